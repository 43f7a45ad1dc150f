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
import { describeProgram, generateProgram, type ProgramSpec, programOf } from "../../src/testing/programs.ts";
import { Prng, swarmSeeds } from "../../src/testing/prng.ts";
import { SimCluster, type SimOutcome } from "../../src/testing/sim-cluster.ts";

const SEEDS = swarmSeeds(2000);

export async function runNoneSeed(seed: number): Promise<{ spec: ProgramSpec; ref: SimOutcome; out: SimOutcome }> {
  const prng = new Prng(seed);
  const size = prng.rangeInclusive(2, 4);
  const spec = generateProgram(prng.fork(1), { size, opsMax: 10 });
  const program = programOf(spec);
  const knobs = prng.fork(2);
  const ref = await new SimCluster({ seed, size, mode: "none", program, policy: "fifo", stepsMax: 20_000 }).run();
  const out = await new SimCluster({
    seed, size, mode: "none", program, policy: "random", stepsMax: 20_000,
    delayMaxMs: knobs.pick([0, 0, 2, 20, 400]),
    advanceChance: knobs.pick([0, 0.01, 0.1, 0.3]),
    stickyChance: knobs.pick([0, 0.5, 0.9]),
  }).run();
  return { spec, ref, out };
}

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
    for (const seed of SEEDS) {
      try {
        const r = await runNoneSeed(seed);
        steps += r.out.steps;
        check(seed, r);
      } catch (err) {
        throw new Error(`${(err as Error).message}\nsimulation failed, reproduce with SEED=${seed}`, { cause: err });
      }
    }
    expect(steps).toBeGreaterThan(0);
  }, 600_000);
});
