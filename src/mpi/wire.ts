/**
 * The frame header every Lifeline message carries, as a fixed 40-byte binary struct.
 *
 * A fixed layout rather than msgpack: it is decoded for every arriving frame, validated
 * before anything else is trusted (stray processes may connect and send garbage), and it
 * reserves room for the recovery protocols' piggyback (epoch, recording bit, per-channel
 * sequence number, sender incarnation) so that no protocol ever needs a second frame.
 *
 * The key is the channel's: random per job and per ordered pair of ranks (source →
 * destination), handed to the two ranks in their tables by the coordinator (docs/security.md).
 * A frame that does not carry the key of the channel its source field names is refused, so a
 * rank cannot pass its frames off as another rank's, and frames of another job never match.
 *
 * Layout (little endian):
 * ```
 *  0 u32 magic "LFL1"      4 u8 version       5 u8 kind        6 u8 flags      7 u8 encoding
 *  8 u32 channel key      12 i32 source      16 i32 tag       20 u32 channel sequence number
 * 24 u32 epoch            28 u32 collective sequence number   32 u32 collective signature
 * 36 u8 array type        37 u8 reserved     38 u16 sender attempt (incarnation)
 * ```
 */
import { LifelineError } from "../errors.ts";

export const HEADER_BYTES = 40;
export const WIRE_MAGIC = 0x314c464c; // "LFL1" read as little-endian u32
export const WIRE_VERSION = 1;

/** What a frame is for; collectives and protocol traffic never match application receives. */
export const Kind = { app: 1, collective: 2, protocol: 3 } as const;
export type Kind = (typeof Kind)[keyof typeof Kind];

/** Flag bits. `recording` is the coordinated protocol's "sender still records" bit. */
export const Flag = {
  recording: 1,
  /** The sender lent a pooled bounce buffer and takes it back when the receipt comes. */
  receipt: 4,
  /**
   * An app frame that carries a receipt: its signature field (unused by app frames) is the
   * channel sequence of the newest `receipt` message from the destination that arrived here.
   */
  ack: 8,
  /** A `receipt` message whose send waits for its receipt (sent from the program's memory): acknowledge it at once. */
  rendezvous: 16,
  /**
   * A mark, without a body: the app message with this header's channel sequence went on the
   * sender's bulk connection, and is delivered where this mark arrived (see Channel.onFrames).
   */
  bulkMark: 32,
  /** An app message that went on the bulk connection: delivered where its mark arrived. */
  bulk: 64,
} as const;

/** The mark of a bulk message whose encoded header is `head`: the same header, flagged {@link Flag.bulkMark} alone. */
export function bulkMarkOf(head: Buffer): Buffer {
  const mark = Buffer.from(head);
  mark[6] = Flag.bulkMark;
  return mark;
}

/** How the body frames are encoded (see codec.ts). */
export const Encoding = { none: 0, msgpack: 1, typedArray: 2 } as const;
export type Encoding = (typeof Encoding)[keyof typeof Encoding];

export interface Header {
  kind: Kind;
  flags: number;
  encoding: Encoding;
  /** The key of the channel source → destination (see the file comment). */
  key: number;
  source: number;
  tag: number;
  /** Count of messages sent on the channel source→destination before this one (0-based). */
  channelSeq: number;
  /** The sender's epoch at send time (cpr); 0 in other modes. */
  epoch: number;
  /** Collective sequence number (kind collective); 0 otherwise. */
  collSeq: number;
  /**
   * Hash of the collective's identity (kind, root, op, type, length) for mismatch detection;
   * on an app frame with {@link Flag.ack}, a receipt (see there).
   */
  signature: number;
  /** Typed-array type code (encoding typedArray). */
  arrayType: number;
  /** The sender's attempt (incarnation), so that frames from a dead incarnation can be told apart. */
  attempt: number;
}

export function encodeHeader(h: Header): Buffer {
  return encodeHeaderInto(h, Buffer.allocUnsafe(HEADER_BYTES));
}

/** Writes `h` into the first {@link HEADER_BYTES} bytes of `b` (a frame with its body inline); returns `b`. */
export function encodeHeaderInto(h: Header, b: Buffer): Buffer {
  // Byte stores without Buffer's per-call range checks: this runs for every frame.
  put32(b, 0, WIRE_MAGIC);
  b[4] = WIRE_VERSION;
  b[5] = h.kind;
  b[6] = h.flags;
  b[7] = h.encoding;
  put32(b, 8, h.key);
  put32(b, 12, h.source);
  put32(b, 16, h.tag);
  put32(b, 20, h.channelSeq);
  put32(b, 24, h.epoch);
  put32(b, 28, h.collSeq);
  put32(b, 32, h.signature);
  b[36] = h.arrayType;
  b[37] = 0;
  b[38] = h.attempt & 0xff;
  b[39] = (h.attempt >>> 8) & 0xff;
  return b;
}

