/**
 * Collective algorithms, built on point-to-point messages of kind `collective`.
 *
 * Each collective call gets a sequence number (the same on every rank, since ranks must call
 * collectives in the same order) and a signature (hash of kind, root, op, type, length); its
 * messages are numbered by step, so `(sequence, source, step)` names every message exactly,
 * and a receiver that sees a different signature reports a mismatch instead of mixing data.
 *
 * Algorithms are chosen by size, and always combine operands in a fixed order:
 * - barrier: dissemination, ⌈log2 p⌉ rounds;
 * - bcast: binomial tree; the payload is encoded once at the root and forwarded as received;
 * - allreduce, small data on ≤ 3 ranks: one round of direct exchange, combined in rank order
 *   (on 4 ranks recursive doubling's 2 rounds of one message each beat 3 messages per rank:
 *   0.64x the raw ring's time against 0.98x, `npm run bench -- --only allreduce --np 4`);
 * - reduce / allreduce, otherwise small or user op: binomial tree / recursive doubling with the
 *   lower-ranked operand first (so user ops need only be associative);
 * - allreduce, large typed arrays with a built-in op on a power-of-two number of ranks (on 2
 *   ranks from 768 KiB: below it recursive doubling's one exchange of the whole array wins):
 *   recursive halving then doubling, 2·log2(p) steps; otherwise (and reduce) ring
 *   reduce-scatter (+ ring allgather, or a gather of chunks to the root); both move
 *   2(p-1)/p of the data per rank, bandwidth optimal; built-in ops are commutative bit for
 *   bit, so the order each block is combined in is fixed by the pattern alone;
 * - gather / scatter: direct (the root's link carries the data once either way);
 * - allgather: ring, forwarding each contribution's encoded frames without re-encoding;
 * - alltoall: all pairs at once.
 *
 * Memory rule on this path: a buffer handed to zeromq (which sends views without copying) is
 * never written again and never given to the program. User data is copied when encoded, unless
 * the receiver provably has the message before the call returns (a causal chain: the call
 * cannot return before a message that needs this one has come back); received buffers that
 * are forwarded are copied before the program sees them. A received chunk is the algorithm's
 * own: every mode that keeps a frame it received (cpr's late log, a checkpoint of the inbox)
 * or re-delivers one from a store keeps or delivers a copy, so the algorithms may combine into
 * what arrives. test/unit/collectives.test.ts checks this by scribbling over inputs and
 * results on return.
 */
import { LifelineError } from "../errors.ts";
import {
  allocUninitialisedLike,
  byteLengthOf,
  bytesOf,
  copyTyped,
  decodeBody,
  type EncodedBody,
  encodeBody,
  isTypedArray,
  typedArrayCode,
  typedArrayFrom,
} from "./codec.ts";
import { combine, combineInto, isBuiltinOp } from "./reduce-ops.ts";
import type { ReduceOp } from "./types.ts";
import { Encoding, type Header } from "./wire.ts";

/** A collective message as received: its header and its body frames. */
export interface Arrival {
  readonly header: Header;
  readonly frames: Buffer[];
}

/** What an algorithm needs from the communicator for one collective call. */
export interface CollectiveIo {
  readonly rank: number;
  readonly size: number;
  send(dest: number, step: number, body: EncodedBody): Promise<void>;
  recv(source: number, step: number): Promise<Arrival>;
  /**
   * Offered (retry-one keeps every result) when the result is a typed array of `arrayType`
   * whose bytes are the concatenation of `parts`, buffers nobody writes again: kept as they
   * are, they spare the keeper a copy of the whole result.
   */
  retainResult?(arrayType: number, parts: readonly Buffer[]): void;
}

/**
 * Typed arrays at or above this size use the bandwidth-optimal algorithms (recursive halving
 * and doubling, or the ring) when the op allows; below it recursive doubling's log2(p) steps
 * of the whole array are faster on few ranks, since each step costs a message's latency. On
 * 2 cores (`npm run bench -- --only allreduce --sizes 65536,131072,262144,1048576`) recursive
 * doubling won clearly at 64 and 128 KiB, the two were even at 192 and 256 KiB, and halving
 * and doubling won at 1 MiB.
 */
