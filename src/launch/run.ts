/**
 * `lifeline run` as a function: claims the store (cpr: which job its lines belong to, and
 * whether this run resumes it; src/launch/job-store.ts), sets up the job's private directory
 * and identity, runs the {@link Supervisor}, handles the launcher's own signals, writes
 * `--results`, prints the summary and cleans up. The CLI only parses flags and calls
 * {@link runJob}.
 *
 * @example
 * const outcome = await runJob(resolveRunConfig(flags, { cwd }), { stdout: process.stdout, stderr: process.stderr, env: process.env });
 * process.exitCode = outcome.exitCode;
 */
import { randomBytes } from "node:crypto";
import { basename, extname, resolve } from "node:path";
import { errorMessage, isLifelineError, LifelineError } from "../errors.ts";
import { openOwnedDir, ownedDirBase, RUN_DIR_PREFIX, sweepStaleOwnedDirs } from "../owned-dir.ts";
import { makeJobKeys } from "../mpi/keys.ts";
import type { RunConfig } from "./options.ts";
import { createReporter, pickStyle, type OutStream, type Reporter } from "./progress.ts";
import { claimStore, type StoreClaim } from "./job-store.ts";
import { compileApp, keepInUse } from "./compile-cache.ts";
import { writeResultsFile } from "./results.ts";
import { Supervisor, type JobOutcome } from "./supervisor.ts";

export interface RunIo {
  stdout: OutStream;
  stderr: OutStream;
  /** Environment the ranks inherit. */
  env: NodeJS.ProcessEnv;
  /**
   * Install SIGINT/SIGTERM/SIGHUP handlers that stop the job gracefully, and a process `exit`
   * hook that kills any rank still alive (default true; tests running in-process may disable).
   */
  handleSignals?: boolean;
  /**
   * Receives the job's events and rank output instead of the reporter the flags would pick
   * (`lifeline drill` records each run's events this way). Closed by runJob at the end.
   */
  reporter?: Reporter;
  /** Random source of the restart back-off's jitter (default Math.random); tests pass a seeded one. */
  random?: () => number;
}

/** The progress output's warning for `--insecure` on tcp (docs/security.md, "--insecure"). */
export const INSECURE_WARNING =
  "--insecure: the job's tcp links are neither authenticated nor encrypted; anyone who can reach its ports can read its messages, and forge them once they have read a rank's token (use it only on a network you trust)";

/** Signals that stop a job gracefully; a second one kills the ranks at once. */
const STOP_SIGNALS: readonly NodeJS.Signals[] = ["SIGINT", "SIGTERM", "SIGHUP"];

/**
 * Runs one job to the end. Resolves with the outcome (its `exitCode` is what the launcher
 * exits with). Rejects, before anything is started, when the store cannot be claimed
 * (`LAUNCH_RESUME`: it holds another job's lines, or `--resume` found nothing to resume;
 * `STORE_LOCKED`: another launcher uses it; other `STORE_*` errors), and for launcher bugs.
 */
