/**
 * Goal: `--launcher slurm` reads an allocation as Slurm writes it — tasks per node in its
 * `2(x3),1` notation, the node list, the job id — refuses to run outside one with a message
 * that says what to do, and builds the srun and scancel command lines a rank's step needs;
 * `--launcher` is validated with the other flags and picks the hosts of each kind.
 *
 * Method: the pure parsers and command builders called directly; the allocation read from a
 * made-up environment with a stand-in for `scontrol show hostnames`; resolveRunConfig with an
 * environment of its own, as the CLI passes it. The real Slurm runs in
 * test/integration/slurm.test.ts.
 */
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { launcherHosts } from "../../src/launch/hosts.ts";
import { resolveRunConfig, type RunFlags } from "../../src/launch/options.ts";
import { parseTasksPerNode, scancelCommand, scontrolHostnames, slurmAllocation, slurmJobId, srunCommand, stepIdOf } from "../../src/launch/slurm.ts";
import { rankLauncherFor } from "../../src/launch/spawners.ts";
import { tempDir, usageMessage } from "./helpers.ts";

const { dir, cleanup } = tempDir("lifeline-slurm-options-");
afterAll(cleanup);
writeFileSync(join(dir, "app.ts"), "export {};\n");
writeFileSync(join(dir, "hosts"), "node1 slots=2\nnode2 slots=2\n");

const ALLOCATION = { SLURM_JOB_ID: "42", SLURM_JOB_NODELIST: "node[1-3],gpu7", SLURM_TASKS_PER_NODE: "2(x3),1" };
const expand = (list: string): string[] => (list === "node[1-3],gpu7" ? ["node1", "node2", "node3", "gpu7"] : []);

