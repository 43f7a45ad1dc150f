/**
 * Goal: a seed is a complete description of a simulated run — `SEED=n` must replay it event
 * for event — and a crash in mode none fails a random program's job fast, never a hang.
 * Method: run seeds twice (random programs; in cpr with crashes, slow disk and restarts) and
 * compare everything observable: steps, simulated time, frames, restarts, lines, results and
 * the event trace. Then random programs in mode none with one random crash: the job must end
 * (bounded steps), failed, with every rank crashed, aborted or exited.
 */
import { describe, expect, it } from "vitest";
import { generateProgram, programOf } from "../../src/testing/programs.ts";
import { Prng, swarmSeeds } from "../../src/testing/prng.ts";
import { SimCluster } from "../../src/testing/sim-cluster.ts";
import { runCprSeed, runNoneSeed } from "../../src/testing/swarm.ts";

describe("simulation: a seed replays exactly", () => {
  it("mode none and mode cpr (with crashes and restarts): identical runs", async () => {
    for (const seed of swarmSeeds(15)) {
      const a = await runNoneSeed(seed);
      const b = await runNoneSeed(seed);
      expect(b.out.report, `reproduce with SEED=${seed}`).toBe(a.out.report);
      expect(b.out.results).toEqual(a.out.results);
      const c = await runCprSeed(seed);
      const d = await runCprSeed(seed);
      expect([d.out.steps, d.out.simMs, d.out.framesDelivered, d.out.restarts, d.out.linesCommitted], `reproduce with SEED=${seed}`).toEqual([
        c.out.steps,
        c.out.simMs,
        c.out.framesDelivered,
        c.out.restarts,
        c.out.linesCommitted,
      ]);
      expect(d.out.report, `reproduce with SEED=${seed}`).toBe(c.out.report);
    }
  }, 120_000);
});

describe("simulation: a crash in mode none", () => {
  const seeds = swarmSeeds(300);
  it(`fails the job with every rank ended, never a hang (${seeds.length} seeds from ${seeds[0]})`, async () => {
    for (const seed of seeds) {
      const prng = new Prng(seed);
      const size = prng.rangeInclusive(2, 4);
      const spec = generateProgram(prng.fork(1), { size, opsMax: 10 });
      const out = await new SimCluster({
        seed,
        size,
        mode: "none",
        program: programOf(spec),
        stepsMax: 20_000,
        crashChance: 0.05,
        crashesMax: 1,
        delayMaxMs: 10,
        advanceChance: 0.1,
      }).run();
      const msg = `${out.report}\nreproduce with SEED=${seed}`;
      expect(out.status, msg).not.toBe("hang");
      // A crash after the release (every result in) is no failure; any earlier one is.
      if (out.status !== "ok" || out.ends.some((e) => e.kind === "crashed" && out.results[out.ends.indexOf(e)] === undefined)) {
        expect(out.status, msg).toBe("failed");
        for (const e of out.ends) expect(["crashed", "rejected", "exited"], msg).toContain(e.kind);
      }
    }
  }, 300_000);
});
