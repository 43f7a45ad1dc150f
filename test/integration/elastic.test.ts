/**
 * Goal: under `--mode elastic`, real jobs go on with the ranks they have. A rank killed with
 * no way to restart it: the job finishes on the others, with results equal to a fault-free run
 * that changes its world the same way at the same checkpoint (`--replay` of the recorded
 * changes), and no process started again. A rank that starts late in a spare slot joins at a
 * checkpoint mid-job: five ranks from there on, again equal to the replay; so does a killed
 * rank's slot started again (4 → 3 → 4 ranks). A rank replaced by a
 * new process at a checkpoint (the joiner gets rank 0's state, and boosting re-derives its rows'
 * part) changes nothing: bit-identical to mode none. Repeated losses below --min-np end the job
 * with LAUNCH_TOO_FEW after --elastic-timeout; a point-to-point program is refused (MPI_MODE), and
 * so is a join whose checkpoint the links cannot carry (MPI_LIMIT);
 * `lifeline drill --mode elastic` compares a faulty run with the replay of its changes.
 *
 * Method: the built launcher (`node dist/cli.js run`, so `npm run build` must have run) on
 * examples/logreg.ts and examples/boosting.ts (the same programs every mode runs) and
 * bench/programs/elastic.ts (a model of any size), faults by
 * `--inject`, the --json events for pids and changes, the --results documents compared.
 */
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { resolveDrillConfig, runDrill } from "../../src/launch/drill.ts";
import { ROOT, Sink, waitGone } from "../launch/helpers.ts";
import { context, type RunOutcome, runDirFor, runLauncher } from "./cpr-run.ts";

const RUN_TIMEOUT_MS = 60_000;
const dir = runDirFor("lifeline-elastic-");
let runs = 0;

interface Change {
  at: number;
  size: number;
  keep: number[];
  joined: number;
}

interface Run extends RunOutcome {
  name: string;
  /** Pids each slot was started with, in order. */
  pids: number[][];
  changes: Change[];
  events: Record<string, unknown>[];
}

async function run(
  np: number,
  program: string,
  flags: readonly string[],
  args: readonly string[],
  watch?: (ev: Record<string, unknown>, pids: readonly number[][]) => void,
): Promise<Run> {
  const pids: number[][] = [];
  const events: Record<string, unknown>[] = [];
  const name = `run${runs++}`;
  const o = await runLauncher({
    np,
    program,
    flags: ["--mode", "elastic", ...flags],
    args,
    dir: dir.path,
    name,
    timeoutMs: RUN_TIMEOUT_MS,
    onEvent: (ev) => {
      events.push(ev);
      if (ev.event === "rank-spawned") (pids[ev.rank as number] ??= []).push(ev.pid as number);
      watch?.(ev, pids);
    },
  });
  const recovery = (o.doc as { recovery?: { changes?: Change[] } } | undefined)?.recovery;
  return { ...o, name, pids, changes: recovery?.changes ?? [], events };
}

/** Sends `sig` to `pid`; false if it is gone. */
function signal(pid: number, sig: NodeJS.Signals): boolean {
  try {
    process.kill(pid, sig);
    return true;
  } catch {
    return false;
  }
}

/** A fault-free run of the changes `r` recorded; its results must equal `r`'s. */
async function expectReplayEqual(r: Run, np: number, program: string, args: readonly string[]): Promise<Run> {
  const replay = await run(np, program, ["--replay", join(dir.path, `${r.name}.json`)], args);
  expect(replay.code, context(replay)).toBe(0);
  expect(replay.changes, context(replay)).toEqual(r.changes);
  expect(replay.doc?.ranks, context(replay)).toEqual(r.doc?.ranks);
  return replay;
}

