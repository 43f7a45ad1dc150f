/**
 * Goal: under `--mode elastic`, random collective programs with random kills — of any rank
 * process at any step: in a collective or a checkpoint, while a change of the world is being
 * settled, a joiner while its state is sent to it, the root sending it — either finish, with
 * results bit-identical to a fault-free replay of the changes the run went through, or stop
 * with one of the two clear errors the design allows (fewer ranks than --min-np after the
 * wait; no rank holding the job's state left, or a rank lost during the bootstrap
 * collectives). Never a hang.
 * Method: the real World, the real elastic driver and the real coordinator machine of elastic
 * jobs over the seeded simulated network (src/testing/sim-elastic.ts); the replay runs the
 * recorded changes without faults under the reference schedule. `SEED=n` reproduces one seed;
 * a failure prints `reproduce with SEED=n`.
 */
import { describe, expect, it } from "vitest";
import { swarmSeeds } from "../../src/testing/prng.ts";
import { runElasticSeed } from "../../src/testing/sim-elastic.ts";

describe("simulation, mode elastic", () => {
  const seeds = swarmSeeds(2000);
  it(`random kills at any step, also during changes: results equal a fault-free replay of the changes (${seeds.length} seeds from ${seeds[0]})`, async () => {
    const seen = { ok: 0, tooFew: 0, noState: 0, changes: 0, rollbacks: 0, grows: 0, transfers: 0, inRound: 0, joiner: 0, root: 0 };
    for (const seed of seeds) {
      try {
        const { spec, out, replay } = await runElasticSeed(seed);
        const where = `program: ${JSON.stringify(spec)}\n${out.report}`;
        if (out.status === "failed" && out.failure !== undefined && out.crashes > 0) {
          // The two ends the design allows, each only after a rank was lost.
          if (out.failure.code === "LAUNCH_TOO_FEW") {
            seen.tooFew++;
            continue;
          }
          if (out.failure.code === "CPR_RESTORE" && /no rank that holds the job's state|bootstrap collectives/.test(out.failure.message)) {
            seen.noState++;
            continue;
          }
        }
        expect(out.status, where).toBe("ok");
        expect(replay?.status, `the replay of ${JSON.stringify(out.changes)}\n${replay?.report}`).toBe("ok");
        expect(replay!.results, `results differ from the fault-free replay of ${JSON.stringify(out.changes)}\n${where}`).toEqual(out.results);
        // Ranks were renumbered 0..size-1 in the final world, and every rank agrees on its size.
        out.results.forEach((r, i) => expect(r, where).toMatchObject({ rank: i, size: out.results.length }));
        seen.ok++;
        seen.changes += out.changes.length;
        seen.rollbacks += out.rollbacks;
        seen.grows += out.decided - out.rollbacks;
        seen.transfers += out.transfers;
        seen.inRound += out.deathsInRound;
        seen.joiner += out.joinerDeaths;
        seen.root += out.rootDeaths;
      } catch (err) {
        throw new Error(`${(err as Error).message}\nsimulation failed, reproduce with SEED=${seed}`, { cause: err });
      }
    }
    if (seeds.length >= 100) {
      // The swarm must exercise what it claims to: most jobs finish, through many changes of
      // every kind, with kills in the middle of changes and of state transfers.
      expect(seen.ok, JSON.stringify(seen)).toBeGreaterThan(seeds.length * 0.6);
      expect(seen.rollbacks, JSON.stringify(seen)).toBeGreaterThan(seeds.length / 4);
      expect(seen.grows, JSON.stringify(seen)).toBeGreaterThan(seeds.length / 4);
      expect(seen.transfers, JSON.stringify(seen)).toBeGreaterThan(seeds.length / 4);
      expect(seen.inRound, JSON.stringify(seen)).toBeGreaterThan(seeds.length / 100);
      expect(seen.joiner, JSON.stringify(seen)).toBeGreaterThan(seeds.length / 100);
      expect(seen.root, JSON.stringify(seen)).toBeGreaterThan(seeds.length / 200);
    }
  }, 300_000);
});
