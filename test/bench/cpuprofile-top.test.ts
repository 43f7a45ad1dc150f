/**
 * Goal: bench/tools/cpuprofile-top.ts, which the performance notes' profile summaries come from,
 * attributes a profile's time to the right areas and functions, honours `--last-s`, and
 * answers bad command lines with its usage instead of a stack trace.
 *
 * Method: a hand-made profile (a root, a Lifeline function, a bench function, the garbage
 * collector) with known sample times, summarized by the real tool in a child process.
 */
import { execFile } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const tmp = mkdtempSync(path.join(os.tmpdir(), "lf-cpuprofile-top-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

function run(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, ["--import", "tsx", "bench/tools/cpuprofile-top.ts", ...args], { cwd: ROOT, timeout: 60_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? Number((err as { code?: number }).code ?? 1) : 0, stdout, stderr });
    });
  });
}

/**
 * 1 s of `send` in dist/mpi/channel.js, then 2 s of the garbage collector, then 1 s of a bench
 * function: a sample every 0.5 s, each standing for the time since the one before (V8's
 * timeDeltas; the first one since the profile's start).
 */
function profileFile(): string {
  const frame = (functionName: string, url: string) => ({ functionName, url, lineNumber: 9, scriptId: "1", columnNumber: 0 });
  const profile = {
    nodes: [
      { id: 1, callFrame: frame("(root)", ""), children: [2, 3, 4] },
      { id: 2, callFrame: frame("send", "file:///x/dist/mpi/channel.js") },
      { id: 3, callFrame: frame("(garbage collector)", "") },
      { id: 4, callFrame: frame("runBlock", "file:///x/bench/programs/mpi-bench.ts") },
    ],
    samples: [2, 2, 3, 3, 3, 3, 4, 4],
    timeDeltas: [500_000, 500_000, 500_000, 500_000, 500_000, 500_000, 500_000, 500_000],
    startTime: 0,
    endTime: 4_000_000,
  };
  const file = path.join(tmp, "p.cpuprofile");
  writeFileSync(file, JSON.stringify(profile));
  return file;
}

describe("cpuprofile-top", () => {
  it("sums self time by area and by function", async () => {
    const r = await run(["--top", "5", profileFile()]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/gc\s+2000 ms\s+50\.0%/);
    expect(r.stdout).toMatch(/lifeline\s+1000 ms\s+25\.0%/);
    expect(r.stdout).toMatch(/bench program\s+1000 ms\s+25\.0%/);
    expect(r.stdout).toMatch(/1000\.0 ms\s+25\.0%\s+send channel\.js:10/);
  });

  it("keeps only the last S seconds with --last-s", async () => {
    // From 2.5 s on: the samples taken at 2.5 and 3 s (the collector) and at 3.5 and 4 s (the
    // bench function); none of `send`'s.
    const r = await run(["--last-s", "1.5", profileFile()]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).not.toMatch(/lifeline\s/);
    expect(r.stdout).toMatch(/bench program\s+1000 ms/);
    expect(r.stdout).toMatch(/gc\s+1000 ms/);
  });

  it("prints its usage for --help, and refuses bad options and missing files", async () => {
    const help = await run(["--help"]);
    expect(help.code).toBe(0);
    expect(help.stdout).toMatch(/^usage: /);
    const bad = await run(["--bogus", profileFile()]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/unknown option --bogus\nusage: /);
    const noTop = await run(["--top", "0", profileFile()]);
    expect(noTop.code).toBe(2);
    const missing = await run([path.join(tmp, "absent.cpuprofile")]);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toMatch(/cannot summarize .*absent\.cpuprofile: ENOENT/);
  });
});
