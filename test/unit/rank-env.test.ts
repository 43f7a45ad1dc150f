import { describe, expect, it } from "vitest";
import { resolveRankPlace } from "../../src/mpi/env.ts";

/** The environment a launcher gives rank 0 of 2, plus `extra`. */
const envWith = (extra: NodeJS.ProcessEnv): NodeJS.ProcessEnv => ({
  LIFELINE_RANK: "0",
  LIFELINE_SIZE: "2",
  LIFELINE_COORDINATOR: "ipc:///tmp/x/coordinator",
  ...extra,
});

describe("a rank's place from its environment", () => {
  it("paces its collections unless LIFELINE_GC_PACING=0 (--no-gc-pacing)", () => {
    expect(resolveRankPlace({}, envWith({})).gcPacing).toBe(true);
    expect(resolveRankPlace({}, envWith({ LIFELINE_GC_PACING: "" })).gcPacing).toBe(true);
    expect(resolveRankPlace({}, envWith({ LIFELINE_GC_PACING: "1" })).gcPacing).toBe(true);
    expect(resolveRankPlace({}, envWith({ LIFELINE_GC_PACING: "0" })).gcPacing).toBe(false);
  });

  it("refuses any other LIFELINE_GC_PACING with MPI_INIT, naming the variable and the value", () => {
    expect(() => resolveRankPlace({}, envWith({ LIFELINE_GC_PACING: "off" }))).toThrow(
      expect.objectContaining({ code: "MPI_INIT", message: 'LIFELINE_GC_PACING="off" is not 0 or 1' }),
    );
  });
});
