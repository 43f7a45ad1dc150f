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
 * - A new job discards the lines an earlier job left in the same store (with a warning):
 *   a run never silently resumes someone else's state.
 *
 * @example
 * const policy = new CprRestartPolicy(config);
 * const sup = new Supervisor(config, { ...deps, policy });
 */
import { LifelineError } from "../errors.ts";
import type { CoordinatorToRank, RankToCoordinator } from "../mpi/control.ts";
import { CprInitiator, INITIATOR_TICK_MS as TICK_MS, initiatorInputOf, PHASE_TIMEOUT_MS } from "../cpr/coordinated/initiator.ts";
import { InitiatorDriver } from "../cpr/coordinated/initiator-driver.ts";
import { LevelRecoveryStore } from "../store/level-store.ts";
import { recoverLocal } from "../store/recovery.ts";
import type { LineManifest, LineRecord, RankPartStore } from "../store/types.ts";
import type { RunConfig } from "./options.ts";
import { FATAL_KINDS, type JobView, type PolicyContext, type PolicyDecision, type RankFailure, type RestartPolicy } from "./supervisor.ts";



export class CprRestartPolicy implements RestartPolicy {
  readonly mode = "cpr" as const;
  private ctx: PolicyContext | undefined;
  private manifest: LineManifest | undefined;
  private timer: NodeJS.Timeout | undefined;
  private restoreLine: LineRecord | undefined;
  private readonly startMs = performance.now();
  private readonly committed: number[] = [];
  private readonly rollbacks: { attempt: number; epoch: number }[] = [];

  /** The initiator of the current attempt and the manifest writes it asks for. */
  private readonly driver: InitiatorDriver;

  constructor(private readonly config: RunConfig) {
    this.driver = new InitiatorDriver(() => this.mustManifest(), {
      keepLines: config.keepLines,
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
    const store = new LevelRecoveryStore(this.config.store);
    this.manifest = await store.openManifest();
    const old = await this.manifest.list();
    if (old.length > 0) {
      ctx.report({ kind: "warning", message: `store ${this.config.store} holds ${old.length} recovery line(s) of an earlier job (newest ${old[old.length - 1]!.epoch}); a new job starts from the beginning and discards them` });
      for (const line of old) await this.manifest.abortLine(line.epoch);
    }
    await this.withRankStores((stores) => Promise.all(stores.map((s) => s.retain([], { dropNewer: true }))));
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
    const manifest = this.mustManifest();
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
    return { linesCommitted: [...this.committed], rollbacks: [...this.rollbacks] };
  }

  async close(): Promise<void> {
    if (this.timer !== undefined) clearInterval(this.timer);
    // A commit still being written finishes first, and is recorded: the results file must list
    // every line that is durable in the manifest.
    await this.driver.settled();
    this.driver.stop();
    await this.manifest?.close();
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

  private mustManifest(): LineManifest {
    if (this.manifest === undefined) throw new LifelineError("STORE_NOT_OPEN", "the cpr policy's manifest is not open");
    return this.manifest;
  }

  private now(): number {
    return performance.now() - this.startMs;
  }
}
