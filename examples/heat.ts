/**
 * heat.ts — a 2-D heat equation solved by Jacobi iteration, the classic halo-exchange stencil.
 *
 * Demonstrates: a domain split across ranks by rows, non-blocking halo exchange of
 * `Float64Array` rows (`isend`/`irecv` + `waitAll`), an `allreduce` of the residual every
 * iteration (so every rank takes the same stop decision), one state object checkpointed once
 * per iteration. This is the `npm run demo` program.
 *
 * Run:
 *   npx lifeline run -n 4 --mode none examples/heat.ts
 *   npx lifeline run -n 4 --mode cpr --checkpoint-every 50steps examples/heat.ts --rows 512 --iters 2000
 *
 * Args: --rows R (global rows, default 256), --cols C (default 256), --iters N (default 400),
 *       --tol T (stop once the residual's L2 norm is below T, default 1e-4).
 *
 * The plate's top edge is held at sin(pi x), the other edges at 0. Rank r owns a contiguous
 * block of rows plus one halo row above and one below. The result is each rank's slab, which
 * depends only on the grid, the iteration count and the number of ranks (the residual sum is
 * reduced in a fixed order), so its SHA-256 is the same on every re-run.
 */
import { createHash } from "node:crypto";
import { parseArgs } from "node:util";
import { init } from "lifeline";

interface State {
  /** Sweeps done so far. */
  iter: number;
  /** This rank's slab, (localRows + 2) x cols, row-major; rows 0 and localRows + 1 are halos. */
  u: Float64Array;
  /** L2 norm of the last sweep's change over the whole grid. */
  residual: number;
}

/** Halo rows travelling towards rank - 1 carry TAG_UP; towards rank + 1, TAG_DOWN. */
const TAG_UP = 1;
const TAG_DOWN = 2;

const { values: args } = parseArgs({
  options: {
    rows: { type: "string", default: "256" },
    cols: { type: "string", default: "256" },
    iters: { type: "string", default: "400" },
    tol: { type: "string", default: "1e-4" },
  },
});
const rows = intArg("rows", args.rows, 3);
const cols = intArg("cols", args.cols, 3);
const iters = intArg("iters", args.iters, 0);
const tol = Number(args.tol);
if (!(tol >= 0)) throw new RangeError(`--tol must be a non-negative number, got ${args.tol}`);

const world = await init();
const { rank, size } = world;
if (rows < size) throw new RangeError(`--rows ${rows} is fewer than the ${size} ranks`);

// Block distribution of rows: the first (rows % size) ranks get one extra row.
const base = Math.floor(rows / size);
const extra = rows % size;
const localRows = base + (rank < extra ? 1 : 0);
const firstRow = rank * base + Math.min(rank, extra); // global index of local row 1
const up = rank - 1; // neighbour owning the rows above, or -1
const down = rank + 1 < size ? rank + 1 : -1;

const saved = await world.restore<State>();
const s: State = saved?.state ?? { iter: 0, u: initialSlab(), residual: Infinity };
// The second buffer of the Jacobi pair is scratch: it is fully rewritten each sweep, and its
// fixed boundary cells come from the same slab, so it need not be part of the checkpoint.
let next: Float64Array = s.u.slice();

while (s.iter < iters && s.residual > tol) {
  await exchangeHalos(s.u);
  const localSq = sweep(s.u, next);
  [s.u, next] = [next, s.u];
  // Every rank gets the same bits back, so every rank leaves the loop at the same iteration.
  s.residual = Math.sqrt(await world.allreduce(localSq, "sum"));
  s.iter++;
  await world.checkpoint(s); // no request is outstanding here: exchangeHalos waited for all
}

if (rank === 0) {
  console.log(`heat: ${rows}x${cols} grid on ${size} ranks, ${s.iter} iterations, residual ${s.residual.toExponential(3)}`);
}
// The digest covers the rows this rank owns, not the halo copies of its neighbours' rows.
await world.finalize(sha256Hex(s.u.subarray(cols, (localRows + 1) * cols)));

/** The slab at t = 0: zero inside, sin(pi x) along the plate's top edge (global row 0). */
function initialSlab(): Float64Array {
  const u = new Float64Array((localRows + 2) * cols);
  if (firstRow === 0) {
    for (let j = 0; j < cols; j++) u[cols + j] = Math.sin((Math.PI * j) / (cols - 1));
  }
  return u;
}

/** Sends our edge rows to the neighbours and fills our halo rows with theirs. */
async function exchangeHalos(u: Float64Array): Promise<void> {
  const recvs = [];
  const sends = [];
  if (up >= 0) {
    recvs.push(world.irecv<Float64Array>(up, TAG_DOWN));
    // slice(): the send gets its own copy, so nothing we do to `u` can race with the transport.
    sends.push(world.isend(u.slice(cols, 2 * cols), up, TAG_UP));
  }
  if (down >= 0) {
    recvs.push(world.irecv<Float64Array>(down, TAG_UP));
    sends.push(world.isend(u.slice(localRows * cols, (localRows + 1) * cols), down, TAG_DOWN));
  }
  for (const msg of await world.waitAll(recvs)) {
    const halo = msg.source === up ? 0 : localRows + 1;
    if (msg.data.length !== cols) throw new Error(`halo from rank ${msg.source} has ${msg.data.length} cells, want ${cols}`);
    u.set(msg.data, halo * cols);
  }
  await world.waitAll(sends);
}

/** One Jacobi sweep from `u` into `out`; returns this rank's sum of squared changes. */
function sweep(u: Float64Array, out: Float64Array): number {
  let sq = 0;
  for (let i = 1; i <= localRows; i++) {
    const g = firstRow + i - 1;
    if (g === 0 || g === rows - 1) continue; // the plate's top and bottom edges are fixed
    const row = i * cols;
    for (let j = 1; j < cols - 1; j++) {
      const k = row + j;
      const v = 0.25 * (u[k - cols] + u[k + cols] + u[k - 1] + u[k + 1]);
      const d = v - u[k];
      sq += d * d;
      out[k] = v;
    }
  }
  return sq;
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
