/**
 * Small statistics and the calibration rule shared by the harness and the standalone
 * Lifeline bench program.
 */

export function quantile(xs: readonly number[], q: number): number {
  if (xs.length === 0) return Number.NaN;
  const s = [...xs].sort((a, b) => a - b);
  const pos = (s.length - 1) * q;
  const lo = Math.floor(pos);
  const hi = Math.ceil(pos);
  return s[lo]! + (s[hi]! - s[lo]!) * (pos - lo);
}

export function median(xs: readonly number[]): number {
  return quantile(xs, 0.5);
}

/** (max - min) / median: the same spread measure as the peers file. */
export function spread(xs: readonly number[]): number {
  if (xs.length === 0) return Number.NaN;
  return (Math.max(...xs) - Math.min(...xs)) / median(xs);
}

export interface Calibration {
  /** Operations per timed block. */
  iters: number;
  /** The probes that led there: [iters, seconds for the block]. */
  probes: [number, number][];
}

/**
 * Finds how many operations take about `targetS` seconds. A first block of one operation is
 * thrown away (cold caches, lazy connection set-up, JIT). Then: 1 operation, ~10× more until a
 * block takes at least a fifth of the target (enough for the clock), scale linearly, and check
 * the scaled count once, rescaling if it is off by more than 2× (a probe hit by a burst of
 * other load). An operation slower than the target runs once.
 */
export async function calibrate(runBlock: (iters: number) => Promise<number>, opts: { targetS: number; itersMax: number }): Promise<Calibration> {
  const probes: [number, number][] = [];
  const probe = async (iters: number): Promise<number> => {
    const seconds = await runBlock(iters);
    probes.push([iters, seconds]);
    return seconds;
  };
  const scale = (iters: number, seconds: number): number => Math.min(opts.itersMax, Math.max(1, Math.round((iters * opts.targetS) / Math.max(seconds, 1e-9))));
  await probe(1); // thrown away
  let iters = 1;
  let seconds: number;
  for (;;) {
    seconds = await probe(iters);
    if (seconds >= opts.targetS / 5 || iters >= opts.itersMax) break;
    const grow = seconds <= 0 ? 10 : Math.ceil(opts.targetS / 4 / seconds);
    iters = Math.min(opts.itersMax, iters * Math.min(10, Math.max(2, grow)));
  }
  const scaled = scale(iters, seconds);
  if (scaled === iters) return { iters, probes };
  const check = await probe(scaled);
  if (check > opts.targetS / 2 && check < opts.targetS * 2) return { iters: scaled, probes };
  return { iters: scale(scaled, check), probes };
}

/** Formats a figure with about 4 significant digits, like the peers file. */
export function fmt(x: number | undefined | null): string {
  if (x === undefined || x === null || !Number.isFinite(x)) return "—";
  const a = Math.abs(x);
  if (a >= 1000) return x.toFixed(0);
  if (a >= 100) return x.toFixed(1);
  if (a >= 10) return x.toFixed(2);
  if (a >= 1) return x.toFixed(3);
  return x.toPrecision(3);
}

export function fmtRatio(x: number | undefined | null): string {
  if (x === undefined || x === null || !Number.isFinite(x)) return "—";
  return x >= 100 ? `${x.toFixed(0)}x` : x >= 10 ? `${x.toFixed(1)}x` : `${x.toFixed(2)}x`;
}
