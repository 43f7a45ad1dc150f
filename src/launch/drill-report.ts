/**
 * What `lifeline drill` makes of its runs: the per-fault analysis of a run's recorded events
 * (where each fault hit, when it was detected, when the job recovered, how much work was
 * redone), the comparison of results with the reference run, the text verdict, and the
 * `--report` HTML page (one time line per rank per run, as inline SVG; no external assets).
 *
 * Everything here is pure: it works on recorded events, so it is unit-tested without processes.
 *
 * @example
 * const faults = analyzeFaults(run.events, run.faults, { size: 4, mode: "cpr" });
 * writeFileSync("drill.html", renderHtml(report)); // self-contained page
 */
import { isDeepStrictEqual, inspect } from "node:util";
import type { Mode } from "../mpi/env.ts";
import { describeTrigger, firedWhy, type PlannedFault } from "./drill-spec.ts";
import type { JobEvent } from "./progress.ts";

/** One thing that happened in a run, at `t` ms after the run started. */
export type RecordedEvent = { t: number; ev: JobEvent } | { t: number; ev: { kind: "rank-output"; rank: number; stream: "stdout" | "stderr"; line: string } };

/** How one run ended (the parts of a JobOutcome a drill keeps). */
export interface RunResult {
  ok: boolean;
  exitCode: number;
  wallMs: number;
  restarts: number;
  results: unknown[];
  error: { code: string; message: string } | undefined;
  /** The policy's account of recovery (elastic: the changes of the world, which a replay runs again). */
  recovery?: Record<string, unknown> | undefined;
}

/** What one planned fault did in its run. Times are ms since the run started. */
export interface FaultReport {
  fault: PlannedFault;
  /** When the rank announced the fault (its "injected fault" line); undefined if it never fired. */
  hitMs: number | undefined;
  /** Steps the rank had completed when it was hit (exact for step triggers, else the last report). */
  stepsAtHit: number | undefined;
  /** When the supervisor saw the failure (process exit, or the heartbeat/stuck verdict). */
  detectedMs: number | undefined;
  /** How it was detected: exit, heartbeat, stuck, ... (from the supervisor's report). */
  cause: string | undefined;
  /** When the failed rank was started again (its next attempt). */
  restartedMs: number | undefined;
  /** When the restarted rank was up (called init()). */
  upMs: number | undefined;
  /** When the failed rank was past the point where it was hit (or finalized). */
  recoveredMs: number | undefined;
  /** When a later fault was detected before this one had recovered (its recovery restarts with that one). */
  interruptedMs: number | undefined;
  /** retry-one: the failed rank alone restored checkpoint `restoreEpoch` from its peers' memory. */
  restoredFromPeers?: boolean;
  /** elastic: the others went back to checkpoint `restoreEpoch` and went on without the failed rank. */
  wentOn?: boolean;
  /** The recovery line (epoch) the job rolled back to, when the protocol reported it. */
  restoreEpoch: number | undefined;
  /** Steps redone: steps at the hit minus the steps the restored state already held. */
  workLostSteps: number | undefined;
  /** Why a figure is missing, or what else a reader should know. */
  note: string | undefined;
}

/** One run's verdict against the reference. */
export type Verdict = { kind: "identical" } | { kind: "differs"; ranks: number[] } | { kind: "failed"; message: string };

/** One run of a drill, recorded and analysed. */
export interface DrillRun {
  /** 0 = the reference run; 1.. = faulty runs. */
  index: number;
  label: string;
  mode: Mode;
  seed: number | undefined;
  faults: PlannedFault[];
  events: RecordedEvent[];
  result: RunResult;
  faultReports: FaultReport[];
  /** Faulty runs only. */
  verdict: Verdict | undefined;
}

/** A whole drill, for the text summary and the HTML page. */
export interface DrillReport {
  app: string;
  appArgs: string[];
  size: number;
  mode: Mode;
  seed: number;
  command: string;
  runs: DrillRun[];
  /** True when every faulty run gave results identical to the reference. */
  pass: boolean;
  /** One line: why the drill passed or failed. */
  summary: string;
}

// ---- analysis ----------------------------------------------------------------------------

/** A rank's fault announcement (src/mpi/faults.ts `fire`); older ranks print no ` at <ms>`. */
export const FIRED_LINE = /injected fault: (?:killing|freezing) this rank \((.+?)\)(?: at (\d+(?:\.\d+)?))?\s*$/;

/** Loose view of an event, for kinds that recovery protocols may add (line commits, restores). */
function fields(ev: RecordedEvent["ev"]): Record<string, unknown> {
  return ev;
}

/** A committed recovery line, when the run's mode reports them. */
export interface LineCommit {
  t: number;
  epoch: number;
}

