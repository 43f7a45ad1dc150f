/**
 * Goal: each output style shows what it promises — plain lines without control characters on
 * a pipe, a status line redrawn in place and cleared before rank output on a tty, one JSON
 * object per stderr line under --json, only failures under --quiet — and rank output is
 * forwarded as `[rank] line` in all of them.
 *
 * Method: feed a fixed event sequence to each reporter with string-collecting streams and a
 * fake clock, then inspect the text.
 */
import { describe, expect, it } from "vitest";
import { createReporter, pickStyle, type JobEvent, type ReportStyle } from "../../src/launch/progress.ts";

class Sink {
  text = "";
  constructor(
    readonly isTTY = false,
    readonly columns = 100,
  ) {}
  write(s: string): boolean {
    this.text += s;
    return true;
  }
}

const failed: JobEvent = {
  kind: "rank-failed",
  rank: 1,
  pid: 4242,
  reason: "was killed by SIGKILL before finalizing",
  code: null,
  signal: "SIGKILL",
  stderrTail: ["Error: boom", "at main (app.ts:3)"],
  error: "Error: boom",
};

function script(style: ReportStyle, opts: { ok: boolean }) {
  const stdout = new Sink(style === "tty");
  const stderr = new Sink(style === "tty");
  let now = 0;
  const reporter = createReporter({ style, stdout, stderr, size: 2, elapsedMs: () => now, color: false });
  reporter.event({ kind: "job-starting", job: "app-1", size: 2, mode: "none", app: "/x/app.ts", coordinator: "ipc:///tmp/c", transport: "ipc" });
  reporter.event({ kind: "rank-spawned", rank: 0, attempt: 0, pid: 11 });
  reporter.event({ kind: "rank-up", rank: 0, pid: 11 });
  reporter.event({ kind: "rank-up", rank: 1, pid: 12 });
  now = 1200;
  reporter.event({ kind: "job-started", rendezvousMs: 1200 });
  reporter.event({ kind: "rank-step", rank: 0, steps: 3, epoch: 0 });
  reporter.rankLine(0, "stdout", "hello from 0");
  reporter.rankLine(1, "stderr", "warn from 1");
  reporter.event({ kind: "warning", message: "ignored garbage" });
  now = 2500;
  if (opts.ok) {
    reporter.event({ kind: "rank-finalized", rank: 0 });
    reporter.event({ kind: "rank-finalized", rank: 1 });
    reporter.event({
      kind: "job-finished",
      ok: true,
      exitCode: 0,
      wallMs: 2500,
      size: 2,
      finalized: 2,
      restarts: 0,
      error: undefined,
      results: [42, { d: "ab" }],
      resultsPath: "/x/out.json",
    });
  } else {
    reporter.event(failed);
    reporter.event({
      kind: "job-finished",
      ok: false,
      exitCode: 137,
      wallMs: 2500,
      size: 2,
      finalized: 0,
      restarts: 0,
      error: { code: "LAUNCH_RANK_FAILED", message: "rank 1 (pid 4242) was killed by SIGKILL before finalizing" },
      results: [undefined, undefined],
      resultsPath: undefined,
    });
  }
  reporter.close();
  return { stdout: stdout.text, stderr: stderr.text };
}

const CONTROL = /[\x00-\x09\x0b-\x1f\x7f]/;

