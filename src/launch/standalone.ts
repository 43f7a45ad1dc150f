/**
 * `lifeline coordinator`: the coordinator alone, for engines that start the ranks themselves
 * (a Kubernetes Indexed Job, a plain `srun`, `mpirun`). It binds a known address (`--bind`,
 * `--port`), waits for `-n` ranks to say hello — each started by the engine with its rank
 * variables and `LIFELINE_COORDINATOR` — and supervises them as far as it can see them: over
 * the control channel (heartbeats, steps, aborts, results), not as processes.
 *
 * It restarts nothing: the engine does. Any failure stops the job — every rank is told to
 * abort, and ranks that cannot hear it end themselves when their lease lapses — and the
 * coordinator exits non-zero, for the engine to run the job again. In `--mode cpr` the job's
 * lines are in `--store` (a volume every rank and the coordinator share), and the next run —
 * the engine's restart of the coordinator with the same command — resumes from the newest one,
 * as `lifeline run` does (src/launch/job-store.ts). `--mode retry-one`, which restarts one rank
 * into a running job, needs the launcher (`lifeline run`) and is refused here.
 *
 * Its links are secured with the keys of `--keys` (a directory `lifeline keys` made; the ranks
 * get its ranks.key, on Kubernetes as a Secret), or not at all with `--insecure`.
 *
 * @example
 * const code = await runStandalone(config, { stdout, stderr, env: process.env });
 */
import { randomBytes } from "node:crypto";
import { constants as osConstants } from "node:os";
import { basename, extname } from "node:path";
import { errorMessage, LifelineError, type LifelineErrorCode } from "../errors.ts";
import { readCoordinatorKeys, type CoordinatorKeys } from "../mpi/keys.ts";
import { Coordinator, type CoordinatorEvent } from "./coordinator.ts";
import { CprRestartPolicy } from "./cpr-policy.ts";
import { FailureDetector } from "./detector.ts";
import { claimStore, type StoreClaim } from "./job-store.ts";
import type { RunConfig } from "./options.ts";
import { createReporter, pickStyle, type OutStream } from "./progress.ts";
import { writeResultsFile } from "./results.ts";
import { INSECURE_WARNING } from "./run.ts";
import { detectorTickMs, rankAbortCode, suspicionCode, suspicionText } from "./watch.ts";

/** What a failure of the job looks like to the standalone coordinator. */
interface Stop {
  code: LifelineErrorCode;
  message: string;
  rank?: number | undefined;
}

/** How long the abort has to leave before the coordinator closes its socket. */
const ABORT_FLUSH_MS = 500;
const STOP_SIGNALS: readonly NodeJS.Signals[] = ["SIGINT", "SIGTERM", "SIGHUP"];

/**
 * Runs the coordinator of one job to its end; resolves to the exit code: 0 when every rank
 * finalized, 1 when the job failed (the engine should run it again), 128+signal when stopped.
 * Rejects, before anything listens, when the store cannot be claimed (`LAUNCH_RESUME`,
 * `STORE_*`) or the address cannot be bound (`LAUNCH_SPAWN`).
 */
