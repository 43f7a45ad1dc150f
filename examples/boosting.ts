/**
 * boosting.ts — histogram-based gradient boosting of decision trees, distributed as XGBoost does
 * it over Rabit: the rows are split across ranks, and each tree level needs one allreduce.
 *
 * Demonstrates: bootstrap collectives before `restore()`. Like XGBoost's workers, the ranks
 * first agree on the number of features (the max over the shards: some shards lack trailing
 * columns) and on a seed that rank 0 chooses; both calls are marked `bootstrap`, so a restarted
 * rank gets the cached answers instead of asking its peers again. Then, per tree level, each
 * rank builds gradient/hessian histograms of its rows per (node, feature, bin), one `allreduce`
 * of a Float64Array sums them, and every rank picks the same best splits from the same sums.
 * The state is checkpointed after every level.
 *
 * Re-partitioning (`--mode elastic`): the dataset is the first world's shards, one per rank it
 * started with; a world of any size splits their rows into contiguous blocks, so in the other
 * modes (and in an elastic job that never changes) every rank has exactly its own shard. After
 * a change of the world a rank's rows are others than its state's per-row part describes: it
 * derives that part (each row's margin and node) again from the model, adding the finished
 * trees' leaf values in the same order as training did, so the margins are bit for bit the ones
 * training would have reached.
 *
 * Run:
 *   npx lifeline run -n 4 --mode none examples/boosting.ts
 *   npx lifeline run -n 4 --mode retry-one examples/boosting.ts --trees 20 --depth 5
 *   npx lifeline run -n 4 --mode elastic --max-np 5 examples/boosting.ts --trees 20 --depth 5
 *
 * Args: --rows N (rows per rank, default 4000), --features F (default 8, at least 5),
 *       --bins B (default 32), --trees T (default 4), --depth H (default 4), --eta E (default 0.3),
 *       --lambda L (default 1), --seed K (rank 0's dataset seed, default 7).
 *
 * Features are in [0, 1) and binned uniformly (a stand-in for XGBoost's quantile sketch). The
 * label is a noisy non-linear function of the first four features; the loss is the log-loss.
 * Every rank finalizes the SHA-256 of the model (split features, split bins, leaf values).
 */
import { createHash } from "node:crypto";
import { parseArgs } from "node:util";
import { init, isLifelineError } from "lifeline";

/** Node kinds in the model's `feature` array; values >= 0 are the split feature. */
const UNUSED = -3;
const PENDING = -2; // exists, not yet decided: split or leaf at its level
const LEAF = -1;

interface State {
  /** The rows the per-row arrays are of: global row indices lo..hi-1. */
  lo: number;
  hi: number;
  /** Trees finished. */
  tree: number;
  /** Level of the current tree being grown (0 = root). */
  level: number;
  /** Heap index (root 0, children 2i+1 and 2i+2) of the node each local row is in. */
  nodeOf: Int32Array;
  /** Each local row's margin (sum of leaf values of finished trees). */
  margin: Float64Array;
  /** The model, `nodesPerTree` entries per tree: split feature or a kind, split bin, leaf value. */
  feature: Int32Array;
  split: Int32Array;
  value: Float64Array;
}

const { values: args } = parseArgs({
  options: {
    rows: { type: "string", default: "4000" },
    features: { type: "string", default: "8" },
    bins: { type: "string", default: "32" },
    trees: { type: "string", default: "4" },
    depth: { type: "string", default: "4" },
    eta: { type: "string", default: "0.3" },
    lambda: { type: "string", default: "1" },
    seed: { type: "string", default: "7" },
  },
});
const nRows = intArg("rows", args.rows, 1);
const featuresArg = intArg("features", args.features, 5);
const nBins = intArg("bins", args.bins, 2);
const nTrees = intArg("trees", args.trees, 1);
const maxDepth = intArg("depth", args.depth, 1);
const eta = Number(args.eta);
const lambda = Number(args.lambda);
if (!(eta > 0)) throw new RangeError(`--eta must be positive, got ${args.eta}`);
if (!(lambda >= 0)) throw new RangeError(`--lambda must be non-negative, got ${args.lambda}`);
const minChildWeight = 1;

const world = await init();

// Bootstrap: the shards come in different widths (odd ranks lack the last column, as sparse
// files do), and the model needs the widest; the largest rank + 1 is the number of shards (the
// first world's size). Then rank 0's seed reaches everyone; the other ranks' argument is
// ignored. Both run once per job and are replayed to a restarted rank (and given to a rank that
// joins an elastic job).
const localFeatureCount = featuresArg - (world.rank % 2);
const [nFeatures, shards] = await world.allreduce(new Int32Array([localFeatureCount, world.rank + 1]), "max", { bootstrap: "nfeat" });
const seed = await world.bcast(world.rank === 0 ? intArg("seed", args.seed, 0) : 0, 0, { bootstrap: "seed" });
const nodesPerTree = 2 ** (maxDepth + 1) - 1;
const allRows = shards * nRows;

