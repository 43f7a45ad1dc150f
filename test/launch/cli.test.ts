/**
 * Goal: the `lifeline` command rejects bad command lines with exit code 2 and a message that
 * names the problem, before any rank is started; help, version and `lines` on a missing store
 * behave as documented in docs/cli.md.
 *
 * Method: call the CLI's `main()` in-process with string-collecting streams (fast, most cases),
 * and run the real entry point as a process for the exit-code and shebang paths.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { CLI_SRC, FIXTURES, inProcessCli, runCli, tempDir } from "./helpers.ts";

const { dir, cleanup } = tempDir("lifeline-cli-");
afterAll(cleanup);
writeFileSync(join(dir, "app.ts"), "throw new Error('must not run');\n");

const cli = inProcessCli(dir);

describe("lifeline CLI usage errors (exit 2)", () => {
  it.each([
    [["run", "--mode", "none", "app.ts"], /missing -n\/--np/],
    [["run", "-n", "0", "--mode", "none", "app.ts"], /-n\/--np must be a whole number from 1 to 1024, got "0"/],
    [["run", "-n", "two", "--mode", "none", "app.ts"], /got "two"/],
    [["run", "-n", "2", "--mode", "turbo", "app.ts"], /--mode "turbo" is not a mode/],
    [["run", "-n", "2", "--mode", "retry-one", "--replicas", "x", "app.ts"], /--replicas/],
    [["run", "-n", "2", "--mode", "none", "--checkpoint-every", "10x", "app.ts"], /--checkpoint-every "10x"/],
    [["run", "-n", "2", "--mode", "none", "--heartbeat", "abc", "app.ts"], /--heartbeat "abc" is not a duration/],
    [["run", "-n", "2", "--mode", "none", "--stuck-timeout", "5 days", "app.ts"], /--stuck-timeout "5 days"/],
    [["run", "-n", "2", "--mode", "none", "--keep-lines", "-3", "app.ts"], /--keep-lines/],
    [["run", "-n", "2", "--mode", "none", "--inject", "7@step:1", "app.ts"], /rank 7 is outside 0..1/],
    [["run", "-n", "2", "--mode", "none", "--inject", "1@explode", "app.ts"], /unknown trigger "explode"/],
    [["run", "-n", "2", "--mode", "none", "--transport", "carrier-pigeon", "app.ts"], /--transport "carrier-pigeon"/],
    [["run", "-n", "2", "--mode", "none", "nope.ts"], /app "nope.ts" not found/],
    [["run", "-n", "2", "--mode", "none"], /missing required argument 'app'/],
    [["run", "-n", "2", "--mode", "none", "--frobnicate", "app.ts"], /unknown option '--frobnicate'/],
    [["run", "-n"], /argument missing/],
    [["launch"], /unknown command 'launch'/],
  ])("%j", async (argv, message) => {
    const r = await cli(...argv);
    expect(r.code, r.stderr).toBe(2);
    expect(r.stderr).toMatch(message);
    expect(r.stderr).toMatch(/^lifeline: /);
  });

  it("lists every problem of a command line at once", async () => {
    const r = await cli("run", "-n", "0", "--mode", "none", "--heartbeat", "x", "--results", "no/dir/r.json", "app.ts");
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/- -n\/--np/);
    expect(r.stderr).toMatch(/- --heartbeat/);
    expect(r.stderr).toMatch(/- --results/);
  });

  it("passes options after <app> to the app instead of parsing them", async () => {
    // -n 0 after the app belongs to the app; the launcher's own -n is fine, the mode is not.
    const r = await cli("run", "-n", "2", "--mode", "turbo", "app.ts", "-n", "0", "--frobnicate");
    expect(r.stderr).not.toMatch(/frobnicate|got "0"/);
    expect(r.stderr).toMatch(/--mode "turbo" is not a mode/);
  });

  it("lines on a directory that holds no store exits 1 with the store error's message (listing: test/integration/cpr-lines.test.ts)", async () => {
    const lines = await cli("lines", "--store", "x");
    expect(lines.code).toBe(1);
    expect(lines.stdout).toBe("");
    expect(lines.stderr).toMatch(/^lifeline: error: .*x/);
  });
});

describe("lifeline CLI help and version", () => {
  it("documents every run option in --help (exit 0)", async () => {
    const r = await cli("run", "--help");
    expect(r.code).toBe(0);
    for (const flag of [
      "-n, --np",
      "--mode",
      "--checkpoint-every",
      "--store",
      "--keep-lines",
      "--max-restarts",
      "--heartbeat",
      "--failure-timeout",
      "--stuck-timeout",
      "--rendezvous-timeout",
      "--results",
      "--json",
      "--quiet",
      "--transport",
      "--inject",
      "--replicas",
    ]) {
      expect(r.stdout).toContain(flag);
    }
    expect(r.stdout).toMatch(/Exit codes/);
  });

  it("prints the package version", async () => {
    const pkg = JSON.parse(readFileSync(join(CLI_SRC, "..", "..", "package.json"), "utf8")) as { version: string };
    const r = await cli("--version");
    expect(r.code).toBe(0);
    expect(r.stdout.trim()).toBe(pkg.version);
  });
});

describe("lifeline CLI as a process", () => {
  it("exits 2 on a usage error, before starting any rank", async () => {
    const r = await runCli(["run", "-n", "2", "--mode", "turbo", "--json", join(FIXTURES, "ok.ts")], { timeoutMs: 20_000 });
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/--mode "turbo" is not a mode/);
    expect(r.stderr).not.toMatch(/rank-spawned/);
  });

  it("starts with a node shebang so that npm can link it as a binary", () => {
    expect(readFileSync(CLI_SRC, "utf8").startsWith("#!/usr/bin/env node\n")).toBe(true);
  });
});
