/**
 * Goal: retry-one's durable floor. When more ranks fail at once than `--replicas` covers (the
 * ranks report CPR_LOST), every rank restarts from the newest consistent set of durable
 * checkpoints, with a warning saying what was lost, and the results are still bit-identical;
 * with no durable line yet it restarts from the beginning; without the floor the job fails
 * with CPR_LOST and says so. A retry-one job whose launcher was SIGKILLed resumes from its
 * newest durable line when the same command runs again.
 *
 * Method: the built launcher on 4 real ranks (examples/heat.ts: halos and an allreduce per
 * iteration, a checkpoint per iteration); two ranks, one holding the other's only replica
 * (`--replicas 1`), SIGKILLed by the test in one instant; `--results` compared with a
 * `--mode none` run.
 */
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { onJsonLines } from "../../src/testing/json-lines.ts";
import { waitGone } from "../launch/helpers.ts";
import { CLI, context, ROOT } from "./cpr-run.ts";
import { killTogetherAt, RUN_TIMEOUT_MS, type Run, retryOneRuns } from "./retry-one-run.ts";

const NP = 4;
const HEAT = "examples/heat.ts";
// 400 steps: the kills below come on a rank's step event, which the launcher passes on with a
// heartbeat, and heat at this size has run 50 steps between two of them (about 5 ms a step).
// With 100 steps, a kill could land after the job's end or past the first durable line.
const ARGS = ["--iters", "400", "--rows", "128", "--cols", "128"];
let dir: string;
const { run, expectOnlyRestarted } = retryOneRuns(() => dir, NP);
let ref: Run | undefined;

beforeAll(async () => {
  if (!existsSync(CLI)) throw new Error(`${CLI} is missing: run \`npm run build\` first`);
  dir = await mkdtemp(join(tmpdir(), "lifeline-r1dur-"));
});

