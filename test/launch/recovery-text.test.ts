/**
 * Goal: under cpr, a rank killed and then recovered does not read as a job error: the human
 * output says a failure was detected (rank, cause), that every rank restarts from a recovery
 * line, and once every rank is up again that the job recovered (epoch rolled back to, time
 * since the failure was detected); only a failure that no restart follows is an `error:`.
 * In retry-one likewise, per rank: failure detected, the rank restarts alone, and once it
 * caught up, recovered (checkpoint version restored from peers, results replayed, time).
 * In mode none every failure is an error, as before.
 *
 * Method: the reporter of src/launch/progress.ts (plain style) fed scripted event sequences
 * with a scripted clock, writing into a string sink; the text is compared line by line.
 */
import { describe, expect, it } from "vitest";
import { createReporter, type JobEvent } from "../../src/launch/progress.ts";

class Sink {
  text = "";
  readonly isTTY = false;
  write(s: string): boolean {
    this.text += s;
    return true;
  }
}

function play(mode: string, events: readonly (JobEvent | number)[]): string[] {
  const stderr = new Sink();
  let now = 0;
  const r = createReporter({ style: "plain", stdout: new Sink(), stderr, size: 2, elapsedMs: () => now, color: false });
  r.event({ kind: "job-starting", job: "heat-1", size: 2, mode, app: "/x/heat.ts", coordinator: "ipc:///tmp/c", transport: "ipc" });
  for (const ev of events) {
    if (typeof ev === "number") now = ev;
    else r.event(ev);
  }
  r.close();
  return stderr.text.trimEnd().split("\n");
}

const killed = (rank: number, pid: number): JobEvent => ({
  kind: "rank-failed",
  rank,
  pid,
  reason: "was killed by SIGKILL before finalizing",
  code: null,
  signal: "SIGKILL",
  stderrTail: ["lifeline: injected fault: killing this rank (step:5)"],
  error: "lifeline: injected fault: killing this rank (step:5)",
});
/** How a failure reads: the failure and its stderr's error line on one line (the stderr itself was forwarded already). */
const FAULT = ": lifeline: injected fault: killing this rank (step:5)";
const finished = (ok: boolean, restarts: number): JobEvent => ({
  kind: "job-finished",
  ok,
  exitCode: ok ? 0 : 137,
  wallMs: 9000,
  size: 2,
  finalized: ok ? 2 : 0,
  restarts,
  error: ok ? undefined : { code: "LAUNCH_RESTARTS", message: "rank 1 failed and --max-restarts 1 is used up" },
  results: [1, 2],
  resultsPath: undefined,
});
const up: JobEvent[] = [
  { kind: "rank-up", rank: 0, pid: 21 },
  { kind: "rank-up", rank: 1, pid: 22 },
];

describe("progress output of a cpr failure and its recovery", () => {
  it("a killed rank that is recovered: failure detected, recovery from the line, recovered (epoch, time); no error", () => {
    const lines = play("cpr", [
      { kind: "job-started", rendezvousMs: 300 },
      { kind: "line-committed", epoch: 3, durationMs: 40, bytes: 2048 },
      4000,
      killed(1, 12),
      { kind: "rank-exited", rank: 0, code: null, signal: "SIGKILL", killedByLauncher: true },
      4100,
      { kind: "job-restarting", attempt: 1, epoch: 3, restarts: 1 },
      ...up,
      5250,
      { kind: "job-started", rendezvousMs: 1150 },
      9000,
      finished(true, 1),
    ]);
    expect(lines.slice(1, 9)).toEqual([
      "lifeline: all 2 ranks up after 0.30s",
      "lifeline: recovery line 3 committed (2048 bytes, 0.04s)",
      `lifeline: failure detected: rank 1 (pid 12) was killed by SIGKILL before finalizing${FAULT}`,
      "lifeline: recovery 1: every rank restarts (attempt 1) from recovery line 3",
      "lifeline: all 2 ranks up after 1.15s",
      "lifeline: recovered from rank 1's failure (was killed by SIGKILL before finalizing): rolled back to epoch 3, every rank running again 1.25s after the failure was detected",
      "lifeline: done: 2/2 ranks finalized in 9.00s, 1 restart",
      "lifeline: results:",
    ]);
    expect(lines.join("\n")).not.toMatch(/error/);
  });

  it("before the first line: recovered by restarting from the beginning", () => {
    const lines = play("cpr", [
      { kind: "job-started", rendezvousMs: 300 },
      1000,
      killed(0, 11),
      { kind: "job-restarting", attempt: 1, epoch: 0, restarts: 1 },
      ...up,
      1500,
      { kind: "job-started", rendezvousMs: 400 },
    ]);
    expect(lines).toContain("lifeline: recovery 1: every rank restarts (attempt 1) from the beginning (no line committed yet)");
    expect(lines).toContain(
      "lifeline: recovered from rank 0's failure (was killed by SIGKILL before finalizing): restarted from the beginning (no line was committed), every rank running again 0.50s after the failure was detected",
    );
  });

  it("a recovered failure, then a final one: the first reads as detected and recovered, only the last as an error", () => {
    const lines = play("cpr", [
      { kind: "job-started", rendezvousMs: 300 },
      1000,
      killed(1, 12),
      { kind: "job-restarting", attempt: 1, epoch: 2, restarts: 1 },
      ...up,
      2000,
      { kind: "job-started", rendezvousMs: 900 },
      5000,
      killed(1, 22),
      { kind: "job-stopping", reason: "--max-restarts 1 is used up" },
      finished(false, 1),
    ]);
    const text = lines.join("\n");
    expect(text).toContain("lifeline: failure detected: rank 1 (pid 12) was killed by SIGKILL before finalizing");
    expect(text).toContain("lifeline: recovered from rank 1's failure");
    expect(lines.filter((l) => l.startsWith("lifeline: error:"))).toEqual([
      `lifeline: error: rank 1 (pid 22) was killed by SIGKILL before finalizing${FAULT}`,
      "lifeline: error: stopping the job: --max-restarts 1 is used up",
    ]);
    expect(text).not.toContain(`(pid 12) was killed by SIGKILL before finalizing${FAULT}\nlifeline: error`);
    expect(lines[lines.length - 1]).toMatch(/^lifeline: job failed \(exit 137\)/);
  });

  it("a final failure with no job-stopping event is still printed as an error before the summary", () => {
    const lines = play("cpr", [{ kind: "job-started", rendezvousMs: 300 }, killed(1, 12), finished(false, 0)]);
    expect(lines).toContain(`lifeline: error: rank 1 (pid 12) was killed by SIGKILL before finalizing${FAULT}`);
  });

  it("mode none: a failure is an error at once, as before", () => {
    const lines = play("none", [{ kind: "job-started", rendezvousMs: 300 }, killed(1, 12)]);
    expect(lines).toContain(`lifeline: error: rank 1 (pid 12) was killed by SIGKILL before finalizing${FAULT}`);
  });
});