export const RING_BYTES_MIN = 256 * 1024;

/**
 * On 2 ranks an allreduce takes halving and doubling only from this size. Below it recursive
 * doubling, which there is one exchange of the whole array, is faster: it moves the same bytes
 * per rank as halving and doubling's two exchanges of half, in one step instead of two, and
 * combines straight into the array that arrived (no result array to assemble). What it costs
 * is a copy of the caller's array, sent while the call may return before the partner has it;
 * from about 768 KiB that copy and the whole-array combine cost as much as the second step.
 * `npm run bench -- --only allreduce --np 2 --sizes 262144,524288,786432,1048576,2097152`,
 * alternating builds with and without (docs/performance.md, "The allreduce from 64 KiB").
 */
export const TWO_RANK_HALVING_BYTES_MIN = 768 * 1024;

/** The size from which an allreduce on `size` ranks takes the bandwidth-optimal algorithms. */
export function largeAllreduceBytesMin(size: number): number {
  return size === 2 ? TWO_RANK_HALVING_BYTES_MIN : RING_BYTES_MIN;
}

type TA =
  | Float64Array
  | Float32Array
  | Int32Array
  | Uint32Array
  | Int16Array
  | Uint16Array
  | Int8Array
  | Uint8Array
  | Uint8ClampedArray
  | BigInt64Array
  | BigUint64Array;

const asBody = (a: Arrival): EncodedBody => ({ encoding: a.header.encoding, arrayType: a.header.arrayType, frames: a.frames });
const decode = (a: Arrival): unknown => decodeBody(a.header.encoding, a.header.arrayType, a.frames);
/** Decodes a body we also forward: the program gets a copy, never the forwarded buffers. */
const decodeCopy = (a: Arrival): unknown =>
  decodeBody(
    a.header.encoding,
    a.header.arrayType,
    a.frames.map((f) => Buffer.from(f)),
  );

/**
 * A chunk of `arr` as a message body: a view of `arr`, never a copy. ZeroMQ reads a sent buffer
 * later, on its I/O thread, while the algorithms go on writing into `arr` and hand it to the
 * program; so every caller sends a chunk that nothing writes before the receiver has it.
 */
function rawBody(arr: TA, from: number, to: number): EncodedBody {
  return { encoding: Encoding.typedArray, arrayType: typedArrayCode(arr), frames: [bytesOf(arr.subarray(from, to), false)] };
}

function viewOf(a: Arrival, like: TA, expectLength: number): TA {
  if (a.header.encoding !== Encoding.typedArray || a.header.arrayType !== typedArrayCode(like)) {
    throw new LifelineError("MPI_COLLECTIVE_MISMATCH", `rank ${a.header.source} sent a chunk of another type than ${like.constructor.name}`);
  }
  const v = typedArrayFrom(a.header.arrayType, a.frames[0]!);
  if (v.length !== expectLength) {
    throw new LifelineError("MPI_COLLECTIVE_MISMATCH", `rank ${a.header.source} sent a chunk of ${v.length} elements, expected ${expectLength}`);
  }
  return v;
}

const chunkStart = (n: number, p: number, i: number): number => Math.floor((i * n) / p);

/** acc.set(chunk, at) for a chunk of acc's own type (viewOf checked it; the union's set() cannot say so). */
function setChunk(acc: TA, chunk: TA, at: number): void {
  (acc as unknown as { set(a: TA, offset: number): void }).set(chunk, at);
}

// ---- barrier -------------------------------------------------------------------------------

export async function barrier(io: CollectiveIo): Promise<void> {
  const { rank, size } = io;
  const empty: EncodedBody = { encoding: Encoding.none, arrayType: 0, frames: [] };
  for (let k = 1, step = 0; k < size; k <<= 1, step++) {
    const sent = io.send((rank + k) % size, step, empty);
    await io.recv((rank - k + size) % size, step);
    await sent;
  }
}

