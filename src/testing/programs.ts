/**
 * Random SPMD programs for the simulator, generated from a seed, and their interpreter.
 *
 * A {@link ProgramSpec} is a list of operations every rank runs in the same order:
 * point-to-point rounds (blocking and non-blocking sends; receives by exact source and tag,
 * by source with ANY_TAG, by tag with ANY_SOURCE, fully wild, `irecv` + `waitAll`, `irecv` +
 * `waitAny` loops, `probe` then `recv`), every collective with random roots, ops and data
 * (numbers, strings under a non-commutative user op, objects with Maps and bigints, typed
 * arrays, occasionally large enough for the ring algorithms), two collectives in flight at
 * once, a collective overlapping a point-to-point round, `nondet` values and `checkpoint()`s.
 *
 * The result of a rank is one short digest per operation, built so that every legal MPI
 * schedule gives the same digests: wildcard receives are folded per source in arrival order
 * (messages from one source on one matching receive cannot overtake each other) and sorted
 * by source; `waitAny` completions are folded by request index; a value from the
 * schedule-dependent environment only reorders sends to different destinations. So any
 * difference from the reference run is a bug in the communicator (or in the simulator).
 *
 * The interpreter keeps its progress in one state object (next operation, digests so far)
 * and calls `restore()` first, so the same program can resume from a recovery line in cpr.
 *
 * @example
 * const spec = generateProgram(new Prng(seed), { size: 3, opsMax: 12 });
 * const program = programOf(spec); // (world, ctx) => Promise<{ ops: string[] }>
 */
import { createHash } from "node:crypto";
import { RING_BYTES_MIN } from "../mpi/collectives.ts";
import { encodeValue } from "../mpi/codec.ts";
import { ANY_SOURCE, ANY_TAG, type Message, type ReduceOp, type Request } from "../mpi/types.ts";
import type { World } from "../mpi/world.ts";
import { mix32, Prng } from "./prng.ts";
import type { RankContext, SimProgram } from "./sim-cluster.ts";

export type RecvStyle = "specific" | "anyTagPerSource" | "anySource" | "anyAny" | "irecvAll" | "irecvAnySource" | "waitAny" | "probe";
const RECV_STYLES: readonly RecvStyle[] = ["specific", "anyTagPerSource", "anySource", "anyAny", "irecvAll", "irecvAnySource", "waitAny", "probe"];

export interface P2pMsg {
  readonly src: number;
  readonly dst: number;
  readonly tag: number;
  /** Index into the op's messages: the payload is derived from it. */
  readonly id: number;
}

export interface P2pRound {
  readonly msgs: readonly P2pMsg[];
  readonly recvStyle: readonly RecvStyle[];
  readonly isend: readonly boolean[];
  /** Senders reorder their sends to different destinations by an environment value. */
  readonly shuffleSends: boolean;
  /** Needed after fully wild receives, so no later round's message can be taken by them. */
  readonly barrierAfter: boolean;
  /** Per receiver, a permutation seed for the order of exact receives. */
  readonly orderSeed: number;
}

export type CollKind = "barrier" | "bcast" | "reduce" | "allreduce" | "gather" | "scatter" | "allgather" | "alltoall";
export type DataKind = "int" | "float" | "string" | "object" | "f64" | "i32" | "u8" | "bigF64";

export interface CollSpec {
  readonly kind: CollKind;
  readonly root: number;
  /** Reduction op name, or "concat" (a non-commutative user function on strings). */
  readonly op: string;
  readonly data: DataKind;
  readonly len: number;
  readonly salt: number;
}