/** Events that say a recovery line was committed (cpr); recognised by kind and `epoch`. */
export function lineCommits(events: readonly RecordedEvent[]): LineCommit[] {
  const out: LineCommit[] = [];
  for (const { t, ev } of events) {
    const f = fields(ev);
    if (typeof f.epoch === "number" && /commit/.test(ev.kind)) out.push({ t, epoch: f.epoch });
  }
  return out;
}

/**
 * The epoch a restart rolled back to, if the event says so: cpr's `job-restarting` (epoch 0 =
 * from the beginning), or any event with `restoreEpoch` or a restore/rollback kind with `epoch`.
 */
function restoreEpochOf(ev: RecordedEvent["ev"]): number | undefined {
  if (ev.kind === "job-restarting") return ev.epoch;
  const f = fields(ev);
  if (typeof f.restoreEpoch === "number") return f.restoreEpoch;
  if (/restor|rollback|rolled-back|recover/.test(ev.kind) && typeof f.epoch === "number") return f.epoch;
  return undefined;
}

/**
 * Works out, for each planned fault, where it hit and what it cost, from a run's events:
 * the rank's "injected fault" line (hit), its exit or heartbeat/stuck failure (detection),
 * its next spawn and rank-up (restart), and the first step report past the point of the hit
 * (recovery). Steps are counted per attempt by ranks; a restarted rank's progress is the
 * steps held by the state it restored (the step count at the restored epoch) plus its new steps.
 */
