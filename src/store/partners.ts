/**
 * Recovery lines without a shared disk (SCR's PARTNER scheme): each rank writes its part to
 * its own host's store and a copy to a partner rank on another host, and every rank keeps a
 * copy of the commit records. Losing one whole host — its processes and its disk — then leaves
 * every part of every committed line on some surviving host. This file holds the two pure
 * decisions of the scheme; the rank driver (src/cpr/coordinated/driver.ts) moves the bytes and
 * the cpr restart policy (src/launch/cpr-policy.ts) asks the ranks what they hold.
 *
 * - {@link partnerOf}: the rank of the same place among the next host's ranks, so each
 *   host's ranks copy to the next host's, one copy per rank when the hosts are equal.
 * - {@link chooseAcrossHosts}: given the committed lines and what each host's store holds (one
 *   rank per host reports every part it verified there: its ranks' own parts and the partner
 *   copies), the newest line whose every part is somewhere — for each rank, its own copy when
 *   it still runs where that is (no transfer), else a copy from another host.
 *
 * @example
 * partnerOf(1, [0, 0, 1, 1]);   // 3: ranks 0 and 1 on host 0 copy to ranks 2 and 3 on host 1
 * const c = chooseAcrossHosts(lines, reports, [0, 0, 2, 2]);
 * c.sources[3];                 // { kind: "copy", holder: 0, where: "held-by-0/rank-3" }: its host is gone
 */
import { formatChecksum } from "./checksum.ts";
import type { LineRecord, PartRef } from "./types.ts";

/**
 * The rank that keeps copies of `rank`'s parts: on the next host (in the order hosts first
 * appear in rank order, wrapping around), the rank whose place among that host's ranks is
 * `rank`'s place among its own (modulo their count) — SCR's partner of the same local index on
 * the next node. With equal hosts every rank keeps exactly one copy, so the copies' receiving
 * and writing spread over all ranks instead of piling on each host's first. Undefined when
 * every rank is on one host (a copy would not survive anything the original does not).
 */
export function partnerOf(rank: number, hosts: readonly number[]): number | undefined {
  const mine = hosts[rank];
  const order: number[] = [];
  const ranksOf = new Map<number, number[]>();
  hosts.forEach((h, r) => {
    let list = ranksOf.get(h);
    if (list === undefined) {
      list = [];
      ranksOf.set(h, list);
      order.push(h);
    }
    list.push(r);
  });
  if (mine === undefined || order.length < 2) return undefined;
  const next = order[(order.indexOf(mine) + 1) % order.length]!;
  const theirs = ranksOf.get(next)!;
  return theirs[ranksOf.get(mine)!.indexOf(rank) % theirs.length];
}

/** A part some host's store holds: `where` is its database in the store (`rank-2`, `held-by-0/rank-2`). */
export interface HeldPart {
  readonly ref: PartRef;
  readonly where: string;
}

/** What one host's store holds, reported by `rank`, one of the ranks now on that host. */
export interface HostReport {
  readonly host: number;
  readonly rank: number;
  readonly parts: readonly HeldPart[];
}

/** Where a rank's part of the chosen line comes from. */
export type PartSource =
  /** From its own part store, on the host it runs on now: nothing moves. */
  | { readonly kind: "own" }
  /** From the store of another host (or another database of its own host), through `holder`. */
  | { readonly kind: "copy"; readonly holder: number; readonly where: string };

/** The outcome of {@link chooseAcrossHosts}. */
export interface HostsChoice {
  /** The line to restore, or undefined: start from the beginning. */
  readonly line: LineRecord | undefined;
  /** One per rank when a line was chosen. */
  readonly sources: readonly PartSource[];
  /** Newer committed lines passed over, and the ranks whose parts are nowhere. */
  readonly skipped: readonly { readonly epoch: number; readonly missing: readonly number[] }[];
  /** One per passed-over line, for the caller to print. */
  readonly warnings: readonly string[];
}

function same(a: PartRef, b: PartRef): boolean {
  return a.rank === b.rank && a.epoch === b.epoch && a.checksum === b.checksum && a.bytes === b.bytes;
}

/** The database a rank's own parts live in (src/cpr/coordinated/host-stores.ts). */
export function ownWhere(rank: number): string {
  return `rank-${rank}`;
}

/**
 * The newest of `lines` (ascending, as the manifest lists them) whose every part some host
 * holds (`reports`, one per host of this run): rank r's own database on the host it runs on
 * now (`hostOf[r]`) is preferred — nothing moves — else any verified copy, its own database on
 * another host first (a rank placed elsewhere on a resume), then a partner's copy. Never throws.
 */
export function chooseAcrossHosts(lines: readonly LineRecord[], reports: readonly HostReport[], hostOf: readonly number[]): HostsChoice {
  const skipped: { epoch: number; missing: number[] }[] = [];
  for (let i = lines.length - 1; i >= 0; i--) {
    const line = lines[i]!;
    const sources: PartSource[] = [];
    const missing: number[] = [];
    for (const ref of line.parts) {
      const own = ownWhere(ref.rank);
      const found = reports.flatMap((rep) => rep.parts.filter((p) => same(p.ref, ref)).map((p) => ({ rep, where: p.where })));
      if (found.some((f) => f.rep.host === hostOf[ref.rank] && f.where === own)) {
        sources.push({ kind: "own" });
        continue;
      }
      const best = found.find((f) => f.where === own) ?? found[0];
      if (best === undefined) missing.push(ref.rank);
      else sources.push({ kind: "copy", holder: best.rep.rank, where: best.where });
    }
    if (missing.length === 0) return { line, sources, skipped, warnings: warningsOf(lines, skipped, line.epoch) };
    skipped.push({ epoch: line.epoch, missing });
  }
  return { line: undefined, sources: [], skipped, warnings: warningsOf(lines, skipped, undefined) };
}

function warningsOf(lines: readonly LineRecord[], skipped: readonly { epoch: number; missing: readonly number[] }[], chosen: number | undefined): string[] {
  const fallback = chosen === undefined ? "no older committed line is complete: the job starts from the beginning" : `falling back to line ${chosen}`;
  return skipped.map(({ epoch, missing }) => {
    const line = lines.find((l) => l.epoch === epoch)!;
    const parts = missing.map((r) => `rank ${r}'s part (crc32 ${formatChecksum(line.parts[r]!.checksum)})`).join(", ");
    return `recovery line ${epoch} is unusable, ${fallback}: no surviving host holds ${parts}, neither the rank's own copy nor its partner's`;
  });
}
