/**
 * Helpers about the job a store holds ({@link JobRecord}): how people see it, and whether the
 * launcher of a run that says it is running is still there.
 *
 * @example
 * describeIdentity(job);  // "/w/heat.ts --iters 400 on 4 ranks"
 * launcherAlive(job);     // false: its launcher was killed
 */
import { hostname } from "node:os";
import type { JobRecord } from "./types.ts";

/** What makes two runs the same job: they may continue each other's lines. */
export interface JobIdentity {
  /** The program's real path (symbolic links resolved). */
  readonly app: string;
  readonly args: readonly string[];
  readonly size: number;
}

/**
 * One line for people: `/path/heat.ts --iters 400 on 4 ranks` (arguments quoted where a shell
 * would need it). Never throws.
 *
 * @example
 * describeIdentity({ app: "/w/heat.ts", args: ["--iters", "400"], size: 4 }); // "/w/heat.ts --iters 400 on 4 ranks"
 */
export function describeIdentity(id: JobIdentity): string {
  const args = id.args.map((a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : JSON.stringify(a))).join(" ");
  return `${id.app}${args === "" ? "" : ` ${args}`} on ${id.size} rank${id.size === 1 ? "" : "s"}`;
}

/**
 * Whether the launcher of a run is alive. Only a launcher on this host can be asked; one on
 * another host counts as gone (false). Never throws.
 *
 * @example
 * if (job.state === "running" && !launcherAlive(job)) console.log("its launcher was killed");
 */
export function launcherAlive(job: JobRecord): boolean {
  if (job.launcher.host !== hostname()) return false;
  try {
    process.kill(job.launcher.pid, 0);
    return job.launcher.pid !== process.pid;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}
