/**
 * Goal: the drill's analysis turns a run's events into the right per-fault figures (hit,
 * detection, restart, recovery, line rolled back to, steps redone), the verdict compares
 * results exactly, and the HTML report is self-contained with one time line per rank per run
 * and a row per fault.
 *
 * Method: hand-written event sequences shaped like the supervisor's (the order of a real
 * mode-none failure, a cpr restart from a committed line, a frozen rank caught by heartbeat),
 * fed to the pure functions of src/launch/drill-report.ts. The HTML is checked structurally
 * (no browser): a manual look in headless Chromium is described in docs/cli.md.
 */
import { describe, expect, it } from "vitest";
import {
  analyzeFaults,
  compareResults,
  describeFault,
  esc,
  lineCommits,
  rankSegments,
  renderHtml,
  verdictOf,
  type DrillReport,
  type DrillRun,
  type RecordedEvent,
} from "../../src/launch/drill-report.ts";
import { planFaults, parseKillSpecs } from "../../src/launch/drill-spec.ts";
import type { JobEvent } from "../../src/launch/progress.ts";

const at = (t: number, ev: JobEvent): RecordedEvent => ({ t, ev });
const out = (t: number, rank: number, line: string): RecordedEvent => ({ t, ev: { kind: "rank-output", rank, stream: "stderr", line } });
const step = (t: number, rank: number, steps: number, epoch = 0): RecordedEvent => at(t, { kind: "rank-step", rank, steps, epoch });
const spawned = (t: number, rank: number, attempt: number): RecordedEvent => at(t, { kind: "rank-spawned", rank, attempt, pid: 100 + 10 * attempt + rank });
const up = (t: number, rank: number): RecordedEvent => at(t, { kind: "rank-up", rank, pid: 1 });
const exited = (t: number, rank: number, signal: string | null, killedByLauncher: boolean): RecordedEvent =>
  at(t, { kind: "rank-exited", rank, code: signal === null ? 0 : null, signal, killedByLauncher });
const failed = (t: number, rank: number, reason: string): RecordedEvent =>
  at(t, { kind: "rank-failed", rank, pid: 1, reason, code: null, signal: "SIGKILL", stderrTail: [] });
const finalized = (t: number, rank: number): RecordedEvent => at(t, { kind: "rank-finalized", rank });

function plan(texts: string[], mode: "none" | "cpr" = "cpr") {
  return planFaults(parseKillSpecs(texts, 2), { size: 2, mode, seed: 1, reference: undefined });
}

/** A cpr run: rank 1 killed at its 8th step after line 1 (taken at step 4) committed. */
function cprEvents(): RecordedEvent[] {
  return [
    spawned(0, 0, 0),
    spawned(0, 1, 0),
    up(500, 0),
    up(510, 1),
    step(520, 0, 1),
    step(520, 1, 1),
    step(600, 0, 4, 1),
    step(601, 1, 4, 1),
    at(650, { kind: "line-committed", epoch: 1, durationMs: 40, bytes: 1000 }),
    step(700, 0, 7, 1),
    out(720, 1, "lifeline: injected fault: killing this rank (step:8)"),
    exited(735, 1, "SIGKILL", false),
    failed(736, 1, "was killed by SIGKILL before finalizing"),
    exited(740, 0, "SIGKILL", true),
    at(850, { kind: "job-restarting", attempt: 1, epoch: 1, restarts: 1 }),
    spawned(860, 0, 1),
    spawned(860, 1, 1),
    up(1_300, 0),
    up(1_320, 1),
    step(1_350, 0, 1, 1),
    step(1_351, 1, 1, 1),
    step(1_500, 1, 3, 1),
    step(1_550, 1, 5, 2),
    finalized(1_700, 0),
    finalized(1_700, 1),
    exited(1_720, 0, null, false),
    exited(1_721, 1, null, false),
  ];
}

