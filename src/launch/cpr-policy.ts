/**
 * The restart policy of `--mode cpr`: drives the coordinated-checkpoint initiator in the
 * launcher process and restarts every rank from the last committed recovery line when one
 * fails.
 *
 * - The initiator (src/cpr/coordinated/initiator.ts, pure) gets a tick every
 *   INITIATOR_TICK_MS, every rank's step reports and its cpr-* messages; its broadcasts go out
 *   through the coordinator; its commits are written to the line manifest (`<store>/manifest`,
 *   held by this process for the job's lifetime), then the manifest is pruned to
 *   `--keep-lines` and the ranks are told which lines to keep (cpr-committed).
 * - A failure of a rank (exit, heartbeat, stuck) restarts all ranks (attempt + 1) after the
 *   supervisor's back-off with jitter (src/launch/backoff.ts), at most `--max-restarts` times
 *   (counted since the last `--restart-reset`); a job-fatal error reported by a rank (e.g. a
 *   collective mismatch, a replay divergence) fails the job, since re-running cannot help.
 * - While no rank runs, the recovery line is chosen with `recoverLocal` (the newest committed
 *   line whose parts all verify; parts of aborted lines are deleted) and each rank's table
 *   names its part. No line yet: the ranks start from the beginning.
 * - The store was claimed before (src/launch/job-store.ts, `claimStore`): the policy holds its
 *   manifest. A claim to resume makes the first start a restore from the newest line that
 *   verifies (`job-resuming`); a fresh claim discards the lines it names first (with a
 *   warning saying why). Every line committed records the job and run.
 * - When the job is over (every rank gone), parts that belong to no committed line — of a
 *   round in progress at the end, or of aborted lines — are deleted, and the job record says
 *   how the run ended: the store holds only committed lines' data, and a later run knows
 *   whether there is anything to resume.
 *
 * @example
 * const policy = new CprRestartPolicy(config, await claimStore(config, { jobIdBase: "heat" }));
 * const sup = new Supervisor(config, { ...deps, policy });
 */
import { LifelineError } from "../errors.ts";
import type { CoordinatorToRank, RankToCoordinator } from "../mpi/control.ts";
import { CprInitiator, INITIATOR_TICK_MS as TICK_MS, initiatorInputOf, PHASE_TIMEOUT_MS } from "../cpr/coordinated/initiator.ts";
import { InitiatorDriver } from "../cpr/coordinated/initiator-driver.ts";
import { LevelRecoveryStore } from "../store/level-store.ts";
import { formatTime } from "../store/lines.ts";
import { recoverLocal } from "../store/recovery.ts";
import type { LineRecord, RankPartStore } from "../store/types.ts";
import { endRun, type StoreClaim } from "./job-store.ts";
import type { RunConfig } from "./options.ts";
import { FATAL_KINDS, type JobEnd, type JobView, type PolicyContext, type PolicyDecision, type RankFailure, type RestartPolicy } from "./policy.ts";

export class CprRestartPolicy implements RestartPolicy {
  readonly mode = "cpr" as const;
  private ctx: PolicyContext | undefined;
  private timer: NodeJS.Timeout | undefined;
  private restoreLine: LineRecord | undefined;
  private readonly startMs = performance.now();
  private readonly committed: number[] = [];
  private readonly rollbacks: { attempt: number; epoch: number }[] = [];
  /** The line this run resumed from (its first start restored it), if it resumed. */
  private resumedFrom: number | undefined;

  /** The initiator of the current attempt and the manifest writes it asks for. */
  private readonly driver: InitiatorDriver;

  constructor(private readonly config: RunConfig, private readonly claim: StoreClaim) {
    this.driver = new InitiatorDriver(() => claim.manifest, {
      keepLines: config.keepLines,
      lineJob: { id: claim.job.id, run: claim.job.run },
      now: () => this.now(),
      broadcast: (msg) => this.ctx?.broadcast(msg),
      // Recorded when durable: a commit that finishes after a failure stopped the initiator is
      // still a line the restart may roll back to, and the results must list it.
      onDurable: (epoch) => this.committed.push(epoch),
      onLineCommitted: (eff) => {
        this.ctx?.report({ kind: "line-committed", epoch: eff.epoch, durationMs: Math.round(eff.durationMs), bytes: eff.bytes });
      },
      onAborted: (epoch, reason) => this.ctx?.report({ kind: "warning", message: `recovery line ${epoch} aborted: ${reason}; the last committed line stays in force` }),
      onAbortNotRecorded: (epoch, err) => this.ctx?.report({ kind: "warning", message: `could not record the abort of line ${epoch}: ${err.message}` }),
    });
  }

