/**
 * Goal: `--checkpoint-every Nsteps` asks for a line after N steps, as it says. Ranks report
 * their step counts every 200 ms at most, so the coordinator used to hear of the Nth step only
 * at the next report: with fast steps, lines came about every 200 ms whatever N was (the demo's
 * `50steps` had no line by step 150 and restarted from the beginning). With N in its table, a
 * rank reports as soon as it has made N calls since its last checkpoint.
 *
 * Method: the built launcher runs test/fixtures/cpr/table-steps.ts (a 5 ms spin per step, about
 * 7 ms a step here) on 4 ranks with `--checkpoint-every 5steps` and `--keep-lines 1000`; then
 * the step each rank's state holds in the first committed line is read from the store. The
 * request follows the 5th step's report, and each rank takes it at one of its next calls (the
 * count alignment): a few steps later. Measured here: steps 7-8, and 10 beside two CPU
 * burners; before the change, 18-21 (the report 200 ms after the first one).
 */
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { decodeValue } from "../../src/mpi/codec.ts";
import { LevelRecoveryStore } from "../../src/store/level-store.ts";
import { context, runDirFor, runLauncher } from "./cpr-run.ts";

const runs = runDirFor("lifeline-cpr-every-steps-");
const EVERY = 5;

describe("cpr: --checkpoint-every Nsteps", () => {
  it("the first line is taken a few steps after the Nth, not at the next step report", async () => {
    const r = await runLauncher({
      np: 4,
      program: join("test", "fixtures", "cpr", "table-steps.ts"),
      args: ["--steps", "120", "--n", "1024", "--spin-ms", "5"],
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
    expect(steps.length).toBe(4);
    for (const s of steps) {
      expect(s, JSON.stringify(steps)).toBeGreaterThanOrEqual(EVERY);
      expect(s, JSON.stringify(steps)).toBeLessThanOrEqual(EVERY + 8);
    }
  }, 90_000);
});
