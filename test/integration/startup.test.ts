/**
 * Goal: faults at start-up are what they are. A rank that freezes before it joins (SIGSTOP
 * before `init()`) is a failure like any other — killed and restarted in cpr and retry-one,
 * the job recovering bit-identically well before the rendezvous timeout — and a program that
 * fails the same way twice before its first `checkpoint()` (a bad argument) is a bug: two
 * attempts, one clear message, its error shown once.
 *
 * Method: the built launcher with `--json` (or plain output for the message checks). The
 * examples run behind test/fixtures/launch/late-start.ts, which waits 1.5 s before loading
 * them; the test SIGSTOPs rank 1's first process 100–300 ms after its `rank-spawned` event, so
 * it has certainly not called `init()` yet. Results are compared with a `--mode none` run of
 * the same. The crash loop uses a fixture that rejects its argument before `init()`.
 */
import { randomInt } from "node:crypto";
import { describe, expect, it } from "vitest";
import { context, runDirFor, runLauncher } from "./cpr-run.ts";

const TIMEOUT_MS = 60_000;
const LATE = "test/fixtures/launch/late-start.ts";
const runs = runDirFor("lifeline-startup-");

const cases = [
  { mode: "cpr", program: LATE, args: ["heat", "--rows", "64", "--cols", "64", "--iters", "300"], flags: ["--checkpoint-every", "50steps"] },
  { mode: "retry-one", program: LATE, args: ["logreg", "--steps", "60"], flags: ["--no-spare"] },
] as const;

describe("a rank frozen before it joins", () => {
  for (const c of cases) {
    it(
      `${c.mode}: is failed after --start-timeout, restarted, and the job finishes bit-identical, long before the rendezvous timeout`,
      async () => {
        const ref = await runLauncher({
          np: 3,
          program: c.program,
          args: c.args,
          flags: ["--mode", "none"],
          dir: runs.path,
          name: `${c.mode}-ref`,
          timeoutMs: TIMEOUT_MS,
        });
        expect(ref.code, context(ref)).toBe(0);
        let stoppedPid: number | undefined;
        const delay = 100 + randomInt(200); // the rank waits 1.5 s before it loads the example
        const started = Date.now();
        const o = await runLauncher({
          np: 3,
          program: c.program,
          args: c.args,
          // Healthy ranks join 1.5 s (the fixture's wait) plus Node's start-up after they spawn:
          // 2.3-3.1 s on a slow machine under a test run's load, so 3 s was too tight.
          flags: ["--mode", c.mode, "--start-timeout", "6s", ...c.flags],
          dir: runs.path,
          name: c.mode,
          timeoutMs: TIMEOUT_MS,
          onEvent: (ev) => {
            if (ev.event === "rank-spawned" && ev.rank === 1 && ev.attempt === 0) {
              const pid = ev.pid as number;
              setTimeout(() => {
                stoppedPid = pid;
                process.kill(pid, "SIGSTOP");
              }, delay);
            }
          },
        });
        const wallMs = Date.now() - started;
        expect(o.code, context(o)).toBe(0);
        expect(stoppedPid, "the rank was not frozen").toBeDefined();
        const failed = o.stderr
          .split("\n")
          .filter((l) => l.includes('"event":"rank-failed"'))
          .map((l) => JSON.parse(l) as Record<string, unknown>);
        expect(failed).toEqual([expect.objectContaining({ rank: 1, pid: stoppedPid })]);
        expect(failed[0]!.reason).toMatch(
          /^did not join the job within \d+ ms of starting \(--start-timeout 6000 ms\): still loading, stuck or frozen before init\(\), killed$/,
        );
        expect(o.doc!.ranks).toEqual(ref.doc!.ranks);
        expect(o.doc!.restarts).toBe(1);
        // Recovered by the start-up deadline, not by the 30 s rendezvous timeout.
        expect(wallMs).toBeLessThan(25_000);
        expect(o.stderr).not.toContain("LAUNCH_RENDEZVOUS");
      },
      3 * TIMEOUT_MS,
    );
  }

  it(
    "a restarted rank is watched afresh: one that freezes in its second attempt is caught by heartbeats too",
    async () => {
      // Regression: a restart left every rank unwatched (the detector forgot them for good), so
      // a freeze after a restart hung the job.
      const args = ["--rows", "64", "--cols", "64", "--iters", "300"];
      const ref = await runLauncher({
        np: 2,
        program: "examples/heat.ts",
        args,
        flags: ["--mode", "none"],
        dir: runs.path,
        name: "again-ref",
        timeoutMs: TIMEOUT_MS,
      });
      const o = await runLauncher({
        np: 2,
        program: "examples/heat.ts",
        args,
        dir: runs.path,
        name: "again",
        timeoutMs: TIMEOUT_MS,
        flags: [
          "--mode",
          "cpr",
          "--checkpoint-every",
          "50steps",
          "--heartbeat",
          "100",
          "--failure-timeout",
          "1s",
          "--inject",
          "1@step:5",
          "--inject",
          "1@hang:step:5@attempt=1",
        ],
      });
      expect(o.code, context(o)).toBe(0);
      expect(o.doc!.restarts).toBe(2);
      expect(o.stderr).toMatch(
        /"event":"rank-failed","rank":1,[^\n]*"reason":"sent no heartbeat for \d+ ms \(--failure-timeout 1000 ms\): frozen or unreachable, killed"/,
      );
      expect(o.doc!.ranks).toEqual(ref.doc!.ranks);
    },
    TIMEOUT_MS,
  );

  it(
    "mode none: the job fails fast with LAUNCH_START",
    async () => {
      const o = await runLauncher({
        np: 2,
        program: "examples/heat.ts",
        args: ["--iters", "50"],
        flags: ["--mode", "none", "--start-timeout", "2s"],
        dir: runs.path,
        name: "none",
        timeoutMs: TIMEOUT_MS,
        onEvent: (ev) => {
          if (ev.event === "rank-spawned" && ev.rank === 0) setTimeout(() => process.kill(ev.pid as number, "SIGSTOP"), 100);
        },
      });
      expect(o.code).toBe(1);
      expect(o.doc!.error).toMatchObject({ code: "LAUNCH_START" });
      expect(o.doc!.error!.message).toMatch(/^rank 0 \(pid \d+\) did not join the job within \d+ ms of starting/);
    },
    TIMEOUT_MS,
  );
});

