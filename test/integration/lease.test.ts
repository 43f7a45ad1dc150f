/**
 * Goal: a rank never waits for a coordinator that will not come back. Ranks without the
 * launcher's pipe (on another host, or started by another engine) hold a lease: the
 * coordinator answers each heartbeat of their watchdog thread; once it stops — its host died,
 * the network is partitioned, or the rank was declared dead and replaced — every rank exits by
 * itself with exit code 75 within --failure-timeout (+ the watchdog's tick); a rank whose main
 * thread is stuck in a synchronous loop is ended by its watchdog thread (SIGUSR2) 1 s later.
 *
 * Method: a real Coordinator (tcp, port 0) in the test process and real rank processes of
 * test/fixtures/launch/forever.ts started by hand with the LIFELINE_* variables another engine
 * would set (no LIFELINE_WATCH_FD), heartbeat 100 ms, failure timeout 1 s. Once the job is up,
 * the coordinator is closed (or starts a new round, which replaces every incarnation); each
 * rank's exit code and the time to it are checked. Nothing is mocked.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { afterEach, describe, expect, it } from "vitest";
import { Coordinator, type CoordinatorEvent } from "../../src/launch/coordinator.ts";
import { rankCommand } from "../../src/launch/rank-process.ts";
import { EXIT_COORDINATOR_LOST } from "../../src/mpi/control.ts";
import { EventLog, tempDir } from "../launch/helpers.ts";
import { ROOT } from "./cpr-run.ts";

const FAILURE_TIMEOUT_MS = 1_000;
let cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.reverse()) await c();
  cleanups = [];
});

interface Rank {
  child: ChildProcess;
  stderr: () => string;
  exited: Promise<{ code: number | null; signal: string | null; atMs: number }>;
}

function startRank(rank: number, size: number, coordinator: string, how: string): Rank {
  const { command, args } = rankCommand(`${ROOT}test/fixtures/launch/forever.ts`, [how]);
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("LIFELINE_")) env[k] = v;
  Object.assign(env, {
    LIFELINE_RANK: String(rank),
    LIFELINE_SIZE: String(size),
    LIFELINE_COORDINATOR: coordinator,
    LIFELINE_MODE: "none",
    LIFELINE_TRANSPORT: "tcp",
    LIFELINE_HEARTBEAT_MS: "100",
    LIFELINE_FAILURE_TIMEOUT_MS: String(FAILURE_TIMEOUT_MS),
  });
  const child = spawn(command, args, { cwd: ROOT, env, stdio: ["ignore", "ignore", "pipe"] });
  let err = "";
  child.stderr.setEncoding("utf8").on("data", (c: string) => {
    err += c;
  });
  const exited = new Promise<{ code: number | null; signal: string | null; atMs: number }>((resolve) => {
    child.on("exit", (code, signal) => resolve({ code, signal, atMs: performance.now() }));
  });
  cleanups.push(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  });
  return { child, stderr: () => err, exited };
}

async function upJob(size: number, how: string) {
  const { dir, cleanup } = tempDir("lifeline-lease-");
  cleanups.push(cleanup);
  const events = new EventLog<CoordinatorEvent>();
  const coord = new Coordinator({ size, transport: "tcp", runDir: dir, rendezvousTimeoutMs: 30_000, onEvent: events.push });
  const endpoint = await coord.start();
  cleanups.push(() => coord.close());
  const ranks = Array.from({ length: size }, (_, r) => startRank(r, size, endpoint, how));
  await events.waitFor((e) => e.kind === "ready", 30_000);
  // Both ranks beat (and got leases) for a while.
  await new Promise((r) => setTimeout(r, 500));
  return { coord, ranks };
}

describe("the lease of ranks without the launcher's pipe", () => {
  it("the coordinator goes away: every rank exits with 75 within the failure timeout (and a tick)", async () => {
    const { coord, ranks } = await upJob(2, "steps");
    const closedAt = performance.now();
    await coord.close();
    for (const r of ranks) {
      const exit = await r.exited;
      expect(exit.code, r.stderr()).toBe(EXIT_COORDINATOR_LOST);
      expect(exit.atMs - closedAt).toBeGreaterThanOrEqual(FAILURE_TIMEOUT_MS - 150);
      expect(exit.atMs - closedAt).toBeLessThan(FAILURE_TIMEOUT_MS + 2_000);
      expect(r.stderr()).toMatch(/the coordinator at tcp:\/\/127\.0\.0\.1:\d+ has not answered for \d+ ms \(--failure-timeout\)/);
    }
  }, 40_000);

  it("a rank busy in a synchronous loop cannot exit by itself: its watchdog thread ends it with SIGUSR2 a second later", async () => {
    const { coord, ranks } = await upJob(2, "busy");
    const closedAt = performance.now();
    await coord.close();
    for (const r of ranks) {
      const exit = await r.exited;
      expect(exit.signal, r.stderr()).toBe("SIGUSR2");
      expect(exit.atMs - closedAt).toBeLessThan(FAILURE_TIMEOUT_MS + 2_000);
    }
  }, 40_000);

  it("a rank replaced by a new incarnation gets no lease and ends itself; the coordinator carries on", async () => {
    const { coord, ranks } = await upJob(2, "steps");
    const replacedAt = performance.now();
    coord.restartRound([1, 1]); // every rank restarted: the running attempt-0 processes are stale
    for (const r of ranks) {
      const exit = await r.exited;
      expect(exit.code, r.stderr()).toBe(EXIT_COORDINATOR_LOST);
      expect(exit.atMs - replacedAt).toBeLessThan(FAILURE_TIMEOUT_MS + 2_000);
      expect(r.stderr()).toMatch(/ending this rank \(exit 75\)/);
    }
  }, 40_000);
});
