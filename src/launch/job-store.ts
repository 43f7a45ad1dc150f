/**
 * Which job a store's recovery lines belong to, and what a new run does with them.
 *
 * A store holds the lines of one job at a time, and its manifest says which (the
 * {@link JobRecord}: program, arguments, size, the run that wrote it and how that run ended).
 * Before a cpr run starts any rank, {@link claimStore} opens the manifest — holding it is what
 * makes the launcher the store's one writer — compares the job the store holds with the one
 * being started, and decides:
 *
 * - **resume**: the store holds lines of this job (same program, arguments and `-n`) from a run
 *   that did not finish — its launcher was killed, interrupted, or gave up. The run continues
 *   from the newest line that verifies. This is the default, so a batch system that requeues
 *   the same command (Slurm's `--requeue`, a rerun of the job script) continues the job, as
 *   users of SCR expect; `--resume` insists on it (an error if there is nothing to resume).
 * - **fresh**: the store holds no line, or only lines of a run of this job that finished
 *   (nothing to continue: the job is run again from the beginning), or `--fresh` was given
 *   (every line in the store is discarded first, whoever's it is).
 * - **refuse** (`LAUNCH_RESUME`, nothing is started or changed): the store holds lines of
 *   another job — another program, other arguments or another size — or `--resume` found
 *   nothing to resume. The message says what the store holds and how to go on. Lines are never
 *   discarded without `--fresh`, except those of a job that finished.
 *
 * The decision itself ({@link decideClaim}) is pure; {@link claimStore} does the I/O around it
 * and writes the new run's job record (`state: "running"`); {@link endRun} records how the run
 * ended.
 *
 * @example
 * const claim = await claimStore(config, { jobIdBase: "heat" });   // throws LAUNCH_RESUME
 * if (claim.action.kind === "resume") console.log(`resuming ${claim.job.id}, run ${claim.job.run}`);
 * // ... the job runs; the cpr policy holds claim.manifest ...
 * await endRun(claim, { state: "finished", exitCode: 0 });
 */
import { createHash, randomBytes } from "node:crypto";
import { readFileSync, realpathSync } from "node:fs";
import { readdir } from "node:fs/promises";
import { join } from "node:path";
import { hostname } from "node:os";
import { LifelineError, errorMessage, isLifelineError } from "../errors.ts";
import { describeIdentity, launcherAlive, type JobIdentity } from "../store/job.ts";
import { LevelRecoveryStore } from "../store/level-store.ts";
import { formatBytes, formatTime as clock } from "../store/lines.ts";
import type { JobRecord, LineManifest, LineRecord } from "../store/types.ts";
import type { RunConfig } from "./options.ts";

/** What the store holds, as {@link decideClaim} needs it. */
export interface StoreHolding {
  readonly job: JobRecord | undefined;
  /** Committed lines, ascending. */
  readonly lines: readonly LineRecord[];
}

/** What the new run does with the store. */
export type ClaimAction =
  /** Continue `job` (the stored record) from its newest line that verifies. */
  | { readonly kind: "resume"; readonly job: JobRecord }
  /**
   * Start from the beginning. `discard`: lines in the store that go first, and why (shown to
   * the user); `continues`: the stored record when this is a new run of the same job.
   */
  | { readonly kind: "fresh"; readonly discard: readonly LineRecord[]; readonly why: string | undefined; readonly continues: JobRecord | undefined }
  /** Start nothing: `message` says what the store holds and what to do. */
  | { readonly kind: "refuse"; readonly message: string };

/**
 * The decision of {@link claimStore}, pure. `location` names the store in messages; `alive`
 * tells whether a run's launcher is still there (a store in use is never taken over).
 *
 * @example
 * decideClaim({ job: undefined, lines: [] }, me, "auto", ctx); // { kind: "fresh", discard: [], ... }
 */