export type Op =
  | { readonly kind: "p2p"; readonly round: P2pRound }
  | { readonly kind: "coll"; readonly coll: CollSpec }
  | { readonly kind: "collPair"; readonly a: CollSpec; readonly b: CollSpec }
  | { readonly kind: "overlap"; readonly coll: CollSpec; readonly round: P2pRound }
  | { readonly kind: "nondet"; readonly salt: number }
  /**
   * Each rank sends one token to a peer chosen by an environment value (`nondet`), after an
   * alltoall of who-sends-to-whom; receivers take their tokens with wildcards. The pattern
   * differs per schedule and per attempt; the folded result (a count) does not. Under cpr this
   * only stays consistent if recorded nondet values are replayed after a restore.
   */
  | { readonly kind: "nondetRoute"; readonly tag: number }
  /** A checkpoint() location; with `mask`, only the ranks whose bit is set call it (uneven checkpoints). */
  | { readonly kind: "checkpoint"; readonly mask?: number };

export interface ProgramSpec {
  readonly seed: number;
  readonly size: number;
  readonly ops: readonly Op[];
  /**
   * With it, every checkpoint() also saves a global: a Float64Array of this many elements that
   * is a fixed function of how many checkpoints the rank took (the same on every rank at the
   * same count, as the API asks), and a restore checks it got that checkpoint's own global.
   */
  readonly globalElems?: number;
  /**
   * The share of point-to-point messages that carry a typed array of 64 KiB and more (the
   * sizes a sender log keeps in pooled memory) instead of a few small values; default 0.
   */
  readonly p2pBigChance?: number;
}

export interface GenerateOptions {
  readonly size: number;
  readonly opsMax: number;
  /** Messages per p2p round at most (default 2 × size). */
  readonly msgsMax?: number;
  /** Chance a reduction uses a typed array big enough for the ring algorithms (default 0.02). */
  readonly bigChance?: number;
  /** Chance an operation is a checkpoint() location (default 0.07; cpr runs want more). */
  readonly checkpointChance?: number;
  /** Only collectives (awaited one at a time) and checkpoints: retry-one's programs. */
  readonly collectivesOnly?: boolean;
  /** Checkpoint locations that only some ranks call (a master checkpointing per result, workers per task). */
  readonly unevenCheckpoints?: boolean;
}

/** Tags of round i live in [i*TAG_STRIDE, (i+1)*TAG_STRIDE): rounds never share a tag. */
const TAG_STRIDE = 8;
/** A large point-to-point body: 64 KiB + a ragged tail, sent from bounce buffers (a reply: from the program's memory). */
const BIG_F64 = 8192 + 3;
/** A large reduction operand: past RING_BYTES_MIN with a ragged tail, so it takes the halving-doubling or ring path. */
const BIG_COLL_F64 = RING_BYTES_MIN / 8 + 3;

function genRound(prng: Prng, size: number, opIndex: number, msgsMax: number): P2pRound {
  const n = prng.rangeInclusive(0, msgsMax);
  const msgs: P2pMsg[] = [];
  for (let id = 0; id < n; id++) {
    const src = prng.index(size);
    let dst = prng.index(size);
    if (prng.chance(0.8) && size > 1 && dst === src) dst = (dst + 1) % size; // mostly real peers, sometimes self
    // Few tags per round, so that (source, tag) repeats and non-overtaking is exercised.
    msgs.push({ src, dst, tag: opIndex * TAG_STRIDE + prng.index(3), id });
  }
  const recvStyle = Array.from({ length: size }, () => prng.pick(RECV_STYLES));
  return {
    msgs,
    recvStyle,
    isend: Array.from({ length: size }, () => prng.chance(0.5)),
    shuffleSends: prng.chance(0.3),
    barrierAfter: recvStyle.includes("anyAny") || prng.chance(0.1),
    orderSeed: prng.next(),
  };
}

