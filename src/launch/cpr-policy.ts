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
import { chooseAcrossHosts, partnerOf, type HostReport, type PartSource } from "../store/partners.ts";
import { recoverLocal } from "../store/recovery.ts";
import type { LineRecord, PartRef, RankPartStore } from "../store/types.ts";
import { endRun, type StoreClaim } from "./job-store.ts";

/** Per-host stores: how long the ranks have to report their parts, and to send one copy. */
const PREPARE_TIMEOUT_MS = 60_000;
import type { RunConfig } from "./options.ts";
import { type JobEnd, type JobView, type PolicyContext, type PolicyDecision, type RankFailure, restartAllDecision, type RestartPolicy } from "./policy.ts";

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
  /** Per-host stores (`--store-scope host`): see {@link beforeTables}. */
  private readonly perHost: boolean;
  /** Per-host stores: the start of all ranks being prepared (the first, or a restart's). */
  private pendingStart: { kind: "resume" } | { kind: "restart"; attempt: number } | { kind: "fresh" } = { kind: "fresh" };
  private partners: (number | undefined)[] | undefined;
  private keep: number[] = [];
  /** Per-host stores: parts fetched from partner copies, by rank, for the tables. */
  private fetched = new Map<number, Uint8Array>();
  /** Per-host stores: the answers awaited from the ranks before the tables go out. */
  private awaiting:
    | { kind: "held"; rank: number; done: (parts: HostReport["parts"]) => void }
    | { kind: "copy"; rank: number; of: number; epoch: number; done: (part: Uint8Array | undefined, error: string | undefined) => void }
    | undefined;
  /** Per-host stores: ends the wait of a preparation under way (a restart began). */
  private cancelPrepare: (() => void) | undefined;
  /** Per-host stores: the commit record of each line made durable, for its `cpr-committed`. */
  private readonly records = new Map<number, LineRecord>();

  /** The initiator of the current attempt and the manifest writes it asks for. */
  private readonly driver: InitiatorDriver;

  constructor(
    private readonly config: RunConfig,
    private readonly claim: StoreClaim,
  ) {
    this.perHost = config.storeScope === "host";
    this.driver = new InitiatorDriver(() => claim.manifest, {
      keepLines: config.keepLines,
      lineJob: { id: claim.job.id, run: claim.job.run },
      now: () => this.now(),
      broadcast: (msg) => this.ctx?.broadcast(this.withRecord(msg)),
      // Recorded when durable: a commit that finishes after a failure stopped the initiator is
      // still a line the restart may roll back to, and the results must list it.
      onDurable: (record) => {
        this.committed.push(record.epoch);
        if (this.perHost) this.records.set(record.epoch, record);
      },
      onLineCommitted: (eff) => {
        this.ctx?.report({ kind: "line-committed", epoch: eff.epoch, durationMs: Math.round(eff.durationMs), bytes: eff.bytes, steps: eff.steps });
      },
      onAborted: (epoch, reason) =>
        this.ctx?.report({ kind: "warning", message: `recovery line ${epoch} aborted: ${reason}; the last committed line stays in force` }),
      onAbortNotRecorded: (epoch, err) => this.ctx?.report({ kind: "warning", message: `could not record the abort of line ${epoch}: ${err.message}` }),
    });
  }

  async attach(ctx: PolicyContext): Promise<void> {
    this.ctx = ctx;
    const manifest = this.claim.manifest;
    const action = this.claim.action;
    if (this.claim.adopted !== undefined) ctx.report({ kind: "warning", message: this.claim.adopted });
    if (this.perHost) {
      // The parts are on the ranks' hosts: the ranks report what they hold once started, and
      // the line is chosen then (beforeTables). Here only the manifest is prepared.
      if (action.kind === "resume") {
        if (this.claim.programChanged !== undefined) ctx.report({ kind: "warning", message: this.claim.programChanged });
        this.pendingStart = { kind: "resume" };
      } else {
        await this.discard(ctx, action);
      }
      this.startTicks();
      return;
    }
    if (action.kind === "resume") {
      if (this.claim.programChanged !== undefined) ctx.report({ kind: "warning", message: this.claim.programChanged });
      const choice = await this.withRankStores((stores) => recoverLocal(manifest, stores, { keep: this.config.keepLines }));
      for (const w of choice.warnings) ctx.report({ kind: "warning", message: w });
      const line = choice.line;
      if (line === undefined) {
        if (this.config.resume === "resume") {
          throw new LifelineError(
            "LAUNCH_RESUME",
            `--resume: no recovery line in ${this.config.store} verifies (see the warnings above); run with --fresh to start the job from the beginning`,
          );
        }
        ctx.report({ kind: "warning", message: `no recovery line of job ${this.claim.job.id} verifies; run ${this.claim.job.run} starts from the beginning` });
      } else {
        this.restoreLine = line;
        this.resumedFrom = line.epoch;
        ctx.report({
          kind: "job-resuming",
          job: this.claim.job.id,
          run: this.claim.job.run,
          epoch: line.epoch,
          lineTime: formatTime(line.timeMs),
          lineRun: line.job?.run,
          previousState: action.job.state,
          previousExitCode: action.job.exitCode,
        });
      }
    } else {
      await this.discard(ctx, action);
      await this.withRankStores((stores) => Promise.all(stores.map((s) => s.retain([], { dropNewer: true }))));
    }
    this.startTicks();
  }

  private async discard(ctx: PolicyContext, action: Extract<StoreClaim["action"], { kind: "fresh" }>): Promise<void> {
    const discard = action.discard;
    if (discard.length === 0) return;
    const newest = discard[discard.length - 1]!;
    ctx.report({
      kind: "warning",
      message: `discarding the ${discard.length} recovery line(s) in ${this.config.store} (newest: line ${newest.epoch}, committed ${formatTime(newest.timeMs)}): ${action.why ?? "starting over"}`,
    });
    for (const line of discard) await this.claim.manifest.abortLine(line.epoch);
  }

  private startTicks(): void {
    this.timer = setInterval(() => this.driver.input({ kind: "tick", nowMs: this.now() }), TICK_MS);
    this.timer.unref();
  }

  /**
   * Per-host stores: every rank of this start said hello. Each reports the parts it verified
   * in its own store and the partner copies it keeps (`cpr-inventory` / `cpr-held`); the
   * newest committed line whose every part is somewhere is chosen
   * ({@link chooseAcrossHosts}), newer ones are retracted, and each part that only a partner
   * holds (its rank's host was lost) is fetched (`cpr-fetch` / `cpr-copy`) and goes to its rank
   * in the table. A copy that cannot be fetched counts as missing and the choice is made again.
   */
  async beforeTables(hosts: readonly number[] | undefined): Promise<void> {
    if (!this.perHost) return;
    const ctx = this.ctx!;
    const hostOf = hosts ?? Array.from({ length: this.config.size }, () => 0);
    this.partners = hostOf.map((_, r) => partnerOf(r, hostOf));
    this.fetched = new Map();
    const manifest = this.claim.manifest;
    const start = this.pendingStart;
    this.pendingStart = { kind: "fresh" };
    let line: LineRecord | undefined;
    if (start.kind !== "fresh" && (await manifest.list()).length > 0) {
      const reports = await this.askHosts(hostOf);
      for (;;) {
        const choice = chooseAcrossHosts(await manifest.list(), reports, hostOf);
        for (const w of choice.warnings) ctx.report({ kind: "warning", message: w });
        for (const { epoch } of choice.skipped) await manifest.abortLine(epoch);
        line = choice.line;
        if (line === undefined) break;
        const lost = await this.fetchCopies(line, choice.sources);
        if (lost === undefined) break;
        // The holder could not send it after all: that copy does not count; choose again.
        const i = reports.findIndex((rep) => rep.rank === lost.holder);
        const rep = reports[i]!;
        reports[i] = { ...rep, parts: rep.parts.filter((p) => !(p.where === lost.where && p.ref.rank === lost.ref.rank && p.ref.epoch === lost.ref.epoch)) };
        ctx.report({
          kind: "warning",
          message: `rank ${lost.holder} could not send rank ${lost.ref.rank}'s part of line ${lost.ref.epoch} (${lost.where}): ${lost.error}`,
        });
      }
    }
    await manifest.prune(this.config.keepLines);
    this.keep = (await manifest.list()).map((l) => l.epoch);
    this.restoreLine = line;
    if (start.kind === "resume") {
      if (line === undefined) {
        if (this.config.resume === "resume")
          throw new LifelineError(
            "LAUNCH_RESUME",
            `--resume: no recovery line of job ${this.claim.job.id} is complete on the hosts of this run (see the warnings above); run with --fresh to start the job from the beginning`,
          );
        ctx.report({
          kind: "warning",
          message: `no recovery line of job ${this.claim.job.id} is complete on these hosts; run ${this.claim.job.run} starts from the beginning`,
        });
      } else {
        this.resumedFrom = line.epoch;
        const action = this.claim.action as Extract<StoreClaim["action"], { kind: "resume" }>;
        ctx.report({
          kind: "job-resuming",
          job: this.claim.job.id,
          run: this.claim.job.run,
          epoch: line.epoch,
          lineTime: formatTime(line.timeMs),
          lineRun: line.job?.run,
          previousState: action.job.state,
          previousExitCode: action.job.exitCode,
        });
      }
    } else if (start.kind === "restart") {
      const epoch = line?.epoch ?? 0;
      this.rollbacks.push({ attempt: start.attempt, epoch });
      ctx.report({ kind: "job-restarting", attempt: start.attempt, epoch, restarts: start.attempt });
    }
  }

  /**
   * Asks one rank per host (the lowest) what its host's store holds, one host after the other
   * (a store directory shared by several hosts is then read by one at a time).
   */
  private async askHosts(hostOf: readonly number[]): Promise<HostReport[]> {
    const reports: HostReport[] = [];
    const asked = new Set<number>();
    for (let r = 0; r < hostOf.length; r++) {
      const host = hostOf[r]!;
      if (asked.has(host)) continue;
      asked.add(host);
      const parts = await this.await_<HostReport["parts"]>(`rank ${r}'s report of the parts on its host`, (resolve) => {
        this.awaiting = { kind: "held", rank: r, done: resolve };
        this.ctx!.send(r, { t: "cpr-inventory" });
      });
      reports.push({ host, rank: r, parts });
    }
    return reports;
  }

  /**
   * Fetches the partner copies the chosen line needs into {@link fetched}. Resolves to the copy
   * that could not be fetched (the choice must be made again), or undefined when all arrived.
   */
  private async fetchCopies(
    line: LineRecord,
    sources: readonly PartSource[],
  ): Promise<{ holder: number; where: string; ref: PartRef; error: string } | undefined> {
    for (let r = 0; r < sources.length; r++) {
      const src = sources[r]!;
      if (src.kind !== "copy") continue;
      const ref = line.parts[r]!;
      const answer = await this.await_<{ part: Uint8Array | undefined; error: string | undefined }>(
        `rank ${src.holder}'s copy of rank ${r}'s part of line ${line.epoch}`,
        (resolve) => {
          this.awaiting = { kind: "copy", rank: src.holder, of: r, epoch: line.epoch, done: (part, error) => resolve({ part, error }) };
          this.ctx!.send(src.holder, {
            t: "cpr-fetch",
            of: r,
            ref: { rank: ref.rank, epoch: ref.epoch, checksum: ref.checksum, bytes: ref.bytes },
            where: src.where,
          });
        },
      );
      if (answer.part === undefined) return { holder: src.holder, where: src.where, ref, error: answer.error ?? "no bytes" };
      this.fetched.set(r, answer.part);
      const what = src.where.startsWith("held-by-") ? "the partner copy" : "its own part store";
      this.ctx?.report({
        kind: "warning",
        message: `rank ${r}'s part of line ${line.epoch} is not on its host: restoring it from ${what} on rank ${src.holder}'s host (${src.where})`,
      });
    }
    return undefined;
  }

  /**
   * Sends a request (`begin`) and waits for its answer: at most PREPARE_TIMEOUT_MS (then it
   * rejects: the job fails with `restore`), and only until a restart or the end of the job
   * cancels it, so the preparation of a start that is over cannot touch the next one's state.
   */
  private await_<T>(what: string, begin: (resolve: (v: T) => void) => void): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const settle = (): void => {
        clearTimeout(timer);
        this.awaiting = undefined;
        this.cancelPrepare = undefined;
      };
      const timer = setTimeout(() => {
        settle();
        reject(new LifelineError("CPR_RESTORE", `${what} did not arrive within ${PREPARE_TIMEOUT_MS / 1000} s`));
      }, PREPARE_TIMEOUT_MS);
      timer.unref();
      // Cancelled, the wait never ends: the preparation of that start stops where it is, and
      // the coordinator neither sends its tables nor reports it failed (a new round begins).
      this.cancelPrepare = settle;
      begin((v) => {
        settle();
        resolve(v);
      });
    });
  }

  /** A rank's answer while the tables are being prepared (per-host stores). */
  private onPrepareAnswer(rank: number, msg: Extract<RankToCoordinator, { t: "cpr-held" | "cpr-copy" }>): void {
    const w = this.awaiting;
    if (w === undefined) return;
    if (msg.t === "cpr-held" && w.kind === "held" && rank === w.rank) {
      w.done(msg.parts);
    } else if (msg.t === "cpr-copy" && w.kind === "copy" && rank === w.rank && msg.of === w.of && msg.epoch === w.epoch) {
      w.done(msg.part, msg.error);
    }
  }

  /** Per-host stores: a `cpr-committed` carries the commit record and the job record. */
  private withRecord(msg: CoordinatorToRank): CoordinatorToRank {
    if (!this.perHost || msg.t !== "cpr-committed") return msg;
    const record = this.records.get(msg.epoch);
    this.records.clear();
    if (record === undefined) return msg;
    const line = {
      epoch: record.epoch,
      timeMs: record.timeMs,
      parts: record.parts.map((p) => ({ ...p })),
      ...(record.job === undefined ? {} : { job: record.job }),
    };
    return { ...msg, line, job: { ...this.claim.job } };
  }

  onReady(): void {
    const every = this.config.checkpointEvery.kind === "time" ? { ms: this.config.checkpointEvery.ms } : { steps: this.config.checkpointEvery.steps };
    this.driver.start(
      new CprInitiator({
        size: this.config.size,
        every,
        committedEpoch: this.restoreLine?.epoch ?? 0,
        keepLines: this.config.keepLines,
        phaseTimeoutMs: PHASE_TIMEOUT_MS,
        nowMs: this.now(),
      }),
    );
  }

  onStep(rank: number, steps: number): void {
    this.driver.input({ kind: "step", rank, steps, nowMs: this.now() });
  }

  onCprMessage(rank: number, msg: Extract<RankToCoordinator, { t: `cpr-${string}` }>): void {
    if (msg.t === "cpr-held" || msg.t === "cpr-copy") this.onPrepareAnswer(rank, msg);
    else if (msg.t !== "cpr-durable") this.driver.input(initiatorInputOf(rank, msg, this.now())); // retry-one's own
  }

  decide(failure: RankFailure, job: JobView): PolicyDecision {
    const decision = restartAllDecision(failure, job);
    // Stop the initiator now: messages of the dying attempt must not start or commit a line.
    if (decision.kind === "restart") this.driver.stop();
    return decision;
  }

  async prepareRestart(attempt: number): Promise<void> {
    this.driver.stop();
    await this.driver.settled();
    this.cancelPrepare?.();
    if (this.perHost) {
      this.pendingStart = { kind: "restart", attempt };
      return;
    }
    const manifest = this.claim.manifest;
    const choice = await this.withRankStores((stores) => recoverLocal(manifest, stores, { keep: this.config.keepLines }));
    for (const w of choice.warnings) this.ctx?.report({ kind: "warning", message: w });
    this.restoreLine = choice.line;
    const epoch = choice.line?.epoch ?? 0;
    this.rollbacks.push({ attempt, epoch });
    this.ctx?.report({ kind: "job-restarting", attempt, epoch, restarts: attempt });
  }

  tableFor(rank: number): Partial<Extract<CoordinatorToRank, { t: "table" }>> {
    const every = this.config.checkpointEvery;
    const hostFields = {
      ...(this.perHost ? { keep: [...this.keep], ...(this.partners?.[rank] === undefined ? {} : { partner: this.partners[rank] }) } : {}),
      ...(every.kind === "steps" ? { checkpointSteps: every.steps } : {}),
    };
    const line = this.restoreLine;
    if (line === undefined) return hostFields;
    const ref = line.parts[rank]!;
    const part = this.fetched.get(rank);
    return {
      ...hostFields,
      restore: {
        epoch: line.epoch,
        ref: { rank: ref.rank, epoch: ref.epoch, checksum: ref.checksum, bytes: ref.bytes },
        ...(part === undefined ? {} : { part }),
      },
    };
  }

  summary(): Record<string, unknown> {
    return {
      linesCommitted: [...this.committed],
      rollbacks: [...this.rollbacks],
      ...(this.resumedFrom === undefined ? {} : { resumedFrom: this.resumedFrom }),
    };
  }

  async close(end: JobEnd): Promise<void> {
    if (this.timer !== undefined) clearInterval(this.timer);
    this.cancelPrepare?.();
    // A commit still being written finishes first, and is recorded: the results file must list
    // every line that is durable in the manifest.
    await this.driver.settled();
    this.driver.stop();
    const manifest = this.claim.manifest;
    try {
      // Per-host stores: the parts are on the ranks' disks; each rank deletes what belongs to no
      // kept line when it next starts (its table's `keep`).
      if (this.perHost) return;
      // No rank runs any more: parts of no committed line (a round in progress at the end, an
      // aborted line whose ranks had no time to delete their parts) go now.
      const kept = (await manifest.list()).map((l) => l.epoch);
      await this.withRankStores((stores) => Promise.all(stores.map((s) => s.retain(kept, { dropNewer: true }))));
    } catch (err) {
      this.ctx?.report({
        kind: "warning",
        message: `could not delete the parts of unfinished lines: ${(err as Error).message} (the next run of this job deletes them)`,
      });
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
