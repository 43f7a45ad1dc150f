/**
 * `lifeline lines [--store dir]`: what recovery lines a store holds, which job they belong
 * to, and in what state.
 *
 * Reads a snapshot of the store (each LevelDB database is copied and the copy opened, see
 * `snapshot.ts`), so it works while a job runs without taking the job's locks or disturbing
 * it, and it creates and deletes nothing in the store. It reads the manifest (lines and the
 * job record) and every rank's part records, verifies the parts of committed lines (reading
 * them: a few hundred ms per GiB from the page cache), and closes everything again before
 * returning. A running job may prune a line while it is being verified: such a line is left
 * out (it is no longer committed), not reported as damaged; and one it commits meanwhile is
 * listed as committed (its parts verify), not as partial.
 *
 * States: `committed` (commit record present, every part verifies), `corrupt` (committed,
 * but a part is missing or damaged: recovery would fall back past it), `partial` (parts
 * without a commit record: a line being written, aborted, or interrupted by a crash).
 *
 * A per-host store (`--store-scope host`: `held-by-*` directories of partner copies next to
 * the ranks' own) holds on each host only its ranks' parts and the copies they keep. There a
 * part not in its rank's own database is looked for among the copies, and a committed line
 * whose parts here all verify but some of which are on other hosts is `spread` (what `lifeline
 * run` gathers from the hosts when it restarts), not `corrupt`.
 *
 * @example
 * const report = await listLines(".lifeline");
 * process.stdout.write(formatLines(report));
 */
import { readdir } from "node:fs/promises";
import { join } from "node:path";
import { isLifelineError } from "../errors.ts";
import { describeIdentity, launcherAlive } from "./job.ts";
import { LevelRecoveryStore } from "./level-store.ts";
import type { JobRecord, LineJob, LineRecord, PartInfo, RankPartStore, RecoveryStore } from "./types.ts";

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
  readonly state: "committed" | "spread" | "partial" | "corrupt";
  /** The job and run that committed the line (committed lines of stores that record it). */
  readonly job?: LineJob | undefined;
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
  /** The job whose lines the store holds, if a launcher recorded it. */
  readonly job?: JobRecord | undefined;
  /** For a `running` job: whether its launcher is alive (on this host; elsewhere: unknown, false). */
  readonly launcherAlive?: boolean | undefined;
  readonly rows: readonly LineRow[];
  readonly warnings: readonly string[];
}

/**
 * Lists the recovery lines in the store directory `storeDir`, also while a job uses it.
 * `verify: false` skips reading the parts (committed lines are then shown as committed).
 * Rejects with `STORE_NOT_FOUND` (no store there), `STORE_CORRUPT` (the manifest is
 * damaged), `STORE_IO`.
 *
 * @example
 * const report = await listLines("./.lifeline");
 * console.log(formatLines(report));
 */
export async function listLines(storeDir: string, opts?: { verify?: boolean }): Promise<LinesReport> {
  let held: string[] = [];
  try {
    held = (await readdir(storeDir)).filter((n) => /^held-by-\d+$/.test(n)).sort();
  } catch {
    // No such directory: listLinesIn says so (STORE_NOT_FOUND).
  }
  // Fresh snapshots for every attempt (see listLinesRetrying).
  return listLinesRetrying(
    () => ({
      store: new LevelRecoveryStore(storeDir, { readOnly: true, snapshot: true }),
      copies: held.map((n) => new LevelRecoveryStore(join(storeDir, n), { readOnly: true, snapshot: true })),
    }),
    opts,
  );
}

/** Listings taken at most, while a running job outpaces them (see listLinesRetrying). */
export const LIST_ATTEMPTS = 5;

/**
 * {@link listLinesIn} over stores from `open`, taken again (with stores opened again: new
 * snapshots) while the listing is stale: the job committed a line while it was listed whose
 * parts, as read, do not all verify (a rank's parts were read before it wrote its part of that
 * line), or the listing shows no committed line while the store has some. A job that commits
 * often and keeps few lines may otherwise be listed with no committed line at all: the lines
 * the manifest named pruned by the time their parts were read, the newer ones' parts read too
 * early. After {@link LIST_ATTEMPTS} attempts the last listing is returned as it is (such a
 * line then shows as partial, "committed while it was listed").
 */
export async function listLinesRetrying(
  open: () => { store: RecoveryStore; copies?: readonly RecoveryStore[] },
  opts?: { verify?: boolean },
): Promise<LinesReport> {
  for (let attempt = 1; ; attempt++) {
    const { store, copies } = open();
    const { report, stale } = await listOnce(store, { ...opts, ...(copies === undefined ? {} : { copies }) });
    if (!stale || attempt >= LIST_ATTEMPTS) return report;
    await new Promise((r) => setTimeout(r, 10 * attempt));
  }
}

