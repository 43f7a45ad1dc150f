/**
 * Goal: a job runs across hosts — ranks started on other hosts through a remote-shell agent,
 * everything over tcp on the hosts' own addresses — and survives what happens to hosts: a
 * whole host lost (its processes and its disk) in retry-one and in cpr, with the lost ranks
 * restarted on the spare host and results bit-identical to an undisturbed run; a partition
 * longer than the failure timeout, after which the old incarnations are refused and end
 * themselves; packet loss; and the coordinator's host lost, after which every rank ends itself
 * within the failure timeout + 2 s and `--resume` on a surviving host finishes the job.
 *
 * Method: 3 test hosts in network namespaces (src/testing/netns.ts: 198.18.0.1-3, private
 * disks), a hostfile giving each 2 slots (4 ranks: hosts 1 and 2 full, host 3 spare), the
 * launcher running on host 1 with `--bind 198.18.0.1 --rsh test/fixtures/netns/rsh` (the agent
 * behaves as ssh: when its host dies it hangs, so only heartbeats tell). Stores live on the
 * machine's shared disk. References are `--mode none` runs on this machine. Needs root; without
 * it the test fails and says why.
 */
import { spawn } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { clusterSupport, netnsRshAgent, TestCluster } from "../../src/testing/netns.ts";
import { CLI, ROOT, runDirFor, runLauncher } from "./cpr-run.ts";

const TIMEOUT_MS = 90_000;
const runs = runDirFor("lifeline-hosts-");
let cluster: TestCluster;
const LOGREG = ["examples/logreg.ts", "--steps", "400"];
const HEAT = ["examples/heat.ts", "--rows", "128", "--cols", "128", "--iters", "1500", "--tol", "0"];
/** Fast detection: a beat every 100 ms, silent for 1 s = failed. */
const FAST = ["--heartbeat", "100", "--failure-timeout", "1s"];

beforeAll(async () => {
  const problem = await clusterSupport();
  if (problem !== undefined) throw new Error(`the many-host tests need test hosts, and here ${problem}`);
  writeFileSync(join(runs.path, "hostfile"), "# 2 slots each; host 3 is the spare\n198.18.0.1 slots=2\n198.18.0.2 slots=2\n198.18.0.3 slots=2\n");
  writeFileSync(join(runs.path, "survivors"), "198.18.0.2 slots=2\n198.18.0.3 slots=2\n");
});

// Hosts die in these tests: every test gets a cluster of its own.
beforeEach(async () => {
  cluster = await TestCluster.create(3, { diskMb: 32 });
}, 60_000);

afterEach(async () => {
  await cluster?.destroy();
});

interface HostRun {
  code: number | null;
  events: Record<string, unknown>[];
  stderr: string;
  doc: { ranks: unknown[]; restarts: number; run?: number; error?: { code: string; message: string }; recovery?: Record<string, unknown> } | undefined;
}

/**
 * Runs `lifeline run --json` on test host `host` (0-based) with the hostfile; `onEvent` sees
 * each event as it comes and may act on the cluster.
 */
function runOnHost(host: number, name: string, flags: readonly string[], program: readonly string[], onEvent?: (ev: Record<string, unknown>) => void, hostfile = "hostfile"): Promise<HostRun> {
  const results = join(runs.path, `${name}.json`);
  const argv = [process.execPath, CLI, "run", "--json", "--bind", cluster.hosts[host]!.address, "--hostfile", join(runs.path, hostfile), "--rsh", netnsRshAgent,
    "--store", join(runs.path, `${name}.store`), "--results", results, ...flags, ...program];
  const child = cluster.spawn(host, argv, { cwd: ROOT, env: { ...process.env, ...cluster.agentEnv }, stdio: ["ignore", "ignore", "pipe"] });
  const events: Record<string, unknown>[] = [];
  let stderr = "";
  let partial = "";
  child.stderr!.setEncoding("utf8").on("data", (chunk: string) => {
    stderr += chunk;
    partial += chunk;
    const lines = partial.split("\n");
    partial = lines.pop()!;
    for (const line of lines) {
      if (!line.startsWith("{")) continue;
      try {
        const ev = JSON.parse(line) as Record<string, unknown>;
        events.push(ev);
        onEvent?.(ev);
      } catch {
        // a rank's own line
      }
    }
  });
  const timer = setTimeout(() => child.kill("SIGKILL"), TIMEOUT_MS - 5_000);
  return new Promise((resolve) => {
    child.on("exit", (code) => {
      clearTimeout(timer);
      const doc = existsSync(results) ? (JSON.parse(readFileSync(results, "utf8")) as HostRun["doc"]) : undefined;
      resolve({ code, events, stderr, doc });
    });
  });
}

const tail = (r: HostRun): string => `exit ${r.code}\n${r.stderr.split("\n").filter((l) => !l.includes('"rank-step"')).slice(-40).join("\n")}`;
const spawnedOn = (r: HostRun, attempt?: number): Record<number, string> =>
  Object.fromEntries(r.events.filter((e) => e.event === "rank-spawned" && (attempt === undefined || e.attempt === attempt)).map((e) => [e.rank as number, e.host as string]));

async function reference(name: string, program: readonly string[]): Promise<unknown[]> {
  const ref = await runLauncher({ np: 4, program: program[0]!, args: program.slice(1), flags: ["--mode", "none"], dir: runs.path, name, timeoutMs: TIMEOUT_MS });
  expect(ref.code, ref.stderr).toBe(0);
  return ref.doc!.ranks;
}

/** Kills test host `i` once rank `rank` reported `steps` steps. */
function killAtStep(i: number, rank: number, steps: number): (ev: Record<string, unknown>) => void {
  let done = false;
  return (ev) => {
    if (done || ev.event !== "rank-step" || ev.rank !== rank || (ev.steps as number) < steps) return;
    done = true;
    void cluster.killHost(i);
  };
}

describe("a job across hosts", () => {
  it("runs ranks on the hosts of the hostfile, over their own addresses; results equal a one-host run", async () => {
    const ref = await reference("ref-logreg", LOGREG);
    const r = await runOnHost(0, "plain", ["-n", "4", "--mode", "none"], LOGREG);
    expect(r.code, tail(r)).toBe(0);
    expect(r.doc!.ranks).toEqual(ref);
    expect(spawnedOn(r)).toEqual({ 0: "198.18.0.1", 1: "198.18.0.1", 2: "198.18.0.2", 3: "198.18.0.2" });
    expect(r.events.find((e) => e.event === "job-starting")).toMatchObject({ coordinator: expect.stringMatching(/^tcp:\/\/198\.18\.0\.1:\d+$/) });
  }, TIMEOUT_MS);

  it("retry-one: host 2 dies with its ranks and disk; they restart on the spare host alone, bit-identical", async () => {
    const ref = await reference("ref-logreg2", LOGREG);
    const r = await runOnHost(0, "retry", ["-n", "4", "--mode", "retry-one", ...FAST], LOGREG, killAtStep(1, 2, 3));
    expect(r.code, tail(r)).toBe(0);
    expect(r.doc!.ranks).toEqual(ref);
    const restarted = r.events.filter((e) => e.event === "rank-spawned" && (e.attempt as number) > 0);
    expect(restarted.map((e) => [e.rank, e.host]).sort()).toEqual([[2, "198.18.0.3"], [3, "198.18.0.3"]]);
    expect(r.events.filter((e) => e.event === "rank-failed").every((e) => /sent no heartbeat/.test(e.reason as string))).toBe(true);
  }, TIMEOUT_MS);
});
