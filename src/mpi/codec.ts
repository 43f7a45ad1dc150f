/**
 * Payload encoding: typed arrays travel as raw frames, everything else as msgpack.
 *
 * - A top-level typed array (the common case for collectives and halos) is one raw frame; its
 *   type code goes in the header, so it arrives as the same type with no msgpack work at all.
 * - Structured data goes through msgpackr. Typed arrays nested inside it are lifted out into
 *   frames of their own (a raw frame needs no encoding at all; msgpack would copy every byte
 *   through its encoder), and `Map`, `Set` and `-0`, which plain msgpack flattens, are boxed so they come back as sent.
 * - Data msgpack cannot carry (functions, symbols, cycles) is rejected with `MPI_ENCODE`
 *   naming the path to the bad value, before anything is sent.
 *
 * @example
 * const body = encodeBody({ x: new Float64Array(8), n: 3 }, { copy: true });
 * const back = decodeBody(body.encoding, body.arrayType, body.frames.map((f) => Buffer.from(f)));
 */
import { addExtension, Packr } from "msgpackr";
import { LifelineError } from "../errors.ts";
import { Encoding } from "./wire.ts";

export type TypedArray =
  | Int8Array
  | Uint8Array
  | Uint8ClampedArray
  | Int16Array
  | Uint16Array
  | Int32Array
  | Uint32Array
  | Float32Array
  | Float64Array
  | BigInt64Array
  | BigUint64Array;

type TypedArrayCtor = {
  new (buffer: ArrayBufferLike, byteOffset: number, length: number): TypedArray;
  new (length: number): TypedArray;
  BYTES_PER_ELEMENT: number;
};

/** Type codes on the wire (header byte 36 / frame reference). 12 is Node's Buffer. */
const CTORS: readonly (TypedArrayCtor | undefined)[] = [
  undefined,
  Int8Array,
  Uint8Array,
  Uint8ClampedArray,
  Int16Array,
  Uint16Array,
  Int32Array,
  Uint32Array,
  Float32Array,
  Float64Array,
  BigInt64Array,
  BigUint64Array,
  Uint8Array,
] as TypedArrayCtor[];
const BUFFER_CODE = 12;

/** The wire code of a typed array's type, or 0 if `v` is not a typed array. */
export function typedArrayCode(v: unknown): number {
  if (!ArrayBuffer.isView(v) || v instanceof DataView) return 0;
  if (Buffer.isBuffer(v)) return BUFFER_CODE;
  switch ((v as object).constructor) {
    case Int8Array:
      return 1;
    case Uint8Array:
      return 2;
    case Uint8ClampedArray:
      return 3;
    case Int16Array:
      return 4;
    case Uint16Array:
      return 5;
    case Int32Array:
      return 6;
    case Uint32Array:
      return 7;
    case Float32Array:
      return 8;
    case Float64Array:
      return 9;
    case BigInt64Array:
      return 10;
    case BigUint64Array:
      return 11;
    default:
      return 0; // a subclass we do not know: msgpack it like any object
  }
}

export function isTypedArray(v: unknown): v is TypedArray {
  return typedArrayCode(v) !== 0;
}

/** Total length of some byte chunks (a body's frames, a result kept as chunks). */
export function byteLengthOf(chunks: readonly ArrayBufferView[]): number {
  let n = 0;
  for (const c of chunks) n += c.byteLength;
  return n;
}

/** A copy of a typed array, of its own type (a Buffer's `slice()` is a view, not a copy). */
export function copyTyped<T extends TypedArray>(v: T): T {
  return (Buffer.isBuffer(v) ? Buffer.from(v) : (v as unknown as { slice(): T }).slice()) as T;
}

/**
 * A typed array of `like`'s type with `length` elements, NOT initialised: for a caller that
 * writes every element before anyone reads one. (A zero-filled one of many MiB comes as fresh
 * pages from the kernel, and writing it costs a page fault per 4 KiB; this memory is recycled.)
 */
export function allocUninitialisedLike<T extends TypedArray>(like: T, length: number): T {
  const bytes = Buffer.allocUnsafeSlow(length * like.BYTES_PER_ELEMENT);
  if (Buffer.isBuffer(like)) return bytes as unknown as T;
  return new (like.constructor as new (buffer: ArrayBufferLike, byteOffset: number, length: number) => T)(bytes.buffer, bytes.byteOffset, length);
}