describe("parseTasksPerNode", () => {
  it("reads counts, repeated ones as N(xM)", () => {
    expect(parseTasksPerNode("2(x3),1")).toEqual([2, 2, 2, 1]);
    expect(parseTasksPerNode("4")).toEqual([4]);
    expect(parseTasksPerNode("1,3(x2),2")).toEqual([1, 3, 3, 2]);
    expect(parseTasksPerNode(" 8(x1) ")).toEqual([8]);
  });

  it("refuses anything else, naming the variable", () => {
    for (const bad of ["", "two", "2(x)", "2(3)", "0", "2(x0)", "2,,1", "-1", "2(x3"]) {
      expect(usageMessage(() => parseTasksPerNode(bad, "SLURM_JOB_CPUS_PER_NODE"))).toMatch(/^SLURM_JOB_CPUS_PER_NODE=.* is not Slurm's tasks-per-node list/);
    }
  });
});

describe("the allocation", () => {
  it("gives the job id and each node with its tasks as slots", () => {
    expect(slurmAllocation(ALLOCATION, expand)).toEqual({
      jobId: "42",
      hosts: [
        { host: "node1", slots: 2 },
        { host: "node2", slots: 2 },
        { host: "node3", slots: 2 },
        { host: "gpu7", slots: 1 },
      ],
    });
    // sbatch without tasks: the CPUs per node, in the same notation.
    const cpus = { SLURM_JOB_ID: "7", SLURM_NODELIST: "a,b", SLURM_JOB_CPUS_PER_NODE: "4(x2)" };
    expect(slurmAllocation(cpus, (l) => l.split(","))).toEqual({
      jobId: "7",
      hosts: [
        { host: "a", slots: 4 },
        { host: "b", slots: 4 },
      ],
    });
  });

  it("outside an allocation: says so, and how to get one", () => {
    const m = usageMessage(() => slurmJobId({}));
    expect(m).toMatch(/SLURM_JOB_ID is not set: this is not inside an allocation/);
    expect(m).toMatch(/salloc -N 3 --no-kill lifeline run --launcher slurm/);
    expect(m).toMatch(/#SBATCH --no-kill/);
    expect(usageMessage(() => slurmJobId({ SLURM_JOB_ID: "12a" }))).toMatch(/SLURM_JOB_ID="12a" is not a job id/);
  });

  it("variables that do not fit together are refused", () => {
    expect(usageMessage(() => slurmAllocation({ SLURM_JOB_ID: "1" }, expand))).toMatch(/SLURM_JOB_NODELIST is not set/);
    expect(usageMessage(() => slurmAllocation({ SLURM_JOB_ID: "1", SLURM_JOB_NODELIST: "n1" }, expand))).toMatch(
      /neither SLURM_TASKS_PER_NODE nor SLURM_JOB_CPUS_PER_NODE/,
    );
    expect(usageMessage(() => slurmAllocation({ ...ALLOCATION, SLURM_TASKS_PER_NODE: "2(x2)" }, expand))).toMatch(
      /lists 4 nodes .* but SLURM_TASKS_PER_NODE=2\(x2\) counts 2/,
    );
  });

  it("a plain list of names needs no scontrol", () => {
    expect(scontrolHostnames("n1,n2, n3", { PATH: "/nonexistent" })).toEqual(["n1", "n2", "n3"]);
  });
});

describe("the step's command lines", () => {
  it("srun: one task on the named node, a step of its own that shares the job's resources", () => {
    const argv = srunCommand({ jobId: "42", host: "node3", rank: 2, line: "echo hi" });
    expect(argv.slice(0, 1)).toEqual(["srun"]);
    expect(argv).toEqual(
      expect.arrayContaining([
        "--jobid=42",
        "--nodelist=node3",
        "--nodes=1",
        "--ntasks=1",
        "--overlap",
        "--kill-on-bad-exit=0",
        "--input=all",
        "--job-name=lifeline-rank-2",
      ]),
    );
    expect(argv.slice(-3)).toEqual(["sh", "-c", "echo hi"]);
  });

  it("scancel: the signal through the controller, to the step", () => {
    expect(scancelCommand("42.7", "SIGTERM")).toEqual(["scancel", "--ctld", "--signal=TERM", "42.7"]);
    expect(stepIdOf(" 42.7 ")).toBe("42.7");
    expect(stepIdOf("")).toBeUndefined();
    expect(stepIdOf("42.")).toBeUndefined();
  });
});

describe("--launcher", () => {
  const env = { PATH: process.env.PATH };
  const resolveWith = (flags: RunFlags, extra: NodeJS.ProcessEnv = {}) =>
    resolveRunConfig({ np: "2", mode: "none", app: "app.ts", ...flags }, { cwd: dir, env: { ...env, ...extra } });

  it("local by default, rsh with a hostfile, and their hosts", () => {
    expect(resolveWith({})).toMatchObject({ launcher: "local", hosts: undefined, transport: "ipc" });
    expect(resolveWith({ hostfile: "hosts", bind: "127.0.0.1" })).toMatchObject({
      launcher: "rsh",
      hosts: [
        { host: "node1", slots: 2 },
        { host: "node2", slots: 2 },
      ],
    });
    expect(rankLauncherFor(resolveWith({})).kind).toBe("local");
    expect(rankLauncherFor(resolveWith({ hostfile: "hosts", bind: "127.0.0.1" })).kind).toBe("rsh");
  });

  it("slurm: the allocation's job, tcp, and the hostfile's hosts when one is given", () => {
    const c = resolveWith({ launcher: "slurm", bind: "127.0.0.1", hostfile: "hosts" }, { SLURM_JOB_ID: "42" });
    expect(c).toMatchObject({
      launcher: "slurm",
      slurmJobId: "42",
      transport: "tcp",
      hosts: [
        { host: "node1", slots: 2 },
        { host: "node2", slots: 2 },
      ],
    });
    const launcher = rankLauncherFor(c);
    expect(launcher.kind).toBe("slurm");
    expect(launcher.hosts).toEqual(c.hosts);
    // The allocation's hosts otherwise.
    expect(launcherHosts("slurm", undefined, { ...ALLOCATION, SLURM_JOB_NODELIST: "node1,node2,node3,gpu7" }).hosts).toHaveLength(4);
  });

  it("slurm outside an allocation, without --bind, with --rsh: each problem named", () => {
    const m = usageMessage(() => resolveWith({ launcher: "slurm", rsh: "ssh" }));
    expect(m).toMatch(/SLURM_JOB_ID is not set/);
    expect(m).toMatch(/--launcher slurm needs --bind/);
    expect(m).toMatch(/--rsh is the agent of --launcher rsh/);
  });

  it("slurm: an allocation too small for -n is refused, saying how to grow it", () => {
    const m = usageMessage(() =>
      resolveRunConfig(
        { np: "5", mode: "none", app: "app.ts", launcher: "slurm", bind: "127.0.0.1" },
        { cwd: dir, env: { SLURM_JOB_ID: "3", SLURM_JOB_NODELIST: "a,b", SLURM_TASKS_PER_NODE: "2(x2)" } },
      ),
    );
    expect(m).toMatch(/the allocation has 4 slots for 5 ranks; allocate more nodes or tasks per node/);
  });

  it("unknown launchers, rsh without a hostfile and local with one are refused", () => {
    expect(usageMessage(() => resolveWith({ launcher: "ssh" }))).toMatch(/--launcher "ssh" is not a launcher; use one of local, rsh, slurm/);
    expect(usageMessage(() => resolveWith({ launcher: "rsh", bind: "127.0.0.1" }))).toMatch(/--launcher rsh starts ranks on the hosts of a --hostfile/);
    expect(usageMessage(() => resolveWith({ launcher: "local", hostfile: "hosts", bind: "127.0.0.1" }))).toMatch(
      /--launcher local runs every rank on this host/,
    );
  });
});