describe("a crash loop", () => {
  for (const mode of ["cpr", "retry-one"] as const) {
    it(
      `${mode}: a program that throws at start with a bad argument runs twice, then stops with one message that shows its error once`,
      async () => {
        const o = await runLauncher({
          np: 2,
          program: "test/fixtures/launch/bad-arg.ts",
          args: ["many"],
          flags: ["--mode", mode, "--no-spare"].slice(0, mode === "cpr" ? 2 : 3),
          dir: runs.path,
          name: `loop-${mode}`,
          timeoutMs: TIMEOUT_MS,
          human: true,
        });
        expect(o.code, o.stderr).toBe(1);
        const own = o.stderr.split("\n").filter((l) => l.startsWith("lifeline:"));
        const errors = own.filter((l) => l.startsWith("lifeline: error:"));
        expect(errors, o.stderr).toHaveLength(1);
        expect(errors[0]).toMatch(
          /the same failure as in attempt 0.*before the first checkpoint\(\).*\(RangeError: iterations must be a positive integer, got "many"\): a bug in the program or its arguments, not a fault a restart can fix/,
        );
        // The launcher quotes the error once per failure, in the failure's line; the stack trace
        // is only the ranks' own output. cpr: attempt 0's failure (every rank restarts), then the
        // loop; retry-one restarts each rank alone, so each rank's attempt 0 may be reported.
        const detected = own.filter((l) => l.startsWith("lifeline: failure detected:"));
        expect(detected.length).toBeGreaterThanOrEqual(1);
        expect(detected.length).toBeLessThanOrEqual(mode === "cpr" ? 1 : 2);
        for (const l of detected) expect(l).toMatch(/exited with code 1 before finalizing: RangeError: iterations must be a positive integer, got "many"$/);
        expect(own.filter((l) => l.includes("RangeError"))).toHaveLength(detected.length + 1);
        expect(own.filter((l) => l.includes("    at "))).toEqual([]);
        expect(own.filter((l) => l.startsWith("lifeline: job failed"))).toEqual([
          expect.stringMatching(/^lifeline: job failed \(exit 1\) after .*: see the error above$/),
        ]);
        expect(o.doc!.error!.code).toBe("LAUNCH_CRASH_LOOP");
        expect(o.doc!.restarts).toBe(mode === "cpr" ? 1 : detected.length);
        // Only two attempts ran (attempt 0 and one restart), so each of the 2 ranks printed its
        // error at most twice.
        const forwarded = o.stderr.split("\n").filter((l) => /^\[\d\] RangeError: iterations must be/.test(l));
        expect(forwarded.length).toBeGreaterThanOrEqual(2);
        for (const rank of [0, 1]) expect(forwarded.filter((l) => l.startsWith(`[${rank}]`)).length).toBeLessThanOrEqual(2);
      },
      TIMEOUT_MS,
    );
  }

  it(
    "failures that got past the first checkpoint() are faults, however alike: restarted up to --max-restarts",
    async () => {
      // crash.ts: rank 1 exits with code 3 after init() on every attempt, before any checkpoint:
      // that is a loop; with --inject at a step it is a fault, counted against --max-restarts.
      const o = await runLauncher({
        np: 2,
        program: "examples/heat.ts",
        args: ["--iters", "400", "--rows", "32", "--cols", "32"],
        flags: [
          "--mode",
          "cpr",
          "--checkpoint-every",
          "1000steps",
          "--max-restarts",
          "2",
          "--inject",
          "1@step:5",
          "--inject",
          "1@step:5@attempt=1",
          "--inject",
          "1@step:5@attempt=2",
        ],
        dir: runs.path,
        name: "faults",
        timeoutMs: TIMEOUT_MS,
      });
      expect(o.code, context(o)).toBe(137);
      expect(o.doc!.error!.code).toBe("LAUNCH_RESTARTS");
      expect(o.doc!.restarts).toBe(2);
    },
    TIMEOUT_MS,
  );
});
