/**
 * The rank's watchdog: a worker thread that heartbeats to the coordinator and ends this
 * process when the launcher is gone.
 *
 * The launcher hands each rank the read end of a pipe (fd `LIFELINE_WATCH_FD`) and keeps the
 * write end; when the launcher dies for any reason, SIGKILL included, the kernel closes the
 * write end and the read end sees EOF. Watch and heartbeats run on their own thread with their
 * own event loop (watchdog-worker.ts), so a rank in a long synchronous computation keeps
 * beating and still dies at once with its launcher, while a frozen rank (SIGSTOP) falls
 * silent and is caught by `--failure-timeout`.
 *
 * @example
 * const dog = startWatchdog({ fd: 3, coordinator, rank, attempt, heartbeatMs: 500 }); // later: dog.stop();
 */
import { Worker } from "node:worker_threads";
import { EXIT_COORDINATOR_LOST } from "../mpi/control.ts";
import type { RankKeys } from "../mpi/keys.ts";

export interface WatchdogOptions {
  /** The launcher pipe's fd, if started by `lifeline run`. */
  fd: number | undefined;
  /** The coordinator's endpoint, for heartbeats. */
  coordinator: string | undefined;
  rank: number;
  attempt: number;
  /** 0 disables heartbeats. */
  heartbeatMs: number;
  /** The coordinator unheard this long (no lease) ends the rank; 0 or absent: never. */
  failureTimeoutMs?: number;
  /** The rank's LIFELINE_FAULTS (time triggers fire from the watchdog thread). */
  faults: string;
  /** The rank's keys (its heartbeat link's token, and CURVE on tcp). */
  keys?: RankKeys;
}

/** Longest wait in init() for the watchdog's first beat: never block a rank on its watchdog. */
const WATCHDOG_READY_MS = 5000;

/** A running watchdog: `ready` once its first heartbeat is out; `stop` for a clean exit. */
export interface Watchdog {
  readonly ready: Promise<void>;
  /**
   * The rank joined its job (the coordinator sent the table): the lease's clock runs from now
   * on even if no lease came yet, so a rank cut off before its first lease still ends itself.
   */
  joined(): void;
  stop(): void;
}

/** Starts the watchdog thread. */
export function startWatchdog(opts: WatchdogOptions): Watchdog {
  // Run from source (tsx) in development, from dist/ when installed. Compiled, the thread needs
  // no loader: not inheriting the program's `--import tsx` saves it most of its start-up.
  const fromSource = import.meta.url.endsWith(".ts");
  const file = fromSource ? "./watchdog-worker.ts" : "./watchdog-worker.js";
  const worker = new Worker(new URL(file, import.meta.url), {
    workerData: { pid: process.pid, ...opts },
    ...(fromSource ? {} : { execArgv: [] }),
  });
  worker.unref();
  worker.on("error", (err) => process.stderr.write(`lifeline: watchdog failed: ${err.message}\n`));
  worker.on("message", (msg: unknown) => {
    const m = msg as { t?: unknown; silentMs?: number; coordinator?: string } | null;
    if (m?.t !== "coordinator-lost") return;
    process.stderr.write(
      `lifeline: rank ${opts.rank}: the coordinator at ${m.coordinator} has not answered for ${m.silentMs} ms (--failure-timeout): ` +
        `its host died, the network is partitioned, or this rank was replaced; ending this rank (exit ${EXIT_COORDINATOR_LOST})\n`,
    );
    process.exit(EXIT_COORDINATOR_LOST);
  });
  // The launcher watches heartbeats from the rank's hello on, so the first beat must be out
  // before init() says hello (a slow thread start under load must not look like a frozen rank).
  const ready = new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, WATCHDOG_READY_MS);
    timer.unref();
    const done = (): void => {
      clearTimeout(timer);
      resolve();
    };
    worker.once("message", done);
    worker.once("error", done);
    worker.once("exit", done);
  });
  // Stopped by a message, not terminate(): the worker handles it only after its start-up code
  // ran, so it is never torn down in the middle of building a socket.
  return { ready, joined: () => worker.postMessage("joined"), stop: () => worker.postMessage("stop") };
}