export function decideClaim(
  held: StoreHolding,
  me: JobIdentity,
  want: RunConfig["resume"],
  ctx: { location: string; alive: (job: JobRecord) => boolean },
): ClaimAction {
  const { job, lines } = held;
  if (want === "fresh") {
    return { kind: "fresh", discard: lines, why: lines.length === 0 ? undefined : "--fresh", continues: undefined };
  }
  const same = job !== undefined && sameJob(job, me);
  if (lines.length === 0) {
    if (want === "resume") {
      const what = job === undefined ? "no recovery line" : `no recovery line${same ? "" : ` (its job record is of ${describeIdentity(job)})`}`;
      return {
        kind: "refuse",
        message: `--resume: the store ${ctx.location} holds ${what}, so there is nothing to resume. Run without --resume to start the job from the beginning.`,
      };
    }
    return { kind: "fresh", discard: [], why: undefined, continues: same && job.state !== "finished" ? job : undefined };
  }
  const holds = holdsText(held, ctx);
  if (!same) {
    const differs = job === undefined ? [] : differences(job, me);
    return {
      kind: "refuse",
      message:
        `the store ${ctx.location} holds ${holds}` +
        (job === undefined ? " of an unknown job (a store written by an older Lifeline)" : `:\n  ${describeIdentity(job)}`) +
        `\nthis run is:\n  ${describeIdentity(me)}${differs.length === 0 ? "" : ` (${differs.join(", ")})`}\n` +
        (job?.state === "finished"
          ? "That job finished; its lines stay until you discard them: add --fresh to discard them and start this job, or choose another --store."
          : "To continue that job, run it with the same program, arguments and -n; to discard its lines and start this job, add --fresh; or choose another --store."),
    };
  }
  if (job.state === "finished") {
    if (want === "resume") {
      return {
        kind: "refuse",
        message: `--resume: the job in the store ${ctx.location} (${job.id}) finished at ${clock(job.endedMs ?? job.runStartedMs)}; there is nothing to resume. Run without --resume to run it again from the beginning.`,
      };
    }
    return {
      kind: "fresh",
      discard: lines,
      why: `they belong to run ${job.run} of this job, which finished at ${clock(job.endedMs ?? job.runStartedMs)}`,
      continues: undefined,
    };
  }
  if (job.state === "running" && ctx.alive(job)) {
    // Its launcher holds the manifest, so claimStore cannot get here; a record copied from
    // elsewhere could.
    return {
      kind: "refuse",
      message: `the store ${ctx.location} is in use: run ${job.run} of job ${job.id} is running (launcher pid ${job.launcher.pid} on ${job.launcher.host})`,
    };
  }
  return { kind: "resume", job };
}

/** The outcome of {@link claimStore}: the manifest (held until {@link endRun}), the new run's record and what to do. */
export interface StoreClaim {
  readonly manifest: LineManifest;
  /** The new run's job record, as written (state `running`). */
  readonly job: JobRecord;
  readonly action: Exclude<ClaimAction, { kind: "refuse" }>;
  /** The program changed since the lines were written (resume only): a warning for the user. */
  readonly programChanged: string | undefined;
  /**
   * Per-host stores: the launcher's manifest was empty (it runs on a host new to the job) and
   * took the commit records a rank kept on this host; what it took, for the user.
   */
  readonly adopted?: string | undefined;
}

/**
 * Per-host stores: fills an empty manifest from the newest copy of the commit records that a
 * rank kept on this host (`<store>/replica-<r>`), so a launcher started on a surviving host
 * after the first launcher's host was lost finds the job's lines. The copies are read from
 * snapshots (no lock taken). Resolves to what was taken, or undefined if no copy has a line.
 * Line times become the time of the copy.
 */
async function adoptReplica(root: string, manifest: LineManifest): Promise<string | undefined> {
  let names: string[];
  try {
    names = (await readdir(root)).filter((n) => /^replica-\d+$/.test(n));
  } catch {
    return undefined;
  }
  let best: { job: JobRecord; lines: LineRecord[]; from: string } | undefined;
  const newer = (a: LineRecord, b: LineRecord): boolean =>
    (a.job?.run ?? 0) !== (b.job?.run ?? 0) ? (a.job?.run ?? 0) > (b.job?.run ?? 0) : a.epoch > b.epoch;
  for (const name of names) {
    let copy: LineManifest | undefined;
    try {
      copy = await new LevelRecoveryStore(join(root, name), { snapshot: true }).openManifest();
      const job = await copy.job();
      const lines = await copy.list();
      if (job === undefined || lines.length === 0) continue;
      if (best === undefined || newer(lines[lines.length - 1]!, best.lines[best.lines.length - 1]!)) best = { job, lines, from: name };
    } catch {
      // A damaged or half-written copy: the others may do.
    } finally {
      await copy?.close().catch(() => undefined);
    }
  }
  if (best === undefined) return undefined;
  await manifest.putJob(best.job);
  for (const l of best.lines)
    await manifest.commitLine(l.epoch, l.parts, { ...(l.job === undefined ? {} : { job: l.job }), ...(l.meta === undefined ? {} : { meta: l.meta }) });
  return `this host's manifest in ${root} was empty: took job ${best.job.id}'s ${best.lines.length} commit record(s) from the copy kept in ${best.from} (rank ${best.from.slice("replica-".length)} ran here)`;
}

/**
 * Opens the store's manifest for a cpr run, decides with {@link decideClaim}, and writes the
 * new run's job record. `jobIdBase` names a new job (`<base>-<8 hex digits>`); a resumed job
 * keeps its id. Rejects with `LAUNCH_RESUME` (refused; the manifest is closed again), and with
 * the store's errors (`STORE_LOCKED` — another launcher holds the store —, `STORE_CORRUPT`,
 * `STORE_IO`, `STORE_NOT_FOUND`).
 *
 * @example
 * const claim = await claimStore(config, { jobIdBase: "heat" });
 */
