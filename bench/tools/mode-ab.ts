/**
 * What a recovery mode costs a program, measured one job at a time: bench/programs/allreduce-loop.ts
 * (barrier and allreduce per iteration, a checkpoint every `--checkpoint-every` iterations) under
 * each `--modes` entry in turn, the order alternating between rounds, so no other job shares
 * the machine while one is measured (the harness of `npm run bench` keeps both jobs alive and
 * alternates blocks, which for large payloads lets one job's background work — GC, freeing
 * received buffers — fall into the other's timing). Per run: the slowest rank's median allreduce
 * time, and per iteration the allreduce's CPU time in all ranks (every thread) and in their main
 * threads alone (bench/lib/thread-cpu.ts), so that what a mode adds on the main thread
 * (JavaScript, garbage collection) can be told from what it adds elsewhere (ZeroMQ's I/O
 * threads, the kernel); per mode: the median over rounds, and the ratio to the first mode.
 * Every job's store is under a temp dir; retry-one runs with `--durable-every 0` (the durable
 * floor's cost is `npm run bench -- --only durable`). Each job's ranks wait 1.5 s before their
 * first iteration (allreduce-loop's `--settle-ms`): cpr and retry-one start a warm spare
 * process with the job, whose start-up would otherwise fall into their first iterations only.
 *
 * `--bench pingpong`: bench/programs/pingpong-loop.ts instead, on 2 ranks (`--np` does not apply):
 * `--iters` round trips (default 3000) of `--sizes` bytes, a checkpoint every `--checkpoint-every`
 * round trips (default 250), the same figures per round trip (the checkpoints included).
 *
 * `--bench stream`: bench/programs/stream-loop.ts, on 2 ranks: 3 blocks of `--iters` messages
 * (default 200) of `--sizes` bytes from rank 0 to rank 1, no checkpoints; per message, the
 * median block's time, both ranks' CPU (every thread; main threads are not told apart) and
 * their minor page faults.
 *
 * For allreduce, a second table gives a checkpoint() call per mode: the slowest rank's median
 * time and the CPU of every rank during one (what the checkpoint's messages cost a rank after
 * the call returned is not in it).
 *
 * A `--modes` entry may add `lifeline run` flags after `+`: `none,none+--no-malloc-tuning`
 * measures the same mode with and without the launcher's malloc tunables. Page faults (every
 * thread of every rank) are in the table for allreduce and stream.
 *
 *   npm run build && node --import tsx bench/tools/mode-ab.ts [--bench allreduce|pingpong|stream] [--np 4]
 *        [--sizes 4194304,16777216,41943040] [--iters 40] [--rounds 3] [--modes none,retry-one]
 *        [--checkpoint-every 1]
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
    bench: { type: "string", default: "allreduce" },
    np: { type: "string", default: "4" },
    sizes: { type: "string", default: "4194304,16777216,41943040" },
    iters: { type: "string" },
    rounds: { type: "string", default: "3" },
    modes: { type: "string", default: "none,retry-one" },
    "checkpoint-every": { type: "string" },
  },
});
const bench = values.bench;
if (bench !== "allreduce" && bench !== "pingpong" && bench !== "stream") throw new RangeError(`--bench ${bench}: expected allreduce, pingpong or stream`);
const np = bench === "allreduce" ? Number(values.np) : 2;
const checkpointEvery = values["checkpoint-every"] ?? (bench === "pingpong" ? "250" : "1");
const iters = values.iters ?? (bench === "pingpong" ? "3000" : bench === "stream" ? "200" : "40");
const sizes = values.sizes.split(",").map(Number);
const modes = values.modes.split(",");
const rounds = Number(values.rounds);
const dir = mkdtempSync(path.join(os.tmpdir(), "mode-ab-"));

/** Milliseconds with three significant digits (an 8 B allreduce takes a few tenths of one). */
const fmt = (ms: number): string => (ms >= 100 ? ms.toFixed(0) : ms.toPrecision(3));

interface Run {
  ms: number;
  cpuMs: number;
  mainMs: number;
  /** Minor page faults per operation, every rank (undefined: the program does not say). */
  faults: number | undefined;
  /**
   * A checkpoint() call: the slowest rank's median time and the CPU of every rank during one,
   * ms (undefined: the program does not say, or no measured iteration checkpointed).
   */
  ckpt: { ms: number; cpuMs: number } | undefined;
}