/**
 * {@link listLines} over any {@link RecoveryStore} (the in-memory one in tests and the
 * simulator). Rejects like {@link listLines}.
 *
 * @example
 * const report = await listLinesIn(memoryStore);
 * report.rows.map((r) => r.state); // ["committed", "committed", "partial"]
 */
export async function listLinesIn(store: RecoveryStore, opts?: { verify?: boolean; copies?: readonly RecoveryStore[] }): Promise<LinesReport> {
  return (await listOnce(store, opts)).report;
}

/**
 * One listing; `stale`: a line committed while it was listed could not be verified from the
 * parts as read, or the store has committed lines now and the listing shows none.
 */
async function listOnce(
  store: RecoveryStore,
  opts?: { verify?: boolean; copies?: readonly RecoveryStore[] },
): Promise<{ report: LinesReport; stale: boolean }> {
  const verify = opts?.verify ?? true;
  const perHost = (opts?.copies?.length ?? 0) > 0;
  const warnings: string[] = [];
  const rankNumbers = await store.ranks();
  let committed: LineRecord[] = [];
  let aborted: number[] = [];
  let job: JobRecord | undefined;
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
        try {
          job = await manifest.job();
        } catch (err) {
          if (!isLifelineError(err, "STORE_CORRUPT")) throw err;
          warnings.push(`the job record cannot be read: ${err.message}`);
        }
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
    // Per-host stores: the partner copies this host keeps, by the rank they are of.
    const copiesOf = new Map<number, RankPartStore[]>();
    for (const c of opts?.copies ?? []) {
      for (const rank of await c.ranks()) {
        const s = await c.openRank(rank).catch(() => undefined);
        if (s === undefined) continue;
        opened.push(s);
        copiesOf.set(rank, [...(copiesOf.get(rank) ?? []), s]);
      }
    }
    const rowOf = async (line: LineRecord): Promise<LineRow> => {
      const notes: string[] = [];
      const elsewhere: number[] = [];
      if (verify) {
        for (const ref of line.parts) {
          const parts = storeOf.get(ref.rank);
          const own = parts === undefined ? undefined : await parts.checkPart(ref);
          if (own?.kind === "ok") continue;
          if (perHost && own?.kind !== "corrupt") {
            let copied = false;
            for (const c of copiesOf.get(ref.rank) ?? []) if ((await c.checkPart(ref)).kind === "ok") copied = true;
            if (!copied) elsewhere.push(ref.rank);
            continue;
          }
          notes.push(own === undefined ? `rank ${ref.rank}'s part is missing: the store has no rank-${ref.rank} directory` : own.message);
        }
      }
      if (elsewhere.length > 0 && notes.length === 0) {
        notes.push(
          `the part${elsewhere.length === 1 ? "" : "s"} of rank${elsewhere.length === 1 ? "" : "s"} ${elsewhere.join(", ")} ${elsewhere.length === 1 ? "is" : "are"} not on this host (a per-host store: run \`lifeline lines\` on ${elsewhere.length === 1 ? "that rank's host" : "those ranks' hosts"})`,
        );
      } else if (elsewhere.length > 0) {
        notes.push(`rank${elsewhere.length === 1 ? "" : "s"} ${elsewhere.join(", ")}: not on this host`);
      }
      return {
        epoch: line.epoch,
        timeMs: line.timeMs,
        ranks: line.parts.length - elsewhere.length,
        ranksTotal: line.parts.length,
        bytes: line.parts.filter((p) => !elsewhere.includes(p.rank)).reduce((sum, p) => sum + p.bytes, 0),
        state: notes.length === 0 ? "committed" : elsewhere.length > 0 && notes.length === 1 ? "spread" : "corrupt",
        job: line.job,
        notes,
      };
    };
    const rows: LineRow[] = [];
    const committedEpochs = new Set(committed.map((l) => l.epoch));
    for (const line of committed) rows.push(await rowOf(line));
    const partial = new Map<number, PartInfo[]>();
    for (const parts of partsByRank.values()) {
      for (const p of parts) {
        if (committedEpochs.has(p.epoch)) continue;
        partial.set(p.epoch, [...(partial.get(p.epoch) ?? []), p]);
      }
    }
    // A running job commits and prunes lines while they are listed: the parts are read after
    // the manifest, so a line may have been pruned since (its parts gone: it is not damaged,
    // it is no longer there) or committed since (its parts look uncommitted). The manifest as
    // it is now settles both.
    const now = rows.some((r) => r.state === "corrupt") || partial.size > 0 ? await committedNow(store) : undefined;
    if (now !== undefined) {
      for (let i = rows.length - 1; i >= 0; i--) if (rows[i]!.state === "corrupt" && !now.has(rows[i]!.epoch)) rows.splice(i, 1);
    }
    const abortedSet = new Set(aborted);
    let stale = false;
    for (const [epoch, parts] of partial) {
      const since = now?.get(epoch);
      if (since !== undefined) {
        // Committed since the manifest was read: listed as such if its parts, as read, verify.
        const row = await rowOf(since);
        if (row.state !== "corrupt") {
          rows.push(row);
          continue;
        }
        stale = true;
      }
      rows.push({
        epoch,
        timeMs: Math.max(...parts.map((p) => p.timeMs)),
        ranks: parts.length,
        ranksTotal: rankNumbers.length,
        bytes: parts.reduce((sum, p) => sum + p.bytes, 0),
        state: "partial",
        notes: abortedSet.has(epoch) ? ["aborted"] : since !== undefined ? ["committed while it was listed"] : [],
      });
    }
    rows.sort((a, b) => a.epoch - b.epoch);
    // Every line the manifest named was pruned before its parts were read, and none committed
    // since could be verified: the store has committed lines, and this listing shows none (a
    // damaged line, listed as corrupt, is no reason to list again).
    if (now !== undefined && now.size > 0 && !rows.some((r) => r.state !== "partial")) stale = true;
    return { report: { location: store.location, job, launcherAlive: job?.state === "running" ? launcherAlive(job) : undefined, rows, warnings }, stale };
  } finally {
    await Promise.all(opened.map((p) => p.close()));
  }
}

