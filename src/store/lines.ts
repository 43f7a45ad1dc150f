/**
 * `lifeline lines [--store dir]`: what recovery lines a store holds, and in what state.
 *
 * Opens the store in inspection mode (creates nothing, deletes nothing), reads the manifest
 * and every rank's part records, verifies the parts of committed lines (reading them: a few
 * hundred ms per GiB from the page cache), and closes everything again before returning. A
 * running job holds the store's locks, so while one runs this is `STORE_LOCKED`.
 *
 * States: `committed` (commit record present, every part verifies), `corrupt` (committed,
 * but a part is missing or damaged: recovery would fall back past it), `partial` (parts
 * without a commit record: a line being written, aborted, or interrupted by a crash).
 *
 * @example
 * const report = await listLines(".lifeline");
 * process.stdout.write(formatLines(report));
 */
import { isLifelineError } from "../errors.ts";
import { LevelRecoveryStore } from "./level-store.ts";
import type { LineRecord, PartInfo, RankPartStore, RecoveryStore } from "./types.ts";

/**
 * One line of the listing.
 *
 * @example
 * const row: LineRow = { epoch: 7, timeMs: 1_700_000_000_000, ranks: 4, ranksTotal: 4, bytes: 4 << 26, state: "committed", notes: [] };
 * formatLines({ location: "/s", rows: [row], warnings: [] });
 */
export interface LineRow {
  readonly epoch: number;
  /** Commit time; for a partial line, the time of its newest part. */
  readonly timeMs: number;
  /** Parts present (committed lines: parts in the commit record). */
  readonly ranks: number;
  /** Parts a whole line has: the committed line's size, or the number of rank stores. */
  readonly ranksTotal: number;
  /** Total bytes of the parts present. */
  readonly bytes: number;
  readonly state: "committed" | "partial" | "corrupt";
  /** What is wrong (corrupt parts) or known (aborted), one sentence each. */
  readonly notes: readonly string[];
}

/**
 * The listing of one store: rows by ascending epoch, and warnings about the store as a whole
 * (a rank store that could not be read).
 *
 * @example
 * const { rows } = await listLines(".lifeline");
 * console.log(rows.filter((r) => r.state === "committed").length, "usable lines");
 */
export interface LinesReport {
  readonly location: string;
  readonly rows: readonly LineRow[];
  readonly warnings: readonly string[];
}

/**
 * Lists the recovery lines in the store directory `storeDir`.
 * `verify: false` skips reading the parts (committed lines are then shown as committed).
 * Rejects with `STORE_NOT_FOUND` (no store there), `STORE_LOCKED` (a job is using it: the
 * message names the path), `STORE_CORRUPT` (the manifest is damaged), `STORE_IO`.
 *
 * @example
 * const report = await listLines("./.lifeline");
 * console.log(formatLines(report));
 */
export async function listLines(storeDir: string, opts?: { verify?: boolean }): Promise<LinesReport> {
  return listLinesIn(new LevelRecoveryStore(storeDir, { readOnly: true }), opts);
}

/**
 * {@link listLines} over any {@link RecoveryStore} (the in-memory one in tests and the
 * simulator). Rejects like {@link listLines}.
 *
 * @example
 * const report = await listLinesIn(memoryStore);
 * report.rows.map((r) => r.state); // ["committed", "committed", "partial"]
 */
