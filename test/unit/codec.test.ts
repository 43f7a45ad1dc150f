// Goal: every value the API promises to carry survives encode → frames → decode with its
// type intact, typed arrays travel as raw frames (no msgpack copy), and bad input is rejected
// with MPI_ENCODE / MPI_DECODE. Method: round trips through the real codec.
import { describe, expect, it } from "vitest";
import {
  decodeBody,
  decodeValue,
  decodeValueChunks,
  decodeValueOwned,
  encodeBody,
  encodedValueChunks,
  encodeValue,
  encodeValueChunks,
  typedArrayFrom,
} from "../../src/mpi/codec.ts";
import { isLifelineError } from "../../src/errors.ts";
import { Encoding } from "../../src/mpi/wire.ts";
import { arrayViewsIn } from "./array-views.ts";

const roundTrip = (v: unknown): unknown => {
  const body = encodeBody(v, { copy: true });
  return decodeBody(
    body.encoding,
    body.arrayType,
    body.frames.map((f) => Buffer.from(f.buffer, f.byteOffset, f.byteLength)),
  );
};

describe("codec", () => {
  it("sends a top-level typed array as one raw frame of its bytes", () => {
    const a = new Float64Array([1.5, -2, Math.PI]);
    const body = encodeBody(a, { copy: false });
    expect(body.encoding).toBe(Encoding.typedArray);
    expect(body.frames).toHaveLength(1);
    expect(body.frames[0]!.byteLength).toBe(24);
    expect(roundTrip(a)).toEqual(a);
  });

  it.each([
    new Int8Array([-1, 2]),
    new Uint8Array([1, 255]),
    new Uint8ClampedArray([3]),
    new Int16Array([-300]),
    new Uint16Array([65535]),
    new Int32Array([-5, 7]),
    new Uint32Array([4e9]),
    new Float32Array([0.5]),
    new Float64Array([1e300]),
    new BigInt64Array([-5n]),
    new BigUint64Array([2n ** 64n - 1n]),
    Buffer.from("buf"),
  ])("keeps the type of %o", (a) => {
    const back = roundTrip(a) as ArrayBufferView;
    expect(back.constructor).toBe(a.constructor);
    expect(Buffer.from(back.buffer, back.byteOffset, back.byteLength)).toEqual(Buffer.from(a.buffer, a.byteOffset, a.byteLength));
  });

  it("lifts nested typed arrays into frames and keeps Map, Set, Date, bigint and -0", () => {
    const v = {
      x: new Float64Array([1, 2]),
      nested: [{ y: new Int32Array([3]) }],
      m: new Map<unknown, unknown>([
        [1, "a"],
        ["k", new Uint8Array([9])],
      ]),
      s: new Set([1, "two"]),
      d: new Date(12345),
      big: 2n ** 70n,
      neg: -0,
      str: "é",
      nil: null,
      und: undefined,
    };
    const body = encodeBody(v, { copy: true });
    expect(body.frames.length).toBe(4); // msgpack + 3 lifted arrays
    const back = roundTrip(v) as typeof v;
    expect(back.x).toBeInstanceOf(Float64Array);
    expect(back.nested[0]!.y).toBeInstanceOf(Int32Array);
    expect(back.m).toBeInstanceOf(Map);
    expect(back.m.get("k")).toBeInstanceOf(Uint8Array);
    expect(back.s).toEqual(new Set([1, "two"]));
    expect(back.d).toEqual(new Date(12345));
    expect(back.big).toBe(2n ** 70n);
    expect(Object.is(back.neg, -0)).toBe(true);
    expect(back.str).toBe("é");
    expect(back.nil).toBeNull();
  });

  it("copies typed-array bytes when asked, so the sender may reuse its array", () => {
    const a = new Float64Array([1, 2]);
    const body = encodeBody({ a }, { copy: true });
    a[0] = 99;
    const back = decodeBody(
      body.encoding,
      body.arrayType,
      body.frames.map((f) => Buffer.from(f.buffer, f.byteOffset, f.byteLength)),
    ) as { a: Float64Array };
    expect(back.a[0]).toBe(1);
  });

  it("rejects functions, symbols and cycles with MPI_ENCODE naming the path", () => {
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    const cases: [unknown, string][] = [
      [{ a: [1, () => 1] }, "data.a[1]"],
      [{ s: Symbol("x") }, "data.s"],
      [cyclic, "cyclic"],
      [
        {
          m: new Map<unknown, unknown>([
            ["k", 1],
            ["j", () => 1],
          ]),
        },
        "data.m.get(j)",
      ],
      [{ m: new Map<unknown, unknown>([[Symbol("y"), 1]]) }, "data.m<key Symbol(y)>"],
      [[{ s: new Set<unknown>([1, 2, () => 1]) }], "data[0].s<set item 2>"],
    ];
    for (const [v, where] of cases) {
      let caught: unknown;
      try {
        encodeBody(v, { copy: true });
      } catch (err) {
        caught = err;
      }
      expect(isLifelineError(caught, "MPI_ENCODE")).toBe(true);
      expect((caught as Error).message).toContain(where);
    }
  });

  it("rejects malformed bodies with MPI_DECODE", () => {
    const bad = [
      () => decodeBody(Encoding.msgpack, 0, [Buffer.from([0x92, 0x01])]),
      () => decodeBody(Encoding.typedArray, 9, [Buffer.alloc(7)]),
      () => decodeBody(Encoding.typedArray, 99, [Buffer.alloc(8)]),
      () => decodeBody(Encoding.typedArray, 9, []),
      () => decodeValue(Buffer.from([1, 0, 5, 0, 0, 0])),
    ];
    for (const f of bad) {
      let caught: unknown;
      try {
        f();
      } catch (err) {
        caught = err;
      }
      expect(isLifelineError(caught, "MPI_DECODE")).toBe(true);
    }
  });

  it("views aligned frames without copying and copies misaligned ones", () => {
    const backing = Buffer.alloc(17);
    const aligned = typedArrayFrom(9, backing.subarray(0, 16)) as Float64Array;
    expect(aligned.buffer).toBe(backing.buffer);
    const misaligned = typedArrayFrom(9, backing.subarray(1, 17)) as Float64Array;
    expect(misaligned.length).toBe(2);
    expect(misaligned.byteOffset % 8).toBe(0);
  });

  it("encodeValue/decodeValue round-trip self-contained buffers", () => {
    for (const v of [undefined, 5, "s", { a: new Float32Array([1]) }, new BigInt64Array([1n])]) {
      expect(decodeValue(encodeValue(v))).toEqual(v);
    }
  });
});

