/**
 * Recovery-time measurement shared by `npm run bench -- --only recovery` (bench/run.ts: retry-one
 * next to cpr on the same program) and bench/cpr-bench.ts (cpr alone, 4 ranks × 64 MiB).
 *
 * One run = the real launcher (`node dist/cli.js run --json ...`) on bench/programs/recovery.ts
 * with `--inject R@step:K`; the parts come from the launcher's --json events and the ranks'
 * wall-clock marks (see the program's header):
 * - **detect**: the fault's wall time (the rank writes it unbuffered just before it SIGKILLs
 *   itself) → the launcher sees the victim exit;
 * - **restart**: → the ranks that restart are up again (retry-one: the victim's new process said
 *   hello; cpr: every rank, after the survivors were stopped, the back-off and a new rendezvous);
 * - **load**: → their restore() returned (retry-one: the checkpoint fetched from peers' memory;
 *   cpr: the part read from disk and verified);
 * - **catch-up**: → back where the failure struck (retry-one: the launcher's `rank-caught-up`
 *   event, the restarted rank runs a collective on the wire with the survivors again; cpr:
 *   every rank finished the failure step again);
 * - **total**: fault → caught up (the four parts add up to it).
 * Rank marks are put on the launcher's clock with the smallest (arrival − wall) offset seen
 * over the run's marked lines: every line arrives after it was written.
 *
 * Every run gets `--store <dir>/<name>` (cpr's lines, retry-one's durable floor), so nothing is
 * written into the repository. {@link launchJson} also serves the `durable` benchmark
 * (bench/lib/durable.ts), which times whole fault-free runs of the same program.
 *
 * @example
 * const r = await recoveryRun({ root, dir, name: "r1-0", mode: "retry-one", np: 4, globalMib: 64, localMib: 1, steps: 40, failStep: 25, stepMs: 20 });
 * process.stdout.write(renderRecoveryTable([r]));
 */
import path from "node:path";
import { onJsonLines } from "../../src/testing/json-lines.ts";
import { spawnChild } from "./procs.ts";
import { median } from "./stats.ts";

/** A --json event of the launcher. */
export interface LaunchEvent {
  readonly event: string;
  readonly t: number;
  readonly [k: string]: unknown;
}

export interface LaunchResult {
  code: number | null;
  events: LaunchEvent[];
  spawnToExitMs: number;
  /** User + system CPU seconds of the launcher and every process it waited for (bash `times`). */
  cpuS: number | undefined;
  tail: string;
}

/**
 * Runs `lifeline run --json <argv>` under bash, whose `times` then reports the CPU time of the
 * launcher and the ranks; collects the JSON events from stderr.
 */
export async function launchJson(root: string, name: string, argv: readonly string[], timeoutMs: number): Promise<LaunchResult> {
  const t0 = performance.now();
  const quoted = [process.execPath, path.join(root, "dist", "cli.js"), "run", "--json", ...argv].map((a) => `'${a.replaceAll("'", "'\\''")}'`).join(" ");
  const child = spawnChild(name, "bash", ["-c", `${quoted}; rc=$?; times >&2; exit $rc`], { cwd: root });
  const events: LaunchEvent[] = [];
  let cpuS: number | undefined;
  onJsonLines(
    child.proc.stderr!,
    (ev) => events.push(ev as LaunchEvent),
    (line) => {
      // `times`: the shell's own line, then its children's "<m>m<s>s <m>m<s>s" (user, system).
      const t = /^(\d+)m([\d.]+)s (\d+)m([\d.]+)s$/.exec(line);
      if (t !== null) cpuS = Number(t[1]) * 60 + Number(t[2]) + Number(t[3]) * 60 + Number(t[4]);
    },
  );
  const status = await child.waitOrKill(timeoutMs);
  return { code: status.code, events, spawnToExitMs: performance.now() - t0, cpuS, tail: child.tail() };
}