describe("analyzeFaults", () => {
  it("cpr: hit, detection by exit, restart, rollback to the committed line, recovery past the hit", () => {
    const [r] = analyzeFaults(cprEvents(), plan(["1@step:8"]), { size: 2, mode: "cpr" });
    expect(r).toMatchObject({ hitMs: 720, stepsAtHit: 7, detectedMs: 735, cause: "exit", restartedMs: 860, upMs: 1_320, restoreEpoch: 1, workLostSteps: 3 });
    // Recovered at the first report of 4 + 3 = 7 restored-plus-new steps.
    expect(r!.recoveredMs).toBe(1_500);
    expect(describeFault(r!)).toMatch(
      /hit at 0\.72s after 7 steps, detected in 15 ms \(exit\), back up 585 ms later, recovered 765 ms after detection, rolled back to line 1, 3 steps redone/,
    );
  });

  it("cpr: the fault's line read after the exit and the restart decision still counts (launcher under load)", () => {
    // The launcher sees the exit before it has read the rank's last stderr line.
    const late = cprEvents().map((e) => (e.ev.kind === "rank-output" ? { ...e, t: 855 } : e));
    const [r] = analyzeFaults(late, plan(["1@step:8"]), { size: 2, mode: "cpr" });
    expect(r).toMatchObject({ hitMs: 735, stepsAtHit: 7, detectedMs: 735, cause: "exit", restartedMs: 860, upMs: 1_320, restoreEpoch: 1, workLostSteps: 3 });
    expect(r!.recoveredMs).toBe(1_500);
  });

  it("retry-one: a restored version whose step report the --json events thinned out still counts the steps it held", () => {
    const events = [
      spawned(0, 0, 0),
      spawned(0, 1, 0),
      up(500, 0),
      up(510, 1),
      step(600, 1, 5, 5),
      // Versions 6-8 and 10-12 were reported within 250 ms of these: not in the events.
      step(850, 1, 9, 9),
      out(900, 1, "lifeline: injected fault: killing this rank (step:13)"),
      exited(905, 1, "SIGKILL", false),
      failed(906, 1, "was killed by SIGKILL before finalizing"),
      spawned(910, 1, 1),
      up(1_000, 1),
      at(1_100, { kind: "rank-caught-up", rank: 1, attempt: 1, restored: 12, version: 12, seqno: 0, replayed: 0 }),
      finalized(1_200, 0),
      finalized(1_200, 1),
    ];
    const faults = planFaults(parseKillSpecs(["1@step:13"], 2), { size: 2, mode: "retry-one", seed: 1, reference: undefined });
    const [r] = analyzeFaults(events, faults, { size: 2, mode: "retry-one" });
    // Version 12 holds 9 + 3 steps: nothing was redone (it was 9 before, from restoring "0").
    expect(r).toMatchObject({ restoreEpoch: 12, workLostSteps: 0 });
  });

  it("cpr without a committed line: restarted from the beginning, every step redone", () => {
    const events = cprEvents().map((e) => (e.ev.kind === "job-restarting" ? at(e.t, { ...e.ev, epoch: 0 }) : e));
    const [r] = analyzeFaults(events, plan(["1@step:8"]), { size: 2, mode: "cpr" });
    expect(r).toMatchObject({ restoreEpoch: 0, workLostSteps: 7 });
    // 0 + 3 < 7 and 0 + 5 < 7: recovered only when it finalized.
    expect(r!.recoveredMs).toBe(1_700);
  });

  it("mode none: detected, not recovered", () => {
    const events = [
      spawned(0, 0, 0),
      spawned(0, 1, 0),
      up(400, 0),
      up(400, 1),
      step(450, 1, 2),
      out(500, 1, "lifeline: injected fault: killing this rank (time:100)"),
      exited(512, 1, "SIGKILL", false),
      failed(513, 1, "was killed by SIGKILL before finalizing"),
      exited(540, 0, "SIGTERM", true),
    ];
    const [r] = analyzeFaults(events, plan(["1@time:100"], "none"), { size: 2, mode: "none" });
    expect(r).toMatchObject({
      hitMs: 500,
      stepsAtHit: 2,
      detectedMs: 512,
      restartedMs: undefined,
      recoveredMs: undefined,
      note: "not recovered: mode none cannot recover",
    });
  });

  it("a frozen rank is detected by heartbeat", () => {
    const events = [
      spawned(0, 0, 0),
      spawned(0, 1, 0),
      up(400, 0),
      up(400, 1),
      out(500, 1, "lifeline: injected fault: freezing this rank (step:3)"),
      exited(1_620, 1, "SIGKILL", true),
      failed(1_900, 1, "sent no heartbeat for 1100 ms (--failure-timeout 1000 ms): frozen or unreachable, killed"),
    ];
    const [r] = analyzeFaults(events, plan(["1@hang:step:3"], "none"), { size: 2, mode: "none" });
    expect(r).toMatchObject({ hitMs: 500, detectedMs: 1_620, cause: "heartbeat", stepsAtHit: 2 });
  });

  it("a second fault before the first recovered interrupts the first's recovery", () => {
    const events = [
      ...cprEvents().filter((e) => e.t < 1_400),
      out(1_420, 0, "lifeline: injected fault: killing this rank (time:70)"),
      exited(1_430, 0, "SIGKILL", false),
      exited(1_431, 1, "SIGKILL", true),
      at(1_500, { kind: "job-restarting", attempt: 2, epoch: 1, restarts: 2 }),
      spawned(1_510, 0, 2),
      spawned(1_510, 1, 2),
      up(1_900, 0),
      up(1_900, 1),
      step(2_000, 0, 9, 1),
      step(2_000, 1, 9, 2),
      finalized(2_100, 0),
      finalized(2_100, 1),
    ];
    const [first, second] = analyzeFaults(events, plan(["1@step:8", "0@time:70"]), { size: 2, mode: "cpr" });
    expect(first).toMatchObject({ detectedMs: 735, interruptedMs: 1_430, recoveredMs: undefined });
    expect(first!.note).toMatch(/a later fault struck 695 ms after detection/);
    expect(second).toMatchObject({
      hitMs: 1_420,
      detectedMs: 1_430,
      restartedMs: 1_510,
      upMs: 1_900,
      recoveredMs: 2_000,
      restoreEpoch: 1,
      interruptedMs: undefined,
    });
  });

  it("a fault that never fired says so", () => {
    const [r] = analyzeFaults([spawned(0, 0, 0), finalized(10, 0)], plan(["1@step:999"]), { size: 2, mode: "cpr" });
    expect(r!.hitMs).toBeUndefined();
    expect(r!.note).toMatch(/did not fire/);
  });
});

