/**
 * Goal: `--checkpoint-every Nsteps` asks for a line after N steps, as it says. Ranks report
 * their step counts every 200 ms at most, so the coordinator used to hear of the Nth step only
 * at the next report: with fast steps, lines came about every 200 ms whatever N was (the demo's
 * `50steps` had no line by step 150 and restarted from the beginning). With N in its table, a
 * rank reports as soon as it has made N calls since its last checkpoint.
 *
 * Method: the built launcher runs test/fixtures/cpr/table-steps.ts (a 2 ms spin per step, 4 to
 * 6 ms a step with 4 ranks on 2 cores) on 4 ranks with `--checkpoint-every 5steps` and
 * `--keep-lines 1000`.
 * - The first line must have been asked for at the slowest rank's 5th step, exactly: its
 *   `line-committed` event says at how many steps the coordinator asked (`steps`). Each rank
 *   reports its 5th step the moment it makes it, so the request comes with 5 whatever the load;
 *   with only the 200 ms reports (the report at the 5th step disabled, as before the change)
 *   the first request came with 33-35 steps here.
 * - The step each rank's state holds in that line, read from the store, is at least 5: the
 *   ranks take the request at one of their next calls. How many steps later depends on how soon
 *   the request reaches them: 8 here, 11-13 beside two CPU burners, once 28 in a loaded CI run
 *   (which is why that is not bounded).
 */
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { decodeValue } from "../../src/mpi/codec.ts";
import { LevelRecoveryStore } from "../../src/store/level-store.ts";
import { context, runDirFor, runLauncher } from "./cpr-run.ts";

const runs = runDirFor("lifeline-cpr-every-steps-");
const EVERY = 5;

describe("cpr: --checkpoint-every Nsteps", () => {
  it("the first line is asked for at the Nth step, not at the next step report", async () => {
    const committed: Record<string, unknown>[] = [];
    const r = await runLauncher({
      onEvent: (ev) => {
        if (ev.event === "line-committed") committed.push(ev);
      },
      np: 4,
      program: join("test", "fixtures", "cpr", "table-steps.ts"),
      args: ["--steps", "120", "--n", "1024", "--spin-ms", "2"],
      flags: ["--mode", "cpr", "--checkpoint-every", `${EVERY}steps`, "--keep-lines", "1000"],
      dir: runs.path,
      name: "every",
      timeoutMs: 60_000,
    });
    expect(r.code, context(r)).toBe(0);
    const store = new LevelRecoveryStore(join(runs.path, "every.store"));
    const manifest = await store.openManifest();
    const lines = await manifest.list();
    await manifest.close();
    const first = lines.reduce((a, b) => (a.epoch <= b.epoch ? a : b));
    const steps: number[] = [];
    for (const ref of first.parts) {
      const parts = await store.openRank(ref.rank);
      const part = decodeValue(await parts.readPart(ref)) as { state: Buffer };
      steps.push((decodeValue(part.state) as { step: number }).step);
      await parts.close();
    }
    expect(
      committed.find((ev) => ev.epoch === first.epoch),
      JSON.stringify(committed),
    ).toMatchObject({ steps: EVERY });
    expect(steps.length).toBe(4);
    for (const s of steps) expect(s, JSON.stringify(steps)).toBeGreaterThanOrEqual(EVERY);
  }, 90_000);
});