// ---- bcast ---------------------------------------------------------------------------------

export async function bcast<T>(io: CollectiveIo, data: T, root: number): Promise<T> {
  const { rank, size } = io;
  const vr = (rank - root + size) % size;
  let body: EncodedBody | undefined;
  let received: Arrival | undefined;
  let mask = 1;
  if (vr === 0) {
    body = encodeBody(data, { copy: true });
  } else {
    while (mask < size) {
      if (vr & mask) {
        received = await io.recv((vr - mask + root) % size, 0);
        body = asBody(received);
        break;
      }
      mask <<= 1;
    }
  }
  mask >>= 1;
  if (vr === 0) mask = highestPowerOfTwoBelow(size);
  const sends: Promise<void>[] = [];
  let forwarded = false;
  for (; mask > 0; mask >>= 1) {
    if (vr + mask < size) {
      sends.push(io.send((vr + mask + root) % size, 0, body!));
      forwarded = true;
    }
  }
  await Promise.all(sends);
  if (vr === 0) return data;
  return (forwarded ? decodeCopy(received!) : decode(received!)) as T;
}

function highestPowerOfTwoBelow(n: number): number {
  let m = 1;
  while (m < n) m <<= 1;
  return m >> 1;
}

// ---- allreduce / reduce --------------------------------------------------------------------

/** Whether the bandwidth-optimal algorithms take `data`, from `minBytes` (an allreduce's: {@link largeAllreduceBytesMin}). */
function useRing(data: unknown, op: ReduceOp, size: number, minBytes = RING_BYTES_MIN): data is TA {
  return size > 1 && isTypedArray(data) && isBuiltinOp(op) && data.byteLength >= minBytes && data.length >= size;
}

/** Up to this many ranks, a small allreduce is one round of direct exchange. */
export const DIRECT_RANKS_MAX = 3;
/** ... and "small" means an encoded payload of at most this many bytes. */
export const DIRECT_BYTES_MAX = 8 * 1024;

/** Not async itself: it hands over the chosen algorithm's promise (one hop fewer per call). */
export function allreduce<T>(io: CollectiveIo, data: T, op: ReduceOp): Promise<T> {
  try {
    if (io.size === 1) return Promise.resolve(copyValue(data));
    if (useRing(data, op, io.size, largeAllreduceBytesMin(io.size))) {
      const pof2 = (io.size & (io.size - 1)) === 0;
      return (pof2 ? halvingDoublingAllreduce(io, data, op) : ringAllreduce(io, data, op)) as Promise<T>;
    }
    let body: EncodedBody | undefined;
    // A typed array's size is known without encoding it; other data is encoded once, and that
    // encoding is the first message of whichever algorithm runs.
    if (io.size <= DIRECT_RANKS_MAX && !(isTypedArray(data) && data.byteLength > DIRECT_BYTES_MAX)) {
      body = encodeBody(data, { copy: true });
      if (bodyBytes(body) <= DIRECT_BYTES_MAX) return directAllreduce(io, data, body, op) as Promise<T>;
    }
    return recursiveDoubling(io, data, op, body) as Promise<T>;
  } catch (err) {
    return Promise.reject(err);
  }
}

const bodyBytes = (b: EncodedBody): number => byteLengthOf(b.frames);

/**
 * One round: every rank sends its operand to every other rank, then each combines all of them
 * in rank order, x0 ⊕ x1 ⊕ … — the same expression everywhere, so the same bits. For few ranks
 * and small data, one round of message latency beats recursive doubling's log2(p) dependent
 * rounds (latency, not bandwidth, is the cost; `npm run bench -- --only allreduce --np 4`). The body is
 * encoded once and sent to every peer.
 */
