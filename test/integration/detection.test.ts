/**
 * Goal: each detector meets its bound, measured from the moment the rank died or froze, and
 * the supervision around it behaves: a process exit is seen within 100 ms (asserted < 1 s, a
 * loaded 2-core box), a frozen rank (SIGSTOP) within --failure-timeout plus one detector tick,
 * a rank waiting forever on a message nobody sends within --stuck-timeout and reported as
 * "stuck"; every failure lands in the error file, also when the job recovers; the restart
 * back-off follows the seeded jitter; --restart-reset forgives restarts after a healthy
 * stretch; an exhausted --max-restarts ends with the worst rank's exit code and an error that
 * names the ranks and causes.
 *
 * Method: runJob in-process (the path `lifeline run` takes) on test/fixtures/launch/paced.ts
 * with a reporter that stamps every event with the wall clock. The rank's fault hook writes
 * the wall-clock time of its SIGKILL/SIGSTOP (src/mpi/faults.ts), the stall fixture the time
 * it starts waiting; detection = supervisor's event time - that time. cpr runs use
 * `--checkpoint-every 1000steps` (no line: every restart is from the beginning). 2 ranks.
 * The measured medians are printed (docs/detection.md quotes them).
 */
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { seededRandom, backoffDelayMs } from "../../src/launch/backoff.ts";
import { resolveRunConfig, type RunFlags } from "../../src/launch/options.ts";
import type { JobEvent, Reporter } from "../../src/launch/progress.ts";
import { runJob } from "../../src/launch/run.ts";
import type { FailureRecord, JobOutcome } from "../../src/launch/supervisor.ts";
import { FIXTURES, tempDir, requireBuild, ROOT, waitGone } from "../launch/helpers.ts";

const { dir, cleanup } = tempDir("lifeline-detect-");
afterAll(cleanup);
beforeAll(requireBuild);

const PACED = join(FIXTURES, "paced.ts");
const TEST_MS = 40_000;

interface Stamped {
  wallMs: number;
  ev: JobEvent | { kind: "output"; rank: number; line: string };
}

/** Records every event and rank stderr line with the wall-clock time it reached the launcher. */
class WallClockReporter implements Reporter {
  readonly events: Stamped[] = [];
  event(ev: JobEvent): void {
    this.events.push({ wallMs: wallNow(), ev });
  }
  rankLine(rank: number, stream: "stdout" | "stderr", line: string): void {
    if (stream === "stderr") this.events.push({ wallMs: wallNow(), ev: { kind: "output", rank, line } });
  }
  close(): void {}
  of<K extends JobEvent["kind"]>(kind: K): { wallMs: number; ev: Extract<JobEvent, { kind: K }> }[] {
    return this.events.filter((e) => e.ev.kind === kind) as { wallMs: number; ev: Extract<JobEvent, { kind: K }> }[];
  }
  /** Wall-clock times a rank reported for its faults ("... at <ms>") or its stall ("stalling at <ms>"). */
  stamps(): { rank: number; atMs: number }[] {
    return this.events.flatMap((e) => {
      if (e.ev.kind !== "output") return [];
      const m = /(?:injected fault: .* at|stalling at) (\d+(?:\.\d+)?)\s*$/.exec(e.ev.line);
      return m === null ? [] : [{ rank: e.ev.rank, atMs: Number(m[1]) }];
    });
  }
}

function wallNow(): number {
  return performance.timeOrigin + performance.now();
}

let runs = 0;
async function job(
  flags: Omit<RunFlags, "np" | "app" | "appArgs">,
  appArgs: string[],
  random?: () => number,
): Promise<{ outcome: JobOutcome; rec: WallClockReporter; errors: { failures: FailureRecord[] } | undefined; errorFile: string }> {
  const store = join(dir, `store${runs++}`);
  const config = resolveRunConfig({ np: "2", store, ...flags, app: PACED, appArgs }, { cwd: ROOT });
  const rec = new WallClockReporter();
  const outcome = await runJob(config, {
    stdout: { write: () => true },
    stderr: { write: () => true },
    env: process.env,
    handleSignals: false,
    reporter: rec,
    ...(random === undefined ? {} : { random }),
  });
  expect(await waitGone(outcome.pids, 2_000)).toEqual([]);
  const errorFile = config.errorFile ?? join(store, "errors.json");
  const errors = existsSync(errorFile) ? (JSON.parse(readFileSync(errorFile, "utf8")) as { failures: FailureRecord[] }) : undefined;
  return { outcome, rec, errors, errorFile };
}

