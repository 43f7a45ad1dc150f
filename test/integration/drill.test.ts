/**
 * Goal: `lifeline drill` gives the right verdict on real programs — it passes when a faulty
 * run recovers to bit-identical results (cpr, on the heat stencil and logistic regression,
 * with a step kill, seeded random kills and a frozen rank), and fails with a non-zero exit and
 * a clear message when it cannot: mode none (no recovery) and a deliberately
 * non-deterministic program (montecarlo.ts) without any fault. It also passes a deterministic
 * program re-run without faults.
 *
 * Method: resolveDrillConfig + runDrill in-process (the path `lifeline drill` takes), with
 * 2 ranks of the shipped examples (which import "lifeline" from dist/: `npm run build`
 * first), string sinks for the output, fixed seeds, and per-test checks that no rank process
 * outlives its drill. Each drill stays well under 30 s on a loaded 2-core machine.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { resolveDrillConfig, runDrill, type DrillFlags, type DrillOutcome } from "../../src/launch/drill.ts";
import { tempDir, requireBuild, ROOT, Sink, waitGone } from "../launch/helpers.ts";

const { dir, cleanup } = tempDir("lifeline-drill-");
afterAll(cleanup);
beforeAll(requireBuild);

const DRILL_TEST_MS = 30_000;
/** Small enough to be quick, long enough for cpr to commit lines before the faults. */
const HEAT = ["examples/heat.ts", "--rows", "128", "--cols", "128", "--iters", "300"];
const LOGREG = ["examples/logreg.ts", "--samples", "4096", "--steps", "150"];

async function drill(flags: Omit<DrillFlags, "np" | "app" | "appArgs">, app: string[], np = "2"): Promise<DrillOutcome & { stderr: string }> {
  const stderr = new Sink();
  const config = resolveDrillConfig({ np, ...flags, app: app[0], appArgs: app.slice(1) }, { cwd: ROOT });
  const outcome = await runDrill(config, { stdout: new Sink(), stderr, env: { ...process.env, NO_COLOR: "1" }, handleSignals: false });
  // Every rank of every run has ended (runJob resolves only then); check it anyway.
  const pids = outcome.report.runs.flatMap((r) => r.events.flatMap((e) => (e.ev.kind === "rank-spawned" ? [e.ev.pid] : [])));
  expect(await waitGone(pids, 2_000)).toEqual([]);
  return { ...outcome, stderr: stderr.text };
}

function context(o: { stderr: string }): string {
  return `--- drill output\n${o.stderr}`;
}

describe("lifeline drill, mode none", () => {
  it(
    "passes a deterministic program re-run without faults",
    async () => {
      const o = await drill({ mode: "none" }, HEAT);
      expect(o.exitCode, context(o)).toBe(0);
      expect(o.pass).toBe(true);
      expect(o.report.runs.map((r) => r.verdict?.kind)).toEqual([undefined, "identical"]);
      expect(o.stderr).toMatch(/PASS: the faulty run's results are bit-identical to the reference run's/);
    },
    DRILL_TEST_MS,
  );

  it(
    "fails when a rank is killed: mode none cannot recover",
    async () => {
      const report = join(dir, "none.html");
      const o = await drill({ mode: "none", kill: ["1@step:5"], seed: "1", report }, HEAT);
      expect(o.exitCode, context(o)).toBe(1);
      const [fault] = o.report.runs[1]!.faultReports;
      expect(fault).toMatchObject({ stepsAtHit: 4, cause: "exit", note: "not recovered: mode none cannot recover" });
      expect(fault!.detectedMs! - fault!.hitMs!).toBeLessThan(1_000);
      expect(o.stderr).toMatch(/FAILED: mode none cannot recover: rank 1 \(pid \d+\) was killed by SIGKILL/);
      expect(o.stderr).toMatch(/FAIL: 1 of 1 faulty run did not reproduce the reference/);
      expect(readFileSync(report, "utf8")).toMatch(/<span class="badge fail">FAIL<\/span>/);
    },
    DRILL_TEST_MS,
  );

  it(
    "a rank that throws: its error line is in the drill's output",
    async () => {
      const o = await drill({ mode: "none" }, ["test/fixtures/launch/crash.ts", "1", "throw"]);
      expect(o.exitCode, context(o)).not.toBe(0);
      // The drill shows no rank output: the line that says why must be on the failure's line.
      expect(o.stderr).toMatch(/rank 1 failed: exited with code 1 before finalizing: Error: deliberate failure in rank code$/m);
    },
    DRILL_TEST_MS,
  );

  it(
    "fails on a non-deterministic program without any fault, naming the ranks that differ",
    async () => {
      const o = await drill({ mode: "none" }, ["examples/montecarlo.ts", "--batches", "4", "--batch-size", "20000"]);
      expect(o.exitCode, context(o)).toBe(1);
      expect(o.report.runs[1]!.verdict).toEqual({ kind: "differs", ranks: [0, 1] });
      expect(o.stderr).toMatch(/RESULTS DIFFER from the reference on ranks 0, 1/);
      expect(o.stderr).toMatch(/rank 0: reference .*\n.*this run/);
      expect(o.stderr).toMatch(/FAIL: .* results differ from the reference on ranks 0, 1/);
    },
    DRILL_TEST_MS,
  );
});

