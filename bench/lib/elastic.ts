/**
 * The elastic benchmark (`npm run bench -- --only elastic`): the real launcher
 * (`node dist/cli.js run --json --mode elastic`) on bench/programs/elastic.ts, two scenarios:
 *
 * - **shrink**: 4 ranks, rank 1 killed at its `failStep`-th checkpoint() (`--inject`), no
 *   process started again (`--max-restarts 0`). Parts: **detect** (the fault's wall time → the
 *   launcher sees the exit), **agree** (→ the last survivor's restore() returned into the world
 *   of 3: the coordinator's news, the survivors' summaries, its decision), **first step** (→ the
 *   last survivor finished a step in it). The target (≤ 0.3 s) is on fault → every survivor
 *   restored: computing again, with no process started on that path.
 * - **join**: `-n 4 --max-np 5`, slot 4's process starts late (`--late-ms`) and joins at the next
 *   checkpoint. **transfer**: the first member's MPI_WORLD_CHANGED at that checkpoint (the root
 *   sends the state as it switches) → the joiner's restore() returned with the model;
 *   **members' pause**: that switch → the last member finished its next step (which waits for
 *   the joiner).
 *
 * Rank marks are put on the launcher's clock with the smallest (arrival − wall) offset seen over
 * the run's marked lines, as bench/lib/recovery.ts does.
 *
 * @example
 * const s = await elasticShrinkRun({ root, dir, name: "e0", globalMib: 64, localMib: 1, steps: 60, failStep: 40, stepMs: 20 });
 */
import { launchJson, type LaunchResult } from "./recovery.ts";
import { median } from "./stats.ts";

export interface ElasticBenchConfig {
  readonly root: string;
  readonly name: string;
  readonly globalMib: number;
  readonly localMib: number;
  readonly steps: number;
  readonly stepMs: number;
  readonly timeoutMs?: number;
}

export interface ShrinkParts {
  readonly detectMs: number;
  readonly agreeMs: number;
  readonly firstStepMs: number;
  /** Fault → every survivor's restore() returned (computing again). */
  readonly restoredMs: number;
  /** The checkpoint the survivors went back to, and the failure's. */
  readonly at: number;
  readonly failStep: number;
  /** Rank processes started during the run (4: none again). */
  readonly spawned: number;
}

export interface JoinParts {
  readonly transferMs: number;
  readonly pauseMs: number;
  /** The checkpoint the joiner came in at. */
  readonly at: number;
  readonly mib: number;
}

interface Mark {
  readonly kind: string;
  readonly wall: number;
  readonly slot: number;
  readonly line: string;
}

/** The run's marks and fault lines on the launcher's clock (ms since it started). */
function marksOf(r: LaunchResult): { marks: Mark[]; fault: number | undefined } {
  const out = r.events.filter((e) => e.event === "output").map((e) => ({ t: e.t, line: e.line as string }));
  const timed: { t: number; wall: number }[] = [];
  const marks: Mark[] = [];
  let faultWall: number | undefined;
  for (const { t, line } of out) {
    const f = /injected fault: killing this rank .* at ([\d.]+)$/.exec(line);
    if (f !== null) {
      faultWall = Number(f[1]);
      timed.push({ t, wall: faultWall });
    }
    const m = /^elastic-bench: (changed|restored|first) ([\d.]+) slot (\d+)/.exec(line);
    if (m === null) continue;
    timed.push({ t, wall: Number(m[2]) });
    marks.push({ kind: m[1]!, wall: Number(m[2]), slot: Number(m[3]), line });
  }
  const offset = Math.min(...timed.map((x) => x.t - x.wall));
  return { marks: marks.map((m) => ({ ...m, wall: m.wall + offset })), fault: faultWall === undefined ? undefined : faultWall + offset };
}

function programArgs(c: ElasticBenchConfig, extra: readonly string[]): string[] {
  return [
    "bench/programs/elastic.ts",
    "--global-mib",
    String(c.globalMib),
    "--local-mib",
    String(c.localMib),
    "--steps",
    String(c.steps),
    "--step-ms",
    String(c.stepMs),
    ...extra,
  ];
}

