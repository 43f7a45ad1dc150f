/**
 * Goal: every `--kill` form of docs/cli.md parses to the per-rank fault trigger the rank side
 * understands, bad specs are refused with a message naming them, and random kills are
 * reproducible from the seed and land inside what the reference run did.
 *
 * Method: pure calls of src/launch/drill-spec.ts; every produced trigger is re-checked with
 * the rank side's own parser (src/mpi/faults.ts). Seeds are fixed.
 */
import { describe, expect, it } from "vitest";
import { parseFaults } from "../../src/mpi/faults.ts";
import { deriveSeed, describeTrigger, DrillPrng, parseKillSpec, parseKillSpecs, planFaults, type KillSpec } from "../../src/launch/drill-spec.ts";
import { usageMessage } from "./helpers.ts";

const reference = { stepsByRank: [40, 40, 40, 40], computeMsByRank: [2_000, 2_000, 2_000, 2_000] };

describe("parseKillSpec", () => {
  it.each([
    ["1@step:5", 1, "step:5", undefined],
    ["2@time:1.5s", 2, "time:1500", undefined],
    ["2@time:800ms", 2, "time:800", undefined],
    ["0@time:250", 0, "time:250", undefined],
    ["0@send:100", 0, "send:100", undefined],
    ["3@hang:step:3", 3, "hang:step:3", undefined],
    ["1@hang:time:2s", 1, "hang:time:2000", undefined],
    ["1@step:2@attempt=1", 1, "step:2", 1],
  ])("%s → rank %i, trigger %s", (text, rank, trigger, attempt) => {
    const spec = parseKillSpec(text, 4);
    expect(spec).toEqual({ kind: "rank", text, rank, trigger, attempt });
    expect(() => parseFaults(trigger)).not.toThrow();
  });

  it("reads Rabit's mock=rank,version,seqno,ndeath as a mock trigger in attempt ndeath", () => {
    expect(parseKillSpec("mock=1,2,0,1", 4)).toEqual({ kind: "rank", text: "mock=1,2,0,1", rank: 1, trigger: "mock:2,0", attempt: 1 });
  });

  it("reads random:K", () => {
    expect(parseKillSpec("random:3", 4)).toEqual({ kind: "random", text: "random:3", count: 3 });
  });

  it.each([
    ["5@step:1", /rank 5 is outside 0\.\.3/],
    ["1@step:0", /counts start at 1/],
    ["1@frob:3", /unknown trigger "frob"/],
    ["x@step:1", /"x" is not a rank number/],
    ["1@time:soon", /not a duration/],
    ["random:0", /random:K needs a count K from 1/],
    ["random:x", /random:K/],
    ["mock=1,2,3", /mock=rank,version,seqno,ndeath/],
    ["mock=9,0,0,0", /rank 9 is outside/],
    ["step:5", /--kill "step:5"/],
  ])("refuses %s", (text, pattern) => {
    const message = usageMessage(() => parseKillSpec(text, 4));
    expect(message).toMatch(pattern);
    expect(message).toMatch(/--kill/);
    expect(message).not.toMatch(/--inject/);
  });

  it("reports every bad spec at once", () => {
    const message = usageMessage(() => parseKillSpecs(["1@step:0", "1@step:3", "random:0"], 4));
    expect(message.split("\n")).toHaveLength(2);
  });
});

describe("planFaults", () => {
  const specs = (...texts: string[]): KillSpec[] => parseKillSpecs(texts, 4);

  it("puts the kth fault of a run in attempt k (restart-all), unless the spec names one", () => {
    const plan = planFaults(specs("1@step:5", "2@time:1s", "mock=0,1,0,0"), { size: 4, mode: "cpr", seed: 1, reference });
    expect(plan.map((f) => [f.rank, f.trigger, f.attempt])).toEqual([
      [1, "step:5", 0],
      [2, "time:1000", 1],
      [0, "mock:1,0", 0],
    ]);
    expect(plan[0]!.stepsBefore).toBe(4);
    expect(plan.map((f) => f.index)).toEqual([1, 2, 3]);
  });

  it("in retry-one counts attempts per rank", () => {
    const plan = planFaults(specs("1@step:5", "2@step:5", "1@step:7"), { size: 4, mode: "retry-one", seed: 1, reference });
    expect(plan.map((f) => f.attempt)).toEqual([0, 0, 1]);
  });

  it("draws the same random kills from the same seed, inside the reference run's steps and time", () => {
    const a = planFaults(specs("random:20"), { size: 4, mode: "cpr", seed: 42, reference });
    const b = planFaults(specs("random:20"), { size: 4, mode: "cpr", seed: 42, reference });
    const c = planFaults(specs("random:20"), { size: 4, mode: "cpr", seed: 43, reference });
    expect(a).toEqual(b);
    expect(a).not.toEqual(c);
    const kinds = new Set<string>();
    for (const f of a) {
      expect(f.rank).toBeGreaterThanOrEqual(0);
      expect(f.rank).toBeLessThan(4);
      const step = /^step:(\d+)$/.exec(f.trigger);
      const time = /^time:(\d+)$/.exec(f.trigger);
      if (step !== null) {
        kinds.add("step");
        expect(Number(step[1])).toBeGreaterThanOrEqual(1);
        expect(Number(step[1])).toBeLessThan(40);
      } else {
        expect(time).not.toBeNull();
        kinds.add("time");
        expect(Number(time![1])).toBeGreaterThanOrEqual(200);
        expect(Number(time![1])).toBeLessThanOrEqual(1_600);
      }
      expect(() => parseFaults(`${f.trigger}@attempt=${f.attempt}`)).not.toThrow();
    }
    expect(kinds).toEqual(new Set(["step", "time"]));
    expect(a.map((f) => f.attempt)).toEqual(a.map((_, k) => k));
  });

  it("falls back to step kills for a program too quick to time", () => {
    const plan = planFaults(specs("random:5"), { size: 2, mode: "cpr", seed: 7, reference: { stepsByRank: [10, 10], computeMsByRank: [5, 5] } });
    for (const f of plan) expect(f.trigger).toMatch(/^step:\d$/);
  });

  it("needs a reference to place random kills", () => {
    expect(usageMessage(() => planFaults(specs("random:1"), { size: 4, mode: "cpr", seed: 1, reference: undefined }))).toMatch(/reference run/);
  });
});

describe("seeds", () => {
  it("repetition 0 uses the seed itself; later ones differ and are reproducible", () => {
    expect(deriveSeed(1234, 0)).toBe(1234);
    const seeds = [0, 1, 2, 3, 4].map((k) => deriveSeed(1234, k));
    expect(new Set(seeds).size).toBe(5);
    expect([0, 1, 2, 3, 4].map((k) => deriveSeed(1234, k))).toEqual(seeds);
  });

  it("the PRNG is uniform enough and stays in range", () => {
    const prng = new DrillPrng(99);
    const counts = new Array<number>(4).fill(0);
    for (let i = 0; i < 4_000; i++) counts[prng.index(4)]!++;
    for (const c of counts) expect(c).toBeGreaterThan(850);
    for (let i = 0; i < 1_000; i++) {
      const v = prng.rangeInclusive(3, 5);
      expect(v >= 3 && v <= 5).toBe(true);
    }
  });

  it("describes time triggers with units", () => {
    expect(describeTrigger("time:1500")).toBe("time:1.5s");
    expect(describeTrigger("hang:time:800")).toBe("hang:time:800ms");
    expect(describeTrigger("step:5")).toBe("step:5");
  });
});