describe("lifeline drill, mode cpr", () => {
  const cpr = { mode: "cpr", checkpointEvery: "100ms" } as const;

  it(
    "heat: rank 1 killed at its 5th step recovers to identical results",
    async () => {
      const o = await drill({ ...cpr, kill: ["1@step:5"], seed: "1" }, HEAT);
      expect(o.exitCode, context(o)).toBe(0);
      const run = o.report.runs[1]!;
      expect(run.result.restarts).toBe(1);
      const [fault] = run.faultReports;
      expect(fault).toMatchObject({ stepsAtHit: 4, cause: "exit" });
      expect(fault!.upMs).toBeGreaterThan(fault!.detectedMs!);
      expect(fault!.recoveredMs).toBeGreaterThanOrEqual(fault!.upMs!);
      expect(fault!.workLostSteps).toBeLessThanOrEqual(4);
    },
    DRILL_TEST_MS,
  );

  it(
    "heat: a kill after lines were committed rolls back to a line, not to the beginning",
    async () => {
      // line:1 kills at the first checkpoint() after the first line committed, however slow
      // the machine (a fixed step could come before the first line under load). A 512x512 grid
      // of 1,000 iterations leaves steps to do after it: with the default 400 the job once
      // ended under load (1.8 s) before its first line committed, and the kill never fired;
      // alone it takes about 0.8 s and commits its first line 0.15 s after the ranks are up.
      const o = await drill({ ...cpr, kill: ["1@line:1"], seed: "2" }, ["examples/heat.ts", "--rows", "512", "--cols", "512", "--iters", "1000"]);
      expect(o.exitCode, context(o)).toBe(0);
      const [fault] = o.report.runs[1]!.faultReports;
      // -1 for a missing figure, so that a failure prints the drill's context.
      expect(fault!.restoreEpoch ?? -1, context(o)).toBeGreaterThan(0);
      expect(fault!.workLostSteps ?? Infinity, context(o)).toBeLessThan(fault!.stepsAtHit ?? -1);
    },
    DRILL_TEST_MS,
  );

  it(
    "a ring of 3 MiB messages on the bulk connection, 3 ranks, random:2 (seeded): identical results",
    async () => {
      // Every step's large message goes without a copy on the second connection, with its
      // mark on the first: kills land with marks, messages and their receipts on the way.
      const o = await drill({ ...cpr, kill: ["random:2"], seed: "77" }, ["test/fixtures/world/bulk-ring.ts"], "3");
      expect(o.exitCode, context(o)).toBe(0);
      expect(o.report.runs[1]!.result.restarts, context(o)).toBe(2);
    },
    DRILL_TEST_MS,
  );

  it(
    "heat: random:2 (seeded) recovers twice to identical results",
    async () => {
      const o = await drill({ ...cpr, kill: ["random:2"], seed: "7" }, HEAT);
      expect(o.exitCode, context(o)).toBe(0);
      const run = o.report.runs[1]!;
      expect(run.faults.map((f) => f.attempt)).toEqual([0, 1]);
      expect(run.faultReports.filter((f) => f.hitMs !== undefined).length, context(o)).toBeGreaterThanOrEqual(1);
    },
    DRILL_TEST_MS,
  );

  it(
    "logreg: rank 1 killed at its 5th step recovers to identical results",
    async () => {
      const o = await drill({ ...cpr, kill: ["1@step:5"], seed: "3" }, LOGREG);
      expect(o.exitCode, context(o)).toBe(0);
      expect(o.report.runs[1]!.faultReports[0]!.hitMs).toBeDefined();
    },
    DRILL_TEST_MS,
  );

  it(
    "logreg: random:2 (seeded) recovers to identical results",
    async () => {
      const o = await drill({ ...cpr, kill: ["random:2"], seed: "11" }, LOGREG);
      expect(o.exitCode, context(o)).toBe(0);
      expect(o.stderr).toMatch(/fault 1 \(rank \d @ (step|time):/);
      // The line above is printed for a fault that did not fire too: at least one must have hit.
      expect(o.report.runs[1]!.faultReports.filter((f) => f.hitMs !== undefined).length, context(o)).toBeGreaterThanOrEqual(1);
    },
    DRILL_TEST_MS,
  );

  it(
    "a frozen rank (SIGSTOP) is caught by heartbeats and recovered",
    async () => {
      const o = await drill({ ...cpr, heartbeat: "100ms", failureTimeout: "1s", kill: ["1@hang:step:100"], seed: "4" }, HEAT);
      expect(o.exitCode, context(o)).toBe(0);
      const [fault] = o.report.runs[1]!.faultReports;
      expect(fault!.cause).toBe("heartbeat");
      const detectionMs = fault!.detectedMs! - fault!.hitMs!;
      // The detector's clock starts at the last beat heard, up to one heartbeat (100 ms) plus
      // scheduling delay before the freeze: detection may read a little under the 1 s timeout.
      expect(detectionMs).toBeGreaterThanOrEqual(700);
      expect(detectionMs).toBeLessThan(3_000);
    },
    DRILL_TEST_MS,
  );
});