/** 4 ranks, rank 1 killed at step `failStep`, nobody started again: the survivors go on as 3. */
export async function elasticShrinkRun(c: ElasticBenchConfig & { readonly failStep: number }): Promise<ShrinkParts> {
  const r = await launchJson(
    c.root,
    c.name,
    ["-n", "4", "--mode", "elastic", "--max-restarts", "0", "--inject", `1@step:${c.failStep}`, ...programArgs(c, [])],
    c.timeoutMs ?? 300_000,
  );
  const fail = (what: string): never => {
    throw new Error(`elastic shrink run ${c.name}: ${what}\n${r.tail}`);
  };
  if (r.code !== 0) fail(`exit ${r.code}`);
  const { marks, fault } = marksOf(r);
  if (fault === undefined) return fail("no fault line");
  const exited = r.events.find((e) => e.event === "rank-exited" && e.rank === 1);
  if (exited === undefined) return fail("no rank-exited event for the victim");
  const restored = marks.filter((m) => m.kind === "restored");
  const first = marks.filter((m) => m.kind === "first");
  if (restored.length !== 3 || first.length !== 3) fail(`${restored.length} restored and ${first.length} first-step marks, expected 3 each`);
  const lastRestored = Math.max(...restored.map((m) => m.wall));
  const lastFirst = Math.max(...first.map((m) => m.wall));
  return {
    detectMs: exited.t - fault,
    agreeMs: lastRestored - exited.t,
    firstStepMs: lastFirst - lastRestored,
    restoredMs: lastRestored - fault,
    at: Number(/step (\d+)/.exec(restored[0]!.line)?.[1] ?? NaN),
    failStep: c.failStep,
    spawned: r.events.filter((e) => e.event === "rank-spawned").length,
  };
}

/** `-n 4 --max-np 5`, slot 4 up `lateMs` after the others: it joins and gets the model. */
export async function elasticJoinRun(c: ElasticBenchConfig & { readonly lateMs: number }): Promise<JoinParts> {
  const r = await launchJson(
    c.root,
    c.name,
    ["-n", "4", "--max-np", "5", "--mode", "elastic", ...programArgs(c, ["--late-slot", "4", "--late-ms", String(c.lateMs)])],
    c.timeoutMs ?? 300_000,
  );
  const fail = (what: string): never => {
    throw new Error(`elastic join run ${c.name}: ${what}\n${r.tail}`);
  };
  if (r.code !== 0) fail(`exit ${r.code}`);
  const { marks } = marksOf(r);
  const changed = marks.filter((m) => m.kind === "changed");
  const joined = marks.find((m) => m.kind === "restored" && m.slot === 4);
  const first = marks.filter((m) => m.kind === "first" && m.slot !== 4);
  if (changed.length !== 4 || joined === undefined || first.length !== 4) {
    fail(
      `${changed.length} changed marks, ${joined === undefined ? "no" : "a"} joiner mark and ${first.length} members' first steps, expected 4, 1 and 4 (did slot 4 come before the end?)`,
    );
  }
  const switched = Math.min(...changed.map((m) => m.wall));
  return {
    transferMs: joined!.wall - switched,
    pauseMs: Math.max(...first.map((m) => m.wall)) - switched,
    at: Number(/step (\d+)/.exec(joined!.line)?.[1] ?? NaN),
    mib: c.globalMib + c.localMib,
  };
}