/** Sets the channel key and the sender attempt of an encoded header (a logged frame sent again). */
export function restamp(b: Buffer, key: number, attempt: number): void {
  put32(b, 8, key);
  b[38] = attempt & 0xff;
  b[39] = (attempt >>> 8) & 0xff;
}

/** Little-endian u32 (or i32: the same bits) at `o`. */
function put32(b: Buffer, o: number, v: number): void {
  b[o] = v & 0xff;
  b[o + 1] = (v >>> 8) & 0xff;
  b[o + 2] = (v >>> 16) & 0xff;
  b[o + 3] = (v >>> 24) & 0xff;
}

function u32(b: Buffer, o: number): number {
  return (b[o]! | (b[o + 1]! << 8) | (b[o + 2]! << 16) | (b[o + 3]! << 24)) >>> 0;
}

function i32(b: Buffer, o: number): number {
  return b[o]! | (b[o + 1]! << 8) | (b[o + 2]! << 16) | (b[o + 3]! << 24);
}

/**
 * Decodes and validates a header. Throws `MPI_DECODE` with the reason for anything that is not
 * a well-formed Lifeline header of this job; the caller drops the frame with a warning.
 * `keysIn[s]` is the key of the channel from rank `s` to the receiver. `keysIn: "stored"`
 * accepts any key: for frames a rank restores from its own recovery line, which an earlier run
 * of the job (with other keys) may have written.
 */
export function decodeHeader(b: Buffer | undefined, expect: { readonly keysIn: ArrayLike<number> | "stored"; readonly size: number }): Header {
  if (b === undefined || b.length !== HEADER_BYTES) {
    throw new LifelineError("MPI_DECODE", `frame header has ${b?.length ?? 0} bytes, expected ${HEADER_BYTES}`);
  }
  if (u32(b, 0) !== WIRE_MAGIC) throw new LifelineError("MPI_DECODE", "frame header has a bad magic number");
  if (b[4] !== WIRE_VERSION) throw new LifelineError("MPI_DECODE", `frame header has wire version ${b[4]}, expected ${WIRE_VERSION}`);
  const kind = b[5]!;
  if (kind !== Kind.app && kind !== Kind.collective && kind !== Kind.protocol) {
    throw new LifelineError("MPI_DECODE", `frame header has unknown kind ${kind}`);
  }
  const encoding = b[7]!;
  if (encoding !== Encoding.none && encoding !== Encoding.msgpack && encoding !== Encoding.typedArray) {
    throw new LifelineError("MPI_DECODE", `frame header has unknown encoding ${encoding}`);
  }
  const source = i32(b, 12);
  if (source < 0 || source >= expect.size) {
    throw new LifelineError("MPI_DECODE", `frame names source rank ${source}, outside 0..${expect.size - 1}`);
  }
  const key = u32(b, 8);
  if (expect.keysIn !== "stored" && key !== expect.keysIn[source]! >>> 0) {
    throw new LifelineError("MPI_DECODE", `frame claims to come from rank ${source} without the key of that channel (another job's frame, or forged)`);
  }
  return {
    kind: kind,
    flags: b[6]!,
    encoding: encoding,
    key,
    source,
    tag: i32(b, 16),
    channelSeq: u32(b, 20),
    epoch: u32(b, 24),
    collSeq: u32(b, 28),
    signature: u32(b, 32),
    arrayType: b[36]!,
    attempt: b[38]! | (b[39]! << 8),
  };
}

/**
 * What a frame is, independent of where it sits on its channel: for a collective frame its
 * (collective sequence, step); for an application frame its number among the application
 * frames of its channel (carried in the collective-sequence field, unused by them otherwise).
 * The recovery protocol suppresses re-sent early frames by this identity: a re-execution issues
 * the same frames, but operations in flight at once may interleave them on the channel in
 * another order than the recorded run did.
 */
export function frameId(h: Pick<Header, "kind" | "collSeq" | "tag">): number {
  return h.kind === Kind.collective ? 2 * (h.collSeq * 0x1000000 + (h.tag & 0xffffff)) + 1 : 2 * h.collSeq;
}