describe("elastic jobs with real processes", () => {
  it(
    "logreg on 4 ranks, rank 1 killed with no restart: finishes on 3, equal to a fault-free run that shrinks at the same checkpoint; no process restarted",
    async () => {
      const args = ["--steps", "60"];
      const r = await run(4, "examples/logreg.ts", ["--max-restarts", "0", "--inject", "1@step:20"], args);
      expect(r.code, context(r)).toBe(0);
      expect(r.doc?.ranks, context(r)).toHaveLength(3);
      // One change: at the checkpoint the survivors all reached (rank 1 died entering its 20th), without rank 1.
      expect(r.changes, context(r)).toHaveLength(1);
      expect(r.changes[0], context(r)).toMatchObject({ size: 4, keep: [0, 2, 3], joined: 0 });
      expect(r.changes[0]!.at).toBeGreaterThanOrEqual(19);
      expect(r.changes[0]!.at).toBeLessThanOrEqual(20);
      expect(r.pids.map((p) => p.length)).toEqual([1, 1, 1, 1]);
      expect(r.doc?.restarts).toBe(0);
      expect(r.events.find((e) => e.event === "world-changed")).toMatchObject({ from: 4, to: 3, left: 1, rollback: true });
      const replay = await expectReplayEqual(r, 4, "examples/logreg.ts", args);
      // The replay changed its world without a fault: rank 1 left at that checkpoint, nobody died.
      expect(replay.events.some((e) => e.event === "rank-failed")).toBe(false);
      expect(await waitGone([...r.pids.flat(), ...replay.pids.flat()], 2_000)).toEqual([]);
    },
    3 * RUN_TIMEOUT_MS,
  );

  it(
    "a rank that starts late in a spare slot (--max-np 5) joins mid-job: 5 ranks from that checkpoint, equal to the replay",
    async () => {
      const args = ["4", "1000", "--steps", "2500"];
      const r = await run(4, "test/fixtures/elastic/late-slot.ts", ["--max-np", "5"], args);
      expect(r.code, context(r)).toBe(0);
      expect(r.doc?.ranks, context(r)).toHaveLength(5);
      expect(r.changes, context(r)).toHaveLength(1);
      expect(r.changes[0], context(r)).toMatchObject({ size: 4, keep: [0, 1, 2, 3], joined: 1 });
      // Mid-job: after some steps on 4 ranks, before the last.
      expect(r.changes[0]!.at).toBeGreaterThan(0);
      expect(r.changes[0]!.at).toBeLessThan(2500);
      expect(r.events.find((e) => e.event === "world-changed")).toMatchObject({ from: 4, to: 5, joined: 1, rollback: false });
      await expectReplayEqual(r, 4, "test/fixtures/elastic/late-slot.ts", args);
    },
    3 * RUN_TIMEOUT_MS,
  );

  it(
    "boosting with rank 3 replaced by a new process at checkpoint 5: the joiner gets rank 0's state and re-derives its rows; bit-identical to mode none",
    async () => {
      const args = ["--trees", "3"];
      const none = await run(4, "examples/boosting.ts", ["--mode", "none"], args);
      expect(none.code, context(none)).toBe(0);
      const plan = join(dir.path, "swap.json");
      await writeFile(plan, JSON.stringify({ recovery: { changes: [{ at: 5, size: 4, keep: [0, 1, 2], joined: 1 }] } }));
      const r = await run(4, "examples/boosting.ts", ["--replay", plan], args);
      expect(r.code, context(r)).toBe(0);
      expect(r.doc?.ranks, context(r)).toEqual(none.doc?.ranks);
      // Slot 4's process joined, slot 3's left at checkpoint 5.
      expect(r.pids.map((p) => p.length)).toEqual([1, 1, 1, 1, 1]);
    },
    3 * RUN_TIMEOUT_MS,
  );

  it(
    "boosting: a rank killed is started again and joins at a later checkpoint (4 → 3 → 4 ranks); equal to the replay",
    async () => {
      const args = ["--trees", "16"];
      // The new process must come up before the others finish, however long a loaded machine
      // takes to start it: they are stopped (SIGSTOP) from the restart's announcement until the
      // new process joined the job (init()), or ended. Their heartbeats stop meanwhile, hence the
      // failure timeout. Their results do not depend on when they run.
      const stopped: number[] = [];
      const resume = (): void => {
        for (const pid of stopped.splice(0)) signal(pid, "SIGCONT");
      };
      let restarted = false;
      const r = await run(4, "examples/boosting.ts", ["--inject", "2@step:4", "--failure-timeout", "20s"], args, (ev, pids) => {
        if (ev.event === "rank-restarting" && ev.rank === 2) {
          restarted = true;
          for (const slot of [0, 1, 3]) {
            const pid = pids[slot]!.at(-1)!;
            if (signal(pid, "SIGSTOP")) stopped.push(pid);
          }
        } else if (restarted && ev.rank === 2 && (ev.event === "rank-up" || ev.event === "rank-exited")) resume();
        else if (ev.event === "job-stopping" || ev.event === "job-finished") resume();
      }).finally(resume);
      expect(r.code, context(r)).toBe(0);
      expect(r.changes, context(r)).toEqual([
        { at: expect.any(Number), size: 4, keep: [0, 1, 3], joined: 0 },
        { at: expect.any(Number), size: 3, keep: [0, 1, 2], joined: 1 },
      ]);
      expect(r.doc?.ranks).toHaveLength(4);
      expect(r.pids[2]).toHaveLength(2);
      await expectReplayEqual(r, 4, "examples/boosting.ts", args);
    },
    3 * RUN_TIMEOUT_MS,
  );

  it(
    "losses down to --min-np 3 go on; one more fails the job with LAUNCH_TOO_FEW after --elastic-timeout",
    async () => {
      const r = await run(
        4,
        "examples/logreg.ts",
        ["--min-np", "3", "--max-restarts", "0", "--elastic-timeout", "1s", "--inject", "1@step:10", "--inject", "2@step:40"],
        ["--steps", "100000"],
      );
      expect(r.code, context(r)).not.toBe(0);
      expect(r.doc?.error?.code, context(r)).toBe("LAUNCH_TOO_FEW");
      expect(r.doc?.error?.message, context(r)).toMatch(/only 2 ranks left, fewer than --min-np 3.*--elastic-timeout/);
      // The first loss was survived: the world went on with 3 ranks.
      expect(
        r.events.filter((e) => e.event === "world-changed"),
        context(r),
      ).toEqual([expect.objectContaining({ from: 4, to: 3 })]);
      // It waited for ranks to join before it gave up.
      const died = r.events.filter((e) => e.event === "rank-exited" && e.rank === 2)[0]?.t as number;
      const stopped = r.events.find((e) => e.event === "job-stopping")?.t as number;
      expect(stopped - died, context(r)).toBeGreaterThanOrEqual(900);
      expect(await waitGone(r.pids.flat(), 2_000)).toEqual([]);
    },
    2 * RUN_TIMEOUT_MS,
  );

  it(
    "lifeline drill --mode elastic: a faulty run is compared with the fault-free replay of its changes",
    async () => {
      const stderr = new Sink();
      const config = resolveDrillConfig(
        { np: "4", mode: "elastic", maxRestarts: "0", kill: ["2@step:15"], app: "examples/logreg.ts", appArgs: ["--steps", "60"] },
        { cwd: ROOT },
      );
      const o = await runDrill(config, { stdout: new Sink(), stderr, env: { ...process.env, NO_COLOR: "1" }, handleSignals: false });
      expect(o.exitCode, stderr.text).toBe(0);
      expect(o.report.runs.map((r) => [r.label, r.verdict?.kind])).toEqual([
        ["faulty run", "identical"],
        ["replay of run 1", undefined],
      ]);
      expect(o.report.runs[0]!.result.results).toHaveLength(3);
      expect(stderr.text).toMatch(/fault 1 \(rank 2 @ step:15\): .*the others went back to checkpoint 1[45] and went on without it/);
      expect(stderr.text).toMatch(/PASS: the faulty run's results are bit-identical to the fault-free replay of their changes of the world/);
      const pids = o.report.runs.flatMap((r) => r.events.flatMap((e) => (e.ev.kind === "rank-spawned" ? [e.ev.pid] : [])));
      expect(await waitGone(pids, 2_000)).toEqual([]);
    },
    3 * RUN_TIMEOUT_MS,
  );

  it(
    "a point-to-point program (heat) is refused at its first send or receive: MPI_MODE, the job stops",
    async () => {
      const r = await run(2, "examples/heat.ts", [], ["--iters", "10"]);
      expect(r.code, context(r)).not.toBe(0);
      expect(r.doc?.error?.code, context(r)).toBe("MPI_MODE");
      expect(r.doc?.error?.message, context(r)).toMatch(/point-to-point messages are not supported in --mode elastic.*use collectives, or --mode cpr/);
    },
    RUN_TIMEOUT_MS,
  );

  it(
    "a joiner whose checkpoint is longer than --max-message: the job stops with MPI_LIMIT, saying what to raise (no wait for a frame the links drop)",
    async () => {
      // A 10 KiB model, 4 KiB frames at most; the collectives carry one number each.
      const r = await run(
        4,
        "bench/programs/elastic.ts",
        ["--max-np", "5", "--max-message", "4KiB"],
        ["--global-mib", "0.01", "--local-mib", "0.001", "--steps", "2000", "--step-ms", "5"],
      );
      expect(r.code, context(r)).not.toBe(0);
      expect(r.doc?.error?.code, context(r)).toBe("MPI_LIMIT");
      expect(r.doc?.error?.message, context(r)).toMatch(
        /checkpoint a joining rank needs \(\d+ bytes.*longer than the job's limit of 4096 bytes \(--max-message\); raise the limit/,
      );
    },
    RUN_TIMEOUT_MS,
  );
});
