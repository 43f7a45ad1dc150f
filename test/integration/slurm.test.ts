/**
 * Goal: `lifeline run --launcher slurm` starts every rank as a job step of its own inside a
 * real Slurm allocation, on the allocation's nodes, and survives the loss of a whole node: in
 * retry-one the lost ranks alone come back as new steps on the spare node, restored from their
 * peers' memory; in cpr every rank restarts from the last recovery line, the lost ones as new
 * steps on the spare node; both with results bit-identical to an undisturbed one-host run.
 * A rank the launcher kills is killed on its node (through the controller), not only its
 * local srun. Outside an allocation `--launcher slurm` is refused with a message that says
 * what to do. The test cluster itself leaves no daemon, namespace or file behind.
 *
 * Method: 3 test hosts in network namespaces running Slurm 22.05 (src/testing/slurm.ts:
 * slurmctld and munged on host 1, a slurmd on each, nodes node1-node3 at 198.18.0.1-3), a
 * fresh cluster per test since nodes die. The launcher runs on node1 inside
 * `salloc -N 3 --ntasks-per-node=2 --no-kill` (2 slots a node: ranks 0-1 on node1, 2-3 on
 * node2, node3 spare) with `--bind eth0`, which each rank resolves on its own node. Node2 is
 * killed mid-job (its processes, slurmd included, and its cable); a rank frozen (SIGSTOP) by
 * fault injection cannot end itself, so only a signal on its node removes its step.
 * `squeue -s` shows the steps. References are `--mode none` runs on this machine. (retry-one
 * runs logreg, a collective program: heat's point-to-point calls are cpr's.) Needs root and Slurm with munge
 * (scripts/install-test-deps.sh, which .ci/run calls): without them the tests fail and say
 * what is missing, as the other many-host tests do — a skipped test would check nothing.
 */
import { spawn } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { slurmSupport, SlurmTestCluster, type SlurmStep } from "../../src/testing/slurm.ts";
import { waitGone } from "../launch/helpers.ts";
import { CLI, context, ROOT, runDirFor, runLauncher, spawnedOn, tunablesPrinted, watchRun, type WatchedRun } from "./cpr-run.ts";

const TIMEOUT_MS = 100_000;
const runs = runDirFor("lifeline-slurm-");
const LOGREG = ["examples/logreg.ts", "--steps", "400"];
const HEAT = ["examples/heat.ts", "--rows", "128", "--cols", "128", "--iters", "1500", "--tol", "0"];
/** Fast detection: a beat every 100 ms, silent for 1 s = failed. */
const FAST = ["--heartbeat", "100", "--failure-timeout", "1s"];
const ALLOCATION = ["-N", "3", "--ntasks-per-node=2", "--no-kill"];

const problem = await slurmSupport();

let slurm: SlurmTestCluster | undefined;

/**
 * Runs `salloc ALLOCATION lifeline run --json --launcher slurm --bind eth0 …` on node1;
 * `onEvent` sees each event as it comes and may act on the cluster.
 */
function runInAllocation(
  name: string,
  flags: readonly string[],
  program: readonly string[],
  onEvent?: (ev: Record<string, unknown>) => void,
  store = join(runs.path, `${name}.store`),
): Promise<WatchedRun> {
  const results = join(runs.path, `${name}.json`);
  const argv = [
    "salloc",
    ...ALLOCATION,
    process.execPath,
    CLI,
    "run",
    "--json",
    "--launcher",
    "slurm",
    "--bind",
    "eth0",
    "--store",
    store,
    "--results",
    results,
    ...flags,
    ...program,
  ];
  const child = slurm!.spawn(0, argv, { cwd: ROOT, stdio: ["ignore", "ignore", "pipe"] });
  return watchRun(child, results, TIMEOUT_MS - 10_000, onEvent);
}

/** Each rank's step as `squeue -s` lists it: rank → node. */
const stepNodes = (steps: readonly SlurmStep[]): Record<number, string> =>
  Object.fromEntries(
    steps.flatMap((s) => {
      const m = /^lifeline-rank-(\d+)$/.exec(s.name);
      return m === null ? [] : [[Number(m[1]), s.node]];
    }),
  );

/** Polls `squeue -s` until `done` holds for the steps (true), or `ms` pass (false). */
async function stepsUntil(done: (steps: SlurmStep[]) => boolean, ms: number): Promise<boolean> {
  const deadline = performance.now() + ms;
  while (performance.now() < deadline) {
    if (done(await slurm!.steps())) return true;
    await new Promise((res) => setTimeout(res, 100));
  }
  return false;
}

