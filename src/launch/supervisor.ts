/**
 * The supervisor runs one job: it starts the coordinator and the rank processes, watches
 * them (process exits at once; frozen or hung ranks through {@link FailureDetector}), and
 * decides what a failure means through a {@link RestartPolicy} (the contract: policy.ts):
 * fail-fast (`--mode none`), restart all (cpr, cpr-policy.ts) or restart one (retry-one).
 *
 * Before it asks the policy, the supervisor recognises a crash loop: a rank that fails the
 * same way (same kind, exit code or signal, and first error line) in two consecutive attempts
 * without reaching its first `checkpoint()` is a bug in the program or its arguments, not a
 * fault; restarting it again would only repeat it, so the job stops (`LAUNCH_CRASH_LOOP`).
 * Faults injected on purpose (`--inject`, drills) never count.
 *
 * Teardown guarantees: when the job fails or is interrupted, every live rank is sent `abort`
 * on the control channel and SIGTERM (plus SIGCONT, for frozen ones) to its process group,
 * then SIGKILL after a grace period; the supervisor resolves only once every rank process
 * has exited. {@link Supervisor.killAllNow} is the synchronous last resort for a launcher
 * that is exiting abnormally; if the launcher is SIGKILLed, ranks see EOF on their watch pipe.
 *
 * @example
 * const sup = new Supervisor(config, { reporter, runDir, jobId, keys: makeJobKeys({ curve: true }), baseEnv: process.env });
 * process.once("SIGINT", () => sup.interrupt("SIGINT"));
 * const outcome = await sup.run(); // { ok, exitCode, results, error, ... }
 */
import { mkdirSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { rankKeyText, writeKeyFile, type JobKeys } from "../mpi/keys.ts";
import { constants as osConstants } from "node:os";
import { dirname, join } from "node:path";
import { EXIT_COORDINATOR_LOST } from "../mpi/control.ts";
import { LifelineError, errorMessage, isLifelineError, type LifelineErrorCode } from "../errors.ts";
import { ENV, type Mode } from "../mpi/env.ts";
import { backoffDelayMs, RestartBudget } from "./backoff.ts";
import { failFastPolicy, type RankFailure, type RestartPolicy } from "./policy.ts";
import { Coordinator, type CoordinatorEvent } from "./coordinator.ts";
import { CprRestartPolicy } from "./cpr-policy.ts";
import { ElasticPolicy } from "./elastic-policy.ts";
import { FailureDetector, type Suspicion } from "./detector.ts";
import { detectorTickMs, rankAbortCode, suspicionCode, suspicionText } from "./watch.ts";
import type { StoreClaim } from "./job-store.ts";
import { ERROR_FILE_NAME } from "../store/level-store.ts";
import { RetryOnePolicy } from "./retry-one-policy.ts";
import type { RunConfig } from "./options.ts";
import type { Reporter } from "./progress.ts";
import { addressOf, Placement } from "./hosts.ts";
import { spawnSpare, withMallocTunables, type RankExit, type RankOutputSink, type RankProcess, type RankSpawnSpec, type SpareProcess } from "./rank-process.ts";
import { rankLauncherFor, type RankLauncher } from "./spawners.ts";

/** Grace between SIGTERM and SIGKILL when a failure stops the job (fail fast: all gone within 1 s). */
export const FAIL_FAST_GRACE_MS = 500;
/** Grace between SIGTERM and SIGKILL when the user interrupts the launcher. */
export const INTERRUPT_GRACE_MS = 2_000;
/** How long ranks may take to exit after `release` before they are killed. */
export const RELEASE_EXIT_TIMEOUT_MS = 10_000;
/** New spares start this long after a restarted rank said hello (retry-one) or the job started (cpr). */
const SPARE_REFILL_DELAY_MS = 1_000;
/** A second stop signal within this window of the first is the same signal delivered twice. */
const REPEAT_SIGNAL_WINDOW_MS = 500;
/** How long to wait for a dead rank's last output before writing its failure message. */
const OUTPUT_DRAIN_WAIT_MS = 300;
/** How long to wait for all output pipes to drain once every rank has exited. */
const FINAL_DRAIN_WAIT_MS = 500;

/** One entry of the `--error-file` (docs/cli.md, "Error file"). */
export interface FailureRecord {
  /** The failed rank; absent for job-level failures (rendezvous, spawn). */
  rank: number | undefined;
  /** Which start of the rank failed: 0 for the first, k after k restarts. */
  attempt: number;
  pid: number | undefined;
  /** What was seen: the process exited (code) or died of a signal, or the launcher's detectors fired. */
  cause: "exit-code" | "signal" | "heartbeat" | "stuck" | "start" | "abort" | "bad-result" | "rendezvous" | "release-hang" | "spawn" | "restore";
  exitCode: number | null;
  signal: string | null;
  /** The error code of the failure (LAUNCH_RANK_FAILED, LAUNCH_HEARTBEAT, LAUNCH_STUCK, ...). */
  code: LifelineErrorCode;
  message: string;
  /** Wall-clock time the launcher detected the failure (ISO 8601), and ms since the job started. */
  time: string;
  elapsedMs: number;
  /** What the launcher did about it: restart (the job went on), go on without the rank (elastic) or fail the job. */
  action: "restart" | "continue" | "fail-job";
  /** The rank's last stderr lines. */
  stderrTail: string[];
}

/** The policy of a mode that needs nothing but the mode (cpr needs the run configuration). */
export function policyFor(mode: Mode): RestartPolicy {
  switch (mode) {
    case "none":
      return failFastPolicy;
    case "cpr":
      throw new LifelineError("LAUNCH_USAGE", "mode cpr needs the run configuration: construct a CprRestartPolicy");
    case "retry-one":
      return new RetryOnePolicy();
    case "elastic":
      throw new LifelineError("LAUNCH_USAGE", "mode elastic needs the run configuration: construct an ElasticPolicy");
  }
}

/** How a job ended. */
export interface JobOutcome {
  ok: boolean;
  /** The launcher's exit code (docs/cli.md, "Exit codes"). */
  exitCode: number;
  wallMs: number;
  size: number;
  finalizedCount: number;
  /** Decoded finalize() results by rank; `undefined` for ranks that did not finalize. */
  results: unknown[];
  restarts: number;
  /** Why the job failed: one-line `message` plus the failed rank's stderr tail. */
  error: LifelineError | undefined;
  /** The failure in one line (for summaries and JSON events). */
  summary: string | undefined;
  /** Pids of every rank process started, for diagnostics (and tests that check none survive). */
  pids: number[];
  /** The policy's account of recovery (cpr: lines committed, epochs rolled back to). */
  recovery?: Record<string, unknown> | undefined;
}

/** What a {@link Supervisor} needs besides the run configuration. */
export interface SupervisorDeps {
  reporter: Reporter;
  /** Private directory for ipc endpoints; the caller creates and removes it. */
  runDir: string;
  jobId: string;
  /**
   * The job's keys (src/mpi/keys.ts): each rank incarnation gets its own key file (0600, in
   * `runDir`), or, on another host, the same text on its stdin.
   */
  keys: JobKeys;
  /** Environment the ranks inherit (LIFELINE_* entries in it are replaced). */
  baseEnv: NodeJS.ProcessEnv;
  policy?: RestartPolicy;
  /** Overrides {@link RELEASE_EXIT_TIMEOUT_MS} (for embedding and tests). */
  releaseExitTimeoutMs?: number;
  /** Random source of the restart back-off's jitter, in [0, 1) (default Math.random; seeded in tests). */
  random?: () => number;
  /** cpr: the store, claimed for this run (src/launch/job-store.ts); required in cpr unless `policy` is given. */
  claim?: StoreClaim;
  /** The file the ranks run, when not `config.app` itself (a `.ts` program compiled for the job: compile-cache.ts). */
  runApp?: string;
}

export class Supervisor {
  private readonly policy: RestartPolicy;
  private readonly procs: (RankProcess | undefined)[];
  private readonly finalized: boolean[];
  private readonly results: unknown[];
  private readonly detector: FailureDetector;
  private coordinator: Coordinator | undefined;
  private readonly startMs = performance.now();
  private failure: RankFailure | undefined;
  private failureDetail: string | undefined;
  private failureReported: Promise<void> = Promise.resolve();
  private stopping = false;
  private interruptedBy: NodeJS.Signals | undefined;
  private interruptedAtMs = 0;
  private spawning = false;
  private detectorTimer: NodeJS.Timeout | undefined;
  private releaseTimer: NodeJS.Timeout | undefined;
  /** Every rank finalized and was told to exit: the results are all in. */
  private released = false;
  private resolveAllExited: (() => void) | undefined;
  private readonly pids: number[] = [];
  private restarts = 0;
  /** All ranks are being stopped and started again (attempt + 1). */
  private restarting = false;
  /** retry-one: ranks being restarted alone (the others keep running). */
  private readonly replacing = new Set<number>();
  /** elastic: processes the job went on without (their failure is dealt with, their end is no news). */
  private readonly letGo = new Set<RankProcess>();
  /**
   * Warm processes waiting to take a restarted rank's place (see spare-entry.ts): one in
   * retry-one (one rank restarts), one per rank in cpr (all restart).
   */
  private spares: SpareProcess[] = [];
  private sparesStarting = 0;
  private spareTimer: NodeJS.Timeout | undefined;
  private spareWarned = false;
  private readonly budget: RestartBudget;
  private readonly errorFile: string;
  private readonly failureRecords: FailureRecord[] = [];
  /** Every rank failure that reached the policy, for the final error. */
  private readonly history: { rank: number | undefined; attempt: number; cause: string }[] = [];
  private errorFileWritten: Promise<void> = Promise.resolve();
  /** Each rank's current process reached a step boundary (a checkpoint() call). */
  private readonly progressed: boolean[];
  /**
   * The last failure that might start a crash loop, by restart unit: the job in cpr (every
   * rank restarts together), the rank in retry-one.
   */
  private readonly loopWatch = new Map<string, { signature: string; attempt: number; text: string }>();
  /** How ranks are started: here, through a remote shell, or as Slurm job steps (`--launcher`). */
  private readonly launcher: RankLauncher;
  /** Which rank runs on which of the launcher's hosts (undefined: every rank on this host). */
  private readonly placement: Placement | undefined;
  /** Each rank's host at the start, for every table of the job (retry-one's replica placement). */
  private readonly initialHosts: number[] | undefined;

  constructor(
    private readonly config: RunConfig,
    private readonly deps: SupervisorDeps,
  ) {
    this.policy =
      deps.policy ??
      (config.mode === "cpr"
        ? new CprRestartPolicy(config, claimOf(deps))
        : config.mode === "retry-one"
          ? new RetryOnePolicy(config, deps.claim)
          : config.mode === "elastic" && config.elastic !== undefined
            ? new ElasticPolicy(config.elastic)
            : policyFor(config.mode));
    this.progressed = new Array<boolean>(config.size).fill(false);
    this.launcher = rankLauncherFor(config);
    this.placement = this.launcher.hosts === undefined ? undefined : new Placement(this.launcher.hosts, config.size);
    this.initialHosts = this.placement?.groups();
    this.procs = new Array<RankProcess | undefined>(config.size).fill(undefined);
    this.finalized = new Array<boolean>(config.size).fill(false);
    this.results = new Array<unknown>(config.size).fill(undefined);
    this.detector = new FailureDetector({
      size: config.size,
      failureTimeoutMs: config.failureTimeoutMs,
      stuckTimeoutMs: config.stuckTimeoutMs,
      startTimeoutMs: config.startTimeoutMs,
    });
    this.budget = new RestartBudget({ maxRestarts: config.maxRestarts, resetAfterMs: config.restartResetMs });
    this.errorFile = config.errorFile ?? join(config.store, ERROR_FILE_NAME);
  }

  /** Runs the job to the end. Never rejects for rank failures: they are in the outcome. */
  async run(): Promise<JobOutcome> {
    const allExited = new Promise<void>((resolve) => (this.resolveAllExited = resolve));
    // A failure record left by an earlier job in the same place would be taken for this one's.
    try {
      rmSync(this.errorFile, { force: true });
    } catch (err) {
      this.deps.reporter.event({ kind: "warning", message: `cannot remove the old error file ${this.errorFile}: ${errorMessage(err)}` });
    }
    const coordinator = new Coordinator({
      size: this.config.size,
      keys: this.deps.keys,
      maxMessageBytes: this.config.maxMessageBytes,
      transport: this.config.transport,
      host: this.config.bindAddress,
      mode: this.config.mode,
      runDir: this.deps.runDir,
      rendezvousTimeoutMs: this.config.rendezvousTimeoutMs,
      onEvent: (ev) => this.onCoordinatorEvent(ev),
      tableFor: this.policy.tableFor === undefined ? undefined : (rank) => this.policy.tableFor!(rank),
      beforeTables: this.policy.beforeTables === undefined ? undefined : () => this.policy.beforeTables!(this.placement?.groups()),
      hosts: this.initialHosts,
      elastic: this.config.elastic === undefined ? undefined : { ...this.config.elastic, slots: this.config.size },
    });
    this.coordinator = coordinator;
    try {
      const endpoint = await coordinator.start();
      this.deps.reporter.event({
        kind: "job-starting",
        job: this.deps.jobId,
        size: this.config.size,
        mode: this.config.mode,
        app: this.config.app,
        coordinator: endpoint,
        transport: this.config.transport,
      });
      this.detectorTimer = setInterval(() => this.onTick(), detectorTickMs(this.config));
      this.detectorTimer.unref();
      await this.policy.attach?.({
        broadcast: (msg) => coordinator.broadcast(msg),
        send: (rank, msg) => coordinator.sendToRank(rank, msg),
        report: (ev) => this.deps.reporter.event(ev),
      });
      await this.spawnAll(endpoint, 0);
    } catch (err) {
      this.fail({
        kind: "spawn",
        rank: undefined,
        code: isLifelineError(err) ? err.code : "LAUNCH_SPAWN",
        message: errorMessage(err),
        exitStatus: undefined,
      });
    }
    this.checkAllExited();
    await allExited;
    await this.failureReported;
    await this.errorFileWritten;
    // Let the last forwarded lines through before the summary is printed.
    await withTimeout(Promise.all(this.procs.flatMap((p) => (p === undefined ? [] : [p.closed]))), FINAL_DRAIN_WAIT_MS);
    this.stopTimers();
    this.dropSpare();
    const ending = this.outcome();
    await this.policy
      .close?.({ ok: ending.ok, exitCode: ending.exitCode, interrupted: this.interruptedBy !== undefined })
      .catch((err: unknown) => this.deps.reporter.event({ kind: "warning", message: errorMessage(err) }));
    await coordinator.close();
    return this.outcome();
  }

  /**
   * Stops the job because the launcher received `signal`: abort + SIGTERM now, SIGKILL after
   * {@link INTERRUPT_GRACE_MS}. A second interrupt kills every rank at once.
   */
  interrupt(signal: NodeJS.Signals): void {
    const now = this.nowMs();
    if (this.interruptedBy !== undefined) {
      // npm/npx forward the terminal's SIGINT to the launcher, which also gets it from the
      // terminal: one Ctrl-C arrives twice. Only a later signal is the user insisting.
      if (now - this.interruptedAtMs >= REPEAT_SIGNAL_WINDOW_MS) this.killAllNow();
      return;
    }
    this.interruptedBy = signal;
    this.interruptedAtMs = now;
    this.deps.reporter.event({ kind: "job-stopping", reason: `interrupted by ${signal}; stopping the ranks (${signal} again kills them at once)` });
    this.fail(
      { kind: "interrupted", rank: undefined, code: "LAUNCH_INTERRUPTED", message: `interrupted by ${signal}`, exitStatus: undefined },
      INTERRUPT_GRACE_MS,
    );
  }

  /** SIGKILLs every rank's process group, synchronously: for a launcher that is going down. */
  killAllNow(): void {
    for (const p of this.procs) p?.kill();
    this.dropSpare();
  }

  // ---- warm spares ---------------------------------------------------------------------------

  /** The file the ranks run: the program, or its compiled form (SupervisorDeps.runApp). */
  private get runApp(): string {
    return this.deps.runApp ?? this.config.app;
  }

  /** How many warm spares to keep: none for ranks on other hosts (they start through their agent). */
  private get sparesWanted(): number {
    if (this.config.spare === false || this.config.maxRestarts <= 0 || this.stopping || this.placement !== undefined) return 0;
    return this.config.mode === "retry-one" ? 1 : this.config.mode === "cpr" ? this.config.size : 0;
  }

  private get sparesUsable(): number {
    this.spares = this.spares.filter((s) => s.usable);
    return this.spares.length;
  }

  /** Starts the missing spares after `delayMs` (off a recovery's path) unless they are there or starting. */
  private refillSpare(delayMs: number): void {
    if (this.spareTimer !== undefined || this.sparesUsable + this.sparesStarting >= this.sparesWanted) return;
    this.spareTimer = setTimeout(() => {
      this.spareTimer = undefined;
      const missing = this.sparesWanted - this.sparesUsable - this.sparesStarting;
      for (let i = 0; i < missing; i++) this.startSpare();
    }, delayMs);
    this.spareTimer.unref();
  }

  private startSpare(): void {
    this.sparesStarting++;
    // A spare runs on this host; the assignment brings its LIFELINE_ variables.
    spawnSpare(this.runApp, this.inheritedEnv(true), this.config.cwd).then(
      (s) => {
        this.sparesStarting--;
        if (this.sparesUsable >= this.sparesWanted) {
          s.kill();
          return;
        }
        // Usable at once (a start-up under way beats a fresh one); announced once warm.
        this.spares.push(s);
        void s.ready.then(() => {
          if (this.spares.includes(s)) this.deps.reporter.event({ kind: "spare-ready", pid: s.pid });
        });
      },
      (err: unknown) => {
        this.sparesStarting--;
        if (!this.spareWarned) this.deps.reporter.event({ kind: "warning", message: `${errorMessage(err)}; restarted ranks start cold` });
        this.spareWarned = true;
      },
    );
  }

  /** A spare, if one is usable: each is handed out once. */
  private takeSpare(): SpareProcess | undefined {
    this.spares = this.spares.filter((s) => s.usable);
    return this.spares.shift();
  }

  private dropSpare(): void {
    if (this.spareTimer !== undefined) clearTimeout(this.spareTimer);
    this.spareTimer = undefined;
    for (const s of this.spares) s.kill();
    this.spares = [];
  }

  /**
   * The launcher's environment without LIFELINE_ variables (those of an enclosing job, when a
   * launcher is started from inside a rank, must not leak in), with glibc's malloc tunables for
   * a process on this host (`local`). A rank on another host gets them from its shell line,
   * before its host's own (spawnRemoteRank); this environment may reach that host too (srun's).
   */
  private inheritedEnv(local: boolean): NodeJS.ProcessEnv {
    const env: NodeJS.ProcessEnv = {};
    for (const [k, v] of Object.entries(this.deps.baseEnv)) if (!k.startsWith("LIFELINE_")) env[k] = v;
    return local && this.config.mallocTuning !== false ? withMallocTunables(env) : env;
  }

  // ---- starting -------------------------------------------------------------------------

  private async spawnAll(coordinator: string, attempt: number): Promise<void> {
    this.spawning = true;
    try {
      // All at once: each start costs a fork of this process, and ranks wait for each other
      // at the rendezvous anyway. A restart of all ranks (cpr) hands each its warm spare,
      // if one is there: its start-up is already done.
      const started = await Promise.allSettled(
        this.procs.map((_, rank) => {
          const spec = {
            rank,
            attempt,
            app: this.runApp,
            appArgs: this.config.appArgs,
            env: this.rankEnv(rank, attempt, coordinator),
            cwd: this.config.cwd,
          };
          const spare = attempt > 0 ? this.takeSpare() : undefined;
          if (spare !== undefined) return Promise.resolve(this.adopt(spare.assign(spec, this.outputSink()), true));
          return this.startProcess(spec).then((proc) => this.adopt(proc));
        }),
      );
      const failed = started.find((s): s is PromiseRejectedResult => s.status === "rejected");
      if (failed !== undefined) throw failed.reason;
    } finally {
      this.spawning = false;
    }
  }

  /**
   * Starts a rank's process: here, or on its host through the launcher (`--launcher`); a rank on
   * another host gets its keys on stdin (LIFELINE_KEYS=-, see rankEnv), and the malloc tunables
   * from its shell line (its `env` stays on this host).
   */
  private startProcess(spec: RankSpawnSpec): Promise<RankProcess> {
    const started =
      this.placement === undefined
        ? spec
        : { ...spec, stdin: rankKeyText(this.deps.keys, spec.rank, spec.attempt), mallocTuning: this.config.mallocTuning !== false };
    return this.launcher.start(started, this.placement?.hostOf(spec.rank), this.outputSink());
  }

  /** Writes the key file of incarnation `attempt` of `rank` (0600, in the run dir's private `keys/`); returns its path. */
  private keyFile(rank: number, attempt: number): string {
    const dir = join(this.deps.runDir, "keys");
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    const path = join(dir, `r${rank}.${attempt}.key`);
    rmSync(path, { force: true });
    writeKeyFile(path, rankKeyText(this.deps.keys, rank, attempt));
    return path;
  }

  /** Takes a freshly started rank (or a spare that took its place: `warm`) under supervision. */
  private adopt(proc: RankProcess, warm = false): void {
    this.procs[proc.rank] = proc;
    this.pids.push(proc.pid);
    this.progressed[proc.rank] = false;
    // Watched afresh from its start: it must join within --start-timeout.
    this.detector.started(proc.rank, this.nowMs());
    this.deps.reporter.event({
      kind: "rank-spawned",
      rank: proc.rank,
      attempt: proc.attempt,
      pid: proc.pid,
      ...(warm ? { warm } : {}),
      ...(proc.remote === undefined ? {} : { host: proc.remote.host }),
    });
    void proc.exited.then((exit) => this.onExit(proc, exit));
    // A failure or interrupt while this rank was starting already swept the others.
    if (this.stopping) proc.terminate(FAIL_FAST_GRACE_MS);
  }

  /** The environment of one rank (docs/cli.md, "What each rank gets"; src/mpi/env.ts). */
  private rankEnv(rank: number, attempt: number, coordinator: string): NodeJS.ProcessEnv {
    const env = this.inheritedEnv(this.placement === undefined);
    env[ENV.rank] = String(rank);
    env[ENV.size] = String(this.config.size);
    env[ENV.coordinator] = coordinator;
    env[ENV.job] = this.deps.jobId;
    env[ENV.mode] = this.config.mode;
    env[ENV.store] = this.config.store;
    env[ENV.attempt] = String(attempt);
    env[ENV.transport] = this.config.transport;
    // A rank on a host named by its address binds that address; otherwise --bind (an interface).
    const bind = this.placement === undefined ? this.config.bind : (addressOf(this.placement.hostOf(rank)) ?? this.config.bind);
    if (bind !== undefined) env[ENV.bind] = bind;
    env[ENV.runDir] = this.deps.runDir;
    env[ENV.watchFd] = "3";
    env[ENV.heartbeatMs] = String(this.config.heartbeatMs);
    env[ENV.failureTimeoutMs] = String(this.config.failureTimeoutMs);
    env[ENV.faults] = this.config.faults[rank] ?? "";
    if (this.config.replicas !== undefined) env[ENV.replicas] = String(this.config.replicas);
    if (this.config.logLimitBytes !== undefined) env[ENV.retryLogBytes] = String(this.config.logLimitBytes);
    if (this.config.mode === "retry-one") env[ENV.durableEvery] = String(this.config.durableEvery ?? 0);
    // The keys themselves never go in the environment: a file of the rank's own, or stdin.
    env[ENV.keys] = this.placement === undefined ? this.keyFile(rank, attempt) : "-";
    if (this.config.maxMessageBytes !== undefined) env[ENV.maxMessageBytes] = String(this.config.maxMessageBytes);
    if (this.config.maxUnexpectedBytes !== undefined) env[ENV.maxUnexpectedBytes] = String(this.config.maxUnexpectedBytes);
    if (this.config.gcPacing === false) env[ENV.gcPacing] = "0";
    return env;
  }

  private outputSink(): RankOutputSink {
    return {
      line: (rank, stream, line) => this.deps.reporter.rankLine(rank, stream, line),
      // Beats of a superseded attempt (a rank being replaced) say nothing about the new one.
      heartbeat: (rank, attempt) => {
        if (this.procs[rank]?.attempt === attempt) this.detector.heard(rank, this.nowMs(), { heartbeat: true });
      },
    };
  }

  // ---- watching -------------------------------------------------------------------------

  private onCoordinatorEvent(ev: CoordinatorEvent): void {
    const now = this.nowMs();
    switch (ev.kind) {
      case "rank-up":
        // Ranks this launcher starts heartbeat from a watchdog thread started before their
        // hello (src/index.ts), so watch them from the hello on: a rank that freezes before its
        // first beat reaches us must not escape the detector (and hang the job for ever).
        this.detector.joined(ev.rank);
        this.detector.heard(ev.rank, now, { heartbeat: this.config.heartbeatMs > 0 });
        this.deps.reporter.event({ kind: "rank-up", rank: ev.rank, pid: ev.pid });
        // A restarted rank is back (retry-one): a new spare once its catching up has had the machine.
        if (ev.attempt > 0 && this.config.mode === "retry-one") this.refillSpare(SPARE_REFILL_DELAY_MS);
        return;
      case "ready":
        for (let r = 0; r < this.config.size; r++) this.detector.armSteps(r, now);
        this.deps.reporter.event({ kind: "job-started", rendezvousMs: Math.round(now) });
        // Spares start once the job runs: at once for retry-one's one; cpr's one per rank
        // after a while, off the first steps (and off a restarted job's recovery).
        this.refillSpare(this.config.mode === "cpr" ? SPARE_REFILL_DELAY_MS : 0);
        this.budget.healthy(now);
        this.policy.onReady?.();
        return;
      case "step":
        this.detector.stepped(ev.rank, now);
        if (ev.steps > 0) this.progressed[ev.rank] = true;
        this.policy.onStep?.(ev.rank, ev.steps, ev.epoch);
        this.deps.reporter.event({ kind: "rank-step", rank: ev.rank, steps: ev.steps, epoch: ev.epoch });
        return;
      case "heartbeat":
        this.detector.heard(ev.rank, now, { heartbeat: true });
        return;
      case "finalized":
        this.finalized[ev.rank] = true;
        this.results[ev.rank] = ev.result;
        this.detector.forget(ev.rank);
        this.deps.reporter.event({ kind: "rank-finalized", rank: ev.rank });
        return;
      case "bad-result":
        this.rankFailed({ kind: "bad-result", rank: ev.rank, code: "LAUNCH_RANK_FAILED", message: ev.message, exitStatus: undefined });
        return;
      case "released":
        this.released = true;
        this.releaseTimer = setTimeout(() => this.onReleaseTimeout(), this.releaseExitTimeoutMs);
        this.releaseTimer.unref();
        return;
      case "caught-up":
        this.deps.reporter.event({
          kind: "rank-caught-up",
          rank: ev.rank,
          attempt: ev.attempt,
          restored: ev.restored,
          version: ev.version,
          seqno: ev.seqno,
          replayed: ev.replayed,
        });
        return;
      case "rank-abort": {
        const proc = this.procs[ev.rank];
        this.rankFailed({
          kind: "abort",
          rank: ev.rank,
          code: rankAbortCode(ev.code),
          message: `rank ${ev.rank}${pidText(proc)} aborted the job: ${ev.code}: ${ev.message}`,
          exitStatus: undefined,
        });
        return;
      }
      case "rendezvous-timeout": {
        const missing = ev.missing;
        const who = missing.length === 1 ? `rank ${missing[0]}` : `ranks ${missing.join(", ")}`;
        this.fail({
          kind: "rendezvous",
          rank: missing[0],
          code: "LAUNCH_RENDEZVOUS",
          message:
            `${who} did not join the job within ${ev.timeoutMs} ms (--rendezvous-timeout): a rank joins when its program calls init() from "lifeline"; ` +
            `check that ${this.config.app} does, and does so early`,
          exitStatus: undefined,
        });
        return;
      }
      case "tables-failed":
        this.fail({ kind: "restore", rank: undefined, code: ev.code as LifelineErrorCode, message: ev.message, exitStatus: undefined });
        return;
      case "warning":
        this.deps.reporter.event({ kind: "warning", message: ev.message });
        return;
      case "cpr":
        // Only modes with coordinated checkpointing send these; the cpr policy handles them.
        this.policy.onCprMessage?.(ev.rank, ev.msg);
        return;
      case "elastic": {
        const failure = this.policy.onElastic?.(ev.detail);
        if (failure !== undefined) this.fail(failure);
        return;
      }
      default: {
        const never: never = ev;
        void never;
      }
    }
  }

  private onExit(proc: RankProcess, exit: RankExit): void {
    const rank = proc.rank;
    // A process of an attempt that was replaced (or is being replaced) by a restart of all.
    const superseded = this.restarting || this.procs[rank] !== proc || this.replacing.has(rank) || this.letGo.has(proc);
    if (!superseded) this.detector.forget(rank);
    this.deps.reporter.event({ kind: "rank-exited", rank, code: exit.code, signal: exit.signal, killedByLauncher: this.stopping || superseded });
    if (!this.stopping && !superseded) {
      const fine = (this.finalized[rank]! && exit.code === 0) || this.policy.exitIsFine?.(rank, exit.code) === true;
      if (!fine && this.released && this.finalized[rank]!) {
        // Every result is in and the ranks were told to go: dying on the way out fails nothing
        // (a restart now would join a job that has ended).
        const how = exit.signal !== null ? `was killed by ${exit.signal}` : `exited with code ${exit.code}`;
        this.deps.reporter.event({ kind: "warning", message: `rank ${rank}${pidText(proc)} ${how} after the job was released (its result was already in)` });
      } else if (!fine) {
        const how = exit.signal !== null ? `was killed by ${exit.signal}` : exit.code === 0 ? "exited with code 0" : `exited with code ${exit.code}`;
        const when = this.finalized[rank] ? "after finalizing" : exit.code === 0 ? "without calling finalize()" : "before finalizing";
        this.rankFailed({
          kind: "exit",
          rank,
          code: "LAUNCH_RANK_FAILED",
          message: `rank ${rank}${pidText(proc)} ${how} ${when}`,
          exitStatus: exit.status === 0 ? undefined : exit.status,
        });
      }
    }
    this.checkAllExited();
  }

  private onTick(): void {
    if (this.stopping || this.restarting) return;
    for (const s of this.detector.check(this.nowMs())) this.onSuspicion(s);
  }

  private onSuspicion(s: Suspicion): void {
    const proc = this.procs[s.rank];
    if (proc === undefined || !proc.alive) return;
    // A frozen or hung rank will not act on SIGTERM; it is failed, so kill it now.
    proc.kill();
    const what = s.kind === "heartbeat" ? "frozen or unreachable" : s.kind === "start" ? "still loading, stuck or frozen before init()" : "stuck";
    const message = `rank ${s.rank}${pidText(proc)} ${suspicionText(s, this.config)}: ${what}, killed`;
    this.rankFailed({ kind: s.kind, rank: s.rank, code: suspicionCode(s), message, exitStatus: undefined });
  }

  private onReleaseTimeout(): void {
    this.releaseTimer = undefined;
    // elastic: a process outside the final world (a rank that was starting, to join) has nothing to finish.
    for (const p of this.procs) if (p !== undefined && p.alive && !this.finalized[p.rank]) p.kill();
    const late = this.procs.flatMap((p) => (p !== undefined && p.alive && this.finalized[p.rank] ? [p] : []));
    if (late.length === 0 || this.stopping) return;
    const first = late[0]!;
    this.fail({
      kind: "release-hang",
      rank: first.rank,
      code: "LAUNCH_RANK_FAILED",
      message:
        `rank${late.length === 1 ? "" : "s"} ${late.map((p) => p.rank).join(", ")} finalized but did not exit within ${this.releaseExitTimeoutMs} ms of being released ` +
        `(does an open handle — a timer, server or socket — keep the process alive?); killed`,
      exitStatus: undefined,
    });
  }

  // ---- failing --------------------------------------------------------------------------

  /** A rank failed: ask the policy what that means. */
  private rankFailed(failure: RankFailure): void {
    if (this.stopping || this.restarting) return;
    const now = this.nowMs();
    const counted = this.budget.used(now);
    this.history.push({ rank: failure.rank, attempt: this.attemptOf(failure.rank), cause: causeText(failure, this.procs[failure.rank ?? -1]?.exit) });
    const decision = this.policy.decide(failure, {
      size: this.config.size,
      mode: this.config.mode,
      restarts: counted,
      maxRestarts: this.config.maxRestarts,
      finalized: this.finalized,
      backoffMs: backoffDelayMs(counted + 1, { random: this.deps.random ?? Math.random }),
      placeable: this.placement === undefined || failure.rank === undefined || !suspectsHost(failure) || this.placement.canMove(failure.rank),
    });
    switch (decision.kind) {
      case "fail-job": {
        if (decision.code === "LAUNCH_RESTARTS") {
          this.fail({ ...failure, code: decision.code, message: `${decision.message ?? failure.message}; ${this.historyText()}` });
          return;
        }
        this.fail(decision.code === undefined ? failure : { ...failure, code: decision.code, message: decision.message ?? failure.message });
        return;
      }
      case "restart":
        if (this.budget.exhausted(now)) {
          // A policy without its own limit: --max-restarts still holds.
          this.fail({
            ...failure,
            code: "LAUNCH_RESTARTS",
            message: `${failure.message}; giving up after ${counted} restart(s) (--max-restarts ${this.config.maxRestarts}); ${this.historyText()}`,
          });
          return;
        }
        this.budget.restarted(now);
        if (decision.ranks.length !== this.config.size) {
          void this.restartRanks(failure, decision.ranks, decision.delayMs);
          return;
        }
        void this.restartAll(failure, decision.delayMs);
        return;
      case "continue":
        this.goOnWithout(failure);
        return;
      default: {
        const never: never = decision;
        void never;
      }
    }
  }

  /**
   * elastic: the job goes on without the failed rank: its process is ended (if it is not gone
   * already) and not started again; the coordinator has the others go on as a smaller world.
   */
  private goOnWithout(failure: RankFailure): void {
    const rank = failure.rank!;
    const proc = this.procs[rank];
    if (proc !== undefined) this.letGo.add(proc);
    this.detector.forget(rank);
    void this.reportFailure(failure, "continue");
    this.coordinator!.rankDown(rank, proc?.attempt ?? 0);
    if (proc?.alive === true) proc.kill();
    this.checkAllExited();
  }

  /**
   * Restarts every rank (cpr): kills the survivors at once (they roll back anyway), waits
   * until every process is gone, lets the policy choose the recovery line while no rank
   * runs, then starts all ranks with attempt + 1 and a new rendezvous. The back-off runs
   * from the start, beside the kills and the choice: a restart waits for the longer of them.
   */
  private async restartAll(failure: RankFailure, delayMs: number): Promise<void> {
    this.restarting = true;
    const loop = await this.crashLoop(failure, "job");
    if (loop !== undefined) {
      this.restarting = false;
      this.fail(loop);
      return;
    }
    this.restarts++;
    const attempt = this.restarts;
    void this.reportFailure(failure, "restart");
    const counted = this.budget.used(this.nowMs());
    const reset = counted === attempt ? "" : ` since the last --restart-reset; ${attempt} in all`;
    this.deps.reporter.event({
      kind: "warning",
      message: `restarting all ${this.config.size} ranks in ${delayMs} ms (restart ${counted} of at most ${this.config.maxRestarts}${reset}) after: ${failure.message}`,
    });
    for (let r = 0; r < this.config.size; r++) this.detector.forget(r);
    // Nothing of the dying attempt counts from now on: a rank cut off from here may still
    // deliver a finalize, which must not release a job that is restarting.
    this.coordinator?.endRound();
    // The back-off counts from now, while the survivors die and the policy chooses the line.
    const backoff = sleepMs(delayMs);
    for (const p of this.procs) if (p?.alive) p.kill();
    await Promise.all(this.procs.flatMap((p) => (p === undefined ? [] : [p.exited])));
    if (this.stopping) {
      this.restarting = false;
      this.checkAllExited();
      return;
    }
    try {
      await Promise.all([this.policy.prepareRestart?.(attempt), backoff]);
    } catch (err) {
      this.restarting = false;
      this.fail({
        kind: "spawn",
        rank: undefined,
        code: isLifelineError(err) ? err.code : "LAUNCH_SPAWN",
        message: `cannot restart the job: ${errorMessage(err)}`,
        exitStatus: undefined,
      });
      return;
    }
    if (this.stopping) {
      this.restarting = false;
      this.checkAllExited();
      return;
    }
    this.finalized.fill(false);
    this.results.fill(undefined);
    if (this.placement !== undefined && failure.rank !== undefined && suspectsHost(failure)) {
      // Its host may be gone: every rank there moves to a free slot elsewhere, if there is one.
      for (const r of this.placement.ranksOn(this.placement.hostOf(failure.rank))) this.placement.move(r, { suspect: true });
    }
    this.coordinator!.restartRound(new Array<number>(this.config.size).fill(attempt));
    this.restarting = false;
    try {
      await this.spawnAll(this.coordinator!.endpoint, attempt);
    } catch (err) {
      this.fail({ kind: "spawn", rank: undefined, code: isLifelineError(err) ? err.code : "LAUNCH_SPAWN", message: errorMessage(err), exitStatus: undefined });
    }
    this.checkAllExited();
  }

  /**
   * Restarts some ranks only (retry-one): the survivors are told at once (`peer-down`), the
   * failed ranks are started again with attempt + 1 after `delayMs`; the coordinator sends
   * them the table and the survivors their new endpoints (`peer`).
   */
  private async restartRanks(failure: RankFailure, ranks: readonly number[], delayMs: number): Promise<void> {
    for (const r of ranks) {
      this.replacing.add(r);
      this.detector.forget(r);
    }
    const loop = await this.crashLoop(failure, `rank ${failure.rank}`);
    if (loop !== undefined) {
      for (const r of ranks) this.replacing.delete(r);
      this.fail(loop);
      return;
    }
    this.restarts++;
    void this.reportFailure(failure, "restart");
    const old = ranks.map((r) => this.procs[r]);
    for (const r of ranks) this.coordinator!.rankDown(r, this.procs[r]?.attempt ?? 0);
    for (const r of ranks) {
      this.deps.reporter.event({
        kind: "rank-restarting",
        rank: r,
        attempt: (this.procs[r]?.attempt ?? 0) + 1,
        delayMs,
        restarts: this.budget.used(this.nowMs()),
        maxRestarts: this.config.maxRestarts,
        after: failure.message,
      });
    }
    // The back-off counts from now, while the failed processes die.
    const backoff = sleepMs(delayMs);
    for (const p of old) if (p?.alive) p.kill();
    await Promise.all([...old.flatMap((p) => (p === undefined ? [] : [p.exited])), backoff]);
    if (this.stopping) {
      for (const r of ranks) this.replacing.delete(r);
      this.checkAllExited();
      return;
    }
    try {
      await Promise.all(
        ranks.map((r, i) => {
          const attempt = (old[i]?.attempt ?? 0) + 1;
          this.coordinator!.restartRank(r, attempt);
          this.placement?.move(r, { suspect: suspectsHost(failure) });
          const spec = {
            rank: r,
            attempt,
            app: this.runApp,
            appArgs: this.config.appArgs,
            env: this.rankEnv(r, attempt, this.coordinator!.endpoint),
            cwd: this.config.cwd,
          };
          // The warm spare if one is ready (start-up already done), else a fresh process.
          const spare = this.takeSpare();
          return (spare !== undefined ? Promise.resolve(spare.assign(spec, this.outputSink())) : this.startProcess(spec)).then((proc) => {
            const warm = spare !== undefined;
            this.finalized[r] = false;
            this.results[r] = undefined;
            this.replacing.delete(r);
            this.adopt(proc, warm);
          });
        }),
      );
    } catch (err) {
      for (const r of ranks) this.replacing.delete(r);
      this.fail({
        kind: "spawn",
        rank: undefined,
        code: isLifelineError(err) ? err.code : "LAUNCH_SPAWN",
        message: `cannot restart rank(s) ${ranks.join(", ")}: ${errorMessage(err)}`,
        exitStatus: undefined,
      });
    }
    this.checkAllExited();
  }

  /**
   * The crash loop `failure` completes, if it does (see the file comment), as the failure that
   * stops the job; `undefined` to go on restarting. `unit` is what restarts together ("job" in
   * cpr, "rank R" in retry-one). Waits (at most {@link OUTPUT_DRAIN_WAIT_MS}) for the failed
   * rank's stderr, since its first error line is part of how it failed.
   */
  private async crashLoop(failure: RankFailure, unit: string): Promise<RankFailure | undefined> {
    const proc = failure.rank === undefined ? undefined : this.procs[failure.rank];
    if (proc === undefined || this.progressed[proc.rank]) {
      this.loopWatch.delete(unit);
      return undefined;
    }
    await withTimeout(proc.closed, OUTPUT_DRAIN_WAIT_MS);
    if (proc.faultInjected) {
      this.loopWatch.delete(unit);
      return undefined;
    }
    const error = proc.errorLine();
    const signature = `${causeText(failure, proc.exit)}\n${error ?? ""}`;
    const last = this.loopWatch.get(unit);
    this.loopWatch.set(unit, { signature, attempt: proc.attempt, text: `rank ${proc.rank}` });
    if (last === undefined || last.signature !== signature || last.attempt !== proc.attempt - 1) return undefined;
    const where = last.text === `rank ${proc.rank}` ? "" : ` (by ${last.text})`;
    return {
      ...failure,
      code: "LAUNCH_CRASH_LOOP",
      message:
        `${failure.message} — the same failure as in attempt ${last.attempt}${where}, both times before the first checkpoint() and with the same error` +
        `${error === undefined ? "" : ` (${error})`}: a bug in the program or its arguments, not a fault a restart can fix, so the job stops instead of restarting again`,
    };
  }

  /**
   * Stops the job because of `failure` (the first failure is the one reported): abort and
   * SIGTERM every live rank now, SIGKILL after `graceMs`.
   */
  private fail(failure: RankFailure, graceMs = FAIL_FAST_GRACE_MS): void {
    if (this.failure === undefined || failure.kind === "interrupted") {
      if (this.failure === undefined) this.failure = failure;
      else if (this.failure.kind !== "interrupted") this.failure = { ...failure, message: `${failure.message} (while stopping: ${this.failure.message})` };
    }
    if (this.stopping) {
      if (failure.kind === "interrupted") for (const p of this.procs) if (p?.alive) p.terminate(graceMs);
      return;
    }
    this.stopping = true;
    this.failureReported = this.reportFailure(failure, "fail-job");
    void this.coordinator?.abort(failure.code, failure.message);
    for (const p of this.procs) {
      if (p === undefined || !p.alive) continue;
      if (failure.kind === "abort" && p.rank === failure.rank) {
        // The aborting rank is shutting down on its own and may still be printing why:
        // give it the grace before any signal.
        const timer = setTimeout(() => p.kill(), graceMs);
        timer.unref();
        void p.exited.then(() => clearTimeout(timer));
        continue;
      }
      p.terminate(graceMs);
    }
    this.checkAllExited();
  }

  /**
   * Emits `rank-failed` with the rank's last stderr lines once its output has drained, and
   * adds the failure to the error file.
   */
  private async reportFailure(failure: RankFailure, action: FailureRecord["action"]): Promise<void> {
    const proc = failure.rank === undefined ? undefined : this.procs[failure.rank];
    const detectedMs = this.nowMs();
    if (proc !== undefined) await withTimeout(proc.closed, OUTPUT_DRAIN_WAIT_MS);
    const tail = proc?.stderrTail() ?? [];
    if (failure.kind !== "interrupted") this.recordFailure(failure, action, proc, tail, detectedMs);
    this.failureDetail =
      tail.length === 0
        ? failure.message
        : `${failure.message}\nlast ${tail.length} stderr line${tail.length === 1 ? "" : "s"} of rank ${failure.rank}:\n${tail.map((l) => `  | ${l}`).join("\n")}`;
    const error = proc?.errorLine();
    if (failure.rank !== undefined && RANK_FAULT_KINDS.includes(failure.kind)) {
      const exit = proc?.exit;
      this.deps.reporter.event({
        kind: "rank-failed",
        rank: failure.rank,
        pid: proc?.pid,
        reason: failure.message.replace(new RegExp(`^rank ${failure.rank}( \\(pid \\d+\\))? `), ""),
        code: exit?.code ?? null,
        signal: exit?.signal ?? null,
        stderrTail: tail,
        ...(error === undefined ? {} : { error }),
      });
    } else if (failure.kind !== "interrupted") {
      this.deps.reporter.event({
        kind: "job-stopping",
        reason: failure.message,
        rank: failure.rank,
        stderrTail: proc === undefined ? undefined : tail,
        ...(error === undefined ? {} : { error }),
      });
    }
  }

  /** Appends one failure to the error file: the whole file is rewritten and renamed into place. */
  private recordFailure(failure: RankFailure, action: FailureRecord["action"], proc: RankProcess | undefined, tail: string[], detectedMs: number): void {
    const exit = proc?.exit;
    this.failureRecords.push({
      rank: failure.rank,
      attempt: proc?.attempt ?? this.restarts,
      pid: proc?.pid,
      cause: recordCause(failure, exit),
      exitCode: exit?.code ?? null,
      signal: exit?.signal ?? null,
      code: failure.code,
      message: failure.message,
      time: new Date(performance.timeOrigin + this.startMs + detectedMs).toISOString(),
      elapsedMs: Math.round(detectedMs),
      action,
      stderrTail: tail,
    });
    const doc = { job: this.deps.jobId, app: this.config.app, mode: this.config.mode, size: this.config.size, failures: [...this.failureRecords] };
    const path = this.errorFile;
    // Synchronous and serialized: a reader sees the previous file or the new one, never half of one.
    this.errorFileWritten = this.errorFileWritten.then(() => {
      try {
        mkdirSync(dirname(path), { recursive: true });
        const tmp = `${path}.${process.pid}.tmp`;
        writeFileSync(tmp, `${JSON.stringify(doc, null, 2)}\n`);
        renameSync(tmp, path);
      } catch (err) {
        this.deps.reporter.event({ kind: "warning", message: `cannot write the error file ${path}: ${errorMessage(err)}` });
      }
    });
  }

  /** The failures so far, for the final error of an exhausted restart budget. */
  private historyText(): string {
    const list = this.history.map((h) => `${h.rank === undefined ? "the job" : `rank ${h.rank}`} (attempt ${h.attempt}): ${h.cause}`);
    const ranks = [...new Set(this.history.flatMap((h) => (h.rank === undefined ? [] : [h.rank])))].sort((a, b) => a - b);
    return `failed rank${ranks.length === 1 ? "" : "s"} ${ranks.join(", ")}; failures in order: ${list.join("; ")}`;
  }

  private attemptOf(rank: number | undefined): number {
    return (rank === undefined ? undefined : this.procs[rank]?.attempt) ?? this.restarts;
  }

  private checkAllExited(): void {
    if (this.spawning || this.restarting || this.replacing.size > 0) return;
    const anyAlive = this.procs.some((p) => p !== undefined && p.alive);
    if (anyAlive) return;
    // Without a failure, the job is over only when every rank has been started and has ended.
    const allStarted = this.procs.every((p) => p !== undefined);
    if (!this.stopping && !allStarted) return;
    this.resolveAllExited?.();
  }

  private outcome(): JobOutcome {
    const finalizedCount = this.finalized.filter(Boolean).length;
    const wallMs = Math.round(this.nowMs());
    const base = {
      wallMs,
      size: this.config.size,
      finalizedCount,
      results: [...this.results],
      restarts: this.restarts,
      pids: [...this.pids],
      recovery: this.policy.summary?.(),
    };
    if (this.failure === undefined) {
      // elastic: the final world's results, by its ranks; ranks lost on the way are not failures.
      const world = this.policy.finalWorld?.(this.results);
      if (world !== undefined)
        return { ...base, size: world.length, finalizedCount: world.length, results: world, ok: true, exitCode: 0, error: undefined, summary: undefined };
      // A rank that died on its way out after the release (a warning said so) fails nothing.
      const allZero = this.released || this.procs.every((p) => p?.exit?.code === 0);
      if (finalizedCount === this.config.size && allZero) {
        return { ...base, ok: true, exitCode: 0, error: undefined, summary: undefined };
      }
      // Unreachable by construction (every non-clean exit is a failure); kept as a safe answer.
      const message = `${this.config.size - finalizedCount} rank(s) did not finalize`;
      return { ...base, ok: false, exitCode: 1, error: new LifelineError("LAUNCH_RANK_FAILED", message), summary: message };
    }
    const f = this.failure;
    let exitCode: number;
    if (this.interruptedBy !== undefined) exitCode = 128 + (osConstants.signals[this.interruptedBy] ?? 0);
    else exitCode = f.exitStatus !== undefined && f.exitStatus !== 0 ? f.exitStatus : 1;
    const detail = this.failureDetail ?? f.message;
    return { ...base, ok: false, exitCode, error: new LifelineError(f.code, detail), summary: f.message };
  }

  private stopTimers(): void {
    if (this.detectorTimer !== undefined) clearInterval(this.detectorTimer);
    if (this.releaseTimer !== undefined) clearTimeout(this.releaseTimer);
    this.detectorTimer = undefined;
    this.releaseTimer = undefined;
  }

  private get releaseExitTimeoutMs(): number {
    return this.deps.releaseExitTimeoutMs ?? RELEASE_EXIT_TIMEOUT_MS;
  }

  private nowMs(): number {
    return performance.now() - this.startMs;
  }
}

/** Resolves after `ms` milliseconds (at once for 0). */
function sleepMs(ms: number): Promise<void> {
  return ms > 0 ? new Promise((resolve) => setTimeout(resolve, ms)) : Promise.resolve();
}

function recordCause(failure: RankFailure, exit: RankExit | undefined): FailureRecord["cause"] {
  switch (failure.kind) {
    case "exit":
      return (exit?.signal ?? null) !== null ? "signal" : "exit-code";
    case "heartbeat":
    case "stuck":
    case "start":
    case "abort":
    case "bad-result":
    case "rendezvous":
    case "release-hang":
    case "spawn":
    case "restore":
      return failure.kind;
    case "interrupted":
      return "exit-code"; // not recorded
  }
}

/** A failure's cause in a few words: "killed by SIGKILL", "exit code 3", "heartbeat", "stuck". */
function causeText(failure: RankFailure, exit: RankExit | undefined): string {
  if (failure.kind === "exit") return exit?.signal !== undefined && exit.signal !== null ? `killed by ${exit.signal}` : `exit code ${exit?.code ?? "?"}`;
  if (failure.kind === "heartbeat") return "no heartbeat (frozen or unreachable)";
  if (failure.kind === "stuck") return "stuck (no step boundary)";
  if (failure.kind === "start") return "did not join within --start-timeout";
  return failure.kind;
}

/** Failures that are one rank's own doing, reported as `rank-failed`; the rest are job-level. */
const RANK_FAULT_KINDS: readonly RankFailure["kind"][] = ["exit", "abort", "heartbeat", "stuck", "start", "bad-result"];

/**
 * A failure that may mean the rank's host is gone or cut off: it went silent, never started,
 * or ended itself because it lost the coordinator (its lease lapsed: exit 75).
 */
function suspectsHost(failure: RankFailure): boolean {
  return failure.kind === "heartbeat" || failure.kind === "start" || (failure.kind === "exit" && failure.exitStatus === EXIT_COORDINATOR_LOST);
}

function claimOf(deps: SupervisorDeps): StoreClaim {
  if (deps.claim === undefined) throw new LifelineError("LAUNCH_USAGE", "mode cpr needs the store claimed for the run (claimStore) or a policy");
  return deps.claim;
}

function pidText(proc: RankProcess | undefined): string {
  return proc === undefined ? "" : ` (pid ${proc.pid})`;
}

async function withTimeout(p: Promise<unknown>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([p, new Promise<void>((resolve) => (timer = setTimeout(resolve, ms)))]);
  clearTimeout(timer);
}
