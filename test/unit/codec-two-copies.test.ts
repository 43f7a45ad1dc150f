/**
 * msgpackr keeps one process-wide registry of extension readers, and the last registration of a
 * type wins. A process that loads two copies of the codec (a program importing both the built
 * package and its sources, as test fixtures do, or two installed versions of Lifeline) must
 * still decode with either: a checkpoint part holding typed arrays failed to restore with
 * "message references missing frame 0" when the other copy had registered last.
 */
import { describe, expect, it } from "vitest";
import type * as codec from "../../src/mpi/codec.ts";
import { decodeValue, encodeValue } from "../../src/mpi/codec.ts";

describe("two copies of the codec in one process", () => {
  it("each decodes what either encodes, typed arrays included", async () => {
    // A second instance of the module (a distinct module id), registering its extensions last.
    const specifier = "../../src/mpi/codec.ts?second-copy";
    const other = (await import(specifier)) as typeof codec;
    expect(other.encodeValue).not.toBe(encodeValue);
    const value = { step: 3, model: Float64Array.from([1.5, -2, 3]), tags: new Map([["a", new Int32Array([7])]]) };
    for (const [enc, dec] of [
      [encodeValue, decodeValue],
      [other.encodeValue, decodeValue],
      [encodeValue, other.decodeValue],
      [other.encodeValue, other.decodeValue],
    ] as const) {
      expect(dec(enc(value))).toEqual(value);
    }
  });
});