function genColl(prng: Prng, size: number, bigChance: number): CollSpec {
  const kind = prng.pick<CollKind>(["barrier", "bcast", "reduce", "allreduce", "allreduce", "gather", "scatter", "allgather", "alltoall"]);
  const root = prng.index(size);
  let op = "sum";
  let data: DataKind = prng.pick<DataKind>(["int", "float", "string", "object", "f64", "i32", "u8"]);
  if (kind === "reduce" || kind === "allreduce") {
    if (prng.chance(bigChance)) {
      data = "bigF64";
      op = prng.pick(["sum", "max", "min"]);
    } else {
      data = prng.pick<DataKind>(["int", "float", "string", "f64", "i32"]);
      switch (data) {
        case "int":
          op = prng.pick(["sum", "prod", "min", "max", "band", "bor", "land", "lor"]);
          break;
        case "float":
        case "f64":
          op = prng.pick(["sum", "prod", "min", "max"]);
          break;
        case "i32":
          op = prng.pick(["sum", "min", "max", "band", "bor"]);
          break;
        case "string":
          op = "concat";
          break;
        default:
          break;
      }
    }
  }
  return { kind, root, op, data, len: prng.rangeInclusive(1, 6), salt: prng.next() };
}

/** Generates a program. The same PRNG state always gives the same program. */
export function generateProgram(prng: Prng, opts: GenerateOptions): ProgramSpec {
  const { size } = opts;
  const msgsMax = opts.msgsMax ?? 2 * size;
  const bigChance = opts.bigChance ?? 0.02;
  const count = prng.rangeInclusive(1, opts.opsMax);
  const ops: Op[] = [];
  const cp = opts.checkpointChance ?? 0.07;
  for (let i = 0; i < count; i++) {
    if (opts.collectivesOnly === true) {
      ops.push(prng.chance(cp) ? { kind: "checkpoint" } : { kind: "coll", coll: genColl(prng, size, bigChance) });
      continue;
    }
    if (cp !== 0.07 && prng.chance(cp)) {
      ops.push(opts.unevenCheckpoints === true && prng.chance(0.5) ? { kind: "checkpoint", mask: prng.index(1 << size) } : { kind: "checkpoint" });
      continue;
    }
    const r = prng.float();
    if (r < 0.35) ops.push({ kind: "p2p", round: genRound(prng, size, i, msgsMax) });
    else if (r < 0.7) ops.push({ kind: "coll", coll: genColl(prng, size, bigChance) });
    else if (r < 0.78) ops.push({ kind: "collPair", a: genColl(prng, size, bigChance), b: genColl(prng, size, bigChance) });
    else if (r < 0.86) ops.push({ kind: "overlap", coll: genColl(prng, size, bigChance), round: genRound(prng, size, i, msgsMax) });
    else if (r < 0.9) ops.push({ kind: "nondet", salt: prng.next() });
    else if (r < 0.95) ops.push({ kind: "nondetRoute", tag: i * TAG_STRIDE });
    else ops.push({ kind: "checkpoint" });
  }
  return { seed: prng.seed, size, ops };
}

// ---- data -----------------------------------------------------------------------------------

/** Deterministic data of one kind, from a key (op, rank, message…). */
export function makeData(kind: DataKind, len: number, key: number): unknown {
  const p = new Prng(key);
  const int = (): number => p.rangeInclusive(-50, 50);
  switch (kind) {
    case "int":
      return p.rangeInclusive(0, 7);
    case "float":
      return Math.round(p.float() * 1000) / 100 + 0.5;
    case "string":
      return `s${key % 997}:${int()}`;
    case "object":
      return {
        k: key % 1000,
        arr: Array.from({ length: len }, int),
        m: new Map<string, unknown>([
          ["a", int()],
          ["b", [true, null, "x"]],
        ]),
        big: BigInt(int()) * 1_000_000_007n,
        nested: { f: new Float64Array(len).map(() => p.float()), s: new Set([1, 2]) },
      };
    case "f64":
      return new Float64Array(len).map(() => Math.round(p.float() * 100) / 8);
    case "i32":
      return new Int32Array(len).map(() => int());
    case "u8":
      return new Uint8Array(len).map(() => p.index(256));
    case "bigF64":
      return new Float64Array(BIG_COLL_F64).map((_, i) => (i % 17) + (key % 5));
  }
}

// ---- digests --------------------------------------------------------------------------------

function hashOf(values: readonly unknown[]): string {
  const h = createHash("sha256");
  for (const v of values) h.update(encodeValue(v === undefined ? "<undefined>" : v));
  return h.digest("hex").slice(0, 12);
}

