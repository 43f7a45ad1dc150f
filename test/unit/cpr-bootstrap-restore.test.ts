/**
 * A bootstrap collective's result travels in every checkpoint (the lib state) and a restored
 * rank gets it from there instead of running the collective again. What the program gets is its
 * own: changing it must not change the bytes kept for the next checkpoint and the next restore.
 */
import { describe, expect, it } from "vitest";
import { encodeValue } from "../../src/mpi/codec.ts";
import { arrayViewsIn } from "./array-views.ts";
import { fakeRank } from "./cpr-driver-fakes.ts";

describe("a bootstrap result after a restore", () => {
  it("is the program's to change: given again, it is the result as it was kept", async () => {
    const results: [string, unknown][] = [
      ["bytes", Buffer.from("partition-0123456789")],
      ["u8", new Uint8Array([1, 2, 3, 4])],
      ["f64", new Float64Array([0.5, 1.5, 2.5])],
      ["object", { seed: 42, w: new Int16Array([7, -7]) }],
    ];
    const r = fakeRank(0, { size: 1 });
    const lib = encodeValue({ channelSeqOut: [0], bootstrap: results.map(([k, v]) => [k, encodeValue(v)]) });
    r.own.set(1, encodeValue({ v: 1, epoch: 1, state: encodeValue({ step: 4 }), global: null, lib, early: [], late: [], nondet: [] }));
    await r.driver.beforeStart(r.restoreTable(1));
    await r.driver.afterStart();
    for (const [key, kept] of results) {
      const got = r.driver.bootstrapResult(key)!.value;
      expect(got).toEqual(kept);
      for (const a of arrayViewsIn(got)) new Uint8Array(a.buffer, a.byteOffset, a.byteLength).fill(0xee);
      expect(r.driver.bootstrapResult(key)!.value, key).toEqual(kept);
    }
  });
});