export function analyzeFaults(events: readonly RecordedEvent[], faults: readonly PlannedFault[], ctx: { size: number; mode: Mode }): FaultReport[] {
  const sorted = [...events].sort((a, b) => a.t - b.t);
  const reports: FaultReport[] = faults.map((fault) => ({
    fault,
    hitMs: undefined,
    stepsAtHit: undefined,
    detectedMs: undefined,
    cause: undefined,
    restartedMs: undefined,
    upMs: undefined,
    recoveredMs: undefined,
    interruptedMs: undefined,
    restoreEpoch: undefined,
    workLostSteps: undefined,
    note: undefined,
  }));
  const attempt = new Array<number>(ctx.size).fill(0);
  const base = new Array<number>(ctx.size).fill(0);
  const steps = new Array<number>(ctx.size).fill(0);
  // Per rank: the absolute step count at which each epoch was first reported.
  const stepsAtEpoch = Array.from({ length: ctx.size }, () => new Map<number, number>());
  // Faults that hit and are waiting for their next stage.
  const open: FaultReport[] = [];
  let lastRestoreEpoch: number | undefined;
  // Per rank: when its current process exited (or was declared failed) with no fault of it
  // open yet. The launcher sees a process's exit before it has read the last of its stderr,
  // so under load the "injected fault" line can arrive after the exit: the fault then hit no
  // later than the exit, and the exit was its detection.
  const unexplained = new Array<{ t: number; reason: string | undefined; restore: number | undefined } | undefined>(ctx.size).fill(undefined);

  for (const { t, ev } of sorted) {
    const restore = restoreEpochOf(ev);
    if (restore !== undefined) {
      lastRestoreEpoch = restore;
      for (const r of open) if (r.detectedMs !== undefined && r.recoveredMs === undefined) r.restoreEpoch = restore;
      for (const gone of unexplained) if (gone !== undefined) gone.restore = restore;
    }
    switch (ev.kind) {
      case "rank-output": {
        const m = ev.stream === "stderr" ? FIRED_LINE.exec(ev.line) : null;
        if (m === null) break;
        const report = reports.find((r) => r.hitMs === undefined && r.fault.rank === ev.rank && firedWhy(r.fault.trigger) === m[1]);
        if (report === undefined) break;
        const gone = unexplained[ev.rank];
        unexplained[ev.rank] = undefined;
        report.hitMs = gone === undefined ? t : Math.min(t, gone.t);
        report.stepsAtHit = report.fault.stepsBefore !== undefined ? base[ev.rank]! + report.fault.stepsBefore : base[ev.rank]! + steps[ev.rank]!;
        if (gone !== undefined) {
          report.detectedMs = gone.t;
          if (gone.reason !== undefined) report.cause = causeOf(gone.reason);
          // A restart decided before the line arrived.
          if (gone.restore !== undefined) report.restoreEpoch = gone.restore;
        }
        open.push(report);
        break;
      }
      case "rank-step": {
        steps[ev.rank] = ev.steps;
        const abs = base[ev.rank]! + ev.steps;
        if (!stepsAtEpoch[ev.rank]!.has(ev.epoch)) stepsAtEpoch[ev.rank]!.set(ev.epoch, abs);
        for (const r of open) {
          if (r.fault.rank === ev.rank && r.upMs !== undefined && recovering(r) && r.stepsAtHit !== undefined && abs >= r.stepsAtHit) r.recoveredMs = t;
        }
        break;
      }
      case "rank-exited":
      case "rank-failed": {
        const detected = open.filter((r) => r.fault.rank === ev.rank && r.detectedMs === undefined);
        for (const r of detected) r.detectedMs = t;
        if (detected.length === 0 && !open.some((r) => r.fault.rank === ev.rank && r.upMs === undefined)) {
          const reason = ev.kind === "rank-failed" ? ev.reason : undefined;
          const prior = unexplained[ev.rank];
          if (prior === undefined) {
            if (!(ev.kind === "rank-exited" && ev.killedByLauncher)) unexplained[ev.rank] = { t, reason, restore: undefined };
          } else if (prior.reason === undefined && reason !== undefined) prior.reason = reason;
        }
        if (detected.length > 0) {
          // A new failure before an earlier fault recovered: that recovery starts over.
          for (const r of open) if (!detected.includes(r) && r.detectedMs !== undefined && recovering(r)) r.interruptedMs = t;
        }
        if (ev.kind === "rank-failed") {
          for (const r of open) if (r.fault.rank === ev.rank && r.cause === undefined) r.cause = causeOf(ev.reason);
        }
        break;
      }
      case "rank-spawned": {
        if (ev.attempt > attempt[ev.rank]!) {
          attempt[ev.rank] = ev.attempt;
          // Progress after a restart starts from what the restored state held.
          const restoredSteps = restoredStepsOf(stepsAtEpoch[ev.rank]!, lastRestoreEpoch, ctx.mode);
          base[ev.rank] = restoredSteps;
          steps[ev.rank] = 0;
          for (const r of open) if (r.fault.rank === ev.rank && r.detectedMs !== undefined && r.restartedMs === undefined) r.restartedMs = t;
        }
        break;
      }
      case "rank-up": {
        // The new process is up: any exit before it was not a fault's (its line would be in).
        unexplained[ev.rank] = undefined;
        for (const r of open) if (r.fault.rank === ev.rank && r.restartedMs !== undefined && r.upMs === undefined) r.upMs = t;
        break;
      }
      case "rank-caught-up": {
        // retry-one: the restarted rank restored checkpoint `restored` (a rank reports its
        // version as its epoch) and now runs with the others again: recovered.
        base[ev.rank] = restoredStepsOf(stepsAtEpoch[ev.rank]!, ev.restored, ctx.mode);
        for (const r of open) {
          if (r.fault.rank !== ev.rank || r.upMs === undefined || !recovering(r)) continue;
          r.restoreEpoch = ev.restored;
          r.restoredFromPeers = true;
          r.recoveredMs = t;
        }
        break;
      }
      case "rank-finalized": {
        for (const r of open) if (r.fault.rank === ev.rank && r.upMs !== undefined && recovering(r)) r.recoveredMs = t;
        break;
      }
      case "world-changed": {
        // elastic: the others went back to checkpoint `at` and go on without the lost rank:
        // recovered, whether or not its slot is started again.
        if (!ev.rollback) break;
        for (const r of open) {
          if (r.detectedMs === undefined || !recovering(r)) continue;
          r.restoreEpoch = ev.at;
          r.wentOn = true;
          r.recoveredMs = t;
          if (r.stepsAtHit !== undefined) r.workLostSteps = Math.max(0, r.stepsAtHit - ev.at);
        }
        break;
      }
      default:
        break;
    }
  }

  for (const r of reports) {
    if (r.hitMs === undefined) {
      r.note = "did not fire (the rank finished, or was stopped, before the trigger)";
      continue;
    }
    if (r.cause === undefined && r.detectedMs !== undefined) r.cause = r.fault.hang ? "heartbeat" : "exit";
    // elastic: the job went on without the rank (whether its slot was started again or not).
    if (r.wentOn === true) continue;
    if (r.restartedMs === undefined) {
      r.note = ctx.mode === "none" ? "not recovered: mode none cannot recover" : "not recovered: the rank was not restarted";
      continue;
    }
    if (r.stepsAtHit !== undefined) {
      const restored = restoredStepsOf(stepsAtEpoch[r.fault.rank]!, r.restoreEpoch, ctx.mode);
      r.workLostSteps = Math.max(0, r.stepsAtHit - restored);
    }
    if (r.interruptedMs !== undefined)
      r.note = `a later fault struck ${Math.round(r.interruptedMs - (r.detectedMs ?? r.interruptedMs))} ms after detection, before this one had recovered`;
    else if (r.recoveredMs === undefined) r.note = "restarted, but did not get back to the point of the fault";
  }
  return reports;
}

/**
 * The steps the state of `epoch` held: the step count at which the rank first reported that
 * epoch (it is reported at the very checkpoint() call that took it); epoch 0, or no line, is
 * the beginning. The launcher's --json step events are thinned (one per rank per 250 ms), so that
 * report may be missing: then the nearest earlier epoch's count stands in, plus — in retry-one,
 * where every checkpoint() call is a version of its own — one step per version in between,
 * never past the next reported epoch's count.
 */
