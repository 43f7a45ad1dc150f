/**
 * Goal: in mode none the communicator gives every legal schedule the failure-free answer.
 * Method (swarm testing, as TigerBeetle's VOPR): each seed picks a job size (2–4 ranks), a
 * random program (p2p in every receive style, every collective, wildcards, nondet,
 * checkpoints) and network knobs (delays, early clock advances, bursts from one channel).
 * The program runs once under the reference schedule (oldest event first) and once under the
 * seeded random schedule; every rank must finalize, with digests equal to the reference's,
 * and collectives whose result is common must agree across ranks. Invariants are checked
 * after every step. `SEED=n` runs one seed; `SIM_SEEDS=n` changes the count; a failure
 * prints `reproduce with SEED=n`.
 */
import { describe, expect, it } from "vitest";
import { describeProgram } from "../../src/testing/programs.ts";
import { swarmSeeds } from "../../src/testing/prng.ts";
import { runNoneSeed } from "../../src/testing/swarm.ts";

const SEEDS = swarmSeeds(2000);

function check(seed: number, { spec, ref, out }: Awaited<ReturnType<typeof runNoneSeed>>): void {
  const where = `program: ${describeProgram(spec)}`;
  expect(ref.status, `reference run\n${where}\n${ref.report}`).toBe("ok");
  expect(out.status, `random schedule\n${where}\n${out.report}`).toBe("ok");
  expect(out.results, `random schedule differs from the reference\n${where}`).toEqual(ref.results);
  // Results every rank shares must agree across ranks.
  const digests = ref.results.map((r) => (r as { ops: string[] }).ops);
  spec.ops.forEach((op, i) => {
    if (op.kind === "coll" && ["barrier", "bcast", "allreduce", "allgather"].includes(op.coll.kind)) {
      for (const d of digests) expect(d[i], `op ${i} (${op.coll.kind}) differs across ranks\n${where}`).toBe(digests[0]![i]);
    }
  });
  void seed;
}

describe("simulation, mode none", () => {
  it(`every schedule of a random program gives the reference result (${SEEDS.length} seeds from ${SEEDS[0]})`, async () => {
    let steps = 0;
    let bulk = 0;
    for (const seed of SEEDS) {
      try {
        const r = await runNoneSeed(seed);
        steps += r.out.steps;
        bulk += r.out.bulkFramesDelivered;
        check(seed, r);
      } catch (err) {
        throw new Error(`${(err as Error).message}\nsimulation failed, reproduce with SEED=${seed}`, { cause: err });
      }
    }
    expect(steps).toBeGreaterThan(0);
    // Half the seeds send their large messages on the bulk connection (simBulkBytesMin).
    if (SEEDS.length >= 100) expect(bulk, "the swarm should send bulk messages").toBeGreaterThan(0);
  }, 600_000);
});