for (;;) {
  const saved = await world.restore<State>();
  const { rank, size } = world;
  // This rank's block of the dataset's rows.
  const lo = Math.floor((allRows * rank) / size);
  const hi = Math.floor((allRows * (rank + 1)) / size);
  const rows = hi - lo;
  const { bins, label } = makeRows(lo, hi);
  const s: State = saved?.state ?? freshState(lo, hi);
  if (s.lo !== lo || s.hi !== hi) rederive(s, lo, hi, bins);
  try {
    while (s.tree < nTrees) {
      const base = s.tree * nodesPerTree;
      const first = 2 ** s.level - 1; // heap index of the first node on this level
      const width = 2 ** s.level;
      // grad[i], hess[i] of the log-loss at the current margins.
      const grad = new Float64Array(rows);
      const hess = new Float64Array(rows);
      for (let i = 0; i < rows; i++) {
        const p = 1 / (1 + Math.exp(-s.margin[i]));
        grad[i] = p - label[i];
        hess[i] = p * (1 - p);
      }
      // hist[((node * nFeatures + f) * nBins + bin) * 2 + {0: grad, 1: hess}] over this level's nodes.
      const hist = new Float64Array(width * nFeatures * nBins * 2);
      for (let i = 0; i < rows; i++) {
        const node = s.nodeOf[i] - first;
        if (node < 0 || s.feature[base + first + node] !== PENDING) continue; // settled in a leaf
        for (let f = 0; f < nFeatures; f++) {
          const k = ((node * nFeatures + f) * nBins + bins[i * nFeatures + f]) * 2;
          hist[k] += grad[i];
          hist[k + 1] += hess[i];
        }
      }
      // The one collective per level: afterwards every rank holds the same sums, bit for bit.
      const total = await world.allreduce(hist, "sum");

      let anyPending = false;
      for (let node = 0; node < width; node++) {
        const at = base + first + node;
        if (s.feature[at] !== PENDING) continue;
        const best = s.level < maxDepth ? bestSplit(total, node) : undefined;
        if (best === undefined) {
          s.feature[at] = LEAF;
          s.value[at] = (-eta * nodeGrad(total, node)) / (nodeHess(total, node) + lambda);
        } else {
          s.feature[at] = best.feature;
          s.split[at] = best.bin;
          s.feature[base + 2 * (first + node) + 1] = PENDING;
          s.feature[base + 2 * (first + node) + 2] = PENDING;
          anyPending = true;
        }
      }
      // Send each row of a split node to its child.
      for (let i = 0; i < rows; i++) {
        const at = base + s.nodeOf[i];
        const f = s.feature[at];
        if (f < 0) continue; // a leaf, decided now or on an earlier level
        s.nodeOf[i] = 2 * s.nodeOf[i] + (bins[i * nFeatures + f] <= s.split[at] ? 1 : 2);
      }
      s.level++;
      if (!anyPending) {
        // The tree is complete: add its leaves to the margins and start the next one.
        for (let i = 0; i < rows; i++) s.margin[i] += s.value[base + s.nodeOf[i]];
        s.nodeOf.fill(0);
        s.tree++;
        s.level = 0;
        if (s.tree < nTrees) s.feature[s.tree * nodesPerTree] = PENDING;
      }
      await world.checkpoint(s);
    }

    // Training loss and accuracy over all ranks, for the summary line.
    let lossSum = 0;
    let correct = 0;
    for (let i = 0; i < rows; i++) {
      const z = s.margin[i];
      lossSum += Math.max(z, 0) + Math.log1p(Math.exp(-Math.abs(z))) - label[i] * z;
      if ((z > 0 ? 1 : 0) === label[i]) correct++;
    }
    const [loss, right] = await world.allreduce(new Float64Array([lossSum, correct]), "sum");
    if (rank === 0) {
      const splits = s.feature.filter((f) => f >= 0).length;
      console.log(
        `boosting: ${nTrees} trees (depth ${maxDepth}, ${splits} splits) on ${size} ranks x ${rows} rows, ${nFeatures} features, seed ${seed}: loss ${(loss / allRows).toFixed(6)}, accuracy ${((100 * right) / allRows).toFixed(2)}%`,
      );
    }
    const h = createHash("sha256");
    for (const a of [s.feature, s.split, s.value]) h.update(new Uint8Array(a.buffer, a.byteOffset, a.byteLength));
    await world.finalize(h.digest("hex"));
    break;
  } catch (err) {
    // --mode elastic: a rank left or joined. Go round: restore(), then take this rank's new rows.
    if (!isLifelineError(err, "MPI_WORLD_CHANGED")) throw err;
  }
}

function freshState(lo: number, hi: number): State {
  const feature = new Int32Array(nTrees * nodesPerTree).fill(UNUSED);
  feature[0] = PENDING;
  return {
    lo,
    hi,
    tree: 0,
    level: 0,
    nodeOf: new Int32Array(hi - lo),
    margin: new Float64Array(hi - lo),
    feature,
    split: new Int32Array(nTrees * nodesPerTree),
    value: new Float64Array(nTrees * nodesPerTree),
  };
}

