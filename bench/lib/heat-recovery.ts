/**
 * `npm run bench -- --only heat-recovery`: how long one killed rank of a halo-exchange stencil
 * takes to catch up, retry-one next to cpr (target: retry-one ≤ 0.5× cpr).
 *
 * Goal: the recovery benchmark (bench/lib/recovery.ts) uses a collective-only program built for
 * retry-one; this one asks the same of an ordinary point-to-point program, examples/heat.ts
 * (isend/irecv halo rows, an allreduce of the residual and a checkpoint() every iteration), where
 * retry-one's restarted rank must get the halo messages it lost back from its neighbours' logs.
 *
 * Method: one run = `lifeline drill` in this process (resolveDrillConfig + runDrill, the same path
 * as the CLI): a reference run under mode none, then the faulty run with rank `victim` SIGKILLed
 * at its `killStep`-th checkpoint() call, whose results must be bit-identical to the reference's
 * (anything else is an error, not a figure). The drill's fault report (src/launch/drill-report.ts)
 * gives, on the launcher's clock, hitMs (the rank's own wall-clock stamp of its death), detectedMs
 * (the launcher saw it exit), upMs (the restarted rank called init()) and recoveredMs (retry-one:
 * the launcher's `rank-caught-up`, the restarted rank works with the others again; cpr: the
 * restarted victim's first step report at or past the step it died in). The figure is
 * recoveredMs − hitMs, split into detect (→ detected), restart (→ up) and catch up (→ recovered:
 * restore, re-execution, for cpr also the other ranks' restart and rendezvous). retry-one's end
 * is exact (the event is sent when it happens), cpr's is not: a rank reports its step count at
 * most every 200 ms (at once only when it joins a new line), so the report that first shows
 * the victim past the kill point can come up to 200 ms after it got there. The table therefore
 * also gives, for cpr, the earliest it can have got there: the victim's last step report still
 * short of the kill point (`totalLowMs`); the ratio is shown on both, the target judged on the
 * drill's figure.
 *
 * Each run gets a fresh scratch directory under the harness's temp dir, used as the launcher's
 * cwd and as the root of the drill's per-run stores (cpr's lines, retry-one's durable floor at its
 * default, every 200th checkpoint): nothing lands in the repository. The modes alternate (retry-one
 * first in even rounds, cpr first in odd ones) so that a burst of other load hits both.
 *
 * @example
 * const r = await heatRecoveryRun({ root, scratch: tmp, config: HEAT_RECOVERY_FULL, mode: "retry-one", round: 0 });
 * process.stdout.write(renderHeatRecoveryTable([r], [], HEAT_RECOVERY_FULL));
 */
import { mkdtempSync, rmSync } from "node:fs";
import path from "node:path";
import { resolveDrillConfig, runDrill } from "../../src/launch/drill.ts";
import { median } from "./stats.ts";

/** What runs: the heat program's size, the fault, and cpr's line interval. */
export interface HeatRecoveryConfig {
  readonly np: number;
  readonly rows: number;
  readonly cols: number;
  readonly iters: number;
  /** Rank killed, and the checkpoint() call (1-based) it dies at. */
  readonly victim: number;
  readonly killStep: number;
  /** cpr's `--checkpoint-every` (a step count keeps the lost work the same in every run). */
  readonly cprCheckpointEvery: string;
}

/**
 * 512×512 on 4 ranks: 128 rows of 512 cells per rank, ~2.5 ms per iteration under mode none on
 * the project's 2-core machines (sweep, two halo rows each way, allreduce), so the job runs for
 * about a second before the kill and recovery is not lost in start-up. The kill at step 200 is
 * half way, and on a multiple of cpr's line interval (10 steps: a line every ~25-50 ms), so cpr
 * rolls back to the last committed line (~10 steps or a little more, a line taking a few steps
 * to commit) and retry-one to the victim's checkpoint of step 199.
 */
export const HEAT_RECOVERY_FULL: HeatRecoveryConfig = { np: 4, rows: 512, cols: 512, iters: 400, victim: 1, killStep: 200, cprCheckpointEvery: "10steps" };
/** `--quick`: the same shape, smaller and shorter (a smoke run, not a figure to quote). */
export const HEAT_RECOVERY_QUICK: HeatRecoveryConfig = { np: 4, rows: 128, cols: 128, iters: 60, victim: 1, killStep: 30, cprCheckpointEvery: "10steps" };

export type HeatRecoveryMode = "retry-one" | "cpr";

