/**
 * Goal: no rank process outlives its launcher. SIGINT/SIGTERM stop the job gracefully (exit
 * 130/143); a SIGKILLed launcher, which can run no code at all, still takes every rank with
 * it — also a rank stuck in a synchronous loop — because ranks see EOF on their watch pipe.
 *
 * Method: start the source CLI on test/fixtures/launch/forever.ts (ranks that never finish),
 * wait for the `job-started` event and a step, signal the launcher, then check by pid (from
 * `rank-spawned` events) that every rank is gone within a bound. Every test kills what it
 * started, by pid. Each test's launchers get a private TMPDIR, where their run directories go:
 * after a SIGKILL, the next launcher must delete the one the killed launcher left.
 */
import { mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { CliProcess, FIXTURES, killCli, requireBuild, processExists, waitGone } from "../launch/helpers.ts";

let started: CliProcess[] = [];
let tmp = "";

beforeAll(requireBuild);
beforeEach(() => {
  tmp = mkdtempSync(join(tmpdir(), "signals-"));
});
afterEach(() => {
  for (const cli of started) killCli(cli);
  started = [];
  rmSync(tmp, { recursive: true, force: true });
});

/** The run directories under this test's TMPDIR. */
function runDirs(): string[] {
  return readdirSync(tmp).filter((n) => n.startsWith("lifeline-"));
}

/** Starts a never-ending job and resolves once every rank has taken a step. */
async function runningJob(how: "steps" | "busy", np: number): Promise<CliProcess> {
  const cli = new CliProcess(["run", "-n", String(np), "--mode", "none", "--json", join(FIXTURES, "forever.ts"), how], {
    timeoutMs: 40_000,
    env: { ...process.env, TMPDIR: tmp },
  });
  started.push(cli);
  await cli.events.waitFor((e) => e.event === "job-started", 30_000, "job-started");
  if (how === "steps") {
    for (let rank = 0; rank < np; rank++) await cli.events.waitFor((e) => e.event === "rank-step" && e.rank === rank, 10_000, `a step of rank ${rank}`);
  }
  expect(cli.rankPids()).toHaveLength(np);
  return cli;
}

describe("stopping the launcher", () => {
  it.each([
    ["SIGINT", 130],
    ["SIGTERM", 143],
  ] as const)("%s stops the job gracefully and exits %i", async (signal, code) => {
    const cli = await runningJob("steps", 3);
    const pids = cli.rankPids();
    // Twice at once, as under npx (npm forwards the signal the terminal also delivered): that
    // is one request to stop, still graceful.
    cli.child.kill(signal);
    cli.child.kill(signal);
    const r = await cli.done;
    expect(r.code, r.stderr).toBe(code);
    expect(runDirs()).toEqual([]);
    // The launcher returns only after its ranks are gone.
    expect(pids.filter(processExists)).toEqual([]);
    const finished = cli.events.all.find((e) => e.event === "job-finished")!;
    expect(finished).toMatchObject({ ok: false, exitCode: code, error: { code: "LAUNCH_INTERRUPTED" } });
    expect(cli.events.all.find((e) => e.event === "job-stopping")?.reason).toMatch(new RegExp(`^interrupted by ${signal}`));
    // Ranks stopped by the launcher are not reported as failures of their own.
    expect(cli.events.all.filter((e) => e.event === "rank-failed")).toEqual([]);
    // Graceful: SIGTERM ended them, no SIGKILL was needed.
    const exits = cli.events.all.filter((e) => e.event === "rank-exited");
    expect(exits.map((e) => [e.signal, e.killedByLauncher])).toEqual([
      ["SIGTERM", true],
      ["SIGTERM", true],
      ["SIGTERM", true],
    ]);
  });

  it("SIGKILL of the launcher takes every rank with it", async () => {
    const cli = await runningJob("steps", 2);
    const pids = cli.rankPids();
    cli.child.kill("SIGKILL");
    const r = await cli.done;
    expect(r.signal).toBe("SIGKILL");
    expect(await waitGone(pids, 3_000)).toEqual([]);
    // The killed launcher could not delete its run directory; the next launcher does.
    expect(runDirs()).toHaveLength(1);
    const next = new CliProcess(["run", "-n", "1", "--mode", "none", "--json", join(FIXTURES, "ok.js")], { env: { ...process.env, TMPDIR: tmp } });
    started.push(next);
    const done = await next.done;
    expect(done.code, done.stderr).toBe(0);
    expect(runDirs()).toEqual([]);
  });

  it("SIGKILL of the launcher also ends ranks busy in a synchronous loop", async () => {
    const cli = await runningJob("busy", 2);
    const pids = cli.rankPids();
    cli.child.kill("SIGKILL");
    await cli.done;
    expect(await waitGone(pids, 3_000)).toEqual([]);
  });
});
