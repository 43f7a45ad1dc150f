/**
 * How long to wait before a restart, and how many restarts a job has used up.
 *
 * - Back-off is exponential with "equal jitter": before restart n (1-based) the supervisor waits
 *   between half and all of `min(maxMs, baseMs * 2^(n-1))`. The jitter keeps the ranks of many
 *   jobs that failed together (a node went down) from coming back in lock step; the lower half
 *   keeps a flapping job from retrying at once. The random source is injected, so tests and
 *   drills are deterministic.
 * - {@link RestartBudget} counts restarts against `--max-restarts`, and forgets them after a
 *   stretch of healthy running (`--restart-reset`): a job that fails once a day for a month is
 *   not the same as one that fails four times a minute. Back-off restarts from its base then too.
 *
 * Pure: time comes in as arguments.
 *
 * @example
 * const budget = new RestartBudget({ maxRestarts: 3, resetAfterMs: 60_000 });
 * budget.healthy(nowMs); // all ranks up again after a restart
 * if (budget.exhausted(nowMs)) fail(); else wait(backoffDelayMs(budget.used(nowMs) + 1, { random }));
 */
/** Back-off before the first restart (before jitter). */
export const BACKOFF_BASE_MS = 100;
/** Longest back-off (before jitter). */
export const BACKOFF_MAX_MS = 5_000;

/** Back-off parameters; `random` returns a number in [0, 1). */
export interface BackoffOptions {
  baseMs?: number;
  maxMs?: number;
  random: () => number;
}

/**
 * The wait before restart `n` (1-based, counted since the last reset): uniformly in
 * [d/2, d] with d = min(maxMs, baseMs * 2^(n-1)). Whole milliseconds.
 */
export function backoffDelayMs(n: number, opts: BackoffOptions): number {
  if (!Number.isInteger(n) || n < 1) throw new RangeError(`restart number must be a whole number >= 1, got ${n}`);
  const baseMs = opts.baseMs ?? BACKOFF_BASE_MS;
  const maxMs = opts.maxMs ?? BACKOFF_MAX_MS;
  // 2^(n-1) overflows to Infinity for huge n; min() caps it.
  const ceiling = Math.min(maxMs, baseMs * 2 ** Math.min(n - 1, 60));
  const u = opts.random();
  if (!(u >= 0 && u < 1)) throw new RangeError(`random() must return a number in [0, 1), got ${u}`);
  return Math.round(ceiling / 2 + u * (ceiling / 2));
}

/** A seeded source for {@link BackoffOptions.random}: the same seed, the same delays. */
export function seededRandom(seed: number): () => number {
  // mulberry32: tiny and plenty for spreading restart times.
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let z = state;
    z = Math.imul(z ^ (z >>> 15), z | 1);
    z ^= z + Math.imul(z ^ (z >>> 7), z | 61);
    return ((z ^ (z >>> 14)) >>> 0) / 0x1_0000_0000;
  };
}

/**
 * Restarts counted against `--max-restarts`, reset by a stretch of healthy running.
 *
 * "Healthy" starts when every rank is up again after a restart (or at the job's start) and
 * lasts until the next failure; once it has lasted `resetAfterMs`, the restarts so far no
 * longer count.
 */
export class RestartBudget {
  private count = 0;
  private healthySinceMs: number | undefined;

  constructor(private readonly opts: { maxRestarts: number; resetAfterMs: number | undefined }) {}

  /** Every rank is up and working as of `nowMs`. */
  healthy(nowMs: number): void {
    this.healthySinceMs ??= nowMs;
  }

  /** Restarts that count at `nowMs` (0 after a long enough healthy stretch). */
  used(nowMs: number): number {
    this.applyReset(nowMs);
    return this.count;
  }

  /** True if a failure at `nowMs` may not be restarted. */
  exhausted(nowMs: number): boolean {
    return this.used(nowMs) >= this.opts.maxRestarts;
  }

  /** A restart happens at `nowMs`; the job is not healthy until {@link healthy} again. */
  restarted(nowMs: number): void {
    this.applyReset(nowMs);
    this.count++;
    this.healthySinceMs = undefined;
  }

  private applyReset(nowMs: number): void {
    const reset = this.opts.resetAfterMs;
    if (reset === undefined || this.healthySinceMs === undefined) return;
    if (nowMs - this.healthySinceMs >= reset) this.count = 0;
  }
}
