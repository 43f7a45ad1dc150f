/**
 * What a recovery mode costs a program, measured one job at a time: bench/programs/allreduce-loop.ts
 * (barrier and allreduce per iteration, a checkpoint every `--checkpoint-every` iterations) under
 * each `--modes` entry in turn, the order alternating between rounds, so no other job shares
 * the machine while one is measured (the harness of `npm run bench` keeps both jobs alive and
 * alternates blocks, which for large payloads lets one job's background work — GC, freeing
 * received buffers — fall into the other's timing). Per run: the slowest rank's median allreduce time and the CPU time of all
 * ranks per iteration; per mode: the median over rounds, and the ratio to the first mode.
 * Every job's store is under a temp dir; retry-one runs with `--durable-every 0` (the durable
 * floor's cost is `npm run bench -- --only durable`). Each job's ranks wait 1.5 s before their
 * first iteration (allreduce-loop's `--settle-ms`): cpr and retry-one start a warm spare
 * process with the job, whose start-up would otherwise fall into their first iterations only.
 *
 *   npm run build && node --import tsx bench/tools/mode-ab.ts [--np 4] [--sizes 4194304,16777216,41943040]
 *        [--iters 40] [--rounds 3] [--modes none,retry-one] [--checkpoint-every 1]
 */
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { sizeLabel } from "../lib/plan.ts";
import { median } from "../lib/stats.ts";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const { values } = parseArgs({
  options: {
    np: { type: "string", default: "4" },
    sizes: { type: "string", default: "4194304,16777216,41943040" },
    iters: { type: "string", default: "40" },
    rounds: { type: "string", default: "3" },
    modes: { type: "string", default: "none,retry-one" },
    "checkpoint-every": { type: "string", default: "1" },
  },
});
const np = Number(values.np);
const sizes = values.sizes.split(",").map(Number);
const modes = values.modes.split(",");
const rounds = Number(values.rounds);
const dir = mkdtempSync(path.join(os.tmpdir(), "mode-ab-"));

/** Milliseconds with three significant digits (an 8 B allreduce takes a few tenths of one). */
const fmt = (ms: number): string => (ms >= 100 ? ms.toFixed(0) : ms.toPrecision(3));

interface Run {
  ms: number;
  cpuMs: number;
}

function runOnce(mode: string, bytes: number): Run {
  const results = path.join(dir, "r.json");
  // A store under the temp dir in every mode (never the repository's `.lifeline/`); retry-one
  // without its durable floor, as the retry-one benchmarks of `npm run bench` (bench/lib/jobs.ts).
  const store = ["--store", path.join(dir, "store")];
  const flags =
    mode === "cpr"
      ? ["--mode", "cpr", ...store, "--checkpoint-every", "1000000s"]
      : ["--mode", mode, ...store, ...(mode === "retry-one" ? ["--durable-every", "0"] : [])];
  execFileSync(
    process.execPath,
    [
      path.join(ROOT, "dist/cli.js"),
      "run",
      "-n",
      String(np),
      ...flags,
      "--quiet",
      "--results",
      results,
      "bench/programs/allreduce-loop.ts",
      "--bytes",
      String(bytes),
      "--iters",
      values.iters,
      "--checkpoint-every",
      values["checkpoint-every"],
    ],
    { cwd: ROOT, stdio: ["ignore", "ignore", "inherit"], timeout: 600_000 },
  );
  const doc = JSON.parse(readFileSync(results, "utf8")) as { ranks: { medianMs: number; cpuMsPerIter: number }[] };
  return { ms: Math.max(...doc.ranks.map((r) => r.medianMs)), cpuMs: doc.ranks.reduce((s, r) => s + r.cpuMsPerIter, 0) };
}

try {
  const lines = [
    `### allreduce per iteration, checkpoint every ${values["checkpoint-every"]}, ${np} ranks, one job at a time (median of ${rounds} rounds; load ${os.loadavg()[0]!.toFixed(2)})`,
    "",
    `| size | ${modes.map((m) => `${m} ms | ${m} CPU ms`).join(" | ")} | ${modes
      .slice(1)
      .map((m) => `${m}/${modes[0]} time | CPU`)
      .join(" | ")} |`,
    `| --- | ${modes.map(() => "---: | ---:").join(" | ")} | ${modes
      .slice(1)
      .map(() => "---: | ---:")
      .join(" | ")} |`,
  ];
  for (const bytes of sizes) {
    const by = new Map<string, Run[]>(modes.map((m) => [m, []]));
    for (let k = 0; k < rounds; k++) {
      for (const m of k % 2 === 0 ? modes : [...modes].reverse()) {
        const r = runOnce(m, bytes);
        by.get(m)!.push(r);
        process.stderr.write(`${sizeLabel(bytes)} round ${k + 1} ${m}: ${fmt(r.ms)} ms, CPU ${fmt(r.cpuMs)} ms per iteration\n`);
      }
    }
    const med = (m: string, f: (r: Run) => number): number => median(by.get(m)!.map(f));
    lines.push(
      `| ${sizeLabel(bytes)} | ${modes.map((m) => `${fmt(med(m, (r) => r.ms))} | ${fmt(med(m, (r) => r.cpuMs))}`).join(" | ")} | ` +
        `${modes
          .slice(1)
          .map(
            (m) =>
              `${(med(m, (r) => r.ms) / med(modes[0]!, (r) => r.ms)).toFixed(2)}x | ${(med(m, (r) => r.cpuMs) / med(modes[0]!, (r) => r.cpuMs)).toFixed(2)}x`,
          )
          .join(" | ")} |`,
    );
  }
  process.stdout.write(`\n${lines.join("\n")}\n`);
} finally {
  rmSync(dir, { recursive: true, force: true });
}