export async function claimStore(config: RunConfig, opts: { jobIdBase: string; nowMs?: () => number }): Promise<StoreClaim> {
  const nowMs = opts.nowMs ?? Date.now;
  const store = new LevelRecoveryStore(config.store);
  let manifest: LineManifest;
  try {
    manifest = await store.openManifest();
  } catch (err) {
    if (isLifelineError(err, "STORE_LOCKED")) {
      throw new LifelineError(
        "STORE_LOCKED",
        `the store ${config.store} is in use by another running job; wait for it to end, or choose another --store (${err.message})`,
        { cause: err },
      );
    }
    throw err;
  }
  try {
    let adopted: string | undefined;
    if (config.storeScope === "host" && (await manifest.job()) === undefined && (await manifest.list()).length === 0) {
      adopted = await adoptReplica(store.location, manifest);
    }
    const held = { job: await manifest.job(), lines: await manifest.list() };
    const me = identityOf(config);
    const action = decideClaim(held, me, config.resume, { location: config.store, alive: launcherAlive });
    if (action.kind === "refuse") throw new LifelineError("LAUNCH_RESUME", action.message);
    const sha = programSha256(me.app);
    const now = nowMs();
    const base = action.kind === "resume" ? action.job : action.continues;
    const job: JobRecord = {
      id: base?.id ?? `${opts.jobIdBase}-${randomBytes(4).toString("hex")}`,
      app: me.app,
      args: [...me.args],
      size: me.size,
      mode: config.mode,
      programSha256: sha,
      createdMs: base?.createdMs ?? now,
      run: (base?.run ?? 0) + 1,
      runStartedMs: now,
      launcher: { pid: process.pid, host: hostname() },
      state: "running",
    };
    await manifest.putJob(job);
    const programChanged =
      action.kind === "resume" && action.job.programSha256 !== sha
        ? `${me.app} changed since run ${action.job.run} of this job wrote its lines (sha-256 ${action.job.programSha256.slice(0, 12)}… then, ${sha.slice(0, 12)}… now); resuming anyway: the program must still read the state those lines hold`
        : undefined;
    return { manifest, job, action, programChanged, adopted };
  } catch (err) {
    await manifest.close().catch(() => undefined);
    throw err;
  }
}

/**
 * Records how the run ended in the job record: `finished` (every rank finalized: a later run
 * of the same command starts the job again), `failed` or `stopped` (a later run resumes).
 * Never rejects: the job's outcome stands whatever happens here; a failure is returned as a
 * message for a warning.
 *
 * @example
 * const problem = await endRun(claim, { state: "finished", exitCode: 0 });
 */
export async function endRun(
  claim: StoreClaim,
  end: { state: "finished" | "failed" | "stopped"; exitCode: number; nowMs?: number },
): Promise<string | undefined> {
  try {
    await claim.manifest.putJob({ ...claim.job, state: end.state, endedMs: end.nowMs ?? Date.now(), exitCode: end.exitCode });
    return undefined;
  } catch (err) {
    return `could not record the end of run ${claim.job.run} in the store: ${errorMessage(err)} (a later run will resume from its lines)`;
  }
}

/** The identity of the job `config` starts. */
export function identityOf(config: Pick<RunConfig, "app" | "appArgs" | "size">): JobIdentity {
  let app = config.app;
  try {
    app = realpathSync(config.app);
  } catch {
    // The launcher checked the file exists; a race with its deletion fails the ranks later.
  }
  return { app, args: [...config.appArgs], size: config.size };
}

function sameJob(a: JobIdentity, b: JobIdentity): boolean {
  return a.app === b.app && a.size === b.size && a.args.length === b.args.length && a.args.every((x, i) => x === b.args[i]);
}

function differences(held: JobIdentity, me: JobIdentity): string[] {
  const out: string[] = [];
  if (held.app !== me.app) out.push("another program");
  if (held.args.length !== me.args.length || held.args.some((x, i) => x !== me.args[i])) out.push("other arguments");
  if (held.size !== me.size) out.push(`-n ${me.size}, not ${held.size}`);
  return out;
}

function holdsText(held: StoreHolding, ctx: { alive: (job: JobRecord) => boolean }): string {
  const newest = held.lines[held.lines.length - 1]!;
  const bytes = newest.parts.reduce((n, p) => n + p.bytes, 0);
  const lines = `${held.lines.length} recovery line${held.lines.length === 1 ? "" : "s"} (newest: line ${newest.epoch}, ${formatBytes(bytes)}, committed ${clock(newest.timeMs)})`;
  const job = held.job;
  if (job === undefined) return lines;
  const how =
    job.state === "finished"
      ? `finished at ${clock(job.endedMs ?? job.runStartedMs)}`
      : job.state === "running"
        ? ctx.alive(job)
          ? `running (launcher pid ${job.launcher.pid})`
          : `ended without finishing (its launcher, pid ${job.launcher.pid} on ${job.launcher.host}, is gone)`
        : `${job.state} at ${clock(job.endedMs ?? job.runStartedMs)} with exit code ${job.exitCode ?? "?"}`;
  return `${lines} of job ${job.id} (run ${job.run}, ${how})`;
}

function programSha256(path: string): string {
  try {
    return createHash("sha256").update(readFileSync(path)).digest("hex");
  } catch {
    return "";
  }
}