/** Markdown: the two scenarios' medians, in seconds, and the target's verdict. */
export function renderElasticTable(shrink: readonly ShrinkParts[], join: readonly JoinParts[], c: ElasticBenchConfig, targetS: number): string {
  const s = (xs: number[]): string => (xs.length === 0 ? "—" : (median(xs) / 1000).toFixed(3));
  const lines = [
    `### Elastic, 4 ranks, ${c.globalMib} MiB model + ${c.localMib} MiB local state per rank (median; seconds)`,
    "",
    "| rank 1 killed, nobody started again | runs | detect | agree (→ every survivor restored) | first step | fault → every survivor computing again | went back to (failed at) |",
    "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
  ];
  if (shrink.length > 0) {
    lines.push(
      `| 4 → 3 ranks | ${shrink.length} | ${s(shrink.map((x) => x.detectMs))} | ${s(shrink.map((x) => x.agreeMs))} | ${s(shrink.map((x) => x.firstStepMs))} | ${s(shrink.map((x) => x.restoredMs))} | ${shrink.map((x) => `${x.at} (${x.failStep})`).join(", ")} |`,
    );
    const total = median(shrink.map((x) => x.restoredMs)) / 1000;
    lines.push(
      "",
      `Target (fault → every survivor computing again, no process started: ${shrink.every((x) => x.spawned === 4) ? "none was" : "SOME WERE"}) <= ${targetS} s: ${total <= targetS ? "met" : "NOT met"} (${total.toFixed(3)} s).`,
    );
  }
  lines.push(
    "",
    "| a rank joins (spare slot) | runs | model received (switch → joiner's restore() returned) | members' pause (switch → their next step done) | at checkpoint |",
    "| --- | ---: | ---: | ---: | --- |",
  );
  if (join.length > 0) {
    lines.push(
      `| 4 → 5 ranks, ${join[0]!.mib} MiB to the joiner | ${join.length} | ${s(join.map((x) => x.transferMs))} | ${s(join.map((x) => x.pauseMs))} | ${join.map((x) => x.at).join(", ")} |`,
    );
  }
  return `${lines.join("\n")}\n`;
}

/** The benchmark's target: fault → every survivor computing again, on 4 ranks. */
export const ELASTIC_TARGET_S = 0.3;

export interface ElasticBenchResult {
  readonly config: ElasticBenchConfig;
  readonly shrink: ShrinkParts[];
  readonly join: JoinParts[];
  readonly errors: string[];
  readonly targetS: number;
}

/** `--only elastic`: `runs` runs of each scenario, alternating; `quick` with a small model. */
export async function elasticBench(root: string, runs: number, quick: boolean, progress: (line: string) => void): Promise<ElasticBenchResult> {
  const config: ElasticBenchConfig = { root, name: "elastic", globalMib: quick ? 8 : 64, localMib: 1, steps: 60, stepMs: 20 };
  const out: ElasticBenchResult = { config, shrink: [], join: [], errors: [], targetS: ELASTIC_TARGET_S };
  progress(
    `\n== elastic: 4 ranks, ${config.globalMib} MiB model + ${config.localMib} MiB local state; rank 1 killed (4 → 3), and a rank joining late (4 → 5); ${runs} run(s) each`,
  );
  const s = (ms: number): string => `${(ms / 1000).toFixed(3)} s`;
  for (let k = 0; k < runs; k++) {
    try {
      const r = await elasticShrinkRun({ ...config, name: `elastic-shrink-${k}`, failStep: 40 });
      out.shrink.push(r);
      progress(
        `  4 → 3 run ${k + 1}: detect ${s(r.detectMs)}, agree ${s(r.agreeMs)} → every survivor computing again ${s(r.restoredMs)}, first step ${s(r.firstStepMs)}`,
      );
    } catch (err) {
      out.errors.push(`shrink run ${k + 1}: ${(err as Error).message}`);
      progress(`  4 → 3 run ${k + 1} FAILED: ${(err as Error).message.split("\n")[0]}`);
    }
    try {
      // Long enough that the late rank (1 s) comes in mid-job, also on a loaded machine.
      const r = await elasticJoinRun({ ...config, name: `elastic-join-${k}`, steps: 150, lateMs: 1000 });
      out.join.push(r);
      progress(`  4 → 5 run ${k + 1}: ${r.mib} MiB received in ${s(r.transferMs)}, members' pause ${s(r.pauseMs)}, at checkpoint ${r.at}`);
    } catch (err) {
      out.errors.push(`join run ${k + 1}: ${(err as Error).message}`);
      progress(`  4 → 5 run ${k + 1} FAILED: ${(err as Error).message.split("\n")[0]}`);
    }
  }
  return out;
}

/** The benchmark's section of the report. */
export function elasticText(r: ElasticBenchResult): string {
  return [renderElasticTable(r.shrink, r.join, r.config, r.targetS), ...r.errors.map((e) => `- elastic ${e.split("\n")[0]}`)].join("\n");
}