/**
 * Folds messages received by wildcard receives: per source in the order received (fixed by
 * non-overtaking), sources in ascending order. Independent of how sources interleaved.
 */
function foldBySource(msgs: readonly Message[]): unknown[] {
  const by = new Map<number, unknown[]>();
  for (const m of msgs) {
    let l = by.get(m.source);
    if (l === undefined) by.set(m.source, (l = []));
    l.push([m.tag, m.data]);
  }
  return [...by.keys()].sort((a, b) => a - b).map((s) => [s, by.get(s)]);
}

// ---- interpreter ----------------------------------------------------------------------------

/** The interpreter's state: what `checkpoint()` saves and `restore()` gives back. */
export interface ProgramState {
  next: number;
  digests: string[];
  /** checkpoint() calls so far (with {@link ProgramSpec.globalElems}). */
  ckpts?: number;
}

/** The global a program with {@link ProgramSpec.globalElems} saves at its `ckpts`-th checkpoint. */
export function programGlobal(elems: number, ckpts: number): Float64Array {
  const g = new Float64Array(elems);
  for (let i = 0; i < elems; i++) g[i] = (ckpts * 7919 + i * 31) % 65_521;
  return g;
}

function payload(spec: ProgramSpec, opIndex: number, m: P2pMsg): unknown {
  const key = mix32(spec.seed, opIndex, m.id);
  if (spec.p2pBigChance !== undefined && (key % 1000) / 1000 < spec.p2pBigChance) {
    return { id: m.id, from: m.src, body: new Float64Array(BIG_F64).map((_, i) => ((i * 7 + key) % 65_521) / 3) };
  }
  return { id: m.id, from: m.src, body: makeData((["int", "string", "object", "f64", "u8"] as const)[key % 5]!, 1 + (key % 4), key) };
}

/** Receives by exact (source, tag) in a program-fixed order that keeps each (source, tag) in send order. */
function exactOrder(incoming: readonly P2pMsg[], orderSeed: number, rank: number): P2pMsg[] {
  const order = new Prng(mix32(orderSeed, rank)).shuffle([...incoming]);
  const groups = new Map<string, P2pMsg[]>();
  for (const m of incoming) {
    const k = `${m.src}/${m.tag}`;
    let g = groups.get(k);
    if (g === undefined) groups.set(k, (g = []));
    g.push(m);
  }
  const taken = new Map<string, number>();
  return order.map((m) => {
    const k = `${m.src}/${m.tag}`;
    const i = taken.get(k) ?? 0;
    taken.set(k, i + 1);
    return groups.get(k)![i]!;
  });
}

