/**
 * A small, fast, seeded PRNG for the deterministic simulator (xoshiro128**, seeded through
 * splitmix32), so that one integer seed fixes a whole simulated run: the program, the
 * network's interleaving and delays, the clock and the crashes.
 *
 * Never use `Math.random` in simulated code: a run must replay bit for bit from its seed.
 *
 * @example
 * const prng = new Prng(seedFromEnv() ?? 42);
 * const rank = prng.index(4); // 0..3
 */
import assert from "node:assert/strict";

/** splitmix32: spreads a 32-bit seed into well-mixed state words. */
function splitmix32(state: { s: number }): number {
  state.s = (state.s + 0x9e3779b9) | 0;
  let z = state.s;
  z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
  z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
  return (z ^ (z >>> 16)) >>> 0;
}

const rotl = (x: number, k: number): number => (x << k) | (x >>> (32 - k));

/** Mixes several integers (e.g. seed, rank, counter) into one 32-bit value. */
export function mix32(...parts: readonly number[]): number {
  const st = { s: 0x1234567 };
  let h = splitmix32(st);
  for (const p of parts) {
    st.s = (h ^ (p | 0) ^ Math.floor(p / 0x1_0000_0000)) | 0;
    h = splitmix32(st);
  }
  return h >>> 0;
}

/**
 * xoshiro128**: 128 bits of state, period 2^128 - 1, passes the usual statistical batteries;
 * plenty for scheduling decisions and cheap in JavaScript (32-bit integer ops only).
 */
export class Prng {
  private a: number;
  private b: number;
  private c: number;
  private d: number;

  constructor(readonly seed: number) {
    assert(Number.isSafeInteger(seed), `PRNG seed must be a safe integer, got ${seed}`);
    const st = { s: (seed ^ Math.floor(seed / 0x1_0000_0000)) | 0 };
    this.a = splitmix32(st);
    this.b = splitmix32(st);
    this.c = splitmix32(st);
    this.d = splitmix32(st);
    if ((this.a | this.b | this.c | this.d) === 0) this.a = 1; // the all-zero state is a fixed point
  }

  /** The next 32-bit unsigned integer. */
  next(): number {
    const result = Math.imul(rotl(Math.imul(this.b, 5), 7), 9);
    const t = this.b << 9;
    this.c ^= this.a;
    this.d ^= this.b;
    this.b ^= this.c;
    this.a ^= this.d;
    this.c ^= t;
    this.d = rotl(this.d, 11);
    return result >>> 0;
  }

  /** A float in [0, 1). */
  float(): number {
    return this.next() / 0x1_0000_0000;
  }

  /** An integer in 0..n-1 (n ≥ 1). */
  index(n: number): number {
    assert(Number.isInteger(n) && n >= 1, `index(n) needs n >= 1, got ${n}`);
    // Multiply-shift: unbiased enough for n far below 2^32, and branch-free.
    return Math.floor(this.float() * n);
  }

  /** An integer in min..max, both included. */
  rangeInclusive(min: number, max: number): number {
    assert(Number.isInteger(min) && Number.isInteger(max) && min <= max, `rangeInclusive(${min}, ${max})`);
    return min + this.index(max - min + 1);
  }

  /** True with probability `p` (0 ≤ p ≤ 1). */
  chance(p: number): boolean {
    if (p <= 0) return false;
    if (p >= 1) return true;
    return this.float() < p;
  }

  /** One element of a non-empty array. */
  pick<T>(items: readonly T[]): T {
    return items[this.index(items.length)]!;
  }

  /** Shuffles `items` in place (Fisher–Yates) and returns it. */
  shuffle<T>(items: T[]): T[] {
    for (let i = items.length - 1; i > 0; i--) {
      const j = this.index(i + 1);
      const t = items[i]!;
      items[i] = items[j]!;
      items[j] = t;
    }
    return items;
  }

  /**
   * An independent stream derived from this one's seed and a label, without consuming from
   * this stream (so adding a consumer of one stream never shifts another's draws).
   */
  fork(...label: readonly number[]): Prng {
    return new Prng(mix32(this.seed, ...label));
  }
}

/**
 * The seed named by the `SEED` environment variable, or undefined when it is not set.
 * Throws a `RangeError` for anything but a non-negative safe integer.
 *
 * @example
 * const only = seedFromEnv(); // SEED=1234 npx vitest run test/sim → 1234
 */
export function seedFromEnv(env: NodeJS.ProcessEnv = process.env): number | undefined {
  const raw = env.SEED;
  if (raw === undefined || raw.trim() === "") return undefined;
  const n = Number(raw);
  if (!Number.isSafeInteger(n) || n < 0) throw new RangeError(`SEED=${JSON.stringify(raw)} is not a non-negative integer`);
  return n;
}

/** The fixed base of CI runs (see {@link swarmSeeds}). */
export const CI_SEED_BASE = 1_000_000_000;

/**
 * The seeds one swarm test runs: just `SEED` when it is set; otherwise `count` consecutive
 * seeds from `SEED_BASE`; else, under CI (`CI` set), from the fixed {@link CI_SEED_BASE}, so that
 * whether a change lands never depends on the luck of the draw; else from a fresh random base,
 * so that developers' runs keep exploring new schedules (a failing seed prints itself, so a
 * random base stays reproducible).
 */
export function swarmSeeds(count: number, env: NodeJS.ProcessEnv = process.env): number[] {
  const only = seedFromEnv(env);
  if (only !== undefined) return [only];
  const rawBase = env.SEED_BASE;
  let base: number;
  if (rawBase !== undefined && rawBase.trim() !== "") {
    base = Number(rawBase);
    if (!Number.isSafeInteger(base) || base < 0) throw new RangeError(`SEED_BASE=${JSON.stringify(rawBase)} is not a non-negative integer`);
  } else if (env.CI !== undefined && env.CI !== "" && env.CI !== "false") {
    base = CI_SEED_BASE;
  } else {
    // The one place randomness is allowed: choosing which seeds to run, not what a seed does.
    base = Math.floor(Math.random() * 1e9) * 1000;
  }
  const rawCount = env.SIM_SEEDS;
  const n = rawCount !== undefined && rawCount.trim() !== "" ? Number(rawCount) : count;
  if (!Number.isInteger(n) || n < 1) throw new RangeError(`SIM_SEEDS=${JSON.stringify(rawCount)} is not a positive integer`);
  return Array.from({ length: n }, (_, i) => base + i);
}
