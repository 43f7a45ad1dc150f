/**
 * The channel layer: every frame a rank sends or receives passes here, whatever the mode.
 *
 * Send: stamp a 40-byte header (kind, source, tag, per-channel sequence number, epoch,
 * collective sequence/signature) → transmit (small bodies inline in the header's frame; sends
 * to self queued without a socket). Large application payloads are copied into pooled bounce
 * buffers that come back with the receiver's receipt (one per turn of its event loop and
 * sender, for every such message that arrived in it; carried by a reply when there is one);
 * from {@link BULK_BYTES_MIN} they go uncopied on the transport's bulk connection, with a mark
 * in their place on the channel (see sendApp and inOrder). Receive: validate the header (garbage
 * from stray processes is dropped with a rate-limited warning; a frame must carry the key of
 * the channel it claims, and come from the source's current incarnation or a newer one), send the
 * receipt a sender waits for, and hand the frame to the communicator. A message longer than
 * the job's limit is refused on both sides.
 *
 * What a recovery mode adds to a frame — its epoch and flags, the suppression of a re-sent
 * message the receiver already holds — comes from the mode's {@link FrameStamper}; mode none's
 * stamper does nothing.
 *
 * @example
 * const ch = new Channel({ rank, size, attempt, host, stamper, deliver: (h, body, raw, classify) => … });
 * await ch.sendApp(new Float64Array(8), 1, 7);
 */
import { LifelineError } from "../errors.ts";
import { BouncePool } from "./bounce-pool.ts";
import { byteLengthOf, decodeBody, type EncodedBody, encodeBody } from "./codec.ts";
import { DEFAULT_MAX_MESSAGE_BYTES } from "./env.ts";
import type { LibState, RawFrame } from "./cpr-hook.ts";
import type { Host, Timer, Transport } from "./host.ts";
import { bulkMarkOf, decodeHeader, Encoding, encodeHeader, encodeHeaderInto, Flag, type Header, HEADER_BYTES, Kind, restamp } from "./wire.ts";

/** Protocol-frame tag of a receipt for messages sent from bounce buffers (see sendApp). */
export const PROTO_RECEIPT = 0x102;
/** Protocol-frame tag of a sender's request for its receipt now: its program waits (see urgeReceipt). */
export const PROTO_RECEIPT_WANTED = 0x103;
/**
 * Application payloads with at least this many bytes of typed arrays are copied into pooled
 * bounce buffers (see bounce-pool.ts) that come back when the receiver sends a receipt.
 */
const BOUNCE_BYTES_MIN = 64 * 1024;
/**
 * Payloads from this size on are sent from the program's own memory and the send waits for
 * the receipt. Below it a copy is cheaper than that wait: the wait holds the sender until the
 * receiver's main thread has taken the message, and a receiver of large messages spends much
 * of its time in garbage collection (each received message is external memory, and every few
 * tens of MiB of it start a mark-compact), so a stream of awaited rendezvous sends runs at
 * about 0.6x raw zeromq.js at 16 MiB, against about 0.8x with copies that keep the link busy.
 * From here on the receiver's own page faults bound both alike, and a copy only costs memory.
 */
const RENDEZVOUS_BYTES_MIN = 32 * 1024 * 1024;
/**
 * Payloads from this size on (below {@link RENDEZVOUS_BYTES_MIN}) go from the program's memory
 * on the transport's bulk connection, when it has one, instead of being copied: the send
 * resolves once the transport has written them (see Transport.sendBulk). At this size the
 * copy costs more CPU than the bulk connection's mark and fences.
 */
export const BULK_BYTES_MIN = 2 * 1024 * 1024;
/** A receiver owing receipts for this many bytes to one sender sends one at the end of its turn. */
const RECEIPT_WINDOW_BYTES = 4 * 1024 * 1024;
/**
 * A send whose message leaves more than this many bytes of bounce buffers lent to its
 * destination resolves only once receipts bring them back under it: a sender that runs ahead
 * of its receiver waits instead of copying into fresh memory for every message (and holding
 * up to the high-water mark's worth of copies). A few receipt windows, so the link stays busy.
 */
const LENT_WINDOW_BYTES = 4 * RECEIPT_WINDOW_BYTES;
/**
 * ... but the window holds at least this many messages of the size being sent, so that large
 * ones pipeline too: one being read by the receiver, one on the wire, one being copied.
 */
const LENT_MESSAGES_MIN = 3;
/** ... and otherwise once that sender's receipt-flagged traffic pauses this long. */
const RECEIPT_IDLE_MS = 2;
/** Idle bounce-buffer memory kept for reuse. */
const BOUNCE_POOL_BYTES_MAX = 256 * 1024 * 1024;
/** Bodies up to this size travel in the header's frame: one ZeroMQ frame instead of two. */
const INLINE_BODY_BYTES_MAX = 4096;
/** Warnings about garbage frames are rate-limited to this many per process. */
const GARBAGE_WARNINGS_MAX = 10;

