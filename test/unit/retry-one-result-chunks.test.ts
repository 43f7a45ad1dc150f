/**
 * Goal: retry-one keeps a collective's result for the survivors' buffers as the chunks the
 * algorithm received it in below 512 KiB and from 16 MiB on, and as a pooled copy between
 * (src/mpi/modes/retry-one.ts, keepsResultChunks; the bounds are measured there).
 *
 * Method: the decision at and around each bound. The integration test of 16 MiB allreduces
 * (test/integration/retry-one.test.ts, fixture test/fixtures/retry-one/large.ts: 2 Mi Float64
 * elements, exactly 16 MiB) relies on results of exactly 16 MiB being kept as chunks: that is
 * the path it serves a restarted rank from. That the allreduce offers its chunks for those
 * results at all is checked in test/unit/collectives.test.ts.
 */
import { describe, expect, it } from "vitest";
import { keepsResultChunks } from "../../src/mpi/modes/retry-one.ts";

const KiB = 1024;
const MiB = 1024 * KiB;

describe("retry-one: how a result is kept for the buffers", () => {
  it("as its chunks below 512 KiB and from 16 MiB, as a pooled copy between", () => {
    for (const bytes of [8, 64 * KiB, 512 * KiB - 8]) expect(keepsResultChunks(bytes), `${bytes}`).toBe(true);
    for (const bytes of [512 * KiB, MiB, 4 * MiB, 16 * MiB - 8]) expect(keepsResultChunks(bytes), `${bytes}`).toBe(false);
    // 16 MiB exactly: the integration fixture's results (see above).
    for (const bytes of [16 * MiB, 64 * MiB]) expect(keepsResultChunks(bytes), `${bytes}`).toBe(true);
  });
});