  async attach(ctx: PolicyContext): Promise<void> {
    this.ctx = ctx;
    const manifest = this.claim.manifest;
    const action = this.claim.action;
    if (action.kind === "resume") {
      if (this.claim.programChanged !== undefined) ctx.report({ kind: "warning", message: this.claim.programChanged });
      const choice = await this.withRankStores((stores) => recoverLocal(manifest, stores, { keep: this.config.keepLines }));
      for (const w of choice.warnings) ctx.report({ kind: "warning", message: w });
      const line = choice.line;
      if (line === undefined) {
        if (this.config.resume === "resume") {
          throw new LifelineError("LAUNCH_RESUME", `--resume: no recovery line in ${this.config.store} verifies (see the warnings above); run with --fresh to start the job from the beginning`);
        }
        ctx.report({ kind: "warning", message: `no recovery line of job ${this.claim.job.id} verifies; run ${this.claim.job.run} starts from the beginning` });
      } else {
        this.restoreLine = line;
        this.resumedFrom = line.epoch;
        ctx.report({
          kind: "job-resuming", job: this.claim.job.id, run: this.claim.job.run, epoch: line.epoch,
          lineTime: formatTime(line.timeMs), lineRun: line.job?.run, previousState: action.job.state, previousExitCode: action.job.exitCode,
        });
      }
    } else {
      const discard = action.discard;
      if (discard.length > 0) {
        const newest = discard[discard.length - 1]!;
        ctx.report({ kind: "warning", message: `discarding the ${discard.length} recovery line(s) in ${this.config.store} (newest: line ${newest.epoch}, committed ${formatTime(newest.timeMs)}): ${action.why ?? "starting over"}` });
        for (const line of discard) await manifest.abortLine(line.epoch);
      }
      await this.withRankStores((stores) => Promise.all(stores.map((s) => s.retain([], { dropNewer: true }))));
    }
    this.timer = setInterval(() => this.driver.input({ kind: "tick", nowMs: this.now() }), TICK_MS);
    this.timer.unref();
  }

  onReady(): void {
    const every = this.config.checkpointEvery.kind === "time" ? { ms: this.config.checkpointEvery.ms } : { steps: this.config.checkpointEvery.steps };
    this.driver.start(new CprInitiator({
      size: this.config.size,
      every,
      committedEpoch: this.restoreLine?.epoch ?? 0,
      keepLines: this.config.keepLines,
      phaseTimeoutMs: PHASE_TIMEOUT_MS,
      nowMs: this.now(),
    }));
  }

  onStep(rank: number, steps: number): void {
    this.driver.input({ kind: "step", rank, steps, nowMs: this.now() });
  }

  onCprMessage(rank: number, msg: Extract<RankToCoordinator, { t: `cpr-${string}` }>): void {
    this.driver.input(initiatorInputOf(rank, msg, this.now()));
  }

  decide(failure: RankFailure, job: JobView): PolicyDecision {
    if (FATAL_KINDS.includes(failure.kind)) return { kind: "fail-job" };
    if (job.restarts >= job.maxRestarts) {
      return {
        kind: "fail-job",
        code: "LAUNCH_RESTARTS",
        message: `${failure.message}; giving up: the job was already restarted ${job.restarts} time(s) (--max-restarts ${job.maxRestarts})`,
      };
    }
    // Stop the initiator now: messages of the dying attempt must not start or commit a line.
    this.driver.stop();
    return { kind: "restart", ranks: Array.from({ length: job.size }, (_, r) => r), delayMs: job.backoffMs };
  }

  async prepareRestart(attempt: number): Promise<void> {
    this.driver.stop();
    await this.driver.settled();
    const manifest = this.claim.manifest;
    const choice = await this.withRankStores((stores) => recoverLocal(manifest, stores, { keep: this.config.keepLines }));
    for (const w of choice.warnings) this.ctx?.report({ kind: "warning", message: w });
    this.restoreLine = choice.line;
    const epoch = choice.line?.epoch ?? 0;
    this.rollbacks.push({ attempt, epoch });
    this.ctx?.report({ kind: "job-restarting", attempt, epoch, restarts: attempt });
  }

  tableFor(rank: number): Partial<Extract<CoordinatorToRank, { t: "table" }>> {
    const line = this.restoreLine;
    if (line === undefined) return {};
    const ref = line.parts[rank]!;
    return { restore: { epoch: line.epoch, ref: { rank: ref.rank, epoch: ref.epoch, checksum: ref.checksum, bytes: ref.bytes } } };
  }

  summary(): Record<string, unknown> {
    return {
      linesCommitted: [...this.committed], rollbacks: [...this.rollbacks],
      ...(this.resumedFrom === undefined ? {} : { resumedFrom: this.resumedFrom }),
    };
  }

  async close(end: JobEnd): Promise<void> {
    if (this.timer !== undefined) clearInterval(this.timer);
    // A commit still being written finishes first, and is recorded: the results file must list
    // every line that is durable in the manifest.
    await this.driver.settled();
    this.driver.stop();
    const manifest = this.claim.manifest;
    try {
      // No rank runs any more: parts of no committed line (a round in progress at the end, an
      // aborted line whose ranks had no time to delete their parts) go now.
      const kept = (await manifest.list()).map((l) => l.epoch);
      await this.withRankStores((stores) => Promise.all(stores.map((s) => s.retain(kept, { dropNewer: true }))));
    } catch (err) {
      this.ctx?.report({ kind: "warning", message: `could not delete the parts of unfinished lines: ${(err as Error).message} (the next run of this job deletes them)` });
    } finally {
      const problem = await endRun(this.claim, { state: end.ok ? "finished" : end.interrupted ? "stopped" : "failed", exitCode: end.exitCode });
      if (problem !== undefined) this.ctx?.report({ kind: "warning", message: problem });
      await manifest.close();
    }
  }

  private async withRankStores<T>(fn: (stores: RankPartStore[]) => Promise<T>): Promise<T> {
    const store = new LevelRecoveryStore(this.config.store);
    const stores: RankPartStore[] = [];
    try {
      for (let r = 0; r < this.config.size; r++) stores.push(await store.openRank(r));
      return await fn(stores);
    } finally {
      await Promise.all(stores.map((s) => s.close()));
    }
  }

  private now(): number {
    return performance.now() - this.startMs;
  }
}
