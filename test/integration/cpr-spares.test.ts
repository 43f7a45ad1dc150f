/**
 * Goal: in cpr a failure restarts every rank, and warm spare processes (Node, tsx and lifeline
 * already loaded) take their places, so the restart does not wait for process start-up.
 *
 * Method: examples/logreg.ts on 4 ranks under the built launcher, --mode none for the
 * reference, then --mode cpr: once one spare per rank is ready, rank 1 is SIGKILLed from the
 * test; every restarted rank must be a spare (`warm`, the spare's pid), the results equal the
 * reference bit for bit, and no process is left after the job. --no-spare: no spare, a cold
 * restart.
 */
import { existsSync, readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RANK_INITIAL_OLD_SPACE_MIB, RANK_MALLOC_TUNABLES } from "../../src/launch/rank-process.ts";
import { waitGone } from "../launch/helpers.ts";
import { CLI, context, runLauncher } from "./cpr-run.ts";

const NP = 4;
const TIMEOUT_MS = 90_000;
const PROGRAM = "examples/logreg.ts";
// Long enough for the spares (started a second after the job runs) to be ready before the end.
const ARGS = ["--steps", "600", "--batch", "16384", "--features", "64"];
let dir: string;
let runs = 0;

beforeAll(async () => {
  if (!existsSync(CLI)) throw new Error(`${CLI} is missing: run \`npm run build\` first`);
  dir = await mkdtemp(join(tmpdir(), "lifeline-cpr-spares-"));
});

afterAll(async () => {
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

describe("cpr: warm spares take the restarted ranks' places", () => {
  it(
    "rank 1 killed once a spare per rank is ready: all 4 restart warm in the spares, results bit-identical, nothing left",
    async () => {
      const ref = await runLauncher({ np: NP, program: PROGRAM, flags: ["--mode", "none"], args: ARGS, dir, name: `run${runs++}`, timeoutMs: TIMEOUT_MS });
      expect(ref.code, context(ref)).toBe(0);
      const spares: number[] = [];
      const cmdlines: string[][] = [];
      const environs: string[][] = [];
      const spawned: { rank: number; attempt: number; pid: number; warm: boolean }[] = [];
      const o = await runLauncher({
        np: NP,
        program: PROGRAM,
        flags: ["--mode", "cpr", "--checkpoint-every", "20steps", "--store", join(dir, "store")],
        args: ARGS,
        dir,
        name: `run${runs++}`,
        timeoutMs: TIMEOUT_MS,
        onEvent: (ev) => {
          if (ev.event === "rank-spawned")
            spawned.push({ rank: ev.rank as number, attempt: ev.attempt as number, pid: ev.pid as number, warm: ev.warm === true });
          if (ev.event === "spare-ready") {
            spares.push(ev.pid as number);
            cmdlines.push(readFileSync(`/proc/${ev.pid as number}/cmdline`, "utf8").split("\0"));
            environs.push(readFileSync(`/proc/${ev.pid as number}/environ`, "utf8").split("\0"));
            if (spares.length === NP) process.kill(spawned.find((s) => s.rank === 1 && s.attempt === 0)!.pid, "SIGKILL");
          }
        },
      });
      expect(o.code, context(o)).toBe(0);
      expect(o.doc?.ranks, context(o)).toEqual(ref.doc?.ranks);
      const again = spawned.filter((s) => s.attempt === 1);
      expect(again.map((s) => s.rank).sort(), JSON.stringify(spawned)).toEqual([0, 1, 2, 3]);
      expect(again.every((s) => s.warm)).toBe(true);
      expect(again.map((s) => s.pid).sort()).toEqual(spares.slice(0, NP).sort());
      // A spare's node runs with the ranks' V8 flags (rank-process.ts).
      for (const argv of cmdlines) expect(argv).toContain(`--initial-old-space-size=${RANK_INITIAL_OLD_SPACE_MIB}`);
      // And glibc's malloc tunables, which glibc reads when the process starts, before it is a
      // rank. /proc shows the environment as the process got it, except that glibc ends each
      // tunable's value it parsed there with a NUL: only the first shows whole.
      const first = `GLIBC_TUNABLES=${RANK_MALLOC_TUNABLES.split(":")[0]!}`;
      for (const env of environs) expect(env.find((kv) => kv.startsWith("GLIBC_TUNABLES="))).toMatch(new RegExp(`^${first}(:|$)`));
      expect(await waitGone([...spares, ...spawned.map((s) => s.pid)], 10_000)).toEqual([]);
    },
    3 * TIMEOUT_MS,
  );

  it(
    "--no-spare: no spare process; the restart is cold, results still bit-identical",
    async () => {
      // As long as the test above: the first line commits well before the end, however fast the machine.
      const args = ARGS;
      const ref = await runLauncher({ np: NP, program: PROGRAM, flags: ["--mode", "none"], args, dir, name: `run${runs++}`, timeoutMs: TIMEOUT_MS });
      const events: string[] = [];
      const warm: boolean[] = [];
      const o = await runLauncher({
        np: NP,
        program: PROGRAM,
        flags: ["--mode", "cpr", "--no-spare", "--checkpoint-every", "10steps", "--store", join(dir, "store-cold"), "--inject", "2@line:1"],
        args,
        dir,
        name: `run${runs++}`,
        timeoutMs: TIMEOUT_MS,
        onEvent: (ev) => {
          events.push(ev.event as string);
          if (ev.event === "rank-spawned" && ev.attempt === 1) warm.push(ev.warm === true);
        },
      });
      expect(o.code, context(o)).toBe(0);
      expect(o.doc?.ranks, context(o)).toEqual(ref.doc?.ranks);
      expect(events).not.toContain("spare-ready");
      expect(warm).toEqual([false, false, false, false]);
    },
    2 * TIMEOUT_MS,
  );
});
