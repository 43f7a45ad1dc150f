/**
 * Goal: the Supervisor's policy hook sees each rank failure with what a restart policy needs
 * (kind, rank, exit status), and a job whose ranks finalized but do not exit is ended within
 * the release timeout instead of hanging.
 *
 * Method: run a Supervisor in-process on real rank programs (test/fixtures/launch, importing
 * "lifeline" from dist/), with a recording reporter and a custom policy.
 */
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { resolveRunConfig } from "../../src/launch/options.ts";
import type { JobEvent, Reporter } from "../../src/launch/progress.ts";
import { failFastPolicy, type JobView, type RankFailure, type RestartPolicy } from "../../src/launch/policy.ts";
import { Supervisor } from "../../src/launch/supervisor.ts";
import { makeJobKeys } from "../../src/mpi/keys.ts";
import { FIXTURES, killAll, tempDir, requireBuild, ROOT, waitGone } from "./helpers.ts";

const { dir, cleanup } = tempDir("lifeline-sup-");
let pids: number[] = [];

beforeAll(requireBuild);
afterEach(() => {
  killAll(pids);
  pids = [];
});
afterAll(cleanup);

function recorder(): Reporter & { events: JobEvent[]; lines: string[] } {
  const events: JobEvent[] = [];
  const lines: string[] = [];
  return {
    events,
    lines,
    event: (ev) => void events.push(ev),
    rankLine: (rank, stream, line) => void lines.push(`${stream} [${rank}] ${line}`),
    close: () => undefined,
  };
}

function supervisor(app: string, args: string[], opts: { policy?: RestartPolicy; releaseExitTimeoutMs?: number } = {}) {
  const config = resolveRunConfig({ np: "2", mode: "none", app: join(FIXTURES, app), appArgs: args }, { cwd: ROOT });
  const reporter = recorder();
  const sup = new Supervisor(config, { reporter, runDir: dir, jobId: "test-job", keys: makeJobKeys({ curve: false }), baseEnv: process.env, ...opts });
  return { sup, reporter };
}

describe("Supervisor", () => {
  it("asks the policy about each failure, with the rank and its exit status", async () => {
    const seen: { failure: RankFailure; job: JobView }[] = [];
    const policy: RestartPolicy = {
      mode: "none",
      decide: (failure, job) => {
        seen.push({ failure, job: { ...job, finalized: [...job.finalized] } });
        return failFastPolicy.decide(failure, job);
      },
    };
    const { sup } = supervisor("crash.ts", ["1", "exit3"], { policy });
    const outcome = await sup.run();
    pids = outcome.pids;
    expect(seen).toEqual([
      {
        failure: {
          kind: "exit",
          rank: 1,
          code: "LAUNCH_RANK_FAILED",
          message: expect.stringMatching(/^rank 1 \(pid \d+\) exited with code 3 before finalizing$/),
          exitStatus: 3,
        },
        job: { size: 2, mode: "none", restarts: 0, maxRestarts: 3, finalized: [false, false], backoffMs: expect.any(Number), placeable: true },
      },
    ]);
    expect(outcome).toMatchObject({ ok: false, exitCode: 3, finalizedCount: 0, restarts: 0 });
    expect(outcome.error?.code).toBe("LAUNCH_RANK_FAILED");
    // The error carries the stderr tail for programs that embed the launcher.
    expect(outcome.error?.message).toContain("| rank 1 is about to fail (exit3)");
    expect(await waitGone(outcome.pids, 1_000)).toEqual([]);
  });

  it("fails the job with LAUNCH_SPAWN when ranks cannot be started", async () => {
    const config = resolveRunConfig({ np: "2", mode: "none", app: join(FIXTURES, "ok.js") }, { cwd: ROOT });
    const reporter = recorder();
    const sup = new Supervisor(
      { ...config, cwd: join(dir, "no-such-dir") },
      { reporter, runDir: dir, jobId: "j", keys: makeJobKeys({ curve: false }), baseEnv: process.env },
    );
    const outcome = await sup.run();
    pids = outcome.pids;
    expect(outcome).toMatchObject({ ok: false, exitCode: 1, pids: [] });
    expect(outcome.error?.code).toBe("LAUNCH_SPAWN");
    expect(outcome.summary).toMatch(/cannot start rank \d .*ENOENT/);
    expect(reporter.events.find((e) => e.kind === "job-stopping")).toMatchObject({ reason: expect.stringMatching(/cannot start rank/) });
  });

  it("a rank that dies on its way out after the release fails nothing and is not restarted (a warning says so)", async () => {
    for (const mode of ["none", "retry-one"] as const) {
      const config = resolveRunConfig(
        { np: "2", mode, durableEvery: mode === "retry-one" ? "0" : undefined, app: join(FIXTURES, "die-after-release.ts") },
        { cwd: ROOT },
      );
      const reporter = recorder();
      const sup = new Supervisor(config, { reporter, runDir: dir, jobId: `release-${mode}`, keys: makeJobKeys({ curve: false }), baseEnv: process.env });
      const outcome = await sup.run();
      pids.push(...outcome.pids);
      expect(outcome, mode).toMatchObject({ ok: true, exitCode: 0, finalizedCount: 2, restarts: 0, results: [0, 1] });
      expect(
        reporter.events.filter((e) => e.kind === "rank-spawned"),
        mode,
      ).toHaveLength(2);
      expect(reporter.events).toContainEqual({
        kind: "warning",
        message: expect.stringMatching(/^rank 1 \(pid \d+\) was killed by SIGKILL after the job was released \(its result was already in\)$/),
      });
    }
  });

  it("kills ranks that finalized but do not exit after release, and fails the job", async () => {
    const { sup, reporter } = supervisor("linger.ts", [], { releaseExitTimeoutMs: 500 });
    const outcome = await sup.run();
    pids = outcome.pids;
    expect(outcome).toMatchObject({ ok: false, exitCode: 1, finalizedCount: 2, results: [0, 1] });
    expect(outcome.summary).toMatch(
      /^ranks 0, 1 finalized but did not exit within 500 ms of being released \(does an open handle .* keep the process alive\?\); killed$/,
    );
    expect(reporter.lines).toContain("stdout [0] rank 0 released, but a timer keeps it alive");
    expect(reporter.events.filter((e) => e.kind === "rank-finalized")).toHaveLength(2);
    expect(await waitGone(outcome.pids, 1_000)).toEqual([]);
  });
});