async function directAllreduce(io: CollectiveIo, data: unknown, body: EncodedBody, op: ReduceOp): Promise<unknown> {
  const { rank, size } = io;
  const sends: Promise<void>[] = [];
  for (let k = 1; k < size; k++) sends.push(io.send((rank + k) % size, 0, body));
  const operands: unknown[] = new Array(size);
  operands[rank] = data;
  await Promise.all(
    Array.from({ length: size - 1 }, async (_, i) => {
      const src = (rank - i - 1 + size) % size;
      operands[src] = decode(await io.recv(src, 0));
    }),
  );
  await Promise.all(sends);
  // A received operand is ours to combine into; the caller's `data` never is.
  let acc = operands[0];
  let own = rank !== 0;
  for (let r = 1; r < size; r++) {
    acc = combine(acc, operands[r], op, own ? "lower" : r !== rank ? "higher" : undefined);
    own = true; // what combine() returns: a fresh value or a received operand
  }
  return acc === data ? copyValue(data) : acc;
}

/**
 * lower ⊕ higher where `theirs` arrived (ours alone: see the memory rule) and `acc` is this
 * rank's: computed into `theirs` when combine() can, so no fresh array is made.
 */
function combineArrival(theirs: unknown, acc: unknown, theirsLower: boolean, op: ReduceOp): unknown {
  return theirsLower ? combine(theirs, acc, op, "lower") : combine(acc, theirs, op, "higher");
}

/**
 * The body of a partial result that this rank sends and never returns: a view when a built-in
 * op made it (a fresh value or a chunk that arrived, which nothing writes again), else a copy
 * (the caller's own `data`, or whatever a user's function returned, which may be its input).
 */
function partialBody(acc: unknown, data: unknown, op: ReduceOp): EncodedBody {
  return encodeBody(acc, { copy: acc === data || !isBuiltinOp(op) });
}

function copyValue<T>(data: T): T {
  return (isTypedArray(data) ? copyTyped(data as unknown as TA) : data) as T;
}

/**
 * Recursive doubling with the usual fold for non-powers of two: ranks below 2·rem pair up
 * (even into odd) first, so every rank's "virtual rank" covers a contiguous range of real
 * ranks and each exchange combines lower-range ⊕ higher-range: the same expression on both
 * sides of every exchange, hence the same bits on every rank.
 */
/** `first`: `data` already encoded (copied), used for the first message that sends `data` itself. */
async function recursiveDoubling(io: CollectiveIo, data: unknown, op: ReduceOp, first?: EncodedBody): Promise<unknown> {
  const { rank, size } = io;
  // Only for an `acc` that is not the result (the last one, which the fold sends as a copy).
  const encodeAcc = (acc: unknown): EncodedBody => (acc === data && first !== undefined ? first : partialBody(acc, data, op));
  const pof2 = highestPowerOfTwoBelow(size + 1);
  const rem = size - pof2;
  let acc: unknown = data;
  let step = 0;
  let vrank: number;
  if (rank < 2 * rem) {
    if (rank % 2 === 0) {
      await io.send(rank + 1, step, encodeAcc(acc));
      vrank = -1;
    } else {
      acc = combineArrival(decode(await io.recv(rank - 1, step)), acc, true, op);
      vrank = rank >> 1;
    }
  } else {
    vrank = rank - rem;
  }
  step++;
  if (vrank >= 0) {
    const real = (v: number): number => (v < rem ? 2 * v + 1 : v + rem);
    for (let mask = 1; mask < pof2; mask <<= 1, step++) {
      const partner = real(vrank ^ mask);
      const sent = io.send(partner, step, encodeAcc(acc));
      const theirs = decode(await io.recv(partner, step));
      await sent;
      // Into what arrived: `acc` was just sent as a view and must not change.
      acc = combineArrival(theirs, acc, partner < rank, op);
    }
  } else {
    step += Math.log2(pof2);
  }
  if (rank < 2 * rem) {
    if (rank % 2 === 1) await io.send(rank - 1, step, encodeBody(acc, { copy: true }));
    else acc = decode(await io.recv(rank + 1, step));
  }
  // A rank that never combined (size 1 paths aside) must still not alias the caller's input.
  return acc === data ? copyValue(data) : acc;
}

/**
 * Ring reduce-scatter: after p-1 steps rank r holds the full reduction of chunk (r+1) mod p.
 * Chunk c is reduced along the ring in a fixed order, so every rank gets the same bits.
 */