function bodyBytes(body: readonly Buffer[]): number {
  let n = 0;
  for (const b of body) n += b.byteLength;
  return n;
}

/** A message waiting for its receipt: its bounce buffers, or the rendezvous send to resolve. */
interface Lent {
  readonly bufs: Buffer[];
  /** Bytes of `bufs`. */
  readonly bytes: number;
  done?: () => void;
  fail?: (err: unknown) => void;
}

/** A send waiting for its destination's lent bytes to fall under its window (see {@link LENT_WINDOW_BYTES}). */
interface CreditWait {
  /** The window it waits for. */
  readonly window: number;
  readonly resolve: () => void;
  readonly reject: (err: unknown) => void;
}

/** An application message as a sender keeps it for a resend (retry-one's sender-based log). */
export interface LoggedFrame {
  /** Its number among the application frames of its channel (the header's collSeq). */
  readonly appSeq: number;
  /** Its encoded header (the attempt field is rewritten on a resend). */
  readonly header: Buffer;
  /** Its body frames: the log's own copies. */
  readonly body: readonly Buffer[];
}

/** Receives every application message a logging mode sends (retry-one). */
export interface AppLog {
  /** The log's own copy of one body frame of a message to `dest` (what goes out, and is kept). */
  copyBody(dest: number, bytes: Uint8Array): Buffer;
  record(dest: number, frame: LoggedFrame): void;
}

/** An arrived frame waiting for its place in its channel's order (see Channel.inOrder). */
interface HeldFrame {
  readonly header: Header;
  readonly body: Buffer[];
  readonly rawHeader: Buffer;
}

/** One source's bulk messages and marks not matched yet, of one incarnation of it. */
interface BulkOrder {
  readonly attempt: number;
  /** Frames after a mark whose message has not arrived (the first one is that mark), in arrival order. */
  readonly held: HeldFrame[];
  /** Bulk messages that arrived before their marks, in order. */
  readonly early: HeldFrame[];
}

/** A frame held back by the closed output gate (see {@link Channel.setGate}). */
interface Gated {
  readonly dest: number;
  readonly frames: readonly (Buffer | Uint8Array)[];
  readonly resolve: () => void;
  readonly reject: (err: unknown) => void;
}

/** What a mode adds to the frames of the channels (mode none: nothing). */
export interface FrameStamper {
  /** Sets `h.epoch` and `h.flags` of an app or collective frame to `dest` (it may count it). */
  stamp(h: Header, dest: number): void;
  /** true: do not send this app or collective frame (the receiver already holds it). */
  suppress(dest: number, h: Header): boolean;
}

export interface ChannelOptions {
  readonly rank: number;
  readonly size: number;
  readonly attempt: number;
  readonly host: Host;
  /** The longest message body sent or accepted (default {@link DEFAULT_MAX_MESSAGE_BYTES}). */
  readonly maxMessageBytes?: number;
  /** Application payloads from this size on use the transport's bulk connection (default {@link BULK_BYTES_MIN}). */
  readonly bulkBytesMin?: number;
  /**
   * A validated frame from a peer (`classify`: first arrival from the network), a send to
   * self or a re-injected one.
   */
  readonly deliver: (header: Header, body: Buffer[], rawHeader: Buffer, classify: boolean) => void;
}

export class Channel {
  stamper: FrameStamper = { stamp: () => undefined, suppress: () => false };
  /**
   * Set by a logging mode (retry-one): application messages are copied for the log, recorded,
   * and sent without bounce buffers or receipts; a failed hand-over to the transport (the peer
   * died and is reconnected) is not an error, since the log resends the message.
   */
  appLog: AppLog | undefined;
  /** Frames held back while the output gate is closed, in send order. */
  private gated: Gated[] | undefined;
  private readonly rank: number;
  private readonly size: number;
  private readonly attempt: number;
  private readonly host: Host;
  private readonly transport: Transport;
  private readonly deliver: ChannelOptions["deliver"];
  private readonly channelSeqOut: Uint32Array;
  /** Application frames sent so far on each channel (their identity, see frameId). */
  private readonly appSeqOut: Uint32Array;
  /** Sends to self waiting for their (deferred) delivery, FIFO. */
  private readonly selfQueue: { header: Header; raw: RawFrame }[] = [];
  /** Messages waiting for their receipt (bounce buffers, rendezvous), per destination by channel sequence. */
  private readonly lent: Map<number, Lent>[];
  /** Per destination, the bytes of bounce buffers lent to it, and the sends waiting for them to come back. */
  private readonly lentBytes: Float64Array;
  private readonly creditWaits: CreditWait[][];
  private readonly bounce = new BouncePool(BOUNCE_POOL_BYTES_MAX);
  private garbageWarnings = 0;
  readonly maxMessageBytes: number;
  private readonly bulkBytesMin: number;
  /** The keys of this rank's channels, from the coordinator's table (src/mpi/wire.ts). */
  private readonly keysOut: Uint32Array;
  /** What an arriving header must match: the keys of the channels to this rank, the job's size. */
  private readonly expect: { readonly keysIn: Uint32Array; readonly size: number };
  /** Each peer's incarnation as last heard from the coordinator: frames of older ones are refused. */
  private readonly attempts: Uint16Array;

