/**
 * Where ranks run: the hosts of a `--hostfile` or a Slurm allocation ({@link launcherHosts}),
 * and which rank sits in which slot.
 *
 * The hostfile is Open MPI's format: one host per line, `host [slots=N] [max_slots=M]`, `#`
 * comments and blank lines ignored; `slots` defaults to 1. A host may be named by its IPv4
 * address, and its ranks then bind that address; a host named otherwise binds the interface or
 * address `--bind` names (which must then be an interface, present on every host).
 *
 * Placement ({@link Placement}, pure) fills slots in hostfile order ("by slot", as `mpirun`
 * does): ranks 0..slots-1 on the first host, and so on; slots beyond `-n` are spares. A rank
 * that must move — its host is suspected dead (it stopped heartbeating or never started) — goes
 * to a free slot on another host, hosts not suspected first; a rank that merely crashed stays.
 *
 * @example
 * const hosts = parseHostfile("198.18.0.1 slots=2\n198.18.0.2 slots=2\n", "hosts.txt");
 * const p = new Placement(hosts, 3);   // ranks 0,1 on .1, rank 2 on .2, one spare slot on .2
 * p.hostOf(2);                          // "198.18.0.2"
 * p.move(0, { suspect: true });         // rank 0 to the spare slot on .2
 */
import { isIPv4 } from "node:net";
import { LifelineError } from "../errors.ts";
import { slurmAllocation, slurmJobId } from "./slurm.ts";

/**
 * How ranks are started (`--launcher`, src/launch/spawners.ts): as children of the launcher on
 * this host, through a remote-shell agent on the hosts of a hostfile, or as Slurm job steps.
 */
export const LAUNCHERS = ["local", "rsh", "slurm"] as const;
export type LauncherKind = (typeof LAUNCHERS)[number];

/**
 * Where each launcher's hosts come from: none for `local` (every rank on this host); the
 * hostfile for `rsh`; for `slurm` the hostfile if one is given, else the allocation the
 * launcher runs in (`env`: SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURM_TASKS_PER_NODE). Throws
 * `LAUNCH_USAGE` when the hosts are missing (no hostfile for rsh; outside an allocation).
 *
 * @example
 * launcherHosts("slurm", undefined, process.env); // { hosts: [{ host: "node1", slots: 2 }, …], slurmJobId: "42" }
 */
export function launcherHosts(
  kind: LauncherKind,
  hostfile: HostSlots[] | undefined,
  env: NodeJS.ProcessEnv,
): { hosts: HostSlots[] | undefined; slurmJobId?: string } {
  switch (kind) {
    case "local":
      if (hostfile !== undefined)
        throw new LifelineError(
          "LAUNCH_USAGE",
          "--launcher local runs every rank on this host, so it has no use for --hostfile: drop one of them (--hostfile alone starts ranks through --rsh)",
        );
      return { hosts: undefined };
    case "rsh":
      if (hostfile === undefined) throw new LifelineError("LAUNCH_USAGE", "--launcher rsh starts ranks on the hosts of a --hostfile: give one");
      return { hosts: hostfile };
    case "slurm": {
      if (hostfile !== undefined) return { hosts: hostfile, slurmJobId: slurmJobId(env) };
      const allocation = slurmAllocation(env);
      return { hosts: allocation.hosts, slurmJobId: allocation.jobId };
    }
  }
}

/** One line of a hostfile. */
export interface HostSlots {
  readonly host: string;
  readonly slots: number;
}