/** One faulty run's recovery, ms on the launcher's clock. */
export interface HeatRecoveryRun {
  readonly mode: HeatRecoveryMode;
  /** 0-based round: the modes run once per round, alternating which goes first. */
  readonly round: number;
  /** Kill → caught up (recoveredMs − hitMs). */
  readonly totalMs: number;
  /** Kill → the launcher saw the exit. */
  readonly detectMs: number;
  /** → the restarted victim called init() (back-off, spare or new process; cpr: survivors stopped first). */
  readonly restartMs: number;
  /** → caught up (restore, re-execution; cpr: also the rendezvous of every rank). */
  readonly catchUpMs: number;
  /**
   * Kill → the earliest the victim can have caught up: retry-one, = totalMs (its event is
   * exact); cpr, its last step report after the restart still short of the kill point (or its
   * rank-up if none), since step reports are throttled to one per 200 ms.
   */
  readonly totalLowMs: number;
  /** Checkpoint (retry-one: version; cpr: line epoch) the victim restored. */
  readonly restoreEpoch: number | undefined;
  /** Steps done again: steps at the kill minus the steps the restored state held. */
  readonly workLostSteps: number | undefined;
  /** Restarts the launcher counted (retry-one: of the rank; cpr: of the job). */
  readonly restarts: number;
  /** Whole faulty run and reference run, launch to exit. */
  readonly faultyWallMs: number;
  readonly referenceWallMs: number;
}

/** Collects what the drill writes (kept for error messages only). */
class Sink {
  text = "";
  write(chunk: string): boolean {
    this.text += chunk;
    if (this.text.length > 200_000) this.text = this.text.slice(-100_000);
    return true;
  }
}

/**
 * One drill of examples/heat.ts in `mode` with the victim killed; throws unless the faulty run's
 * results are identical to the reference run's and every part of the recovery was seen.
 */
export async function heatRecoveryRun(o: {
  root: string;
  scratch: string;
  config: HeatRecoveryConfig;
  mode: HeatRecoveryMode;
  round: number;
}): Promise<HeatRecoveryRun> {
  const c = o.config;
  const cwd = mkdtempSync(path.join(o.scratch, `heat-${o.mode}-${o.round}-`));
  const out = new Sink();
  try {
    const config = resolveDrillConfig(
      {
        np: String(c.np),
        mode: o.mode,
        ...(o.mode === "cpr" ? { checkpointEvery: c.cprCheckpointEvery } : {}),
        kill: [`${c.victim}@step:${c.killStep}`],
        seed: "1",
        store: cwd, // the root of each run's fresh store (src/launch/drill.ts)
        app: path.join(o.root, "examples", "heat.ts"),
        appArgs: ["--rows", String(c.rows), "--cols", String(c.cols), "--iters", String(c.iters), "--tol", "0"],
      },
      { cwd, command: `lifeline drill -n ${c.np} --mode ${o.mode} --kill ${c.victim}@step:${c.killStep} examples/heat.ts` },
    );
    const outcome = await runDrill(config, { stdout: new Sink(), stderr: out, env: process.env, handleSignals: false });
    const tail = (): string =>
      out.text
        .trimEnd()
        .split("\n")
        .slice(-12)
        .map((l) => `    ${l}`)
        .join("\n");
    const fail = (what: string): never => {
      throw new Error(`heat-recovery ${o.mode} round ${o.round + 1}: ${what}\n${tail()}`);
    };
    const [reference, faulty] = outcome.report.runs;
    if (faulty === undefined || reference === undefined) return fail(outcome.report.summary);
    const v = faulty.verdict;
    if (v?.kind !== "identical") {
      return fail(
        `verdict ${v === undefined ? "none" : v.kind === "differs" ? `results differ on ranks ${v.ranks.join(", ")}` : `failed: ${v.message.split("\n")[0]}`}`,
      );
    }
    const f = faulty.faultReports[0];
    if (f === undefined) return fail("no fault report");
    const { hitMs, detectedMs, upMs, recoveredMs } = f;
    if (hitMs === undefined || detectedMs === undefined || upMs === undefined || recoveredMs === undefined) {
      return fail(`incomplete fault report: hit ${hitMs}, detected ${detectedMs}, up ${upMs}, recovered ${recoveredMs}${f.note ? ` (${f.note})` : ""}`);
    }
    // cpr: between the last report short of the kill point and the first past it.
    let lowMs = recoveredMs;
    if (o.mode === "cpr") {
      lowMs = upMs;
      for (const { t, ev } of faulty.events) if (ev.kind === "rank-step" && ev.rank === c.victim && t > upMs && t < recoveredMs) lowMs = Math.max(lowMs, t);
    }
    return {
      mode: o.mode,
      round: o.round,
      totalMs: recoveredMs - hitMs,
      totalLowMs: lowMs - hitMs,
      detectMs: detectedMs - hitMs,
      restartMs: upMs - detectedMs,
      catchUpMs: recoveredMs - upMs,
      restoreEpoch: f.restoreEpoch,
      workLostSteps: f.workLostSteps,
      restarts: faulty.result.restarts,
      faultyWallMs: faulty.result.wallMs,
      referenceWallMs: reference.result.wallMs,
    };
  } finally {
    rmSync(cwd, { recursive: true, force: true });
  }
}

