// Goal: the communicator over real processes, real ZeroMQ sockets and the real launcher:
// every collective and op at several sizes with 2, 3 and 4 ranks (3 exercises the
// non-power-of-two paths), point-to-point semantics, each error code, and stray garbage.
// Method: fixture programs check themselves against independent expectations and finalize a
// report; the test reads `--results` and also compares digests across runs (bit-identical).
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { ROOT, runCli, tempDir } from "../launch/helpers.ts";

const FIX = join(ROOT, "test", "fixtures", "world");
const tmp = tempDir("lifeline-world-");
afterAll(() => tmp.cleanup());

let runs = 0;
/** A rank's entry of --results: what each fixture finalizes (checks failed, digests, observations). */
interface RankResult {
  fails: string[];
  digest: string;
  [k: string]: unknown;
}

async function run(np: number, fixture: string, args: string[] = [], timeoutMs = 60_000, mode = "none", flags: string[] = []) {
  const results = join(tmp.dir, `r${runs}.json`);
  // Each run its own store (retry-one's durable floor and cpr keep lines there).
  const store = join(tmp.dir, `s${runs++}`);
  const res = await runCli(["run", "-n", String(np), "--mode", mode, "--store", store, "--results", results, ...flags, join(FIX, fixture), ...args], {
    timeoutMs,
  });
  let json: { ranks: [RankResult, ...RankResult[]]; recovery?: { linesCommitted: unknown[] } } | undefined;
  try {
    json = JSON.parse(readFileSync(results, "utf8"));
  } catch {
    json = undefined;
  }
  return { ...res, json };
}

describe("collectives over real processes", () => {
  const digests = new Map<number, string>();
  it.each([2, 3, 4])("every collective, op, size and root with %i ranks", async (np) => {
    const r = await run(np, "collectives.ts", [], 120_000);
    expect(r.code, r.stderr).toBe(0);
    for (const rank of r.json!.ranks) expect(rank.fails).toEqual([]);
    digests.set(np, r.json!.ranks[0].digest);
  });

  it.each([
    [2, "none"],
    [3, "none"],
    [4, "none"],
    [3, "cpr"],
    [4, "cpr"],
    [4, "retry-one"],
  ])("ring allreduce/reduce while the program trashes results and inputs at once, two calls at a time too (none, cpr), %i ranks, mode %s", async (np, mode) => {
    // cpr: a checkpoint location after every call and a line every 2 steps, so collectives run
    // while ranks record (late chunks logged, then combined into) as well as between lines.
    const cpr = mode === "cpr";
    const args = mode === "retry-one" ? ["--sequential"] : cpr ? ["--checkpoints"] : [];
    const r = await run(np, "ring-reuse.ts", args, 120_000, mode, cpr ? ["--checkpoint-every", "2steps"] : []);
    expect(r.code, r.stderr).toBe(0);
    for (const rank of r.json!.ranks) expect(rank.fails).toEqual([]);
    if (cpr) expect(r.json!.recovery!.linesCommitted.length).toBeGreaterThan(5);
  });

  it.each([
    [2, "none"],
    [2, "cpr"],
    [2, "retry-one"],
  ])("a result the program dropped is not kept alive by the communicator (%i ranks, mode %s)", async (np, mode) => {
    const r = await run(np, "result-dropped.ts", [], 60_000, mode);
    expect(r.code, r.stderr).toBe(0);
    for (const rank of r.json!.ranks) {
      expect(rank.fails).toEqual([]);
      expect(rank.alive).toBe(0);
    }
  });

  it("gives bit-identical reductions on a re-run with the same size", async () => {
    const r = await run(3, "collectives.ts", [], 120_000);
    expect(r.code, r.stderr).toBe(0);
    expect(r.json!.ranks[0].digest).toBe(digests.get(3));
  });
});

describe("point to point over real processes", () => {
  it.each([2, 4])("tags, wildcards, ordering, probe, requests, self-sends with %i ranks", async (np) => {
    const r = await run(np, "p2p.ts");
    expect(r.code, r.stderr).toBe(0);
    for (const rank of r.json!.ranks) expect(rank.fails).toEqual([]);
  });

  it("the same under cpr with 3 ranks: its stamps on marks and bulk messages too (lines with them: the cpr swarm)", async () => {
    const r = await run(3, "p2p.ts", [], 60_000, "cpr");
    expect(r.code, r.stderr).toBe(0);
    for (const rank of r.json!.ranks) expect(rank.fails).toEqual([]);
  });

  it("the same over tcp, every link CURVE-authenticated and encrypted, the bulk connections too", async () => {
    const r = await run(2, "p2p.ts", [], 60_000, "none", ["--transport", "tcp"]);
    expect(r.code, r.stderr).toBe(0);
    for (const rank of r.json!.ranks) expect(rank.fails).toEqual([]);
  });

  it("ignores garbage from a stray process with a warning and delivers only real messages", async () => {
    const r = await run(2, "garbage.ts");
    expect(r.code, r.stderr).toBe(0);
    expect(r.json!.ranks[1]!.got).toEqual([{ real: 1 }, { real: 2 }, "nothing else"]);
    expect(r.stderr).toMatch(/dropping a malformed frame/);
  });
});

describe("errors", () => {
  it("reports every locally detectable misuse with its code and keeps running", async () => {
    const r = await run(2, "errors.ts", ["local"]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.json!.ranks[0].codes).toEqual([
      "MPI_RANK",
      "MPI_RANK",
      "MPI_RANK",
      "MPI_RANK",
      "MPI_TAG",
      "MPI_TAG",
      "MPI_TAG",
      "MPI_ENCODE",
      "MPI_ENCODE",
      expect.stringMatching(/^TypeError/),
      "MPI_BOOTSTRAP",
      "CPR_RESTORE",
      "CPR_CHECKPOINT",
      "MPI_BOOTSTRAP",
    ]);
  });

  it.each([
    ["root", 3],
    ["length", 2],
    ["kind", 3],
    ["gather", 3],
    ["scatter", 3],
  ] as const)("detects a %s mismatch across ranks and stops the job instead of hanging", async (scenario, np) => {
    const r = await run(np, "errors.ts", [scenario], 30_000);
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/MPI_COLLECTIVE_MISMATCH|every rank must/);
    expect(r.ms).toBeLessThan(20_000);
  });

  it("rejects a call after finalize() with MPI_FINALIZED", async () => {
    const r = await run(2, "errors.ts", ["finalized"]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/after finalize: MPI_FINALIZED/);
  });
});