/** The bytes of a typed array, as a Buffer view (no copy) or a fresh copy. */
export function bytesOf(v: ArrayBufferView, copy: boolean): Buffer {
  const view = Buffer.from(v.buffer, v.byteOffset, v.byteLength);
  return copy ? Buffer.from(view) : view;
}

/**
 * A typed array of the given wire type over `buf`. Views without copying when the bytes are
 * aligned for the element type (zeromq.js hands large messages over as external buffers);
 * copies otherwise.
 */
export function typedArrayFrom(code: number, buf: Buffer): TypedArray | Buffer {
  if (code === BUFFER_CODE) return buf;
  const Ctor = CTORS[code];
  if (Ctor === undefined) throw new LifelineError("MPI_DECODE", `unknown typed-array type code ${code}`);
  const bpe = Ctor.BYTES_PER_ELEMENT;
  if (buf.byteLength % bpe !== 0) {
    throw new LifelineError("MPI_DECODE", `a ${Ctor.name} frame of ${buf.byteLength} bytes is not a whole number of elements`);
  }
  if (buf.byteOffset % bpe === 0) return new Ctor(buf.buffer, buf.byteOffset, buf.byteLength / bpe);
  const out = new Ctor(buf.byteLength / bpe);
  Buffer.from(out.buffer, out.byteOffset, out.byteLength).set(buf);
  return out;
}

// ---- msgpack boxes for what plain msgpack would flatten ------------------------------------

class FrameRef {
  constructor(
    readonly index: number,
    readonly code: number,
  ) {}
}
class MapBox {
  constructor(readonly entries: unknown[]) {}
}
class SetBox {
  constructor(readonly values: unknown[]) {}
}
class NegZero {}

/**
 * Frames of the message being decoded (msgpackr's extension readers are synchronous), in a
 * process-wide slot rather than in this module: msgpackr keeps one registry of extension
 * readers per process, and the last registration of a type wins. With two copies of this
 * module loaded (a program importing both the built package and its sources, or two installed
 * versions), the reader registered by one copy must see the frames the other copy's
 * decodeBody set.
 */
const decoding = ((globalThis as Record<symbol, unknown>)[Symbol.for("lifeline.codec.decoding")] ??= { frames: [] }) as { frames: Buffer[] };

// Extension type numbers 0x4c.. ("L"): registered for our private classes only, so a user's
// own use of msgpackr in the same process is unaffected.
addExtension({
  Class: FrameRef,
  type: 0x4c,
  write: (r: FrameRef) => [r.index, r.code],
  read: ([index, code]: [number, number]) => {
    const frame = decoding.frames[index];
    if (frame === undefined) throw new LifelineError("MPI_DECODE", `message references missing frame ${index}`);
    return typedArrayFrom(code, frame);
  },
});
addExtension({ Class: MapBox, type: 0x4d, write: (m: MapBox) => m.entries, read: (e: unknown[]) => new Map(pairs(e)) });
addExtension({ Class: SetBox, type: 0x4e, write: (s: SetBox) => s.values, read: (v: unknown[]) => new Set(v) });
addExtension({ Class: NegZero, type: 0x4f, write: () => 0, read: () => -0 });

function pairs(e: unknown[]): [unknown, unknown][] {
  const out: [unknown, unknown][] = [];
  for (let i = 0; i + 1 < e.length; i += 2) out.push([e[i], e[i + 1]]);
  return out;
}

const packr = new Packr({ useRecords: false, structuredClone: false, moreTypes: false, useBigIntExtension: true });

const DEPTH_MAX = 256;

class EncodePathError extends Error {
  constructor(
    readonly path: string[],
    readonly reason: string,
  ) {
    super(reason);
  }
}

/**
 * Checks `v` is encodable and tells whether it needs boxing (typed arrays, Map, Set, -0 inside).
 * Throws EncodePathError with the path to the first bad value.
 */