async function runRound(world: World, ctx: RankContext, spec: ProgramSpec, opIndex: number, round: P2pRound): Promise<unknown[]> {
  const me = world.rank;
  const outgoing = round.msgs.filter((m) => m.src === me);
  const incoming = round.msgs.filter((m) => m.dst === me);
  const style = round.recvStyle[me]!;
  const out: unknown[] = [style];

  // Sends: optionally reordered across destinations by an environment value (order within a
  // destination is kept, so receivers see the same per-channel order in every run).
  let sends = outgoing;
  if (round.shuffleSends && outgoing.length > 1) {
    const env = world.nondet(ctx.environment);
    const dsts = new Prng(env).shuffle([...new Set(outgoing.map((m) => m.dst))]);
    const perDst = new Map(dsts.map((d) => [d, outgoing.filter((m) => m.dst === d)] as const));
    sends = [];
    const cursors = new Map(dsts.map((d) => [d, 0]));
    const pick = new Prng(env ^ 0x55);
    while (sends.length < outgoing.length) {
      const open = dsts.filter((d) => cursors.get(d)! < perDst.get(d)!.length);
      const d = pick.pick(open);
      sends.push(perDst.get(d)![cursors.get(d)!]!);
      cursors.set(d, cursors.get(d)! + 1);
    }
  }
  const sendAll = async (): Promise<void> => {
    const reqs: Request<void>[] = [];
    for (const m of sends) {
      if (round.isend[me]) reqs.push(world.isend(payload(spec, opIndex, m), m.dst, m.tag));
      else await world.send(payload(spec, opIndex, m), m.dst, m.tag);
    }
    await world.waitAll(reqs);
  };

  const exact = exactOrder(incoming, round.orderSeed, me);
  const tags = [...new Set(incoming.map((m) => m.tag))].sort((a, b) => a - b);
  const countOfTag = (t: number): number => incoming.filter((m) => m.tag === t).length;
  switch (style) {
    case "specific": {
      await sendAll();
      for (const m of exact) out.push((await world.recv(m.src, m.tag)).data);
      break;
    }
    case "anyTagPerSource": {
      await sendAll();
      const sources = [...new Set(exact.map((m) => m.src))];
      for (const s of sources) {
        const n = incoming.filter((m) => m.src === s).length;
        const got: Message[] = [];
        for (let i = 0; i < n; i++) got.push(await world.recv(s, ANY_TAG));
        out.push(
          s,
          got.map((g) => [g.tag, g.data]),
        );
      }
      break;
    }
    case "anySource": {
      await sendAll();
      const got: Message[] = [];
      for (const t of tags) for (let i = 0; i < countOfTag(t); i++) got.push(await world.recv(ANY_SOURCE, t));
      out.push(foldBySource(got));
      break;
    }
    case "anyAny": {
      await sendAll();
      const got: Message[] = [];
      for (let i = 0; i < incoming.length; i++) got.push(await world.recv(ANY_SOURCE, ANY_TAG));
      out.push(foldBySource(got));
      break;
    }
    case "probe": {
      await sendAll();
      const got: Message[] = [];
      for (const t of tags) {
        for (let i = 0; i < countOfTag(t); i++) {
          const st = await world.probe(ANY_SOURCE, t);
          got.push(await world.recv(st.source, st.tag));
        }
      }
      out.push(foldBySource(got));
      break;
    }
    case "irecvAll": {
      const reqs = exact.map((m) => world.irecv(m.src, m.tag));
      await sendAll();
      out.push((await world.waitAll(reqs)).map((m) => m.data));
      break;
    }
    case "irecvAnySource": {
      const reqs: Request<Message>[] = [];
      for (const t of tags) for (let i = 0; i < countOfTag(t); i++) reqs.push(world.irecv(ANY_SOURCE, t));
      await sendAll();
      out.push(foldBySource(await world.waitAll(reqs)));
      break;
    }
    case "waitAny": {
      const reqs = exact.map((m) => world.irecv(m.src, m.tag));
      await sendAll();
      const done: unknown[] = new Array(reqs.length);
      let left = reqs.map((r, i) => ({ r, i }));
      while (left.length > 0) {
        const { index, value } = await world.waitAny(left.map((x) => x.r));
        done[left[index]!.i] = value.data;
        left = left.filter((_, j) => j !== index);
      }
      out.push(done);
      break;
    }
  }
  if (round.barrierAfter) await world.barrier();
  return out;
}

const concat = (a: string, b: string): string => a + b;

function runColl(world: World, spec: ProgramSpec, opIndex: number, c: CollSpec): Promise<unknown> {
  const me = world.rank;
  const mine = (extra = 0): unknown => makeData(c.data, c.len, mix32(spec.seed, opIndex, c.salt, me, extra));
  const op: ReduceOp = c.op === "concat" ? concat : (c.op as ReduceOp);
  switch (c.kind) {
    case "barrier":
      return world.barrier();
    case "bcast":
      return world.bcast(me === c.root ? mine() : null, c.root);
    case "reduce":
      return world.reduce(mine(), op, c.root);
    case "allreduce":
      return world.allreduce(mine(), op);
    case "gather":
      return world.gather(mine(), c.root);
    case "scatter":
      return world.scatter(me === c.root ? Array.from({ length: world.size }, (_, i) => mine(i + 1)) : undefined, c.root);
    case "allgather":
      return world.allgather(mine());
    case "alltoall":
      return world.alltoall(Array.from({ length: world.size }, (_, i) => mine(i + 1)));
  }
}