/** Parses a hostfile's text; `LAUNCH_USAGE` naming the file and line for anything malformed. */
export function parseHostfile(text: string, file: string): HostSlots[] {
  const hosts: HostSlots[] = [];
  const problems: string[] = [];
  text.split("\n").forEach((raw, i) => {
    const line = raw.replace(/#.*$/, "").trim();
    if (line === "") return;
    const [host, ...fields] = line.split(/\s+/);
    let slots = 1;
    for (const f of fields) {
      const m = /^(slots|max_slots|max-slots)=(\d+)$/.exec(f);
      if (m === null) {
        problems.push(`${file}:${i + 1}: ${JSON.stringify(f)} is not slots=N (a line is: host [slots=N] [max_slots=M])`);
        continue;
      }
      if (m[1] === "slots") slots = Number(m[2]);
    }
    if (!/^[A-Za-z0-9_.:-]+$/.test(host!)) problems.push(`${file}:${i + 1}: ${JSON.stringify(host)} is not a host name or address`);
    else if (slots < 1) problems.push(`${file}:${i + 1}: ${host} has slots=${slots}; a host needs at least one slot`);
    else if (hosts.some((h) => h.host === host)) problems.push(`${file}:${i + 1}: ${host} is listed twice; give it one line with all its slots`);
    else hosts.push({ host: host!, slots });
  });
  if (problems.length === 0 && hosts.length === 0) problems.push(`${file} names no host`);
  if (problems.length > 0)
    throw new LifelineError(
      "LAUNCH_USAGE",
      problems.length === 1 ? problems[0]! : `--hostfile has ${problems.length} problems:\n${problems.map((p) => `- ${p}`).join("\n")}`,
    );
  return hosts;
}

/** A host named by an IPv4 address binds it; otherwise undefined (use `--bind`). */
export function addressOf(host: string): string | undefined {
  return isIPv4(host) ? host : undefined;
}

/** Which rank is on which host, and the free (spare) slots. */
export class Placement {
  private readonly at: number[];
  private readonly used: number[];
  private readonly suspect = new Set<number>();

  constructor(
    readonly hosts: readonly HostSlots[],
    size: number,
    source: "hostfile" | "allocation" = "hostfile",
  ) {
    const total = hosts.reduce((n, h) => n + h.slots, 0);
    if (total < size) {
      const fix =
        source === "hostfile"
          ? "add hosts or slots (host slots=N)"
          : "allocate more nodes or tasks per node (salloc -N/--ntasks-per-node), or give a --hostfile";
      throw new LifelineError("LAUNCH_USAGE", `the ${source} has ${total} slot${total === 1 ? "" : "s"} for ${size} ranks; ${fix}, or use fewer ranks`);
    }
    this.at = [];
    this.used = hosts.map(() => 0);
    let h = 0;
    for (let r = 0; r < size; r++) {
      while (this.used[h]! >= hosts[h]!.slots) h++;
      this.at.push(h);
      this.used[h]!++;
    }
  }

  /** The host rank `rank` runs on. */
  hostOf(rank: number): string {
    return this.hosts[this.at[rank]!]!.host;
  }

  /** Each rank's host, as an index into the hostfile. */
  groups(): number[] {
    return [...this.at];
  }

  /** The ranks on `host`. */
  ranksOn(host: string): number[] {
    return this.at.flatMap((h, r) => (this.hosts[h]!.host === host ? [r] : []));
  }

  /** Free slots, by host, in hostfile order. */
  spares(): HostSlots[] {
    return this.hosts.flatMap((h, i) => (this.used[i]! < h.slots ? [{ host: h.host, slots: h.slots - this.used[i]! }] : []));
  }

  /** Whether a free slot on another host not suspected dead is there for rank `rank` (see {@link move}). */
  canMove(rank: number): boolean {
    const from = this.at[rank]!;
    return this.hosts.some((h, i) => i !== from && !this.suspect.has(i) && this.used[i]! < h.slots);
  }

  /**
   * Where rank `rank` restarts. A crash (`suspect: false`) keeps its host. A host suspected
   * dead is avoided from then on: the rank moves to a free slot on a host not suspected, else
   * on any other host, else stays (there is nowhere to go). Returns the host.
   */
  move(rank: number, how: { suspect: boolean }): string {
    const from = this.at[rank]!;
    if (!how.suspect) return this.hostOf(rank);
    this.suspect.add(from);
    const free = (i: number): boolean => i !== from && this.used[i]! < this.hosts[i]!.slots;
    const to = this.hosts.findIndex((_, i) => free(i) && !this.suspect.has(i));
    const target = to >= 0 ? to : this.hosts.findIndex((_, i) => free(i));
    if (target < 0) return this.hostOf(rank);
    this.used[from]!--;
    this.used[target]!++;
    this.at[rank] = target;
    return this.hostOf(rank);
  }
}

/**
 * Quotes `words` for a POSIX shell, as a remote-shell agent's command line: `ssh host CMD`
 * hands CMD to the remote user's shell. Words of safe characters stay as they are.
 *
 * @example
 * shellQuote(["env", "A=b c", "node", "app.js"]); // "env 'A=b c' node app.js"
 */
export function shellQuote(words: readonly string[]): string {
  return words.map((w) => (/^[A-Za-z0-9_@%+=:,./-]+$/.test(w) ? w : `'${w.replace(/'/g, `'\\''`)}'`)).join(" ");
}
