/**
 * What the launcher's supervisor (src/launch/supervisor.ts) and the standalone coordinator
 * (`lifeline coordinator`, src/launch/standalone.ts) both make of what they watch: how often
 * the failure detector is checked, what a suspicion is called and which error it is, and which
 * error a rank's abort of the job becomes. Each adds what it does about it (the supervisor
 * kills and restarts; the standalone coordinator stops the job for its engine to rerun).
 *
 * @example
 * setInterval(tick, detectorTickMs(config));
 * for (const s of detector.check(now)) fail(suspicionCode(s), `rank ${s.rank} ${suspicionText(s, config)}: killed`);
 */
import type { LifelineErrorCode } from "../errors.ts";
import type { Suspicion } from "./detector.ts";

/** The timeouts a suspicion is measured against (RunConfig's). */
export interface WatchTimeouts {
  readonly failureTimeoutMs: number;
  readonly stuckTimeoutMs: number | undefined;
  readonly startTimeoutMs: number;
}

/** How often to check the detector: a quarter of the shortest timeout, within 20..250 ms. */
export function detectorTickMs(t: WatchTimeouts): number {
  return Math.max(20, Math.min(250, Math.floor(Math.min(t.failureTimeoutMs, t.stuckTimeoutMs ?? Infinity, t.startTimeoutMs) / 4)));
}

/** The error a suspicion fails the rank (or the job) with. */
export function suspicionCode(s: Suspicion): LifelineErrorCode {
  return s.kind === "heartbeat" ? "LAUNCH_HEARTBEAT" : s.kind === "start" ? "LAUNCH_START" : "LAUNCH_STUCK";
}

/** What the rank did not do, and for how long against which flag, e.g. "sent no heartbeat for 1204 ms (--failure-timeout 1000 ms)". */
export function suspicionText(s: Suspicion, t: WatchTimeouts): string {
  const silentMs = Math.round(s.silentMs);
  switch (s.kind) {
    case "heartbeat":
      return `sent no heartbeat for ${silentMs} ms (--failure-timeout ${t.failureTimeoutMs} ms)`;
    case "start":
      return `did not join the job within ${silentMs} ms of starting (--start-timeout ${t.startTimeoutMs} ms)`;
    case "stuck":
      return `reached no step boundary (checkpoint() call) for ${silentMs} ms (--stuck-timeout ${t.stuckTimeoutMs} ms)`;
  }
}

/** The error a rank's abort of the job is reported with: its own code when it is one of Lifeline's, else LAUNCH_RANK_FAILED. */
export function rankAbortCode(code: string): LifelineErrorCode {
  return code.startsWith("MPI_") || code.startsWith("CPR_") || code.startsWith("STORE_") || code.startsWith("LAUNCH_")
    ? (code as LifelineErrorCode)
    : "LAUNCH_RANK_FAILED";
}
