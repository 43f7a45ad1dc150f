/**
 * Goal: a cpr job whose launcher dies (SIGKILL: a reboot, a batch time limit) is continued by
 * running the same command again — from its newest recovery line, not from the beginning,
 * with results bit-identical to an uninterrupted run — and a store is never taken over by
 * another job without `--fresh`.
 *
 * Method: the built launcher (`node dist/cli.js run --json`) runs the heat stencil with a
 * line every 100 ms; the test SIGKILLs the launcher process once two lines are committed
 * (from its `line-committed` events), checks that every rank process it had started ends by
 * itself (their watch pipe closed), and runs the same command again, with `--resume` and
 * without. The `--results` ranks are compared with a `--mode none` run of the same program;
 * `job-resuming` names the line, and the resumed run's step reports show it did not redo the
 * iterations before it. Refusals: other arguments, another `-n`, and `--resume` with nothing
 * to resume exit 2 before any rank starts, naming what the store holds; `--fresh` starts over.
 */
import { beforeAll, describe, expect, it } from "vitest";
import { context, runDirFor, runLauncher, type RunOutcome } from "./cpr-run.ts";

const TIMEOUT_MS = 60_000;
const HEAT = "examples/heat.ts";
/** Long enough that two lines (100 ms apart) commit well before the end; the residual stop is off. */
const ITERS = 2500;
const ARGS = ["--rows", "96", "--cols", "96", "--iters", String(ITERS), "--tol", "0"];
const NP = 3;
const CPR = ["--mode", "cpr", "--checkpoint-every", "100ms"];

const runs = runDirFor("lifeline-resume-");
let reference: unknown[];

beforeAll(async () => {
  const ref = await runLauncher({ np: NP, program: HEAT, args: ARGS, flags: ["--mode", "none"], dir: runs.path, name: "reference", timeoutMs: TIMEOUT_MS });
  expect(ref.code, context(ref)).toBe(0);
  reference = ref.doc!.ranks;
}, TIMEOUT_MS);

interface Killed {
  outcome: RunOutcome;
  /** Lines committed before the kill, in order. */
  lines: number[];
  /** Pids of the rank processes the killed launcher had started. */
  pids: number[];
}

/** Runs the job in store `name` and SIGKILLs its launcher once `lines` lines are committed (`after`: counting only lines newer than it). */
async function runAndKill(name: string, lines: number, extra: readonly string[] = [], after = 0): Promise<Killed> {
  let launcher: number | undefined;
  const committed: number[] = [];
  const pids: number[] = [];
  let killed = false;
  const outcome = await runLauncher({
    np: NP,
    program: HEAT,
    args: ARGS,
    flags: [...CPR, ...extra],
    dir: runs.path,
    name,
    timeoutMs: TIMEOUT_MS,
    onSpawn: (pid) => {
      launcher = pid;
    },
    onEvent: (ev) => {
      if (ev.event === "rank-spawned") pids.push(ev.pid as number);
      if (ev.event !== "line-committed" || killed) return;
      committed.push(ev.epoch as number);
      if (committed.filter((e) => e > after).length >= lines) {
        killed = true;
        process.kill(launcher!, "SIGKILL");
      }
    },
  });
  expect(killed, `the job ended before ${lines} line(s) were committed: ${context(outcome)}`).toBe(true);
  expect(outcome.code).toBeNull(); // killed by a signal: no exit code
  return { outcome, lines: committed, pids };
}

/** Every pid is gone within `ms` (ranks end by themselves when their launcher dies). */
async function allGone(pids: readonly number[], ms = 5_000): Promise<number[]> {
  const deadline = Date.now() + ms;
  let alive = [...pids];
  while (alive.length > 0 && Date.now() < deadline) {
    alive = alive.filter((pid) => {
      try {
        process.kill(pid, 0);
        return true;
      } catch {
        return false;
      }
    });
    if (alive.length > 0) await new Promise((r) => setTimeout(r, 50));
  }
  return alive;
}

/** Runs the job in store `name` to its end, collecting the events a test checks. */
async function runToEnd(name: string, extra: readonly string[] = [], args: readonly string[] = ARGS, np = NP) {
  const events: Record<string, unknown>[] = [];
  const outcome = await runLauncher({
    np,
    program: HEAT,
    args,
    flags: [...CPR, ...extra],
    dir: runs.path,
    name,
    timeoutMs: TIMEOUT_MS,
    onEvent: (ev) => events.push(ev),
  });
  const maxSteps = Math.max(0, ...events.filter((e) => e.event === "rank-step").map((e) => e.steps as number));
  return { outcome, events, resuming: events.find((e) => e.event === "job-resuming"), maxSteps };
}

