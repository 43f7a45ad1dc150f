/**
 * Result records and the tables printed at the end of a run (Markdown, so they can be pasted
 * into an issue as they are).
 */
import { BENCH_NAMES, type BenchName, type Unit } from "./plan.ts";
import { fmt, fmtRatio } from "./stats.ts";

export interface VariantResult {
  /** Job that measured it, e.g. "lifeline4" or "rawpush4". */
  job: string;
  /** Operations per timed block, from calibration. */
  iters: number;
  /** Calibration probes: [iters, block wall seconds]. */
  calibration: [number, number][];
  /** The warm-up block, seconds per operation (not used in the median). */
  warmupPerOpS: number;
  /** Timed repetitions, seconds per operation, in the order they ran. */
  perOpS: number[];
  medianPerOpS: number;
  /** The median in the table's unit (us or MB/s). */
  value: number;
  /** (max - min) / median over the repetitions. */
  spread: number;
  /** CPU seconds per operation, summed over the job's processes, per repetition. */
  cpuPerOpS: number[];
  /** Their median, in microseconds. */
  medianCpuUs: number;
  /** Median main-thread event-loop-active time per operation, summed over processes (us). */
  medianLoopUs: number;
  /** Median minor page faults per operation, summed over processes (fresh memory touched). */
  medianMinorFaults: number;
}

export interface CaseResult {
  key: string;
  bench: BenchName;
  np: number;
  bytes: number;
  label: string;
  unit: Unit;
  lifeline: VariantResult | null;
  raw: VariantResult | null;
  /** Lifeline vs raw: time ratio (us rows) or bandwidth ratio (MB/s rows), of the medians. */
  ratio: number | null;
  /** Quartiles of the per-repetition ratios (repetition k of Lifeline with repetition k of raw). */
  ratioQ1: number | null;
  ratioQ3: number | null;
  /** Open MPI over TCP from bench/peers.json, in `unit`, and Lifeline's ratio to it. */
  mpiTcp: number | null;
  ratioMpiTcp: number | null;
  /**
   * `met` judges the ratio of the medians; `withinNoise` is true when the interquartile range
   * of the paired ratios reaches across the threshold, i.e. this run cannot tell.
   */
  target: { text: string; met: boolean | null; withinNoise: boolean | null } | null;
  errors: string[];
}

const TITLES: Record<BenchName, string> = {
  pingpong: "Ping-pong latency, one way = round trip / 2, 2 processes (us)",
  stream: "Unidirectional streaming bandwidth, 2 processes (MB/s, 1 MB = 1e6 B)",
  allreduce: "Allreduce, Float64Array sum, per op, slowest rank (us); raw = hand-written ring",
  bcast: "Bcast from rank 0, per op, slowest rank (us); no raw baseline",
  barrier: "Barrier, per op, slowest rank (us); no raw baseline",
};

function row(cells: string[]): string {
  return `| ${cells.join(" | ")} |`;
}

function pct(x: number | undefined): string {
  return x === undefined || !Number.isFinite(x) ? "—" : `${Math.round(x * 100)}%`;
}

export function renderTables(results: readonly CaseResult[], transport: string): string {
  const out: string[] = [];
  for (const bench of BENCH_NAMES) {
    const rows = results.filter((r) => r.bench === bench);
    if (rows.length === 0) continue;
    const u = rows[0]!.unit;
    const ratioHead = u === "MB/s" ? "L/raw (MB/s) [IQR]" : "L/raw (time) [IQR]";
    out.push(`### ${TITLES[bench]} — transport ${transport}`, "");
    out.push(row(["case", `Lifeline ${u}`, `raw ${u}`, ratioHead, `Open MPI TCP ${u}`, "L/MPI-TCP", "spread L / raw", "CPU us/op L / raw", "target", "met"]));
    out.push(row(["---", "---:", "---:", "---:", "---:", "---:", "---:", "---:", "---", "---"]));
    for (const r of rows) {
      const iqr = r.ratioQ1 !== null && r.ratioQ3 !== null ? ` [${fmtRatio(r.ratioQ1)}–${fmtRatio(r.ratioQ3)}]` : "";
      const met = r.target === null ? "" : r.target.met === null ? "n/a" : `${r.target.met ? "met" : "NOT met"}${r.target.withinNoise ? "*" : ""}`;
      out.push(row([
        r.label,
        r.lifeline ? fmt(r.lifeline.value) : r.errors.some((e) => e.startsWith("lifeline")) ? "error" : "—",
        r.raw ? fmt(r.raw.value) : r.errors.some((e) => e.startsWith("raw")) ? "error" : "—",
        r.ratio === null ? "—" : `${fmtRatio(r.ratio)}${iqr}`,
        fmt(r.mpiTcp),
        fmtRatio(r.ratioMpiTcp),
        `${pct(r.lifeline?.spread)} / ${pct(r.raw?.spread)}`,
        `${fmt(r.lifeline?.medianCpuUs)} / ${fmt(r.raw?.medianCpuUs)}`,
        r.target?.text ?? "",
        met,
      ]));
    }
    out.push("");
  }
  const errs = results.filter((r) => r.errors.length > 0);
  if (errs.length > 0) {
    out.push("### Errors", "");
    for (const r of errs) for (const e of r.errors) out.push(`- ${r.key}: ${e.split("\n")[0]}`);
    out.push("");
  }
  const targets = results.filter((r) => r.target !== null);
  if (targets.length > 0) {
    const met = targets.filter((r) => r.target!.met === true).length;
    const noisy = targets.filter((r) => r.target!.withinNoise === true).length;
    out.push(`Targets met: ${met} of ${targets.length}.${noisy > 0 ? ` * = ${noisy} verdict(s) within noise: the interquartile range of the paired L/raw ratios reaches across the threshold.` : ""}`, "");
  }
  return out.join("\n");
}