/** A `--modes` entry: the mode, then any `lifeline run` flags of its own after `+`. */
function runOnce(spec: string, bytes: number): Run {
  const [mode, ...extra] = spec.split("+") as [string, ...string[]];
  const results = path.join(dir, "r.json");
  // A store under the temp dir in every mode (never the repository's `.lifeline/`); retry-one
  // without its durable floor, as the retry-one benchmarks of `npm run bench` (bench/lib/jobs.ts).
  const store = ["--store", path.join(dir, "store")];
  const flags = [
    ...(mode === "cpr"
      ? ["--mode", "cpr", ...store, "--checkpoint-every", "1000000s"]
      : ["--mode", mode, ...store, ...(mode === "retry-one" ? ["--durable-every", "0"] : [])]),
    ...extra,
  ];
  const program =
    bench === "stream"
      ? ["bench/programs/stream-loop.ts", "--bytes", String(bytes), "--iters", iters, "--blocks", "3"]
      : [
          bench === "pingpong" ? "bench/programs/pingpong-loop.ts" : "bench/programs/allreduce-loop.ts",
          "--bytes",
          String(bytes),
          "--iters",
          iters,
          "--checkpoint-every",
          checkpointEvery,
        ];
  execFileSync(process.execPath, [path.join(ROOT, "dist/cli.js"), "run", "-n", String(np), ...flags, "--quiet", "--results", results, ...program], {
    cwd: ROOT,
    stdio: ["ignore", "ignore", "inherit"],
    timeout: 600_000,
  });
  if (bench === "stream") {
    const doc = JSON.parse(readFileSync(results, "utf8")) as { ranks: { mbps: number[]; cpuUs: number[]; faults: number[] }[] };
    return {
      ms: bytes / (median(doc.ranks[0]!.mbps) * 1000),
      cpuMs: doc.ranks.reduce((s, r) => s + median(r.cpuUs) / 1000, 0),
      mainMs: 0,
      faults: doc.ranks.reduce((s, r) => s + median(r.faults), 0),
      ckpt: undefined,
    };
  }
  const doc = JSON.parse(readFileSync(results, "utf8")) as {
    ranks: {
      medianMs: number;
      cpuMsPerIter: number;
      mainMsPerIter: number;
      faultsPerIter?: number;
      checkpointMedianMs?: number;
      checkpointCpuMs?: number;
    }[];
  };
  return {
    ms: Math.max(...doc.ranks.map((r) => r.medianMs)),
    cpuMs: doc.ranks.reduce((s, r) => s + r.cpuMsPerIter, 0),
    mainMs: doc.ranks.reduce((s, r) => s + r.mainMsPerIter, 0),
    faults: doc.ranks.every((r) => r.faultsPerIter !== undefined) ? doc.ranks.reduce((s, r) => s + r.faultsPerIter!, 0) : undefined,
    ckpt: doc.ranks.every((r) => r.checkpointMedianMs !== undefined && r.checkpointCpuMs !== undefined)
      ? { ms: Math.max(...doc.ranks.map((r) => r.checkpointMedianMs!)), cpuMs: doc.ranks.reduce((s, r) => s + r.checkpointCpuMs!, 0) }
      : undefined,
  };
}