/** Detection latencies: from each stamped death/freeze of `rank` to the next matching supervisor event. */
function latencies(rec: WallClockReporter, pick: (e: Stamped) => boolean): number[] {
  const out: number[] = [];
  for (const s of rec.stamps()) {
    const seen = rec.events.find((e) => e.wallMs >= s.atMs && pick(e));
    if (seen !== undefined) out.push(seen.wallMs - s.atMs);
  }
  return out;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 === 1 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}

function context(r: { outcome: JobOutcome; rec: WallClockReporter }): string {
  return `exit ${r.outcome.exitCode}: ${r.outcome.error?.message ?? ""}\n${r.rec.events
    .filter((e) => e.ev.kind !== "rank-step")
    .map((e) => JSON.stringify(e.ev))
    .join("\n")}`;
}

const exitedRank1 = (e: Stamped): boolean => e.ev.kind === "rank-exited" && e.ev.rank === 1 && !e.ev.killedByLauncher;
const failedRank1 = (e: Stamped): boolean => e.ev.kind === "rank-failed" && e.ev.rank === 1;

describe("detection bounds", () => {
  it(
    "process exit: seen at once (mode none and cpr); the failures are in the error file, also when the job recovers",
    async () => {
      const none = await job({ mode: "none", inject: ["1@step:3"] }, ["40", "20"]);
      expect(none.outcome.exitCode, context(none)).toBe(137);
      // Three deaths in a row, each in a fresh attempt, then a clean attempt.
      const kills = ["1@step:3", "1@step:3@attempt=1", "1@step:3@attempt=2"];
      const cpr = await job({ mode: "cpr", checkpointEvery: "1000steps", maxRestarts: "3", inject: kills }, ["40", "20"], seededRandom(5));
      expect(cpr.outcome.exitCode, context(cpr)).toBe(0);
      expect(cpr.outcome.restarts).toBe(3);

      const exited = [...latencies(none.rec, exitedRank1), ...latencies(cpr.rec, exitedRank1)];
      const failed = [...latencies(none.rec, failedRank1), ...latencies(cpr.rec, failedRank1)];
      expect(exited).toHaveLength(4);
      expect(failed).toHaveLength(4);
      console.log(
        `detection, process exit: rank-exited ${exited.map(Math.round).join(", ")} ms (median ${median(exited).toFixed(1)}); rank-failed ${failed.map(Math.round).join(", ")} ms (median ${median(failed).toFixed(1)})`,
      );
      for (const ms of exited) expect(ms).toBeLessThan(1_000);
      for (const ms of failed) expect(ms).toBeLessThan(1_000);

      // The error file of the recovered job holds all three failures, in order.
      expect(
        cpr.errors?.failures.map((f) => [f.rank, f.attempt, f.cause, f.signal, f.action]),
        context(cpr),
      ).toEqual([
        [1, 0, "signal", "SIGKILL", "restart"],
        [1, 1, "signal", "SIGKILL", "restart"],
        [1, 2, "signal", "SIGKILL", "restart"],
      ]);
      for (const f of cpr.errors!.failures) {
        expect(f.stderrTail.join("\n")).toMatch(/injected fault: killing this rank \(step:3\)/);
        expect(Date.parse(f.time)).toBeGreaterThan(Date.now() - 120_000);
      }
      expect(none.errors?.failures).toEqual([
        expect.objectContaining({ rank: 1, attempt: 0, cause: "signal", action: "fail-job", code: "LAUNCH_RANK_FAILED" }),
      ]);

      // The back-off followed the seeded jitter: restart n waited backoffDelayMs(n) of the same seed.
      const random = seededRandom(5);
      const expected = [1, 2, 3].map((n) => backoffDelayMs(n, { random }));
      const waited = cpr.rec.of("warning").flatMap((w) => {
        const m = /^restarting all 2 ranks in (\d+) ms/.exec(w.ev.message);
        return m === null ? [] : [Number(m[1])];
      });
      expect(waited).toEqual(expected);
    },
    TEST_MS,
  );

  it(
    "heartbeat: a frozen rank (SIGSTOP) is failed within --failure-timeout plus a tick, and the job recovers",
    async () => {
      const r = await job({ mode: "cpr", checkpointEvery: "1000steps", heartbeat: "100ms", failureTimeout: "1s", inject: ["1@hang:step:5"] }, ["60", "20"]);
      expect(r.outcome.exitCode, context(r)).toBe(0);
      const [ms] = latencies(r.rec, failedRank1);
      console.log(`detection, heartbeat (--heartbeat 100ms --failure-timeout 1s): ${ms?.toFixed(1)} ms from SIGSTOP to rank-failed`);
      // The last beat heard left about one interval (plus scheduling delays on a loaded box) before
      // the freeze; the detector ticks every 250 ms.
      expect(ms).toBeGreaterThanOrEqual(1_000 - 300);
      expect(ms).toBeLessThan(1_000 + 250 + 750);
      expect(r.errors?.failures).toEqual([expect.objectContaining({ rank: 1, attempt: 0, cause: "heartbeat", code: "LAUNCH_HEARTBEAT", action: "restart" })]);
    },
    TEST_MS,
  );

  it(
    "stuck: a rank waiting forever on a message nobody sends is failed as stuck (not crashed) within --stuck-timeout, and the job recovers",
    async () => {
      const r = await job({ mode: "cpr", checkpointEvery: "1000steps", stuckTimeout: "1s" }, ["100", "20", "stall"]);
      expect(r.outcome.exitCode, context(r)).toBe(0);
      const failed = r.rec.of("rank-failed");
      expect(failed.map((f) => f.ev.rank)).toEqual([1]);
      expect(failed[0]!.ev.reason).toMatch(/reached no step boundary .* \(--stuck-timeout 1000 ms\): stuck, killed/);
      expect(failed[0]!.ev.reason).not.toMatch(/crash|SIGKILL/);
      const [ms] = latencies(r.rec, failedRank1);
      console.log(`detection, stuck (--stuck-timeout 1s): ${ms?.toFixed(1)} ms from the start of the wait to rank-failed`);
      // Step reports are batched (at most one per 200 ms), so the detector may date the last step
      // up to 200 ms early; it ticks every 250 ms.
      expect(ms).toBeGreaterThanOrEqual(1_000 - 250);
      expect(ms).toBeLessThan(1_000 + 250 + 750);
      expect(r.errors?.failures).toEqual([expect.objectContaining({ rank: 1, attempt: 0, cause: "stuck", code: "LAUNCH_STUCK", action: "restart" })]);
    },
    TEST_MS,
  );
});