/** The committed lines of the store now, by epoch, or undefined if the manifest cannot be read again. */
async function committedNow(store: RecoveryStore): Promise<Map<number, LineRecord> | undefined> {
  try {
    const manifest = await store.openManifest();
    try {
      return new Map((await manifest.list()).map((l) => [l.epoch, l]));
    } finally {
      await manifest.close();
    }
  } catch {
    return undefined;
  }
}

/**
 * The listing as a table for people — the job first, then a row per line (RUN: which run of
 * the job committed it) — with notes and warnings below it.
 *
 * @example
 * console.log(formatLines(await listLines(".lifeline")));
 * // job heat-3f9a1c2e: /w/heat.ts --iters 3000 on 4 ranks (mode cpr); run 2 ended without finishing ...
 * //  EPOCH  TIME                 RANKS  BYTES      RUN  STATE ...
 */
export function formatLines(report: LinesReport): string {
  const header = ["EPOCH", "TIME", "RANKS", "BYTES", "RUN", "STATE"];
  const jobId = report.job?.id;
  const runOf = (r: LineRow): string => (r.job === undefined ? "-" : r.job.id === jobId ? String(r.job.run) : `${r.job.id}/${r.job.run}`);
  const table = report.rows.map((r) => [
    String(r.epoch),
    formatTime(r.timeMs),
    r.ranks === r.ranksTotal ? String(r.ranks) : `${r.ranks}/${r.ranksTotal}`,
    formatBytes(r.bytes),
    runOf(r),
    r.state + (r.notes.includes("aborted") ? " (aborted)" : ""),
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...table.map((row) => row[i]!.length)));
  const right = [true, false, true, true, true, false];
  const fmt = (row: string[]): string =>
    row
      .map((cell, i) => (right[i] ? cell.padStart(widths[i]!) : cell.padEnd(widths[i]!)))
      .join("  ")
      .trimEnd();
  const out: string[] = [];
  if (report.job !== undefined) out.push(jobLine(report.job, report.launcherAlive === true));
  out.push(`recovery lines in ${report.location}:`);
  if (report.rows.length === 0) out.push("  (none)");
  else out.push(...[header, ...table].map((row) => "  " + fmt(row)));
  for (const r of report.rows) for (const n of r.notes) if (n !== "aborted") out.push(`line ${r.epoch}: ${n}`);
  for (const w of report.warnings) out.push(`warning: ${w}`);
  return out.join("\n") + "\n";
}

/** The job a store holds, in one line: what it runs, and where its newest run stands. */
function jobLine(job: JobRecord, alive: boolean): string {
  const what = `job ${job.id}: ${describeIdentity(job)} (mode ${job.mode})`;
  const run = `run ${job.run}`;
  switch (job.state) {
    case "running":
      return alive
        ? `${what}; ${run} is running (launcher pid ${job.launcher.pid}, started ${formatTime(job.runStartedMs)})`
        : `${what}; ${run} (launcher pid ${job.launcher.pid} on ${job.launcher.host}, started ${formatTime(job.runStartedMs)}) ended without finishing: the same \`lifeline run\` command resumes it`;
    case "finished":
      return `${what}; ${run} finished at ${formatTime(job.endedMs ?? job.runStartedMs)}`;
    case "failed":
    case "stopped":
      return `${what}; ${run} ${job.state === "failed" ? "failed" : "was stopped"} at ${formatTime(job.endedMs ?? job.runStartedMs)} (exit ${job.exitCode ?? "?"}): the same \`lifeline run\` command resumes it`;
  }
}

/**
 * Local wall-clock time to the second, as the listing prints it. Never throws.
 *
 * @example
 * formatTime(Date.now()); // "2026-11-23 19:40:12"
 */
export function formatTime(ms: number): string {
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
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${v.toFixed(1)} ${units[i]}`;
}
