/**
 * Goal: under cpr, what a person sees tells where the job stands after failures: the tty
 * status line shows the newest committed recovery line (epoch) and the restarts so far; a
 * pipe gets the same facts as plain lines, without control characters; --json gives the
 * events themselves.
 * Method: the reporter of src/launch/progress.ts fed a scripted cpr job with one restart,
 * writing into string sinks, with a fixed clock.
 */
import { describe, expect, it } from "vitest";
import { createReporter, type JobEvent, type ReportStyle } from "../../src/launch/progress.ts";

class Sink {
  text = "";
  constructor(
    readonly isTTY = false,
    readonly columns = 200,
  ) {}
  write(s: string): boolean {
    this.text += s;
    return true;
  }
}

const JOB: JobEvent[] = [
  { kind: "job-starting", job: "heat-1", size: 2, mode: "cpr", app: "/x/heat.ts", coordinator: "ipc:///tmp/c", transport: "ipc" },
  { kind: "rank-up", rank: 0, pid: 11 },
  { kind: "rank-up", rank: 1, pid: 12 },
  { kind: "job-started", rendezvousMs: 300 },
  { kind: "rank-step", rank: 0, steps: 9, epoch: 2 },
  { kind: "line-committed", epoch: 1, durationMs: 40, bytes: 100 },
  { kind: "line-committed", epoch: 2, durationMs: 40, bytes: 100 },
  { kind: "rank-failed", rank: 1, pid: 12, reason: "was killed by SIGKILL before finalizing", code: null, signal: "SIGKILL", stderrTail: [] },
  { kind: "job-restarting", attempt: 1, epoch: 2, restarts: 1 },
  { kind: "rank-up", rank: 0, pid: 21 },
];

function play(style: ReportStyle): Sink {
  const stderr = new Sink(style === "tty");
  const r = createReporter({ style, stdout: new Sink(style === "tty"), stderr, size: 2, elapsedMs: () => 1_000, color: false });
  for (const ev of JOB) r.event(ev);
  r.close();
  return stderr;
}

/** The last status line drawn on a tty (each draw starts with "\r\x1b[2K"). */
function lastStatus(text: string): string {
  const draws = text.split("\r\x1b[2K").filter((s) => s.startsWith("lifeline heat-1"));
  return draws[draws.length - 1] ?? "";
}

describe("status under cpr", () => {
  it("tty: the status line shows the committed epoch and the restarts", () => {
    const text = play("tty").text;
    const status = lastStatus(text);
    expect(status).toBe("lifeline heat-1 · 1/2 up · epoch 2 · 1 restart · steps 9 0 · 1.00s");
    // Before the restart it showed the epoch without restarts.
    expect(text).toContain("lifeline heat-1 · 2/2 up · epoch 2 · steps 9 0 · 1.00s");
  });

  it("pipe: plain lines for the commit, the failure and the restart; no control characters", () => {
    const text = play("plain").text;
    expect(text).not.toMatch(/[\r\x1b]/);
    expect(text).toContain("lifeline: recovery line 2 committed (100 bytes, 0.04s)\n");
    expect(text).toContain("lifeline: failure detected: rank 1 (pid 12) was killed by SIGKILL before finalizing (it wrote nothing to stderr)\n");
    expect(text).not.toContain("error:");
    expect(text).toContain("lifeline: recovery 1: every rank restarts (attempt 1) from recovery line 2\n");
  });

  it("--json: one event per line, with the epoch and restart count", () => {
    const events = play("json")
      .text.trim()
      .split("\n")
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(events.find((e) => e.event === "job-restarting")).toMatchObject({ attempt: 1, epoch: 2, restarts: 1 });
    expect(events.filter((e) => e.event === "line-committed").map((e) => e.epoch)).toEqual([1, 2]);
  });
});
