/**
 * The restart policy of `--mode retry-one`: a failed rank is restarted alone, with attempt + 1
 * after the supervisor's back-off; the others keep their processes and memory and restore it
 * from theirs (src/cpr/retry-one). The supervisor tells the survivors at once (`peer-down`),
 * and `peer` with the new endpoint once the new process says hello.
 *
 * - A job-fatal error reported by a rank (e.g. a replay mismatch) fails the job: every rank
 *   computed the same decision, re-running cannot help.
 * - `--max-restarts` exhausted: the job fails with `LAUNCH_RESTARTS` (the survivors are
 *   aborted; they would fail on their own with `MPI_TIMEOUT` after `--failure-timeout`).
 *
 * The durable floor (`--durable-every N`, with a store claimed as cpr claims one): every N-th
 * checkpoint of each rank is also written to its part store, and reported (`cpr-durable`)
 * with the rank's message counters. Each report, this policy looks for the newest set of the
 * ranks' durable checkpoints that fits together (src/cpr/retry-one/durable.ts) and commits
 * it in the manifest as a line of independent checkpoints, pruned to `--keep-lines`. When
 * failures exceed what the in-memory replicas cover (the ranks report `CPR_LOST`), every rank
 * restarts from the newest such line that verifies (or from the start), with a warning saying
 * what was lost; and a job whose launcher ended resumes from it, as in cpr.
 *
 * @example
 * const sup = new Supervisor(config, { ...deps, policy: new RetryOnePolicy(config, claim) });
 */
import { LifelineError } from "../errors.ts";
import { decodeValue, encodeValue } from "../mpi/codec.ts";
import type { CoordinatorToRank, RankToCoordinator } from "../mpi/control.ts";
import { DurableCandidates } from "../cpr/retry-one/durable.ts";
import { LevelRecoveryStore } from "../store/level-store.ts";
import { formatTime } from "../store/lines.ts";
import { recoverLocal } from "../store/recovery.ts";
import type { LineRecord, PartRef, RankPartStore } from "../store/types.ts";
import { endRun, type StoreClaim } from "./job-store.ts";
import type { RunConfig } from "./options.ts";
import { type JobEnd, type JobView, type PolicyContext, type PolicyDecision, type RankFailure, type RestartPolicy, retryOneDecision } from "./policy.ts";

/** A start of every rank from a durable line (or from the start: `line` undefined). */
export interface AllStart {
  readonly line: LineRecord | undefined;
  readonly versions: number[];
  readonly index: number;
}

/** What rank `rank`'s table carries for a start of every rank from `start` (the simulator's too). */
export function allStartTable(start: AllStart, rank: number): Partial<Extract<CoordinatorToRank, { t: "table" }>> {
  const ref = start.line?.parts[rank];
  return {
    retryStart: { versions: [...start.versions], index: start.index },
    ...(ref === undefined
      ? {}
      : { restore: { epoch: start.line!.epoch, ref: { rank: ref.rank, epoch: ref.epoch, checksum: ref.checksum, bytes: ref.bytes } } }),
  };
}

export class RetryOnePolicy implements RestartPolicy {
  readonly mode = "retry-one" as const;
  private readonly restarted: { rank: number; delayMs: number }[] = [];
  private ctx: PolicyContext | undefined;
  /** The durable checkpoints the ranks reported that a newer line may still use. */
  private readonly candidates: DurableCandidates<PartRef>;
  /** Per rank, the checkpoint count it last reported (what a restart of every rank loses). */
  private readonly reached: number[];
  /** Manifest writes, one at a time. */
  private writes: Promise<void> = Promise.resolve();
  private readonly committed: number[] = [];
  private readonly fallbacks: { attempt: number; line: number; versions: number[] }[] = [];
  private resumedFrom: number | undefined;
  /** The start of every rank the next tables carry (a fallback, or a resume); cleared once they went out. */
  private allStart: AllStart | undefined;

  /** With a claimed store (`--durable-every` > 0): the durable floor. */
  constructor(
    private readonly config?: RunConfig,
    private readonly claim?: StoreClaim,
  ) {
    const size = config?.size ?? 0;
    this.candidates = new DurableCandidates(size);
    this.reached = new Array<number>(size).fill(0);
  }

  private get durable(): boolean {
    return this.claim !== undefined && this.config !== undefined;
  }

