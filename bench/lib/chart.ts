/**
 * The picture of a run: every case's ratio to its baseline (the ratio of the medians as a dot,
 * and the interquartile range of the paired ratios as a bar) against its target, one row per
 * case, on one log scale around 1x, as a self-contained SVG. `npm run bench` writes it next to
 * the JSON report.
 *
 * Each row shades the side of its target that meets it: the left for times (Lifeline's time
 * over the baseline's, lower is better), the right for bandwidths (higher is better). The dot
 * is green when the target is met and red when it is missed, hollow (and its verdict marked
 * `?`) when the run cannot tell: the interquartile range reaches across the target. Cases
 * without a target are grey.
 *
 * @example
 * writeFileSync("run.svg", renderChart(results, { title: "npm run bench at 6cbf7f2", note: "ipc, 2 cores" }));
 */
import { BENCHMARKS, type Benchmark } from "./plan.ts";
import { columnsOf, targetsMet, type CaseResult } from "./report.ts";
import { fmtRatio } from "./stats.ts";

/** What each benchmark's rows are called in the picture. */
const NAMES: Record<Benchmark, string> = {
  pingpong: "ping-pong",
  stream: "stream",
  "stream-isend": "stream, isend windows",
  allreduce: "allreduce",
  bcast: "bcast",
  barrier: "barrier",
  "retry-one": "retry-one allreduce",
  "retry-one-pingpong": "retry-one ping-pong",
  "retry-one-stream": "retry-one stream",
  cpr: "cpr allreduce",
  "cpr-pingpong": "cpr ping-pong",
  "cpr-stream": "cpr stream",
};

const W = 900;
const LABEL_X = 12;
const PLOT_LEFT = 250;
const PLOT_RIGHT = 700;
const VALUE_X = 712;
const ROW_H = 22;
const GROUP_H = 26;
const TOP = 64;
/** The widest scale: a ratio outside is pinned to its edge (its text stays exact). */
const SCALE_MIN = 1 / 16;
const SCALE_MAX = 16;

const GREEN = "#2e8b57";
const RED = "#c0392b";
const GREY = "#8a8a8a";
const BAND = "#e3f3e8";

function esc(s: string): string {
  return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
}

const num = (x: number): string => (Math.round(x * 10) / 10).toString();

export interface ChartOptions {
  /** First line, e.g. the command and the commit. */
  title: string;
  /** Second line, e.g. transport, machine and load. */
  note?: string;
}

/** The cases drawn: those with a ratio, grouped by benchmark in the tables' order. */
function rowsOf(results: readonly CaseResult[]): { bench: Benchmark; rows: CaseResult[] }[] {
  const groups: { bench: Benchmark; rows: CaseResult[] }[] = [];
  for (const bench of BENCHMARKS) {
    const rows = results.filter((r) => r.bench === bench && r.ratio !== null && Number.isFinite(r.ratio) && r.ratio > 0);
    if (rows.length > 0) groups.push({ bench, rows });
  }
  return groups;
}

/** The verdict a row's dot shows. */
export function verdictOf(r: CaseResult): "met" | "missed" | "unclear" | "none" {
  const t = r.target;
  if (t === null || t.met === null) return "none";
  if (t.withinNoise === true) return "unclear";
  return t.met ? "met" : "missed";
}

/**
 * Where the picture of a report goes: beside it, `.svg` for its `.json` (or appended).
 *
 * @example
 * chartPathFor("bench/results/2026-11-30T12-00-00-000Z.json"); // → "bench/results/2026-11-30T12-00-00-000Z.svg"
 */
export function chartPathFor(reportPath: string): string {
  return `${reportPath.replace(/\.json$/, "")}.svg`;
}

