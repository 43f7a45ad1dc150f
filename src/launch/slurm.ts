/**
 * Slurm, for `lifeline run --launcher slurm`: which nodes and slots an allocation has, and the
 * command lines that start a rank as a job step of its own and signal it.
 *
 * - Hosts: the allocation's nodes (`SLURM_JOB_NODELIST`, a hostlist expression such as
 *   `node[1-3,7]`, expanded by `scontrol show hostnames` so that every syntax Slurm accepts is
 *   read as Slurm reads it), with slots from `SLURM_TASKS_PER_NODE` (`2(x3),1`: two tasks on
 *   each of the first three nodes, one on the fourth; {@link parseTasksPerNode}).
 * - Each rank is one step (`srun --jobid=JOB --nodelist=HOST --nodes=1 --ntasks=1 --overlap`),
 *   so that a rank can be started, ended and replaced alone: a step with several tasks lives
 *   and dies as a unit, and Slurm kills only the steps on a failed node when the job itself was
 *   allocated with `--no-kill`. `--overlap` lets a step share the CPUs and memory of the steps
 *   already running (the ranks of the job, and the lost steps Slurm has not written off yet),
 *   so that no start waits for resources.
 * - Signals go through the controller (`scancel --ctld --signal=SIG JOB.STEP`), which answers at
 *   once and forwards them to the node: asked directly, a dead node keeps scancel waiting for
 *   the message timeout.
 *
 * @example
 * parseTasksPerNode("2(x3),1");                    // [2, 2, 2, 1]
 * slurmAllocation(process.env);                    // { jobId: "42", hosts: [{ host: "node1", slots: 2 }, …] }
 * srunCommand({ jobId: "42", host: "node3", rank: 2, line: "echo hi" });
 */
import { execFileSync } from "node:child_process";
import { LifelineError, errorMessage } from "../errors.ts";
import type { HostSlots } from "./hosts.ts";

/** What an allocation offers: its job id and its nodes, with the tasks Slurm placed on each. */
export interface SlurmAllocation {
  readonly jobId: string;
  readonly hosts: HostSlots[];
}

/** `scontrol show hostnames` is given up after this long: resolving the job's options must not hang. */
const SCONTROL_TIMEOUT_MS = 15_000;

/**
 * Parses Slurm's tasks-per-node notation (`SLURM_TASKS_PER_NODE`, `SLURM_JOB_CPUS_PER_NODE`):
 * comma-separated counts, each optionally repeated, `N(xM)` meaning M nodes with N each.
 * Throws `LAUNCH_USAGE` naming `variable` for anything else.
 *
 * @example
 * parseTasksPerNode("2(x3),1"); // [2, 2, 2, 1]
 * parseTasksPerNode("4");       // [4]
 */
export function parseTasksPerNode(text: string, variable = "SLURM_TASKS_PER_NODE"): number[] {
  const counts: number[] = [];
  for (const item of text.trim().split(",")) {
    const m = /^(\d+)(?:\(x(\d+)\))?$/.exec(item.trim());
    const tasks = m === null ? NaN : Number(m[1]);
    const repeat = m === null ? NaN : m[2] === undefined ? 1 : Number(m[2]);
    if (!Number.isSafeInteger(tasks) || tasks < 1 || !Number.isSafeInteger(repeat) || repeat < 1 || counts.length + repeat > 100_000) {
      throw new LifelineError(
        "LAUNCH_USAGE",
        `${variable}=${JSON.stringify(text)} is not Slurm's tasks-per-node list (counts such as 2(x3),1); is it set by Slurm?`,
      );
    }
    for (let i = 0; i < repeat; i++) counts.push(tasks);
  }
  return counts;
}

/**
 * The node names of a hostlist expression, as `scontrol show hostnames` expands it (a plain
 * comma-separated list of names needs no expanding). Throws `LAUNCH_USAGE`.
 */
export function scontrolHostnames(nodelist: string, env: NodeJS.ProcessEnv = process.env): string[] {
  if (!/[[\]]/.test(nodelist))
    return nodelist
      .split(",")
      .map((n) => n.trim())
      .filter((n) => n !== "");
  let out: string;
  try {
    out = execFileSync("scontrol", ["show", "hostnames", nodelist], { encoding: "utf8", env, timeout: SCONTROL_TIMEOUT_MS, stdio: ["ignore", "pipe", "pipe"] });
  } catch (err) {
    const e = err as { code?: string; stderr?: string };
    const why =
      e.code === "ENOENT" ? "scontrol is not on PATH (Slurm's client commands are needed on this host)" : (e.stderr ?? "").trim() || errorMessage(err);
    throw new LifelineError("LAUNCH_USAGE", `cannot expand the allocation's node list ${JSON.stringify(nodelist)} with scontrol show hostnames: ${why}`, {
      cause: err,
    });
  }
  return out
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l !== "");
}