function scan(v: unknown, depth: number): boolean {
  switch (typeof v) {
    case "number":
      return v === 0 && 1 / v < 0;
    case "string":
    case "boolean":
    case "undefined":
    case "bigint":
      return false;
    case "function":
      throw new EncodePathError([], "a function cannot be sent");
    case "symbol":
      throw new EncodePathError([], "a symbol cannot be sent");
  }
  if (v === null) return false;
  if (depth > DEPTH_MAX) throw new EncodePathError([], `data is cyclic or nested deeper than ${DEPTH_MAX} levels`);
  if (ArrayBuffer.isView(v)) return typedArrayCode(v) !== 0;
  if (v instanceof Date || v instanceof RegExp) return false;
  // Every message's data goes through here: no closure per container, and a path element is
  // only built when an error unwinds through it.
  let needs = false;
  if (Array.isArray(v)) {
    let i = 0;
    try {
      for (; i < v.length; i++) if (scan(v[i], depth + 1)) needs = true;
    } catch (err) {
      throw onPath(err, `[${i}]`);
    }
    return needs;
  }
  if (v instanceof Map) {
    let key: unknown,
      inKey = true;
    try {
      for (const [k, x] of v) {
        key = k;
        inKey = true;
        scan(k, depth + 1);
        inKey = false;
        scan(x, depth + 1);
      }
    } catch (err) {
      throw onPath(err, inKey ? `<key ${String(key)}>` : `.get(${String(key)})`);
    }
    return true;
  }
  if (v instanceof Set) {
    let i = 0;
    try {
      for (const x of v) {
        scan(x, depth + 1);
        i++;
      }
    } catch (err) {
      throw onPath(err, `<set item ${i}>`);
    }
    return true;
  }
  if (v instanceof ArrayBuffer) throw new EncodePathError([], "an ArrayBuffer cannot be sent; wrap it in a Uint8Array");
  let key = "";
  try {
    for (key of Object.keys(v as object)) if (scan((v as Record<string, unknown>)[key], depth + 1)) needs = true;
  } catch (err) {
    throw onPath(err, `.${key}`);
  }
  return needs;
}

/** Adds `element` in front of an encoding error's path as it unwinds; other errors pass. */
function onPath(err: unknown, element: string): unknown {
  if (err instanceof EncodePathError) err.path.unshift(element);
  return err;
}

/** Builds the boxed copy of `v`; typed arrays are appended to `frames`. */
function box(v: unknown, frames: Uint8Array[], copy: boolean): unknown {
  if (typeof v === "number") return v === 0 && 1 / v < 0 ? new NegZero() : v;
  if (v === null || typeof v !== "object") return v;
  const code = typedArrayCode(v);
  if (code !== 0) {
    frames.push(bytesOf(v as TypedArray, copy));
    return new FrameRef(frames.length - 1, code);
  }
  if (Array.isArray(v)) return v.map((x) => box(x, frames, copy));
  if (v instanceof Map) {
    const e: unknown[] = [];
    for (const [k, x] of v) e.push(box(k, frames, copy), box(x, frames, copy));
    return new MapBox(e);
  }
  if (v instanceof Set) return new SetBox([...v].map((x) => box(x, frames, copy)));
  if (v instanceof Date || v instanceof RegExp || ArrayBuffer.isView(v)) return v;
  const out: Record<string, unknown> = {};
  for (const k of Object.keys(v)) out[k] = box((v as Record<string, unknown>)[k], frames, copy);
  return out;
}

export interface EncodedBody {
  encoding: Encoding;
  arrayType: number;
  /** Body frames: [raw bytes] for a typed array; [msgpack, ...lifted arrays] otherwise. */
  frames: Uint8Array[];
}

/**
 * Encodes `data` for the wire. With `copy`, typed-array bytes are copied so that the caller
 * may reuse its arrays as soon as the send resolves (zeromq.js sends views without copying).
 * Rejects data msgpack cannot carry with `MPI_ENCODE`.
 */
