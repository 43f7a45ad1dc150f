/**
 * Goal: bench/tools/retry-path.ts, which the performance notes' per-collective protocol figures
 * come from, runs the real driver to the end (every collective decided and kept; a protocol
 * error would end the run) and prints a figure per variant; bad command lines get its usage.
 *
 * Method: the real tool in a child process, with a few calls per round.
 */
import { execFile } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");

function run(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, ["--import", "tsx", "bench/tools/retry-path.ts", ...args], { cwd: ROOT, timeout: 60_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? Number((err as { code?: number }).code ?? 1) : 0, stdout, stderr });
    });
  });
}

describe("bench/tools/retry-path.ts", () => {
  it("decides and keeps every collective and prints µs per collective for each amount of memory read", async () => {
    const r = await run(["--calls", "500", "--rounds", "2", "--touch-mib", "0,1"]);
    expect(r.stderr).toBe("");
    expect(r.code).toBe(0);
    const lines = r.stdout.split("\n").filter((l) => l.includes("µs per collective"));
    expect(lines.map((l) => /^ {2}(\d+) MiB read/.exec(l)?.[1])).toEqual(["0", "1"]);
    for (const l of lines) expect(Number(/: ([\d.]+) µs/.exec(l)?.[1])).toBeGreaterThan(0);
  });

  it("answers a bad command line with its usage", async () => {
    const r = await run(["--calls", "70000"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/usage: retry-path\.ts/);
  });
});