export async function runJob(config: RunConfig, io: RunIo): Promise<JobOutcome> {
  // Fresh for every run, and unrelated to the job id that is printed and kept in the store;
  // CURVE on every tcp link unless --insecure (ipc links are files in the private run dir).
  const keys = makeJobKeys({ curve: config.transport === "tcp" && config.insecure !== true });
  const name = basename(config.app, extname(config.app))
    .replace(/[^A-Za-z0-9_.-]/g, "_")
    .slice(0, 32);
  // cpr keeps recovery lines, retry-one its durable floor's; mode none leaves the store alone.
  const keepsLines = config.mode === "cpr" || (config.mode === "retry-one" && (config.durableEvery ?? 0) > 0);
  const claim: StoreClaim | undefined = keepsLines ? await claimStore(config, { jobIdBase: name }) : undefined;
  const jobId = claim?.job.id ?? `${name}-${randomBytes(4).toString("hex")}`;
  const runDirHandle = await openOwnedDir(RUN_DIR_PREFIX);
  const runDir = runDirHandle.path;
  // Run directories of launchers, and store readers' snapshots, that were SIGKILLed
  // (src/owned-dir.ts); the job does not wait for this.
  const swept = sweepStaleOwnedDirs(ownedDirBase(), { except: runDir });
  const reporter =
    io.reporter ??
    createReporter({
      style: pickStyle({ json: config.json, quiet: config.quiet, stderr: io.stderr, env: io.env }),
      stdout: io.stdout,
      stderr: io.stderr,
      size: config.size,
    });
  if (config.insecure === true && config.transport === "tcp") reporter.event({ kind: "warning", message: INSECURE_WARNING });
  // A .ts program whose ranks run here is compiled once for the job (compile-cache.ts); ranks
  // on other hosts keep the tsx loader (they may not see the compiled file).
  let runApp: string | undefined;
  let stopKeeping: (() => void) | undefined;
  const ext = extname(config.app);
  if ((ext === ".ts" || ext === ".mts") && config.hosts === undefined && (config.launcher ?? "local") === "local") {
    try {
      runApp = (await compileApp(resolve(config.cwd, config.app))).app;
      // Restarts start ranks from it for as long as the job runs (see keepInUse).
      stopKeeping = keepInUse(runApp);
    } catch (err) {
      reporter.event({ kind: "warning", message: `${errorMessage(err)}; its ranks run it through the tsx loader` });
    }
  }
  const supervisor = new Supervisor(config, {
    ...(runApp === undefined ? {} : { runApp }),
    reporter,
    runDir,
    jobId,
    keys,
    baseEnv: io.env,
    ...(io.random === undefined ? {} : { random: io.random }),
    ...(claim === undefined ? {} : { claim }),
  });

  const handleSignals = io.handleSignals ?? true;
  const onSignal = (signal: NodeJS.Signals): void => supervisor.interrupt(signal);
  // Runs even when the launcher crashes: Node emits `exit` on an uncaught exception.
  const onExit = (): void => {
    supervisor.killAllNow();
    runDirHandle.remove();
  };
  if (handleSignals) {
    for (const s of STOP_SIGNALS) process.on(s, onSignal);
    process.on("exit", onExit);
  }

  let outcome: JobOutcome;
  try {
    outcome = await supervisor.run();
  } finally {
    if (handleSignals) {
      for (const s of STOP_SIGNALS) process.off(s, onSignal);
      process.off("exit", onExit);
    }
    stopKeeping?.();
    runDirHandle.remove();
    await swept;
  }

  if (config.resultsPath !== undefined) {
    try {
      await writeResultsFile(config.resultsPath, {
        ranks: outcome.results,
        restarts: outcome.restarts,
        mode: config.mode,
        size: outcome.size,
        wallMs: outcome.wallMs,
        exitCode: outcome.exitCode,
        job: jobId,
        ...(claim === undefined ? {} : { run: claim.job.run }),
        ...(outcome.recovery === undefined ? {} : { recovery: outcome.recovery }),
        error: outcome.error === undefined ? undefined : { code: outcome.error.code, message: outcome.error.message },
      });
    } catch (err) {
      // The job ran, but its results are lost: that is a failure the exit code must show.
      const error = isLifelineError(err) ? err : new LifelineError("LAUNCH_USAGE", errorMessage(err), { cause: err });
      outcome = {
        ...outcome,
        ok: false,
        exitCode: outcome.exitCode === 0 ? 1 : outcome.exitCode,
        error: outcome.error ?? error,
        summary: outcome.summary ?? error.message,
      };
      reporter.event({ kind: "warning", message: error.message });
    }
  }

  reporter.event({
    kind: "job-finished",
    ok: outcome.ok,
    exitCode: outcome.exitCode,
    wallMs: outcome.wallMs,
    size: outcome.size,
    finalized: outcome.finalizedCount,
    restarts: outcome.restarts,
    error: outcome.error === undefined ? undefined : { code: outcome.error.code, message: outcome.summary ?? outcome.error.message },
    results: outcome.results,
    resultsPath: config.resultsPath,
  });
  reporter.close();
  return outcome;
}
