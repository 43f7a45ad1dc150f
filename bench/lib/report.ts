/**
 * Result records and the tables printed at the end of a run (Markdown, so they can be pasted
 * into an issue as they are).
 */
import {
  BENCHMARKS,
  describeKind,
  familyModeOf,
  isModeBenchmark,
  STREAM_WINDOW,
  insecureKind,
  type BenchName,
  type Benchmark,
  type JobKind,
  type Unit,
} from "./plan.ts";
import { fmt, fmtRatio } from "./stats.ts";

export interface VariantResult {
  /** Job that measured it, e.g. "lifeline4", "lifeline4-retry-one" or "rawpush4". */
  job: string;
  /** What that job is: "lifeline:<mode>" (mpi-bench.ts under `lifeline run --mode <mode>`) or a raw program. */
  kind: JobKind;
  /** Operations per timed block, from calibration. */
  iters: number;
  /** Calibration probes: [iters, block wall seconds]. */
  calibration: [number, number][];
  /** The untimed warm-up blocks, seconds per operation, in the order they ran (not used in the median). */
  warmupPerOpS: number[];
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
  /** Median garbage-collection pause per operation, summed over processes (us). */
  medianGcUs: number;
  /** Median full (mark-compact) collections per operation, summed over processes. */
  medianMajorGcs: number;
  /** Median over the timed blocks of the processes' mean young-generation size at a block's end (MiB). */
  medianYoungMiB: number;
}

export interface CaseResult {
  key: string;
  bench: Benchmark;
  /** The block the programs ran (retry-one runs allreduce, retry-one-pingpong pingpong, retry-one-stream stream). */
  op: BenchName;
  np: number;
  bytes: number;
  label: string;
  unit: Unit;
  /**
   * The jobs compared, by kind, whether or not they measured: `subject` is the numerator of
   * the ratio (Lifeline under `--mode`; for the retry-one family the retry-one job), `baseline`
   * the denominator (a raw zeromq.js program; for the retry-one family the mode-none Lifeline job), null when
   * the case has none or `--variant` left it out.
   */
  kinds: { subject: JobKind | null; baseline: JobKind | null };
  subject: VariantResult | null;
  baseline: VariantResult | null;
  /** Subject vs baseline: time ratio (us rows) or bandwidth ratio (MB/s rows), of the medians. */
  ratio: number | null;
  /** Quartiles of the per-repetition ratios (repetition k of the subject with repetition k of the baseline). */
  ratioQ1: number | null;
  ratioQ3: number | null;
  /** Open MPI over TCP from bench/peers.json, in `unit`, and the subject's ratio to it (null for the retry-one family). */
  mpiTcp: number | null;
  ratioMpiTcp: number | null;
  /**
   * `met` judges the ratio of the medians; `withinNoise` is true when the interquartile range
   * of the paired ratios reaches across the threshold, i.e. this run cannot tell.
   */
  target: { text: string; bound: number; atMost: boolean; met: boolean | null; withinNoise: boolean | null } | null;
  /** Each prefixed with the variant it concerns: "subject (...)" or "baseline (...)". */
  errors: string[];
}

/** How a benchmark's table names its two variants. */
export interface Columns {
  /** Column headers of the two medians. */
  subject: string;
  baseline: string;
  /** Short names, for the ratio and the paired columns. */
  subjectShort: string;
  baselineShort: string;
  /** Show the Open MPI TCP reference columns. */
  peers: boolean;
}

const LIFELINE_VS_RAW: Columns = { subject: "Lifeline", baseline: "raw", subjectShort: "L", baselineShort: "raw", peers: true };
const RETRY_ONE_VS_NONE: Columns = { subject: "retry-one", baseline: "none", subjectShort: "r1", baselineShort: "none", peers: false };
const CPR_VS_NONE: Columns = { subject: "cpr", baseline: "none", subjectShort: "cpr", baselineShort: "none", peers: false };

const CURVE_VS_INSECURE: Columns = { subject: "CURVE", baseline: "insecure", subjectShort: "C", baselineShort: "ins", peers: false };

/** The columns of a benchmark's table; `baseline`: the kind of job its cases compare with (`--curve`: an insecure Lifeline job). */
export function columnsOf(bench: Benchmark, baseline?: JobKind | null): Columns {
  const family = familyModeOf(bench);
  if (family !== undefined) return family === "cpr" ? CPR_VS_NONE : RETRY_ONE_VS_NONE;
  return baseline !== undefined && baseline !== null && insecureKind(baseline) ? CURVE_VS_INSECURE : LIFELINE_VS_RAW;
}

const PINGPONG_TITLE = "Ping-pong latency, one way = round trip / 2, 2 processes (us)";
const STREAM_TITLE = "Unidirectional streaming bandwidth, 2 processes (MB/s, 1 MB = 1e6 B)";
const ALLREDUCE_TITLE = "Allreduce, Float64Array sum, per op, slowest rank (us)";
/** The title of a mode family's table: its block's, then the two jobs. */
const versusNone = (block: string, mode: string): string => `${block}: Lifeline job under --mode ${mode} vs Lifeline job under --mode none, both in this run`;

