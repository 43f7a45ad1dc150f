/**
 * Goal: under `--mode cpr`, random programs with random crashes — of any rank, at any step,
 * also while a line is being recorded or written and while the job recovers — finish with
 * exactly their failure-free results, and every committed recovery line is a consistent cut
 * with complete channel logs.
 * Method: each seed picks a job size, a random program rich in checkpoint() locations, the
 * initiator's period, `--keep-lines`, a slow or fast simulated disk, network knobs and a crash
 * rate. The reference is the program's mode-none run under the reference schedule. The cpr run
 * restarts every rank from the last committed line after each crash (as the cpr policy does),
 * and its results must equal the reference bit for bit. Line invariants are checked as each
 * line commits (see checkLine in src/testing/invariants.ts), the network's after every step.
 * `SEED=n` reproduces one seed; a failure prints `reproduce with SEED=n`.
 */
import { describe, expect, it } from "vitest";
import { SimCluster } from "../../src/testing/sim-cluster.ts";
import { describeProgram, generateProgram, programOf } from "../../src/testing/programs.ts";
import { Prng, swarmSeeds } from "../../src/testing/prng.ts";
import { runCprSeed } from "../../src/testing/swarm.ts";

describe("simulation, mode cpr", () => {
  // Issue 3 asks for at least 2,000 seeded schedules in every CI run.
  const seeds = swarmSeeds(2000);
  it(`random crashes, restart-all: failure-free results and consistent lines (${seeds.length} seeds from ${seeds[0]})`, async () => {
    let restarts = 0;
    let lines = 0;
    let linesAfterRestart = 0;
    let bulk = 0;
    for (const seed of seeds) {
      try {
        const { spec, ref, out } = await runCprSeed(seed);
        const where = `program: ${describeProgram(spec)}`;
        expect(ref.status, `reference run\n${where}\n${ref.report}`).toBe("ok");
        expect(out.status, `cpr run\n${where}\n${out.report}`).toBe("ok");
        expect(out.results, `cpr results differ from the failure-free ones\n${where}\n${out.report}`).toEqual(ref.results);
        restarts += out.restarts;
        lines += out.linesCommitted.length;
        linesAfterRestart += out.linesAfterRestart;
        bulk += out.bulkFramesDelivered;
      } catch (err) {
        throw new Error(`${(err as Error).message}\nsimulation failed, reproduce with SEED=${seed}`, { cause: err });
      }
    }
    if (seeds.length >= 100) {
      expect(restarts, "the swarm should exercise restarts").toBeGreaterThan(0);
      expect(lines, "the swarm should commit lines").toBeGreaterThan(0);
      // A restored job goes on taking lines (regression: ranks restored from a line without
      // non-deterministic events never checkpointed again).
      expect(linesAfterRestart, "restored jobs should commit lines after their restart").toBeGreaterThan(0);
      // Half the seeds send their large messages on the bulk connection (simBulkBytesMin).
      expect(bulk, "the swarm should send bulk messages").toBeGreaterThan(0);
    }
  }, 600_000);
});

/**
 * Regression test for a driver bug this simulator found (traced at seeds 1005 and
 * 584390233557). After a crash every rank restores line L and the initiator may start round
 * L+1 at once. A restored rank then took checkpoint L+1 at its very next checkpoint() location,
 * before re-executing the sends its peers hold as early frames (and before replaying its log):
 * those frames moved into epoch L+1 although the line counts them in epoch L (CPR_PROTOCOL at
 * the next marker), or the replay log was cut short and a peer waited forever for a logged
 * outcome (a hang). Fixed: a restored rank defers a due checkpoint until its replay log is used
 * up and its suppressed re-sends have happened (RankMachine.mayCheckpoint).
 */
const KNOWN_SEEDS = [1005, 584390233557, 844451332005, 7000592, 7000618, 7001198, 7001274, 7001426, 7002718, 7002751];

describe("cpr bugs found by the simulator, as regression tests", () => {
  it("a restored rank does not checkpoint before replaying its line's logs (seeds that used to fail)", async () => {
    for (const seed of KNOWN_SEEDS) {
      const { ref, out } = await runCprSeed(seed);
      expect(out.status, `SEED=${seed}\n${out.report}`).toBe("ok");
      expect(out.results, `SEED=${seed}`).toEqual(ref.results);
    }
  }, 120_000);
});

/**
 * Regression test for a bug found in long swarm runs (rarer than 1 in 12,000 seeds): after a
 * restore, two operations in flight at once (here a reduce and a barrier) issued their sends to
 * a peer in another order than the recorded execution, because their progress depends on
 * arrival timing. Early frames were identified by their channel sequence number, so a sender
 * suppressed the wrong frame and re-sent one the receiver already held (MPI_COLLECTIVE_MISMATCH
 * for a stray frame). Fixed: early frames are identified by what they are (frameId in wire.ts:
 * collective sequence and step, or the frame's number among the channel's application frames).
 */
describe("cpr: early-frame identity survives reordered sends after a restore", () => {
  it("concurrent collectives after a restore keep early-frame suppression right (SEED=84356165557)", async () => {
    const { ref, out } = await runCprSeed(84356165557);
    expect(out.status, out.report).toBe("ok");
    expect(out.results).toEqual(ref.results);
  }, 60_000);
});

/**
 * A full disk: from line 2 on, one rank cannot write its part, so every later line aborts and
 * the job runs on without new lines. The ranks that did write their parts of an aborted line
 * delete them (cpr-aborted), so a full disk is not filled further by lines that will never be
 * used: at the end no rank holds a part of a line aborted while every rank was running.
 */
describe("cpr: lines aborted because a part could not be written leave no parts behind", () => {
  it("one rank's writes fail from line 2 on: the job finishes with failure-free results, and the aborted lines' parts are gone", async () => {
    let aborted = 0;
    for (let seed = 1; seed <= 60; seed++) {
      const prng = new Prng(seed);
      const size = prng.rangeInclusive(2, 4);
      const spec = generateProgram(prng.fork(1), { size, opsMax: 30, checkpointChance: 0.5 });
      const program = programOf(spec);
      const victim = prng.rangeInclusive(0, size - 1);
      const ref = await new SimCluster({ seed, size, mode: "none", program, policy: "fifo", stepsMax: 20_000 }).run();
      const out = await new SimCluster({
        seed,
        size,
        mode: "cpr",
        program,
        stepsMax: 60_000,
        cpr: { every: { ms: 20 }, keepLines: 2, slowDisk: prng.chance(0.5), failPartWrite: (rank, epoch) => rank === victim && epoch >= 2 },
        // Network delays make simulated time pass, so the initiator's rounds happen.
        delayMaxMs: prng.pick([5, 20, 100]),
        advanceChance: prng.pick([0.2, 0.4]),
      }).run();
      const where = `SEED=${seed}, program: ${describeProgram(spec)}\n${out.report}`;
      expect(out.status, where).toBe("ok");
      expect(out.results, where).toEqual(ref.results);
      expect(
        out.linesCommitted.every((e) => e < 2),
        where,
      ).toBe(true);
      const early = new Set(out.linesAborted.filter((a) => a.early).map((a) => a.epoch));
      aborted += early.size;
      for (const [rank, epochs] of out.partsLeft.entries()) {
        expect(
          epochs.filter((e) => early.has(e)),
          `rank ${rank} kept parts of aborted lines; ${where}`,
        ).toEqual([]);
      }
    }
    expect(aborted, "the seeds should abort lines").toBeGreaterThan(10);
  }, 120_000);
});