/**
 * The command line of bench/programs/recovery.ts (the program of the recovery, durable,
 * host-recovery and partner benchmarks): `failStep` past `steps` runs it without a fault.
 *
 * @example
 * recoveryProgram({ globalMib: 64, localMib: 1, steps: 100, failStep: 101, stepMs: 20 });
 */
export function recoveryProgram(c: { globalMib: number; localMib: number; steps: number; failStep: number; stepMs: number }): string[] {
  return [
    "bench/programs/recovery.ts",
    "--global-mib",
    String(c.globalMib),
    "--local-mib",
    String(c.localMib),
    "--steps",
    String(c.steps),
    "--fail-step",
    String(c.failStep),
    "--step-ms",
    String(c.stepMs),
  ];
}

export interface RecoveryConfig {
  /** Repository root (the launcher is dist/cli.js under it). */
  readonly root: string;
  /** Scratch directory (the cpr store goes under it). */
  readonly dir: string;
  readonly name: string;
  readonly mode: "cpr" | "retry-one";
  readonly np: number;
  readonly globalMib: number;
  readonly localMib: number;
  readonly steps: number;
  /** The victim (rank 1) dies at its failStep-th checkpoint() call. */
  readonly failStep: number;
  readonly stepMs: number;
  /** cpr: `--checkpoint-every` (default 5steps). */
  readonly checkpointEvery?: string;
  /** retry-one: false runs with `--no-spare` (the restarted rank starts cold). */
  readonly spare?: boolean;
  /** retry-one: `--durable-every` (default: the launcher's, every 200th checkpoint into the run's store). */
  readonly durableEvery?: number;
  readonly timeoutMs?: number;
}

export interface RecoveryParts {
  readonly mode: "cpr" | "retry-one";
  /** The mode and its variant flags, e.g. "retry-one --no-spare" (a row of the table). */
  readonly variant: string;
  readonly detectMs: number;
  readonly restartMs: number;
  readonly loadMs: number;
  readonly catchUpMs: number;
  readonly totalMs: number;
  /** Processes started again (retry-one: 1; cpr: every rank). */
  readonly restarted: number;
  /** The step the restarted ranks restored (0: from the beginning), and the failure step. */
  readonly restoredStep: number;
  readonly failStep: number;
  /** retry-one: collective results served from the survivors' buffers. */
  readonly replayed: number | undefined;
  readonly stateMib: { readonly global: number; readonly local: number };
}

const VICTIM = 1;

