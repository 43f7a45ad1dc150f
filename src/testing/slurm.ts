/**
 * A real Slurm on the test hosts of src/testing/netns.ts, for tests of `--launcher slurm`:
 * slurmctld on host 0, a slurmd on every host (`slurmd -N nodeI`, in the host's network and
 * mount namespaces, reached at its address 198.18.0.I), and one munged for all of them (its
 * socket is a file, which every namespace reaches). Node `node1` is host 0, `node2` host 1, …
 * Host 0 holds the controller and munged: tests kill other hosts.
 *
 * Everything lives in a temporary directory: slurm.conf (found through `SLURM_CONF`, in
 * {@link SlurmTestCluster.env}), cgroup.conf, an empty plugstack.conf, the munge key, socket
 * and logs, the controller's state and every node's spool, pid and log files. Nothing is
 * written to /etc or /var, nothing is added to the machine's own network namespace, and the
 * daemons run inside the test hosts' namespaces, so {@link SlurmTestCluster.destroy} — which
 * kills every process there — takes them all (and a later cluster's creation takes those of a
 * test process that was killed, as it does for the hosts).
 *
 * The configuration keeps to what a machine without systemd or cgroups of its own offers:
 * process tracking through /proc (proctrack/linuxproc), no task plugin, no accounting, CPUs as
 * the only consumable (so that `--overlap` steps share nodes freely). slurmd loads a cgroup
 * plugin whatever it tracks with; the test hosts' /sys (`ip netns exec` mounts a fresh one)
 * has no cgroup mounts for it to detect a version from, so cgroup.conf names one (cgroup/v1,
 * which nothing here then uses).
 *
 * Needs root, the hosts' tools (iproute2, util-linux) and Slurm with munge (Debian: slurmctld,
 * slurmd, slurm-client, munge; scripts/install-test-deps.sh installs them). {@link slurmSupport}
 * says what is missing.
 *
 * @example
 * const slurm = await SlurmTestCluster.create(3);
 * const child = slurm.spawn(0, ["salloc", "-N", "3", "--no-kill", "lifeline", "run", …]);
 * await slurm.cluster.killHost(1);      // node2 dies with everything on it
 * await slurm.destroy();
 */
import { execFile, type ChildProcess, type SpawnOptions } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { hostname } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { clusterSupport, TestCluster } from "./netns.ts";

const run = promisify(execFile);

/** Slurm's and munge's programs the test cluster runs. */
const SLURM_TOOLS = ["munged", "slurmctld", "slurmd", "slurmstepd", "srun", "salloc", "scontrol", "scancel", "sinfo", "squeue"] as const;
/** How long the daemons may take until every node is idle. */
const READY_TIMEOUT_MS = 30_000;

/** Why a Slurm test cluster cannot be built here, or undefined when it can. */
export async function slurmSupport(): Promise<string | undefined> {
  const hosts = await clusterSupport();
  if (hosts !== undefined) return hosts;
  const missing: string[] = [];
  for (const tool of SLURM_TOOLS) {
    try {
      await run("sh", ["-c", `command -v ${tool}`]);
    } catch {
      missing.push(tool);
    }
  }
  if (missing.length > 0)
    return `${missing.join(", ")} ${missing.length === 1 ? "is" : "are"} not installed (Debian: slurmctld slurmd slurm-client munge; scripts/install-test-deps.sh)`;
  return undefined;
}

/** A running job step as `squeue -s` lists it: its id (`JOB.STEP`), name and node. */
export interface SlurmStep {
  readonly step: string;
  readonly name: string;
  readonly node: string;
}

export class SlurmTestCluster {
  private destroyed = false;
  private readonly daemons: ChildProcess[] = [];

  private constructor(
    /** The test hosts the daemons and jobs run on. */
    readonly cluster: TestCluster,
    /** The directory of the configuration, the munge key and socket, state, spools and logs. */
    readonly dir: string,
    /** Node names, by host index: `node1` runs on host 0. */
    readonly nodes: readonly string[],
  ) {}