function restoredStepsOf(stepsAtEpoch: ReadonlyMap<number, number>, epoch: number | undefined, mode: Mode): number {
  if (epoch === undefined || epoch === 0) return 0;
  const exact = stepsAtEpoch.get(epoch);
  if (exact !== undefined) return exact;
  let below: { epoch: number; steps: number } = { epoch: 0, steps: 0 };
  let above: { epoch: number; steps: number } | undefined;
  for (const [e, steps] of stepsAtEpoch) {
    if (e < epoch && e >= below.epoch) below = { epoch: e, steps };
    if (e > epoch && (above === undefined || e < above.epoch)) above = { epoch: e, steps };
  }
  const estimate = mode === "retry-one" ? below.steps + (epoch - below.epoch) : below.steps;
  return above === undefined ? estimate : Math.min(estimate, above.steps);
}

function recovering(r: FaultReport): boolean {
  return r.recoveredMs === undefined && r.interruptedMs === undefined;
}

function causeOf(reason: string): string {
  if (/heartbeat/.test(reason)) return "heartbeat";
  if (/step boundary|stuck/.test(reason)) return "stuck";
  if (/aborted/.test(reason)) return "abort";
  return "exit";
}

/** Milliseconds between two optional instants. */
export function span(from: number | undefined, to: number | undefined): number | undefined {
  return from === undefined || to === undefined ? undefined : Math.max(0, Math.round(to - from));
}

/**
 * Compares a run's results with the reference's, rank by rank, exactly (deep strict equality
 * of the decoded values: same types, same bits of every number).
 */
export function compareResults(reference: readonly unknown[], results: readonly unknown[]): number[] {
  const differing: number[] = [];
  const n = Math.max(reference.length, results.length);
  for (let r = 0; r < n; r++) if (!isDeepStrictEqual(reference[r], results[r])) differing.push(r);
  return differing;
}

/** The verdict of one faulty run. */
export function verdictOf(run: { mode: Mode; result: RunResult; faultReports: readonly FaultReport[] }, reference: readonly unknown[]): Verdict {
  if (!run.result.ok) {
    const hit = run.faultReports.some((r) => r.hitMs !== undefined);
    const why = run.result.error?.message.split("\n")[0] ?? `exit ${run.result.exitCode}`;
    if (run.mode === "none" && hit) return { kind: "failed", message: `mode none cannot recover: ${why}` };
    return { kind: "failed", message: `the run did not complete: ${why}` };
  }
  const ranks = compareResults(reference, run.result.results);
  return ranks.length === 0 ? { kind: "identical" } : { kind: "differs", ranks };
}

// ---- text --------------------------------------------------------------------------------

/** `1@step:5` plus where it hit and what it cost, in one line. */
export function describeFault(r: FaultReport): string {
  const head = `fault ${r.fault.index} (rank ${r.fault.rank} @ ${describeTrigger(r.fault.trigger)}${r.fault.attempt > 0 ? ` in attempt ${r.fault.attempt}` : ""})`;
  if (r.hitMs === undefined) return `${head}: ${r.note ?? "did not fire"}`;
  const parts = [`hit at ${secs(r.hitMs)}${r.stepsAtHit === undefined ? "" : ` after ${r.stepsAtHit} step${r.stepsAtHit === 1 ? "" : "s"}`}`];
  const detection = span(r.hitMs, r.detectedMs);
  parts.push(detection === undefined ? "not detected" : `detected in ${detection} ms (${r.cause ?? "exit"})`);
  const restart = span(r.detectedMs, r.upMs);
  if (restart !== undefined) parts.push(`back up ${restart} ms later`);
  const recovery = span(r.detectedMs, r.recoveredMs);
  if (recovery !== undefined) parts.push(`recovered ${recovery} ms after detection`);
  if (r.restoreEpoch !== undefined) {
    const none = r.restoredFromPeers === true ? "restarted from the beginning (no checkpoint yet)" : "restarted from the beginning (no line yet)";
    const back = r.restoredFromPeers === true ? `restored checkpoint ${r.restoreEpoch} from its peers` : `rolled back to line ${r.restoreEpoch}`;
    parts.push(r.wentOn === true ? `the others went back to checkpoint ${r.restoreEpoch} and went on without it` : r.restoreEpoch === 0 ? none : back);
  }
  if (r.workLostSteps !== undefined) parts.push(`${r.workLostSteps} step${r.workLostSteps === 1 ? "" : "s"} redone`);
  if (r.note !== undefined) parts.push(r.note);
  return `${head}: ${parts.join(", ")}`;
}

/** The verdict of one run in one line. */
export function describeVerdict(v: Verdict, size: number): string {
  switch (v.kind) {
    case "identical":
      return `results identical to the reference (${size}/${size} ranks, bit for bit)`;
    case "differs":
      return `RESULTS DIFFER from the reference on rank${v.ranks.length === 1 ? "" : "s"} ${v.ranks.join(", ")}`;
    case "failed":
      return `FAILED: ${v.message}`;
  }
}

