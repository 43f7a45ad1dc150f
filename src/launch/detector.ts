/**
 * Failure suspicion for ranks that are alive as processes but not working (docs/detection.md;
 * after KungFu's monitor). Process exits need no detector: the supervisor sees them at once.
 *
 * - Heartbeats catch frozen or unreachable ranks: no control message for `failureTimeoutMs`.
 *   Armed per rank by `heard(..., { heartbeat: true })`: the supervisor arms its own ranks at
 *   their hello (their watchdog thread is already beating by then), so a rank that freezes
 *   before its first beat is caught too.
 * - Steps catch hung ranks: no `checkpoint()` boundary for `stuckTimeoutMs` (only when the user
 *   asked for it with `--stuck-timeout`). Armed when the job starts (the rendezvous completes),
 *   so a rank that hangs before its first step — in a collective whose peer went elsewhere —
 *   is caught too.
 * - A start-up deadline catches ranks that never join: a process that has not said hello
 *   `startTimeoutMs` after it was started (still loading, stuck on a slow disk, frozen before
 *   its watchdog thread ran) is suspected like a frozen one. Armed per process by `started`,
 *   disarmed by its hello (`joined`).
 * A rank that finalized is no longer watched: it waits for the others by design.
 *
 * Pure: time comes in as arguments, so tests drive it without timers.
 *
 * @example
 * const d = new FailureDetector({ size: 2, failureTimeoutMs: 5000, stuckTimeoutMs: undefined });
 * d.heard(0, now, { heartbeat: true });
 * d.check(now + 6000); // [{ kind: "heartbeat", rank: 0, silentMs: 6000 }]
 */

export type Suspicion =
  | { kind: "heartbeat"; rank: number; silentMs: number }
  | { kind: "stuck"; rank: number; silentMs: number }
  /** Not joined `silentMs` after its process started. */
  | { kind: "start"; rank: number; silentMs: number };

interface Watch {
  /** When the process started, until it joins; undefined when not watched for joining. */
  startedMs: number | undefined;
  heartbeatArmed: boolean;
  lastHeardMs: number;
  stepArmed: boolean;
  lastStepMs: number;
  done: boolean;
}

export class FailureDetector {
  private readonly watches: Watch[];

  constructor(private readonly opts: { size: number; failureTimeoutMs: number; stuckTimeoutMs: number | undefined; startTimeoutMs?: number | undefined }) {
    this.watches = Array.from({ length: opts.size }, () => fresh());
  }

  /** A new process of `rank` was started at `nowMs`: watch it afresh, and for joining. */
  started(rank: number, nowMs: number): void {
    if (rank < 0 || rank >= this.watches.length) return;
    this.watches[rank] = { ...fresh(), startedMs: nowMs };
  }

  /** `rank` said hello: its start-up is over. */
  joined(rank: number): void {
    const w = this.watches[rank];
    if (w !== undefined) w.startedMs = undefined;
  }

  /** Any control message from `rank` at `nowMs`; `heartbeat` arms heartbeat monitoring. */
  heard(rank: number, nowMs: number, how: { heartbeat: boolean }): void {
    const w = this.watches[rank];
    if (w === undefined) return;
    w.lastHeardMs = nowMs;
    if (how.heartbeat) w.heartbeatArmed = true;
  }

  /** A step boundary of `rank` at `nowMs` (also counts as being heard). */
  stepped(rank: number, nowMs: number): void {
    const w = this.watches[rank];
    if (w === undefined) return;
    w.lastHeardMs = nowMs;
    w.lastStepMs = nowMs;
    w.stepArmed = true;
  }

  /** Starts step monitoring of `rank` as of `nowMs` (the job started). */
  armSteps(rank: number, nowMs: number): void {
    const w = this.watches[rank];
    if (w === undefined || w.stepArmed) return;
    w.stepArmed = true;
    w.lastStepMs = nowMs;
  }

  /** Stop watching `rank` (finalized, exited, or being restarted). */
  forget(rank: number): void {
    const w = this.watches[rank];
    if (w !== undefined) w.done = true;
  }

  /** Start watching `rank` afresh (a restarted rank); nothing is armed until it speaks. */
  reset(rank: number): void {
    if (rank >= 0 && rank < this.watches.length) this.watches[rank] = fresh();
  }

  /** Ranks suspected at `nowMs`. Each suspicion is reported once; the rank is then forgotten. */
  check(nowMs: number): Suspicion[] {
    const out: Suspicion[] = [];
    this.watches.forEach((w, rank) => {
      if (w.done) return;
      const start = this.opts.startTimeoutMs;
      if (start !== undefined && w.startedMs !== undefined && nowMs - w.startedMs >= start) {
        out.push({ kind: "start", rank, silentMs: nowMs - w.startedMs });
        w.done = true;
        return;
      }
      if (w.heartbeatArmed && nowMs - w.lastHeardMs >= this.opts.failureTimeoutMs) {
        out.push({ kind: "heartbeat", rank, silentMs: nowMs - w.lastHeardMs });
        w.done = true;
        return;
      }
      const stuck = this.opts.stuckTimeoutMs;
      if (stuck !== undefined && w.stepArmed && nowMs - w.lastStepMs >= stuck) {
        out.push({ kind: "stuck", rank, silentMs: nowMs - w.lastStepMs });
        w.done = true;
      }
    });
    return out;
  }
}

function fresh(): Watch {
  return { startedMs: undefined, heartbeatArmed: false, lastHeardMs: 0, stepArmed: false, lastStepMs: 0, done: false };
}