  constructor(opts: ChannelOptions) {
    this.rank = opts.rank;
    this.size = opts.size;
    this.attempt = opts.attempt;
    this.host = opts.host;
    this.transport = opts.host.transport;
    this.deliver = opts.deliver;
    this.maxMessageBytes = opts.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
    this.bulkBytesMin = opts.bulkBytesMin ?? BULK_BYTES_MIN;
    this.keysOut = new Uint32Array(opts.size);
    this.expect = { keysIn: new Uint32Array(opts.size), size: opts.size };
    this.attempts = new Uint16Array(opts.size);
    this.channelSeqOut = new Uint32Array(opts.size);
    this.appSeqOut = new Uint32Array(opts.size);
    this.lent = Array.from({ length: opts.size }, () => new Map<number, Lent>());
    this.lentBytes = new Float64Array(opts.size);
    this.creditWaits = Array.from({ length: opts.size }, () => []);
    this.heardFrom = new Uint8Array(opts.size);
    this.urgedAt = new Float64Array(opts.size).fill(-1);
    this.receiptDue = new Float64Array(opts.size).fill(-1);
    this.receiptBytes = new Float64Array(opts.size);
  }

  /** The table's channel keys and incarnations (before anything is sent or received). */
  join(table: { readonly keysIn: readonly number[]; readonly keysOut: readonly number[]; readonly attempts: readonly number[] }): void {
    this.expect.keysIn.set(table.keysIn);
    this.keysOut.set(table.keysOut);
    this.attempts.set(table.attempts);
  }

  /** `rank` runs again as incarnation `attempt`: frames of the older ones are refused from now on. */
  peerRestarted(rank: number, attempt: number): void {
    if (attempt > this.attempts[rank]!) this.attempts[rank] = attempt;
    const o = this.bulkOrders[rank];
    if (o !== undefined && o.attempt < attempt) this.dropBulkOrder(rank);
  }

  // ---- send --------------------------------------------------------------------------------

  /** The header of the next frame to `dest` (its channel and app counters move on); `transmit` encodes it. */
  header(kind: Header["kind"], dest: number, tag: number, body: EncodedBody, collSeq = 0, signature = 0): Header {
    // Protocol frames are the layer's own talk: not part of any channel's message sequence,
    // not stamped with an epoch.
    const h: Header = {
      kind,
      flags: 0,
      encoding: body.encoding,
      key: this.keysOut[dest]!,
      source: this.rank,
      tag,
      channelSeq: kind === Kind.protocol ? 0 : this.channelSeqOut[dest]!++,
      epoch: 0,
      collSeq: kind === Kind.app ? this.appSeqOut[dest]!++ : collSeq,
      signature,
      arrayType: body.arrayType,
      attempt: this.attempt,
    };
    if (kind !== Kind.protocol) this.stamper.stamp(h, dest);
    return h;
  }

