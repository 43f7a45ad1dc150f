/**
 * Goal: the decoders a peer's bytes reach — the frame header (wire.ts), message bodies and
 * self-contained values (codec.ts), control messages (control.ts) — never throw anything but
 * MPI_DECODE, whatever the bytes, and nothing a length field says makes them allocate more than
 * the bytes they were given; and every value the API promises to carry round-trips exactly.
 *
 * Method: property tests over seeded random input (`SEED=n` replays one run; the seed is in
 * every failure message): random values through encode → decode, compared by type as well as
 * value; random bytes, mutations of valid encodings (flipped, inserted, deleted, truncated
 * bytes), and encodings whose length fields claim up to 4 GiB, through every decoder.
 */
import { describe, expect, it } from "vitest";
import { decodeBody, decodeValue, encodeBody, encodeValue, typedArrayFrom } from "../../src/mpi/codec.ts";
import { decodeControl, encodeControl } from "../../src/mpi/control.ts";
import { decodeHeader, encodeHeader, Encoding, type Header, HEADER_BYTES, Kind } from "../../src/mpi/wire.ts";
import { Prng, seedFromEnv } from "../../src/testing/prng.ts";
import { LifelineError } from "../../src/errors.ts";

const SEED = seedFromEnv() ?? 0x5ec0de;
const CASES = 3000;

/** Every typed-array class the codec carries (its wire codes 1..11; 12 is Buffer). */
const ARRAY_TYPES = Array.from(
  { length: 11 },
  (_, i) => typedArrayFrom(i + 1, Buffer.alloc(8)).constructor as { new (b: ArrayBuffer): ArrayBufferView; BYTES_PER_ELEMENT: number },
);

function randomString(p: Prng): string {
  let s = "";
  const n = p.index(12);
  for (let i = 0; i < n; i++) {
    // Valid Unicode only (a lone surrogate is not a string UTF-8 can carry).
    const cp = p.chance(0.7) ? p.rangeInclusive(0x20, 0x7e) : p.chance(0.5) ? p.rangeInclusive(0xa0, 0xd7ff) : p.rangeInclusive(0x10000, 0x10ffff);
    s += String.fromCodePoint(cp);
  }
  return s;
}

function randomTyped(p: Prng): ArrayBufferView {
  const n = p.index(40);
  if (p.chance(0.1)) return Buffer.from(Array.from({ length: n }, () => p.index(256)));
  const Ctor = p.pick(ARRAY_TYPES);
  const bytes = new Uint8Array(n * Ctor.BYTES_PER_ELEMENT);
  for (let i = 0; i < bytes.length; i++) bytes[i] = p.index(256);
  return new Ctor(bytes.buffer);
}

function randomNumber(p: Prng): number {
  return p.pick([0, -0, 1, -1, NaN, Infinity, -Infinity, 2 ** 53, -(2 ** 31), p.next(), p.float() * 1e300, -p.float(), 0.1]);
}

/** A value of a kind the API promises to carry, nested up to `depth`. */
function randomValue(p: Prng, depth: number): unknown {
  const leaf = depth <= 0 || p.chance(0.4);
  if (leaf) {
    switch (p.index(8)) {
      case 0:
        return randomNumber(p);
      case 1:
        return p.chance(0.5) ? BigInt(p.next()) * BigInt(p.next()) * BigInt(p.next()) : -BigInt(p.next());
      case 2:
        return randomString(p);
      case 3:
        return p.chance(0.5);
      case 4:
        return null;
      case 5:
        return new Date(p.next() * 1000);
      case 6:
        return randomTyped(p);
      default:
        return p.index(1000);
    }
  }
  const n = p.index(5);
  switch (p.index(4)) {
    case 0:
      return Array.from({ length: n }, () => randomValue(p, depth - 1));
    case 1: {
      const o: Record<string, unknown> = {};
      for (let i = 0; i < n; i++) o[`k${randomString(p)}${i}`] = randomValue(p, depth - 1);
      return o;
    }
    case 2:
      return new Map(Array.from({ length: n }, (_, i) => [p.chance(0.5) ? i : randomString(p), randomValue(p, depth - 1)]));
    default:
      return new Set(Array.from({ length: n }, () => randomValue(p, depth - 1)));
  }
}

