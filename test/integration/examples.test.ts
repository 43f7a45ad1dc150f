/**
 * Goal: every shipped example runs to completion under `lifeline run` and, except the one that
 * is non-deterministic on purpose, gives bit-identical results when run again.
 *
 * Method: run each example through the built launcher (`node dist/cli.js run`, so `npm run
 * build` must have run) with small arguments, twice, with `--mode none` and `--results`; check
 * the exit code, that every rank finalized a SHA-256 digest, and that the two runs' digests are
 * equal. `montecarlo.ts` runs once and is only checked to land near pi. Rank counts are 2..4
 * and sizes are small so the whole file stays well under a minute on a loaded 2-core machine.
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
/** A run that takes longer than this is hung, not slow. */
const RUN_TIMEOUT_MS = 25_000;

interface RunOutcome {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  /** `ranks` from the `--results` file, or undefined if the launcher wrote none. */
  ranks: unknown[] | undefined;
}

let dir: string;
let runs = 0;

beforeAll(async () => {
  if (!existsSync(CLI)) throw new Error(`${CLI} is missing: run \`npm run build\` first`);
  dir = await mkdtemp(join(tmpdir(), "lifeline-examples-"));
});

afterAll(async () => {
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

/** Runs `lifeline run -n <np> --mode none examples/<example>.ts <args>` and reads its results. */
async function runExample(np: number, example: string, args: readonly string[]): Promise<RunOutcome> {
  const n = runs++;
  const results = join(dir, `r${n}.json`);
  const argv = [
    CLI,
    "run",
    "-n",
    String(np),
    "--mode",
    "none",
    "--store",
    join(dir, `store${n}`),
    "--results",
    results,
    join("examples", `${example}.ts`),
    ...args,
  ];
  const child = spawn(process.execPath, argv, { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
  let stdout = "";
  let stderr = "";
  child.stdout.setEncoding("utf8").on("data", (chunk: string) => {
    stdout += chunk;
  });
  child.stderr.setEncoding("utf8").on("data", (chunk: string) => {
    stderr += chunk;
  });
  const timer = setTimeout(() => child.kill("SIGTERM"), RUN_TIMEOUT_MS);
  const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve, reject) => {
    child.on("error", reject);
    child.on("close", (c, s) => resolve([c, s]));
  });
  clearTimeout(timer);
  let ranks: unknown[] | undefined;
  if (existsSync(results)) {
    const parsed = JSON.parse(await readFile(results, "utf8")) as { ranks?: unknown };
    if (Array.isArray(parsed.ranks)) ranks = parsed.ranks;
  }
  return { code, signal, stdout, stderr, ranks };
}

/** Asserts a clean run in which every one of `np` ranks finalized a hex SHA-256. */
function expectDigests(run: RunOutcome, np: number): string[] {
  const context = `exit ${run.code} ${run.signal ?? ""}\n--- stdout\n${run.stdout}\n--- stderr\n${run.stderr}`;
  expect(run.code, context).toBe(0);
  expect(run.ranks, context).toHaveLength(np);
  for (const digest of run.ranks!) expect(digest, context).toMatch(/^[0-9a-f]{64}$/);
  return run.ranks as string[];
}

describe("examples under `lifeline run --mode none`", () => {
  const cases: { example: string; np: number; args: string[]; sameOnAllRanks: boolean; prints: RegExp }[] = [
    // A small plate converges well before the iteration limit: this also covers the tolerance stop.
    {
      example: "heat",
      np: 4,
      args: ["--rows", "24", "--cols", "24", "--iters", "5000", "--tol", "1e-3"],
      sameOnAllRanks: false,
      prints: /heat: 24x24 grid on 4 ranks, [1-9]\d{0,2} iterations, residual (?:[1-9]\.\d+e-4|1\.000e-3)/,
    },
    {
      example: "taskfarm",
      np: 4,
      args: ["--tasks", "24", "--steps", "1000", "--spin-ms", "3"],
      sameOnAllRanks: true,
      prints: /taskfarm: 24 tasks on 3 workers/,
    },
    {
      example: "token-ring",
      np: 3,
      args: ["--laps", "30", "--len", "64", "--work", "100000"],
      sameOnAllRanks: false,
      prints: /token-ring: 30 laps on 3 ranks, 90 hops/,
    },
    {
      example: "logreg",
      np: 2,
      args: ["--samples", "2048", "--steps", "60", "--batch", "64"],
      sameOnAllRanks: true,
      prints: /logreg: 2048 samples x 16 features on 2 ranks, 60 steps/,
    },
    {
      example: "boosting",
      np: 2,
      args: ["--rows", "1000", "--trees", "2", "--depth", "3"],
      sameOnAllRanks: true,
      prints: /boosting: 2 trees \(depth 3, \d+ splits\) on 2 ranks/,
    },
  ];

  for (const { example, np, args, sameOnAllRanks, prints } of cases) {
    it(`${example}.ts: ${np} ranks, the same digests on a re-run`, async () => {
      const first = await runExample(np, example, args);
      const a = expectDigests(first, np);
      expect(first.stdout).toMatch(prints);
      const b = expectDigests(await runExample(np, example, args), np);
      expect(b).toEqual(a);
      if (sameOnAllRanks) expect(new Set(a).size).toBe(1);
      else expect(new Set(a).size).toBe(np); // each rank digests its own part
    });
  }

  it("montecarlo.ts runs and lands near pi (it is non-deterministic on purpose)", async () => {
    const run = await runExample(2, "montecarlo", ["--batches", "4", "--batch-size", "50000"]);
    const context = `exit ${run.code}\n--- stdout\n${run.stdout}\n--- stderr\n${run.stderr}`;
    expect(run.code, context).toBe(0);
    expect(run.ranks, context).toHaveLength(2);
    const [e0, e1] = run.ranks as number[];
    expect(e0).toBe(e1); // one allreduce: every rank reports the same estimate
    // 400000 points: the standard error is about 0.0026, so 0.05 is ~19 sigma.
    expect(Math.abs(e0! - Math.PI)).toBeLessThan(0.05);
  });
});