/** Short previews of the differing ranks' results, for the failure message. */
export function differenceLines(reference: readonly unknown[], results: readonly unknown[], ranks: readonly number[], max = 4): string[] {
  const out: string[] = [];
  for (const r of ranks.slice(0, max)) {
    out.push(`  rank ${r}: reference ${preview(reference[r])}`);
    out.push(`  ${" ".repeat(String(r).length + 5)}  this run  ${preview(results[r])}`);
  }
  if (ranks.length > max) out.push(`  … and ${ranks.length - max} more rank(s)`);
  return out;
}

function preview(v: unknown): string {
  const text = inspect(v, { depth: 2, breakLength: Infinity, maxArrayLength: 6, maxStringLength: 72, compact: true });
  return text.length > 90 ? `${text.slice(0, 90)}…` : text;
}

export function secs(ms: number): string {
  return `${(ms / 1000).toFixed(2)}s`;
}

// ---- HTML --------------------------------------------------------------------------------

const COLORS = {
  attempt0: "#dbe7f6",
  attemptN: "#d9f0d9",
  step: "#6b7f99",
  checkpoint: "#1f4e8c",
  commit: "#2e8b57",
  fault: "#d62728",
  detection: "#ff9f1c",
  restart: "#9467bd",
  recovery: "#f2d024",
  finalized: "#2ca02c",
  stopped: "#7f7f7f",
} as const;

const LANE_H = 34;
const LEFT = 92;
const PLOT_W = 900;
const RIGHT = 150;
const TOP = 36;
const AXIS_H = 28;

/** Escapes text for HTML and SVG. */
export function esc(text: string): string {
  return text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
}

interface Segment {
  attempt: number;
  from: number;
  /** When the rank called init() (the end of process start-up), if it did. */
  upAt: number | undefined;
  to: number;
  end: "finalized" | "failed" | "stopped" | "running";
}

/** Each rank's process lifetimes (one segment per attempt) from spawn/exit events. */
export function rankSegments(events: readonly RecordedEvent[], size: number, endMs: number): Segment[][] {
  const lanes: Segment[][] = Array.from({ length: size }, () => []);
  const finalized = new Array<boolean>(size).fill(false);
  for (const { t, ev } of events) {
    if (ev.kind === "rank-spawned") {
      finalized[ev.rank] = false;
      lanes[ev.rank]?.push({ attempt: ev.attempt, from: t, upAt: undefined, to: endMs, end: "running" });
    } else if (ev.kind === "rank-up") {
      const seg = lanes[ev.rank]?.at(-1);
      if (seg !== undefined && seg.upAt === undefined) seg.upAt = t;
    } else if (ev.kind === "rank-finalized") {
      finalized[ev.rank] = true;
    } else if (ev.kind === "rank-exited") {
      const seg = lanes[ev.rank]?.at(-1);
      if (seg !== undefined && seg.end === "running") {
        seg.to = t;
        seg.end = finalized[ev.rank] ? "finalized" : ev.killedByLauncher ? "stopped" : "failed";
      }
    }
  }
  return lanes;
}