try {
  const what =
    bench === "pingpong"
      ? `ping-pong round trip, checkpoint every ${checkpointEvery} round trips, 2 ranks`
      : bench === "stream"
        ? `stream per message (${iters} per block), 2 ranks`
        : `allreduce per iteration, checkpoint every ${checkpointEvery}, ${np} ranks`;
  const per = bench === "pingpong" ? "round trip" : bench === "stream" ? "message" : "iteration";
  // Page faults: the minor faults of every thread of every rank (the loop programs but ping-pong count them).
  const withFaults = bench !== "pingpong";
  const modeCols = withFaults ? ["ms", "CPU ms", "main ms", "faults"] : ["ms", "CPU ms", "main ms"];
  const lines = [
    `### ${what}, one job at a time (median of ${rounds} rounds; load ${os.loadavg()[0]!.toFixed(2)})`,
    "",
    `CPU: every thread of every rank; main: the CPU time of the ranks' main threads alone${withFaults ? "; faults: minor page faults of every rank" : ""}.`,
    "",
    `| size | ${modes.map((m) => modeCols.map((c) => `${m} ${c}`).join(" | ")).join(" | ")} | ${modes
      .slice(1)
      .map((m) => `${m}/${modes[0]} time | CPU | main`)
      .join(" | ")} |`,
    `| --- | ${modes.map(() => modeCols.map(() => "---:").join(" | ")).join(" | ")} | ${modes
      .slice(1)
      .map(() => "---: | ---: | ---:")
      .join(" | ")} |`,
  ];
  // A checkpoint() call per mode, for the programs that report it (allreduce-loop).
  const ckptLines: string[] = [];
  for (const bytes of sizes) {
    const by = new Map<string, Run[]>(modes.map((m) => [m, []]));
    for (let k = 0; k < rounds; k++) {
      for (const m of k % 2 === 0 ? modes : [...modes].reverse()) {
        const r = runOnce(m, bytes);
        by.get(m)!.push(r);
        const faults = r.faults === undefined ? "" : `, ${r.faults.toFixed(1)} page faults`;
        process.stderr.write(
          `${sizeLabel(bytes)} round ${k + 1} ${m}: ${fmt(r.ms)} ms, CPU ${fmt(r.cpuMs)} ms, main ${fmt(r.mainMs)} ms${faults} per ${per}\n`,
        );
      }
    }
    const med = (m: string, f: (r: Run) => number): number => median(by.get(m)!.map(f));
    const fields: ((r: Run) => number)[] = [(r) => r.ms, (r) => r.cpuMs, (r) => r.mainMs];
    // A main-thread time of 0: the system does not say (bench/lib/thread-cpu.ts).
    const cell = (m: string, f: (r: Run) => number): string => (med(m, f) > 0 ? fmt(med(m, f)) : "–");
    const ratio = (m: string, f: (r: Run) => number): string =>
      med(m, f) > 0 && med(modes[0]!, f) > 0 ? `${(med(m, f) / med(modes[0]!, f)).toFixed(2)}x` : "–";
    const faults = (m: string): string => {
      const f = by.get(m)!.flatMap((r) => (r.faults === undefined ? [] : [r.faults]));
      return f.length === rounds ? median(f).toFixed(1) : "–";
    };
    lines.push(
      `| ${sizeLabel(bytes)} | ${modes.map((m) => [...fields.map((f) => cell(m, f)), ...(withFaults ? [faults(m)] : [])].join(" | ")).join(" | ")} | ` +
        `${modes
          .slice(1)
          .map((m) => fields.map((f) => ratio(m, f)).join(" | "))
          .join(" | ")} |`,
    );
    if (modes.every((m) => by.get(m)!.every((r) => r.ckpt !== undefined))) {
      const ckptFields: ((r: Run) => number)[] = [(r) => r.ckpt!.ms, (r) => r.ckpt!.cpuMs];
      ckptLines.push(
        `| ${sizeLabel(bytes)} | ${modes.map((m) => ckptFields.map((f) => fmt(med(m, f))).join(" | ")).join(" | ")} | ${modes
          .slice(1)
          .map((m) => ckptFields.map((f) => ratio(m, f)).join(" | "))
          .join(" | ")} |`,
      );
    }
  }
  if (ckptLines.length > 0) {
    lines.push(
      "",
      `A checkpoint() call (median of ${rounds} rounds): the slowest rank's median time, and the CPU of every rank during one (every thread; what the checkpoint's messages cost after the call returned is not in it).`,
      "",
      `| size | ${modes.map((m) => `${m} ms | ${m} CPU ms`).join(" | ")} | ${modes
        .slice(1)
        .map((m) => `${m}/${modes[0]} time | CPU`)
        .join(" | ")} |`,
      `| --- | ${modes.map(() => "---: | ---:").join(" | ")} | ${modes
        .slice(1)
        .map(() => "---: | ---:")
        .join(" | ")} |`,
      ...ckptLines,
    );
  }
  process.stdout.write(`\n${lines.join("\n")}\n`);
} finally {
  rmSync(dir, { recursive: true, force: true });
}
