/**
 * Draws a JSON report of `npm run bench` again (bench/lib/chart.ts): the ratios of its cases
 * against their targets, as the run itself drew them beside its JSON. For reports older than
 * the picture, whose targets lack their bounds, the bounds come from today's targets.
 *
 *   node --import tsx bench/tools/chart.ts bench/results/<run>.json [out.svg]
 */
import { readFileSync, writeFileSync } from "node:fs";
import { chartPathFor, renderChart } from "../lib/chart.ts";
import { targetFor } from "../lib/plan.ts";
import type { CaseResult } from "../lib/report.ts";

const [input, output] = process.argv.slice(2);
if (input === undefined) {
  process.stderr.write("usage: node --import tsx bench/tools/chart.ts <report.json> [out.svg]\n");
  process.exit(2);
}
interface Report {
  commit?: string | null;
  startedAt?: string;
  options?: { transport?: string; curve?: boolean };
  machine?: { cpus?: number };
  results?: CaseResult[];
}
let report: Report;
try {
  report = JSON.parse(readFileSync(input, "utf8")) as Report;
} catch (err) {
  process.stderr.write(`chart: cannot read ${input} as a bench report: ${(err as Error).message}\n`);
  process.exit(1);
}
if (!Array.isArray(report.results)) {
  process.stderr.write(`chart: ${input} has no results: is it a JSON report of npm run bench?\n`);
  process.exit(1);
}
const results = report.results.map((r): CaseResult => {
  if (r.target === null || typeof r.target.bound === "number") return r;
  const t = targetFor({ bench: r.bench, np: r.np, bytes: r.bytes, label: r.label }, report.options?.curve === true);
  return t === undefined ? r : { ...r, target: { ...r.target, bound: t.bound, atMost: t.atMost } };
});
const out = output ?? chartPathFor(input);
const when = report.startedAt === undefined ? "" : `, ${report.startedAt.slice(0, 16).replace("T", " ")} UTC`;
writeFileSync(
  out,
  renderChart(results, {
    title: `npm run bench, ${input.split("/").pop()}`,
    note: `at ${report.commit ?? "(unknown commit)"}${when}; transport ${report.options?.transport ?? "?"}, ${report.machine?.cpus ?? "?"} CPUs`,
  }),
);
process.stdout.write(`${out}\n`);