describe("encodeValueChunks", () => {
  it("joined, is encodeValue's bytes; the buffers inside the value are its chunks, not copies", () => {
    const state = encodeValue({ step: 3, w: new Float64Array([1, 2, 3]) });
    const values: unknown[] = [
      undefined,
      7,
      "text",
      new Float32Array([1.5, -2]),
      { epoch: 3, state, global: null, logs: [[1, 2, 3]] },
      [state, Buffer.from("x")],
    ];
    for (const v of values) expect(Buffer.concat(encodeValueChunks(v)).equals(encodeValue(v))).toBe(true);
    const chunks = encodeValueChunks({ epoch: 3, state });
    expect(chunks.some((c) => c.buffer === state.buffer && c.byteOffset === state.byteOffset && c.byteLength === state.byteLength)).toBe(true);
  });

  it("encodeValue's own way for nothing and typed arrays writes the same bytes, into memory from alloc when given", () => {
    const backing = new Uint8Array(64).map((_, i) => i * 3);
    const values: unknown[] = [
      undefined,
      new Float64Array([0.1, -0, Number.NaN]),
      new Uint8Array(backing.buffer, 3, 17), // a view at an odd offset
      new Int16Array(backing.buffer, 2, 0), // empty
      Buffer.from("bytes"),
      new BigInt64Array([-1n, 2n ** 60n]),
    ];
    for (const v of values) {
      const generic = Buffer.concat(encodeValueChunks(v));
      expect(encodeValue(v).equals(generic)).toBe(true);
      const arena = Buffer.alloc(128, 0xee);
      const into = encodeValue(v, (n) => arena.subarray(0, n));
      expect(into.buffer).toBe(arena.buffer);
      expect(into.equals(generic)).toBe(true);
      expect(decodeValue(into)).toEqual(v);
    }
  });

  it("an encoded value split back into its chunks decodes from them; an array in a chunk of its own is viewed, not copied", () => {
    const model = Float64Array.from({ length: 1000 }, (_, i) => i / 7);
    const values: unknown[] = [undefined, "text", model, { step: 4, w: model, tags: ["a"] }];
    for (const v of values) {
      const enc = encodeValue(v);
      const chunks = encodedValueChunks(enc);
      expect(Buffer.concat(chunks).equals(enc)).toBe(true);
      expect(decodeValueChunks(chunks)).toEqual(decodeValue(enc));
      // Any other split is joined first.
      expect(decodeValueChunks([enc.subarray(0, 3), enc.subarray(3)])).toEqual(decodeValue(enc));
    }
    // As a receiver gets them when each chunk was a frame of its own: in aligned memory.
    const own = encodedValueChunks(encodeValue(model)).map((c) => Buffer.from(c));
    const got = decodeValueChunks(own) as Float64Array;
    expect(got).toEqual(model);
    expect(got.buffer).toBe(own[1]!.buffer);
    expect(() => encodedValueChunks(encodeValue(model).subarray(0, 40))).toThrow(/truncated/);
  });

  it("decodeValueOwned: the same value as decodeValue, sharing no memory with the bytes, at every offset", () => {
    const model = Float64Array.from({ length: 1000 }, (_, i) => i / 7);
    const values: unknown[] = [undefined, "text", model, new Uint8Array([1, 2, 3]), { step: 4, w: model, b: Buffer.from("xy"), tags: ["a"] }];
    for (const v of values) {
      const enc = encodeValue(v);
      // At each offset in a larger buffer, where decodeValue views an array whose start is aligned.
      for (let at = 0; at < 8; at++) {
        const within = Buffer.alloc(at + enc.length);
        enc.copy(within, at);
        const bytes = within.subarray(at);
        const got = decodeValueOwned(bytes);
        expect(got).toEqual(decodeValue(bytes));
        for (const a of arrayViewsIn(got)) expect(a.buffer === within.buffer, `offset ${at}`).toBe(false);
        const before = Buffer.from(bytes);
        for (const a of arrayViewsIn(got)) new Uint8Array(a.buffer, a.byteOffset, a.byteLength).fill(0xff);
        expect(bytes.equals(before)).toBe(true);
      }
    }
    expect(() => decodeValueOwned(encodeValue(model).subarray(0, 40))).toThrow(/truncated/);
  });

  it("decodeValueOwned copies each frame once, into memory from alloc, which a typed array views", () => {
    const model = Float64Array.from({ length: 1000 }, (_, i) => i / 7);
    const asked: number[] = [];
    const blocks: Buffer[] = [];
    const alloc = (n: number): Buffer => {
      asked.push(n);
      const b = Buffer.allocUnsafeSlow(n);
      blocks.push(b);
      return b;
    };
    const got = decodeValueOwned(encodeValue(model), alloc) as Float64Array;
    expect(got).toEqual(model);
    // One block, of the array's bytes: no second copy to align them.
    expect(asked).toEqual([model.byteLength]);
    expect(got.buffer).toBe(blocks[0]!.buffer);
    asked.length = 0;
    const v = decodeValueOwned(encodeValue({ w: model, step: 2 }), alloc) as { w: Float64Array };
    expect(asked.filter((n) => n === model.byteLength)).toHaveLength(1);
    expect(v.w.buffer).toBe(blocks.at(-1)!.buffer);
  });
});