async function ringReduceScatter(io: CollectiveIo, acc: TA, op: ReduceOp): Promise<void> {
  const { rank, size } = io;
  const n = acc.length;
  const next = (rank + 1) % size,
    prev = (rank - 1 + size) % size;
  for (let s = 0; s < size - 1; s++) {
    const sendChunk = (rank - s + size) % size;
    const recvChunk = (rank - s - 1 + size) % size;
    // A view: this chunk is written again only when its finished value comes back (at a
    // reduce's root), from the end of the chain that this message continues, so after the
    // successor received it (each rank sends step t + 1 only after it received step t). (A
    // retry-one execution that is abandoned stops writing: its receives fail.)
    const sent = io.send(next, s, rawBody(acc, chunkStart(n, size, sendChunk), chunkStart(n, size, sendChunk + 1)));
    const from = chunkStart(n, size, recvChunk),
      to = chunkStart(n, size, recvChunk + 1);
    const theirs = viewOf(await io.recv(prev, s), acc, to - from);
    // Built-in ops are commutative bit for bit; the partial sum from upstream goes first.
    combineInto(acc.subarray(from, to), theirs, op, false);
    await sent;
  }
}

/**
 * Ring allreduce (any number of ranks): reduce-scatter, then allgather. The reduce-scatter
 * combines our part of each chunk into the chunk that arrived (which nothing else holds) and
 * passes that buffer on, so no copy of the caller's data is made; the first step sends a view
 * of it (this call cannot return before our chunk comes back finished, at the end of a chain
 * that starts with that message).
 */
async function ringAllreduce(io: CollectiveIo, data: TA, op: ReduceOp): Promise<TA> {
  const { rank, size } = io;
  const n = data.length;
  const at = (chunk: number): number => chunkStart(n, size, chunk);
  const next = (rank + 1) % size,
    prev = (rank - 1 + size) % size;
  // After the reduce-scatter this rank holds chunk `mine` finished.
  const mine = (rank + 1) % size;
  let outgoing = rawBody(data, at(rank), at(rank + 1));
  let cur: TA = data;
  for (let s = 0; s < size - 1; s++) {
    const sent = io.send(next, s, outgoing);
    const chunk = (rank - s - 1 + size) % size;
    cur = viewOf(await io.recv(prev, s), data, at(chunk + 1) - at(chunk));
    // The partial sum from upstream first, as ringReduceScatter combines it.
    combineInto(cur, data.subarray(at(chunk), at(chunk + 1)), op, true);
    outgoing = rawBody(cur, 0, cur.length);
    await sent;
  }
  const finished = cur;
  const out = allocUninitialisedLike(data, n); // every chunk is set below
  // Allgather: forward what we receive (buffers the program never sees), copy it into `out`.
  // The finished chunks as immutable buffers (ours, the others as received).
  const parts: Buffer[] = [];
  parts[mine] = bytesOf(finished, false);
  let gathered: EncodedBody = { encoding: Encoding.typedArray, arrayType: typedArrayCode(data), frames: [parts[mine]] };
  for (let s = 0; s < size - 1; s++) {
    const base = size - 1;
    const sent = io.send(next, base + s, gathered);
    if (s === 0) setChunk(out, finished, at(mine));
    const recvChunk = (rank - s + size) % size;
    const arrival = await io.recv(prev, base + s);
    setChunk(out, viewOf(arrival, data, at(recvChunk + 1) - at(recvChunk)), at(recvChunk));
    parts[recvChunk] = arrival.frames[0]!;
    gathered = asBody(arrival);
    await sent;
  }
  if (io.retainResult !== undefined && byteLengthOf(parts) === out.byteLength) {
    io.retainResult(typedArrayCode(out), parts);
  }
  return out;
}