const TITLES: Record<Benchmark, string> = {
  pingpong: PINGPONG_TITLE,
  stream: STREAM_TITLE,
  "stream-isend": `Unidirectional streaming bandwidth, 2 processes, Lifeline in windows of ${STREAM_WINDOW} isends then waitAll (MB/s, 1 MB = 1e6 B); raw as in stream`,
  allreduce: `${ALLREDUCE_TITLE}; raw = hand-written ring`,
  bcast: "Bcast from rank 0, per op, slowest rank (us); no raw baseline",
  barrier: "Barrier, per op, slowest rank (us); raw = the hand-written ring's allreduce of 8 B",
  "retry-one": versusNone(ALLREDUCE_TITLE, "retry-one"),
  "retry-one-pingpong": versusNone(PINGPONG_TITLE, "retry-one"),
  "retry-one-stream": versusNone(STREAM_TITLE, "retry-one"),
  cpr: versusNone(ALLREDUCE_TITLE, "cpr with nothing due"),
  "cpr-pingpong": versusNone(PINGPONG_TITLE, "cpr with nothing due"),
  "cpr-stream": versusNone(STREAM_TITLE, "cpr with nothing due"),
};

function row(cells: string[]): string {
  return `| ${cells.join(" | ")} |`;
}

function pct(x: number | undefined): string {
  return x === undefined || !Number.isFinite(x) ? "—" : `${Math.round(x * 100)}%`;
}

export function renderTables(results: readonly CaseResult[], transport: string): string {
  const out: string[] = [];
  for (const bench of BENCHMARKS) {
    const rows = results.filter((r) => r.bench === bench);
    if (rows.length === 0) continue;
    const u = rows[0]!.unit;
    const col = columnsOf(bench, rows[0]!.kinds.baseline);
    const vs = `${col.subjectShort} / ${col.baselineShort}`;
    const ratioHead = `${col.subjectShort}/${col.baselineShort} (${u === "MB/s" ? "MB/s" : "time"}) [IQR]`;
    // A Lifeline job under another mode than none (--mode) says so in the title.
    const modes = [...new Set(rows.map((r) => r.kinds.subject).filter((k): k is JobKind => k !== null && k !== "lifeline:none"))];
    const modeNote = isModeBenchmark(bench) || modes.length === 0 ? "" : `, Lifeline = ${modes.map(describeKind).join(", ")}`;
    const curveNote = col === CURVE_VS_INSECURE ? " — CURVE (the default on tcp) vs the same job under --insecure" : "";
    out.push(`### ${TITLES[bench]} — transport ${transport}${modeNote}${curveNote}`, "");
    const head = ["case", `${col.subject} ${u}`, `${col.baseline} ${u}`, ratioHead];
    if (col.peers) head.push(`Open MPI TCP ${u}`, `${col.subjectShort}/MPI-TCP`);
    head.push(`spread ${vs}`, `CPU us/op ${vs}`, "target", "met");
    out.push(row(head));
    out.push(row(head.map((h, i) => (i === 0 || h === "target" || h === "met" ? "---" : "---:"))));
    for (const r of rows) {
      const iqr = r.ratioQ1 !== null && r.ratioQ3 !== null ? ` [${fmtRatio(r.ratioQ1)}–${fmtRatio(r.ratioQ3)}]` : "";
      const met = r.target === null ? "" : r.target.met === null ? "n/a" : `${r.target.met ? "met" : "NOT met"}${r.target.withinNoise ? "*" : ""}`;
      const cells = [
        r.label,
        r.subject ? fmt(r.subject.value) : r.errors.some((e) => e.startsWith("subject")) ? "error" : "—",
        r.baseline ? fmt(r.baseline.value) : r.errors.some((e) => e.startsWith("baseline")) ? "error" : "—",
        r.ratio === null ? "—" : `${fmtRatio(r.ratio)}${iqr}`,
      ];
      if (col.peers) cells.push(fmt(r.mpiTcp), fmtRatio(r.ratioMpiTcp));
      cells.push(
        `${pct(r.subject?.spread)} / ${pct(r.baseline?.spread)}`,
        `${fmt(r.subject?.medianCpuUs)} / ${fmt(r.baseline?.medianCpuUs)}`,
        r.target?.text ?? "",
        met,
      );
      out.push(row(cells));
    }
    out.push("");
  }
  const errs = results.filter((r) => r.errors.length > 0);
  if (errs.length > 0) {
    out.push("### Errors", "");
    for (const r of errs) for (const e of r.errors) out.push(`- ${r.key}: ${e.split("\n")[0]}`);
    out.push("");
  }
  const met = targetsMet(results);
  if (met !== "") {
    const noisy = results.filter((r) => r.target?.withinNoise === true).length;
    out.push(
      `${met}${noisy > 0 ? ` * = ${noisy} verdict(s) within noise: the interquartile range of the paired ratios reaches across the threshold.` : ""}`,
      "",
    );
  }
  return out.join("\n");
}

/** "Targets met: m of n." over the cases that have a target; "" when none has. */
export function targetsMet(results: readonly CaseResult[]): string {
  const targets = results.filter((r) => r.target !== null);
  if (targets.length === 0) return "";
  return `Targets met: ${targets.filter((r) => r.target!.met === true).length} of ${targets.length}.`;
}