/**
 * The id of the Slurm job this process runs in (`SLURM_JOB_ID`, set by `salloc` and `sbatch`).
 * Throws `LAUNCH_USAGE` outside an allocation.
 */
export function slurmJobId(env: NodeJS.ProcessEnv): string {
  const jobId = (env.SLURM_JOB_ID ?? env.SLURM_JOBID ?? "").trim();
  if (jobId === "") {
    throw new LifelineError(
      "LAUNCH_USAGE",
      "--launcher slurm starts the ranks as steps of a Slurm job, and SLURM_JOB_ID is not set: this is not inside an allocation. " +
        "Run lifeline from one — `salloc -N 3 --no-kill lifeline run --launcher slurm …`, or an sbatch script with #SBATCH --no-kill — or use --hostfile with --rsh.",
    );
  }
  if (!/^\d+$/.test(jobId)) throw new LifelineError("LAUNCH_USAGE", `SLURM_JOB_ID=${JSON.stringify(jobId)} is not a job id (digits)`);
  return jobId;
}

/**
 * The allocation this process runs in, from the variables `salloc` and `sbatch` set. Throws
 * `LAUNCH_USAGE` outside an allocation (no `SLURM_JOB_ID`) and for variables that do not fit
 * together. `expand` turns the node list into names (default: {@link scontrolHostnames}).
 */
export function slurmAllocation(env: NodeJS.ProcessEnv, expand: (nodelist: string) => string[] = (l) => scontrolHostnames(l, env)): SlurmAllocation {
  const jobId = slurmJobId(env);
  const nodelist = env.SLURM_JOB_NODELIST ?? env.SLURM_NODELIST;
  if (nodelist === undefined || nodelist.trim() === "") {
    throw new LifelineError(
      "LAUNCH_USAGE",
      `SLURM_JOB_ID is ${jobId} but SLURM_JOB_NODELIST is not set: start lifeline with salloc or sbatch (which set both), or give the nodes with --hostfile`,
    );
  }
  const perNodeVar = env.SLURM_TASKS_PER_NODE !== undefined ? "SLURM_TASKS_PER_NODE" : "SLURM_JOB_CPUS_PER_NODE";
  const perNodeText = env[perNodeVar];
  if (perNodeText === undefined) {
    throw new LifelineError(
      "LAUNCH_USAGE",
      `SLURM_JOB_ID is ${jobId} but neither SLURM_TASKS_PER_NODE nor SLURM_JOB_CPUS_PER_NODE is set: lifeline takes each node's slots from them; give the nodes and slots with --hostfile instead`,
    );
  }
  const slots = parseTasksPerNode(perNodeText, perNodeVar);
  const names = expand(nodelist.trim());
  if (names.length !== slots.length) {
    throw new LifelineError(
      "LAUNCH_USAGE",
      `the allocation lists ${names.length} node${names.length === 1 ? "" : "s"} (${nodelist}) but ${perNodeVar}=${perNodeText} counts ${slots.length}: give the nodes and slots with --hostfile`,
    );
  }
  return { jobId, hosts: names.map((host, i) => ({ host, slots: slots[i]! })) };
}

/** Shell words a step's line prints after its pid: the step's full id, as scancel takes it. */
export const SLURM_STEP_WORDS = "${SLURM_JOB_ID}.${SLURM_STEP_ID}";

/**
 * The `srun` command line that runs the shell line `line` as a step of its own on `host`: one
 * task on that one node, sharing the job's resources with every other step (`--overlap`), not
 * killed with its step's other tasks (there are none) or on a bad exit, srun's stdin passed to
 * the task (it carries the rank's keys, then ends), and srun's own informational lines left
 * out (its errors still come through, on stderr).
 */
export function srunCommand(opts: { jobId: string; host: string; rank: number; line: string }): string[] {
  return [
    "srun",
    `--jobid=${opts.jobId}`,
    `--nodelist=${opts.host}`,
    "--nodes=1",
    "--ntasks=1",
    "--overlap",
    "--kill-on-bad-exit=0",
    "--input=all",
    "--quiet",
    `--job-name=lifeline-rank-${opts.rank}`,
    "sh",
    "-c",
    opts.line,
  ];
}

/**
 * The command that sends `sig` to step `step` (`JOB.STEP`) through the controller, which
 * queues it for the node and answers at once, even when the node is gone.
 */
export function scancelCommand(step: string, sig: NodeJS.Signals): string[] {
  return ["scancel", "--ctld", `--signal=${sig.replace(/^SIG/, "")}`, step];
}

/** A step id as {@link SLURM_STEP_WORDS} prints it, or undefined for anything else. */
export function stepIdOf(words: string): string | undefined {
  const step = words.trim();
  return /^\d+\.\d+$/.test(step) ? step : undefined;
}