/** An SVG of `results` (see the file comment); a picture with a line saying so when no case has a ratio. */
export function renderChart(results: readonly CaseResult[], opts: ChartOptions): string {
  const groups = rowsOf(results);
  const nRows = groups.reduce((n, g) => n + g.rows.length, 0);
  const rowsBottom = TOP + groups.length * GROUP_H + nRows * ROW_H;
  const height = rowsBottom + 68;
  // The scale: powers of two around every median, quartile and bound, at least 1/2x to 2x.
  let minR = 0.5;
  let maxR = 2;
  for (const g of groups)
    for (const r of g.rows)
      for (const v of [r.ratio, r.ratioQ1, r.ratioQ3, r.target?.bound]) {
        if (typeof v !== "number" || !(v > 0) || !Number.isFinite(v)) continue;
        minR = Math.min(minR, v);
        maxR = Math.max(maxR, v);
      }
  const kLo = Math.max(Math.log2(SCALE_MIN), Math.floor(Math.log2(minR)));
  const kHi = Math.min(Math.log2(SCALE_MAX), Math.ceil(Math.log2(maxR)));
  const lo = kLo * Math.LN2;
  const hi = kHi * Math.LN2;
  const x = (ratio: number): number => {
    const r = Math.min(2 ** kHi, Math.max(2 ** kLo, ratio));
    return PLOT_LEFT + ((Math.log(r) - lo) / (hi - lo)) * (PLOT_RIGHT - PLOT_LEFT);
  };
  const out: string[] = [];
  out.push(
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${height}" viewBox="0 0 ${W} ${height}" font-family="sans-serif" font-size="12">`,
    `<rect width="${W}" height="${height}" fill="#ffffff"/>`,
    `<text x="${LABEL_X}" y="22" font-size="15" font-weight="bold">${esc(opts.title)}</text>`,
  );
  if (opts.note !== undefined) out.push(`<text x="${LABEL_X}" y="40" fill="#444">${esc(opts.note)}</text>`);
  if (nRows === 0) {
    out.push(`<text x="${LABEL_X}" y="${TOP + 14}">No case of this run has a ratio to draw.</text>`, "</svg>");
    return out.join("\n");
  }
  const plotTop = TOP - 8;
  const plotBottom = rowsBottom + 4;
  // The scale: grid lines at powers of two, 1x stronger.
  for (let k = kLo; k <= kHi; k++) {
    const r = 2 ** k;
    const gx = num(x(r));
    out.push(`<line x1="${gx}" y1="${plotTop}" x2="${gx}" y2="${plotBottom}" stroke="${k === 0 ? "#555" : "#ddd"}" stroke-width="${k === 0 ? 1.2 : 1}"/>`);
    out.push(`<text x="${gx}" y="${plotBottom + 16}" text-anchor="middle" fill="#444">${esc(fmtScale(r))}</text>`);
  }
  let y = TOP;
  for (const g of groups) {
    const col = columnsOf(g.bench, g.rows[0]!.kinds.baseline);
    const unit = g.rows[0]!.unit === "MB/s" ? "bandwidth, higher is better" : "time, lower is better";
    out.push(`<text x="${LABEL_X}" y="${y + 17}" font-weight="bold">${esc(`${NAMES[g.bench]}: ${col.subject} / ${col.baseline} (${unit})`)}</text>`);
    y += GROUP_H;
    for (const r of g.rows) {
      const mid = y + ROW_H / 2;
      const t = r.target;
      if (t !== null) {
        // The side of the target that meets it.
        const bx = x(t.bound);
        const [from, to] = t.atMost ? [PLOT_LEFT, bx] : [bx, PLOT_RIGHT];
        out.push(`<rect x="${num(from)}" y="${num(y + 3)}" width="${num(to - from)}" height="${ROW_H - 6}" fill="${BAND}"/>`);
        out.push(`<line x1="${num(bx)}" y1="${num(y + 2)}" x2="${num(bx)}" y2="${num(y + ROW_H - 2)}" stroke="${GREEN}" stroke-width="2"/>`);
      }
      out.push(`<text x="${LABEL_X + 10}" y="${num(mid + 4)}">${esc(r.label)}</text>`);
      if (r.ratioQ1 !== null && r.ratioQ3 !== null) {
        const [a, b] = [x(Math.min(r.ratioQ1, r.ratioQ3)), x(Math.max(r.ratioQ1, r.ratioQ3))];
        out.push(
          `<line x1="${num(a)}" y1="${num(mid)}" x2="${num(Math.max(b, a + 1))}" y2="${num(mid)}" stroke="#555" stroke-width="3" stroke-linecap="round"/>`,
        );
      }
      const v = verdictOf(r);
      const colour = v === "none" ? GREY : t!.met ? GREEN : RED;
      out.push(
        `<circle cx="${num(x(r.ratio!))}" cy="${num(mid)}" r="5" fill="${v === "unclear" ? "#ffffff" : colour}" stroke="${colour}" stroke-width="2" class="${v}"/>`,
      );
      const goal = t === null ? "" : ` (${t.atMost ? "≤" : "≥"} ${fmtRatio(t.bound)})`;
      const verdict = v === "none" ? "" : `${t!.met ? " met" : " missed"}${v === "unclear" ? "?" : ""}`;
      out.push(`<text x="${VALUE_X}" y="${num(mid + 4)}" fill="${v === "missed" ? RED : "#222"}">${esc(`${fmtRatio(r.ratio)}${goal}${verdict}`)}</text>`);
      y += ROW_H;
    }
  }
  out.push(
    `<text x="${LABEL_X}" y="${height - 24}" fill="#444">${esc("Dot: the ratio of the medians. Bar: the interquartile range of the paired ratios (block k of one job with block k of the other).")}</text>`,
    `<text x="${LABEL_X}" y="${height - 8}" fill="#444">${esc(`Green band: where the target is met. Hollow dot and ?: this run cannot tell. ${targetsMet(results)}`)}</text>`,
    "</svg>",
  );
  return out.join("\n");
}

function fmtScale(r: number): string {
  return r >= 1 ? `${r}x` : `1/${1 / r}x`;
}