/** Runs one operation and returns what goes into its digest. */
export async function runOp(world: World, ctx: RankContext, spec: ProgramSpec, i: number, op: Op): Promise<unknown[]> {
  switch (op.kind) {
    case "p2p":
      return runRound(world, ctx, spec, i, op.round);
    case "coll":
      return [await runColl(world, spec, i, op.coll)];
    case "collPair": {
      const a = runColl(world, spec, i, op.a);
      const b = runColl(world, spec, i * 1000 + 1, op.b);
      return await Promise.all([a, b]);
    }
    case "overlap": {
      const c = runColl(world, spec, i, op.coll);
      // If the round fails (an abort), the collective fails too; it is awaited below only on success.
      c.catch(() => undefined);
      const r = await runRound(world, ctx, spec, i, op.round);
      return [await c, r];
    }
    case "nondet":
      return [world.nondet(() => mix32(spec.seed, world.rank, op.salt))];
    case "nondetRoute": {
      const dest = world.nondet(ctx.environment) % world.size;
      const plan = await world.alltoall(Array.from<unknown, number>({ length: world.size }, (_, d) => (d === dest ? 1 : 0)));
      const expected = plan.reduce((a, b) => a + b, 0);
      await world.send({ token: world.rank }, dest, op.tag);
      let got = 0;
      for (let k = 0; k < expected; k++) {
        const m = await world.recv<{ token: number }>(ANY_SOURCE, op.tag);
        if (plan[m.source] === 1 && m.data.token === m.source) got++;
      }
      return [await world.allreduce(got, "sum")];
    }
    case "checkpoint":
      return ["checkpoint"];
  }
}

/** The program a rank runs for `spec`: its result is `{ ops: digest per operation }`. */
export function programOf(spec: ProgramSpec): SimProgram {
  return async (world, ctx) => {
    const elems = spec.globalElems;
    const saved = await world.restore<ProgramState, Float64Array>();
    const st: ProgramState = saved?.state ?? { next: 0, digests: [], ...(elems === undefined ? {} : { ckpts: 0 }) };
    if (elems !== undefined && saved !== undefined) {
      const want = programGlobal(elems, st.ckpts ?? -1);
      const got = saved.global;
      if (!(got instanceof Float64Array) || got.length !== elems || got.some((x, i) => x !== want[i])) {
        throw new Error(`rank ${world.rank} restored checkpoint ${st.ckpts ?? "?"} with a global that is not the one it saved there`);
      }
    }
    for (let i = st.next; i < spec.ops.length; i++) {
      const op = spec.ops[i]!;
      const parts = await runOp(world, ctx, spec, i, op);
      st.digests.push(`${op.kind}:${hashOf(parts)}`);
      st.next = i + 1;
      if (op.kind === "checkpoint" && (op.mask === undefined || ((op.mask >> world.rank) & 1) === 1)) {
        if (elems === undefined) await world.checkpoint({ next: st.next, digests: [...st.digests] });
        else {
          st.ckpts = st.ckpts! + 1;
          await world.checkpoint({ next: st.next, digests: [...st.digests], ckpts: st.ckpts }, programGlobal(elems, st.ckpts));
        }
      }
    }
    return { ops: st.digests };
  };
}

