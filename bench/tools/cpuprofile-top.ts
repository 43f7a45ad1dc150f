/**
 * Summarizes V8 CPU profiles (from `npm run bench -- --cpu-prof <dir>`): where a process's
 * busy time went, by area (Lifeline, zeromq.js, the bench program, Node internals, GC) and by
 * function (self time), so that Lifeline's per-message overhead can be read off.
 *
 *   node --import tsx bench/tools/cpuprofile-top.ts [--top 25] [--last-s S] <file.cpuprofile>...
 */
import { readFileSync } from "node:fs";
import path from "node:path";

interface CallFrame {
  functionName: string;
  url: string;
  lineNumber: number;
}
interface ProfileNode {
  id: number;
  callFrame: CallFrame;
  children?: number[];
}
interface Profile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
  startTime: number;
  endTime: number;
}

function area(cf: CallFrame): string {
  const u = cf.url;
  if (cf.functionName === "(idle)") return "idle";
  if (cf.functionName === "(garbage collector)") return "gc";
  if (cf.functionName === "(program)") return "program (native, unattributed)";
  if (u.includes("/node_modules/zeromq/")) return "zeromq.js";
  if (u.includes("/node_modules/msgpackr/")) return "msgpackr";
  if (u.includes("/node_modules/")) return "other node_modules";
  if (u.includes("/dist/") || u.includes("/src/")) return "lifeline";
  if (u.includes("/bench/")) return "bench program";
  if (u.startsWith("node:") || u === "") return "node internals / native";
  return "other";
}

function label(cf: CallFrame): string {
  const file = cf.url === "" ? "" : ` ${path.basename(cf.url.replace(/^file:\/\//, ""))}:${cf.lineNumber + 1}`;
  return `${cf.functionName || "(anonymous)"}${file}`;
}

function summarize(file: string, top: number, lastS: number | undefined): void {
  const p = JSON.parse(readFileSync(file, "utf8")) as Profile;
  const byId = new Map<number, ProfileNode>(p.nodes.map((n) => [n.id, n]));
  const fromUs = lastS === undefined ? p.startTime : Math.max(p.startTime, p.endTime - lastS * 1e6);
  const self = new Map<number, number>();
  // A sample's time delta is the time since the one before: each sample stands for that much.
  let t = p.startTime;
  for (let i = 0; i < p.samples.length; i++) {
    const dt = p.timeDeltas[i] ?? 0;
    t += dt;
    if (t < fromUs) continue;
    const id = p.samples[i]!;
    self.set(id, (self.get(id) ?? 0) + dt);
  }
  const totalUs = p.endTime - fromUs;
  const areas = new Map<string, number>();
  const fns = new Map<string, number>();
  for (const [id, us] of self) {
    const cf = byId.get(id)!.callFrame;
    areas.set(area(cf), (areas.get(area(cf)) ?? 0) + us);
    if (area(cf) !== "idle") fns.set(label(cf), (fns.get(label(cf)) ?? 0) + us);
  }
  const busyUs = totalUs - (areas.get("idle") ?? 0);
  process.stdout.write(
    `\n== ${path.basename(file)}: ${(totalUs / 1e6).toFixed(2)} s profiled${lastS === undefined ? "" : " (its last)"}, main thread busy ${(busyUs / 1e6).toFixed(2)} s (${((100 * busyUs) / totalUs).toFixed(0)}%)\n`,
  );
  process.stdout.write("  by area (self time, share of busy):\n");
  for (const [a, us] of [...areas].filter(([a]) => a !== "idle").sort((x, y) => y[1] - x[1])) {
    process.stdout.write(`    ${a.padEnd(32)} ${(us / 1000).toFixed(0).padStart(8)} ms  ${((100 * us) / busyUs).toFixed(1).padStart(5)}%\n`);
  }
  process.stdout.write(`  top ${top} functions (self time):\n`);
  for (const [f, us] of [...fns].sort((x, y) => y[1] - x[1]).slice(0, top)) {
    process.stdout.write(`    ${(us / 1000).toFixed(1).padStart(8)} ms  ${((100 * us) / busyUs).toFixed(1).padStart(5)}%  ${f}\n`);
  }
}

const argv = process.argv.slice(2);
// Piped into \`head\`: stop quietly once the reader has gone.
process.stdout.on("error", (err: NodeJS.ErrnoException) => {
  if (err.code !== "EPIPE") throw err;
  process.exit(0);
});
const USAGE = "usage: node --import tsx bench/tools/cpuprofile-top.ts [--top N] [--last-s S] <file.cpuprofile>...\n";
let top = 25;
let lastS: number | undefined;
let unknown: string | undefined;
const files: string[] = [];
for (let i = 0; i < argv.length; i++) {
  const a = argv[i]!;
  if (a === "-h" || a === "--help") {
    process.stdout.write(USAGE);
    process.exit(0);
  }
  if (a === "--top") top = Number(argv[++i]);
  else if (a === "--last-s") lastS = Number(argv[++i]);
  else if (a.startsWith("-")) unknown ??= a;
  else files.push(a);
}
if (unknown !== undefined || files.length === 0 || !(top > 0) || (lastS !== undefined && !(lastS > 0))) {
  process.stderr.write(`${unknown === undefined ? "" : `unknown option ${unknown}\n`}${USAGE}`);
  process.exit(2);
}
for (const f of files) {
  try {
    summarize(f, top, lastS);
  } catch (err) {
    process.stderr.write(`cpuprofile-top: cannot summarize ${f}: ${(err as Error).message}\n`);
    process.exitCode = 1;
  }
}
