/**
 * Goal: a timed block's clock (bench/lib/raw-proc.ts `startClock`, which every benchmark
 * process uses) counts the garbage collections that ran in the block: their pauses and how
 * many were full mark-compacts, and none that ran before it started; and it reports the size
 * of V8's young generation at the block's end, in MiB.
 *
 * Method: in this process, force full collections through V8's `gc` (exposed for the test
 * with `--expose-gc`) inside and outside clocked blocks. Milliseconds.
 */
import { getHeapSpaceStatistics, setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { describe, expect, it } from "vitest";
import { startClock } from "../../bench/lib/raw-proc.ts";

setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;
const turn = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

describe("startClock", () => {
  it("counts the full collections of its block, and their pauses", async () => {
    const stop = startClock();
    gc();
    gc();
    await turn();
    const t = stop();
    expect(t.majorGcs).toBe(2);
    expect(t.gcS).toBeGreaterThan(0);
    expect(t.gcS).toBeLessThanOrEqual(t.seconds);
  });

  it("does not count collections from before the block", async () => {
    // A block with a collection, then one without: the second counts none of the first's.
    const first = startClock();
    gc();
    await turn();
    first();
    const stop = startClock();
    await turn();
    const t = stop();
    expect(t.majorGcs).toBe(0);
  });

  it("reports the young generation's size at the block's end, in MiB", () => {
    const t = startClock()();
    const young = getHeapSpaceStatistics().find((s) => s.space_name === "new_space");
    expect(young).toBeDefined();
    // Nothing ran between the two reads that could resize it (no allocation to speak of).
    expect(t.youngMiB).toBe(young!.space_size / (1024 * 1024));
    expect(t.youngMiB).toBeGreaterThan(0);
  });
});
