/**
 * Goal: under `--mode retry-one`, point-to-point programs recover by restarting only the killed
 * ranks: the heat stencil (isend/irecv halos and an allreduce per iteration), the task farm
 * (a master's `ANY_SOURCE` receives, workers' `nondet` costs, checkpoints at different rates on
 * master and workers) and the token ring (iprobe/probe polling), each killed at a step, at a
 * send, and twice in one run, finish with results bit-identical to `--mode none`, and every
 * rank that was not killed keeps its process. A program that never checkpoints cannot grow the
 * senders' logs without bound: past `--log-limit` the job stops with CPR_CHECKPOINT naming the
 * bound; the same program checkpointing now and then runs to the end under the same bound.
 *
 * Method: the built launcher (`node dist/cli.js run`, so `npm run build` must have run) on 4
 * ranks with `--inject` faults; `--results` digests compared with a `--mode none` run, pids from
 * the --json `rank-spawned` events.
 */
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CLI, context } from "./cpr-run.ts";
import { RUN_TIMEOUT_MS, type Run, retryOneRuns } from "./retry-one-run.ts";

const NP = 4;
let dir: string;
const { run, expectSameAsNone, expectOnlyRestarted } = retryOneRuns(() => dir, NP);

beforeAll(async () => {
  if (!existsSync(CLI)) throw new Error(`${CLI} is missing: run \`npm run build\` first`);
  dir = await mkdtemp(join(tmpdir(), "lifeline-r1p2p-"));
});

afterAll(async () => {
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

/** Per example: its arguments (short runs), a kill at a step, and a kill at a send plus a second kill. */
const CASES = [
  { program: "examples/heat.ts", args: ["--iters", "120", "--rows", "128", "--cols", "128"], step: "1@step:40", twice: ["2@send:60", "0@step:90"] },
  { program: "examples/taskfarm.ts", args: ["--tasks", "36", "--spin-ms", "2"], step: "0@step:12", twice: ["2@send:4", "1@step:8"] },
  { program: "examples/token-ring.ts", args: ["--laps", "60", "--work", "200000"], step: "3@step:25", twice: ["1@send:20", "2@step:45"] },
] as const;

describe("retry-one: point-to-point programs with real processes", () => {
  for (const c of CASES) {
    let ref: Run | undefined;
    it(
      `${c.program}: killed at a step (${c.step}) → bit-identical, only that rank restarted`,
      async () => {
        ref = await run(c.program, ["--mode", "none"], c.args);
        const r1 = await expectSameAsNone(c.program, c.args, [c.step], [], ref);
        expectOnlyRestarted(r1, { [Number(c.step[0])]: 1 });
        expect(r1.caughtUp.map((u) => u.rank)).toEqual([Number(c.step[0])]);
      },
      3 * RUN_TIMEOUT_MS,
    );
    it(
      `${c.program}: killed at a send and again later (${c.twice.join(" + ")}) → bit-identical, only those ranks restarted`,
      async () => {
        const r1 = await expectSameAsNone(c.program, c.args, c.twice, [], ref);
        expectOnlyRestarted(r1, Object.fromEntries(c.twice.map((f) => [Number(f[0]), 1])));
      },
      3 * RUN_TIMEOUT_MS,
    );
  }

  it(
    "--checkpoint-every 10steps: heat checkpoints at every 10th call only; killed at its 45th → bit-identical, restored from its 3rd or 4th checkpoint",
    async () => {
      const heat = CASES[0];
      const r1 = await expectSameAsNone(heat.program, heat.args, ["1@step:45"], ["--checkpoint-every", "10steps"]);
      expectOnlyRestarted(r1, { 1: 1 });
      expect(r1.caughtUp).toHaveLength(1);
      // Calls 10, 20, 30 and 40 were checkpoints: the newest the others knew complete (without
      // the flag, every call is one: the restarted rank would restore checkpoint 43 or 44).
      const restored = r1.caughtUp[0]!.restored;
      expect(restored, JSON.stringify(r1.caughtUp)).toBeGreaterThanOrEqual(3);
      expect(restored, JSON.stringify(r1.caughtUp)).toBeLessThanOrEqual(4);
    },
    3 * RUN_TIMEOUT_MS,
  );

  it(
    "a program that never checkpoints stops at --log-limit with CPR_CHECKPOINT; checkpointing now and then it finishes under the same bound",
    async () => {
      const FLOOD = "test/fixtures/retry-one/flood.ts";
      // 6000 messages of 1 KiB to each of 3 receivers: 17.6 MiB logged by rank 0 with no checkpoint.
      const stuck = await run(FLOOD, ["--mode", "retry-one", "--log-limit", "16MiB"], ["--messages", "6000"]);
      expect(stuck.code, context(stuck)).not.toBe(0);
      expect(stuck.stderr).toMatch(/CPR_CHECKPOINT.*above the bound of 16777216 bytes.*--log-limit/);
      // With checkpoints, what rank 0 keeps is what it runs ahead of its slowest receiver's last
      // safe checkpoint. Sends do not wait for receivers, so on a loaded machine that may be up to
      // the sockets' high-water marks (1,000 messages queued at each end, about 2 MiB per
      // receiver, 6 MiB for the three): a clean-clone CI run saw 2 MiB in all (683 messages for
      // rank 1). 16 MiB is far above it.
      const ok = await run(FLOOD, ["--mode", "retry-one", "--log-limit", "16MiB"], ["--messages", "3000", "--every", "100"]);
      expect(ok.code, context(ok)).toBe(0);
      expect(ok.doc?.ranks).toEqual([0, 4498500, 4498500, 4498500]);
    },
    2 * RUN_TIMEOUT_MS,
  );
});