/** The `--report` page: one SVG time line per run (a lane per rank), then the fault table. */
export function renderHtml(report: DrillReport): string {
  const scaleMs = Math.max(1, ...report.runs.map((r) => Math.max(r.result.wallMs, ...r.events.map((e) => e.t))));
  const refWall = report.runs[0]?.result.ok === true ? report.runs[0].result.wallMs : undefined;
  const runsHtml = report.runs.map((run) => renderRun(run, report.size, scaleMs, refWall)).join("\n");
  const rows = report.runs.flatMap((run) => run.faultReports.map((f) => faultRow(run, f)));
  const runRows = report.runs.map((run) => {
    const verdict = run.verdict === undefined ? (run.result.ok ? "reference" : "reference FAILED") : describeVerdict(run.verdict, report.size);
    const cls = run.verdict === undefined ? "" : run.verdict.kind === "identical" ? "ok" : "bad";
    return `<tr><td>${esc(run.label)}</td><td>${esc(run.mode)}</td><td>${run.seed ?? "—"}</td><td>${secs(run.result.wallMs)}</td><td>${run.result.restarts}</td><td class="${cls}">${esc(verdict)}</td></tr>`;
  });
  return `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>lifeline drill: ${esc(basename(report.app))} — ${report.pass ? "PASS" : "FAIL"}</title>
<style>
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; }
h2 { font-size: 16px; margin: 28px 0 6px; }
.badge { display: inline-block; padding: 2px 10px; border-radius: 4px; color: #fff; font-weight: 600; }
.pass { background: #2ca02c; } .fail { background: #d62728; }
code { background: #f3f3f3; padding: 1px 4px; border-radius: 3px; }
table { border-collapse: collapse; margin-top: 6px; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; font-variant-numeric: tabular-nums; }
th { background: #f3f3f3; }
td.num { text-align: right; }
td.ok { color: #1d7a1d; font-weight: 600; } td.bad { color: #c0392b; font-weight: 600; }
.legend span { display: inline-block; margin-right: 14px; }
.legend i { display: inline-block; width: 14px; height: 10px; margin-right: 4px; vertical-align: middle; border: 1px solid #999; }
svg { display: block; margin-top: 4px; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
.run-title { font-weight: 600; }
</style>
</head>
<body>
<h1>lifeline drill <span class="badge ${report.pass ? "pass" : "fail"}">${report.pass ? "PASS" : "FAIL"}</span></h1>
<div>${esc(report.summary)}</div>
<div style="margin-top:6px"><code>${esc(report.command)}</code></div>
<div style="margin-top:4px">${report.size} rank${report.size === 1 ? "" : "s"} · mode ${esc(report.mode)} · seed ${report.seed}</div>
<h2>Faults</h2>
${
  rows.length === 0
    ? "<p>No faults were injected (the faulty runs re-run the program and compare).</p>"
    : `<table id="faults">
<tr><th>run</th><th>fault</th><th>rank</th><th>trigger</th><th>hit at</th><th>steps done</th><th>detected by</th><th>detection ms</th><th>restart ms</th><th>recovery ms</th><th>rolled back to</th><th>work lost (steps)</th><th>run verdict</th></tr>
${rows.join("\n")}
</table>`
}
<h2>Runs</h2>
<table id="runs">
<tr><th>run</th><th>mode</th><th>seed</th><th>wall time</th><th>restarts</th><th>verdict</th></tr>
${runRows.join("\n")}
</table>
<h2>Time lines</h2>
<div class="legend">
<span><i style="background:repeating-linear-gradient(45deg,#fff 0 2px,#b9c6d6 2px 4px)"></i>process starting (until init())</span>
<span><i style="background:${COLORS.attempt0}"></i>rank running</span>
<span><i style="background:${COLORS.attemptN}"></i>restarted rank running</span>
<span><i style="background:${COLORS.step};width:2px"></i>step (checkpoint() call)</span>
<span><i style="background:${COLORS.checkpoint};width:4px"></i>new epoch (local checkpoint)</span>
<span><i style="background:${COLORS.commit};width:2px"></i>line committed</span>
<span><b style="color:${COLORS.fault}">✕</b> fault hit</span>
<span><i style="background:${COLORS.detection}"></i>until detected</span>
<span><i style="background:${COLORS.restart}"></i>restarting</span>
<span><i style="background:${COLORS.recovery}"></i>redoing lost work</span>
<span><b style="color:${COLORS.finalized}">●</b> finalized</span>
<span><b style="color:${COLORS.stopped}">■</b> stopped by the launcher</span>
</div>
${runsHtml}
</body>
</html>
`;
}

function faultRow(run: DrillRun, f: FaultReport): string {
  const cell = (v: number | undefined): string => `<td class="num">${v === undefined ? "—" : v}</td>`;
  const verdict = run.verdict === undefined ? "" : run.verdict.kind === "identical" ? "identical" : run.verdict.kind === "differs" ? "differs" : "failed";
  const cls = verdict === "identical" ? "ok" : "bad";
  const trigger = f.hitMs === undefined ? `${describeTrigger(f.fault.trigger)} (did not fire)` : describeTrigger(f.fault.trigger);
  const recovery =
    f.recoveredMs === undefined && f.note !== undefined && f.hitMs !== undefined ? `<td>${esc(f.note)}</td>` : cell(span(f.detectedMs, f.recoveredMs));
  return (
    `<tr><td>${esc(run.label)}</td><td>${f.fault.index}</td><td>${f.fault.rank}</td><td>${esc(trigger)}${f.fault.attempt > 0 ? ` (attempt ${f.fault.attempt})` : ""}</td>` +
    `<td class="num">${f.hitMs === undefined ? "—" : secs(f.hitMs)}</td>${cell(f.stepsAtHit)}<td>${esc(f.cause ?? "—")}</td>${cell(span(f.hitMs, f.detectedMs))}` +
    `${cell(span(f.detectedMs, f.upMs))}${recovery}<td>${f.restoreEpoch === undefined ? "—" : f.restoreEpoch === 0 ? "the beginning" : `line ${f.restoreEpoch}`}</td>${cell(f.workLostSteps)}<td class="${cls}">${verdict}</td></tr>`
  );
}

