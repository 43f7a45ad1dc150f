/**
 * Recovery after a whole host is lost (`npm run bench -- --hosts --only recovery`): the
 * recovery program (bench/programs/recovery.ts) on 4 ranks across test hosts — ranks 0-1 on
 * host 1, 2-3 on host 2, host 3 spare — with host 2 killed (its processes, its disk, its
 * cable) once rank 2 has reported `killStep` steps. Nothing tells the launcher but silence:
 * the ranks' heartbeats stop (`--heartbeat 100 --failure-timeout 1s` here), and the remote
 * shell to a dead host hangs as ssh does.
 *
 * The parts, on this machine's clock (the harness's and the ranks' marks share it):
 * - **detect**: the kill → the launcher's first `rank-failed` (heartbeat) event;
 * - **restart**: → the restarted ranks are up again on the spare host (retry-one: the last of
 *   them said hello; cpr: every rank, after a new rendezvous);
 * - **load**: → their restore() returned (the last `restored` mark);
 * - **compute**: → each restarted rank finished its first step after the restore (the last
 *   `first` mark): the job computes again;
 * - **total**: the kill → computing again.
 *
 * @example
 * const r = await hostRecoveryRun({ cluster, hostfile, root, dir, name: "h-r1-0", mode: "retry-one", globalMib: 64, localMib: 1, steps: 60, killStep: 30, stepMs: 20 });
 */
import path from "node:path";
import { onJsonLines } from "../../src/testing/json-lines.ts";
import { netnsRshAgent, type TestCluster } from "../../src/testing/netns.ts";
import { recoveryProgram, type RecoveryParts } from "./recovery.ts";
import { spawnChild } from "./procs.ts";

export interface HostRecoveryConfig {
  readonly cluster: TestCluster;
  /** Hosts 1-3 with 2 slots each (the first two full, the third spare). */
  readonly hostfile: string;
  readonly root: string;
  readonly dir: string;
  readonly name: string;
  readonly mode: "cpr" | "retry-one";
  readonly globalMib: number;
  readonly localMib: number;
  readonly steps: number;
  readonly killStep: number;
  readonly stepMs: number;
  readonly timeoutMs?: number;
}

const wallNow = (): number => performance.timeOrigin + performance.now();

/**
 * Wall time the job computes past the kill step at least. The kill is a race against the
 * program: the step is seen in a heartbeat (every 100 ms), and taking a host down spawns `ip`
 * and scans /proc, which on a loaded machine took longer than 10 steps of 20 ms, so the job
 * had finished before its host went.
 */
const KILL_MARGIN_MS = 2_000;

export async function hostRecoveryRun(c: HostRecoveryConfig): Promise<RecoveryParts> {
  const steps = Math.max(c.steps, c.killStep + Math.ceil(KILL_MARGIN_MS / c.stepMs));
  const argv = [
    process.execPath,
    path.join(c.root, "dist", "cli.js"),
    "run",
    "--json",
    "-n",
    "4",
    "--mode",
    c.mode,
    ...(c.mode === "cpr" ? ["--checkpoint-every", "5steps"] : ["--replicas", "1"]),
    // A store of the run's own in both modes (cpr's lines; the error file, which retry-one
    // writes there too): nothing goes into the repository's `.lifeline/`.
    "--store",
    path.join(c.dir, c.name),
    "--bind",
    c.cluster.hosts[0]!.address,
    "--hostfile",
    c.hostfile,
    "--rsh",
    netnsRshAgent,
    "--heartbeat",
    "100",
    "--failure-timeout",
    "1s",
    ...recoveryProgram({ ...c, steps, failStep: steps + 1 }),
  ];
  const { command, args } = c.cluster.wrap(0, argv, c.root);
  const child = spawnChild(c.name, command, args, { cwd: c.root, env: { ...process.env, ...c.cluster.agentEnv } });
  const events: { at: number; ev: Record<string, unknown> }[] = [];
  let killAt: number | undefined;
  let downAt: number | undefined;
  onJsonLines(child.proc.stderr!, (ev) => {
    events.push({ at: wallNow(), ev });
    if (killAt === undefined && ev.event === "rank-step" && ev.rank === 2 && (ev.steps as number) >= c.killStep) {
      killAt = wallNow();
      void c.cluster.killHost(1).then(() => (downAt = wallNow()));
    }
  });
  const timer = setTimeout(() => void child.kill(), c.timeoutMs ?? 180_000);
  const status = await child.exited;
  clearTimeout(timer);
  const fail = (what: string): never => {
    throw new Error(`host recovery run ${c.name} (${c.mode}): ${what}\n${child.tail()}`);
  };
  if (killAt === undefined) fail("the job ended before rank 2 reported the kill step");
  const finalized = events.filter((e) => e.ev.event === "rank-finalized" && (downAt === undefined || e.at < downAt));
  if (finalized.length === 4) {
    const took = downAt === undefined ? "it never finished" : `it took ${Math.round(downAt - killAt!)} ms`;
    fail(`every rank finished before host 2 was down (${took} from the kill step; ${steps} steps of ${c.stepMs} ms): not a host loss`);
  }
  if (status.code !== 0) fail(`exit ${status.code}`);
  const after = events.filter((e) => e.at >= killAt!);
  const failed = after.find((e) => e.ev.event === "rank-failed");
  if (failed === undefined) return fail("no rank-failed event after the kill");
  const restartedRanks = [...new Set(after.filter((e) => e.ev.event === "rank-spawned").map((e) => e.ev.rank as number))];
  let upAt: number;
  if (c.mode === "cpr") {
    const started = after.find((e) => e.ev.event === "job-started");
    if (started === undefined) return fail("no job-started after the kill");
    upAt = started.at;
  } else {
    const ups = restartedRanks.map((r) => after.find((e) => e.ev.event === "rank-up" && e.ev.rank === r)?.at);
    if (ups.some((t) => t === undefined)) return fail("a restarted rank never said hello");
    upAt = Math.max(...(ups as number[]));
  }
  const marks = (kind: string): { wall: number; line: string }[] =>
    after.flatMap((e) => {
      if (e.ev.event !== "output") return [];
      const line = String(e.ev.line);
      const m = new RegExp(`^recovery-bench: ${kind} ([\\d.]+)`).exec(line);
      return m === null ? [] : [{ wall: Number(m[1]), line }];
    });
  const restored = marks("restored");
  const first = marks("first");
  if (restored.length !== restartedRanks.length || first.length !== restartedRanks.length) {
    return fail(`${restored.length} restored and ${first.length} first marks for ${restartedRanks.length} restarted ranks`);
  }
  const loadedAt = Math.max(...restored.map((m) => m.wall));
  const computingAt = Math.max(...first.map((m) => m.wall));
  const restoredStep = Math.min(...restored.map((m) => Number(/step (\d+)/.exec(m.line)?.[1] ?? NaN)));
  const caught = after.filter((e) => e.ev.event === "rank-caught-up").map((e) => e.ev.replayed as number);
  return {
    mode: c.mode,
    variant: `${c.mode}, host lost`,
    detectMs: failed.at - killAt!,
    restartMs: upAt - failed.at,
    loadMs: loadedAt - upAt,
    catchUpMs: computingAt - loadedAt,
    totalMs: computingAt - killAt!,
    restarted: restartedRanks.length,
    restoredStep,
    failStep: c.killStep,
    replayed: caught.length === 0 ? undefined : caught.reduce((a, b) => a + b, 0),
    stateMib: { global: c.globalMib, local: c.localMib },
  };
}