/** A one-line description of a program, for failure messages. */
export function describeProgram(spec: ProgramSpec): string {
  return spec.ops
    .map((op, i) => {
      switch (op.kind) {
        case "p2p":
          return `${i}:p2p(${op.round.msgs.length} msgs; ${op.round.recvStyle.join("/")})`;
        case "coll":
          return `${i}:${op.coll.kind}(root ${op.coll.root}, ${op.coll.op}, ${op.coll.data})`;
        case "collPair":
          return `${i}:pair(${op.a.kind}, ${op.b.kind})`;
        case "overlap":
          return `${i}:overlap(${op.coll.kind} + ${op.round.msgs.length} msgs)`;
        case "nondet":
          return `${i}:nondet`;
        case "nondetRoute":
          return `${i}:nondetRoute`;
        case "checkpoint":
          return op.mask === undefined ? `${i}:checkpoint` : `${i}:checkpoint(ranks ${op.mask.toString(2)})`;
      }
    })
    .join(" ");
}

// ---- mismatch injection -----------------------------------------------------------------------

export type MismatchKind = "kind" | "root" | "op" | "length" | "skip" | "extra";

export interface MismatchPlan {
  /** The program each rank runs (all equal but one). */
  readonly specs: readonly ProgramSpec[];
  readonly rank: number;
  readonly opIndex: number;
  readonly mismatch: MismatchKind;
}

/**
 * Makes one rank call a different collective at one collective operation: another kind,
 * root, op or data length, or no collective at all (`skip`), or one more (`extra`).
 * Returns undefined when `spec` has no collective operation.
 */
export function injectMismatch(spec: ProgramSpec, prng: Prng, kinds: readonly MismatchKind[]): MismatchPlan | undefined {
  const candidates = spec.ops.flatMap((op, i) => (op.kind === "coll" && spec.size > 1 ? [i] : []));
  if (candidates.length === 0) return undefined;
  const opIndex = prng.pick(candidates);
  const rank = prng.index(spec.size);
  const mismatch = prng.pick(kinds);
  const c = (spec.ops[opIndex] as Extract<Op, { kind: "coll" }>).coll;
  let changed: CollSpec;
  switch (mismatch) {
    case "root":
      changed = {
        ...c,
        kind: c.kind === "bcast" || c.kind === "gather" || c.kind === "scatter" || c.kind === "reduce" ? c.kind : "bcast",
        root: (c.root + 1) % spec.size,
      };
      break;
    case "op":
      changed =
        c.kind === "reduce" || c.kind === "allreduce"
          ? { ...c, data: "f64", op: c.op === "max" ? "min" : "max" }
          : { ...c, kind: "allreduce", data: "f64", op: "max" };
      break;
    case "length":
      changed = { ...c, kind: c.kind === "reduce" ? "reduce" : "allreduce", data: "f64", op: "sum", len: c.len + 1 };
      break;
    default: {
      const kinds2: CollKind[] = ["barrier", "bcast", "reduce", "allreduce", "gather", "scatter", "allgather", "alltoall"];
      changed = { ...c, kind: prng.pick(kinds2.filter((k) => k !== c.kind)), data: "f64", op: "sum" };
    }
  }
  const ops = [...spec.ops];
  const other: Op[] =
    mismatch === "skip" ? [] : mismatch === "extra" ? [ops[opIndex]!, { kind: "coll", coll: { ...c, kind: "barrier" } }] : [{ kind: "coll", coll: changed }];
  // The other ranks must also see the changed data shape where the shape is what differs.
  const base: Op =
    mismatch === "op" || mismatch === "length"
      ? {
          kind: "coll",
          coll: {
            ...changed,
            op: mismatch === "op" ? (changed.op === "max" ? "min" : "max") : "sum",
            len: mismatch === "length" ? c.len : changed.len,
            kind: changed.kind,
          },
        }
      : ops[opIndex]!;
  const baseOps = [...ops];
  baseOps[opIndex] = base;
  const oddOps = [...ops];
  oddOps.splice(opIndex, 1, ...other);
  const specs = Array.from({ length: spec.size }, (_, r) => ({ ...spec, ops: r === rank ? oddOps : baseOps }));
  return { specs, rank, opIndex, mismatch };
}

/** A program in which rank r runs `specs[r]`. */
export function programOfEach(specs: readonly ProgramSpec[]): SimProgram {
  const programs = specs.map(programOf);
  return (world, ctx) => programs[world.rank]!(world, ctx);
}
