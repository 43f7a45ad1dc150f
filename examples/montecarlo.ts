/**
 * montecarlo.ts — a Monte Carlo estimate of pi: the fraction of random points in the unit square
 * that fall inside the quarter circle.
 *
 * Demonstrates: `nondet()`. Each batch of samples is generated from a seed drawn with
 * `world.nondet(Math.random)`. While cpr records a checkpoint the drawn seeds are logged, and a
 * recovery replays them, so a rolled-back rank regenerates exactly the batches it had drawn.
 * Logging one seed per batch rather than one value per sample keeps the log small.
 *
 * THIS PROGRAM IS DELIBERATELY NON-DETERMINISTIC ACROSS RUNS. Two separate runs draw different
 * seeds and so report different estimates. That is the point: it shows nondet logging at work,
 * and it proves that a drill's verdict can fail — `lifeline drill` compares a faulty run with a
 * fault-free one bit for bit, and for this program the two differ even without any fault.
 * (Replace `Math.random` with a seeded generator and it becomes deterministic.)
 *
 * Run:
 *   npx lifeline run -n 4 --mode none examples/montecarlo.ts
 *   npx lifeline drill -n 4 --kill 1@step:5 examples/montecarlo.ts    # verdict: results differ
 *
 * Args: --batches B (per rank, default 20), --batch-size N (points per batch, default 100000).
 *
 * Each rank finalizes the estimate (a number), the same on all ranks of one run.
 */
import { parseArgs } from "node:util";
import { init } from "lifeline";

interface State {
  /** Batches done by this rank. */
  batch: number;
  /** Points inside the quarter circle, and points drawn, by this rank. */
  inside: number;
  drawn: number;
}

const { values: args } = parseArgs({
  options: {
    batches: { type: "string", default: "20" },
    "batch-size": { type: "string", default: "100000" },
  },
});
const batches = intArg("batches", args.batches, 1);
const batchSize = intArg("batch-size", args["batch-size"], 1);

const world = await init();
const { rank, size } = world;

const saved = await world.restore<State>();
const s: State = saved?.state ?? { batch: 0, inside: 0, drawn: 0 };

while (s.batch < batches) {
  // The only non-deterministic input: one 32-bit seed per batch, logged while recording.
  const seed = Math.floor(world.nondet(Math.random) * 4294967296) >>> 0;
  const rng = mulberry32(seed);
  let inside = 0;
  for (let i = 0; i < batchSize; i++) {
    const x = rng();
    const y = rng();
    if (x * x + y * y < 1) inside++;
  }
  s.inside += inside;
  s.drawn += batchSize;
  s.batch++;
  await world.checkpoint(s);
}

const [inside, drawn] = await world.allreduce(new Float64Array([s.inside, s.drawn]), "sum");
const estimate = (4 * inside) / drawn;
if (rank === 0) {
  console.log(`montecarlo: ${drawn} points on ${size} ranks, pi ~ ${estimate.toFixed(6)} (error ${(estimate - Math.PI).toExponential(2)})`);
}
await world.finalize(estimate);

/** mulberry32: a tiny, well-mixed 32-bit PRNG; returns floats in [0, 1). */
function mulberry32(seed32: number): () => number {
  let a = seed32 >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function intArg(name: string, raw: string | undefined, min: number): number {
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min) throw new RangeError(`--${name} must be an integer >= ${min}, got ${raw}`);
  return n;
}
