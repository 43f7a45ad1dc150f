/**
 * Goal: under `--mode cpr`, a job whose rank is SIGKILLed rolls every rank back to the last
 * committed recovery line (or to the beginning, before the first line) and finishes with
 * results bit-identical to `--mode none`; `--max-restarts` exhaustion fails with a clear
 * LAUNCH_RESTARTS error.
 *
 * Method: the built launcher (`node dist/cli.js run`, so `npm run build` must have run) runs
 * each example with small arguments, once with `--mode none` and once with `--mode cpr
 * --checkpoint-every 3steps` and a kill (`--inject <rank>@step:N`, or SIGKILL from outside at
 * a seeded random moment); the `--results` digests must be equal. Ranks 2..4, bounded runs.
 */
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const CLI = join(ROOT, "dist", "cli.js");
const RUN_TIMEOUT_MS = 60_000;

interface Outcome {
  code: number | null;
  stderr: string;
  doc:
    | {
        ranks: unknown[];
        restarts: number;
        error?: { code: string; message: string };
        recovery?: { linesCommitted: number[]; rollbacks: { attempt: number; epoch: number }[] };
      }
    | undefined;
}

let dir: string;
let runs = 0;

beforeAll(async () => {
  if (!existsSync(CLI)) throw new Error(`${CLI} is missing: run \`npm run build\` first`);
  dir = await mkdtemp(join(tmpdir(), "lifeline-cpr-"));
});

afterAll(async () => {
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

/** Runs the launcher; `onRankUp(pid)` sees each rank's pid (from --json events). */
async function run(
  np: number,
  example: string,
  flags: readonly string[],
  args: readonly string[],
  onRankUp?: (pid: number, rank: number) => void,
): Promise<Outcome> {
  const n = runs++;
  const results = join(dir, `r${n}.json`);
  const argv = [
    CLI,
    "run",
    "-n",
    String(np),
    "--json",
    "--store",
    join(dir, `store${n}`),
    "--results",
    results,
    ...flags,
    join("examples", `${example}.ts`),
    ...args,
  ];
  const child = spawn(process.execPath, argv, { cwd: ROOT, stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  let partial = "";
  child.stderr.setEncoding("utf8").on("data", (chunk: string) => {
    stderr += chunk;
    partial += chunk;
    const lines = partial.split("\n");
    partial = lines.pop()!;
    for (const line of lines) {
      if (onRankUp === undefined || !line.includes('"rank-up"')) continue;
      const ev = JSON.parse(line) as { rank: number; pid: number };
      onRankUp(ev.pid, ev.rank);
    }
  });
  const timer = setTimeout(() => child.kill("SIGTERM"), RUN_TIMEOUT_MS);
  const code = await new Promise<number | null>((resolve, reject) => {
    child.on("error", reject);
    child.on("close", (c) => resolve(c));
  });
  clearTimeout(timer);
  const doc = existsSync(results) ? (JSON.parse(await readFile(results, "utf8")) as Outcome["doc"]) : undefined;
  return { code, stderr, doc };
}

const context = (o: Outcome): string =>
  `exit ${o.code}\n${o.stderr
    .split("\n")
    .filter((l) => !l.includes('"rank-step"'))
    .slice(-40)
    .join("\n")}`;

const CASES: { example: string; np: number; kill: string; args: string[] }[] = [
  { example: "heat", np: 4, kill: "2@step:150", args: ["--rows", "24", "--cols", "24", "--iters", "5000", "--tol", "1e-3"] },
  // The master checkpoints once per result (deterministic count); a worker may, under load,
  // get fewer tasks than any fixed step number, so the kill would never fire.
  { example: "taskfarm", np: 4, kill: "0@step:6", args: ["--tasks", "24", "--steps", "1000", "--spin-ms", "3"] },
  { example: "token-ring", np: 3, kill: "1@step:20", args: ["--laps", "30", "--len", "64", "--work", "100000"] },
  { example: "logreg", np: 2, kill: "1@step:40", args: ["--samples", "2048", "--steps", "60", "--batch", "64"] },
  { example: "boosting", np: 2, kill: "1@step:2", args: ["--rows", "1000", "--trees", "2", "--depth", "3"] },
];

describe("examples under --mode cpr with a killed rank", () => {
  for (const { example, np, kill, args } of CASES) {
    it(
      `${example}.ts: ${np} ranks, rank killed at ${kill}, results bit-identical to --mode none`,
      async () => {
        const base = await run(np, example, ["--mode", "none"], args);
        expect(base.code, context(base)).toBe(0);
        const cpr = await run(np, example, ["--mode", "cpr", "--checkpoint-every", "3steps", "--inject", kill], args);
        expect(cpr.code, context(cpr)).toBe(0);
        expect(cpr.doc!.restarts).toBe(1);
        expect(cpr.doc!.recovery!.rollbacks).toHaveLength(1);
        expect(cpr.doc!.ranks).toEqual(base.doc!.ranks);
      },
      2 * RUN_TIMEOUT_MS,
    );
  }

  it(
    "heat.ts: a rank SIGKILLed from outside at a random moment; identical results",
    async () => {
      const args = ["--rows", "32", "--cols", "32", "--iters", "5000", "--tol", "5e-4"];
      const base = await run(4, "heat", ["--mode", "none"], args);
      expect(base.code, context(base)).toBe(0);
      // Seeded: the victim and the delay are fixed per test run, printed on failure.
      const seed = Number(process.env.SEED ?? 7);
      const victim = seed % 4;
      const delayMs = 300 + ((seed * 7919) % 700);
      let killed = false;
      const cpr = await run(4, "heat", ["--mode", "cpr", "--checkpoint-every", "2steps"], args, (pid, rank) => {
        if (rank !== victim || killed) return;
        killed = true;
        setTimeout(() => {
          try {
            process.kill(pid, "SIGKILL");
          } catch {
            /* already gone: the job finished first */
          }
        }, delayMs);
      });
      expect(cpr.code, `seed ${seed}\n${context(cpr)}`).toBe(0);
      // The kill really landed (the job runs for seconds, the kill comes within one), and was recovered.
      expect(cpr.doc!.restarts, `seed ${seed}\n${context(cpr)}`).toBe(1);
      expect(cpr.doc!.ranks).toEqual(base.doc!.ranks);
    },
    2 * RUN_TIMEOUT_MS,
  );

  it(
    "a failure before the first line restarts from the beginning; --max-restarts exhaustion fails with LAUNCH_RESTARTS",
    async () => {
      const args = ["--samples", "1024", "--steps", "20", "--batch", "64"];
      // Dies at its 1st checkpoint() in attempts 0 and 1: with --max-restarts 1 the second death is final.
      const o = await run(
        2,
        "logreg",
        ["--mode", "cpr", "--checkpoint-every", "1000steps", "--max-restarts", "1", "--inject", "1@step:1", "--inject", "1@step:1@attempt=1"],
        args,
      );
      expect(o.code, context(o)).not.toBe(0);
      expect(o.doc!.restarts).toBe(1);
      expect(o.doc!.recovery!.rollbacks).toEqual([{ attempt: 1, epoch: 0 }]);
      expect(o.doc!.error!.code).toBe("LAUNCH_RESTARTS");
      expect(o.doc!.error!.message).toMatch(/--max-restarts 1/);
    },
    RUN_TIMEOUT_MS,
  );
});