  async attach(ctx: PolicyContext): Promise<void> {
    this.ctx = ctx;
    const claim = this.claim;
    if (claim === undefined || this.config === undefined) return;
    const action = claim.action;
    if (action.kind === "resume") {
      if (claim.programChanged !== undefined) ctx.report({ kind: "warning", message: claim.programChanged });
      const start = await this.chooseLine();
      if (start.line === undefined) {
        if (this.config.resume === "resume") {
          throw new LifelineError(
            "LAUNCH_RESUME",
            `--resume: no durable line in ${this.config.store} verifies (see the warnings above); run with --fresh to start the job from the beginning`,
          );
        }
        ctx.report({ kind: "warning", message: `no durable line of job ${claim.job.id} verifies; run ${claim.job.run} starts from the beginning` });
        return;
      }
      this.allStart = start;
      this.candidates.restarted(start.versions);
      this.resumedFrom = start.line.epoch;
      ctx.report({
        kind: "job-resuming",
        job: claim.job.id,
        run: claim.job.run,
        epoch: start.line.epoch,
        lineTime: formatTime(start.line.timeMs),
        lineRun: start.line.job?.run,
        previousState: action.job.state,
        previousExitCode: action.job.exitCode,
      });
      return;
    }
    const discard = action.discard;
    if (discard.length > 0) {
      ctx.report({
        kind: "warning",
        message: `discarding the ${discard.length} durable line(s) in ${this.config.store} (newest: line ${discard[discard.length - 1]!.epoch}): ${action.why ?? "starting over"}`,
      });
      for (const line of discard) await claim.manifest.abortLine(line.epoch);
    }
    await this.withRankStores((stores) => Promise.all(stores.map((s) => s.retain([], { dropNewer: true }))));
  }

  decide(failure: RankFailure, job: JobView): PolicyDecision {
    const decision = retryOneDecision(failure, job, this.durable);
    if (decision.kind === "restart" && decision.ranks.length === 1 && failure.code !== "CPR_LOST") {
      this.restarted.push({ rank: decision.ranks[0]!, delayMs: decision.delayMs });
    }
    return decision;
  }

  onStep(rank: number, _steps: number, epoch?: number): void {
    if (epoch !== undefined && rank < this.reached.length) this.reached[rank] = Math.max(this.reached[rank]!, epoch);
  }

  /** A rank's durable checkpoint is in its part store. */
  onCprMessage(rank: number, msg: Extract<RankToCoordinator, { t: `cpr-${string}` }>): void {
    if (msg.t !== "cpr-durable" || !this.durable || this.allStart !== undefined) return;
    this.candidates.add(
      rank,
      { version: msg.epoch, index: msg.index, sent: msg.sent, consumed: msg.consumed, logFrom: msg.logFrom },
      { rank: msg.ref.rank, epoch: msg.ref.epoch, checksum: msg.ref.checksum, bytes: msg.ref.bytes },
      performance.now(),
    );
    this.writes = this.writes
      .then(() => this.commitNewest())
      .catch((err: unknown) => this.ctx?.report({ kind: "warning", message: `could not record a durable line: ${(err as Error).message}` }));
  }

  /** Commits the newest consistent set of durable checkpoints, if it is newer than the last line. */
  private async commitNewest(): Promise<void> {
    const claim = this.claim!;
    const size = this.config!.size;
    const next = this.candidates.next();
    if (next === undefined) return;
    const { versions, chosen, index } = next;
    const parts = chosen.map((c) => c.ref);
    const epoch = Math.max(0, ...(await claim.manifest.list()).map((l) => l.epoch)) + 1;
    await claim.manifest.commitLine(epoch, parts, { mixed: true, meta: encodeValue({ index }), job: { id: claim.job.id, run: claim.job.run } });
    this.candidates.committed(versions);
    this.committed.push(epoch);
    // Its duration: from the first of its parts reported to the commit.
    const durationMs = Math.round(performance.now() - Math.min(...chosen.map((c) => c.atMs)));
    this.ctx?.report({ kind: "line-committed", epoch, durationMs, bytes: parts.reduce((n, p) => n + p.bytes, 0) });
    // The ranks keep their parts of the kept lines and newer ones.
    await claim.manifest.prune(this.config!.keepLines);
    const kept = await claim.manifest.list();
    for (let r = 0; r < size; r++) this.ctx?.send(r, { t: "cpr-durable-keep", keep: kept.map((l) => l.parts[r]!.epoch) });
  }