describe("verdict", () => {
  it("compares results exactly: types, -0, NaN and every bit of a float", () => {
    expect(compareResults(["ab", 1.5], ["ab", 1.5])).toEqual([]);
    expect(compareResults(["ab", 1.5], ["ab", 1.5000000000000002])).toEqual([1]);
    expect(compareResults([0], [-0])).toEqual([0]);
    expect(compareResults([NaN], [NaN])).toEqual([]);
    expect(compareResults([new Float64Array([1, 2])], [[1, 2]])).toEqual([0]);
    expect(compareResults([1n, { a: [1] }], [1n, { a: [1] }])).toEqual([]);
    expect(compareResults(["x", "y"], ["x"])).toEqual([1]);
  });

  const result = (ok: boolean, results: unknown[]) => ({
    ok,
    exitCode: ok ? 0 : 137,
    wallMs: 1,
    restarts: 0,
    results,
    error: ok ? undefined : { code: "LAUNCH_RANK_FAILED", message: "rank 1 (pid 5) was killed by SIGKILL before finalizing\nlast lines" },
  });

  it("identical, differs (naming ranks), failed (mode none cannot recover)", () => {
    expect(verdictOf({ mode: "cpr", result: result(true, ["a", "b"]), faultReports: [] }, ["a", "b"])).toEqual({ kind: "identical" });
    expect(verdictOf({ mode: "cpr", result: result(true, ["a", "c"]), faultReports: [] }, ["a", "b"])).toEqual({ kind: "differs", ranks: [1] });
    const [hit] = analyzeFaults([out(5, 1, "lifeline: injected fault: killing this rank (step:2)")], plan(["1@step:2"], "none"), { size: 2, mode: "none" });
    expect(verdictOf({ mode: "none", result: result(false, [undefined, undefined]), faultReports: [hit!] }, ["a", "b"])).toEqual({
      kind: "failed",
      message: "mode none cannot recover: rank 1 (pid 5) was killed by SIGKILL before finalizing",
    });
  });
});