export function encodeBody(data: unknown, opts: { copy: boolean }): EncodedBody {
  if (data === undefined) return { encoding: Encoding.none, arrayType: 0, frames: [] };
  const code = typedArrayCode(data);
  if (code !== 0) {
    return { encoding: Encoding.typedArray, arrayType: code, frames: [bytesOf(data as TypedArray, opts.copy)] };
  }
  let needsBox: boolean;
  try {
    needsBox = scan(data, 0);
  } catch (err) {
    if (err instanceof EncodePathError) {
      const where = err.path.length > 0 ? ` (at data${err.path.join("")})` : "";
      throw new LifelineError("MPI_ENCODE", `cannot encode message data${where}: ${err.reason}`);
    }
    throw err;
  }
  const frames: Uint8Array[] = [];
  const value = needsBox ? box(data, frames, opts.copy) : data;
  let packed: Buffer;
  try {
    packed = packr.pack(value);
  } catch (err) {
    throw new LifelineError("MPI_ENCODE", `cannot encode message data: ${(err as Error).message}`, { cause: err });
  }
  return { encoding: Encoding.msgpack, arrayType: 0, frames: [packed, ...frames] };
}

/** Decodes body frames produced by {@link encodeBody}. Throws `MPI_DECODE` on malformed input. */
export function decodeBody(encoding: Encoding, arrayType: number, frames: Buffer[]): unknown {
  switch (encoding) {
    case Encoding.none:
      return undefined;
    case Encoding.typedArray: {
      if (frames.length !== 1) throw new LifelineError("MPI_DECODE", `a typed-array message has ${frames.length} body frames, expected 1`);
      return typedArrayFrom(arrayType, frames[0]!);
    }
    case Encoding.msgpack: {
      const [first, ...rest] = frames;
      if (first === undefined) throw new LifelineError("MPI_DECODE", "a msgpack message has no body frame");
      decoding.frames = rest;
      try {
        return packr.unpack(first);
      } catch (err) {
        if (err instanceof LifelineError) throw err;
        throw new LifelineError("MPI_DECODE", `malformed msgpack body: ${(err as Error).message}`, { cause: err });
      } finally {
        decoding.frames = [];
      }
    }
  }
}

/** Encodes a value to one self-contained buffer (frames length-prefixed); for stores and logs. */
export function encodeValue(data: unknown, alloc?: (bytes: number) => Buffer): Buffer {
  // The head is written straight into the result (retry-one encodes every small collective
  // result this way): no separate head buffer or chunk list as encodeValueChunks makes. Nothing
  // (a barrier's result) and a typed array, the results of nearly every collective, are written
  // without a body in between (the same bytes as below).
  if (data === undefined) return writeValueHead6(alloc === undefined ? Buffer.allocUnsafe(6) : alloc(6), Encoding.none, 0, 0);
  const code = typedArrayCode(data);
  if (code !== 0) {
    const v = data as ArrayBufferView;
    const n = v.byteLength;
    const out = writeValueHead6(alloc === undefined ? Buffer.allocUnsafe(10 + n) : alloc(10 + n), Encoding.typedArray, code, 1);
    out.writeUInt32LE(n, 6);
    out.set(new Uint8Array(v.buffer, v.byteOffset, n), 10);
    return out;
  }
  const body = encodeBody(data, { copy: false });
  const headBytes = 6 + 4 * body.frames.length;
  const total = headBytes + byteLengthOf(body.frames);
  const out = alloc === undefined ? Buffer.allocUnsafe(total) : alloc(total);
  writeValueHead(
    out,
    body.encoding,
    body.arrayType,
    body.frames.map((f) => f.byteLength),
  );
  let off = headBytes;
  for (const f of body.frames) {
    out.set(f, off);
    off += f.byteLength;
  }
  return out;
}

/**
 * {@link encodeValue}'s bytes as the chunks they are made of, nothing copied: its head, then
 * the body's frames — which view the arrays and buffers inside `data` — so a caller can send or
 * write them without joining them first, or tell which chunk is which of its buffers.
 *
 * @example
 * const state = encodeValue(model);
 * const chunks = encodeValueChunks({ epoch: 3, state });
 * Buffer.concat(chunks).equals(encodeValue({ epoch: 3, state })); // true
 * chunks.some((c) => c.buffer === state.buffer);                  // true: a view, not a copy
 */
export function encodeValueChunks(data: unknown): Buffer[] {
  const body = encodeBody(data, { copy: false });
  const frames = body.frames.map((f) => bytesOf(f, false));
  return [
    encodedValueHead(
      body.encoding,
      body.arrayType,
      frames.map((f) => f.byteLength),
    ),
    ...frames,
  ];
}

/**
 * The head of {@link encodeValue}'s layout for a body whose frames have these lengths: the
 * head followed by the frames' bytes is that value's encoding (e.g. a typed array kept as the
 * chunks it arrived in, concatenated only if it is ever decoded).
 */