/**
 * Rows lo..hi-1 take the place of the state's rows: each one's margin (the finished trees' leaf
 * values, added in training's order from 0) and its node in the tree being grown (the splits
 * decided so far, level by level) come from the model.
 */
function rederive(s: State, lo: number, hi: number, bins: Uint8Array | Uint16Array): void {
  const rows = hi - lo;
  const walk = (tree: number, i: number, levels: number): number => {
    const base = tree * nodesPerTree;
    let node = 0;
    for (let l = 0; l < levels; l++) {
      const f = s.feature[base + node];
      if (f < 0) break; // a leaf (or not split yet)
      node = 2 * node + (bins[i * nFeatures + f] <= s.split[base + node] ? 1 : 2);
    }
    return node;
  };
  s.margin = new Float64Array(rows);
  s.nodeOf = new Int32Array(rows);
  for (let i = 0; i < rows; i++) {
    for (let t = 0; t < s.tree; t++) s.margin[i] += s.value[t * nodesPerTree + walk(t, i, maxDepth)];
    if (s.tree < nTrees) s.nodeOf[i] = walk(s.tree, i, s.level);
  }
  s.lo = lo;
  s.hi = hi;
}

/** Sum of gradients in a node: every row falls in exactly one bin of feature 0. */
function nodeGrad(total: Float64Array, node: number): number {
  let g = 0;
  for (let b = 0; b < nBins; b++) g += total[(node * nFeatures * nBins + b) * 2];
  return g;
}

function nodeHess(total: Float64Array, node: number): number {
  let h = 0;
  for (let b = 0; b < nBins; b++) h += total[(node * nFeatures * nBins + b) * 2 + 1];
  return h;
}

/**
 * XGBoost's exact-greedy gain over the histogram's bin boundaries: rows with bin <= b go left.
 * Ties keep the first candidate in (feature, bin) order, so every rank picks the same split.
 */
function bestSplit(total: Float64Array, node: number): { feature: number; bin: number } | undefined {
  const G = nodeGrad(total, node);
  const H = nodeHess(total, node);
  if (H < 2 * minChildWeight) return undefined;
  const parentScore = (G * G) / (H + lambda);
  let bestGain = 1e-9;
  let best: { feature: number; bin: number } | undefined;
  for (let f = 0; f < nFeatures; f++) {
    let gl = 0;
    let hl = 0;
    for (let b = 0; b < nBins - 1; b++) {
      const k = ((node * nFeatures + f) * nBins + b) * 2;
      gl += total[k];
      hl += total[k + 1];
      const gr = G - gl;
      const hr = H - hl;
      if (hl < minChildWeight || hr < minChildWeight) continue;
      const gain = 0.5 * ((gl * gl) / (hl + lambda) + (gr * gr) / (hr + lambda) - parentScore);
      if (gain > bestGain) {
        bestGain = gain;
        best = { feature: f, bin: b };
      }
    }
  }
  return best;
}

/**
 * Rows lo..hi-1 of the dataset, binned. Row g is row g % nRows of shard floor(g / nRows); shard k
 * is what rank k of the first world holds: its rows come from a generator seeded by (seed, k),
 * with the last column missing on odd shards (it reads 0, bin 0, as missing values would).
 * Features are uniform in [0, 1); the label is a noisy non-linear function of features 0..3.
 */
function makeRows(lo: number, hi: number): { bins: Uint8Array | Uint16Array; label: Uint8Array } {
  const binsOut = nBins <= 256 ? new Uint8Array((hi - lo) * nFeatures) : new Uint16Array((hi - lo) * nFeatures);
  const labelOut = new Uint8Array(hi - lo);
  const x = new Float64Array(nFeatures);
  let shard = -1;
  let rng = (): number => 0;
  let width = 0;
  for (let g = lo; g < hi; g++) {
    if (Math.floor(g / nRows) !== shard) {
      // Into a new shard: its generator, advanced past the rows before this one (width + 1 draws a row).
      shard = Math.floor(g / nRows);
      width = featuresArg - (shard % 2);
      rng = mulberry32((Math.imul(seed, 0x9e3779b1) ^ Math.imul(shard + 1, 0x85ebca6b)) >>> 0);
      for (let skip = (g % nRows) * (width + 1); skip > 0; skip--) rng();
    }
    const i = g - lo;
    for (let f = 0; f < nFeatures; f++) {
      x[f] = f < width ? rng() : 0;
      binsOut[i * nFeatures + f] = Math.min(nBins - 1, Math.floor(x[f] * nBins));
    }
    const signal = (x[0] > 0.5 && x[1] < 0.4 ? 1 : 0) + (x[2] * x[3] > 0.3 ? 1 : 0) - 0.5 + 1.2 * (rng() - 0.5);
    labelOut[i] = signal > 0 ? 1 : 0;
  }
  return { bins: binsOut, label: labelOut };
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

function intArg(name: string, raw: string | undefined, min: number): number {
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min) throw new RangeError(`--${name} must be an integer >= ${min}, got ${raw}`);
  return n;
}
