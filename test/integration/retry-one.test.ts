/**
 * Goal: under `--mode retry-one`, real jobs whose ranks are SIGKILLed (`--inject r@step:N` and
 * Rabit's `mock=rank,version,seqno,ndeath` coordinates as `r@mock:V,S[@attempt=N]`) finish
 * with results bit-identical to `--mode none`, restarting only the failed rank (the others
 * keep their pids); a dead rank that is not restarted (`--max-restarts 0`) ends the job with a
 * clear error, never a hang.
 *
 * Method: the built launcher (`node dist/cli.js run`, so `npm run build` must have run) runs
 * examples/logreg.ts, examples/boosting.ts (bootstrap collectives) and Rabit's
 * model/local/lazy recovery programs (test/fixtures/retry-one/rabit.ts, which checks every
 * collective result against its known value) on 4 ranks; the `--results` digests are compared
 * with a `--mode none` run, the --json `rank-spawned` events give every rank's pids.
 */
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { waitGone } from "../launch/helpers.ts";
import { CLI, context, runLauncher } from "./cpr-run.ts";
import { RUN_TIMEOUT_MS, type Run, retryOneRuns } from "./retry-one-run.ts";

const NP = 4;
const RABIT = "test/fixtures/retry-one/rabit.ts";

let dir: string;
const { run, expectSameAsNone, expectOnlyRestarted, nextName } = retryOneRuns(() => dir, NP);

beforeAll(async () => {
  if (!existsSync(CLI)) throw new Error(`${CLI} is missing: run \`npm run build\` first`);
  dir = await mkdtemp(join(tmpdir(), "lifeline-r1-"));
});

