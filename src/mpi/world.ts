/**
 * The communicator: MPI-style point-to-point and collectives over a {@link Host}'s transport
 * (ZeroMQ in production, a simulated network in tests), with the hooks the recovery protocols
 * attach to.
 *
 * Message path (send): validate → encode body (typed arrays as raw frames) → stamp a 40-byte
 * header (kind, source, tag, channel sequence number, epoch, collective sequence/signature)
 * → transport. (Receive): one reader loop → validate header (garbage from stray processes is
 * dropped with a warning) → app messages decoded and matched (posted receives first, else the
 * unexpected queue), collective messages filed by (sequence, source, step).
 *
 * @example
 * const world = await init();
 * if (world.rank === 0) await world.send(new Float64Array([1, 2]), 1, 7);
 * else console.log((await world.recv(0, 7)).data);
 */
import { LifelineError } from "../errors.ts";
import { type ActiveCollective, CollectiveRegistry } from "./coll-registry.ts";
import * as coll from "./collectives.ts";
import { byteLengthOf, type EncodedBody, decodeBody, decodeValue, encodeBody, encodedValueHead, encodeValue, isTypedArray } from "./codec.ts";
import type { CoordinatorToRank } from "./control.ts";
import type { Mode, RankPlace } from "./env.ts";
import { FaultPlan, parseFaults } from "./faults.ts";
import { Matcher, type Waiter } from "./matching.ts";
import { checkOp, isBuiltinOp } from "./reduce-ops.ts";
import { asImpl, RequestImpl, waitAll, waitAny } from "./request.ts";
import {
  ANY_SOURCE, ANY_TAG, type CollectiveOptions, type Message, type ReduceOp, type Request, type Restored, type Status,
  TAG_MAX, type WorldApi,
} from "./types.ts";
import { decodeHeader, Encoding, encodeHeader, encodeHeaderInto, Flag, frameId, type Header, HEADER_BYTES, Kind } from "./wire.ts";
import { type CprHook, type CprHookFactory, type CprWorldAccess, type LibState, type NondetEntry, PROTO_CPR_BASE, type RawFrame } from "./cpr-hook.ts";
import { type ControlChannel, type Host, type Timer, type Transport, zmqHost } from "./host.ts";
import { BouncePool } from "./bounce-pool.ts";
import { PROTO_RETRY_BASE, type RetryCollIdentity, type RetryDecision, type RetryOneHook, type RetryOneHookFactory, type RetryWorldAccess } from "./retry-hook.ts";

/** An application message after decoding, as the matcher holds it. */
interface AppEnvelope {
  readonly source: number;
  readonly tag: number;
  readonly data: unknown;
  /** The frame as it arrived (kept for checkpoints of the unexpected queue). */
  readonly raw?: RawFrame;
}

/** Options of {@link World.join} beyond the rank's place. */
export interface JoinOptions {
  /** The recovery protocol's hook (mode cpr); see cpr-hook.ts. */
  readonly cpr?: CprHookFactory;
  /** The retry-one driver (mode retry-one); see retry-hook.ts. */
  readonly retryOne?: RetryOneHookFactory;
}

/** The internal signal that ends a collective the retry-one protocol abandoned (never user-visible). */
class Abandoned extends Error {}

/** A collective call as retry-one checks it on replay: op, root, type, length (see retry-hook.ts). */
function identOf(op: string, root: number, data: unknown): RetryCollIdentity {
  if (isTypedArray(data)) return { op, root, type: (data as object).constructor.name, length: (data as ArrayLike<unknown>).length };
  if (Array.isArray(data)) return { op, root, type: "msgpack", length: data.length };
  return { op, root, type: data === undefined ? "none" : "msgpack", length: 0 };
}

/** Collective kinds, carried in the top byte of a collective frame's tag for error messages. */
const COLL_KINDS = ["barrier", "bcast", "reduce", "allreduce", "gather", "scatter", "allgather", "alltoall"] as const;
type CollKind = (typeof COLL_KINDS)[number];

/** Steps fit in the low 24 bits of the tag; the kind index sits above them. */
const STEP_BITS = 24;
/** retry-one: steps of a second algorithm run in the same collective (reduce, then bcast). */
const RETRY_STEP_SHIFT = 1 << 20;

/** Protocol-frame tags of the layer's own collective-signature query. */
const PROTO_COLL_QUERY = 0x100;
const PROTO_COLL_ANSWER = 0x101;
/** Protocol-frame tag of a receipt for a message sent without copying (see sendApp). */
const PROTO_RECEIPT = 0x102;
/**
 * Application payloads with at least this many bytes of typed arrays are copied into pooled
 * bounce buffers (see bounce-pool.ts) that come back when the receiver sends a receipt.
 */
const BOUNCE_BYTES_MIN = 64 * 1024;
/** Idle bounce-buffer memory kept for reuse. */
const BOUNCE_POOL_BYTES_MAX = 256 * 1024 * 1024;
/**
 * retry-one: results of at least this size are copied for the result buffer into pooled
 * memory, reused once the protocol drops them at the next checkpoint (fresh memory faults in
 * every page: several times the copy itself).
 */
const RESULT_POOL_BYTES_MIN = 64 * 1024;
/** retry-one: idle memory of results and checkpoint copies kept for reuse. */
const RESULT_POOL_BYTES_MAX = 512 * 1024 * 1024;
/** Bodies up to this size travel in the header's frame: one ZeroMQ frame instead of two. */
const INLINE_BODY_BYTES_MAX = 4096;
/** How often blocked collectives are looked at (see coll-registry.ts). */
const QUERY_TICK_MS = 250;

/** Time allowed for rendezvous (every rank says hello, the table arrives). */
const RENDEZVOUS_TIMEOUT_MS = 120_000;
/** How long a released rank waits for its cpr driver's background writes before it leaves. */
const CPR_CLOSE_WAIT_MS = 5_000;
/** At most one progress report per this interval. */
const STEP_REPORT_MS = 200;
/** Warnings about garbage frames are rate-limited to this many per process. */
const GARBAGE_WARNINGS_MAX = 10;