export async function listLinesIn(store: RecoveryStore, opts?: { verify?: boolean }): Promise<LinesReport> {
  const verify = opts?.verify ?? true;
  const warnings: string[] = [];
  const rankNumbers = await store.ranks();
  let committed: LineRecord[] = [];
  let aborted: number[] = [];
  const opened: RankPartStore[] = [];
  try {
    let manifest;
    try {
      manifest = await store.openManifest();
    } catch (err) {
      // A store whose coordinator never got as far as creating the manifest has no lines.
      if (!isLifelineError(err, "STORE_NOT_FOUND")) throw err;
    }
    if (manifest !== undefined) {
      try {
        committed = await manifest.list();
        aborted = await manifest.aborted();
      } finally {
        await manifest.close();
      }
    }
    const partsByRank = new Map<number, PartInfo[]>();
    for (const rank of rankNumbers) {
      let parts: RankPartStore;
      try {
        parts = await store.openRank(rank);
      } catch (err) {
        if (!isLifelineError(err, "STORE_NOT_FOUND")) throw err;
        warnings.push(`rank ${rank}'s directory holds no part database (a crash while it was being created?)`);
        continue;
      }
      opened.push(parts);
      try {
        partsByRank.set(rank, await parts.listParts());
      } catch (err) {
        if (!isLifelineError(err, "STORE_CORRUPT")) throw err;
        warnings.push(`rank ${rank}'s part records cannot all be read, so its uncommitted parts are not listed: ${err.message}`);
      }
    }
    const storeOf = new Map(opened.map((p) => [p.rank, p]));
    const rows: LineRow[] = [];
    const committedEpochs = new Set(committed.map((l) => l.epoch));
    for (const line of committed) {
      const notes: string[] = [];
      if (verify) {
        for (const ref of line.parts) {
          const parts = storeOf.get(ref.rank);
          if (parts === undefined) {
            notes.push(`rank ${ref.rank}'s part is missing: the store has no rank-${ref.rank} directory`);
            continue;
          }
          const check = await parts.checkPart(ref);
          if (check.kind !== "ok") notes.push(check.message);
        }
      }
      rows.push({
        epoch: line.epoch, timeMs: line.timeMs, ranks: line.parts.length, ranksTotal: line.parts.length,
        bytes: line.parts.reduce((sum, p) => sum + p.bytes, 0),
        state: notes.length === 0 ? "committed" : "corrupt", notes,
      });
    }
    const partial = new Map<number, PartInfo[]>();
    for (const parts of partsByRank.values()) {
      for (const p of parts) {
        if (committedEpochs.has(p.epoch)) continue;
        partial.set(p.epoch, [...(partial.get(p.epoch) ?? []), p]);
      }
    }
    const abortedSet = new Set(aborted);
    for (const [epoch, parts] of partial) {
      rows.push({
        epoch, timeMs: Math.max(...parts.map((p) => p.timeMs)), ranks: parts.length, ranksTotal: rankNumbers.length,
        bytes: parts.reduce((sum, p) => sum + p.bytes, 0), state: "partial",
        notes: abortedSet.has(epoch) ? ["aborted"] : [],
      });
    }
    rows.sort((a, b) => a.epoch - b.epoch);
    return { location: store.location, rows, warnings };
  } finally {
    await Promise.all(opened.map((p) => p.close()));
  }
}

/**
 * The listing as a table for people, with notes and warnings below it.
 *
 * @example
 * console.log(formatLines(await listLines(".lifeline")));
 * //  EPOCH  TIME                 RANKS  BYTES      STATE ...
 */
export function formatLines(report: LinesReport): string {
  const header = ["EPOCH", "TIME", "RANKS", "BYTES", "STATE"];
  const table = report.rows.map((r) => [
    String(r.epoch), formatTime(r.timeMs), r.ranks === r.ranksTotal ? String(r.ranks) : `${r.ranks}/${r.ranksTotal}`,
    formatBytes(r.bytes), r.state + (r.notes.includes("aborted") ? " (aborted)" : ""),
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...table.map((row) => row[i]!.length)));
  const right = [true, false, true, true, false];
  const fmt = (row: string[]): string => row.map((cell, i) => (right[i] ? cell.padStart(widths[i]!) : cell.padEnd(widths[i]!))).join("  ").trimEnd();
  const out = [`recovery lines in ${report.location}:`];
  if (report.rows.length === 0) out.push("  (none)");
  else out.push(...[header, ...table].map((row) => "  " + fmt(row)));
  for (const r of report.rows) for (const n of r.notes) if (n !== "aborted") out.push(`line ${r.epoch}: ${n}`);
  for (const w of report.warnings) out.push(`warning: ${w}`);
  return out.join("\n") + "\n";
}

function formatTime(ms: number): string {
  const d = new Date(ms);
  const p = (n: number): string => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

/**
 * Binary units, one decimal: what people compare with `du -h`. Never throws.
 *
 * @example
 * formatBytes(512);      // "512 B"
 * formatBytes(64 << 20); // "64.0 MiB"
 */
export function formatBytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let v = n / 1024;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(1)} ${units[i]}`;
}
