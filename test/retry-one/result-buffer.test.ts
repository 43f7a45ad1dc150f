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
  it("serves (version, seqno) to the same collective", () => {
    const b = new ResultBuffer({ entriesMax: 10, bytesMax: 1000 });
    b.add({ version: 0, seqno: 0, ident: sum8, result: "r0", bytes: 64 });
    b.add({ version: 0, seqno: 1, ident: bcast8, result: "r1", bytes: 64 });
    expect(b.take(0, 1, bcast8)?.result).toBe("r1");
    expect(b.take(0, 2, sum8)).toBeUndefined();
    expect(b.count).toBe(2);
    expect(b.bytes).toBe(128);
  });

  it("rejects replay with another op, root, type or length (CPR_REPLAY), never a mixed result", () => {
    const b = new ResultBuffer({ entriesMax: 10, bytesMax: 1000 });
    b.add({ version: 0, seqno: 0, ident: sum8, result: "r0", bytes: 8 });
    expect(codeOf(() => b.take(0, 0, bcast8))).toBe("CPR_REPLAY");
    expect(codeOf(() => b.take(0, 0, { ...sum8, length: 9 }))).toBe("CPR_REPLAY");
    expect(codeOf(() => b.take(0, 0, { ...sum8, type: "Float32Array" }))).toBe("CPR_REPLAY");
    expect(codeOf(() => b.take(0, 0, { ...sum8, op: "allreduce:max" }))).toBe("CPR_REPLAY");
    expect(codeOf(() => b.take(0, 0, { ...bcast8, root: 1 }))).toBe("CPR_REPLAY");
  });

  it("is bounded by entries and bytes with a clear CPR_CHECKPOINT error", () => {
    const b = new ResultBuffer({ entriesMax: 2, bytesMax: 1000 });
    b.add({ version: 0, seqno: 0, ident: sum8, result: 0, bytes: 8 });
    b.add({ version: 0, seqno: 1, ident: sum8, result: 0, bytes: 8 });
    expect(() => b.add({ version: 0, seqno: 2, ident: sum8, result: 0, bytes: 8 })).toThrow(/resultEntriesMax 2.*call checkpoint\(\) more often/);
    const c = new ResultBuffer({ entriesMax: 10, bytesMax: 100 });
    c.add({ version: 0, seqno: 0, ident: sum8, result: 0, bytes: 60 });
    expect(codeOf(() => c.add({ version: 0, seqno: 1, ident: sum8, result: 0, bytes: 60 }))).toBe("CPR_CHECKPOINT");
  });

  it("takes results in seqno order and accepts a second copy of a held one only if identical", () => {
    const b = new ResultBuffer({ entriesMax: 10, bytesMax: 1000 });
    expect(codeOf(() => b.add({ version: 0, seqno: 1, ident: sum8, result: 0, bytes: 8 }))).toBe("CPR_PROTOCOL");
    b.add({ version: 0, seqno: 0, ident: sum8, result: 0, bytes: 8 });
    b.add({ version: 0, seqno: 0, ident: sum8, result: 0, bytes: 8 }); // a transfer overlapping what we hold
    expect(b.count).toBe(1);
    expect(codeOf(() => b.add({ version: 0, seqno: 0, ident: bcast8, result: 0, bytes: 8 }))).toBe("CPR_REPLAY");
    expect(codeOf(() => b.add({ version: 1, seqno: 1, ident: sum8, result: 0, bytes: 8 }))).toBe("CPR_PROTOCOL");
  });

  it("is emptied by a committed checkpoint (reset to the new version)", () => {
    const b = new ResultBuffer({ entriesMax: 10, bytesMax: 1000 });
    b.add({ version: 0, seqno: 0, ident: sum8, result: 0, bytes: 8 });
    b.reset(1);
    expect(b.version).toBe(1);
    expect(b.count).toBe(0);
    expect(b.bytes).toBe(0);
    expect(b.take(0, 0, sum8)).toBeUndefined();
  });

  it("lists at reset only the results it never handed out (a transfer or a replay may still hold the rest)", () => {
    const fill = (b: ResultBuffer, version: number, n: number): void => {
      for (let s = 0; s < n; s++) b.add({ version, seqno: s, ident: sum8, result: `v${version}s${s}`, bytes: 8 });
    };
    const b = new ResultBuffer({ entriesMax: 10, bytesMax: 1000 });
    fill(b, 0, 4);
    expect(b.reset(1)).toEqual(["v0s0", "v0s1", "v0s2", "v0s3"]);
    fill(b, 1, 4);
    b.from(2); // seqnos 2 and 3 go out in a transfer
    expect(b.reset(2)).toEqual(["v1s0", "v1s1"]);
    fill(b, 2, 4);
    b.take(2, 1, sum8); // served to this rank's program from seqno 1 on
    b.from(3);
    expect(b.reset(3)).toEqual(["v2s0"]);
    fill(b, 3, 2);
    expect(b.reset(4)).toEqual(["v3s0", "v3s1"]); // lending does not outlive its version
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