/**
 * Recursive halving, then recursive doubling (power-of-two sizes): the same bytes per rank as
 * the ring, 2(p-1)/p of the data, in 2·log2(p) steps instead of 2(p-1). Rank r ends the
 * halving with block r fully reduced — each block is reduced in one place, along a fixed tree,
 * so every rank gets the same bits on every run — then the doubling hands the finished blocks
 * round, each as the immutable buffer it was made or received as (several frames per message).
 *
 * The partial sums live in buffers the program never sees, so the result array is written
 * once, at the end. The first step sends half of the caller's data and combines the other half
 * into the chunk that arrived, which nothing else holds (no copy of the caller's data at all;
 * the view sent is safe because this call cannot return before that partner's finished blocks
 * come back, which needs that message). Later steps combine in place into the half they keep
 * of that buffer and send the other half as a view: nothing writes it again.
 */
async function halvingDoublingAllreduce(io: CollectiveIo, data: TA, op: ReduceOp): Promise<TA> {
  const { rank, size } = io;
  const n = data.length;
  const at = (block: number): number => chunkStart(n, size, block);
  // `cur` holds the partial sums of blocks [lo, hi): element i of it is element at(lo) + i.
  let cur: TA = data;
  let lo = 0,
    hi = size;
  let step = 0;
  for (let dist = size >> 1; dist >= 1; dist >>= 1, step++) {
    const partner = rank ^ dist;
    const mid = (lo + hi) >> 1;
    const lower = rank < partner;
    const [keepLo, keepHi] = lower ? [lo, mid] : [mid, hi];
    const [sendLo, sendHi] = lower ? [mid, hi] : [lo, mid];
    const base = at(lo);
    const sent = io.send(partner, step, rawBody(cur, at(sendLo) - base, at(sendHi) - base));
    const theirs = viewOf(await io.recv(partner, step), data, at(keepHi) - at(keepLo));
    const ours = cur.subarray(at(keepLo) - base, at(keepHi) - base);
    if (cur !== data) {
      combineInto(ours, theirs, op, false);
      cur = ours;
    } else {
      // Built-in ops are commutative bit for bit: theirs ⊕ ours == ours ⊕ theirs.
      combineInto(theirs, ours, op, false);
      cur = theirs;
    }
    await sent;
    lo = keepLo;
    hi = keepHi;
  }
  // Block `rank` is final, in `cur`, which nothing writes again. The finished blocks as
  // immutable buffers: ours and the others as received.
  const parts: Buffer[] = new Array(size);
  parts[rank] = bytesOf(cur, false);
  const code = typedArrayCode(data);
  const out = allocUninitialisedLike(data, n); // every block is set below
  for (let dist = 1; dist < size; dist <<= 1, step++) {
    const partner = rank ^ dist;
    const sent = io.send(partner, step, { encoding: Encoding.typedArray, arrayType: code, frames: parts.slice(lo, hi) });
    // Our own block goes into the result while the first exchange is on the wire.
    if (dist === 1) setChunk(out, cur, at(rank));
    const [theirLo, theirHi] = partner < rank ? [lo - dist, lo] : [hi, hi + dist];
    const arrival = await io.recv(partner, step);
    if (arrival.header.encoding !== Encoding.typedArray || arrival.header.arrayType !== code || arrival.frames.length !== theirHi - theirLo) {
      throw new LifelineError(
        "MPI_COLLECTIVE_MISMATCH",
        `rank ${partner} sent ${arrival.frames.length} finished blocks of another shape than ${data.constructor.name}`,
      );
    }
    for (let b = theirLo; b < theirHi; b++) {
      const frame = arrival.frames[b - theirLo]!;
      setChunk(out, viewOf({ header: arrival.header, frames: [frame] }, data, at(b + 1) - at(b)), at(b));
      parts[b] = frame;
    }
    lo = Math.min(lo, theirLo);
    hi = Math.max(hi, theirHi);
    await sent;
  }
  if (io.retainResult !== undefined && byteLengthOf(parts) === out.byteLength) io.retainResult(code, parts);
  return out;
}