/** Exact equality, type for type: typed-array classes, Map/Set/Date, bigint, -0 and NaN. */
function same(a: unknown, b: unknown): boolean {
  if (typeof a !== typeof b) return false;
  if (typeof a === "number") return Object.is(a, b);
  if (a === null || typeof a !== "object") return a === b;
  if (b === null || typeof b !== "object" || Object.getPrototypeOf(a) !== Object.getPrototypeOf(b)) return false;
  if (ArrayBuffer.isView(a)) {
    const x = a;
    const y = b as ArrayBufferView;
    return Buffer.from(x.buffer, x.byteOffset, x.byteLength).equals(Buffer.from(y.buffer, y.byteOffset, y.byteLength));
  }
  if (a instanceof Date) return Object.is(a.getTime(), (b as Date).getTime());
  if (a instanceof Map || a instanceof Set) return same([...a], [...(b as Map<unknown, unknown>)]);
  const ka = Object.keys(a);
  const kb = Object.keys(b);
  return ka.length === kb.length && ka.every((k, i) => k === kb[i] && same((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k]));
}

/** Runs `decode`; anything thrown must be MPI_DECODE. Returns what was thrown (or undefined). */
function onlyDecodeErrors(decode: () => unknown, what: string): unknown {
  try {
    decode();
    return undefined;
  } catch (err) {
    if (!(err instanceof LifelineError) || err.code !== "MPI_DECODE") {
      throw new Error(`${what} (seed ${SEED}) threw ${err instanceof Error ? `${err.constructor.name}: ${err.message}` : String(err)}`);
    }
    return err;
  }
}

function randomBytes(p: Prng, max: number): Buffer {
  const b = Buffer.alloc(p.index(max + 1));
  for (let i = 0; i < b.length; i++) b[i] = p.index(256);
  return b;
}

/** A valid encoding with a few bytes flipped, inserted, deleted, or the tail cut off. */
function mutate(p: Prng, valid: Buffer): Buffer {
  let b = Buffer.from(valid);
  const edits = 1 + p.index(3);
  for (let e = 0; e < edits && b.length > 0; e++) {
    const at = p.index(b.length);
    switch (p.index(4)) {
      case 0:
        b[at] = p.index(256);
        break;
      case 1:
        b = Buffer.concat([b.subarray(0, at), Buffer.from([p.index(256)]), b.subarray(at)]);
        break;
      case 2:
        b = Buffer.concat([b.subarray(0, at), b.subarray(at + 1)]);
        break;
      default:
        b = b.subarray(0, at);
    }
  }
  return b;
}

const toBuffers = (frames: readonly Uint8Array[]): Buffer[] => frames.map((f) => Buffer.from(f.buffer, f.byteOffset, f.byteLength));

