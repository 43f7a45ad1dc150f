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
import { describeProgram } from "../../src/testing/programs.ts";
import { swarmSeeds } from "../../src/testing/prng.ts";
import type { SimOutcome } from "../../src/testing/sim-cluster.ts";
import { runCprSeed } from "../../src/testing/swarm.ts";

const STRICT = process.env.SIM_STRICT === "1";


/** Known driver bug (see the KNOWN block): a restored sender's next marker undercounts early frames. */
function knownMarkerBug(out: SimOutcome): boolean {
  return out.aborts.some((a) => a.code === "CPR_PROTOCOL" && /arrived before its marker/.test(a.message));
}

/**
 * Known driver bug (see the KNOWN block): a restored rank that takes its next checkpoint before
 * replaying its line's log drops the rest of the log; peers replay outcomes that depended on it.
 */
function knownReplayHang(out: SimOutcome): boolean {
  return out.status === "hang" && out.restarts > 0;
}

describe("simulation, mode cpr", () => {
  const seeds = swarmSeeds(600);
  it(`random crashes, restart-all: failure-free results and consistent lines (${seeds.length} seeds from ${seeds[0]})`, async () => {
    const known: number[] = [];
    let restarts = 0;
    let lines = 0;
    for (const seed of seeds) {
      try {
        const { spec, ref, out } = await runCprSeed(seed);
        const where = `program: ${describeProgram(spec)}`;
        expect(ref.status, `reference run\n${where}\n${ref.report}`).toBe("ok");
        if (!STRICT && ((out.status === "failed" && knownMarkerBug(out)) || knownReplayHang(out))) {
          known.push(seed);
          continue;
        }
        expect(out.status, `cpr run\n${where}\n${out.report}`).toBe("ok");
        expect(out.results, `cpr results differ from the failure-free ones\n${where}\n${out.report}`).toEqual(ref.results);
        restarts += out.restarts;
        lines += out.linesCommitted.length;
      } catch (err) {
        throw new Error(`${(err as Error).message}\nsimulation failed, reproduce with SEED=${seed}`, { cause: err });
      }
    }
    if (known.length > 0) console.warn(`known cpr bugs (checkpoint taken too early after a restore: CPR_PROTOCOL marker count, or replay divergence hang): seeds ${known.join(", ")}`);
    if (seeds.length >= 100) {
      expect(restarts, "the swarm should exercise restarts").toBeGreaterThan(0);
      expect(lines, "the swarm should commit lines").toBeGreaterThan(0);
    }
  }, 600_000);
});

/**
 * Known driver bug, found by this simulator. Mechanism (traced at seed 1005): line 1 is taken at
 * a checkpoint() location; rank 0 then sends a frame to rank 2 in epoch 1, which rank 2
 * receives before its own checkpoint (an early frame, listed in rank 2's part). After a crash
 * every rank restores line 1; the initiator starts round 2 at once, so rank 0 takes checkpoint 2
 * at its very next checkpoint() location — before it re-executes (and suppresses) that send,
 * which now belongs to epoch 2. But RankMachine.restore counted rank 2's early ids as arrivals
 * of epoch 1, so rank 0's epoch-1 marker ("sent 0") disagrees: CPR_PROTOCOL, the job fails.
 * Fix idea: leave early (suppressed) frames out of both counts (markers count frames actually
 * transmitted; restore does not pre-count early ids), or keep a restored rank from taking a
 * checkpoint until its peers' early lists for it are used up.
 * The repro uses the swarm's generator: if the generator changes, find a new seed with
 * `SIM_SEEDS=3000 SEED_BASE=0 npx vitest run test/sim/cpr.sim.test.ts` (the warning lists them).
 */
/** Swarm seeds that showed one of the two known symptoms (with the generator of 2026-11-21). */
const KNOWN_SEEDS = [1005, 584390233557, 844451332005, 7000592, 7000618, 7001198, 7001274, 7001426, 7002718, 7002751];

describe("KNOWN cpr bugs (remove .fails when fixed)", () => {
  /**
   * Same root cause, worse symptom (traced at this seed): line 1 has rank 2 at op 1 and ranks
   * 0, 1 at op 3. Recording, rank 2 draws nondet at op 5 (logged, ordinal 0) and sends a token
   * to rank 1, whose wildcard receive logs "matched source 2". After a crash all restore line 1;
   * round 2 is already due, so rank 2 takes checkpoint 2 at op 3 — which resets its replay log
   * before op 5 — then draws a fresh value and sends its token elsewhere, while rank 1 replays
   * "match source 2" and waits forever: the job hangs (no error, no timeout).
   * Fix idea: a restored rank defers checkpointDue until its nondet log is replayed to the end
   * and its peers' early lists for it are used up (it cannot be inside the recorded stretch
   * and start a new line at once).
   */
  it.fails("a restored rank checkpoints before replaying its line's logs: CPR_PROTOCOL marker mismatch or a replay-divergence hang at some known seed", async () => {
    // Any schedule change (in World or the generator) moves which seeds show it: if this starts
    // failing without a fix, refresh KNOWN_SEEDS from the swarm's warning line.
    const hit: string[] = [];
    for (const seed of KNOWN_SEEDS) {
      const { out } = await runCprSeed(seed);
      if (knownMarkerBug(out) || knownReplayHang(out)) hit.push(`SEED=${seed}: ${out.status} ${JSON.stringify(out.aborts)}`);
    }
    expect(hit).toEqual([]);
  }, 120_000);
});
