/**
 * Goal: `lifeline drill` is wired into the CLI as docs/cli.md describes: its options are in
 * --help, bad command lines exit 2 naming every problem before anything starts, and a real
 * drill run as a process speaks `--json` (every stderr line parses) and writes `--results`.
 *
 * Method: the CLI's `main()` in-process for usage errors and help; one drill of a tiny
 * fixture program as a real launcher process (source CLI through tsx).
 */
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { FIXTURES, inProcessCli, runCli, tempDir } from "./helpers.ts";

const { dir, cleanup } = tempDir("lifeline-drill-cli-");
afterAll(cleanup);
writeFileSync(join(dir, "app.ts"), "throw new Error('must not run');\n");

const cli = inProcessCli(dir);

describe("lifeline drill usage", () => {
  it("lists its options in --help", async () => {
    const r = await cli("drill", "--help");
    expect(r.code).toBe(0);
    for (const flag of ["--kill <spec>", "--seed", "--repeat", "--report", "-n, --np", "--mode", "--checkpoint-every", "--failure-timeout"])
      expect(r.stdout).toContain(flag);
  });

  it("reports every bad flag at once, exit 2, before starting anything", async () => {
    const r = await cli(
      "drill",
      "-n",
      "2",
      "--mode",
      "none",
      "--kill",
      "3@step:1",
      "--kill",
      "1@step:0",
      "--repeat",
      "0",
      "--seed",
      "-1",
      "--report",
      join(dir, "nope", "r.html"),
      "app.ts",
    );
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/--kill "3@step:1": rank 3 is outside 0\.\.1/);
    expect(r.stderr).toMatch(/counts start at 1/);
    expect(r.stderr).toMatch(/--repeat must be a whole number from 1 to 1000/);
    expect(r.stderr).toMatch(/--seed must be a whole number/);
    expect(r.stderr).toMatch(/--report .* does not exist/);
  });

  it("takes faults from --kill, not --inject, and checks the run options too", async () => {
    const r = await cli("drill", "-n", "2", "--mode", "none", "--inject", "1@step:2", "missing.ts");
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/not --inject/);
    expect(r.stderr).toMatch(/app "missing.ts" not found/);
  });

  it("passes options after <app> to the app", async () => {
    const r = await cli("drill", "-n", "2", "--mode", "none", "--kill", "1@step:0", "app.ts", "--kill", "zzz");
    expect(r.code).toBe(2);
    expect(r.stderr).not.toMatch(/zzz/);
  });
});

describe("lifeline drill as a process", () => {
  it("--json: every stderr line is an event; --results holds the verdict and each run", async () => {
    const results = join(dir, "drill.json");
    const r = await runCli(["drill", "-n", "2", "--mode", "none", "--seed", "5", "--json", "--results", results, join(FIXTURES, "ok.ts")], {
      timeoutMs: 25_000,
    });
    expect(r.code, r.stderr).toBe(0);
    const events = r.stderr
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(events[0]).toMatchObject({ event: "drill-starting", seed: 5, size: 2 });
    expect(events.filter((e) => e.event === "job-finished").map((e) => e.run)).toEqual([0, 1]);
    expect(events.at(-1)).toMatchObject({ event: "drill-finished", pass: true, exitCode: 0 });
    const doc = JSON.parse(readFileSync(results, "utf8")) as { pass: boolean; runs: { label: string; ranks: unknown[]; verdict: unknown }[] };
    expect(doc.pass).toBe(true);
    expect(doc.runs.map((x) => x.label)).toEqual(["reference", "faulty run"]);
    expect(doc.runs[1]!.verdict).toEqual({ kind: "identical" });
    expect(doc.runs[1]!.ranks).toEqual(doc.runs[0]!.ranks);
  });
});