describe("progress output of a retry-one failure and its recovery", () => {
  const restarting = (rank: number, attempt: number, restarts: number): JobEvent => ({
    kind: "rank-restarting",
    rank,
    attempt,
    delayMs: 90,
    restarts,
    maxRestarts: 3,
    after: `rank ${rank} was killed by SIGKILL before finalizing`,
  });
  const caughtUp = (rank: number, attempt: number, restored: number, replayed: number): JobEvent => ({
    kind: "rank-caught-up",
    rank,
    attempt,
    restored,
    version: restored + 1,
    seqno: 0,
    replayed,
  });

  it("restart announced before the failure's output drained: failure detected, restarting alone, recovered; no error", () => {
    const lines = play("retry-one", [
      { kind: "job-started", rendezvousMs: 300 },
      4000,
      restarting(1, 1, 1),
      4020,
      killed(1, 12),
      { kind: "rank-up", rank: 1, pid: 31 },
      4470,
      caughtUp(1, 1, 7, 3),
      9000,
      finished(true, 1),
    ]);
    expect(lines.slice(1, 6)).toEqual([
      "lifeline: all 2 ranks up after 0.30s",
      "lifeline: restarting rank 1 alone (attempt 1) in 90 ms, restart 1 of at most 3; the other ranks keep running",
      `lifeline: failure detected: rank 1 (pid 12) was killed by SIGKILL before finalizing${FAULT}`,
      "lifeline: recovered from rank 1's failure (was killed by SIGKILL before finalizing): restored checkpoint version 7 from its peers, 3 collective results replayed from the others' buffers, caught up 0.47s after the failure was detected",
      "lifeline: done: 2/2 ranks finalized in 9.00s, 1 restart",
    ]);
    expect(lines.join("\n")).not.toMatch(/error/);
  });

  it("failure reported first, then the restart: the same story; before any checkpoint it restarts from the beginning", () => {
    const lines = play("retry-one", [{ kind: "job-started", rendezvousMs: 300 }, 1000, killed(0, 11), 1010, restarting(0, 1, 1), 1600, caughtUp(0, 1, 0, 1)]);
    expect(lines.slice(2)).toEqual([
      `lifeline: failure detected: rank 0 (pid 11) was killed by SIGKILL before finalizing${FAULT}`,
      "lifeline: restarting rank 0 alone (attempt 1) in 90 ms, restart 1 of at most 3; the other ranks keep running",
      "lifeline: recovered from rank 0's failure (was killed by SIGKILL before finalizing): restarted from the beginning (no checkpoint yet), 1 collective result replayed from the others' buffers, caught up 0.60s after the failure was detected",
    ]);
  });

  it("a failure no restart follows (--max-restarts used up) is an error", () => {
    const lines = play("retry-one", [
      { kind: "job-started", rendezvousMs: 300 },
      1000,
      restarting(1, 1, 1),
      killed(1, 12),
      1500,
      caughtUp(1, 1, 2, 0),
      5000,
      killed(1, 22),
      { kind: "job-stopping", reason: "--max-restarts 1 is used up" },
      finished(false, 1),
    ]);
    expect(lines.filter((l) => l.startsWith("lifeline: error:"))).toEqual([
      `lifeline: error: rank 1 (pid 22) was killed by SIGKILL before finalizing${FAULT}`,
      "lifeline: error: stopping the job: --max-restarts 1 is used up",
    ]);
    expect(lines).toContain(`lifeline: failure detected: rank 1 (pid 12) was killed by SIGKILL before finalizing${FAULT}`);
  });
});
