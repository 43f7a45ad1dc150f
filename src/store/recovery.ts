/**
 * Choosing the recovery line, and the coordinator's housekeeping sequences.
 *
 * {@link latestLine} takes a verifier rather than rank stores, because the parts live with the
 * ranks: on one host the coordinator may verify them itself ({@link localVerifier}, between
 * jobs or while all ranks are down), while with ranks on several hosts each restarted rank
 * verifies its own part (`RankPartStore.checkPart`, or `readPart` keeping the bytes it is
 * about to restore from) and the verifier is a round trip to it.
 *
 * @example
 * const choice = await latestLine(manifest, localVerifier(rankStores));
 * for (const w of choice.warnings) console.warn(w);
 */
import { formatChecksum } from "./checksum.ts";
import type { LineManifest, LineRecord, PartCheck, PartRef, RankPartStore } from "./types.ts";

/** Verifies one part of a line; must not throw for damage, only for I/O failure. */
export type PartVerifier = (ref: PartRef) => Promise<PartCheck>;

/**
 * The outcome of {@link latestLine}: the line to recover from (or none: start from the
 * beginning), the newer committed lines passed over and why, and one warning per passed-over
 * line for the caller to print.
 *
 * @example
 * const { line, warnings } = await latestLine(manifest, verify);
 * console.log(line === undefined ? "fresh start" : `rolling back to line ${line.epoch}`);
 */
export interface RecoveryChoice {
  readonly line: LineRecord | undefined;
  readonly skipped: readonly { readonly epoch: number; readonly problems: readonly PartCheck[] }[];
  readonly warnings: readonly string[];
}

/**
 * The newest committed line whose parts all verify. A committed line with a missing or
 * damaged part is passed over for the previous one, with a warning naming the line, the ranks
 * and the files. Rejects with `STORE_CORRUPT` if a commit record is damaged (the manifest
 * itself cannot be trusted then), and with whatever `verify` rejects with (`STORE_IO`,
 * `STORE_NOT_OPEN`).
 *
 * After falling back, a coordinator that resumes the job should `abortLine` each skipped line
 * before reusing its epoch ({@link recoverLocal} does).
 *
 * @example
 * const choice = await latestLine(manifest, localVerifier(parts));
 * const restoreFrom = choice.line?.epoch; // undefined: start from the beginning
 */
export async function latestLine(manifest: LineManifest, verify: PartVerifier): Promise<RecoveryChoice> {
  const lines = await manifest.list();
  const skipped: { epoch: number; problems: PartCheck[] }[] = [];
  let chosen: LineRecord | undefined;
  for (let i = lines.length - 1; i >= 0 && chosen === undefined; i--) {
    const line = lines[i]!;
    const checks = await Promise.all(line.parts.map((ref) => verify(ref)));
    const problems = checks.filter((c) => c.kind !== "ok");
    if (problems.length === 0) chosen = line;
    else skipped.push({ epoch: line.epoch, problems });
  }
  const fallback = chosen === undefined ? "no older committed line verifies: the job starts from the beginning" : `falling back to line ${chosen.epoch}`;
  const warnings = skipped.map(
    ({ epoch, problems }) => `recovery line ${epoch} is unusable, ${fallback}: ` + problems.map((p) => (p.kind === "ok" ? "" : p.message)).join("; "),
  );
  return { line: chosen, skipped, warnings };
}

/**
 * A {@link PartVerifier} over rank stores open in this process (one host, ranks not
 * running). A rank without a store counts as a missing part.
 *
 * @example
 * const parts = await Promise.all([0, 1, 2, 3].map((r) => store.openRank(r)));
 * const choice = await latestLine(manifest, localVerifier(parts));
 */
export function localVerifier(ranks: readonly RankPartStore[]): PartVerifier {
  const byRank = new Map(ranks.map((r) => [r.rank, r]));
  return async (ref) => {
    const store = byRank.get(ref.rank);
    if (store === undefined) {
      return {
        kind: "missing",
        ref,
        message: `rank ${ref.rank}'s part of line ${ref.epoch} (crc32 ${formatChecksum(ref.checksum)}) is missing: no part store for rank ${ref.rank}`,
      };
    }
    return store.checkPart(ref);
  };
}

/**
 * After a commit: deletes all but the newest `keep` lines, manifest first, then the parts —
 * never the other way round, so that a crash in between leaves unreferenced parts (deleted
 * later) rather than a committed line without parts. Resolves to the pruned epochs.
 * Rejects with `RangeError` (keep < 1), `STORE_IO`, `STORE_CORRUPT`, `STORE_NOT_OPEN`.
 *
 * @example
 * await manifest.commitLine(epoch, refs);
 * await pruneLines(manifest, rankStores, keepLines); // with ranks elsewhere: tell them retain()
 */
export async function pruneLines(manifest: LineManifest, ranks: readonly RankPartStore[], keep: number): Promise<number[]> {
  const pruned = await manifest.prune(keep);
  const kept = (await manifest.list()).map((l) => l.epoch);
  await Promise.all(ranks.map((r) => r.retain(kept)));
  return pruned;
}

/**
 * The start of a job on one host, before any rank runs: chooses the recovery line, retracts
 * (aborts) the newer committed lines that failed verification so their epochs can be reused,
 * and deletes every part that belongs to no remaining committed line (aborted or interrupted
 * lines, and lines pruned from the manifest just before a crash); with `opts.keep`, first
 * prunes the manifest to that many lines, as after a commit. `ranks` must be the stores
 * of ranks `0..n-1` of a job of the size that wrote the store (`RangeError` otherwise,
 * before anything is changed). Rejects like {@link latestLine}, and with `STORE_IO` /
 * `STORE_NOT_OPEN`.
 *
 * @example
 * const choice = await recoverLocal(manifest, rankStores, { keep: KEEP_LINES_DEFAULT });
 * for (const w of choice.warnings) console.warn(`lifeline: ${w}`);
 */
export async function recoverLocal(manifest: LineManifest, ranks: readonly RankPartStore[], opts?: { keep?: number }): Promise<RecoveryChoice> {
  const keep = opts?.keep;
  if (keep !== undefined && (!Number.isInteger(keep) || keep < 1)) throw new RangeError(`recoverLocal: keep must be an integer >= 1, got ${String(keep)}`);
  // A store written by a job of another size is not damaged, it is the wrong store: every
  // line would "miss" parts and be retracted. Refuse before deleting anything.
  const sizes = new Set((await manifest.list()).map((l) => l.parts.length));
  const wrong = [...sizes].filter((n) => n !== ranks.length);
  if (wrong.length > 0) {
    throw new RangeError(
      `recoverLocal: the store ${manifest.location} holds lines of a ${wrong.join("/")}-rank job, this job has ${ranks.length} ranks; use the same number of ranks or another store`,
    );
  }
  const choice = await latestLine(manifest, localVerifier(ranks));
  for (const { epoch } of choice.skipped) await manifest.abortLine(epoch);
  // A crash between a commit and its pruning leaves one line too many; catch up here.
  if (keep !== undefined) await manifest.prune(keep);
  // Each rank keeps its parts of the kept lines (a line of independent checkpoints names each
  // rank's own epoch).
  const kept = await manifest.list();
  await Promise.all(
    ranks.map((r) =>
      r.retain(
        kept.flatMap((l) => l.parts.filter((p) => p.rank === r.rank).map((p) => p.epoch)),
        { dropNewer: true },
      ),
    ),
  );
  return choice;
}
