/**
 * Goal: a rank (or a whole host) cut off from the job by a network partition, and later
 * reconnected, never changes a result. The cluster declares it dead after the failure timeout
 * and restarts it (retry-one: that rank alone; cpr: every rank from the last committed line)
 * while the old incarnation runs on in isolation; once the partition heals, the old
 * incarnation's frames reach the others and are refused by attempt, and it ends by itself
 * when its lease lapses (as the real watchdog ends a rank the coordinator stopped answering).
 *
 * Method: random programs over the seeded simulated network (src/testing/swarm.ts
 * runPartitionSeed) with watchdogs beating to the coordinator for a lease, the launcher's
 * failure detector, and cuts of 0.5–6 s against a 2 s failure timeout. Checked: results
 * bit-identical to the program's failure-free run; no rank takes a frame of an incarnation it
 * knows to be replaced (an invariant checked at every delivery, src/testing/sim-host.ts); every
 * incarnation declared dead while cut off has ended by the end of the run. `SEED=n` reproduces
 * one seed.
 *
 * Two failures are allowed, rarely, each a clear error, never a wrong result or a hang: in
 * cpr, an old incarnation that gets its messages again after the heal may open its part store
 * (one store shared by all hosts here) just when the launcher reads the recovery line for the
 * next restart, and the launcher fails the job with STORE_LOCKED (as src/launch/cpr-policy.ts
 * does); in retry-one, a second cut before a checkpoint re-replicated the first restarted
 * rank's state can take a checkpoint and all its replicas, or (on 2 ranks) restart every rank
 * (CPR_LOST, as in the crash swarm).
 */
import { describe, expect, it } from "vitest";
import { describeProgram } from "../../src/testing/programs.ts";
import { swarmSeeds } from "../../src/testing/prng.ts";
import { SimCluster, type SimProgram } from "../../src/testing/sim-cluster.ts";
import { runPartitionSeed } from "../../src/testing/swarm.ts";

describe("simulation: partitions", () => {
  for (const mode of ["retry-one", "cpr"] as const) {
    const seeds = swarmSeeds(2000);
    it(`${mode}: ranks and hosts cut off and reconnected: failure-free results, stale frames refused, old incarnations end (${seeds.length} seeds from ${seeds[0]})`, async () => {
      let partitions = 0;
      let declaredDead = 0;
      let leaseEnds = 0;
      let staleFrames = 0;
      let locked = 0;
      let beyond = 0;
      for (const seed of seeds) {
        const { spec, ref, out } = await runPartitionSeed(seed, mode).catch((err: unknown) => {
          throw new Error(`${(err as Error).message}\nsimulation failed, reproduce with SEED=${seed}`, { cause: err });
        });
        const where = `program: ${describeProgram(spec)}\nreproduce with SEED=${seed}\n${out.report}`;
        expect(ref.status, `reference run\n${where}`).toBe("ok");
        if (mode === "cpr" && out.status === "failed" && out.restartFailure === "STORE_LOCKED") {
          locked++;
          continue;
        }
        if (mode === "retry-one" && out.status === "failed" && out.aborts.length > 0 && out.aborts.every((a) => a.code === "CPR_LOST")) {
          beyond++;
          continue;
        }
        expect(out.status, where).toBe("ok");
        expect(out.results, `results differ from the failure-free ones\n${where}`).toEqual(ref.results);
        partitions += out.partitions;
        declaredDead += out.declaredDead;
        leaseEnds += out.leaseEnds.length;
        staleFrames += out.staleFrames;
      }
      if (seeds.length >= 100) {
        expect(partitions, "the seeds should cut ranks off").toBeGreaterThan(seeds.length / 2);
        expect(declaredDead, "some cuts should outlast the failure timeout").toBeGreaterThan(seeds.length / 10);
        expect(leaseEnds, "cut-off incarnations should end when their lease lapses").toBeGreaterThan(seeds.length / 10);
        // In cpr every rank restarts with new endpoints, so fewer old frames find a live receiver.
        expect(staleFrames, "frames of replaced incarnations should reach live ranks after a heal").toBeGreaterThan(0);
        expect(locked, "restarts stopped by an old incarnation's store lock should be rare").toBeLessThan(seeds.length / 100);
        expect(beyond, "failures beyond the replicas' coverage should be rare").toBeLessThan(seeds.length / 100);
      }
    }, 300_000);
  }
});

/**
 * Long enough for the detector (2 s failure timeout, checked every 250 ms) and a restart (100
 * ms back-off), short enough that the survivors still run when the cut heals.
 */
const CUT_MS = 2600;

describe("simulation: one rank cut off for 2.6 s", () => {
  for (const mode of ["retry-one", "cpr"] as const) {
    it(`${mode}: declared dead and restarted; the old incarnation ends by its lease (exit 75) and its frames are refused after the heal`, async () => {
      let staleFrames = 0;
      for (let seed = 1; seed <= 20; seed++) {
        const steps =
          (cut: ((rank: number) => void) | undefined): SimProgram =>
          async (world, ctx) => {
            const saved = await world.restore<{ i: number; x: number }>();
            const s = saved?.state ?? { i: 0, x: world.rank };
            while (s.i < 12) {
              // Rank 1's links fail in the middle of the job, just before it sends its part of a
              // collective: those frames wait in the cut.
              if (ctx.rank === 1 && ctx.attempt === 0 && s.i === 4) cut?.(1);
              s.x = await world.allreduce(s.x * 3 + s.i, "sum");
              s.i++;
              await world.checkpoint(s);
            }
            return s.x;
          };
        const ref = await new SimCluster({ seed, size: 3, mode: "none", policy: "fifo", program: steps(undefined) }).run();
        const cluster: SimCluster = new SimCluster({
          seed,
          size: 3,
          mode,
          stepsMax: 100_000,
          delayMaxMs: 20,
          advanceChance: 0.2,
          program: steps((rank) => cluster.partition([rank], CUT_MS)),
          ...(mode === "cpr" ? { cpr: { every: { ms: 20 } } } : { retryOne: { replicas: 1 } }),
          partitions: { chance: 0, max: 0, durationMs: [0, 0] },
        });
        const out = await cluster.run();
        const where = `SEED=${seed}\n${out.report}`;
        expect(out.status, where).toBe("ok");
        expect(out.results, where).toEqual(ref.results);
        expect(out.partitions, where).toBe(1);
        expect(out.declaredDead, where).toBeGreaterThanOrEqual(1);
        expect(
          out.leaseEnds.some((e) => e.rank === 1 && e.attempt === 0),
          where,
        ).toBe(true);
        staleFrames += out.staleFrames;
      }
      // In cpr every rank is restarted on new endpoints: the old incarnation's frames go to dead
      // nodes. In retry-one they reach the survivors, which know the new attempt by then.
      if (mode === "retry-one") expect(staleFrames, "the old incarnations' frames should reach the survivors after the heal").toBeGreaterThan(0);
    }, 60_000);
  }
});