describe("resuming a cpr job whose launcher died", () => {
  it(
    "SIGKILL after two lines: no rank is left, --resume continues from the newest line, bit-identical; and again after a second kill",
    async () => {
      const first = await runAndKill("twice", 2);
      expect(await allGone(first.pids), "rank processes outlived their launcher").toEqual([]);

      // The second run: resumed from the newest line the first one committed, then killed too
      // once it has committed a line of its own.
      const newest = Math.max(...first.lines);
      const second = await runAndKill("twice", 1, ["--resume"], newest);
      expect(await allGone(second.pids)).toEqual([]);
      expect(second.outcome.stderr).toContain(`"event":"job-resuming"`);
      expect(second.outcome.stderr).toMatch(new RegExp(`"event":"job-resuming","job":"heat-[0-9a-f]{8}","run":2,"epoch":${newest},`));
      expect(Math.max(...second.lines)).toBeGreaterThan(newest); // the resumed run commits lines of its own

      // The third run (no flag: a requeue runs the same command) resumes from the second's newest line.
      const third = await runToEnd("twice");
      expect(third.outcome.code, context(third.outcome)).toBe(0);
      expect(third.resuming).toMatchObject({ run: 3, epoch: Math.max(...second.lines), lineRun: 2, previousState: "running" });
      expect(third.outcome.doc!.ranks).toEqual(reference);
      expect(third.outcome.doc).toMatchObject({ run: 3, restarts: 0, recovery: { resumedFrom: Math.max(...second.lines) } });
      // It really started from the line: its ranks did only the iterations after it.
      expect(third.maxSteps).toBeGreaterThan(0);
      expect(third.maxSteps).toBeLessThan(ITERS);
    },
    4 * TIMEOUT_MS,
  );

  it(
    "a job that finished is not resumed: the same command runs it again from the beginning; --resume says there is nothing to resume",
    async () => {
      const done = await runToEnd("finished");
      expect(done.outcome.code, context(done.outcome)).toBe(0);
      expect(done.outcome.doc!.recovery!.linesCommitted.length).toBeGreaterThan(0);
      const again = await runToEnd("finished");
      expect(again.outcome.code, context(again.outcome)).toBe(0);
      expect(again.resuming).toBeUndefined();
      expect(again.outcome.stderr).toMatch(/discarding the \d+ recovery line\(s\) in .*: they belong to run 1 of this job, which finished at/);
      expect(again.outcome.doc!.ranks).toEqual(reference);
      expect(again.maxSteps).toBe(ITERS);
      const insist = await runToEnd("finished", ["--resume"]);
      expect(insist.outcome.code).toBe(2);
      expect(insist.outcome.stderr).toMatch(/--resume: the job in the store .* finished at .*; there is nothing to resume/);
      expect(insist.events.filter((e) => e.event === "rank-spawned")).toEqual([]);
    },
    4 * TIMEOUT_MS,
  );

  it(
    "a store holding another job's lines is refused (other arguments, another -n) without --fresh; --fresh starts over",
    async () => {
      await runAndKill("other", 1);
      const otherArgs = await runToEnd(
        "other",
        [],
        ARGS.map((a) => (a === String(ITERS) ? String(ITERS - 1) : a)),
      );
      expect(otherArgs.outcome.code).toBe(2);
      const message = otherArgs.outcome.stderr;
      expect(message).toMatch(
        /error: the store .*other\.store holds 1 recovery line \(newest: line \d+, .*, committed .*\) of job heat-[0-9a-f]{8} \(run 1, ended without finishing/,
      );
      expect(message).toContain(`heat.ts --rows 96 --cols 96 --iters ${ITERS} --tol 0 on ${NP} ranks`);
      expect(message).toContain("(other arguments)");
      expect(message).toContain("add --fresh");
      expect(otherArgs.events.filter((e) => e.event === "rank-spawned")).toEqual([]);

      const otherSize = await runToEnd("other", [], ARGS, NP - 1);
      expect(otherSize.outcome.code).toBe(2);
      expect(otherSize.outcome.stderr).toContain(`(-n ${NP - 1}, not ${NP})`);

      const fresh = await runToEnd("other", ["--fresh"]);
      expect(fresh.outcome.code, context(fresh.outcome)).toBe(0);
      expect(fresh.resuming).toBeUndefined();
      expect(fresh.outcome.stderr).toMatch(/discarding the 1 recovery line\(s\) in .*: --fresh/);
      expect(fresh.outcome.doc!.ranks).toEqual(reference);
      expect(fresh.outcome.doc).toMatchObject({ run: 1 });
      expect(fresh.maxSteps).toBe(ITERS);
    },
    5 * TIMEOUT_MS,
  );

  it(
    "--resume with an empty store is refused; --resume and --fresh are usage errors where nothing is kept (mode none, retry-one without its durable floor)",
    async () => {
      const empty = await runToEnd("empty", ["--resume"]);
      expect(empty.outcome.code).toBe(2);
      expect(empty.outcome.stderr).toMatch(/--resume: the store .* holds no recovery line, so there is nothing to resume/);
      const none = await runLauncher({
        np: 2,
        program: HEAT,
        args: ARGS,
        flags: ["--mode", "none", "--resume"],
        dir: runs.path,
        name: "none",
        timeoutMs: TIMEOUT_MS,
      });
      expect(none.code).toBe(2);
      expect(none.stderr).toContain("--resume needs recovery lines, and --mode none keeps none");
      const retry = await runLauncher({
        np: 2,
        program: HEAT,
        args: ARGS,
        flags: ["--mode", "retry-one", "--durable-every", "0", "--fresh"],
        dir: runs.path,
        name: "retry",
        timeoutMs: TIMEOUT_MS,
      });
      expect(retry.code).toBe(2);
      expect(retry.stderr).toContain("--fresh: --mode retry-one keeps its checkpoints in the ranks' memory, and its durable floor is off");
    },
    3 * TIMEOUT_MS,
  );
});