function renderRun(run: DrillRun, size: number, scaleMs: number, referenceWallMs: number | undefined): string {
  const endMs = Math.max(run.result.wallMs, ...run.events.map((e) => e.t));
  const x = (t: number): number => LEFT + (Math.max(0, t) / scaleMs) * PLOT_W;
  const laneY = (rank: number): number => TOP + rank * LANE_H;
  const height = TOP + size * LANE_H + AXIS_H;
  const width = LEFT + PLOT_W + RIGHT;
  const parts: string[] = [];
  const extra =
    referenceWallMs === undefined || run.verdict === undefined
      ? ""
      : ` · wall ${secs(run.result.wallMs)} (${run.result.wallMs >= referenceWallMs ? "+" : "−"}${secs(Math.abs(run.result.wallMs - referenceWallMs))} vs the reference)`;
  const title =
    run.verdict === undefined
      ? `${run.label} (mode ${run.mode}) · wall ${secs(run.result.wallMs)}`
      : `${run.label} (mode ${run.mode}${run.seed === undefined ? "" : `, seed ${run.seed}`}): ${describeVerdict(run.verdict, size)}${extra}`;
  parts.push(
    `<text class="run-title" x="4" y="16" style="font-weight:600;font-size:13px;fill:${run.verdict === undefined || run.verdict.kind === "identical" ? "#222" : COLORS.fault}">${esc(title)}</text>`,
  );

  // Lanes: one row per rank, a bar per attempt.
  const segments = rankSegments(run.events, size, endMs);
  for (let rank = 0; rank < size; rank++) {
    const y = laneY(rank);
    parts.push(`<text x="8" y="${y + LANE_H / 2 + 4}">rank ${rank}</text>`);
    parts.push(`<line x1="${LEFT}" x2="${LEFT + PLOT_W}" y1="${y + LANE_H / 2}" y2="${y + LANE_H / 2}" stroke="#eee"/>`);
    for (const seg of segments[rank] ?? []) {
      const x0 = x(seg.from);
      const w = Math.max(1, x(seg.to) - x0);
      parts.push(
        `<rect x="${f1(x0)}" y="${y + 7}" width="${f1(w)}" height="${LANE_H - 14}" fill="${seg.attempt === 0 ? COLORS.attempt0 : COLORS.attemptN}" stroke="#9fb3c8"><title>rank ${rank}, attempt ${seg.attempt}: ${secs(seg.from)}–${secs(seg.to)} (${seg.end})</title></rect>`,
      );
      // Process start-up (spawn until init()) is hatched: it is not the program's work.
      const upTo = Math.min(seg.upAt ?? seg.to, seg.to);
      if (upTo > seg.from) {
        parts.push(
          `<rect x="${f1(x0)}" y="${y + 7}" width="${f1(Math.max(1, x(upTo) - x0))}" height="${LANE_H - 14}" fill="url(#startup)" stroke="#9fb3c8"><title>rank ${rank}, attempt ${seg.attempt}: starting (${Math.round(upTo - seg.from)} ms until init())</title></rect>`,
        );
      }
      if (seg.end === "finalized")
        parts.push(`<circle cx="${f1(x(seg.to))}" cy="${y + LANE_H / 2}" r="4" fill="${COLORS.finalized}"><title>rank ${rank} finalized</title></circle>`);
      if (seg.end === "stopped")
        parts.push(
          `<rect x="${f1(x(seg.to) - 3)}" y="${y + LANE_H / 2 - 3}" width="6" height="6" fill="${COLORS.stopped}"><title>rank ${rank} stopped by the launcher at ${secs(seg.to)}</title></rect>`,
        );
    }
  }

  // Steps and epochs.
  const epochOf = new Array<number>(size).fill(0);
  for (const { t, ev } of run.events) {
    if (ev.kind !== "rank-step") continue;
    const y = laneY(ev.rank);
    const newEpoch = ev.epoch !== epochOf[ev.rank];
    epochOf[ev.rank] = ev.epoch;
    if (newEpoch) {
      parts.push(
        `<rect x="${f1(x(t) - 1.5)}" y="${y + 3}" width="3" height="${LANE_H - 6}" fill="${COLORS.checkpoint}"><title>rank ${ev.rank}: epoch ${ev.epoch} at step ${ev.steps} (${secs(t)})</title></rect>`,
      );
    } else {
      parts.push(
        `<line x1="${f1(x(t))}" x2="${f1(x(t))}" y1="${y + 9}" y2="${y + LANE_H - 9}" stroke="${COLORS.step}" stroke-width="1"><title>rank ${ev.rank}: ${ev.steps} steps (${secs(t)})</title></line>`,
      );
    }
  }

  // Committed lines: across every lane.
  for (const c of lineCommits(run.events)) {
    parts.push(
      `<line x1="${f1(x(c.t))}" x2="${f1(x(c.t))}" y1="${TOP - 4}" y2="${TOP + size * LANE_H}" stroke="${COLORS.commit}" stroke-width="1.5" stroke-dasharray="4 3"><title>line ${c.epoch} committed at ${secs(c.t)}</title></line>`,
    );
    parts.push(`<text x="${f1(x(c.t) + 2)}" y="${TOP - 6}" style="fill:${COLORS.commit}">L${c.epoch}</text>`);
  }

  // Faults: where each hit, how long until detection, restart and recovery.
  for (const f of run.faultReports) {
    if (f.hitMs === undefined) continue;
    const y = laneY(f.fault.rank);
    const mid = y + LANE_H / 2;
    const band = (from: number | undefined, to: number | undefined, color: string, what: string): void => {
      if (from === undefined || to === undefined) return;
      const w = Math.max(2, x(to) - x(from));
      parts.push(
        `<rect x="${f1(x(from))}" y="${mid - 5}" width="${f1(w)}" height="10" fill="${color}" opacity="0.9"><title>${esc(what)}: ${Math.round(to - from)} ms</title></rect>`,
      );
    };
    band(f.hitMs, f.detectedMs, COLORS.detection, `fault ${f.fault.index}: detection (${f.cause ?? "exit"})`);
    const stop = f.interruptedMs;
    band(f.detectedMs, min(f.upMs, stop), COLORS.restart, `fault ${f.fault.index}: restart`);
    if (stop === undefined || (f.upMs !== undefined && f.upMs < stop)) {
      band(
        f.upMs,
        f.recoveredMs ?? stop,
        COLORS.recovery,
        `fault ${f.fault.index}: redoing ${f.workLostSteps ?? "?"} lost steps${stop === undefined ? "" : " (interrupted by a later fault)"}`,
      );
    }
    const hx = x(f.hitMs);
    parts.push(
      `<g><title>fault ${f.fault.index}: rank ${f.fault.rank} @ ${esc(describeTrigger(f.fault.trigger))}, hit at ${secs(f.hitMs)}</title>` +
        `<line x1="${f1(hx - 6)}" y1="${mid - 6}" x2="${f1(hx + 6)}" y2="${mid + 6}" stroke="${COLORS.fault}" stroke-width="3"/>` +
        `<line x1="${f1(hx - 6)}" y1="${mid + 6}" x2="${f1(hx + 6)}" y2="${mid - 6}" stroke="${COLORS.fault}" stroke-width="3"/></g>`,
    );
    const cost = [
      span(f.hitMs, f.detectedMs) === undefined ? undefined : `det ${span(f.hitMs, f.detectedMs)}ms`,
      span(f.detectedMs, f.recoveredMs) === undefined ? undefined : `rec ${span(f.detectedMs, f.recoveredMs)}ms`,
      f.workLostSteps === undefined ? undefined : `${f.workLostSteps} steps lost`,
    ].filter((s) => s !== undefined);
    const label = `✕${f.fault.index} ${describeTrigger(f.fault.trigger)}${cost.length > 0 ? ` · ${cost.join(" · ")}` : ""}`;
    // A white halo keeps the label legible over the bars it crosses.
    parts.push(
      `<text x="${f1(hx + 8)}" y="${y + 6}" style="fill:${COLORS.fault};font-weight:600;paint-order:stroke;stroke:#fff;stroke-width:3px">${esc(label)}</text>`,
    );
  }

  // Time axis.
  const axisY = TOP + size * LANE_H + 4;
  parts.push(`<line x1="${LEFT}" x2="${LEFT + PLOT_W}" y1="${axisY}" y2="${axisY}" stroke="#999"/>`);
  const tick = niceTick(scaleMs);
  for (let t = 0; t <= scaleMs + 1e-9; t += tick) {
    parts.push(`<line x1="${f1(x(t))}" x2="${f1(x(t))}" y1="${axisY}" y2="${axisY + 4}" stroke="#999"/>`);
    parts.push(
      `<text x="${f1(x(t))}" y="${axisY + 16}" text-anchor="middle">${t >= 1000 || tick >= 1000 ? `${(t / 1000).toFixed(tick < 1000 ? 1 : 0)}s` : `${t}ms`}</text>`,
    );
  }
  parts.push(
    `<line x1="${f1(x(endMs))}" x2="${f1(x(endMs))}" y1="${TOP - 2}" y2="${axisY}" stroke="#555" stroke-dasharray="2 2"><title>run ended at ${secs(endMs)}</title></line>`,
  );
  parts.push(`<text x="${f1(x(endMs) + 4)}" y="${axisY - 4}">end ${secs(endMs)}</text>`);

  return `<section class="run" id="run-${run.index}">
<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" role="img" aria-label="${esc(title)}">
<defs><pattern id="startup" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#fff"/><rect width="3" height="6" fill="#b9c6d6"/></pattern></defs>
${parts.join("\n")}
</svg>
</section>`;
}

/** A round tick interval giving about 8–12 ticks over `spanMs`. */
function niceTick(spanMs: number): number {
  const raw = spanMs / 10;
  const pow = 10 ** Math.floor(Math.log10(Math.max(raw, 1)));
  for (const m of [1, 2, 5, 10]) if (m * pow >= raw) return m * pow;
  return 10 * pow;
}

function min(a: number | undefined, b: number | undefined): number | undefined {
  return a === undefined ? b : b === undefined ? a : Math.min(a, b);
}

function f1(n: number): string {
  return n.toFixed(1);
}

function basename(path: string): string {
  return path.slice(path.lastIndexOf("/") + 1);
}
