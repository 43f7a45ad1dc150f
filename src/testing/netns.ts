/**
 * Hosts on one machine, for tests and benchmarks that cross a network: each "host" is a
 * network namespace with its own interface (`eth0`, an address from 198.18.0.0/24, the
 * benchmarking range) on a bridge that lives in a namespace of its own, and its own disk (a
 * tmpfs mounted in a mount namespace that only the host's processes see, at
 * {@link TestCluster.diskPath}). Nothing is added to the machine's own (root) network namespace
 * or its mounts, and {@link TestCluster.destroy} takes every process, namespace and file away
 * again — also the ones a failed test left, since every process of a host is found through its
 * namespace, not through who started it.
 *
 * A host is kept by one small "init" process (`sleep`) inside its namespaces: commands run on
 * the host enter them through it (`nsenter`). Killing a host kills every process in its network
 * namespace, the init included, which takes its disk with it (the tmpfs belongs to the init's
 * mount namespace), and unplugs its cable: its peers' packets vanish, as with a dead machine.
 *
 * Needs root (namespaces, mounts) and iproute2, util-linux (nsenter, unshare); packet loss
 * needs nftables. {@link clusterSupport} says what is missing.
 *
 * The remote-shell agent for these hosts (`netnsRshAgent`, test/fixtures/netns/rsh) behaves as
 * ssh does: `AGENT HOST COMMAND...` runs the command on the host (named by its address), in a
 * session of its own, with the agent's stdio; the command runs on when the agent is killed;
 * and when the host dies, the agent neither exits nor reports: it hangs.
 *
 * @example
 * const cluster = await TestCluster.create(3);
 * const child = cluster.spawn(0, ["ip", "-4", "addr"]);   // runs on host 0 (198.18.0.1)
 * await cluster.killHost(1);                             // host 1 is gone, disk and all
 * await cluster.destroy();
 */
import { execFile, spawn, type ChildProcess, type SpawnOptions } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, readdir, readFile, readlink, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const run = promisify(execFile);

/** The agent script that enters a test host, as `--rsh` takes it. */
export const netnsRshAgent = fileURLToPath(new URL("../../test/fixtures/netns/rsh", import.meta.url));

/** Why clusters cannot be built here, or undefined when they can. */
export async function clusterSupport(): Promise<string | undefined> {
  if (process.getuid?.() !== 0) return "network namespaces and mounts need root";
  for (const tool of ["ip", "nsenter", "unshare"]) {
    try {
      await run("sh", ["-c", `command -v ${tool}`]);
    } catch {
      return `${tool} is not installed (iproute2, util-linux)`;
    }
  }
  return undefined;
}

export interface TestHost {
  readonly index: number;
  readonly name: string;
  /** Its address on the cluster's network, e.g. 198.18.0.2. */
  readonly address: string;
  /** The init process that holds the host's namespaces. */
  readonly initPid: number;
  /** Every process of the host's init (the sleeper and the unshare that started it). */
  readonly initPids: readonly number[];
}

export class TestCluster {
  private destroyed = false;
  /** Every namespace made so far, also of a host whose set-up failed half-way. */
  private readonly made: string[] = [];

  private constructor(
    /** Directory of the cluster's state: `hosts/<address>.pid` for the agent, the disks' mount points. */
    readonly stateDir: string,
    private readonly id: string,
    readonly hosts: readonly TestHost[],
    /** Where each host sees its own disk (the same path on every host, a different tmpfs). */
    readonly diskPath: string,
  ) {}

  /**
   * Builds `n` hosts (1..200): 198.18.0.1, .2, ... on one bridge, each with a `diskMb` tmpfs
   * at {@link diskPath}. Rejects (after tearing down what it made) if a command fails.
   */
  static async create(n: number, opts: { diskMb?: number } = {}): Promise<TestCluster> {
    if (!Number.isInteger(n) || n < 1 || n > 200) throw new RangeError(`a test cluster has 1..200 hosts, not ${n}`);
    const problem = await clusterSupport();
    if (problem !== undefined) throw new Error(`cannot build test hosts: ${problem}`);
    await removeStaleClusters();
    const id = randomBytes(3).toString("hex");
    const stateDir = join(tmpdir(), `lifeline-hosts-${id}`);
    const diskPath = join(stateDir, "disk");
    await mkdir(join(stateDir, "hosts"), { recursive: true });
    await writeFile(join(stateDir, "owner"), `${process.pid}\n`);
    await mkdir(diskPath, { recursive: true });
    const hosts: TestHost[] = [];
    const cluster = new TestCluster(stateDir, id, hosts, diskPath);
    try {
      const bridge = cluster.bridgeNs;
      await ip(["netns", "add", bridge]);
      cluster.made.push(bridge);
      await ip(["-n", bridge, "link", "add", "br0", "type", "bridge"]);
      await ip(["-n", bridge, "link", "set", "br0", "up"]);
      for (let i = 0; i < n; i++) {
        const name = `ll${id}h${i}`;
        const address = `198.18.0.${i + 1}`;
        await ip(["netns", "add", name]);
        cluster.made.push(name);
        await ip(["-n", bridge, "link", "add", `p${i}`, "type", "veth", "peer", "name", "eth0", "netns", name]);
        await ip(["-n", bridge, "link", "set", `p${i}`, "master", "br0", "up"]);
        await ip(["-n", name, "addr", "add", `${address}/24`, "dev", "eth0"]);
        await ip(["-n", name, "link", "set", "eth0", "up"]);
        await ip(["-n", name, "link", "set", "lo", "up"]);
        const initPid = await startInit(name, diskPath, opts.diskMb ?? 256);
        hosts.push({ index: i, name, address, initPid, initPids: await pidsInNetns(name) });
        await writeFile(join(stateDir, "hosts", `${address}.pid`), `${initPid}\n`);
      }
    } catch (err) {
      await cluster.destroy();
      throw err;
    }
    return cluster;
  }