function fnv1a(parts: readonly (string | number)[]): number {
  let h = 0x811c9dc5;
  const s = parts.join("\u0001");
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

/** Shape of data for collective signatures: type and length must agree across ranks. */
function shapeOf(data: unknown): string {
  if (isTypedArray(data)) return `${(data as object).constructor.name}[${(data as ArrayLike<unknown>).length}]`;
  if (Array.isArray(data)) return `array[${data.length}]`;
  return data === null ? "null" : typeof data;
}

function callSite(): string {
  // Frames: callSite ← collective method ← user code. The user's frame identifies the call.
  const lines = (new Error().stack ?? "").split("\n").slice(1).map((l) => l.trim());
  const user = lines.find((l) => !l.includes("/src/mpi/") && !l.includes("/dist/mpi/") && !l.includes("node:internal"));
  return user ?? lines.join("|");
}

export class World implements WorldApi {
  readonly rank: number;
  readonly size: number;
  readonly mode: Mode;
  readonly attempt: number;

  private jobKey = 0;
  private readonly matcher: Matcher<AppEnvelope>;
  private readonly channelSeqOut: Uint32Array;
  /** Application frames sent so far on each channel (their identity, see frameId). */
  private readonly appSeqOut: Uint32Array;
  private readonly colls: CollectiveRegistry;
  private collTimer: Timer | undefined;
  private finalized = false;
  private failure: LifelineError | undefined;
  private readonly faults: FaultPlan;
  private steps = 0;
  private lastStepReport = 0;
  private versions = 0;
  private collSinceCheckpoint = 0;
  private restoreCalled = false;
  private readonly bootstrapKeys = new Set<string>();
  private outstandingRecvs = 0;
  private garbageWarnings = 0;
  private released: { resolve: () => void; reject: (e: unknown) => void } | undefined;
  private host!: Host;
  private cpr: CprHook | undefined;
  private retry: RetryOneHook | undefined;
  /** retry-one: the epoch field of collective frames (the protocol's view id); 0 otherwise. */
  private collEpoch = 0;
  /** retry-one: the collective running on the wire, and whether the protocol abandoned it. */
  private retryRun: { seq: number; abandoned: boolean; abandon: () => void } | undefined;
  private readonly bootstrapResults = new Map<string, Buffer>();
  /** Sends to self waiting for their (deferred) delivery, FIFO. */
  private readonly selfQueue: { header: Header; raw: RawFrame }[] = [];
  private transport!: Transport;
  private control!: ControlChannel;

  private constructor(private readonly place: RankPlace) {
    this.rank = place.rank;
    this.size = place.size;
    this.mode = place.mode;
    this.attempt = place.attempt;
    this.matcher = new Matcher(place.size);
    this.colls = new CollectiveRegistry(place.rank);
    this.channelSeqOut = new Uint32Array(place.size);
    this.appSeqOut = new Uint32Array(place.size);
    this.faults = new FaultPlan(parseFaults(place.faults), place.attempt);
  }

  /**
   * Joins the job: binds the data socket, says hello to the coordinator, waits for the table of
   * endpoints and connects to every peer. Rejects with `MPI_INIT` if that cannot happen.
   */
  static async join(place: RankPlace, opts: JoinOptions = {}): Promise<World> {
    const world = new World(place);
    await world.connect(await zmqHost(place, (msg) => world.onControl(msg)), opts);
    return world;
  }

  /**
   * Joins with a given host (the simulator's). `makeHost` receives the control-message handler
   * the host must call for every message from the coordinator.
   */
  static async joinWith(place: RankPlace, makeHost: (onControl: (msg: CoordinatorToRank) => void) => Host | Promise<Host>, opts: JoinOptions = {}): Promise<World> {
    const world = new World(place);
    await world.connect(await makeHost((msg) => world.onControl(msg)), opts);
    return world;
  }

  private gotTable: (t: Extract<CoordinatorToRank, { t: "table" }>) => void = () => undefined;
  private failJoin: (e: unknown) => void = () => undefined;

  /** A message from the coordinator. */
  private onControl(msg: CoordinatorToRank): void {
    switch (msg.t) {
      case "table": this.gotTable(msg); break;
      case "peer":
        if (msg.rank !== this.rank) this.transport.connect(msg.rank, msg.endpoint);
        this.retry?.onControl(msg);
        break;
      case "peer-down":
        this.retry?.onControl(msg);
        break;
      case "release": this.released?.resolve(); break;
      case "abort": {
        const err = new LifelineError("MPI_ABORTED", `the job was aborted: ${msg.message}`);
        this.failJoin(err);
        this.abortLocal(err);
        break;
      }
      case "cpr-checkpoint":
      case "cpr-stop":
      case "cpr-committed":
      case "cpr-aborted":
      case "cpr-inventory": // these two come before the table
      case "cpr-fetch":
        this.cpr?.onControl(msg);
        break;
    }
  }

  private async connect(host: Host, opts: JoinOptions): Promise<void> {
    const { rank, attempt } = this;
    this.host = host;
    this.transport = host.transport;
    this.control = host.control;
    if (this.mode === "cpr" && opts.cpr !== undefined) this.cpr = opts.cpr(this.cprAccess(), host);
    if (this.mode === "retry-one" && opts.retryOne !== undefined) {
      this.retry = opts.retryOne(this.retryAccess(), host);
      this.colls.supersede = true;
    }
    const table = new Promise<Extract<CoordinatorToRank, { t: "table" }>>((resolve, reject) => {
      this.gotTable = resolve;
      this.failJoin = reject;
    });
    const timer = host.after(RENDEZVOUS_TIMEOUT_MS, () =>
      this.failJoin(new LifelineError("MPI_INIT", `no endpoint table from the coordinator at ${this.place.coordinator} within ${RENDEZVOUS_TIMEOUT_MS / 1000} s`)));
    let t: Extract<CoordinatorToRank, { t: "table" }>;
    try {
      await this.control.send({ t: "hello", rank, attempt, pid: host.pid, endpoint: this.transport.endpoint, size: this.size });
      t = await table;
    } catch (err) {
      await this.closeSockets();
      throw err;
    } finally {
      timer.stop();
    }
    if (t.endpoints.length !== this.size) {
      await this.closeSockets();
      throw new LifelineError("MPI_INIT", `the coordinator's table has ${t.endpoints.length} ranks, but this rank was started for ${this.size}`);
    }
    if (t.mode !== undefined && t.mode !== this.mode) {
      await this.closeSockets();
      throw new LifelineError("MPI_INIT", `the coordinator runs the job in mode ${t.mode}, but this rank was started for mode ${this.mode}: set LIFELINE_MODE=${t.mode}`);
    }
    this.jobKey = t.jobKey;
    // retry-one: a rank that is down has no endpoint yet; a `peer` message brings it.
    t.endpoints.forEach((ep, r) => { if (r !== rank && ep !== "") this.transport.connect(r, ep); });
    this.retry?.beforeStart(t);
    if (this.cpr !== undefined) {
      try {
        // Restore the library state and re-inject logged messages before anything new can
        // arrive: this keeps every channel's order.
        await this.cpr.beforeStart(t);
      } catch (err) {
        await this.closeSockets();
        throw err;
      }
    }
    this.transport.start((frames) => this.onFrames(frames), (err) => this.abortLocal(new LifelineError("MPI_ABORTED", `receive loop failed: ${(err as Error).message}`, { cause: err })));
    this.collTimer = host.every(QUERY_TICK_MS, () => this.queryOverdueCollectives());
    if (this.cpr !== undefined) {
      try {
        await this.cpr.afterStart();
      } catch (err) {
        this.failPending(err as LifelineError);
        await this.closeSockets();
        throw err;
      }
    }
  }

  /** What the recovery protocol's driver may do with this communicator. */
  private cprAccess(): CprWorldAccess {
    return {
      rank: this.rank,
      size: this.size,
      attempt: this.attempt,
      captureLibState: () => this.captureLibState(),
      restoreLibState: (lib) => this.restoreLibState(lib),
      inject: (frame) => this.injectFrame(frame, true),
      sendProtocol: (dest, tag, body) => this.sendProtocol(dest, tag, body),
      sendControl: (msg) => void this.control.send(msg).catch(() => undefined),
      fatal: (code, message) => this.fatal(new LifelineError(code, message)),
    };
  }

  /** What the retry-one driver may do with this communicator. */
  private retryAccess(): RetryWorldAccess {
    return {
      rank: this.rank,
      size: this.size,
      attempt: this.attempt,
      sendProtocol: (dest, tag, body) => this.sendProtocol(dest, tag, body),
      caughtUp: (info) => void this.control.send({ t: "retry-caught-up", rank: this.rank, attempt: this.attempt, ...info }).catch(() => undefined),
      recycle: (buf) => {
        if (!this.pooledResults.delete(buf)) return; // not ours (e.g. a transfer's), or given back twice
        this.resultPool.release(buf);
      },
      abandonCollective: (seq) => {
        if (this.retryRun !== undefined && this.retryRun.seq === seq) {
          this.retryRun.abandoned = true;
          this.retryRun.abandon();
        }
        this.colls.abandon(seq, new Abandoned(`collective #${seq} abandoned`));
      },
      inject: (frame) => this.injectFrame(frame),
      fatal: (code, message) => {
        const err = new LifelineError(code, message);
        this.fatal(err);
        this.failPending(err);
      },
    };
  }

  private captureLibState(): LibState {
    const raw = (f: RawFrame): RawFrame => ({ header: Buffer.from(f.header), body: f.body.map((b) => Buffer.from(b)) });
    return {
      channelSeqOut: [...this.channelSeqOut],
      appSeqOut: [...this.appSeqOut],
      collNextSeq: this.colls.started,
      collInbox: this.colls.inboxInOrder().map((a) => raw({ header: encodeHeader(a.header), body: a.frames })),
      unexpected: this.matcher.queuedInOrder().map((env) => {
        if (env.raw === undefined) throw new LifelineError("CPR_CHECKPOINT", "an unexpected message without its frame (internal error)");
        return raw(env.raw);
      }),
      bootstrap: [...this.bootstrapResults],
      versions: this.versions,
    };
  }

  private restoreLibState(lib: LibState): void {
    lib.channelSeqOut.forEach((n, d) => { this.channelSeqOut[d] = n; });
    lib.appSeqOut?.forEach((n, d) => { this.appSeqOut[d] = n; });
    this.colls.restoreNextSeq(lib.collNextSeq);
    for (const [k, v] of lib.bootstrap) this.bootstrapResults.set(k, v);
    for (const f of lib.collInbox) this.injectFrame(f, true);
    for (const f of lib.unexpected) this.injectFrame(f, true);
  }

  /**
   * Delivers a frame held or logged elsewhere as if it arrived now (not classified again).
   * `stored`: it comes from this rank's recovery line, which a run with another job key may
   * have written (a resumed job).
   */
  private injectFrame(frame: RawFrame, stored = false): void {
    const h = decodeHeader(frame.header, { jobKey: stored ? "stored" : this.jobKey, size: this.size });
    this.arrive(h, frame.body, frame.header, false);
  }

  /** One protocol frame (kind protocol, not counted on any channel); a failed send is dropped. */
  private sendProtocol(dest: number, tag: number, body: unknown): void {
    const enc = encodeBody(body, { copy: false });
    void this.transmit(dest, this.header(Kind.protocol, dest, tag, enc), enc).catch(() => undefined);
  }

  // ---- receive path ------------------------------------------------------------------------

  private onFrames(frames: Buffer[]): void {
    let header: Header;
    let rawHeader = frames[0];
    let body: Buffer[];
    if (frames.length === 1 && rawHeader !== undefined && rawHeader.length > HEADER_BYTES) {
      // A small body sent inline after the header (see transmit). 40 is a multiple of 8, so a
      // typed array in it stays aligned.
      body = [rawHeader.subarray(HEADER_BYTES)];
      rawHeader = rawHeader.subarray(0, HEADER_BYTES);
    } else {
      body = frames.slice(1);
    }
    try {
      header = decodeHeader(rawHeader, { jobKey: this.jobKey, size: this.size });
    } catch (err) {
      this.warnGarbage(err);
      return;
    }
    if ((header.flags & Flag.receipt) !== 0 && header.kind === Kind.app) {
      // The sender waits for this before it reuses its buffer; the bytes are all here now.
      this.sendProtocol(header.source, PROTO_RECEIPT, { seq: header.channelSeq });
    }
    this.arrive(header, body, rawHeader!, true);
  }

  private warnGarbage(err: unknown): void {
    if (this.garbageWarnings++ < GARBAGE_WARNINGS_MAX) {
      this.host.warn(`lifeline: rank ${this.rank}: dropping a malformed frame: ${(err as Error).message}${this.garbageWarnings === GARBAGE_WARNINGS_MAX ? " (further warnings suppressed)" : ""}`);
    }
  }

  /**
   * A validated frame (from the network, a send to self, or re-injected on recovery).
   * `classify`: show it to the recovery protocol first (frames from peers, first arrival).
   */
  private arrive(header: Header, body: Buffer[], rawHeader: Buffer, classify: boolean): void {
    if (classify && this.cpr !== undefined && header.kind !== Kind.protocol && header.source !== this.rank) {
      this.cpr.arrive(header, { header: rawHeader, body });
    }
    if (classify && this.retry !== undefined && header.kind === Kind.collective && header.source !== this.rank && !this.retry.arrive(header, { header: rawHeader, body })) return;
    if (classify && header.kind !== Kind.protocol && header.source !== this.rank) this.host.accepted?.(header);
    switch (header.kind) {
      case Kind.app: {
        let data: unknown;
        try {
          data = decodeBody(header.encoding, header.arrayType, body);
        } catch (err) {
          this.warnGarbage(err);
          return;
        }
        this.matcher.arrive({ source: header.source, tag: header.tag, data, raw: this.cpr === undefined ? undefined : { header: rawHeader, body } });
        return;
      }
      case Kind.collective: {
        const stray = this.colls.arrive({ header, frames: body }, header.tag & ((1 << STEP_BITS) - 1));
        if (stray !== undefined) this.fatal(stray);
        return;
      }
      case Kind.protocol:
        this.onProtocol(header, body);
        return;
    }
  }

  // ---- checks ------------------------------------------------------------------------------

  private live(what: string): void {
    if (this.failure !== undefined) throw this.failure;
    if (this.finalized) throw new LifelineError("MPI_FINALIZED", `${what}() called after finalize()`);
  }

  private checkRank(r: unknown, what: string, allowAny: boolean): number {
    if (allowAny && r === ANY_SOURCE) return ANY_SOURCE;
    if (typeof r !== "number" || !Number.isInteger(r) || r < 0 || r >= this.size) {
      throw new LifelineError("MPI_RANK", `${what}: rank ${String(r)} is outside 0..${this.size - 1}${allowAny ? " (or ANY_SOURCE)" : ""}`);
    }
    return r;
  }

  private checkTag(t: unknown, what: string, allowAny: boolean): number {
    if (allowAny && t === ANY_TAG) return ANY_TAG;
    if (typeof t !== "number" || !Number.isInteger(t) || t < 0 || t > TAG_MAX) {
      throw new LifelineError("MPI_TAG", `${what}: tag ${String(t)} must be an integer in 0..${TAG_MAX}${allowAny ? " (or ANY_TAG)" : ""}`);
    }
    return t;
  }

  // ---- point to point ----------------------------------------------------------------------

  /** retry-one replays collectives only: point-to-point calls are rejected there (README, docs/api.md). */
  private pointToPoint(what: string): void {
    if (this.mode !== "retry-one") return;
    throw new LifelineError(
      "MPI_MODE",
      `${what}(): point-to-point messages are not recoverable in --mode retry-one (only collectives are replayed from peers); use --mode cpr`,
    );
  }

  /** The header of the next frame to `dest` (its channel and app counters move on); `transmit` encodes it. */
  private header(kind: Header["kind"], dest: number, tag: number, body: EncodedBody, collSeq = 0, signature = 0): Header {
    // Protocol frames are the layer's own talk: not part of any channel's message sequence,
    // not stamped with an epoch.
    const stamp = kind === Kind.protocol || this.cpr === undefined ? { epoch: kind === Kind.collective ? this.collEpoch : 0, flags: 0 } : this.cpr.stamp(dest);
    return {
      kind, flags: stamp.flags, encoding: body.encoding, jobKey: this.jobKey, source: this.rank, tag,
      channelSeq: kind === Kind.protocol ? 0 : this.channelSeqOut[dest]!++, epoch: stamp.epoch,
      collSeq: kind === Kind.app ? this.appSeqOut[dest]!++ : collSeq, signature, arrayType: body.arrayType, attempt: this.attempt,
    };
  }

  /** Encodes `h` once and sends it with `body` (to self: queued without a socket). */
  private transmit(dest: number, h: Header, body: EncodedBody, onSuppressed?: () => void): Promise<void> {
    if (this.cpr !== undefined && h.kind !== Kind.protocol && this.cpr.suppress(dest, frameId(h))) {
      // An early message the receiver already holds (it told us on recovery): not re-sent.
      onSuppressed?.();
      return Promise.resolve();
    }
    if (dest === this.rank) {
      // Send to self: same path as the network, minus the socket. Deliver on a later tick,
      // as a socket would, so a send never completes a receive synchronously. A FIFO, so a
      // checkpoint can deliver what is pending at once (nothing to self is ever in flight
      // across a checkpoint).
      const frames = body.frames.map((f) => Buffer.from(f.buffer, f.byteOffset, f.byteLength));
      this.selfQueue.push({ header: h, raw: { header: encodeHeader(h), body: frames } });
      this.host.defer(() => this.deliverSelf(1));
      return Promise.resolve();
    }
    const [only] = body.frames;
    if (body.frames.length === 1 && only!.byteLength <= INLINE_BODY_BYTES_MAX) {
      const frame = encodeHeaderInto(h, Buffer.allocUnsafe(HEADER_BYTES + only!.byteLength));
      frame.set(only!, HEADER_BYTES);
      return this.transport.send(dest, [frame]);
    }
    return this.transport.send(dest, [encodeHeader(h), ...body.frames]);
  }

  /** Delivers up to `n` pending sends to self, in order. */
  private deliverSelf(n: number): void {
    for (let i = 0; i < n && this.selfQueue.length > 0; i++) {
      const m = this.selfQueue.shift()!;
      this.arrive(m.header, m.raw.body, m.raw.header, false);
    }
  }

  async send(data: unknown, dest: number, tag = 0): Promise<void> {
    this.live("send");
    this.pointToPoint("send");
    this.checkRank(dest, "send", false);
    this.checkTag(tag, "send", false);
    await this.sendApp(data, dest, tag);
  }

  isend(data: unknown, dest: number, tag = 0): Request<void> {
    const req = new RequestImpl<void>(this.cpr === undefined ? undefined : (r) => this.pollSend(r));
    // Validation errors throw synchronously, like send's would reject: the call is wrong.
    this.live("isend");
    this.pointToPoint("isend");
    this.checkRank(dest, "isend", false);
    this.checkTag(tag, "isend", false);
    this.sendApp(data, dest, tag).then(() => req.complete(), (e) => req.fail(e));
    return req;
  }

  /** Bounce buffers lent to in-flight messages, by `${dest}:${channelSeq}`, until the receipt. */
  private readonly lent = new Map<string, Buffer[]>();
  private readonly bounce = new BouncePool(BOUNCE_POOL_BYTES_MAX);
  /** retry-one: memory of kept collective results, and the buffers it lent out (see recycle). */
  private readonly resultPool = new BouncePool(RESULT_POOL_BYTES_MAX, 8);
  private readonly pooledResults = new WeakSet<Buffer>();

  /**
   * Encodes and sends one application message; the program may reuse its buffers once this
   * resolves (a buffered send, as in MPI). Arrays are copied — small ones into fresh memory,
   * large ones into warm pooled buffers, which the receiver's reader loop releases with a
   * receipt on arrival (not on a matching receive, so it cannot deadlock).
   */
  private async sendApp(data: unknown, dest: number, tag: number): Promise<void> {
    const body = encodeBody(data, { copy: false });
    // Frames that view the program's arrays; msgpack's own output buffer is ours already.
    const first = body.encoding === Encoding.typedArray ? 0 : 1;
    let userBytes = 0;
    for (let i = first; i < body.frames.length; i++) userBytes += body.frames[i]!.byteLength;
    const bounced = userBytes >= BOUNCE_BYTES_MIN && dest !== this.rank;
    const lent: Buffer[] = [];
    for (let i = first; i < body.frames.length; i++) {
      const f = body.frames[i]!;
      if (bounced) {
        const b = this.bounce.acquire(f.byteLength);
        b.set(f);
        lent.push(b);
        body.frames[i] = b;
      } else {
        body.frames[i] = Buffer.from(f);
      }
    }
    this.faults.onSend();
    const header = this.header(Kind.app, dest, tag, body);
    if (!bounced) {
      await this.transmit(dest, header, body);
      return;
    }
    header.flags |= Flag.receipt;
    const key = `${dest}:${header.channelSeq}`;
    this.lent.set(key, lent);
    await this.transmit(dest, header, body, () => {
      // Not sent after all (a suppressed re-send): no receipt will come.
      this.lent.delete(key);
      for (const b of lent) this.bounce.release(b);
    });
  }

  irecv<T = unknown>(source: number = ANY_SOURCE, tag: number = ANY_TAG): Request<Message<T>> {
    this.live("irecv");
    this.pointToPoint("irecv");
    let src = this.checkRank(source, "irecv", true);
    let tg = this.checkTag(tag, "irecv", true);
    // A wildcard receive's match depends on timing: log it while recording, replay it after
    // a restore by receiving exactly the logged (source, tag).
    const ticket = src === ANY_SOURCE ? this.ticket("match") : undefined;
    if (ticket?.replay?.k === "match") {
      src = ticket.replay.source;
      tg = ticket.replay.tag;
    }
    const logMatch = (env: AppEnvelope): void => {
      if (ticket !== undefined && ticket.replay === undefined) this.cpr!.logNondet(ticket.ordinal, { k: "match", source: env.source, tag: env.tag });
    };
    // Mode cpr: the frame of the matched message, for a poll that logs it (see pollRecv).
    let matched: RawFrame | undefined;
    const recv: PolledRecv = { waiter: undefined, raw: () => matched };
    const req = new RequestImpl<Message<T>>(this.cpr === undefined ? undefined : (r) => this.pollRecv(r, recv));
    const now = this.matcher.take(src, tg);
    if (now !== undefined) {
      logMatch(now);
      matched = now.raw;
      req.complete(publicMessage(now) as Message<T>);
      return req;
    }
    this.outstandingRecvs++;
    const waiter: Waiter<AppEnvelope> = {
      source: src, tag: tg, consume: true,
      onMatch: (env) => {
        this.pending.delete(req as RequestImpl<unknown>);
        if (req.settled) {
          // A ghost: a replayed poll already completed this receive from the log; this is
          // the re-sent copy of that message, swallowed.
          this.ghosts--;
          return;
        }
        this.outstandingRecvs--;
        logMatch(env);
        matched = env.raw;
        req.complete(publicMessage(env) as Message<T>);
      },
    };
    recv.waiter = waiter;
    this.matcher.post(waiter);
    this.pending.add(req as RequestImpl<unknown>);
    return req;
  }

  /**
   * Receives completed from the log by a replayed poll whose re-sent copy has not arrived yet
   * (their posted receives stay in place and swallow it). A checkpoint waits for them.
   */
  private ghosts = 0;

  /**
   * A poll (`test()`/`done`) of an irecv in mode cpr: its outcome depends on timing, so it is
   * logged while recording — for a receive seen done, with the message's frame — and replayed
   * on recovery. A replayed "done" whose message has not arrived again yet completes the
   * request from the log and leaves its posted receive as a ghost, narrowed to the logged
   * (source, tag) in its place in posting order, to swallow the copy the sender re-sends.
   */
  private pollRecv<T>(req: RequestImpl<Message<T>>, recv: PolledRecv): { done: boolean; value: Message<T> | undefined } | undefined {
    const cpr = this.cpr!;
    const ticket = cpr.nondet("test");
    const r = ticket.replay;
    if (r?.k === "test") {
      if (!r.done) return { done: false, value: undefined };
      if (req.settled) return { done: true, value: req.peek() };
      if (r.msg === undefined) {
        this.fatal(new LifelineError("CPR_REPLAY", `rank ${this.rank}: replay: a receive's poll #${ticket.ordinal} was logged done without its message`));
        return undefined;
      }
      const h = decodeHeader(r.msg.header, { jobKey: "stored", size: this.size });
      const env: AppEnvelope = { source: h.source, tag: h.tag, data: decodeBody(h.encoding, h.arrayType, r.msg.body), raw: r.msg };
      const w = recv.waiter!;
      this.matcher.replace(w, { ...w, source: env.source, tag: env.tag });
      recv.waiter = undefined;
      this.outstandingRecvs--;
      this.ghosts++;
      req.complete(publicMessage(env) as Message<T>);
      return { done: true, value: req.peek() };
    }
    const done = req.settled;
    const raw = done ? recv.raw() : undefined;
    // Copied: the program may change the arrays it received.
    const msg = raw === undefined ? undefined : { header: Buffer.from(raw.header), body: raw.body.map((b) => Buffer.from(b)) };
    cpr.logNondet(ticket.ordinal, msg === undefined ? { k: "test", done } : { k: "test", done, msg });
    return { done, value: done ? req.peek() : undefined };
  }

  /** A poll of an isend in mode cpr: whether it was done is timing; logged and replayed. */
  private pollSend(req: RequestImpl<void>): { done: boolean; value: undefined } | undefined {
    const cpr = this.cpr!;
    const ticket = cpr.nondet("test");
    if (ticket.replay?.k === "test") return { done: ticket.replay.done, value: undefined };
    const done = req.settled;
    cpr.logNondet(ticket.ordinal, { k: "test", done });
    return { done, value: undefined };
  }

  /** Requests that the layer must fail on abort (posted receives and probes). */
  private readonly pending = new Set<RequestImpl<unknown>>();

  async recv<T = unknown>(source: number = ANY_SOURCE, tag: number = ANY_TAG): Promise<Message<T>> {
    return this.irecv<T>(source, tag).wait();
  }

  iprobe(source: number = ANY_SOURCE, tag: number = ANY_TAG): Status | undefined {
    this.live("iprobe");
    this.pointToPoint("iprobe");
    const src = this.checkRank(source, "iprobe", true);
    const tg = this.checkTag(tag, "iprobe", true);
    // Whether a message is there yet is timing: always an outcome to log and replay. On
    // replay the logged status is returned even if the message has not arrived yet; the
    // receive that follows waits for it.
    const ticket = this.ticket("iprobe");
    if (ticket?.replay?.k === "iprobe") return ticket.replay.found ? { source: ticket.replay.source, tag: ticket.replay.tag } : undefined;
    const env = this.matcher.peek(src, tg);
    if (ticket !== undefined) {
      this.cpr!.logNondet(ticket.ordinal, env === undefined ? { k: "iprobe", source: -1, tag: -1, found: false } : { k: "iprobe", source: env.source, tag: env.tag, found: true });
    }
    return env === undefined ? undefined : { source: env.source, tag: env.tag };
  }

  probe(source: number = ANY_SOURCE, tag: number = ANY_TAG): Promise<Status> {
    let src: number;
    let tg: number;
    try {
      this.live("probe");
      this.pointToPoint("probe");
      src = this.checkRank(source, "probe", true);
      tg = this.checkTag(tag, "probe", true);
    } catch (err) {
      return Promise.reject(err);
    }
    const ticket = src === ANY_SOURCE ? this.ticket("match") : undefined;
    if (ticket?.replay?.k === "match") {
      src = ticket.replay.source;
      tg = ticket.replay.tag;
    }
    const found = (env: AppEnvelope): Status => {
      if (ticket !== undefined && ticket.replay === undefined) this.cpr!.logNondet(ticket.ordinal, { k: "match", source: env.source, tag: env.tag });
      return { source: env.source, tag: env.tag };
    };
    const now = this.matcher.peek(src, tg);
    if (now !== undefined) return Promise.resolve(found(now));
    const req = new RequestImpl<Status>();
    this.pending.add(req as RequestImpl<unknown>);
    this.matcher.post({
      source: src, tag: tg, consume: false,
      onMatch: (env) => req.complete(found(env)),
    });
    return req.wait().finally(() => this.pending.delete(req as RequestImpl<unknown>));
  }

  waitAll<T>(reqs: readonly Request<T>[]): Promise<T[]> {
    return waitAll(reqs);
  }

  waitAny<T>(reqs: readonly Request<T>[]): Promise<{ index: number; value: T }> {
    reqs.forEach(asImpl);
    const ticket = this.ticket("any");
    if (ticket?.replay?.k === "any") {
      const index = ticket.replay.index;
      const r = reqs[index];
      if (r === undefined) return Promise.reject(new LifelineError("CPR_REPLAY", `replay: waitAny was logged returning index ${index}, but it got ${reqs.length} requests`));
      return r.wait().then((value) => ({ index, value }));
    }
    const p = waitAny(reqs);
    if (ticket === undefined) return p;
    return p.then((r) => {
      this.cpr!.logNondet(ticket.ordinal, { k: "any", index: r.index });
      return r;
    });
  }

  /** A non-deterministic call (cpr only): its ordinal and, on recovery, the outcome to replay. */
  private ticket(kind: NondetEntry["k"]): { ordinal: number; replay: NondetEntry | undefined } | undefined {
    return this.cpr?.nondet(kind);
  }

  // ---- collectives -------------------------------------------------------------------------

  /**
   * Runs one collective: assigns its sequence number and signature synchronously (so calls
   * keep program order even when not awaited one by one), then the algorithm.
   */
  private collective<R>(
    kind: CollKind,
    identity: readonly (string | number)[],
    run: (io: coll.CollectiveIo) => Promise<R>,
    rc?: { readonly ident: RetryCollIdentity; readonly key?: string | undefined },
  ): Promise<R> {
    try {
      this.live(kind);
    } catch (err) {
      return Promise.reject(err);
    }
    this.faults.onCollective(this.versions, this.collSinceCheckpoint++);
    if (this.retry !== undefined) return this.retryCollective(kind, identity, run, rc ?? { ident: identOf(kind, -1, undefined) });
    return this.runCollective(kind, identity, run);
  }

  /**
   * retry-one: the protocol answers the call from a buffer (a replay) or has it run on the
   * wire as the given sequence number in the given view; an abandoned run (a peer failed)
   * asks the protocol again.
   */
  private async retryCollective<R>(
    kind: CollKind,
    identity: readonly (string | number)[],
    run: (io: coll.CollectiveIo) => Promise<R>,
    rc: { readonly ident: RetryCollIdentity; readonly key?: string | undefined },
  ): Promise<R> {
    const hook = this.retry!;
    let d: RetryDecision = await hook.beforeCollective(rc.key === undefined ? { ident: rc.ident } : { ident: rc.ident, bootstrapKey: rc.key });
    for (;;) {
      if (this.failure !== undefined) throw this.failure;
      // A copy: the buffer's result may be served again (to another restarted peer), so the
      // program must not get a view of it that it could change.
      if ("result" in d) return decodeValue(Buffer.from(d.result)) as R;
      const { wireSeq, viewId, purgeBelow } = d.run;
      this.colls.restoreNextSeq(wireSeq);
      this.colls.purge((a) => a.header.epoch === viewId && a.header.collSeq >= purgeBelow);
      this.collEpoch = viewId;
      // A run blocked in a send to a dead peer never ends by itself: the abandon ends the wait.
      let abandon!: () => void;
      const abandoned = new Promise<never>((_, reject) => { abandon = () => reject(new Abandoned(`collective #${wireSeq} abandoned`)); });
      abandoned.catch(() => undefined);
      const mine = { seq: wireSeq, abandoned: hook.isAbandoned(wireSeq), abandon };
      this.retryRun = mine;
      let result: { value: R } | undefined;
      const retained: { arrayType: number; parts: readonly Buffer[] } = { arrayType: 0, parts: [] };
      // Abandoned before it started (the abandon overtook the decision): not run at all.
      if (!mine.abandoned) {
        try {
          const running = this.runCollective(kind, identity, run, (arrayType, parts) => Object.assign(retained, { arrayType, parts }));
          running.catch(() => undefined); // an abandoned run may end later; nobody waits for it
          result = { value: await Promise.race([running, abandoned]) };
        } catch (err) {
          if (!(err instanceof Abandoned) && !mine.abandoned) throw err;
        }
      }
      if (this.retryRun === mine) this.retryRun = undefined;
      if (result !== undefined && !mine.abandoned) {
        // The algorithm's own immutable chunks when it offered them (no copy), else a copy.
        const bytes = byteLengthOf(retained.parts);
        hook.afterCollective(retained.parts.length > 0
          ? [encodedValueHead(Encoding.typedArray, retained.arrayType, [bytes]), ...retained.parts]
          : encodeValue(result.value, (n) => this.resultBuffer(n)));
        return result.value;
      }
      d = await hook.resumeCollective();
    }
  }

  /** retry-one: memory for a kept result or checkpoint copy (pooled when large; see recycle in retryAccess). */
  private resultBuffer(bytes: number): Buffer {
    if (bytes < RESULT_POOL_BYTES_MIN) return Buffer.allocUnsafe(bytes);
    const buf = this.resultPool.acquire(bytes);
    this.pooledResults.add(buf);
    return buf;
  }

  private runCollective<R>(
    kind: CollKind,
    identity: readonly (string | number)[],
    run: (io: coll.CollectiveIo) => Promise<R>,
    retainResult?: (arrayType: number, parts: readonly Buffer[]) => void,
  ): Promise<R> {
    const kindIndex = COLL_KINDS.indexOf(kind);
    const c = this.colls.begin(fnv1a([kind, ...identity]), `${kind}(${identity.join(", ")})`, this.host.now());
    const io: coll.CollectiveIo = {
      rank: this.rank,
      size: this.size,
      send: (dest, step, body) => {
        if (this.failure !== undefined) return Promise.reject(this.failure);
        const tag = (kindIndex << STEP_BITS) | step;
        return this.transmit(dest, this.header(Kind.collective, dest, tag, body, c.seq, c.signature), body);
      },
      recv: (source, step) => (this.failure !== undefined ? Promise.reject(this.failure) : this.colls.recv(c, source, step)),
      ...(retainResult === undefined ? {} : { retainResult }),
      liveOnly: this.cpr === undefined,
    };
    // retry-one: a run the protocol abandoned (no longer active) may still end later; ignore it.
    const gone = (): boolean => this.retry !== undefined && this.colls.activeCollective(c.seq) !== c;
    return run(io).then(
      (result) => {
        if (gone()) return result;
        try {
          this.colls.end(c);
        } catch (err) {
          this.fatal(err as LifelineError);
          throw err;
        }
        return result;
      },
      (err: unknown) => {
        if (gone()) throw err;
        if (err instanceof LifelineError && (err.code === "MPI_COLLECTIVE_MISMATCH" || err.code === "MPI_OP")) this.fatal(err, c);
        throw err;
      },
    );
  }

  /**
   * A collective-level error that leaves peers inconsistent: fail the collective here and ask
   * the coordinator to stop the job (errors are fatal, as MPI's are by default), since peers
   * may be blocked in a collective that can no longer complete.
   */
  private fatal(err: LifelineError, c?: ActiveCollective): void {
    c?.fail(err);
    this.host.warn(`lifeline: rank ${this.rank}: ${err.code}: ${err.message}`);
    void this.control.send({ t: "abort", rank: this.rank, code: err.code, message: err.message }).catch(() => undefined);
  }

  /** Asks every peer for its signature of each collective blocked here for a while. */
  private queryOverdueCollectives(): void {
    if (this.failure !== undefined || this.finalized) return;
    // retry-one: no queries while the protocol's rounds run (ranks are at different points).
    if (this.retry?.inRecovery === true) return;
    for (const c of this.colls.overdue(this.host.now())) {
      const body = encodeBody(this.retry === undefined ? { seq: c.seq } : { seq: c.seq, view: this.retry.viewId }, { copy: false });
      for (let r = 0; r < this.size; r++) {
        if (r !== this.rank) void this.transmit(r, this.header(Kind.protocol, r, PROTO_COLL_QUERY, body), body).catch(() => undefined);
      }
    }
  }

  private onProtocol(header: Header, body: Buffer[]): void {
    // Tags from PROTO_RETRY_BASE / PROTO_CPR_BASE up belong to the recovery protocol in use.
    const protocol = header.tag >= PROTO_RETRY_BASE && this.retry !== undefined ? this.retry
      : header.tag >= PROTO_CPR_BASE && this.cpr !== undefined ? this.cpr
      : undefined;
    let decoded: unknown;
    try {
      decoded = decodeBody(header.encoding, header.arrayType, body);
    } catch (err) {
      this.warnGarbage(err);
      return;
    }
    if (protocol !== undefined) {
      protocol.onProtocol(header, decoded);
      return;
    }
    const msg = decoded as { seq?: unknown; signature?: unknown; call?: unknown; view?: unknown } | null;
    if (typeof msg !== "object" || msg === null || typeof msg.seq !== "number") {
      this.warnGarbage(new Error("protocol body has no sequence number"));
      return;
    }
    const seq = msg.seq as number;
    switch (header.tag) {
      case PROTO_RECEIPT: {
        const key = `${header.source}:${seq}`;
        const lent = this.lent.get(key);
        this.lent.delete(key);
        if (lent !== undefined) for (const b of lent) this.bounce.release(b);
        return;
      }
      case PROTO_COLL_QUERY: {
        // retry-one: a query of another view is about another execution (answer "not reached").
        const mine = this.retry !== undefined && msg.view !== this.retry.viewId ? undefined : this.colls.signatureOf(seq);
        this.sendProtocol(
          header.source,
          PROTO_COLL_ANSWER,
          this.retry === undefined
            ? { seq, signature: mine?.signature ?? null, call: mine?.call ?? null }
            : { seq, signature: mine?.signature ?? null, call: mine?.call ?? null, view: this.retry.viewId },
        );
        return;
      }
      case PROTO_COLL_ANSWER: {
        const c = this.colls.activeCollective(seq);
        if (c === undefined || typeof msg.signature !== "number" || msg.signature === c.signature) return;
        if (this.retry !== undefined && (this.retry.inRecovery || msg.view !== this.retry.viewId)) return;
        this.fatal(
          new LifelineError(
            "MPI_COLLECTIVE_MISMATCH",
            `collective #${seq}: rank ${this.rank} called ${c.call}, but rank ${header.source} called ${String(msg.call)}; every rank must make the same collective calls in the same order`,
          ),
          c,
        );
        return;
      }
      default:
        // Reserved for the recovery protocols' peer traffic.
        this.warnGarbage(new Error(`unexpected protocol frame (tag ${header.tag}) from rank ${header.source} in mode ${this.mode}`));
    }
  }

  private bootstrapKey(opts: CollectiveOptions | undefined, kind: CollKind): string | undefined {
    if (opts === undefined || opts.bootstrap === undefined) return undefined;
    const b = opts.bootstrap;
    if (b !== true && typeof b !== "string") throw new TypeError(`opts.bootstrap must be true or a string, not ${JSON.stringify(b)}`);
    const key = b === true ? `${kind}@${callSite()}` : b;
    if (this.versions > 0 || this.steps > 0) {
      throw new LifelineError("MPI_BOOTSTRAP", `bootstrap ${kind} ${JSON.stringify(key)} called after the first checkpoint(); bootstrap collectives must run before the main loop`);
    }
    if (this.bootstrapKeys.has(key)) {
      throw new LifelineError("MPI_BOOTSTRAP", `bootstrap key ${JSON.stringify(key)} used twice in one run; give each bootstrap collective its own key`);
    }
    this.bootstrapKeys.add(key);
    return key;
  }

  /**
   * A bootstrap collective's result is kept for the job's lifetime (it travels in every
   * checkpoint); a restored rank gets it from there without running the collective again.
   */
  private bootstrapped<R>(key: string | undefined, run: () => Promise<R>): Promise<R> {
    if (key === undefined || this.cpr === undefined) return run();
    const cached = this.cpr.bootstrapResult(key);
    if (cached !== undefined) return Promise.resolve(cached.value as R);
    return run().then((r) => {
      this.bootstrapResults.set(key, encodeValue(r));
      return r;
    });
  }

  barrier(): Promise<void> {
    return this.collective("barrier", [], (io) => coll.barrier(io), { ident: identOf("barrier", -1, undefined) });
  }

  bcast<T>(data: T, root = 0, opts?: CollectiveOptions): Promise<T> {
    let key: string | undefined;
    try {
      this.checkRank(root, "bcast root", false);
      key = this.bootstrapKey(opts, "bcast");
    } catch (err) {
      return Promise.reject(err);
    }
    return this.bootstrapped(key, () => this.collective("bcast", [`root=${root}`], (io) => coll.bcast(io, data, root), { ident: identOf("bcast", root, undefined), key }));
  }

  reduce<T>(data: T, op: ReduceOp = "sum", root = 0): Promise<T | undefined> {
    let checked: ReduceOp;
    try {
      checked = checkOp(op);
      this.checkRank(root, "reduce root", false);
    } catch (err) {
      return Promise.reject(err);
    }
    if (this.retry !== undefined) {
      // A buffered result must serve any rank: the reduce runs as in the other modes (so the
      // root's result is bit for bit theirs: float sums depend on the combining order), then
      // the root broadcasts it, in the same collective with its steps shifted.
      return this.collective("reduce", [`root=${root}`, opLabel(checked), shapeOf(data), "retry-one"], async (io) => {
        const r = await coll.reduce(io, data, checked, root);
        const shifted: coll.CollectiveIo = { ...io, send: (d, step, b) => io.send(d, step + RETRY_STEP_SHIFT, b), recv: (src, step) => io.recv(src, step + RETRY_STEP_SHIFT) };
        return coll.bcast(shifted, r, root);
      }, { ident: identOf(`reduce:${opLabel(checked)}`, root, data) })
        .then((r) => (this.rank === root ? r : undefined));
    }
    return this.collective("reduce", [`root=${root}`, opLabel(checked), shapeOf(data)], (io) => coll.reduce(io, data, checked, root));
  }

  allreduce<T>(data: T, op: ReduceOp = "sum", opts?: CollectiveOptions): Promise<T> {
    let checked: ReduceOp;
    let key: string | undefined;
    try {
      checked = checkOp(op);
      key = this.bootstrapKey(opts, "allreduce");
    } catch (err) {
      return Promise.reject(err);
    }
    return this.bootstrapped(key, () => this.collective("allreduce", [opLabel(checked), shapeOf(data)], (io) => coll.allreduce(io, data, checked), { ident: identOf(`allreduce:${opLabel(checked)}`, -1, data), key }));
  }

  gather<T>(data: T, root = 0): Promise<T[] | undefined> {
    try {
      this.checkRank(root, "gather root", false);
    } catch (err) {
      return Promise.reject(err);
    }
    if (this.retry !== undefined) {
      return this.collective("allgather", [`gather root=${root}`], (io) => coll.allgather(io, data), { ident: identOf("gather", root, undefined) })
        .then((r) => (this.rank === root ? r : undefined));
    }
    return this.collective("gather", [`root=${root}`], (io) => coll.gather(io, data, root));
  }

  scatter<T>(items: readonly T[] | undefined, root = 0): Promise<T> {
    try {
      this.checkRank(root, "scatter root", false);
      if (this.rank === root && (!Array.isArray(items) || items.length !== this.size)) {
        throw new LifelineError(
          "MPI_COLLECTIVE_MISMATCH",
          `scatter: the root must pass an array of exactly ${this.size} items (one per rank), got ${Array.isArray(items) ? `${items.length} items` : String(items)}`,
        );
      }
    } catch (err) {
      if (err instanceof LifelineError) this.fatal(err);
      return Promise.reject(err);
    }
    if (this.retry !== undefined) {
      // Every rank gets the root's items (a bcast) and picks its own: replayable for any rank.
      return this.collective("bcast", [`scatter root=${root}`], (io) => coll.bcast(io, items, root), { ident: identOf("scatter", root, undefined) })
        .then((all) => (all as readonly T[])[this.rank] as T);
    }
    return this.collective("scatter", [`root=${root}`], (io) => coll.scatter(io, items, root));
  }

  allgather<T>(data: T, opts?: CollectiveOptions): Promise<T[]> {
    let key: string | undefined;
    try {
      key = this.bootstrapKey(opts, "allgather");
    } catch (err) {
      return Promise.reject(err);
    }
    return this.bootstrapped(key, () => this.collective("allgather", [], (io) => coll.allgather(io, data), { ident: identOf("allgather", -1, undefined), key }));
  }

  alltoall<T>(items: readonly T[]): Promise<T[]> {
    if (!Array.isArray(items) || items.length !== this.size) {
      const err = new LifelineError(
        "MPI_COLLECTIVE_MISMATCH",
        `alltoall: every rank must pass an array of exactly ${this.size} items (one per destination), got ${Array.isArray(items) ? `${items.length} items` : String(items)}`,
      );
      this.fatal(err);
      return Promise.reject(err);
    }
    if (this.retry !== undefined) {
      // Every rank gets every row (an allgather: p times the data) and picks its column.
      return this.collective("allgather", ["alltoall"], (io) => coll.allgather(io, items), { ident: identOf("alltoall", -1, items) })
        .then((rows) => (rows as T[][]).map((row) => row[this.rank]!));
    }
    return this.collective("alltoall", [], (io) => coll.alltoall(io, items));
  }

  // ---- checkpoint-restart surface (mode none: no-ops with the same rules) --------------------

  async restore<S, G = undefined>(): Promise<Restored<S, G> | undefined> {
    this.live("restore");
    if (this.restoreCalled) throw new LifelineError("CPR_RESTORE", "restore() called twice; call it once, before the main loop");
    if (this.steps > 0) throw new LifelineError("CPR_RESTORE", "restore() called after checkpoint(); call it once, before the first checkpoint()");
    this.restoreCalled = true;
    if (this.retry !== undefined) {
      const got = await this.retry.restore();
      if (got === undefined) return undefined;
      this.versions = got.version;
      // Counted as in the run that took the checkpoint (fault coordinates: version, seqno).
      this.collSinceCheckpoint = 0;
      return { state: decodeValue(got.state) as S, global: decodeValue(got.global) as G, version: got.version };
    }
    const r = this.cpr?.restored();
    if (r === undefined) return undefined;
    this.versions = r.version;
    return { state: r.state as S, global: r.global as G, version: r.version };
  }

  async checkpoint<S, G = undefined>(state: S | (() => S), global?: G): Promise<void> {
    this.live("checkpoint");
    this.faults.onCheckpoint();
    if (this.outstandingRecvs > 0) {
      // The same program must run in every mode, and the recovery protocols cannot save a
      // half-done receive: enforce the rule everywhere so a port fails early, not at recovery.
      throw new LifelineError(
        "CPR_CHECKPOINT",
        `checkpoint() with ${this.outstandingRecvs} receive request(s) still outstanding; complete every irecv (wait/waitAll) before a checkpoint location`,
      );
    }
    if (this.colls.activeCount > 0) {
      throw new LifelineError(
        "CPR_CHECKPOINT",
        `checkpoint() with ${this.colls.activeCount} collective(s) still running; await every collective before a checkpoint location`,
      );
    }
    this.steps++;
    this.collSinceCheckpoint = 0;
    if (this.retry !== undefined) {
      // Encoded now (a copy: later changes must not reach the checkpoint), or, for the
      // function form, when the protocol really needs a copy (Rabit's lazy checkpoint).
      const lazy = typeof state === "function";
      const alloc = (n: number): Buffer => this.resultBuffer(n);
      const s = lazy ? () => encodeValue((state as () => S)(), alloc) : encodeValue(state, alloc);
      const g = lazy ? () => encodeValue(global, alloc) : encodeValue(global, alloc);
      await this.retry.checkpoint(s, g);
      this.versions = this.retry.progress.version;
      this.reportStep(true);
      return;
    }
    if (this.cpr !== undefined && this.ghosts > 0) {
      // A replayed poll completed a receive from the log and its re-sent copy is still on
      // its way: a checkpoint now would save a posted receive, which no part can hold. Not
      // a checkpoint location this time; the next one is (the copy is already re-sent or
      // about to be, by a peer replaying the same execution).
      this.reportStep(false);
      return;
    }
    if (this.cpr !== undefined) {
      const before = this.cpr.epoch;
      this.cpr.checkpoint(state, global, () => this.deliverSelf(Infinity));
      if (this.cpr.epoch !== before) this.versions = this.cpr.epoch;
      this.reportStep(this.cpr.epoch !== before);
      return;
    }
    this.versions++;
    this.reportStep(false);
  }

  nondet<T>(fn: () => T): T {
    this.live("nondet");
    if (this.mode === "retry-one") {
      throw new LifelineError(
        "MPI_MODE",
        "nondet() is not recoverable in --mode retry-one (a restarted rank would compute a different value); broadcast such a value from one rank with a collective, or use --mode cpr",
      );
    }
    if (typeof fn !== "function") throw new TypeError("nondet(fn) needs a function");
    const ticket = this.ticket("value");
    if (ticket?.replay?.k === "value") return ticket.replay.v as T;
    const v = fn();
    if (ticket !== undefined) this.cpr!.logNondet(ticket.ordinal, { k: "value", v });
    return v;
  }

  private reportStep(force: boolean): void {
    const now = this.host.now();
    if (!force && now - this.lastStepReport < STEP_REPORT_MS) return;
    this.lastStepReport = now;
    void this.control.send({ t: "step", rank: this.rank, steps: this.steps, epoch: this.cpr?.epoch ?? (this.retry !== undefined ? this.versions : 0) }).catch(() => undefined);
  }

  async finalize(result?: unknown): Promise<void> {
    this.live("finalize");
    const encoded = encodeValue(result);
    // Finalize is collective, as in MPI. The barrier also flushes every channel (they are FIFO):
    // a stray message of a mismatched collective that some peer sent earlier arrives before
    // that peer's barrier message and is reported, instead of after the job was released.
    // Its own signature: a program collective on one rank against finalize() on another is a
    // mismatch, reported at once.
    await this.collective("barrier", ["finalize"], (io) => coll.barrier(io), { ident: identOf("finalize", -1, undefined) });
    // retry-one: the rank stays to serve restarted peers until the release.
    this.retry?.finalize();
    this.finalized = true;
    this.reportStep(true);
    const released = new Promise<void>((resolve, reject) => { this.released = { resolve, reject }; });
    await this.control.send({ t: "finalize", rank: this.rank, result: encoded });
    try {
      await released;
    } finally {
      this.faults.dispose();
      this.failPending(new LifelineError("MPI_FINALIZED", "finalize() was called while this operation was pending"));
      await this.closeSockets();
      if (this.cpr !== undefined) await this.closeCpr(this.cpr);
      this.retry?.close();
      for (const fn of this.closeHooks.splice(0)) fn();
    }
  }

  // ---- failure -----------------------------------------------------------------------------

  private failPending(err: LifelineError): void {
    this.matcher.drainWaiters();
    this.outstandingRecvs = 0;
    for (const r of this.pending) r.fail(err);
    this.pending.clear();
    // Bounce buffers still lent are left to the garbage collector: ZeroMQ may still read them.
    this.lent.clear();
    this.colls.failAll(err);
    this.collTimer?.stop();
  }

  /** The job is over for this rank: every pending and future call fails with `err`. */
  private abortLocal(err: LifelineError): void {
    if (this.failure !== undefined) return;
    this.failure = err;
    this.failPending(err);
    this.released?.reject(err);
    this.host.warn(`lifeline: rank ${this.rank}: ${err.message}`);
    // Peers are being stopped too; leave promptly even if the program swallows the error.
    this.host.after(200, () => this.host.exit(1));
    void this.closeSockets();
  }

  /**
   * Waits for the cpr driver's background writes, but not for ever: a write stuck on a peer
   * that already left must not keep this released rank (and its watchdog) alive.
   */
  private async closeCpr(cpr: CprHook): Promise<void> {
    let timer: Timer | undefined;
    const late = new Promise<void>((resolve) => {
      timer = this.host.after(CPR_CLOSE_WAIT_MS, () => {
        this.host.warn(`lifeline: rank ${this.rank}: background checkpoint writes did not finish within ${CPR_CLOSE_WAIT_MS / 1000} s of the release; leaving them (no committed line depends on them)`);
        resolve();
      });
    });
    await Promise.race([cpr.close().catch(() => undefined), late]);
    timer?.stop();
  }

  private readonly closeHooks: (() => void)[] = [];

  /** Runs `fn` once this rank has finished (after finalize's release). */
  onClose(fn: () => void): void {
    this.closeHooks.push(fn);
  }

  private async closeSockets(): Promise<void> {
    await Promise.all([this.transport?.close(), this.control?.close()]);
  }
}

/** What the program sees of a message (not the frame kept for checkpoints). */
/** An irecv as its poller sees it: its posted receive (until matched) and its message's frame. */
interface PolledRecv {
  waiter: Waiter<AppEnvelope> | undefined;
  readonly raw: () => RawFrame | undefined;
}

function publicMessage(env: AppEnvelope): { source: number; tag: number; data: unknown } {
  return { source: env.source, tag: env.tag, data: env.data };
}

function opLabel(op: ReduceOp): string {
  return isBuiltinOp(op) ? op : "user-op";
}