export async function runStandalone(
  config: RunConfig & { port: number },
  io: { stdout: OutStream; stderr: OutStream; env: NodeJS.ProcessEnv; handleSignals?: boolean },
): Promise<number> {
  const name = basename(config.app, extname(config.app))
    .replace(/[^A-Za-z0-9_.-]/g, "_")
    .slice(0, 32);
  // The keys first: a bad key file stops the command before the store is claimed.
  const read = config.keys === undefined ? undefined : readCoordinatorKeys(config.keys);
  const keys: CoordinatorKeys | undefined = read?.keys;
  const keyWarning = read?.warning;
  const claim: StoreClaim | undefined = config.mode === "cpr" ? await claimStore(config, { jobIdBase: name }) : undefined;
  const jobId = claim?.job.id ?? `${name}-${randomBytes(4).toString("hex")}`;
  const reporter = createReporter({
    style: pickStyle({ json: config.json, quiet: config.quiet, stderr: io.stderr, env: io.env }),
    stdout: io.stdout,
    stderr: io.stderr,
    size: config.size,
  });
  if (config.insecure === true) reporter.event({ kind: "warning", message: INSECURE_WARNING });
  if (keyWarning !== undefined) reporter.event({ kind: "warning", message: keyWarning });
  const policy = claim === undefined ? undefined : new CprRestartPolicy(config, claim);
  const startMs = performance.now();
  const now = (): number => performance.now() - startMs;
  const finalized = new Array<boolean>(config.size).fill(false);
  const results = new Array<unknown>(config.size).fill(undefined);
  const detector = new FailureDetector({ size: config.size, failureTimeoutMs: config.failureTimeoutMs, stuckTimeoutMs: config.stuckTimeoutMs });
  let stop: Stop | undefined;
  let interruptedBy: NodeJS.Signals | undefined;
  let finish!: () => void;
  const over = new Promise<void>((resolve) => (finish = resolve));

  const fail = (s: Stop): void => {
    if (stop !== undefined) return;
    stop = s;
    reporter.event({ kind: "job-stopping", reason: s.message, rank: s.rank });
    void coordinator.abort(s.code, s.message).finally(() => setTimeout(finish, ABORT_FLUSH_MS).unref());
  };

  const coordinator: Coordinator = new Coordinator({
    size: config.size,
    keys,
    maxMessageBytes: config.maxMessageBytes,
    transport: "tcp",
    host: config.bindAddress,
    port: config.port,
    runDir: "",
    rendezvousTimeoutMs: config.rendezvousTimeoutMs,
    mode: config.mode,
    tableFor: policy === undefined ? undefined : (rank) => policy.tableFor(rank),
    onEvent: (ev: CoordinatorEvent) => {
      const t = now();
      switch (ev.kind) {
        case "rank-up":
          detector.heard(ev.rank, t, { heartbeat: config.heartbeatMs > 0 });
          reporter.event({ kind: "rank-up", rank: ev.rank, pid: ev.pid });
          return;
        case "ready":
          for (let r = 0; r < config.size; r++) detector.armSteps(r, t);
          reporter.event({ kind: "job-started", rendezvousMs: Math.round(t) });
          policy?.onReady();
          return;
        case "step":
          detector.stepped(ev.rank, t);
          policy?.onStep(ev.rank, ev.steps);
          reporter.event({ kind: "rank-step", rank: ev.rank, steps: ev.steps, epoch: ev.epoch });
          return;
        case "heartbeat":
          detector.heard(ev.rank, t, { heartbeat: true });
          return;
        case "finalized":
          finalized[ev.rank] = true;
          results[ev.rank] = ev.result;
          detector.forget(ev.rank);
          reporter.event({ kind: "rank-finalized", rank: ev.rank });
          return;
        case "released":
          // Every rank finalized and was released: it exits by itself.
          setTimeout(finish, ABORT_FLUSH_MS).unref();
          return;
        case "bad-result":
          fail({ code: "LAUNCH_RANK_FAILED", message: ev.message, rank: ev.rank });
          return;
        case "rank-abort":
          fail({ code: rankAbortCode(ev.code), message: `rank ${ev.rank} aborted the job: ${ev.code}: ${ev.message}`, rank: ev.rank });
          return;
        case "rendezvous-timeout":
          fail({
            code: "LAUNCH_RENDEZVOUS",
            message: `rank${ev.missing.length === 1 ? "" : "s"} ${ev.missing.join(", ")} did not join within ${ev.timeoutMs} ms (--rendezvous-timeout): has the engine started them, with LIFELINE_COORDINATOR=${coordinator.endpoint}?`,
          });
          return;
        case "tables-failed":
          fail({ code: ev.code as LifelineErrorCode, message: ev.message });
          return;
        case "cpr":
          policy?.onCprMessage(ev.rank, ev.msg);
          return;
        case "warning":
          reporter.event({ kind: "warning", message: ev.message });
          return;
        case "caught-up":
          return;
      }
    },
  });

  const onSignal = (signal: NodeJS.Signals): void => {
    interruptedBy ??= signal;
    fail({ code: "LAUNCH_INTERRUPTED", message: `interrupted by ${signal}` });
  };
  const handleSignals = io.handleSignals ?? true;
  if (handleSignals) for (const s of STOP_SIGNALS) process.on(s, onSignal);
  const tick = setInterval(() => {
    if (stop !== undefined) return;
    for (const s of detector.check(now())) {
      const what = s.kind === "heartbeat" ? "dead, frozen or unreachable" : "stuck";
      fail({
        code: suspicionCode(s),
        message: `rank ${s.rank} ${suspicionText(s, config)}: ${what}; the engine that started the ranks restarts the job`,
        rank: s.rank,
      });
    }
  }, detectorTickMs(config));
  tick.unref();

  try {
    // The recovery line is chosen (and the ranks' stores are tidied) before anything listens:
    // the engine's ranks may be waiting already, and must get the line in their table.
    await policy?.attach({
      broadcast: (msg) => coordinator.broadcast(msg),
      send: (rank, msg) => coordinator.sendToRank(rank, msg),
      report: (ev) => reporter.event(ev),
    });
    const endpoint = await coordinator.start();
    reporter.event({ kind: "job-starting", job: jobId, size: config.size, mode: config.mode, app: config.app, coordinator: endpoint, transport: "tcp" });
    await over;
  } catch (err) {
    stop ??= { code: "LAUNCH_SPAWN", message: errorMessage(err) };
  } finally {
    clearInterval(tick);
    if (handleSignals) for (const s of STOP_SIGNALS) process.off(s, onSignal);
  }
  const ok = stop === undefined && finalized.every(Boolean);
  const exitCode = ok ? 0 : interruptedBy !== undefined ? 128 + (osConstants.signals[interruptedBy] ?? 0) : 1;
  await policy
    ?.close({ ok, exitCode, interrupted: interruptedBy !== undefined })
    .catch((err: unknown) => reporter.event({ kind: "warning", message: errorMessage(err) }));
  await coordinator.close();
  const wallMs = Math.round(now());
  const error = stop === undefined ? undefined : new LifelineError(stop.code, stop.message);
  if (config.resultsPath !== undefined) {
    await writeResultsFile(config.resultsPath, {
      ranks: results,
      restarts: 0,
      mode: config.mode,
      size: config.size,
      wallMs,
      exitCode,
      job: jobId,
      ...(claim === undefined ? {} : { run: claim.job.run }),
      ...(policy === undefined ? {} : { recovery: policy.summary() }),
      error: error === undefined ? undefined : { code: error.code, message: error.message },
    }).catch((err: unknown) => reporter.event({ kind: "warning", message: `cannot write --results: ${errorMessage(err)}` }));
  }
  reporter.event({
    kind: "job-finished",
    ok,
    exitCode,
    wallMs,
    size: config.size,
    finalized: finalized.filter(Boolean).length,
    restarts: 0,
    error: error === undefined ? undefined : { code: error.code, message: error.message },
    results,
    resultsPath: config.resultsPath,
  });
  reporter.close();
  return exitCode;
}