async function reference(name: string, program: readonly string[]): Promise<unknown[]> {
  const ref = await runLauncher({
    np: 4,
    program: program[0]!,
    args: program.slice(1),
    flags: ["--mode", "none"],
    dir: runs.path,
    name,
    timeoutMs: TIMEOUT_MS,
  });
  expect(ref.code, ref.stderr).toBe(0);
  return ref.doc!.ranks;
}

describe("a job as Slurm job steps", () => {
  beforeAll(() => {
    if (problem !== undefined) throw new Error(`the Slurm tests need test hosts with Slurm, and here ${problem}`);
  });

  // Nodes die in these tests: every test gets a cluster of its own.
  beforeEach(async () => {
    slurm = await SlurmTestCluster.create(3, { diskMb: 32 });
  }, 60_000);

  afterEach(async () => {
    await slurm?.destroy();
    slurm = undefined;
  });

  it("teardown leaves no daemon, namespace or file behind", async () => {
    const s = slurm!;
    const pids = (await Promise.all(s.cluster.hosts.map((_, i) => s.cluster.pids(i)))).flat();
    // A short-lived helper may be gone between the listing and the reading: it has no name then.
    const comms = pids.map((pid) => (existsSync(`/proc/${pid}/comm`) ? readFileSync(`/proc/${pid}/comm`, "utf8").trim() : ""));
    expect(comms).toEqual(expect.arrayContaining(["munged", "slurmctld", "slurmd", "slurmd", "slurmd"]));
    const names = s.cluster.hosts.map((h) => h.name);
    await s.destroy();
    expect(await waitGone(pids, 5_000)).toEqual([]);
    expect(readdirSync("/run/netns").filter((n) => names.includes(n))).toEqual([]);
    expect(existsSync(s.dir)).toBe(false);
  });

  it(
    "ranks run as steps with the launcher's malloc tunables once, before their own",
    async () => {
      // srun passes the launcher's environment on to the steps: the tunables must come from the
      // rank's shell line alone, not from that environment too.
      const r = await runInAllocation("tunables", ["-n", "4", "--mode", "none"], ["test/fixtures/launch/ok.ts", "1"]);
      expect(r.code, context(r)).toBe(0);
      const { printed, launchers } = tunablesPrinted(r.events, 4);
      expect(printed).toEqual(launchers);
    },
    TIMEOUT_MS,
  );

  it(
    "retry-one: ranks run as steps on the allocation's nodes; node2 dies, its ranks come back alone as new steps on node3, bit-identical",
    async () => {
      const ref = await reference("ref-logreg", LOGREG);
      let before: Promise<SlurmStep[]> | undefined;
      let after: Promise<SlurmStep[]> | undefined;
      let caughtUp = 0;
      // One replica each, placed on the other node first: ranks 0 and 1 hold 2's and 3's.
      const r = await runInAllocation("retry", ["-n", "4", "--mode", "retry-one", "--replicas", "1", ...FAST], LOGREG, (ev) => {
        if (before === undefined && ev.event === "rank-step" && ev.rank === 2 && (ev.steps as number) >= 3) {
          before = slurm!.steps();
          void before.then(() => slurm!.cluster.killHost(1));
        }
        if (ev.event === "rank-caught-up" && ++caughtUp === 2) after = slurm!.steps();
      });
      expect(r.code, context(r)).toBe(0);
      expect(r.doc!.ranks).toEqual(ref);
      expect(spawnedOn(r, 0)).toEqual({ 0: "node1", 1: "node1", 2: "node2", 3: "node2" });
      expect(spawnedOn(r, 1)).toEqual({ 2: "node3", 3: "node3" });
      expect(r.events.filter((e) => e.event === "rank-failed").every((e) => /sent no heartbeat/.test(e.reason as string))).toBe(true);
      // Each rank was a step of its own, and the replacements are new steps on the spare node.
      const stepsBefore = await before!;
      expect(stepNodes(stepsBefore)).toEqual({ 0: "node1", 1: "node1", 2: "node2", 3: "node2" });
      const stepsAfter = (await after!).filter((s) => /^lifeline-rank-[23]$/.test(s.name) && s.node === "node3");
      expect(stepsAfter.length).toBe(2);
      for (const s of stepsAfter) expect(stepsBefore.map((b) => b.step)).not.toContain(s.step);
      // Both restored a checkpoint (not the beginning) from the surviving node's replicas.
      const restored = r.events.filter((e) => e.event === "rank-caught-up");
      expect(restored.map((e) => e.rank).sort()).toEqual([2, 3]);
      for (const e of restored) expect(e.restored as number).toBeGreaterThan(0);
    },
    TIMEOUT_MS,
  );

  it(
    "cpr: node2 dies; every rank restarts from the last line as a new step, the lost ones on node3, bit-identical",
    async () => {
      const ref = await reference("ref-heat", HEAT);
      let lines = 0;
      let killed = false;
      // The lines go to each node's own disk (the default under --launcher slurm), every part
      // copied to a partner on another node: node2's disk dies with it.
      const r = await runInAllocation(
        "cpr",
        ["-n", "4", "--mode", "cpr", "--checkpoint-every", "100ms", ...FAST],
        HEAT,
        (ev) => {
          if (ev.event === "line-committed") lines++;
          if (!killed && lines >= 2) {
            killed = true;
            void slurm!.cluster.killHost(1);
          }
        },
        join(slurm!.cluster.diskPath, "cpr.store"),
      );
      expect(r.code, context(r)).toBe(0);
      expect(killed).toBe(true);
      expect(r.doc!.ranks).toEqual(ref);
      expect(r.doc!.restarts).toBeGreaterThanOrEqual(1);
      const rollback = (r.doc!.recovery!.rollbacks as { epoch: number }[])[0]!;
      expect(rollback.epoch).toBeGreaterThan(0); // from a line, not from the beginning
      expect(spawnedOn(r, 0)).toEqual({ 0: "node1", 1: "node1", 2: "node2", 3: "node2" });
      expect(spawnedOn(r, 1)).toEqual({ 0: "node1", 1: "node1", 2: "node3", 3: "node3" });
      expect(r.events.filter((e) => e.event === "warning" && /restoring it from the partner copy/.test(e.message as string))).toHaveLength(2);
    },
    TIMEOUT_MS,
  );

  it(
    "a frozen rank's step is ended on its live node through the controller, not only its srun; cpr restarts every rank as new steps",
    async () => {
      const ref = await reference("ref-heat2", HEAT);
      let first: Promise<SlurmStep[]> | undefined;
      let gone: Promise<boolean> | undefined;
      let started = 0;
      // Rank 2 stops (SIGSTOP) at its 20th step: no heartbeat, and no lease of its own to end
      // it. Only a signal on its node does: killing its srun on this node leaves the step.
      const r = await runInAllocation(
        "frozen",
        ["-n", "4", "--mode", "cpr", "--store-scope", "shared", "--checkpoint-every", "100ms", ...FAST, "--inject", "2@hang:step:20"],
        HEAT,
        (ev) => {
          if (ev.event !== "job-started") return;
          started++;
          if (started === 1) first = slurm!.steps();
          if (started === 2) gone = first!.then((old) => stepsUntil((now) => now.every((s) => !old.some((o) => o.step === s.step)), 5_000));
        },
      );
      expect(r.code, context(r)).toBe(0);
      expect(r.doc!.ranks).toEqual(ref);
      expect(r.events.filter((e) => e.event === "rank-failed").map((e) => [e.rank, /sent no heartbeat/.test(e.reason as string)])).toEqual([[2, true]]);
      const old = await first!;
      expect(stepNodes(old)).toEqual({ 0: "node1", 1: "node1", 2: "node2", 3: "node2" });
      expect(await gone!, "the old steps (the frozen one among them) were still running after the restart").toBe(true);
      // A silent rank may mean a dead node: its node's ranks move to the spare one.
      expect(spawnedOn(r, 1)).toEqual({ 0: "node1", 1: "node1", 2: "node3", 3: "node3" });
    },
    TIMEOUT_MS,
  );
});

describe("--launcher slurm outside an allocation", () => {
  it("is refused before anything starts, with what to do instead", async () => {
    const env: NodeJS.ProcessEnv = {};
    for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("SLURM_")) env[k] = v;
    const child = spawn(process.execPath, [CLI, "run", "-n", "2", "--launcher", "slurm", "--bind", "127.0.0.1", "--mode", "none", "examples/heat.ts"], {
      cwd: ROOT,
      env,
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    child.stdout.setEncoding("utf8").on("data", (c: string) => {
      out += c;
    });
    child.stderr.setEncoding("utf8").on("data", (c: string) => {
      out += c;
    });
    const code = await new Promise<number | null>((resolve) => child.on("exit", resolve));
    expect(code, out).toBe(2);
    expect(out).toMatch(/--launcher slurm .* SLURM_JOB_ID is not set: this is not inside an allocation/);
    expect(out).toMatch(/salloc .*--no-kill lifeline run --launcher slurm/);
    expect(out).not.toMatch(/rank-spawned|job-starting/);
  });
});