describe("progress reporters", () => {
  it("plain: one line per event, no control characters, a summary with results", () => {
    const { stdout, stderr } = script("plain", { ok: true });
    expect(stdout).toBe("[0] hello from 0\n");
    expect(stderr).not.toMatch(CONTROL);
    expect(stderr).toContain("lifeline: job app-1: starting 2 ranks of /x/app.ts (mode none)\n");
    expect(stderr).toContain("lifeline: all 2 ranks up after 1.20s\n");
    expect(stderr).toContain("[1] warn from 1\n");
    expect(stderr).toContain("lifeline: warning: ignored garbage\n");
    expect(stderr).toContain("lifeline: rank 0 finalized at 2.50s\n");
    expect(stderr).toContain("lifeline: done: 2/2 ranks finalized in 2.50s\n");
    expect(stderr).toContain("lifeline:   rank 1: { d: 'ab' }\n");
    expect(stderr).toContain("lifeline: results written to /x/out.json\n");
  });

  it("plain: a failure names the rank, how it died and its error line, once (its stderr was forwarded as it came)", () => {
    const { stderr } = script("plain", { ok: false });
    expect(stderr).not.toMatch(CONTROL);
    expect(stderr).toContain("lifeline: error: rank 1 (pid 4242) was killed by SIGKILL before finalizing: Error: boom\n");
    expect(stderr).not.toContain("at main (app.ts:3)");
    // The summary does not repeat the error printed just before.
    expect(stderr).toContain("lifeline: job failed (exit 137) after 2.50s, 0/2 ranks finalized: see the error above\n");
    expect(stderr.match(/was killed by SIGKILL/g)).toHaveLength(1);
  });

  it("tty: a status line redrawn in place and cleared before rank output and at the end", () => {
    const { stdout, stderr } = script("tty", { ok: true });
    expect(stdout).toBe("[0] hello from 0\n");
    expect(stderr).toMatch(/\r\x1b\[2Klifeline app-1 · 2\/2 up · steps 3 0 · 1\.20s/);
    // Rank output always starts on a cleared line, never after a status line.
    expect(stderr).toContain("\r\x1b[2K[1] warn from 1\n");
    expect(stderr).not.toMatch(/· \d+\.\d+s\[1\]/);
    // The status line is gone before the summary and at the very end.
    expect(stderr).toMatch(/\r\x1b\[2Klifeline: done:/);
    expect(stderr.endsWith("\n")).toBe(true);
  });

  it("json: every stderr line is one JSON event with a time stamp", () => {
    const { stdout, stderr } = script("json", { ok: false });
    expect(stdout).toBe("[0] hello from 0\n");
    const events = stderr
      .trimEnd()
      .split("\n")
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(events.map((e) => e.event)).toEqual([
      "job-starting",
      "rank-spawned",
      "rank-up",
      "rank-up",
      "job-started",
      "rank-step",
      "output",
      "warning",
      "rank-failed",
      "job-finished",
    ]);
    for (const e of events) expect(typeof e.t).toBe("number");
    expect(events[2]).toEqual({ event: "rank-up", rank: 0, pid: 11, t: 0 });
    expect(events[6]).toEqual({ event: "output", rank: 1, stream: "stderr", line: "warn from 1", t: 1200 });
    expect(events[8]).toMatchObject({
      event: "rank-failed",
      rank: 1,
      signal: "SIGKILL",
      stderrTail: ["Error: boom", "at main (app.ts:3)"],
      error: "Error: boom",
    });
    expect(events[9]).toMatchObject({ event: "job-finished", ok: false, exitCode: 137, error: { code: "LAUNCH_RANK_FAILED" } });
  });

  it("json: step events are rate-limited per rank but the last count is not lost", () => {
    const stderr = new Sink();
    let now = 0;
    const r = createReporter({ style: "json", stdout: new Sink(), stderr, size: 1, elapsedMs: () => now });
    for (let s = 1; s <= 100; s++) {
      now = s;
      r.event({ kind: "rank-step", rank: 0, steps: s, epoch: 0 });
    }
    r.event({ kind: "rank-finalized", rank: 0 });
    r.close();
    const steps = stderr.text
      .trimEnd()
      .split("\n")
      .map((l) => JSON.parse(l))
      .filter((e) => e.event === "rank-step");
    expect(steps.map((e) => e.steps)).toEqual([1, 100]);
  });

  it("quiet: only the failure, and nothing on success", () => {
    expect(script("quiet", { ok: true }).stderr).toBe("[1] warn from 1\n");
    const { stderr } = script("quiet", { ok: false });
    expect(stderr).not.toContain("starting");
    expect(stderr).not.toContain("warning");
    expect(stderr).toContain("lifeline: error: rank 1 (pid 4242) was killed by SIGKILL before finalizing");
    expect(stderr).toContain("lifeline: job failed (exit 137)");
  });

  it("picks the style from flags and the terminal", () => {
    const tty = new Sink(true);
    const pipe = new Sink(false);
    expect(pickStyle({ json: true, quiet: false, stderr: tty, env: {} })).toBe("json");
    expect(pickStyle({ json: false, quiet: true, stderr: tty, env: {} })).toBe("quiet");
    expect(pickStyle({ json: false, quiet: false, stderr: tty, env: {} })).toBe("tty");
    expect(pickStyle({ json: false, quiet: false, stderr: tty, env: { TERM: "dumb" } })).toBe("plain");
    expect(pickStyle({ json: false, quiet: false, stderr: pipe, env: {} })).toBe("plain");
  });
});