  /**
   * Encodes `h` once and sends it with `body` (to self: queued without a socket). `bulk`: on
   * the transport's bulk connection, with a mark in its place on the channel (an app message
   * to a peer with `sendBulk`; see sendApp).
   */
  transmit(dest: number, h: Header, body: EncodedBody, onSuppressed?: () => void, bulk = false): Promise<void> {
    if (h.kind !== Kind.protocol && this.stamper.suppress(dest, h)) {
      onSuppressed?.();
      return Promise.resolve();
    }
    if (h.kind === Kind.app && dest !== this.rank) {
      // A receipt owed to `dest` rides on this frame instead of a frame of its own.
      const due = this.receiptDue[dest]!;
      if (due >= 0) {
        h.flags |= Flag.ack;
        h.signature = due;
        this.receiptDue[dest] = -1;
        this.receiptBytes[dest] = 0;
      }
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
    const frames = body.frames;
    if (bulk) return this.outBulk(dest, h, frames);
    if (frames.length === 1) {
      const only = frames[0]!;
      if (only.byteLength > this.maxMessageBytes) return Promise.reject(this.tooLong(dest, only.byteLength));
      if (only.byteLength <= INLINE_BODY_BYTES_MAX) {
        const frame = encodeHeaderInto(h, Buffer.allocUnsafe(HEADER_BYTES + only.byteLength));
        frame.set(only, HEADER_BYTES);
        return this.out(dest, h.kind, [frame]);
      }
      return this.out(dest, h.kind, [encodeHeader(h), only]);
    }
    const bytes = byteLengthOf(frames);
    if (bytes > this.maxMessageBytes) return Promise.reject(this.tooLong(dest, bytes));
    return this.out(dest, h.kind, [encodeHeader(h), ...frames]);
  }

  /** Hands frames to the transport, or holds them back while the gate is closed (not protocol frames). */
  private out(dest: number, kind: Header["kind"], frames: readonly (Buffer | Uint8Array)[]): Promise<void> {
    if (this.gated === undefined || kind === Kind.protocol) return this.transport.send(dest, frames);
    const gated = this.gated;
    const p = new Promise<void>((resolve, reject) => gated.push({ dest, frames, resolve, reject }));
    // If the rank fails while it waits (failGated), a caller that no longer awaits it (a
    // collective whose receive failed first) must not see an unhandled rejection.
    p.catch(() => undefined);
    return p;
  }

  /**
   * A bulk message: its mark goes on the channel, the message itself on the bulk connection
   * from the program's memory. Resolves when both are sent and the transport has written the
   * message (the program may change its arrays then).
   */
  private outBulk(dest: number, h: Header, frames: readonly (Buffer | Uint8Array)[]): Promise<void> {
    h.flags |= Flag.bulk;
    const head = encodeHeader(h);
    const marked = this.transport.send(dest, [bulkMarkOf(head)]);
    const sent = this.transport.sendBulk!(dest, [head, ...frames]);
    return Promise.all([marked, sent]).then(() => undefined);
  }

  /**
   * Closes or opens the output gate (retry-one's pessimistic logging: nothing that may depend
   * on a determinant leaves the rank before every successor holds it). Opening sends what
   * was held back, in order; protocol frames are never held.
   */
  setGate(open: boolean): void {
    if (!open) {
      this.gated ??= [];
      return;
    }
    const held = this.gated;
    this.gated = undefined;
    if (held === undefined) return;
    for (const g of held) this.transport.send(g.dest, g.frames).then(g.resolve, g.reject);
  }

  /** Fails every frame held back by the gate (the rank is failing). */
  failGated(err: unknown): void {
    const held = this.gated;
    if (held === undefined) return;
    this.gated = [];
    for (const g of held) g.reject(err);
  }

  /**
   * Sends a logged application message again (to a restarted peer, or after this rank's own
   * restore), stamped with this run's key of the channel and this incarnation's attempt (a
   * resumed job's restored log was written by an earlier run, with other keys). Never fails: if the peer is gone again, the
   * log resends it once more when it is back.
   */
  resend(dest: number, f: LoggedFrame): void {
    const header = Buffer.from(f.header);
    restamp(header, this.keysOut[dest]!, this.attempt);
    if (dest === this.rank) {
      this.deliver(decodeHeader(header, { keysIn: "stored", size: this.size }), [...f.body], header, false);
      return;
    }
    const frames = f.body.length === 1 && f.body[0]!.byteLength <= INLINE_BODY_BYTES_MAX ? [Buffer.concat([header, f.body[0]!])] : [header, ...f.body];
    void this.out(dest, Kind.app, frames).catch(() => undefined);
  }

  private tooLong(dest: number, bytes: number): LifelineError {
    return new LifelineError(
      "MPI_LIMIT",
      `a message of ${bytes} bytes to rank ${dest} is longer than the job's limit of ${this.maxMessageBytes} bytes (--max-message); send it in parts, or raise the limit`,
    );
  }

  /** Delivers up to `n` pending sends to self, in order. */
  deliverSelf(n: number): void {
    for (let i = 0; i < n && this.selfQueue.length > 0; i++) {
      const m = this.selfQueue.shift()!;
      this.deliver(m.header, m.raw.body, m.raw.header, false);
    }
  }

  /**
   * One protocol frame (kind protocol, not counted on any channel); a failed send is dropped,
   * with a warning if it was longer than the job's limit (a checkpoint part copied to a peer).
   */
  sendProtocol(dest: number, tag: number, body: unknown): void {
    const enc = encodeBody(body, { copy: false });
    void this.transmit(dest, this.header(Kind.protocol, dest, tag, enc), enc).catch((err: unknown) => {
      if (err instanceof LifelineError && err.code === "MPI_LIMIT") this.host.warn(`lifeline: rank ${this.rank}: ${err.message}`);
    });
  }

  /**
   * Encodes and sends one application message; the program may reuse its buffers once this
   * resolves (as MPI's send). Arrays are copied — small ones into fresh memory, large ones
   * into warm pooled buffers, which the receiver's reader loop releases with a receipt on
   * arrival (not on a matching receive, so it cannot deadlock); while the destination holds
   * more than {@link LENT_WINDOW_BYTES} of them (or {@link LENT_MESSAGES_MIN} messages of this
   * size, if more) the send resolves only once receipts bring them back (a slow receiver slows
   * its sender). From {@link BULK_BYTES_MIN} (the transport permitting) they are not copied
   * but sent on the bulk connection, and the send resolves once the transport has written
   * them (they count against the same window). Very large ones ({@link RENDEZVOUS_BYTES_MIN})
   * are not copied at all (a rendezvous): ZeroMQ reads the program's own memory, and the send
   * resolves when the receipt says every byte arrived. So is a large reply — a message to a rank that sent us
   * one since our last to it, with nothing of ours still unacknowledged there (ping-pong,
   * request and answer): that rank waits for it, and its receipt rides on what it sends next.
   *
   * `nonBlocking` (an `isend`): the program promised not to change its arrays until the send
   * resolves, as with MPI_Isend, so a large payload is never copied: it goes from the
   * program's memory and the send resolves on the receipt. The receiver acknowledges such
   * messages as it does copies (per receipt window, or when the traffic pauses), and at once
   * when the sender asks because its program waits for one ({@link urgeReceipt}). A program
   * that keeps many such sends in flight (a window of isends, then waitAll) streams without a
   * copy, with one receipt per window instead of one per message or a round trip each.
   */
  sendApp(data: unknown, dest: number, tag: number, nonBlocking = false): Promise<void> {
    if (this.appLog !== undefined) return this.sendLogged(data, dest, tag, this.appLog);
    const reply = this.heardFrom[dest] === 1;
    this.heardFrom[dest] = 0;
    const body = encodeBody(data, { copy: false });
    // Frames that view the program's arrays; msgpack's own output buffer is ours already.
    const first = body.encoding === Encoding.typedArray ? 0 : 1;
    const frames = body.frames;
    let userBytes = 0;
    for (let i = first; i < frames.length; i++) userBytes += frames[i]!.byteLength;
    // Refused before anything is counted or lent: the channel's numbering stays whole.
    const bytes = userBytes + (first === 1 ? frames[0]!.byteLength : 0);
    if (bytes > this.maxMessageBytes) return Promise.reject(this.tooLong(dest, bytes));
    if (userBytes < BOUNCE_BYTES_MIN || dest === this.rank) {
      // A single small frame to a peer is copied into the header's frame by transmit, at
      // once: no copy of its own.
      if (dest === this.rank || frames.length !== 1 || frames[0]!.byteLength > INLINE_BODY_BYTES_MAX) {
        for (let i = first; i < frames.length; i++) frames[i] = Buffer.from(frames[i]!);
      }
      return this.transmit(dest, this.header(Kind.app, dest, tag, body), body);
    }
    // A reply (the destination sent us an application message since our last one to it) to a
    // quiet channel goes from the program's memory too: the destination is waiting for it,
    // its receipt rides on what the destination sends next, and the copy is saved. So does an
    // isend's (see above).
    const rendezvous = nonBlocking || userBytes >= RENDEZVOUS_BYTES_MIN || (reply && this.lent[dest]!.size === 0);
    // Large enough that the copy costs more than the bulk connection (never while the gate
    // holds frames back: the gate keeps one order, and the bulk connection is not gated).
    const bulk = !rendezvous && userBytes >= this.bulkBytesMin && this.gated === undefined && this.transport.sendBulk !== undefined;
    const bufs: Buffer[] = [];
    if (!rendezvous && !bulk) {
      for (let i = first; i < frames.length; i++) {
        const f = frames[i]!;
        const b = this.bounce.acquire(f.byteLength);
        b.set(f);
        bufs.push(b);
        frames[i] = b;
      }
    }
    const header = this.header(Kind.app, dest, tag, body);
    // An isend's receipt is not urgent until its program waits for it (urgeReceipt).
    header.flags |= rendezvous && !nonBlocking ? Flag.receipt | Flag.rendezvous : Flag.receipt;
    const seq = header.channelSeq;
    const byDest = this.lent[dest]!;
    const entry: Lent = { bufs, bytes: rendezvous ? 0 : userBytes };
    byDest.set(seq, entry);
    this.lentBytes[dest] = this.lentBytes[dest]! + entry.bytes;
    let suppressed = false;
    const sent = this.transmit(
      dest,
      header,
      body,
      () => {
        // Not sent after all (a suppressed re-send): no receipt will come.
        suppressed = true;
        byDest.delete(seq);
        this.returnLent(dest, entry);
      },
      bulk,
    );
    if (!rendezvous) {
      // A message the transport refused gets no receipt: it holds no credit. Its buffers are
      // left to the collector, not pooled (which ZeroMQ still reads is not known here).
      sent.catch(() => {
        if (byDest.delete(seq)) this.lentBytes[dest] = this.lentBytes[dest]! - entry.bytes;
        this.credit(dest);
      });
      // The message is on its way already (in order with everything else on the channel);
      // only the program waits, while its destination holds too many of our buffers.
      const window = Math.max(LENT_WINDOW_BYTES, LENT_MESSAGES_MIN * userBytes);
      if (this.lentBytes[dest] <= window) return sent;
      const waits = this.creditWaits[dest]!;
      return sent.then(() =>
        this.lentBytes[dest]! <= window
          ? undefined
          : new Promise<void>((resolve, reject) => {
              waits.push({ window, resolve, reject });
            }),
      );
    }
    // Suppressed in transmit, before a waiter could be attached: done already.
    if (suppressed) return sent;
    return new Promise<void>((resolve, reject) => {
      entry.done = resolve;
      entry.fail = reject;
      sent.catch((err: unknown) => {
        byDest.delete(seq);
        reject(err);
      });
    });
  }

  /**
   * A logged send: the body is copied once, for the log (which resends it to a restarted
   * peer until the peer's checkpoint covers it), and that copy is what goes out; no bounce
   * buffer, no receipt. It resolves once the transport has it, or once the transport gave it
   * up because the peer died (the log has it).
   */
  private sendLogged(data: unknown, dest: number, tag: number, log: AppLog): Promise<void> {
    const body = encodeBody(data, { copy: false });
    // msgpack's own output buffer is ours already; typed arrays view the program's memory.
    const first = body.encoding === Encoding.typedArray ? 0 : 1;
    const frames = body.frames;
    // Refused before it is counted or logged (transmit's own refusal would be taken for a dead
    // peer below, and the message would go nowhere while the send resolved).
    const bytes = byteLengthOf(frames);
    if (bytes > this.maxMessageBytes) return Promise.reject(this.tooLong(dest, bytes));
    for (let i = first; i < frames.length; i++) frames[i] = log.copyBody(dest, frames[i]!);
    const h = this.header(Kind.app, dest, tag, body);
    log.record(dest, { appSeq: h.collSeq, header: encodeHeader(h), body: frames as Buffer[] });
    return this.transmit(dest, h, body).catch(() => undefined);
  }

  private returnLent(dest: number, entry: Lent): void {
    for (const b of entry.bufs) this.bounce.release(b);
    this.lentBytes[dest] = this.lentBytes[dest]! - entry.bytes;
    entry.done?.();
  }

  /**
   * The program waits for a send to `dest` that resolves on its receipt (an isend's): ask
   * `dest` for its receipt now, unless nothing is lent to it (the send waits for the transport
   * only) or this rank asked already and sent it nothing since (that request's receipt covers
   * every message lent to it).
   */
  urgeReceipt(dest: number): void {
    if (dest === this.rank || this.lent[dest]!.size === 0 || this.urgedAt[dest] === this.channelSeqOut[dest]) return;
    this.urgedAt[dest] = this.channelSeqOut[dest]!;
    this.sendProtocol(dest, PROTO_RECEIPT_WANTED, null);
  }

  /** Sends waiting for credit to `dest` go on, in order, once its lent bytes are under their window again. */
  private credit(dest: number): void {
    const waits = this.creditWaits[dest]!;
    let n = 0;
    while (n < waits.length && this.lentBytes[dest]! <= waits[n]!.window) n++;
    for (const w of waits.splice(0, n)) w.resolve();
  }

  /**
   * A receipt from `source` (a receipt frame, or an app frame's ack): every message to it up
   * to channel sequence `seq` arrived (its channel is FIFO), so the bounce buffers lent to
   * them come back and the rendezvous sends among them are done.
   */
  private onReceipt(source: number, seq: number): void {
    const byDest = this.lent[source];
    if (byDest === undefined) return;
    // Insertion order is channel order.
    for (const [s, entry] of byDest) {
      if (s > seq) break;
      byDest.delete(s);
      this.returnLent(source, entry);
    }
    this.credit(source);
  }

  /** Frames that arrived and wait behind a mark for its bulk message (see inOrder). */
  get heldCount(): number {
    return this.bulkHeld;
  }

  /** Messages whose bounce buffers are still lent (waiting for their receipt). */
  get lentCount(): number {
    let n = 0;
    for (const m of this.lent) n += m.size;
    return n;
  }

  /**
   * Whether a send of the program's may still wait here: behind the gate, for credit, for its
   * destination's receipt (a rendezvous), or in the transport. Walks every channel: for an
   * occasional look (the idle watch, src/mpi/idle-watch.ts), not for the message path.
   */
  sendsWaiting(): boolean {
    if (this.gated !== undefined && this.gated.length > 0) return true;
    for (const waits of this.creditWaits) if (waits.length > 0) return true;
    for (const byDest of this.lent) for (const entry of byDest.values()) if (entry.done !== undefined) return true;
    return this.transport.sending?.() ?? false;
  }

  /**
   * After an abort: lent buffers are left to the collector (ZeroMQ may still read them), and
   * rendezvous sends waiting for a receipt, and sends waiting for credit, fail with `err`.
   */
  forgetLent(err: unknown): void {
    this.failGated(err);
    for (const m of this.lent) {
      for (const entry of m.values()) entry.fail?.(err);
      m.clear();
    }
    this.lentBytes.fill(0);
    for (const waits of this.creditWaits) for (const w of waits.splice(0)) w.reject(err);
  }

  // ---- receive -----------------------------------------------------------------------------

  /** Frames from the transport's reader loop. */
  onFrames(frames: Buffer[]): void {
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
    let header: Header;
    try {
      header = decodeHeader(rawHeader, this.expect);
    } catch (err) {
      this.warnGarbage(err);
      return;
    }
    // A replaced incarnation's late frames: refused quietly (the coordinator said it is gone).
    if (header.attempt < this.attempts[header.source]!) return;
    if (this.bulkHeld > 0 || (header.flags & (Flag.bulk | Flag.bulkMark)) !== 0) this.inOrder(header, body, rawHeader!);
    else this.arrive(header, body, rawHeader!);
  }

  /** A validated frame in its channel's order. */
  private arrive(header: Header, body: Buffer[], rawHeader: Buffer): void {
    if ((body.length === 1 ? body[0]!.byteLength : byteLengthOf(body)) > this.maxMessageBytes) {
      this.warnGarbage(new Error(`a message longer than the job's limit of ${this.maxMessageBytes} bytes (--max-message)`), header.source);
      return;
    }
    if (header.kind === Kind.protocol) {
      if (header.tag === PROTO_RECEIPT) {
        this.receiptFrame(header, body);
        return;
      }
      if (header.tag === PROTO_RECEIPT_WANTED) {
        // Every message of the source's before this request has arrived (its channel is FIFO):
        // acknowledge them at the end of this turn.
        if (this.receiptDue[header.source]! >= 0) this.scheduleReceipts();
        return;
      }
    }
    if (header.kind === Kind.app) {
      this.heardFrom[header.source] = 1;
      if ((header.flags & Flag.ack) !== 0) this.onReceipt(header.source, header.signature);
    }
    if ((header.flags & Flag.receipt) !== 0 && header.kind === Kind.app) {
      // The bytes are all here now: the sender may have its buffers back. One receipt covers
      // every such message from the source so far, and rides on the next app frame to it when
      // the program sends one (a reply). A rendezvous send waits for it: sent at the end of
      // this turn. Pooled buffers only need to come back eventually: once RECEIPT_WINDOW_BYTES
      // are owed to the source, or when its traffic pauses for RECEIPT_IDLE_MS.
      const src = header.source;
      this.receiptDue[src] = header.channelSeq;
      this.receiptBytes[src] = this.receiptBytes[src]! + bodyBytes(body);
      if ((header.flags & Flag.rendezvous) !== 0 || this.receiptBytes[src] >= RECEIPT_WINDOW_BYTES) {
        this.scheduleReceipts();
      } else {
        // One timer for the pause, moved on lazily: not a timer of its own per message.
        this.receiptIdleAt = this.host.now() + RECEIPT_IDLE_MS;
        this.receiptIdle ??= this.host.after(RECEIPT_IDLE_MS, this.receiptPause);
      }
    }
    this.deliver(header, body, rawHeader, true);
  }

  /** Frames held in all {@link bulkOrders} (0: every frame arrives at once). */
  private bulkHeld = 0;
  /** Per source, where its bulk messages and the frames after their marks wait (see inOrder). */
  private readonly bulkOrders: (BulkOrder | undefined)[] = [];

  /**
   * Puts bulk messages back in their channel's order. A bulk message and its mark travel on
   * two connections, each FIFO: the mark where the message was sent, the message on its own.
   * Whichever comes first waits for the other: a mark holds every later frame from its
   * source until its message arrives, and a message that overtook its mark waits for it. The
   * n-th mark from a source is its n-th bulk message's.
   */
  private inOrder(header: Header, body: Buffer[], rawHeader: Buffer): void {
    const src = header.source;
    let o = this.bulkOrders[src];
    if (o !== undefined && o.attempt !== header.attempt) {
      // Another incarnation's. A newer one means the source restarted: what its old one left
      // waiting here will never be completed. An older one's frame is stale once a newer one
      // has sent bulk messages.
      if (header.attempt < o.attempt && (o.held.length > 0 || o.early.length > 0)) return;
      this.dropBulkOrder(src);
      o = undefined;
    }
    const f: HeldFrame = { header, body, rawHeader };
    if ((header.flags & Flag.bulk) !== 0) {
      if (o !== undefined && o.held.length > 0) {
        // The first held frame is the mark this message was waiting for.
        this.bulkHeld--;
        this.arriveBulk(o.held.shift()!, f);
        this.releaseHeld(o);
      } else {
        (o ?? this.newBulkOrder(src, header.attempt)).early.push(f);
      }
      return;
    }
    // Messages wait early only while no mark waits (else the first would have taken them).
    if ((header.flags & Flag.bulkMark) !== 0 && o !== undefined && o.early.length > 0) {
      this.arriveBulk(f, o.early.shift()!);
      return;
    }
    if ((header.flags & Flag.bulkMark) !== 0 || (o !== undefined && o.held.length > 0)) {
      (o ?? this.newBulkOrder(src, header.attempt)).held.push(f);
      this.bulkHeld++;
      return;
    }
    this.arrive(header, body, rawHeader);
  }

  private newBulkOrder(src: number, attempt: number): BulkOrder {
    const o: BulkOrder = { attempt, held: [], early: [] };
    this.bulkOrders[src] = o;
    return o;
  }

  /** A bulk message at its mark's place. */
  private arriveBulk(mark: HeldFrame, msg: HeldFrame): void {
    if (mark.header.channelSeq !== msg.header.channelSeq) {
      // The connections are FIFO, so this is a sender's fault; the message is delivered anyway.
      this.warnGarbage(new Error(`bulk message ${msg.header.channelSeq} arrived for the mark of ${mark.header.channelSeq}`), msg.header.source);
    }
    this.arrive(msg.header, msg.body, msg.rawHeader);
  }

  /** Delivers the frames a source's marks held, up to the next mark whose message has not come. */
  private releaseHeld(o: BulkOrder): void {
    while (o.held.length > 0) {
      const f = o.held[0]!;
      if ((f.header.flags & Flag.bulkMark) !== 0) {
        const msg = o.early.shift();
        if (msg === undefined) return;
        o.held.shift();
        this.bulkHeld--;
        this.arriveBulk(f, msg);
      } else {
        o.held.shift();
        this.bulkHeld--;
        this.arrive(f.header, f.body, f.rawHeader);
      }
    }
  }

  /** Forgets what a source's replaced incarnation left waiting for bulk messages. */
  private dropBulkOrder(src: number): void {
    const o = this.bulkOrders[src];
    if (o === undefined) return;
    this.bulkHeld -= o.held.length;
    this.bulkOrders[src] = undefined;
  }

  /** Per peer, 1 when an application message from it arrived since our last one to it (see sendApp). */
  private readonly heardFrom: Uint8Array;
  /** Per destination, its channel's next sequence number when this rank last asked it for a receipt (see urgeReceipt). */
  private readonly urgedAt: Float64Array;
  /** Per source, the channel sequence of the newest message still to acknowledge (-1: none). */
  private readonly receiptDue: Float64Array;
  /** Per source, the body bytes of the messages owed a receipt. */
  private readonly receiptBytes: Float64Array;
  private receiptsScheduled = false;
  private receiptIdle: Timer | undefined;
  /** When the traffic owed a receipt counts as paused (see {@link receiptPause}). */
  private receiptIdleAt = 0;
  private readonly receiptPause = (): void => {
    this.receiptIdle = undefined;
    const left = this.receiptIdleAt - this.host.now();
    if (left > 0) this.receiptIdle = this.host.after(left, this.receiptPause);
    else this.sendReceipts();
  };
  /** The receipts owed go out at the end of this turn (once, however often asked). */
  private scheduleReceipts(): void {
    if (this.receiptsScheduled) return;
    this.receiptsScheduled = true;
    this.host.defer(this.sendReceipts);
  }
  private readonly sendReceipts = (): void => {
    this.receiptsScheduled = false;
    this.receiptIdle?.stop();
    this.receiptIdle = undefined;
    for (let r = 0; r < this.size; r++) {
      const seq = this.receiptDue[r]!;
      if (seq < 0) continue;
      this.receiptDue[r] = -1;
      this.receiptBytes[r] = 0;
      this.sendProtocol(r, PROTO_RECEIPT, { seq });
    }
  };

  private receiptFrame(header: Header, body: Buffer[]): void {
    let msg: unknown;
    try {
      msg = decodeBody(header.encoding, header.arrayType, body);
    } catch (err) {
      this.warnGarbage(err, header.source);
      return;
    }
    const seq = (msg as { seq?: unknown } | null)?.seq;
    if (typeof seq !== "number") {
      this.warnGarbage(new Error("receipt has no sequence number"), header.source);
      return;
    }
    this.onReceipt(header.source, seq);
  }

  /**
   * Delivers a frame held or logged elsewhere as if it arrived now (not classified again).
   * `stored`: it comes from this rank's recovery line, which a run with another job key may
   * have written (a resumed job). Its body is delivered as a copy: decoded from the part, it
   * views the part's bytes, which the store may still be writing (a partner's copy kept
   * again), and a collective combines into the chunks it receives.
   */
  inject(frame: RawFrame, stored = false): void {
    const h = decodeHeader(frame.header, stored ? { keysIn: "stored", size: this.size } : this.expect);
    this.deliver(h, stored ? frame.body.map((b) => Buffer.from(b)) : frame.body, frame.header, false);
  }

  /** A dropped frame, with the rank that sent it when its channel key proved that (rate-limited). */
  warnGarbage(err: unknown, source?: number): void {
    if (this.garbageWarnings++ < GARBAGE_WARNINGS_MAX) {
      this.host.warn(
        `lifeline: rank ${this.rank}: dropping a malformed frame${source === undefined ? "" : ` from rank ${source}`}: ${(err as Error).message}${this.garbageWarnings === GARBAGE_WARNINGS_MAX ? " (further warnings suppressed)" : ""}`,
      );
    }
  }

  // ---- state at a checkpoint location --------------------------------------------------------

  /** The channels' counters, for a checkpoint. */
  counters(): { channelSeqOut: number[]; appSeqOut: number[] } {
    return { channelSeqOut: [...this.channelSeqOut], appSeqOut: [...this.appSeqOut] };
  }

  restoreCounters(lib: Pick<LibState, "channelSeqOut" | "appSeqOut">): void {
    lib.channelSeqOut.forEach((n, d) => {
      this.channelSeqOut[d] = n;
    });
    lib.appSeqOut?.forEach((n, d) => {
      this.appSeqOut[d] = n;
    });
  }
}
