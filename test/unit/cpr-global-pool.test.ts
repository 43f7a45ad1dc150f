/**
 * A large `global` is saved into pooled memory, which the next checkpoint reuses once the line
 * is committed (a copy into fresh memory faults in every page). Reuse must never change a part:
 * the memory goes back only after the line's commit, never after an abort (its part may still
 * be being written from it).
 */
import { afterEach, describe, expect, it, vi } from "vitest";
import { BouncePool } from "../../src/mpi/bounce-pool.ts";
import { decodeValue } from "../../src/mpi/codec.ts";
import { fakeRank, round, settle } from "./cpr-driver-fakes.ts";

const model = (seed: number) => Float64Array.from({ length: 1 << 18 }, (_, i) => Math.sin(i * seed)); // 2 MiB

function globalOf(part: Buffer): Float64Array {
  return decodeValue((decodeValue(part) as { global: Buffer }).global) as Float64Array;
}

/** The memory blocks the pool hands out, in order. */
function poolBlocks(): ArrayBuffer[] {
  const acquired: ArrayBuffer[] = [];
  const acquire = BouncePool.prototype.acquire;
  vi.spyOn(BouncePool.prototype, "acquire").mockImplementation(function (this: BouncePool, bytes: number) {
    const b = acquire.call(this, bytes);
    acquired.push(b.buffer as ArrayBuffer);
    return b;
  });
  return acquired;
}

afterEach(() => vi.restoreAllMocks());

describe("saved globals in pooled memory", () => {
  it("a committed line's memory serves the next checkpoint; every part keeps its own global", async () => {
    const acquired = poolBlocks();
    const a = fakeRank(0, { size: 1 });
    await a.driver.beforeStart(a.table);
    await round(a, 1, { step: 1 }, model(1));
    a.driver.onControl({ t: "cpr-committed", epoch: 1, keep: [1] });
    await settle();
    await round(a, 2, { step: 2 }, model(2));
    expect(acquired).toHaveLength(2);
    expect(acquired[1]).toBe(acquired[0]); // the same memory, reused
    expect(globalOf(a.own.get(1)!)).toEqual(model(1));
    expect(globalOf(a.own.get(2)!)).toEqual(model(2));
  });

  it("an aborted line's memory is not reused", async () => {
    const acquired = poolBlocks();
    const a = fakeRank(0, { size: 1 });
    await a.driver.beforeStart(a.table);
    await round(a, 1, { step: 1 }, model(1));
    a.driver.onControl({ t: "cpr-aborted", epoch: 1 });
    await settle();
    await round(a, 2, { step: 2 }, model(2));
    a.driver.onControl({ t: "cpr-committed", epoch: 2, keep: [2] });
    await settle();
    await round(a, 3, { step: 3 }, model(3));
    expect(acquired).toHaveLength(3);
    expect(acquired[1]).not.toBe(acquired[0]);
    expect(acquired[2]).toBe(acquired[1]);
    expect(globalOf(a.own.get(2)!)).toEqual(model(2));
    expect(globalOf(a.own.get(3)!)).toEqual(model(3));
  });
});