afterAll(async () => {
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

describe("retry-one with real processes", () => {
  it(
    "logreg: rank 1 killed at step 25 → bit-identical weights, only rank 1 restarted",
    async () => {
      const r1 = await expectSameAsNone("examples/logreg.ts", ["--steps", "50"], ["1@step:25"]);
      expectOnlyRestarted(r1, { 1: 1 });
      // The launcher heard that the new process caught up, from a checkpoint near the kill.
      expect(r1.caughtUp).toHaveLength(1);
      expect(r1.caughtUp[0]).toMatchObject({ rank: 1, attempt: 1 });
      expect(r1.caughtUp[0]!.restored).toBeGreaterThanOrEqual(23);
    },
    2 * RUN_TIMEOUT_MS,
  );

  it(
    "boosting: a kill inside a bootstrap collective (mock 1,0,0,0) and one after checkpoint 2 (mock 3,2,0,0) → bit-identical model",
    async () => {
      const r1 = await expectSameAsNone("examples/boosting.ts", ["--trees", "2"], ["1@mock:0,0", "3@mock:2,0"]);
      expectOnlyRestarted(r1, { 1: 1, 3: 1 });
    },
    2 * RUN_TIMEOUT_MS,
  );

  it(
    "Rabit model_recover, mock=0,0,1,0 + 1,1,1,0: a death before any checkpoint, one after",
    async () => {
      const r1 = await expectSameAsNone(RABIT, ["--kind", "model"], ["0@mock:0,1", "1@mock:1,1"]);
      expectOnlyRestarted(r1, { 0: 1, 1: 1 });
    },
    2 * RUN_TIMEOUT_MS,
  );

  let localRef: Run | undefined;
  it(
    "Rabit local_recover, die same (0,0,1,0 + 1,2,1,0 + 2,2,1,0 + 3,2,1,0): three ranks die at the same collective, --replicas 3",
    async () => {
      localRef = await run(RABIT, ["--mode", "none"], ["--kind", "local"]);
      const r1 = await expectSameAsNone(
        RABIT,
        ["--kind", "local"],
        ["0@mock:0,1", "1@mock:2,1", "2@mock:2,1", "3@mock:2,1"],
        ["--replicas", "3", "--max-restarts", "8"],
        localRef,
      );
      expectOnlyRestarted(r1, { 0: 1, 1: 1, 2: 1, 3: 1 });
    },
    2 * RUN_TIMEOUT_MS,
  );

  it(
    "Rabit lazy_recover (checkpoint(() => state)), mock=0,0,1,0 + 1,1,1,0: same results as local_recover in mode none",
    async () => {
      const r1 = await expectSameAsNone(RABIT, ["--kind", "lazy"], ["0@mock:0,1", "1@mock:1,1"], [], localRef);
      expectOnlyRestarted(r1, { 0: 1, 1: 1 });
    },
    2 * RUN_TIMEOUT_MS,
  );

  it(
    "Rabit die hard: die same, then the restarted ranks 1 and 3 die again while being restored (mock 1,2,1,1 + 3,2,1,1) and rank 0 right after (0,2,2,1)",
    async () => {
      const hard = ["0@mock:0,1", "1@mock:2,1", "2@mock:2,1", "3@mock:2,1", "1@mock:2,1@attempt=1", "3@mock:2,1@attempt=1", "0@mock:2,2@attempt=1"];
      const r1 = await expectSameAsNone(RABIT, ["--kind", "local"], hard, ["--replicas", "3", "--max-restarts", "10"], localRef);
      expectOnlyRestarted(r1, { 0: 2, 1: 2, 2: 1, 3: 2 });
    },
    2 * RUN_TIMEOUT_MS,
  );

  it(
    "collectives in flight at once (Promise.all of an allreduce sum, a max and a bcast), rank 2 killed between two of them: results as in mode none",
    async () => {
      const r1 = await expectSameAsNone("test/fixtures/retry-one/in-flight.ts", [], ["2@mock:3,1"]);
      expectOnlyRestarted(r1, { 2: 1 });
    },
    2 * RUN_TIMEOUT_MS,
  );

  it(
    "allreduces of 16 MiB (results kept as the chunks they arrived in), rank 1 killed at its second collective after checkpoint 1: same results as mode none, the first served from the survivors' buffers",
    async () => {
      const r1 = await expectSameAsNone("test/fixtures/retry-one/large.ts", [], ["1@mock:1,1"]);
      expectOnlyRestarted(r1, { 1: 1 });
      expect(r1.caughtUp).toHaveLength(1);
      expect(r1.caughtUp[0]).toMatchObject({ rank: 1, attempt: 1, restored: 1, replayed: 1 });
    },
    2 * RUN_TIMEOUT_MS,
  );

  it(
    "a dead rank never restarted (--max-restarts 0): a clear LAUNCH_RESTARTS error, no hang",
    async () => {
      const started = performance.now();
      const r = await run(RABIT, ["--mode", "retry-one", "--max-restarts", "0", "--inject", "2@mock:1,1"], ["--kind", "local"]);
      expect(r.code, context(r)).not.toBe(0);
      expect(r.doc?.error?.code, context(r)).toBe("LAUNCH_RESTARTS");
      expect(r.doc?.error?.message, context(r)).toMatch(/--max-restarts 0.*cannot go on without rank 2/s);
      expect(performance.now() - started).toBeLessThan(30_000);
    },
    RUN_TIMEOUT_MS,
  );

  describe("warm spare process (the next restarted rank's start-up done in advance)", () => {
    const PROGRAM = "examples/logreg.ts";
    // About 3 s in mode none: the spare is warm well before the end.
    const ARGS = ["--steps", "600", "--batch", "16384", "--features", "64"];

    it(
      "a rank killed once the spare is up is taken over by the spare (warm, its pid), results bit-identical; no spare left after the job",
      async () => {
        const ref = await run(PROGRAM, ["--mode", "none"], ARGS);
        expect(ref.code, context(ref)).toBe(0);
        const spares: number[] = [];
        const spawned: { rank: number; attempt: number; pid: number; warm: boolean }[] = [];
        const o = await runLauncher({
          np: NP,
          program: PROGRAM,
          flags: ["--mode", "retry-one"],
          args: ARGS,
          dir,
          name: nextName(),
          timeoutMs: RUN_TIMEOUT_MS,
          onEvent: (ev) => {
            if (ev.event === "rank-spawned")
              spawned.push({ rank: ev.rank as number, attempt: ev.attempt as number, pid: ev.pid as number, warm: ev.warm === true });
            if (ev.event === "spare-ready") {
              spares.push(ev.pid as number);
              // The first spare is ready: kill rank 1 now, so its restart can use it.
              if (spares.length === 1) process.kill(spawned.find((s) => s.rank === 1)!.pid, "SIGKILL");
            }
          },
        });
        expect(o.code, context(o)).toBe(0);
        expect(o.doc?.ranks, context(o)).toEqual(ref.doc?.ranks);
        const again = spawned.filter((s) => s.rank === 1 && s.attempt === 1);
        expect(again, JSON.stringify(spawned)).toHaveLength(1);
        expect(again[0]).toMatchObject({ warm: true, pid: spares[0] });
        expect(await waitGone([...spares, ...spawned.map((s) => s.pid)], 5_000)).toEqual([]);
      },
      3 * RUN_TIMEOUT_MS,
    );

    it(
      "a launcher SIGKILLed while a spare waits leaves no process behind",
      async () => {
        let launcher = 0;
        const pids: number[] = [];
        const o = await runLauncher({
          np: NP,
          program: PROGRAM,
          flags: ["--mode", "retry-one"],
          args: ARGS,
          dir,
          name: nextName(),
          timeoutMs: RUN_TIMEOUT_MS,
          onSpawn: (pid) => {
            launcher = pid;
          },
          onEvent: (ev) => {
            if (ev.event === "rank-spawned") pids.push(ev.pid as number);
            if (ev.event === "spare-ready") {
              pids.push(ev.pid as number);
              process.kill(launcher, "SIGKILL");
            }
          },
        });
        expect(o.code).toBeNull(); // killed
        expect(pids.length).toBe(NP + 1);
        expect(await waitGone(pids, 10_000)).toEqual([]);
      },
      2 * RUN_TIMEOUT_MS,
    );

    it(
      "--no-spare: no spare process; a killed rank restarts cold, results still bit-identical",
      async () => {
        const args = ["--steps", "60"];
        const ref = await run(PROGRAM, ["--mode", "none"], args);
        const events: string[] = [];
        const warm: boolean[] = [];
        const o = await runLauncher({
          np: NP,
          program: PROGRAM,
          flags: ["--mode", "retry-one", "--no-spare", "--inject", "2@step:20"],
          args,
          dir,
          name: nextName(),
          timeoutMs: RUN_TIMEOUT_MS,
          onEvent: (ev) => {
            events.push(ev.event as string);
            if (ev.event === "rank-spawned" && ev.attempt === 1) warm.push(ev.warm === true);
          },
        });
        expect(o.code, context(o)).toBe(0);
        expect(o.doc?.ranks, context(o)).toEqual(ref.doc?.ranks);
        expect(events).not.toContain("spare-ready");
        expect(warm).toEqual([false]);
      },
      2 * RUN_TIMEOUT_MS,
    );
  });
});