  /**
   * Builds `n` test hosts with Slurm on them and waits until every node is idle. Rejects
   * (after tearing down what it made, with the daemons' log tails) if something fails.
   */
  static async create(n: number, opts: { diskMb?: number; cpusPerNode?: number } = {}): Promise<SlurmTestCluster> {
    const problem = await slurmSupport();
    if (problem !== undefined) throw new Error(`cannot build a Slurm test cluster: ${problem}`);
    const cluster = await TestCluster.create(n, opts.diskMb === undefined ? {} : { diskMb: opts.diskMb });
    let slurm: SlurmTestCluster | undefined;
    try {
      // In the hosts' state directory, which the hosts' own clean-up of a killed test removes.
      const dir = await mkdtemp(join(cluster.stateDir, "slurm-"));
      const nodes = cluster.hosts.map((h) => `node${h.index + 1}`);
      slurm = new SlurmTestCluster(cluster, dir, nodes);
      await slurm.start(opts.cpusPerNode ?? 2);
    } catch (err) {
      const logs = slurm === undefined ? "" : await slurm.logTails();
      await (slurm?.destroy() ?? cluster.destroy());
      throw new Error(`${(err as Error).message}${logs}`, { cause: err });
    }
    return slurm;
  }

  /**
   * The environment for Slurm commands on the test hosts: the caller's, less any `SLURM_*`
   * variable of a job the test itself may run in, plus `SLURM_CONF` and `extra`.
   */
  env(extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
    const env: NodeJS.ProcessEnv = {};
    for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("SLURM_")) env[k] = v;
    return { ...env, SLURM_CONF: join(this.dir, "slurm.conf"), ...extra };
  }

  /** Starts `argv` on host `i` with {@link env} (plus `opts.env`). */
  spawn(i: number, argv: readonly string[], opts: SpawnOptions = {}): ChildProcess {
    return this.cluster.spawn(i, argv, { ...opts, env: this.env(opts.env) });
  }

  /** Runs `argv` on host `i` with {@link env} to its end; rejects on a non-zero exit. */
  async exec(i: number, argv: readonly string[]): Promise<string> {
    const { command, args } = this.cluster.wrap(i, argv);
    return (await run(command, args, { encoding: "utf8", env: this.env(), timeout: 20_000 })).stdout;
  }

  /** The running steps as `squeue -s` sees them: id, name and node. */
  async steps(): Promise<SlurmStep[]> {
    const out = await this.exec(0, ["squeue", "-h", "-s", "-o", "%i %j %N"]);
    return out.split("\n").flatMap((line) => {
      const [step, name, node] = line.trim().split(/\s+/);
      return step === undefined || step === "" ? [] : [{ step, name: name ?? "", node: node ?? "" }];
    });
  }

  /** Kills the daemons, every process on the hosts and the hosts themselves, and removes the files. Idempotent. */
  async destroy(): Promise<void> {
    if (this.destroyed) return;
    this.destroyed = true;
    for (const d of this.daemons) if (d.exitCode === null && d.signalCode === null) d.kill("SIGKILL");
    await this.cluster.destroy();
    await rm(this.dir, { recursive: true, force: true });
  }

  private async start(cpusPerNode: number): Promise<void> {
    const d = this.dir;
    await mkdir(join(d, "state"), { recursive: true });
    for (const node of this.nodes) await mkdir(join(d, "spool", node), { recursive: true });
    // munged refuses a key that others may read, and a key under 32 bytes.
    await writeFile(join(d, "munge.key"), randomBytes(1024), { mode: 0o400 });
    await writeFile(join(d, "slurm.conf"), this.config(cpusPerNode));
    await writeFile(join(d, "cgroup.conf"), "CgroupPlugin=cgroup/v1\n");
    await writeFile(join(d, "plugstack.conf"), "");

    this.daemon(0, [
      "munged",
      "--foreground",
      "--force",
      `--key-file=${join(d, "munge.key")}`,
      `--socket=${this.mungeSocket}`,
      `--pid-file=${join(d, "munged.pid")}`,
      `--log-file=${join(d, "munged.log")}`,
      `--seed-file=${join(d, "munged.seed")}`,
    ]);
    await this.waitFor(() => existsSync(this.mungeSocket), "munged did not create its socket");
    this.daemon(0, ["slurmctld", "-D", "-i"]);
    for (let i = 0; i < this.nodes.length; i++) this.daemon(i, ["slurmd", "-D", "-N", this.nodes[i]!]);
    await this.waitFor(async () => {
      const out = await this.exec(0, ["sinfo", "-h", "-N", "-o", "%N %T"]).catch(() => "");
      const idle = out.split("\n").filter((l) => /\sidle$/.test(l.trim())).length;
      return idle === this.nodes.length;
    }, `the nodes did not all become idle within ${READY_TIMEOUT_MS} ms`);
  }

  private get mungeSocket(): string {
    return join(this.dir, "munge.socket");
  }

  private config(cpusPerNode: number): string {
    const d = this.dir;
    // The controller checks that it runs on the host slurm.conf names: every test host has the
    // machine's own host name (the namespaces do not include UTS), at its own address.
    const controller = hostname().split(".")[0]!;
    return [
      "ClusterName=lifeline-test",
      `SlurmctldHost=${controller}(${this.cluster.hosts[0]!.address})`,
      "SlurmUser=root",
      "SlurmdUser=root",
      "AuthType=auth/munge",
      "CredType=cred/munge",
      `AuthInfo=socket=${this.mungeSocket}`,
      `StateSaveLocation=${join(d, "state")}`,
      `SlurmdSpoolDir=${join(d, "spool", "%n")}`,
      `SlurmctldPidFile=${join(d, "slurmctld.pid")}`,
      `SlurmdPidFile=${join(d, "slurmd-%n.pid")}`,
      `SlurmctldLogFile=${join(d, "slurmctld.log")}`,
      `SlurmdLogFile=${join(d, "slurmd-%n.log")}`,
      `PlugStackConfig=${join(d, "plugstack.conf")}`,
      "ProctrackType=proctrack/linuxproc",
      "TaskPlugin=task/none",
      "SwitchType=switch/none",
      "MpiDefault=none",
      "SelectType=select/cons_tres",
      "SelectTypeParameters=CR_CPU",
      "JobAcctGatherType=jobacct_gather/none",
      "AccountingStorageType=accounting_storage/none",
      "JobCompType=jobcomp/none",
      "MailProg=/bin/true",
      // Hardware that differs from the lines below (cores per socket) must not drain a node.
      "SlurmdParameters=config_overrides",
      "ReturnToService=2",
      "SlurmdTimeout=10",
      "MessageTimeout=5",
      "KillWait=2",
      ...this.cluster.hosts.map((h, i) => `NodeName=${this.nodes[i]} NodeAddr=${h.address} CPUs=${cpusPerNode} State=UNKNOWN`),
      `PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP`,
      "",
    ].join("\n");
  }

  private daemon(i: number, argv: readonly string[]): void {
    const child = this.spawn(i, argv, { stdio: "ignore", detached: true });
    child.on("error", () => undefined);
    child.unref();
    this.daemons.push(child);
  }

  private async waitFor(ready: () => boolean | Promise<boolean>, problem: string): Promise<void> {
    const deadline = performance.now() + READY_TIMEOUT_MS;
    while (!(await ready())) {
      if (performance.now() > deadline) throw new Error(problem);
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  /** The last lines of the daemons' logs, for a set-up that failed. */
  private async logTails(): Promise<string> {
    const files = ["munged.log", "slurmctld.log", ...this.nodes.map((n) => `slurmd-${n}.log`)];
    const parts = await Promise.all(
      files.map(async (f) => {
        const text = await readFile(join(this.dir, f), "utf8").catch(() => "");
        return text === "" ? "" : `\n--- ${f}\n${text.trim().split("\n").slice(-10).join("\n")}`;
      }),
    );
    return parts.join("");
  }
}