  private get bridgeNs(): string {
    return `ll${this.id}br`;
  }

  /** Environment that points the rsh agent at this cluster. */
  get agentEnv(): Record<string, string> {
    return { LIFELINE_TEST_HOSTS: this.stateDir };
  }

  /** Starts `argv` on host `i` (in its network and mount namespaces). */
  spawn(i: number, argv: readonly string[], opts: SpawnOptions = {}): ChildProcess {
    const { command, args } = this.wrap(i, argv, opts.cwd === undefined ? undefined : String(opts.cwd));
    return spawn(command, args, opts);
  }

  /**
   * The command line that runs `argv` on host `i` (nsenter into its namespaces, in `cwd`:
   * entering a mount namespace otherwise starts at its root), for callers that spawn it
   * themselves. The process keeps `argv[0]`'s pid: nsenter execs it.
   */
  wrap(i: number, argv: readonly string[], cwd?: string): { command: string; args: string[] } {
    const host = this.host(i);
    return { command: "nsenter", args: ["-t", String(host.initPid), "-m", "-n", ...(cwd === undefined ? [] : [`--wd=${cwd}`]), "--", ...argv] };
  }

  /** Runs `argv` on host `i` to its end; resolves with its output. Rejects on a non-zero exit. */
  async exec(i: number, argv: readonly string[]): Promise<{ stdout: string; stderr: string }> {
    const host = this.host(i);
    return run("nsenter", ["-t", String(host.initPid), "-m", "-n", "--", ...argv], { encoding: "utf8" });
  }

  /**
   * Host `i` dies: its cable is unplugged (its peers' packets vanish, no connection is reset),
   * every process on it is killed, and its disk is gone. Its agent sessions hang, as ssh's do.
   */
  async killHost(i: number): Promise<void> {
    const host = this.host(i);
    await writeFile(join(this.stateDir, "hosts", `${host.address}.dead`), "");
    await ip(["-n", this.bridgeNs, "link", "set", `p${i}`, "down"]);
    await killNetns(host.name);
  }

  /** Cuts (`cut: true`) or heals host `i`'s link: nothing reaches it or leaves it meanwhile. */
  async partition(i: number, cut: boolean): Promise<void> {
    await ip(["-n", this.bridgeNs, "link", "set", `p${i}`, cut ? "down" : "up"]);
  }

  /**
   * Drops `percent` of the packets host `i` receives and sends, at random (nftables in the
   * host's namespace); 0 removes the rule. `rtoMaxMs` caps TCP's retransmission timeout on every
   * host (`net.ipv4.tcp_rto_max_ms`, per namespace on recent Linux kernels, 6.18 here; ignored
   * where it does not exist): with 20% loss the timeout of a segment lost again and again
   * doubles up to the kernel's 120 s, and one connection can stall a job for a minute.
   */
  async loss(i: number, percent: number, opts: { rtoMaxMs?: number } = {}): Promise<void> {
    if (opts.rtoMaxMs !== undefined) {
      for (const h of this.hosts)
        await run("ip", ["netns", "exec", h.name, "sysctl", "-q", "-w", `net.ipv4.tcp_rto_max_ms=${opts.rtoMaxMs}`]).catch(() => undefined);
    }
    const host = this.host(i);
    await run("ip", ["netns", "exec", host.name, "nft", "delete", "table", "inet", "lifeline_loss"]).catch(() => undefined);
    if (percent <= 0) return;
    const rules = [
      "add table inet lifeline_loss",
      "add chain inet lifeline_loss in { type filter hook input priority 0 ; policy accept ; }",
      "add chain inet lifeline_loss out { type filter hook output priority 0 ; policy accept ; }",
      `add rule inet lifeline_loss in iifname "eth0" numgen random mod 100 < ${percent} drop`,
      `add rule inet lifeline_loss out oifname "eth0" numgen random mod 100 < ${percent} drop`,
    ];
    for (const rule of rules) await run("ip", ["netns", "exec", host.name, "nft", ...rule.split(" ")]);
  }

