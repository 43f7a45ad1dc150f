/**
 * Which seeds a seeded test runs: `SEED=n` runs exactly that one (to reproduce a failure);
 * otherwise `SIM_SEEDS` (default `count`) consecutive seeds from `SEED_BASE`, or from a fresh
 * base so that every run explores new schedules (a failing seed prints itself).
 */
export function seedsToRun(count: number, env: NodeJS.ProcessEnv = process.env): number[] {
  const one = env.SEED;
  if (one !== undefined && one.trim() !== "") {
    const n = Number(one);
    if (!Number.isSafeInteger(n) || n < 0) throw new RangeError(`SEED=${JSON.stringify(one)} is not a non-negative integer`);
    return [n];
  }
  const rawBase = env.SEED_BASE;
  // Choosing which seeds to run is the one place randomness is allowed; what a seed does is fixed.
  const base = rawBase !== undefined && rawBase.trim() !== "" ? Number(rawBase) : Math.floor(Math.random() * 1e6) * 10_000;
  if (!Number.isSafeInteger(base) || base < 0) throw new RangeError(`SEED_BASE=${JSON.stringify(rawBase)} is not a non-negative integer`);
  const rawCount = env.SIM_SEEDS;
  const n = rawCount !== undefined && rawCount.trim() !== "" ? Number(rawCount) : count;
  if (!Number.isInteger(n) || n < 1) throw new RangeError(`SIM_SEEDS=${JSON.stringify(rawCount)} is not a positive integer`);
  return Array.from({ length: n }, (_, i) => base + i);
}