afterAll(async () => {
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

async function reference(): Promise<Run> {
  ref ??= await run(HEAT, ["--mode", "none"], ARGS);
  expect(ref.code, context(ref)).toBe(0);
  return ref;
}

interface Recovery {
  ranksRestarted: number[];
  durableLines?: number[];
  fallbacks?: { attempt: number; line: number; versions: number[] }[];
  resumedFrom?: number;
}

describe("retry-one: the durable floor", () => {
  it(
    "a global model in every checkpoint, written every version while the ranks run on: the fallback restores each rank's own version of it, bit-identical",
    async () => {
      // The model is 256 KiB: its checkpoint copies come from the pooled memory that the
      // protocol reuses once a version is dropped, while the durable write of that version may
      // still be reading it (the store writes the global as it is, without a joined copy).
      const MODEL = "test/fixtures/retry-one/model-steps.ts";
      // Long enough that the kill (on a step event, which comes with a heartbeat) lands before the end.
      const args = ["--steps", "200", "--n", "32768"];
      const want = await run(MODEL, ["--mode", "none"], args);
      expect(want.code, context(want)).toBe(0);
      const r = await run(MODEL, ["--mode", "retry-one", "--replicas", "1", "--durable-every", "1"], args, killTogetherAt(50, [1, 2]));
      expect(r.code, context(r)).toBe(0);
      expect(r.doc?.ranks, context(r)).toEqual(want.doc?.ranks);
      const rec = r.doc?.recovery as unknown as Recovery;
      expect(rec.fallbacks, context(r)).toHaveLength(1);
      expect(rec.fallbacks![0]!.line, context(r)).toBeGreaterThan(0);
    },
    RUN_TIMEOUT_MS,
  );

  it(
    "two ranks killed at once beyond --replicas 1: every rank restarts from the newest durable line, bit-identical, with a warning of what was lost",
    async () => {
      const want = await reference();
      const r = await run(HEAT, ["--mode", "retry-one", "--replicas", "1", "--durable-every", "5"], ARGS, killTogetherAt(40, [1, 2]));
      expect(r.code, context(r)).toBe(0);
      expect(r.doc?.ranks, context(r)).toEqual(want.doc?.ranks);
      const rec = r.doc?.recovery as unknown as Recovery;
      expect(rec.fallbacks, context(r)).toHaveLength(1);
      const fb = rec.fallbacks![0]!;
      // A line of checkpoints from before the kills (how recent depends on the background
      // writes), the same on every rank: heat runs in lockstep.
      expect(fb.line).toBeGreaterThan(0);
      expect(new Set(fb.versions).size).toBe(1);
      expect(fb.versions[0]).toBeGreaterThanOrEqual(5);
      expect(r.stderr).toMatch(
        /more ranks failed than --replicas 1 cover: every rank restarts from durable line \d+ \(checkpoints (\d+, ){3}\d+\); checkpoints lost per rank/,
      );
      // A fallback restarts every rank: each has a second process.
      for (let rank = 0; rank < NP; rank++) expect(r.pids[rank]!.length, JSON.stringify(r.pids)).toBeGreaterThanOrEqual(2);
    },
    3 * RUN_TIMEOUT_MS,
  );

  it(
    "the task farm (wildcard receives, ranks checkpointing at their own pace): the line mixes versions and still ends bit-identical",
    async () => {
      // Long enough that the kill (on a throttled step event, after the first durable line)
      // lands well before the end.
      const args = ["--tasks", "160", "--spin-ms", "2"];
      const want = await run("examples/taskfarm.ts", ["--mode", "none"], args);
      expect(want.code, context(want)).toBe(0);
      // The master and worker 1 at once: with --replicas 1, rank 1 holds the only copy of rank 0.
      const r = await run(
        "examples/taskfarm.ts",
        ["--mode", "retry-one", "--replicas", "1", "--durable-every", "2"],
        args,
        killTogetherAt(8, [0, 1], { afterLine: true }),
      );
      expect(r.code, context(r)).toBe(0);
      expect(r.doc?.ranks, context(r)).toEqual(want.doc?.ranks);
      const fb = (r.doc?.recovery as unknown as Recovery).fallbacks;
      expect(fb, context(r)).toHaveLength(1);
      // The master checkpoints once per result, a worker once per task: their durable
      // checkpoints are numbered apart.
      expect(new Set(fb![0]!.versions).size, JSON.stringify(fb)).toBeGreaterThan(1);
    },
    3 * RUN_TIMEOUT_MS,
  );

  it(
    "beyond the replicas before any durable line: every rank restarts from the beginning; without the floor the job fails with CPR_LOST",
    async () => {
      const want = await reference();
      // The first durable line comes at step 300; the kill, on the first step event from 8 on.
      const early = await run(HEAT, ["--mode", "retry-one", "--replicas", "1", "--durable-every", "300"], ARGS, killTogetherAt(8, [1, 2]));
      expect(early.code, context(early)).toBe(0);
      expect(early.doc?.ranks, context(early)).toEqual(want.doc?.ranks);
      expect(early.stderr).toMatch(/no durable line exists yet: every rank restarts from the beginning \(all work is lost\)/);
      const off = await run(HEAT, ["--mode", "retry-one", "--replicas", "1", "--durable-every", "0"], ARGS, killTogetherAt(8, [1, 2]));
      expect(off.code, context(off)).not.toBe(0);
      expect(off.stderr).toMatch(/CPR_LOST.*with --durable-every the job would restart every rank from its newest durable checkpoints instead/s);
    },
    3 * RUN_TIMEOUT_MS,
  );

  it(
    "a single failure within the replicas still restarts that rank alone (the floor is only written, not used)",
    async () => {
      await reference();
      const r = await run(HEAT, ["--mode", "retry-one", "--durable-every", "5", "--inject", "3@step:30"], ARGS);
      expect(r.code, context(r)).toBe(0);
      expect(r.doc?.ranks).toEqual(ref!.doc?.ranks);
      expectOnlyRestarted(r, { 3: 1 });
      expect((r.doc?.recovery as unknown as Recovery).durableLines!.length).toBeGreaterThan(5);
    },
    2 * RUN_TIMEOUT_MS,
  );

  it(
    "the launcher SIGKILLed: the same command resumes from the newest durable line and finishes bit-identical",
    async () => {
      const want = await reference();
      const store = join(dir, "resume.store");
      const results = join(dir, "resume.json");
      const argv = [
        CLI,
        "run",
        "-n",
        String(NP),
        "--json",
        "--mode",
        "retry-one",
        "--durable-every",
        "5",
        "--store",
        store,
        "--results",
        results,
        HEAT,
        "--iters",
        "400",
        "--rows",
        "128",
        "--cols",
        "128",
      ];
      // First run: killed (with its launcher's pid only: the ranks end by themselves) once two lines committed.
      const first = spawn(process.execPath, argv, { cwd: ROOT, stdio: ["ignore", "ignore", "pipe"] });
      const pids: number[] = [];
      let lines = 0;
      onJsonLines(first.stderr, (ev) => {
        if (ev.event === "rank-spawned") pids.push(ev.pid as number);
        if (ev.event === "line-committed" && ++lines === 2) first.kill("SIGKILL");
      });
      await new Promise((resolve) => first.on("close", resolve));
      expect(lines).toBeGreaterThanOrEqual(2);
      expect(await waitGone(pids, 15_000)).toEqual([]);
      // Second run: the same command.
      const second = spawn(process.execPath, argv, { cwd: ROOT, stdio: ["ignore", "ignore", "pipe"] });
      let resuming: Record<string, unknown> | undefined;
      let stderr = "";
      second.stderr.setEncoding("utf8").on("data", (c: string) => (stderr += c));
      onJsonLines(second.stderr, (ev) => {
        if (ev.event === "job-resuming") resuming = ev;
      });
      const code = await new Promise<number | null>((resolve) => second.on("close", resolve));
      expect(code, stderr.slice(-3000)).toBe(0);
      expect(resuming, stderr.slice(-3000)).toMatchObject({ run: 2, previousState: "running" });
      const doc = JSON.parse(await readFile(results, "utf8")) as { ranks: unknown[]; recovery: Recovery };
      expect(doc.recovery.resumedFrom).toBeGreaterThan(0);
      // 400 iterations against the reference's 100: compare with a reference of the same length.
      const full = await run(HEAT, ["--mode", "none"], ["--iters", "400", "--rows", "128", "--cols", "128"]);
      expect(doc.ranks).toEqual(full.doc?.ranks);
      expect(want.code).toBe(0);
    },
    4 * RUN_TIMEOUT_MS,
  );
});