  /** Pids of the processes on host `i` (its network namespace), its init's excluded. */
  async pids(i: number): Promise<number[]> {
    const host = this.host(i);
    return (await pidsInNetns(host.name)).filter((pid) => !host.initPids.includes(pid));
  }

  /** Kills every process on every host and removes the namespaces and files. Idempotent. */
  async destroy(): Promise<void> {
    if (this.destroyed) return;
    this.destroyed = true;
    for (const name of this.made) await killNetns(name).catch(() => undefined);
    for (const name of this.made) await run("ip", ["netns", "del", name]).catch(() => undefined);
    await rm(this.stateDir, { recursive: true, force: true });
  }

  private host(i: number): TestHost {
    const host = this.hosts[i];
    if (host === undefined) throw new RangeError(`no host ${i} in a cluster of ${this.hosts.length}`);
    return host;
  }
}

/**
 * Removes the clusters that a test process left when it was killed (its `owner` pid is gone):
 * their processes, namespaces and state directory. Clusters of live processes are left alone.
 * Resolves to the namespaces removed. Called by {@link TestCluster.create}.
 */
export async function removeStaleClusters(): Promise<string[]> {
  const removed: string[] = [];
  let entries: string[];
  try {
    entries = (await readdir(tmpdir())).filter((n) => /^lifeline-hosts-[0-9a-f]{6}$/.test(n));
  } catch {
    return removed;
  }
  for (const entry of entries) {
    const dir = join(tmpdir(), entry);
    const owner = Number((await readFile(join(dir, "owner"), "utf8").catch(() => "")).trim());
    if (Number.isInteger(owner) && owner > 0 && processAlive(owner)) continue;
    const id = entry.slice("lifeline-hosts-".length);
    const names = (await readdir("/run/netns").catch(() => [] as string[])).filter((n) => n.startsWith(`ll${id}`));
    for (const name of names) await killNetns(name).catch(() => undefined);
    for (const name of names) await run("ip", ["netns", "del", name]).catch(() => undefined);
    await rm(dir, { recursive: true, force: true });
    removed.push(...names);
  }
  return removed;
}

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

async function ip(args: readonly string[]): Promise<void> {
  try {
    await run("ip", [...args]);
  } catch (err) {
    const e = err as { stderr?: string; message: string };
    throw new Error(`ip ${args.join(" ")} failed: ${(e.stderr ?? e.message).trim()}`);
  }
}

/** Starts the host's init: a private mount namespace with a tmpfs at `disk`, then sleep. Resolves to its pid. */
async function startInit(netns: string, disk: string, diskMb: number): Promise<number> {
  const script = `mount -t tmpfs -o size=${diskMb}m,mode=0755 tmpfs "$1" && echo ready && exec sleep 1000000`;
  const child = spawn("ip", ["netns", "exec", netns, "unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c", script, "init", disk], {
    stdio: ["ignore", "pipe", "pipe"],
    detached: true,
  });
  child.unref();
  const ready = await new Promise<boolean>((resolve) => {
    let out = "";
    child.stdout.setEncoding("utf8").on("data", (c: string) => {
      out += c;
      if (out.includes("ready")) resolve(true);
    });
    child.on("exit", () => resolve(false));
    setTimeout(() => resolve(false), 10_000).unref();
  });
  child.stdout.destroy();
  child.stderr.destroy();
  if (!ready) throw new Error(`the init of test host ${netns} did not start (mount of its tmpfs disk failed?)`);
  // The sleep is the process whose namespaces commands enter. "ready" comes just before the
  // shell execs it, which may take a moment on a loaded machine: look until it is there.
  for (let i = 0; i < 200; i++) {
    const pids = await pidsInNetns(netns);
    const comms = await Promise.all(pids.map(async (pid) => ({ pid, comm: (await readFile(`/proc/${pid}/comm`, "utf8").catch(() => "")).trim() })));
    const sleeper = comms.find((p) => p.comm === "sleep");
    if (sleeper !== undefined) return sleeper.pid;
    await new Promise((r) => setTimeout(r, 25));
  }
  throw new Error(`the init of test host ${netns} is not running`);
}

/** Every process whose network namespace is `netns`. */
async function pidsInNetns(netns: string): Promise<number[]> {
  const path = `/run/netns/${netns}`;
  if (!existsSync(path)) return [];
  const ino = (await stat(path)).ino;
  const out: number[] = [];
  for (const entry of await readdir("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const link = await readlink(`/proc/${entry}/ns/net`);
      if (link === `net:[${ino}]`) out.push(Number(entry));
    } catch {
      // gone meanwhile, or not ours to read
    }
  }
  return out;
}

/** SIGKILLs every process in `netns`, until none is left (bounded). */
async function killNetns(netns: string): Promise<void> {
  for (let round = 0; round < 50; round++) {
    const pids = await pidsInNetns(netns);
    if (pids.length === 0) return;
    for (const pid of pids) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // already gone
      }
    }
    await new Promise((r) => setTimeout(r, 20));
  }
}
