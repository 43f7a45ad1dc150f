/**
 * Goal: the result buffer and the bootstrap cache keep what replay needs, within their
 * bounds, and never serve a result to a call that is not the collective that produced it
 * (Rabit's worst bug: a seqno-only match served a broadcast's result to an allreduce).
 * Method: direct calls, one rule per test.
 */
import { describe, expect, it } from "vitest";
import { BootstrapCache, ProtocolError, ResultBuffer } from "../../src/cpr/retry-one/result-buffer.ts";
import type { CollIdentity } from "../../src/cpr/retry-one/types.ts";

const sum8: CollIdentity = { op: "allreduce:sum", root: -1, type: "Float64Array", length: 8 };
const bcast8: CollIdentity = { op: "bcast", root: 0, type: "Float64Array", length: 8 };

function codeOf(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (err) {
    if (err instanceof ProtocolError) return err.code;
    throw err;
  }
  return undefined;
}

describe("ResultBuffer", () => {
  it("serves collective #index to the same collective", () => {
    const b = new ResultBuffer({ entriesMax: 10, bytesMax: 1000 });
    b.add({ index: 0, ident: sum8, result: "r0", bytes: 64 });
    b.add({ index: 1, ident: bcast8, result: "r1", bytes: 64 });
    expect(b.take(1, bcast8)?.result).toBe("r1");
    expect(b.take(2, sum8)).toBeUndefined();
    expect([b.from, b.to, b.count, b.bytes]).toEqual([0, 2, 2, 128]);
  });

  it("rejects replay with another op, root, type or length (CPR_REPLAY), never a mixed result", () => {
    const b = new ResultBuffer({ entriesMax: 10, bytesMax: 1000 });
    b.add({ index: 0, ident: sum8, result: "r0", bytes: 8 });
    expect(codeOf(() => b.take(0, bcast8))).toBe("CPR_REPLAY");
    expect(codeOf(() => b.take(0, { ...sum8, length: 9 }))).toBe("CPR_REPLAY");
    expect(codeOf(() => b.take(0, { ...sum8, type: "Float32Array" }))).toBe("CPR_REPLAY");
    expect(codeOf(() => b.take(0, { ...sum8, op: "allreduce:max" }))).toBe("CPR_REPLAY");
    expect(codeOf(() => b.take(0, { ...bcast8, root: 1 }))).toBe("CPR_REPLAY");
  });

  it("is bounded by entries and bytes with a clear CPR_CHECKPOINT error", () => {
    const b = new ResultBuffer({ entriesMax: 2, bytesMax: 1000 });
    b.add({ index: 0, ident: sum8, result: 0, bytes: 8 });
    b.add({ index: 1, ident: sum8, result: 0, bytes: 8 });
    expect(() => b.add({ index: 2, ident: sum8, result: 0, bytes: 8 })).toThrow(/resultEntriesMax 2.*call checkpoint\(\) more often/);
    const c = new ResultBuffer({ entriesMax: 10, bytesMax: 100 });
    c.add({ index: 0, ident: sum8, result: 0, bytes: 60 });
    expect(codeOf(() => c.add({ index: 1, ident: sum8, result: 0, bytes: 60 }))).toBe("CPR_CHECKPOINT");
  });

  it("takes results in index order and accepts a second copy of a held one only if identical", () => {
    const b = new ResultBuffer({ entriesMax: 10, bytesMax: 1000 });
    expect(codeOf(() => b.add({ index: 1, ident: sum8, result: 0, bytes: 8 }))).toBe("CPR_PROTOCOL");
    b.add({ index: 0, ident: sum8, result: 0, bytes: 8 });
    b.add({ index: 0, ident: sum8, result: 0, bytes: 8 }); // a transfer overlapping what we hold
    expect(b.count).toBe(1);
    expect(codeOf(() => b.add({ index: 0, ident: bcast8, result: 0, bytes: 8 }))).toBe("CPR_REPLAY");
  });

  it("drops the results below every rank's safe checkpoint, and ignores results below what it keeps", () => {
    const b = new ResultBuffer({ entriesMax: 10, bytesMax: 1000 });
    for (let i = 0; i < 4; i++) b.add({ index: i, ident: sum8, result: i, bytes: 8 });
    b.dropBelow(2);
    expect([b.from, b.to, b.count, b.bytes]).toEqual([2, 4, 2, 16]);
    expect(b.take(1, sum8)).toBeUndefined();
    b.add({ index: 1, ident: bcast8, result: 9, bytes: 8 }); // below the floor: nobody asks
    expect(b.count).toBe(2);
    b.resetTo(7); // a restored rank's buffer begins where it is given results
    expect([b.from, b.to, b.count, b.bytes]).toEqual([7, 7, 0, 0]);
    b.add({ index: 7, ident: sum8, result: 7, bytes: 8 });
    expect(b.take(7, sum8)?.result).toBe(7);
  });

  it("lists as dropped only the results it never handed out (a transfer or a replay may still hold the rest)", () => {
    const b = new ResultBuffer({ entriesMax: 100, bytesMax: 10_000 });
    for (let i = 0; i < 8; i++) b.add({ index: i, ident: sum8, result: `r${i}`, bytes: 8 });
    b.take(1, sum8); // served to this rank's program
    expect(b.slice(6).map((e) => e.index)).toEqual([6, 7]); // sent in a transfer
    expect(b.dropBelow(4)).toEqual(["r0", "r2", "r3"]);
    expect(b.dropBelow(8)).toEqual(["r4", "r5"]);
    for (let i = 8; i < 10; i++) b.add({ index: i, ident: sum8, result: `r${i}`, bytes: 8 });
    expect(b.dropBelow(10)).toEqual(["r8", "r9"]); // lending one result does not mark later ones
  });
});

describe("BootstrapCache", () => {
  it("serves a key to the same collective and rejects another (CPR_REPLAY)", () => {
    const c = new BootstrapCache(10);
    c.put({ key: "seed", ident: bcast8, result: 42 });
    expect(c.get("seed", bcast8)?.result).toBe(42);
    expect(c.get("other", bcast8)).toBeUndefined();
    expect(codeOf(() => c.get("seed", sum8))).toBe("CPR_REPLAY");
    expect(codeOf(() => c.put({ key: "seed", ident: sum8, result: 1 }))).toBe("CPR_REPLAY");
  });

  it("is bounded (MPI_BOOTSTRAP)", () => {
    const c = new BootstrapCache(1);
    c.put({ key: "a", ident: bcast8, result: 1 });
    expect(codeOf(() => c.put({ key: "b", ident: bcast8, result: 1 }))).toBe("MPI_BOOTSTRAP");
  });

  it("picks entries by key for a transfer", () => {
    const c = new BootstrapCache(10);
    c.put({ key: "a", ident: bcast8, result: 1 });
    c.put({ key: "b", ident: sum8, result: 2 });
    expect(c.pick(["b", "zz"]).map((e) => e.key)).toEqual(["b"]);
    expect(c.keys).toEqual(["a", "b"]);
  });
});