describe("codec properties", () => {
  it(`${CASES} random values round-trip exactly, as a message body and as a self-contained value`, () => {
    const p = new Prng(SEED);
    for (let i = 0; i < CASES; i++) {
      const v = randomValue(p, 4);
      const body = encodeBody(v, { copy: true });
      const back = decodeBody(body.encoding, body.arrayType, toBuffers(body.frames));
      if (!same(v, back)) expect.fail(`seed ${SEED} case ${i}: ${String(v)} came back as ${String(back)}`);
      if (!same(v, decodeValue(encodeValue(v)))) expect.fail(`seed ${SEED} case ${i}: encodeValue did not round-trip`);
    }
  });

  it("random bytes and mutated encodings never make a decoder throw anything but MPI_DECODE", () => {
    const p = new Prng(SEED + 1);
    const valid = Array.from({ length: 50 }, () => encodeBody(randomValue(p, 3), { copy: true }));
    let refused = 0;
    for (let i = 0; i < CASES; i++) {
      const from = p.pick(valid);
      const frames = p.chance(0.3) ? [randomBytes(p, 64)] : toBuffers(from.frames).map((f, k) => (k === 0 || p.chance(0.3) ? mutate(p, f) : f));
      const encoding = p.chance(0.8) ? from.encoding : (p.index(5) as Encoding);
      const arrayType = p.chance(0.8) ? from.arrayType : p.index(16);
      if (onlyDecodeErrors(() => decodeBody(encoding, arrayType, frames), `decodeBody case ${i}`) !== undefined) refused++;
      const value = p.chance(0.5) ? randomBytes(p, 64) : mutate(p, encodeValue(randomValue(p, 2)));
      onlyDecodeErrors(() => decodeValue(value), `decodeValue case ${i}`);
      const control = p.chance(0.5) ? randomBytes(p, 64) : mutate(p, encodeControl({ t: "step", rank: p.index(8), steps: p.next(), epoch: 0 }));
      onlyDecodeErrors(() => decodeControl(control), `decodeControl case ${i}`);
    }
    expect(refused).toBeGreaterThan(CASES / 10); // the mutations do break things
  });

  it("length fields that claim up to 4 GiB allocate nothing of the sort: MPI_DECODE at once", () => {
    const huge = [0xff, 0xff, 0xff, 0xff];
    const msgpack = [
      [0xdd, ...huge], // array32
      [0xdf, ...huge], // map32
      [0xdb, ...huge, 0x41], // str32
      [0xc6, ...huge, 0x41], // bin32
      [0xc9, ...huge, 0x4c, 0x41], // ext32 (a frame reference)
      [0xc9, ...huge, 0x4d], // ext32 (a Map)
      [0x92, 0xdc, 0xff, 0xff, 0xdd, ...huge], // nested
      [0xd6, 0x4c, 0x92, 0xce, ...huge.slice(0, 2)], // a frame reference to frame 2^32-1
    ].map((b) => Buffer.from(b));
    const values = [
      Buffer.from([Encoding.msgpack, 0, ...huge]), // 2^32-1 frames
      Buffer.concat([Buffer.from([Encoding.typedArray, 9, 1, 0, 0, 0]), Buffer.from(huge)]), // a frame of 4 GiB
    ];
    const before = process.memoryUsage();
    const started = performance.now();
    for (let round = 0; round < 200; round++) {
      for (const b of msgpack) {
        expect(onlyDecodeErrors(() => decodeBody(Encoding.msgpack, 0, [b]), "msgpack")).toBeDefined();
        expect(onlyDecodeErrors(() => decodeControl(b), "control")).toBeDefined();
      }
      for (const v of values) expect(onlyDecodeErrors(() => decodeValue(v), "value")).toBeDefined();
      expect(onlyDecodeErrors(() => decodeBody(Encoding.typedArray, 9, [Buffer.alloc(7)]), "typed")).toBeDefined();
    }
    const after = process.memoryUsage();
    expect(performance.now() - started).toBeLessThan(5_000);
    expect(after.arrayBuffers - before.arrayBuffers).toBeLessThan(64 * 1024 * 1024);
    expect(after.rss - before.rss).toBeLessThan(256 * 1024 * 1024);
  });
});

describe("wire header properties", () => {
  const randomHeader = (p: Prng, size: number): Header => ({
    kind: p.pick([Kind.app, Kind.collective, Kind.protocol]),
    flags: p.index(256),
    encoding: p.pick([Encoding.none, Encoding.msgpack, Encoding.typedArray]),
    key: p.next(),
    source: p.index(size),
    tag: p.next() | 0,
    channelSeq: p.next(),
    epoch: p.next(),
    collSeq: p.next(),
    signature: p.next(),
    arrayType: p.index(256),
    attempt: p.index(65536),
  });

  it(`${CASES} random headers round-trip field for field`, () => {
    const p = new Prng(SEED + 2);
    for (let i = 0; i < CASES; i++) {
      const size = 1 + p.index(64);
      const h = randomHeader(p, size);
      const keysIn = new Uint32Array(size);
      keysIn[h.source] = h.key;
      expect(decodeHeader(encodeHeader(h), { keysIn, size })).toEqual(h);
    }
  });

  it("random bytes, mutated headers and wrong lengths are MPI_DECODE or a header that passed every check", () => {
    const p = new Prng(SEED + 3);
    const size = 4;
    const keysIn = Uint32Array.from([11, 22, 33, 44]);
    let accepted = 0;
    for (let i = 0; i < CASES; i++) {
      const valid = encodeHeader({ ...randomHeader(p, size), key: 0 });
      valid.writeUInt32LE(keysIn[valid.readInt32LE(12)]!, 8);
      const b = p.chance(0.2) ? randomBytes(p, 2 * HEADER_BYTES) : p.chance(0.5) ? mutate(p, valid) : valid;
      let h: Header | undefined;
      onlyDecodeErrors(() => (h = decodeHeader(b, { keysIn, size })), `decodeHeader case ${i}`);
      if (h === undefined) continue;
      accepted++;
      // Whatever passed is exactly what the bytes say, and its key is its source's channel's.
      expect(b.length).toBe(HEADER_BYTES);
      expect(h.key).toBe(keysIn[h.source]);
      expect(encodeHeader(h).equals(Buffer.concat([b.subarray(0, 37), Buffer.from([0]), b.subarray(38)]))).toBe(true);
    }
    expect(accepted).toBeGreaterThan(CASES / 4);
  });
});