describe("restart policy", () => {
  // Rank 1 dies at its 3rd step in attempt 0, and 2.5 s into attempt 1 (healthy for > 1 s by then).
  const kills = ["1@step:3", "1@time:2500@attempt=1"];
  const args = ["150", "20"];

  it(
    "--max-restarts exhausted: the worst rank's exit code (128+9) and an error naming the ranks and causes",
    async () => {
      const r = await job({ mode: "cpr", checkpointEvery: "1000steps", maxRestarts: "1", inject: kills }, args);
      expect(r.outcome.exitCode, context(r)).toBe(137);
      expect(r.outcome.error?.code).toBe("LAUNCH_RESTARTS");
      expect(r.outcome.summary).toMatch(
        /giving up: the job was already restarted 1 time\(s\) \(--max-restarts 1\); failed rank 1; failures in order: rank 1 \(attempt 0\): killed by SIGKILL; rank 1 \(attempt 1\): killed by SIGKILL$/,
      );
      expect(r.errors?.failures.map((f) => [f.attempt, f.action])).toEqual([
        [0, "restart"],
        [1, "fail-job"],
      ]);
    },
    TEST_MS,
  );

  it(
    "--restart-reset: after a healthy stretch the restarts so far no longer count",
    async () => {
      const r = await job({ mode: "cpr", checkpointEvery: "1000steps", maxRestarts: "1", restartReset: "1s", inject: kills }, args);
      expect(r.outcome.exitCode, context(r)).toBe(0);
      expect(r.outcome.restarts).toBe(2);
      const restarting = r.rec
        .of("warning")
        .map((w) => w.ev.message)
        .filter((m) => m.startsWith("restarting"));
      expect(restarting[0]).toMatch(/\(restart 1 of at most 1\)/);
      expect(restarting[1]).toMatch(/\(restart 1 of at most 1 since the last --restart-reset; 2 in all\)/);
    },
    TEST_MS,
  );
});