/** Target: retry-one's kill → caught up at most this fraction of cpr's (medians). */
export const HEAT_RECOVERY_TARGET = 0.5;

/**
 * Median totals per mode and their ratio retry-one / cpr (null without both), on the drill's
 * figures (`ratio`, the one judged) and with cpr's earliest possible catch-up (`ratioLow`).
 */
export function heatRecoveryRatio(runs: readonly HeatRecoveryRun[]): {
  retryOneMs: number | null;
  cprMs: number | null;
  cprLowMs: number | null;
  ratio: number | null;
  ratioLow: number | null;
} {
  const med = (mode: HeatRecoveryMode, k: "totalMs" | "totalLowMs"): number | null => {
    const xs = runs.filter((r) => r.mode === mode).map((r) => r[k]);
    return xs.length === 0 ? null : median(xs);
  };
  const retryOneMs = med("retry-one", "totalMs");
  const cprMs = med("cpr", "totalMs");
  const cprLowMs = med("cpr", "totalLowMs");
  const div = (a: number | null, b: number | null): number | null => (a === null || b === null || b <= 0 ? null : a / b);
  return { retryOneMs, cprMs, cprLowMs, ratio: div(retryOneMs, cprMs), ratioLow: div(retryOneMs, cprLowMs) };
}

/** Markdown: one row per mode (medians, seconds), one per failed run, then the ratio and target. */
export function renderHeatRecoveryTable(
  runs: readonly HeatRecoveryRun[],
  errors: readonly { mode: HeatRecoveryMode; round: number; message: string }[],
  c: HeatRecoveryConfig,
): string {
  const lines = [
    `### Recovery of one killed rank in examples/heat.ts: ${c.np} ranks, ${c.rows}x${c.cols}, ${c.iters} iterations, rank ${c.victim} killed at its ${c.killStep}th checkpoint(); lifeline drill, retry-one vs cpr --checkpoint-every ${c.cprCheckpointEvery} (median; seconds)`,
    "",
    "| mode | runs | restarted | detect | restart (→ rank up) | catch up (→ past the kill) | total: kill → caught up | earliest possible | steps redone | restored (line/version) | verdict |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
  ];
  const s = (ms: number): string => (ms / 1000).toFixed(3);
  for (const mode of ["retry-one", "cpr"] as const) {
    const rs = runs.filter((r) => r.mode === mode);
    if (rs.length === 0) continue;
    const m = (k: "detectMs" | "restartMs" | "catchUpMs" | "totalMs" | "totalLowMs"): string => s(median(rs.map((x) => x[k])));
    const lost = rs.map((r) => r.workLostSteps).filter((x): x is number => x !== undefined);
    lines.push(
      `| ${mode === "cpr" ? `cpr --checkpoint-every ${c.cprCheckpointEvery}` : "retry-one"} | ${rs.length} | ${mode === "cpr" ? `all ${c.np}` : "1 rank"} | ${m("detectMs")} | ${m("restartMs")} | ${m("catchUpMs")} | ${m("totalMs")} | ${m("totalLowMs")} | ${lost.length === 0 ? "—" : median(lost)} | ${rs.map((r) => r.restoreEpoch ?? "?").join(", ")} | identical |`,
    );
  }
  for (const e of errors) lines.push(`| ${e.mode} (round ${e.round + 1}) | error | | | | | | | | | ${e.message.split("\n")[0]!.replaceAll("|", "/")} |`);
  const { retryOneMs, cprMs, cprLowMs, ratio, ratioLow } = heatRecoveryRatio(runs);
  lines.push("");
  if (ratio !== null) {
    lines.push(
      `Ratio retry-one / cpr (kill → caught up, medians ${s(retryOneMs!)} s / ${s(cprMs!)} s): ${ratio.toFixed(2)}x; target <= ${HEAT_RECOVERY_TARGET}x: ${ratio <= HEAT_RECOVERY_TARGET ? "met" : "NOT met"}` +
        ` (with cpr's earliest possible catch-up, ${s(cprLowMs!)} s: ${ratioLow!.toFixed(2)}x, ${ratioLow! <= HEAT_RECOVERY_TARGET ? "met" : "NOT met"}).`,
      "",
    );
  } else {
    lines.push(`Ratio retry-one / cpr: n/a (a mode has no successful run); target <= ${HEAT_RECOVERY_TARGET}x: n/a.`, "");
  }
  return lines.join("\n");
}