  /** The newest durable line whose parts verify (no rank runs), or the start. */
  private async chooseLine(): Promise<AllStart> {
    const claim = this.claim!;
    const size = this.config!.size;
    const choice = await this.withRankStores((stores) => recoverLocal(claim.manifest, stores, { keep: this.config!.keepLines }));
    for (const w of choice.warnings) this.ctx?.report({ kind: "warning", message: w });
    const line = choice.line;
    if (line === undefined) return { line: undefined, versions: new Array<number>(size).fill(0), index: 0 };
    const meta = line.meta === undefined ? undefined : (decodeValue(line.meta) as { index?: unknown });
    const index = typeof meta?.index === "number" ? meta.index : 0;
    return { line, versions: line.parts.map((p) => p.epoch), index };
  }

  /** Every rank is down for a restart of all (beyond the replicas): the durable line they restart from. */
  async prepareRestart(attempt: number): Promise<void> {
    await this.writes;
    const start = await this.chooseLine();
    this.allStart = start;
    // What the dead execution wrote past the line is not part of this one (recoverLocal deleted
    // it); the next line is made of checkpoints every rank writes from here on.
    this.candidates.restarted(start.line === undefined ? undefined : start.versions);
    this.fallbacks.push({ attempt, line: start.line?.epoch ?? 0, versions: start.versions });
    const lost = this.reached.map((v, r) => `rank ${r} ${Math.max(0, v - start.versions[r]!)}`).join(", ");
    this.ctx?.report({
      kind: "warning",
      message:
        start.line === undefined
          ? `more ranks failed than --replicas ${this.config!.replicas} cover, and no durable line exists yet: every rank restarts from the beginning (all work is lost)`
          : `more ranks failed than --replicas ${this.config!.replicas} cover: every rank restarts from durable line ${start.line.epoch} (checkpoints ${start.versions.join(", ")}); checkpoints lost per rank: ${lost}`,
    });
    this.reached.fill(0);
    this.ctx?.report({ kind: "job-restarting", attempt, epoch: start.line?.epoch ?? 0, restarts: attempt });
  }

  tableFor(rank: number): Partial<Extract<CoordinatorToRank, { t: "table" }>> {
    // `--checkpoint-every Nsteps`: every Nth checkpoint() call of a rank is a checkpoint.
    const every = this.config?.checkpointEvery;
    const steps = every?.kind === "steps" ? { checkpointSteps: every.steps } : {};
    return this.allStart === undefined ? steps : { ...allStartTable(this.allStart, rank), ...steps };
  }

  onReady(): void {
    // Every rank got its table: later tables (of single restarts) restore from peers again.
    this.allStart = undefined;
  }

  summary(): Record<string, unknown> {
    return {
      ranksRestarted: this.restarted.map((r) => r.rank),
      ...(this.durable ? { durableLines: [...this.committed], fallbacks: [...this.fallbacks] } : {}),
      ...(this.resumedFrom === undefined ? {} : { resumedFrom: this.resumedFrom }),
    };
  }

  async close(end: JobEnd): Promise<void> {
    const claim = this.claim;
    if (claim === undefined) return;
    await this.writes;
    try {
      // No rank runs: each keeps only its parts of the committed lines.
      const kept = await claim.manifest.list();
      await this.withRankStores((stores) =>
        Promise.all(
          stores.map((s) =>
            s.retain(
              kept.map((l) => l.parts[s.rank]!.epoch),
              { dropNewer: true },
            ),
          ),
        ),
      );
    } catch (err) {
      this.ctx?.report({
        kind: "warning",
        message: `could not delete durable checkpoints of no line: ${(err as Error).message} (the next run of this job deletes them)`,
      });
    } finally {
      const problem = await endRun(claim, { state: end.ok ? "finished" : end.interrupted ? "stopped" : "failed", exitCode: end.exitCode });
      if (problem !== undefined) this.ctx?.report({ kind: "warning", message: problem });
      await claim.manifest.close();
    }
  }

  private async withRankStores<T>(fn: (stores: RankPartStore[]) => Promise<T>): Promise<T> {
    const store = new LevelRecoveryStore(this.config!.store);
    const stores: RankPartStore[] = [];
    try {
      for (let r = 0; r < this.config!.size; r++) stores.push(await store.openRank(r));
      return await fn(stores);
    } finally {
      await Promise.all(stores.map((s) => s.close()));
    }
  }
}