/** One run of the recovery program with rank 1 killed; its recovery in parts. */
export async function recoveryRun(c: RecoveryConfig): Promise<RecoveryParts> {
  const cold = c.mode === "retry-one" && c.spare === false;
  // Every run has a store of its own under the scratch directory: cpr's lines go there, and so
  // do retry-one's durable checkpoints (its durable floor is on by default with a store every
  // rank reaches), never into the repository's `.lifeline/`.
  const store = ["--store", path.join(c.dir, c.name)];
  const modeFlags =
    c.mode === "cpr"
      ? ["--mode", "cpr", "--checkpoint-every", c.checkpointEvery ?? "5steps", ...store]
      : [
          "--mode",
          "retry-one",
          ...(cold ? ["--no-spare"] : []),
          ...store,
          ...(c.durableEvery === undefined ? [] : ["--durable-every", String(c.durableEvery)]),
        ];
  const r = await launchJson(
    c.root,
    c.name,
    ["-n", String(c.np), ...modeFlags, "--inject", `${VICTIM}@step:${c.failStep}`, ...recoveryProgram(c)],
    c.timeoutMs ?? 300_000,
  );
  const fail = (what: string): never => {
    throw new Error(`recovery run ${c.name} (${c.mode}): ${what}\n${r.tail}`);
  };
  if (r.code !== 0) fail(`exit ${r.code}`);
  const out = r.events.filter((e) => e.event === "output").map((e) => ({ t: e.t, rank: e.rank as number, line: e.line as string }));
  const fault = out.map((l) => ({ l, m: /injected fault: killing this rank .* at ([\d.]+)$/.exec(l.line) })).find((x) => x.m !== null);
  if (fault === undefined) return fail("no fault line");
  const marks = out.map((l) => ({ ...l, m: /^recovery-bench: (start|restored|past) ([\d.]+)/.exec(l.line) })).filter((x) => x.m !== null);
  const timed = [{ t: fault.l.t, wall: Number(fault.m![1]) }, ...marks.map((x) => ({ t: x.t, wall: Number(x.m![2]) }))];
  const offset = Math.min(...timed.map((x) => x.t - x.wall));
  const killAt = Number(fault.m![1]) + offset;
  const exited = r.events.find((e) => e.event === "rank-exited" && e.rank === VICTIM && e.t >= fault.l.t - 1);
  if (exited === undefined) return fail("no rank-exited event for the victim");
  const restarted = c.mode === "cpr" ? c.np : 1;
  const lastMark = (kind: string): number => {
    const ts = marks.filter((x) => x.m![1] === kind).map((x) => Number(x.m![2]) + offset);
    if (ts.length !== restarted) fail(`${ts.length} '${kind}' marks, expected ${restarted}`);
    return Math.max(...ts);
  };
  let upAt: number;
  let caughtUpAt: number;
  let replayed: number | undefined;
  if (c.mode === "cpr") {
    const started = r.events.filter((e) => e.event === "job-started")[1];
    if (started === undefined) return fail("no second job-started event");
    upAt = started.t;
    caughtUpAt = lastMark("past");
  } else {
    const up = r.events.find((e) => e.event === "rank-up" && e.rank === VICTIM && e.t > exited.t);
    const caught = r.events.find((e) => e.event === "rank-caught-up" && e.rank === VICTIM);
    if (up === undefined || caught === undefined) return fail("no rank-up / rank-caught-up event for the restarted rank");
    upAt = up.t;
    caughtUpAt = caught.t;
    replayed = caught.replayed as number;
  }
  const restoredAt = lastMark("restored");
  const restoredStep = Number(/step (\d+)/.exec(marks.find((x) => x.m![1] === "restored")!.line)?.[1] ?? NaN);
  return {
    mode: c.mode,
    variant: cold ? "retry-one --no-spare" : c.mode,
    detectMs: exited.t - killAt,
    restartMs: upAt - exited.t,
    loadMs: restoredAt - upAt,
    catchUpMs: caughtUpAt - restoredAt,
    totalMs: caughtUpAt - killAt,
    restarted,
    restoredStep,
    failStep: c.failStep,
    replayed,
    stateMib: { global: c.globalMib, local: c.localMib },
  };
}

/** Markdown: one row per variant (mode and flags), medians over its runs, in seconds. */
export function renderRecoveryTable(runs: readonly RecoveryParts[], title: string): string {
  const variants = [...new Set(runs.map((r) => r.variant))];
  const lines = [
    title,
    "",
    "| mode | runs | restarted | detect | restart (back-off, start, hello) | load (restore() returned) | catch up | total: kill → caught up | restored step (failure step) |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
  ];
  for (const variant of variants) {
    const rs = runs.filter((r) => r.variant === variant);
    const m = (k: "detectMs" | "restartMs" | "loadMs" | "catchUpMs" | "totalMs"): string => (median(rs.map((x) => x[k])) / 1000).toFixed(2);
    const n = rs[0]!.restarted;
    const what = rs[0]!.mode === "retry-one" ? `${n} rank${n === 1 ? "" : "s"}` : `all ${n}`;
    lines.push(
      `| ${variant} | ${rs.length} | ${what} | ${m("detectMs")} | ${m("restartMs")} | ${m("loadMs")} | ${m("catchUpMs")} | ${m("totalMs")} | ${rs.map((r) => `${r.restoredStep} (${r.failStep})`).join(", ")} |`,
    );
  }
  return `${lines.join("\n")}\n`;
}
