/**
 * logreg.ts — data-parallel logistic regression trained by mini-batch SGD (Rabit's use case).
 *
 * Demonstrates: the allreduce-only pattern that retry-one mode is built for, and the loop of
 * elastic jobs. Each rank generates its shard of a synthetic dataset from a seeded PRNG,
 * computes the gradient of its part of the mini-batch, and one `allreduce` of a Float64Array
 * sums the gradients (plus loss and count). Every rank applies the identical update, so the
 * weights stay the same everywhere; the state checkpointed per step is just (step, weights).
 *
 * In `--mode elastic` the world may change: the loop is inside a try, and MPI_WORLD_CHANGED
 * sends the rank round again — restore() gives the checkpoint the new world starts from, and
 * the shard is cut again for the new rank and size. In the other modes the loop runs once.
 *
 * Run:
 *   npx lifeline run -n 4 --mode none examples/logreg.ts
 *   npx lifeline run -n 4 --mode retry-one examples/logreg.ts --steps 1000
 *   npx lifeline run -n 4 --mode elastic --min-np 2 examples/logreg.ts --steps 1000
 *
 * Args: --samples N (whole dataset, default 16384), --features D (default 16),
 *       --steps S (default 300), --batch B (rows per rank per step, default 128),
 *       --lr R (learning rate, default 0.5), --seed K (dataset seed, default 42).
 *
 * Sample i is generated from (seed, i) alone, so the dataset does not depend on the number of
 * ranks; the ranks split it into contiguous blocks. Each rank finalizes the SHA-256 of the
 * weights, identical on all ranks and on every re-run with the same rank count (elastic: with
 * the same changes of the world at the same steps).
 */
import { createHash } from "node:crypto";
import { parseArgs } from "node:util";
import { init, isLifelineError } from "lifeline";

interface State {
  /** SGD steps done. */
  step: number;
  /** Weights w[0..D-1] and the bias w[D]. */
  w: Float64Array;
  /** Mean log-loss of the last mini-batch. */
  loss: number;
}

const { values: args } = parseArgs({
  options: {
    samples: { type: "string", default: "16384" },
    features: { type: "string", default: "16" },
    steps: { type: "string", default: "300" },
    batch: { type: "string", default: "128" },
    lr: { type: "string", default: "0.5" },
    seed: { type: "string", default: "42" },
  },
});
const nSamples = intArg("samples", args.samples, 1);
const d = intArg("features", args.features, 1);
const steps = intArg("steps", args.steps, 0);
const batch = intArg("batch", args.batch, 1);
const seed = intArg("seed", args.seed, 0);
const lr = Number(args.lr);
if (!(lr > 0)) throw new RangeError(`--lr must be a positive number, got ${args.lr}`);

const world = await init();
// [gradient (D weights + bias), loss sum, row count]: one allreduce per step carries it all.
const buf = new Float64Array(d + 3);
const reportEvery = Math.max(1, Math.floor(steps / 5));
for (;;) {
  const saved = await world.restore<State>();
  const s: State = saved?.state ?? { step: 0, w: new Float64Array(d + 1), loss: NaN };
  const { rank, size } = world;
  if (nSamples < size) throw new RangeError(`--samples ${nSamples} is fewer than the ${size} ranks`);
  // This rank's shard: a contiguous block of the global sample indices.
  const lo = Math.floor((nSamples * rank) / size);
  const hi = Math.floor((nSamples * (rank + 1)) / size);
  const nLocal = hi - lo;
  const { x, y } = makeShard(lo, hi);
  try {
    while (s.step < steps) {
      buf.fill(0);
      const start = (s.step * batch) % nLocal;
      for (let b = 0; b < Math.min(batch, nLocal); b++) accumulate(x, y, (start + b) % nLocal, s.w, buf);
      const total = await world.allreduce(buf, "sum");
      const count = total[d + 2];
      for (let j = 0; j <= d; j++) s.w[j] -= (lr * total[j]) / count;
      s.loss = total[d + 1] / count;
      s.step++;
      if (rank === 0 && (s.step % reportEvery === 0 || s.step === steps)) {
        console.log(`logreg: step ${s.step}/${steps}, mini-batch loss ${s.loss.toFixed(6)}`);
      }
      await world.checkpoint(s);
    }

    // Loss and accuracy over the whole dataset, for the summary line.
    buf.fill(0);
    let correct = 0;
    for (let i = 0; i < nLocal; i++) {
      const z = accumulate(x, y, i, s.w, buf);
      if ((z > 0 ? 1 : 0) === y[i]) correct++;
    }
    const [lossSum, n, right] = await world.allreduce(new Float64Array([buf[d + 1], buf[d + 2], correct]), "sum");
    if (rank === 0) {
      console.log(
        `logreg: ${nSamples} samples x ${d} features on ${size} ranks, ${steps} steps: loss ${(lossSum / n).toFixed(6)}, accuracy ${((100 * right) / n).toFixed(2)}%`,
      );
    }
    await world.finalize(sha256Hex(s.w));
    break;
  } catch (err) {
    // --mode elastic: a rank left or joined. Go round: restore(), then cut the shard again.
    if (!isLifelineError(err, "MPI_WORLD_CHANGED")) throw err;
  }
}

/**
 * Adds row i's gradient of the log-loss (and its loss and a count of 1) into `acc`;
 * returns the row's margin z = w.x + b.
 */
function accumulate(x: Float64Array, y: Uint8Array, i: number, w: Float64Array, acc: Float64Array): number {
  const row = i * d;
  let z = w[d];
  for (let j = 0; j < d; j++) z += w[j] * x[row + j];
  const p = 1 / (1 + Math.exp(-z));
  const g = p - y[i];
  for (let j = 0; j < d; j++) acc[j] += g * x[row + j];
  acc[d] += g;
  // log(1 + e^z) - y z, written so that it cannot overflow.
  acc[d + 1] += Math.max(z, 0) + Math.log1p(Math.exp(-Math.abs(z))) - y[i] * z;
  acc[d + 2] += 1;
  return z;
}

/**
 * Samples lo..hi-1 of the dataset. A hidden weight vector (from the seed) labels points drawn
 * uniformly from [-1, 1]^D, with some label noise so that the classes overlap.
 */
function makeShard(from: number, to: number): { x: Float64Array; y: Uint8Array } {
  const truth = mulberry32(seed);
  const wTrue = Float64Array.from({ length: d + 1 }, () => 4 * truth() - 2);
  const xs = new Float64Array((to - from) * d);
  const ys = new Uint8Array(to - from);
  for (let i = from; i < to; i++) {
    const rng = mulberry32((Math.imul(seed, 0x9e3779b1) ^ Math.imul(i + 1, 0x85ebca6b)) >>> 0);
    let z = wTrue[d];
    for (let j = 0; j < d; j++) {
      const v = 2 * rng() - 1;
      xs[(i - from) * d + j] = v;
      z += wTrue[j] * v;
    }
    ys[i - from] = z + (rng() - 0.5) > 0 ? 1 : 0;
  }
  return { x: xs, y: ys };
}

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

function sha256Hex(bytes: ArrayBufferView): string {
  return createHash("sha256")
    .update(new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength))
    .digest("hex");
}

function intArg(name: string, raw: string | undefined, min: number): number {
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min) throw new RangeError(`--${name} must be an integer >= ${min}, got ${raw}`);
  return n;
}