describe("renderHtml", () => {
  function report(): DrillReport {
    const faults = plan(["1@step:8"]);
    const refEvents = [
      spawned(0, 0, 0),
      spawned(0, 1, 0),
      up(400, 0),
      up(400, 1),
      step(500, 0, 10),
      step(500, 1, 10),
      finalized(900, 0),
      finalized(900, 1),
      exited(910, 0, null, false),
      exited(910, 1, null, false),
    ];
    const reference: DrillRun = {
      index: 0,
      label: "reference",
      mode: "none",
      seed: undefined,
      faults: [],
      events: refEvents,
      result: { ok: true, exitCode: 0, wallMs: 910, restarts: 0, results: ["a", "b"], error: undefined },
      faultReports: [],
      verdict: undefined,
    };
    const events = cprEvents();
    const faulty: DrillRun = {
      index: 1,
      label: "faulty run <1>",
      mode: "cpr",
      seed: 7,
      faults,
      events,
      result: { ok: true, exitCode: 0, wallMs: 1_721, restarts: 1, results: ["a", "b"], error: undefined },
      faultReports: analyzeFaults(events, faults, { size: 2, mode: "cpr" }),
      verdict: { kind: "identical" },
    };
    return {
      app: "/x/heat.ts",
      appArgs: [],
      size: 2,
      mode: "cpr",
      seed: 7,
      command: "lifeline drill -n 2 --kill 1@step:8 heat.ts",
      runs: [reference, faulty],
      pass: true,
      summary: "PASS: identical",
    };
  }

  it("is one self-contained page: inline SVG and CSS, no scripts, no external assets", () => {
    const html = renderHtml(report());
    expect(html.startsWith("<!DOCTYPE html>")).toBe(true);
    expect(html).not.toMatch(/<script|<link|<img|@import|url\((?!#)/);
    // The only URL is the SVG namespace.
    expect(html.match(/https?:\/\/[^"\s]+/g)).toEqual(["http://www.w3.org/2000/svg", "http://www.w3.org/2000/svg"]);
    expect(html.match(/<svg /g)).toHaveLength(2);
    expect(html).toContain("PASS");
  });

  it("draws one lane per rank per run, each fault where it hit, the bands and committed lines", () => {
    const html = renderHtml(report());
    const faulty = html.slice(html.indexOf('id="run-1"'));
    expect(faulty.match(/>rank \d<\/text>/g)).toEqual([">rank 0</text>", ">rank 1</text>"]);
    expect(faulty).toContain("fault 1: rank 1 @ step:8, hit at 0.72s");
    expect(faulty).toMatch(/fault 1: detection \(exit\): 15 ms/);
    expect(faulty).toMatch(/fault 1: restart: 585 ms/);
    expect(faulty).toMatch(/fault 1: redoing 3 lost steps: 180 ms/);
    expect(faulty).toMatch(/line 1 committed at 0\.65s/);
    expect(faulty).toMatch(/epoch 1 at step 4/);
    expect(faulty).toMatch(/\+0\.81s vs the reference/);
    // Labels are escaped.
    expect(faulty).toContain("faulty run &lt;1&gt;");
  });

  it("has a summary row per fault with its figures", () => {
    const html = renderHtml(report());
    const table = html.slice(html.indexOf('<table id="faults">'), html.indexOf("</table>"));
    const rows = table.split("<tr>").slice(2);
    expect(rows).toHaveLength(1);
    const cells = [...rows[0]!.matchAll(/<td[^>]*>(.*?)<\/td>/g)].map((m) => m[1]);
    expect(cells).toEqual(["faulty run &lt;1&gt;", "1", "1", "step:8", "0.72s", "7", "exit", "15", "585", "765", "line 1", "3", "identical"]);
  });

  it("segments and commits come from the events", () => {
    const segs = rankSegments(cprEvents(), 2, 2_000);
    expect(segs[1]!.map((s) => [s.attempt, s.from, s.upAt, s.to, s.end])).toEqual([
      [0, 0, 510, 735, "failed"],
      [1, 860, 1_320, 1_721, "finalized"],
    ]);
    expect(segs[0]![0]!.end).toBe("stopped");
    expect(lineCommits(cprEvents())).toEqual([{ t: 650, epoch: 1 }]);
    expect(esc(`<a href="x">&`)).toBe("&lt;a href=&quot;x&quot;&gt;&amp;");
  });
});