export function encodedValueHead(encoding: Encoding, arrayType: number, frameBytes: readonly number[]): Buffer {
  const head = Buffer.allocUnsafe(6 + 4 * frameBytes.length);
  writeValueHead(head, encoding, arrayType, frameBytes);
  return head;
}

function writeValueHead(out: Buffer, encoding: Encoding, arrayType: number, frameBytes: readonly number[]): void {
  writeValueHead6(out, encoding, arrayType, frameBytes.length);
  frameBytes.forEach((n, i) => out.writeUInt32LE(n, 6 + 4 * i));
}

/** The head's first 6 bytes: encoding, array type and the count of frames (their lengths follow). */
function writeValueHead6(out: Buffer, encoding: Encoding, arrayType: number, frames: number): Buffer {
  out[0] = encoding;
  out[1] = arrayType;
  out.writeUInt32LE(frames, 2);
  return out;
}

/** Inverse of {@link encodeValue}. Typed arrays in the result may view `buf`. */
export function decodeValue(buf: Buffer): unknown {
  const [head, ...frames] = encodedValueChunks(buf);
  return decodeBody(head![0] as Encoding, head![1]!, frames);
}

/**
 * The chunks {@link encodeValueChunks} made `buf` of — its head, then its frames — as views of
 * `buf`. Sent as separate frames, a typed array among them arrives in memory of its own,
 * aligned, where {@link decodeValueChunks} views it instead of copying it. Throws `MPI_DECODE`
 * when `buf` is truncated.
 *
 * @example
 * decodeValueChunks(encodedValueChunks(encodeValue(model))); // model, equal
 */
export function encodedValueChunks(buf: Buffer): Buffer[] {
  if (buf.length < 6) throw new LifelineError("MPI_DECODE", "encoded value is truncated");
  const n = buf.readUInt32LE(2);
  if (6 + 4 * n > buf.length) throw new LifelineError("MPI_DECODE", "encoded value is truncated");
  const chunks: Buffer[] = [buf.subarray(0, 6 + 4 * n)];
  let off = 6 + 4 * n;
  for (let i = 0; i < n; i++) {
    const len = buf.readUInt32LE(6 + 4 * i);
    if (off + len > buf.length) throw new LifelineError("MPI_DECODE", "encoded value is truncated");
    chunks.push(buf.subarray(off, off + len));
    off += len;
  }
  return chunks;
}

/**
 * {@link decodeValue} into memory of its own: nothing in the value shares `buf`'s memory, so the
 * caller may hand `buf` to a transport (which reads it later, in place) and the value to a
 * program (which may change it) at once. Each frame is copied once, into memory from `alloc`
 * (which must start each block at an offset that aligns any typed array: a block of its own),
 * and a typed array then views its copy. `decodeValue(Buffer.from(buf))` copies a typed array
 * twice: its bytes follow the value's head, at an offset that does not align it.
 *
 * @example
 * const mine = decodeValueOwned(served); send(encodedValueChunks(served)); (mine as Float64Array).fill(0);
 */
export function decodeValueOwned(buf: Buffer, alloc: (bytes: number) => Buffer = Buffer.allocUnsafeSlow): unknown {
  const [head, ...frames] = encodedValueChunks(buf);
  const copies = frames.map((f) => {
    const own = alloc(f.length);
    f.copy(own);
    return own;
  });
  return decodeBody(head![0] as Encoding, head![1]!, copies);
}

/**
 * {@link decodeValue} of the concatenation of `chunks`. When they are the value's head and then
 * one chunk per frame ({@link encodedValueChunks}), nothing is joined; any other split is.
 */
export function decodeValueChunks(chunks: readonly Buffer[]): unknown {
  const head = chunks[0];
  if (head !== undefined && head.length >= 6) {
    const n = head.readUInt32LE(2);
    if (head.length === 6 + 4 * n && chunks.length === n + 1 && chunks.every((c, i) => i === 0 || c.length === head.readUInt32LE(6 + 4 * (i - 1)))) {
      return decodeBody(head[0] as Encoding, head[1]!, chunks.slice(1));
    }
  }
  return decodeValue(Buffer.concat(chunks));
}