export async function reduce<T>(io: CollectiveIo, data: T, op: ReduceOp, root: number): Promise<T | undefined> {
  const { rank, size } = io;
  if (size === 1) return copyValue(data);
  if (useRing(data, op, size)) {
    // Reduce-scatter, then every rank sends its finished chunk to the root.
    const acc = copyTyped(data as unknown as TA);
    const n = acc.length;
    await ringReduceScatter(io, acc, op);
    const mine = (rank + 1) % size;
    const step = size;
    if (rank !== root) {
      // A view: acc is this call's own and never written again (a non-root returns nothing).
      await io.send(root, step, rawBody(acc, chunkStart(n, size, mine), chunkStart(n, size, mine + 1)));
      return undefined;
    }
    for (let r = 0; r < size; r++) {
      if (r === root) continue;
      const c = (r + 1) % size;
      const from = chunkStart(n, size, c),
        to = chunkStart(n, size, c + 1);
      setChunk(acc, viewOf(await io.recv(r, step), acc, to - from), from);
    }
    return acc as unknown as T;
  }
  // Binomial tree toward rank 0 over real ranks: node r owns the contiguous range
  // [r, r + 2^k), so acc ⊕ child keeps rank order. Rank 0 then hands the result to the root.
  let acc: unknown = data;
  let step = 0;
  for (let mask = 1; mask < size; mask <<= 1, step++) {
    if (rank & mask) {
      await io.send(rank - mask, step, partialBody(acc, data, op));
      acc = undefined;
      break;
    }
    if (rank + mask < size) acc = combineArrival(decode(await io.recv(rank + mask, step)), acc, false, op);
  }
  const last = 64;
  if (root === 0) return rank === 0 ? (acc === data ? copyValue(data) : (acc as T)) : undefined;
  if (rank === 0) {
    await io.send(root, last, partialBody(acc, data, op));
    return undefined;
  }
  if (rank === root) return decode(await io.recv(0, last)) as T;
  return undefined;
}

// ---- gather / scatter / allgather / alltoall ------------------------------------------------

export async function gather<T>(io: CollectiveIo, data: T, root: number): Promise<T[] | undefined> {
  const { rank, size } = io;
  if (rank !== root) {
    await io.send(root, 0, encodeBody(data, { copy: true }));
    return undefined;
  }
  const out: T[] = new Array(size);
  out[root] = data;
  await Promise.all(
    Array.from({ length: size }, async (_, r) => {
      if (r !== root) out[r] = decode(await io.recv(r, 0)) as T;
    }),
  );
  return out;
}

export async function scatter<T>(io: CollectiveIo, items: readonly T[] | undefined, root: number): Promise<T> {
  const { rank } = io;
  if (rank !== root) return decode(await io.recv(root, 0)) as T;
  await Promise.all(items!.flatMap((item, r) => (r === root ? [] : [io.send(r, 0, encodeBody(item, { copy: true }))])));
  return items![root]!;
}

export async function allgather<T>(io: CollectiveIo, data: T): Promise<T[]> {
  const { rank, size } = io;
  const out: T[] = new Array(size);
  out[rank] = data;
  const next = (rank + 1) % size,
    prev = (rank - 1 + size) % size;
  let outgoing = encodeBody(data, { copy: true });
  for (let s = 0; s < size - 1; s++) {
    const sent = io.send(next, s, outgoing);
    const arrival = await io.recv(prev, s);
    const owner = (rank - s - 1 + size) % size;
    const forward = s < size - 2;
    out[owner] = (forward ? decodeCopy(arrival) : decode(arrival)) as T;
    outgoing = asBody(arrival);
    await sent;
  }
  return out;
}

export async function alltoall<T>(io: CollectiveIo, items: readonly T[]): Promise<T[]> {
  const { rank, size } = io;
  const out: T[] = new Array(size);
  out[rank] = items[rank]!;
  const sends: Promise<void>[] = [];
  for (let k = 1; k < size; k++) {
    const dest = (rank + k) % size;
    sends.push(io.send(dest, 0, encodeBody(items[dest], { copy: true })));
  }
  await Promise.all(
    Array.from({ length: size - 1 }, async (_, i) => {
      const src = (rank - i - 1 + size) % size;
      out[src] = decode(await io.recv(src, 0)) as T;
    }),
  );
  await Promise.all(sends);
  return out;
}
