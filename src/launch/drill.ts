/**
 * `lifeline drill` (docs/cli.md): run the program once cleanly (mode none, no faults) as the
 * reference, then `--repeat` times in the requested mode with the `--kill` faults injected,
 * and compare each faulty run's results with the reference bit for bit.
 *
 * Every run goes through {@link runJob}, the same in-process path as `lifeline run`, with a
 * recording reporter: the drill learns where each fault hit from the rank's "injected fault"
 * line, when it was detected from the supervisor's `rank-exited`/`rank-failed`, and how the
 * job recovered from the restarted rank's `rank-spawned`, `rank-up` and step reports
 * (src/launch/drill-report.ts does the analysis). Each run gets a fresh store directory, so a
 * faulty run can never recover from another run's lines.
 *
 * Exit code: 0 only if every faulty run finished with results identical to the reference;
 * 1 if one differs or fails (or the reference itself fails); 2 for usage errors; 128+signal
 * when interrupted.
 *
 * @example
 * const config = resolveDrillConfig({ np: "4", mode: "cpr", kill: ["1@step:5"], app: "examples/heat.ts", appArgs: [] }, { cwd });
 * const outcome = await runDrill(config, { stdout: process.stdout, stderr: process.stderr, env: process.env });
 */
import { randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, rmSync, statSync } from "node:fs";
import { writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { basename, dirname, join, resolve } from "node:path";
import { LifelineError, errorMessage, isLifelineError } from "../errors.ts";
import type { Mode } from "../mpi/env.ts";
import { deriveSeed, describeTrigger, parseKillSpecs, planFaults, type KillSpec, type PlannedFault, type ReferenceShape } from "./drill-spec.ts";
import {
  analyzeFaults,
  describeFault,
  describeVerdict,
  differenceLines,
  renderHtml,
  secs,
  verdictOf,
  type DrillReport,
  type DrillRun,
  type RecordedEvent,
  type RunResult,
} from "./drill-report.ts";
import { parseCount, resolveRunConfig, type RunConfig, type RunFlags } from "./options.ts";
import { errorLineSuffix, type JobEvent, type OutStream, type Reporter } from "./progress.ts";
import { toJsonSafe } from "./results.ts";
import { runJob, type RunIo } from "./run.ts";
import { runElasticDrill } from "./drill-elastic.ts";

/** Most faulty runs `--repeat` may ask for. */
export const REPEAT_MAX = 1000;
/** Rank stderr lines a run's record keeps (fault announcements are always kept). */
const STDERR_LINES_KEPT_MAX = 10_000;

/** The raw flags of `lifeline drill`: those of `run` plus the drill's own. */
export interface DrillFlags extends RunFlags {
  kill?: string[] | undefined;
  seed?: string | undefined;
  repeat?: string | undefined;
  report?: string | undefined;
}

/** A validated drill. */
export interface DrillConfig {
  /** The faulty runs' configuration (the reference run derives from it). */
  run: RunConfig;
  kills: KillSpec[];
  seed: number;
  repeat: number;
  /** Absolute path of the HTML report, if any. */
  reportPath: string | undefined;
  /** Where each run's fresh store directory is made: inside --store if given, else the temp dir. */
  storeRoot: string;
  /** The command line, for the report. */
  command: string;
}

/** How a drill ended. */
export interface DrillOutcome {
  pass: boolean;
  exitCode: number;
  report: DrillReport;
}

/** Builds a drill's configuration; throws one `LAUNCH_USAGE` listing every problem. */
export function resolveDrillConfig(flags: DrillFlags, ctx: { cwd: string; command?: string }): DrillConfig {
  const problems: string[] = [];
  const collect = (err: unknown): void => {
    if (!isLifelineError(err, "LAUNCH_USAGE")) throw err;
    problems.push(...err.message.split("\n").map((l) => l.replace(/^- /, "")));
  };
  if ((flags.inject ?? []).length > 0) problems.push("drill takes its faults from --kill (e.g. --kill 1@step:5), not --inject");
  if (flags.replay !== undefined) problems.push("drill replays each faulty run's changes of the world itself (--mode elastic): drop --replay");
  if (flags.resume === true || flags.fresh === true)
    problems.push(`drill runs every job in a fresh store of its own, so ${flags.resume === true ? "--resume" : "--fresh"} does not apply`);
  let run: RunConfig | undefined;
  try {
    run = resolveRunConfig({ ...flags, inject: [] }, ctx);
  } catch (err) {
    collect(err);
  }
  let size: number | undefined;
  try {
    size = flags.np === undefined ? undefined : parseCount(flags.np, "-n/--np", 1, Number.MAX_SAFE_INTEGER);
  } catch {
    size = undefined;
  }
  let kills: KillSpec[] = [];
  try {
    kills = parseKillSpecs(flags.kill ?? [], size);
  } catch (err) {
    collect(err);
  }
  let seed = randomBytes(4).readUInt32LE(0);
  if (flags.seed !== undefined) {
    try {
      seed = parseCount(flags.seed, "--seed", 0, 0xffff_ffff);
    } catch (err) {
      collect(err);
    }
  }
  let repeat = 1;
  if (flags.repeat !== undefined) {
    try {
      repeat = parseCount(flags.repeat, "--repeat", 1, REPEAT_MAX);
    } catch (err) {
      collect(err);
    }
  }
  let reportPath: string | undefined;
  if (flags.report !== undefined) {
    const path = resolve(ctx.cwd, flags.report);
    const dir = dirname(path);
    if (flags.report.trim() === "") problems.push("--report needs a file name");
    else if (!existsSync(dir) || !statSync(dir).isDirectory()) problems.push(`--report ${JSON.stringify(flags.report)}: directory ${dir} does not exist`);
    else if (existsSync(path) && statSync(path).isDirectory()) problems.push(`--report ${JSON.stringify(flags.report)} is a directory; give a file name`);
    else reportPath = path;
  }
  if (problems.length > 0 || run === undefined) {
    throw new LifelineError("LAUNCH_USAGE", problems.length === 1 ? problems[0]! : problems.map((p) => `- ${p}`).join("\n"));
  }
  const storeRoot = flags.store === undefined ? tmpdir() : run.store;
  return { run, kills, seed, repeat, reportPath, storeRoot, command: ctx.command ?? `lifeline drill ${run.app}` };
}

/** Streams the drill writes to, as for `lifeline run`. */
export type DrillIo = Pick<RunIo, "stdout" | "stderr" | "env" | "handleSignals">;

/** Runs the reference and the faulty runs; never rejects for failed runs (they are the verdict). */
export async function runDrill(config: DrillConfig, io: DrillIo): Promise<DrillOutcome> {
  // elastic: each faulty run's reference is the fault-free replay of its changes (drill-elastic.ts).
  if (config.run.mode === "elastic") return runElasticDrill(config, io);
  const out = new DrillOutput(config, io.stderr);
  const { run: base } = config;
  const runs: DrillRun[] = [];
  const faultCount = config.kills.reduce((n, k) => n + (k.kind === "random" ? k.count : 1), 0);
  out.info(
    `${basename(base.app)} on ${base.size} rank${base.size === 1 ? "" : "s"}: a reference run (mode none), then ${config.repeat} run${config.repeat === 1 ? "" : "s"} in mode ${base.mode} ` +
      (faultCount === 0 ? "without faults (re-run and compare)" : `with ${faultCount} fault${faultCount === 1 ? "" : "s"} each`) +
      ` · seed ${config.seed}`,
  );
  out.json({
    event: "drill-starting",
    app: base.app,
    size: base.size,
    mode: base.mode,
    seed: config.seed,
    repeat: config.repeat,
    kills: config.kills.map((k) => k.text),
  });

  const finish = (pass: boolean, exitCode: number, summary: string): Promise<DrillOutcome> => finishDrill(config, out, runs, pass, exitCode, summary);

  // 1. The reference: mode none, no faults, no results file of its own.
  out.info(`run 0 (reference, mode none): starting`);
  const refConfig: RunConfig = { ...base, mode: "none", faults: new Array<string>(base.size).fill(""), resultsPath: undefined };
  const reference = await executeRun(refConfig, { index: 0, label: "reference", mode: "none", seed: undefined, faults: [] }, config, io, out);
  runs.push(reference);
  if (!reference.result.ok) {
    const why = reference.result.error?.message ?? `exit ${reference.result.exitCode}`;
    if (reference.result.error?.code === "LAUNCH_INTERRUPTED") return finish(false, reference.result.exitCode, "drill interrupted during the reference run");
    out.detail(why);
    return finish(false, 1, `the reference run (mode none, no faults) failed, so there is nothing to compare with: ${why.split("\n")[0]}`);
  }
  out.info(`run 0 (reference): ${base.size}/${base.size} ranks finalized in ${secs(reference.result.wallMs)}`);
  const shape = referenceShape(reference.events, base.size);

  // 2. The faulty runs.
  for (let k = 0; k < config.repeat; k++) {
    const planned = faultsOfRun(config, k, shape);
    if ("problem" in planned) return finish(false, 1, planned.problem);
    const { seed, faults, perRank } = planned;
    const label = config.repeat === 1 ? "faulty run" : `faulty run ${k + 1}/${config.repeat}`;
    out.info(
      `run ${k + 1} (${label}, mode ${base.mode}, seed ${seed}): ` +
        (faults.length === 0
          ? "no faults"
          : faults.map((f) => `fault ${f.index}: rank ${f.rank} @ ${describeTrigger(f.trigger)}${f.attempt > 0 ? ` (attempt ${f.attempt})` : ""}`).join("; ")),
    );
    const run = await executeRun({ ...base, faults: perRank, resultsPath: undefined }, { index: k + 1, label, mode: base.mode, seed, faults }, config, io, out);
    run.verdict = verdictOf(run, reference.result.results);
    runs.push(run);
    for (const r of run.faultReports) out.detail(describeFault(r));
    out.runVerdict(k + 1, describeVerdict(run.verdict, base.size), run.verdict.kind === "identical");
    if (run.verdict.kind === "differs") for (const l of differenceLines(reference.result.results, run.result.results, run.verdict.ranks)) out.detail(l);
    out.json({ event: "drill-run-finished", run: k + 1, seed, verdict: run.verdict, faults: run.faultReports.map(faultJson) });
    if (run.result.error?.code === "LAUNCH_INTERRUPTED") return finish(false, run.result.exitCode, "drill interrupted");
  }

  return closeDrill(finish, runs.slice(1), { same: "the reference run's", against: "the reference", missed: "reproduce the reference" });
}

/** Faulty run `k`'s seed and faults, and each rank's LIFELINE_FAULTS for them; or why a kill cannot be placed. */
export function faultsOfRun(
  config: DrillConfig,
  k: number,
  shape: ReferenceShape | undefined,
): { seed: number; faults: PlannedFault[]; perRank: string[] } | { problem: string } {
  const base = config.run;
  const seed = deriveSeed(config.seed, k);
  let faults: PlannedFault[];
  try {
    faults = planFaults(config.kills, { size: base.size, mode: base.mode, seed, reference: shape });
  } catch (err) {
    if (!isLifelineError(err)) throw err;
    return { problem: err.message };
  }
  const perRank = new Array<string>(base.size).fill("");
  for (const f of faults) {
    const spec = `${f.trigger}@attempt=${f.attempt}`;
    perRank[f.rank] = perRank[f.rank] === "" ? spec : `${perRank[f.rank]};${spec}`;
  }
  return { seed, faults, perRank };
}

/**
 * The drill's last word: PASS if every faulty run's results equal its reference's (`ref` words
 * what that reference is), else FAIL naming the first that did not.
 */
export function closeDrill(
  finish: (pass: boolean, exitCode: number, summary: string) => Promise<DrillOutcome>,
  faulty: readonly DrillRun[],
  ref: { same: string; against: string; missed: string },
): Promise<DrillOutcome> {
  const bad = faulty.filter((r) => r.verdict?.kind !== "identical");
  if (bad.length === 0) {
    return finish(true, 0, `PASS: ${faulty.length === 1 ? "the faulty run's" : `all ${faulty.length} faulty runs'`} results are bit-identical to ${ref.same}`);
  }
  const first = bad[0]!;
  const v = first.verdict!;
  const what =
    v.kind === "differs"
      ? `results differ from ${ref.against} on rank${v.ranks.length === 1 ? "" : "s"} ${v.ranks.join(", ")}`
      : `failed: ${v.kind === "failed" ? v.message : ""}`;
  return finish(
    false,
    1,
    `FAIL: ${bad.length} of ${faulty.length} faulty run${faulty.length === 1 ? "" : "s"} did not ${ref.missed}; ${first.label} (seed ${first.seed}) ${what}`,
  );
}

/** Writes the report and the results file of a drill whose runs are done, and says how it went. */
export async function finishDrill(
  config: DrillConfig,
  out: DrillOutput,
  runs: DrillRun[],
  pass: boolean,
  exitCode: number,
  summary: string,
): Promise<DrillOutcome> {
  const base = config.run;
  const report: DrillReport = {
    app: base.app,
    appArgs: base.appArgs,
    size: base.size,
    mode: base.mode,
    seed: config.seed,
    command: config.command,
    runs,
    pass,
    summary,
  };
  if (config.reportPath !== undefined) {
    try {
      await writeFile(config.reportPath, renderHtml(report));
      out.info(`report written to ${config.reportPath}`);
    } catch (err) {
      out.error(`cannot write --report file ${config.reportPath}: ${errorMessage(err)}`);
      if (exitCode === 0) exitCode = 1;
    }
  }
  if (base.resultsPath !== undefined) {
    try {
      await writeFile(base.resultsPath, `${JSON.stringify(resultsDocument(report, exitCode), null, 2)}\n`);
    } catch (err) {
      out.error(`cannot write --results file ${base.resultsPath}: ${errorMessage(err)}`);
      if (exitCode === 0) exitCode = 1;
    }
  }
  if (pass) out.pass(summary);
  else out.fail(summary);
  out.json({ event: "drill-finished", pass, exitCode, summary });
  return { pass, exitCode, report };
}

/** Runs one job through runJob with a recording reporter and analyses its faults. */
export async function executeRun(
  runConfig: RunConfig,
  meta: { index: number; label: string; mode: Mode; seed: number | undefined; faults: PlannedFault[] },
  config: DrillConfig,
  io: DrillIo,
  out: DrillOutput,
): Promise<DrillRun> {
  const store = mkdtempSync(join(config.storeRoot, "lifeline-drill-"));
  const recorder = new RecordingReporter(meta.index, meta.faults, out);
  let result: RunResult;
  try {
    const outcome = await runJob(
      { ...runConfig, store, json: false, quiet: true },
      { stdout: io.stdout, stderr: io.stderr, env: io.env, handleSignals: io.handleSignals ?? true, reporter: recorder },
    );
    result = {
      ok: outcome.ok,
      exitCode: outcome.exitCode,
      wallMs: outcome.wallMs,
      restarts: outcome.restarts,
      results: outcome.results,
      error: outcome.error === undefined ? undefined : { code: outcome.error.code, message: outcome.error.message },
      recovery: outcome.recovery,
    };
  } finally {
    rmSync(store, { recursive: true, force: true });
  }
  const faultReports = analyzeFaults(recorder.events, meta.faults, { size: runConfig.size, mode: meta.mode });
  return { ...meta, events: recorder.events, result, faultReports, verdict: undefined };
}

/** Each rank's step count and compute time in the reference run, for placing random kills. */
export function referenceShape(events: readonly RecordedEvent[], size: number): ReferenceShape {
  const stepsByRank = new Array<number>(size).fill(0);
  const upAt = new Array<number | undefined>(size).fill(undefined);
  const computeMsByRank = new Array<number>(size).fill(0);
  for (const { t, ev } of events) {
    if (ev.kind === "rank-step") stepsByRank[ev.rank] = Math.max(stepsByRank[ev.rank]!, ev.steps);
    else if (ev.kind === "rank-up") upAt[ev.rank] = t;
    else if (ev.kind === "rank-finalized" && upAt[ev.rank] !== undefined) computeMsByRank[ev.rank] = t - upAt[ev.rank]!;
  }
  return { stepsByRank, computeMsByRank };
}

/**
 * The reporter each run of a drill uses: it records every event with its time, shows the
 * drill's live progress (faults hitting, detection, restarts), and under `--json` passes the
 * events on with the run's number.
 */
class RecordingReporter implements Reporter {
  readonly events: RecordedEvent[] = [];
  private readonly start = performance.now();
  private stderrKept = 0;

  constructor(
    private readonly run: number,
    private readonly faults: readonly PlannedFault[],
    private readonly out: DrillOutput,
  ) {}

  event(ev: JobEvent): void {
    const t = this.now();
    this.events.push({ t, ev });
    this.out.jobEvent(this.run, t, ev);
    switch (ev.kind) {
      case "rank-failed":
        // With the line of its stderr that says why: a drill's report shows no rank output.
        this.out.live(`  ${secs(t)} rank ${ev.rank} failed: ${ev.reason}${errorLineSuffix(ev.reason, ev.error)}`);
        break;
      case "rank-spawned":
        if (ev.attempt > 0) this.out.live(`  ${secs(t)} rank ${ev.rank} restarted (attempt ${ev.attempt})`);
        break;
      case "job-stopping":
        this.out.live(`  ${secs(t)} stopping the job: ${ev.reason.split("\n")[0]}`);
        break;
      case "job-finished":
        this.out.live(
          `  ${secs(t)} job ${ev.ok ? "finished" : `failed (exit ${ev.exitCode})`}: ${ev.finalized}/${ev.size} ranks finalized${ev.restarts > 0 ? `, ${ev.restarts} restart${ev.restarts === 1 ? "" : "s"}` : ""}`,
        );
        break;
      default:
        break;
    }
  }

  rankLine(rank: number, stream: "stdout" | "stderr", line: string): void {
    // The program's stdout is not the drill's business; its stderr is kept (bounded) for the
    // fault announcements the analysis reads, and passed on under --json.
    if (stream === "stdout") return;
    const fired = /injected fault: (killing|freezing) this rank \((.+?)\)(?: at (\d+(?:\.\d+)?))?\s*$/.exec(line);
    // A fault line carries the moment the rank died (wall clock): place the hit there, not at
    // the line's arrival through the pipe, so that detection times are measured from the death.
    const stamped = fired?.[3] === undefined ? undefined : Number(fired[3]) - (performance.timeOrigin + this.start);
    const t = stamped !== undefined && Number.isFinite(stamped) && stamped >= 0 ? Math.min(stamped, this.now()) : this.now();
    if (fired !== null || this.stderrKept < STDERR_LINES_KEPT_MAX) {
      this.stderrKept++;
      this.events.push({ t, ev: { kind: "rank-output", rank, stream, line } });
    }
    this.out.json({ event: "output", run: this.run, rank, stream, line, t: Math.round(t) });
    if (fired !== null) {
      const f = this.faults.find((p) => p.rank === rank && (p.trigger === fired[2] || p.trigger === `hang:${fired[2]}`));
      this.out.live(
        `  ${secs(t)} fault${f === undefined ? "" : ` ${f.index}`} hit rank ${rank} (${fired[1] === "killing" ? "killed" : "frozen"} at ${describeTrigger(fired[2]!)})`,
      );
    }
  }

  close(): void {}

  private now(): number {
    return performance.now() - this.start;
  }
}

/** The drill's own output: plain lines for people (or nothing with --quiet), JSON with --json. */
export class DrillOutput {
  private readonly style: "json" | "quiet" | "plain";

  constructor(
    config: DrillConfig,
    private readonly stderr: OutStream,
  ) {
    this.style = config.run.json ? "json" : config.run.quiet ? "quiet" : "plain";
  }

  info(message: string): void {
    if (this.style === "plain") this.write(message);
  }

  live(message: string): void {
    if (this.style === "plain") this.write(message);
  }

  detail(message: string): void {
    if (this.style !== "json") for (const l of message.split("\n")) this.write(`  ${l}`);
  }

  runVerdict(run: number, text: string, ok: boolean): void {
    if (this.style === "plain" || (this.style === "quiet" && !ok)) this.write(`run ${run}: ${text}`);
  }

  error(message: string): void {
    if (this.style === "json") this.json({ event: "warning", message });
    else this.write(`error: ${message}`);
  }

  pass(summary: string): void {
    if (this.style !== "json") this.write(summary);
  }

  fail(summary: string): void {
    if (this.style !== "json") this.write(summary);
  }

  json(obj: Record<string, unknown>): void {
    if (this.style !== "json") return;
    this.stderr.write(`${JSON.stringify(toJsonSafe(obj))}\n`);
  }

  jobEvent(run: number, t: number, ev: JobEvent): void {
    if (this.style !== "json") return;
    const { kind, ...rest } = ev as JobEvent & { results?: unknown };
    if (kind === "job-finished") delete (rest as { results?: unknown }).results;
    this.json({ event: kind, run, ...rest, t: Math.round(t) });
  }

  private write(line: string): void {
    this.stderr.write(`lifeline drill: ${line}\n`);
  }
}

export function faultJson(r: DrillRun["faultReports"][number]): Record<string, unknown> {
  return {
    index: r.fault.index,
    rank: r.fault.rank,
    trigger: r.fault.trigger,
    attempt: r.fault.attempt,
    source: r.fault.source,
    hitMs: round(r.hitMs),
    stepsAtHit: r.stepsAtHit,
    cause: r.cause,
    detectionMs: r.hitMs === undefined || r.detectedMs === undefined ? undefined : round(r.detectedMs - r.hitMs),
    restartMs: r.detectedMs === undefined || r.upMs === undefined ? undefined : round(r.upMs - r.detectedMs),
    recoveryMs: r.detectedMs === undefined || r.recoveredMs === undefined ? undefined : round(r.recoveredMs - r.detectedMs),
    restoreEpoch: r.restoreEpoch,
    workLostSteps: r.workLostSteps,
    note: r.note,
  };
}

function round(n: number | undefined): number | undefined {
  return n === undefined ? undefined : Math.round(n);
}

/** The drill's `--results` document: the verdict, every run's results and every fault's figures. */
function resultsDocument(report: DrillReport, exitCode: number): Record<string, unknown> {
  return {
    pass: report.pass,
    exitCode,
    summary: report.summary,
    mode: report.mode,
    size: report.size,
    seed: report.seed,
    runs: report.runs.map((r) => ({
      run: r.index,
      label: r.label,
      mode: r.mode,
      seed: r.seed,
      ok: r.result.ok,
      exitCode: r.result.exitCode,
      wallMs: r.result.wallMs,
      restarts: r.result.restarts,
      error: r.result.error,
      verdict: r.verdict,
      ranks: r.result.results.map((v) => toJsonSafe(v)),
      faults: r.faultReports.map(faultJson),
    })),
  };
}
