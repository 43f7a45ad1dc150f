/**
 * Coordinated checkpoint-restart benchmarks, in one run:
 *
 * - **pingpong**: 8 B one-way latency of the same program (bench/programs/mpi-bench.ts, 2
 *   ranks) under `--mode cpr` with no checkpoint due (`--checkpoint-every 1000000s`) vs
 *   `--mode none`: both jobs kept running, timed blocks alternating (N C, C N, …), median.
 *   Target: cpr / none <= 1.05.
 * - **heat**: examples/heat.ts on 4 ranks, wall time with `--checkpoint-every 1s` vs none,
 *   runs alternating; the launcher's own wall time (job-finished) and its compute part
 *   (job-started → job-finished). Target: <= 5% more wall time.
 * - **store**: one rank's 64 MiB part through the store vs `fs.writeFile` + fsync — this is
 *   bench/store-bench.ts's `runStoreBench`, run from here (not re-implemented).
 *   Target: <= 1.25x.
 * - **recovery**: bench/programs/recovery.ts, 4 ranks × 64 MiB local state, a line every 10
 *   steps, rank 1 SIGKILLed at its 40th checkpoint() (`--inject 1@step:40`), in parts
 *   (detect, restart, load, catch up; see bench/lib/recovery.ts, which `npm run bench -- --only
 *   recovery` also uses to put retry-one next to cpr).
 *
 * Prints a table; writes JSON to bench/results/cpr-<timestamp>.json (or --out).
 * Usage: node --import tsx bench/cpr-bench.ts [--only pingpong,heat,store,recovery] [--quick]
 *          [--reps 15] [--heat-runs 2] [--heat-iters 1500] [--recovery-runs 3] [--out file]
 * Needs the built package (`npm run build`).
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { CtrlServer } from "./lib/ctrl.ts";
import { LifelineJob, type JobEnv } from "./lib/jobs.ts";
import { cpuPerOpSeconds, perOpSeconds } from "./lib/plan.ts";
import { installCleanup, killAllSync } from "./lib/procs.ts";
import { launchJson, recoveryRun, renderRecoveryTable, type RecoveryParts } from "./lib/recovery.ts";
import { median, quantile } from "./lib/stats.ts";
import { renderStoreTable, runStoreBench, type StoreBenchResult } from "./store-bench.ts";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const PARTS = ["pingpong", "heat", "store", "recovery"] as const;
type Part = (typeof PARTS)[number];

/** mpi-bench.ts under --mode cpr, with no checkpoint ever due. */
class CprPingJob extends LifelineJob {
  override command(): string[] {
    const argv = super.command();
    const i = argv.indexOf("none");
    argv.splice(i, 1, "cpr", "--checkpoint-every", "1000000s");
    return argv;
  }
}

interface Row {
  readonly name: string;
  readonly value: string;
  readonly baseline: string;
  readonly ratio: number | null;
  readonly target: string;
  readonly met: boolean | null;
}

function ratioRow(name: string, unit: string, v: number, base: number, target: number, note = ""): Row {
  const ratio = v / base;
  return {
    name,
    value: `${v.toFixed(unit === "s" ? 2 : 1)} ${unit}`,
    baseline: `${base.toFixed(unit === "s" ? 2 : 1)} ${unit}${note}`,
    ratio,
    target: `<= ${target.toFixed(2)}x`,
    met: ratio <= target,
  };
}

// ---- (a) ping-pong, cpr with nothing due vs none --------------------------------------------

async function benchPingpong(tmpDir: string, o: { reps: number; iters: number }): Promise<{ rows: Row[]; data: Record<string, unknown> }> {
  const ctrl = await CtrlServer.open(`ipc://${tmpDir}/ctrl`);
  const env: JobEnv = {
    ctrl,
    root: ROOT,
    tmpDir,
    transport: "ipc",
    mode: "none",
    payload: "f64",
    echo: false,
    startTimeoutMs: 90_000,
    commandTimeoutMs: 60_000,
    idleMs: 60_000,
    cpuProf: undefined,
  };
  const none = new LifelineJob(2, env, 0);
  const cpr = new CprPingJob(2, env, 1);
  try {
    await Promise.all([none.start(), cpr.start()]);
    const nCpu: number[] = [];
    const cCpu: number[] = [];
    const oneWayUs = async (job: LifelineJob, cpu?: number[]): Promise<number> => {
      const r = await job.run("pingpong", 8, o.iters);
      cpu?.push(cpuPerOpSeconds("pingpong", o.iters, r.cpuS) * 1e6);
      return perOpSeconds("pingpong", o.iters, r.seconds) * 1e6;
    };
    await oneWayUs(none);
    await oneWayUs(cpr);
    const n: number[] = [];
    const c: number[] = [];
    for (let k = 0; k < o.reps; k++) {
      // Alternate which goes first, so drift of a shared machine hits both alike.
      if (k % 2 === 0) {
        n.push(await oneWayUs(none, nCpu));
        c.push(await oneWayUs(cpr, cCpu));
      } else {
        c.push(await oneWayUs(cpr, cCpu));
        n.push(await oneWayUs(none, nCpu));
      }
    }
    const paired = c.map((x, k) => x / n[k]!);
    const row = ratioRow(
      "8 B ping-pong one-way, cpr (nothing due) vs none",
      "us",
      median(c),
      median(n),
      1.05,
      ` (paired ${median(paired).toFixed(3)}x, IQR ${quantile(paired, 0.25).toFixed(3)}..${quantile(paired, 0.75).toFixed(3)})`,
    );
    const cpuRow = ratioRow("  same, CPU per one-way message, both ranks (all threads; steadier on a loaded machine)", "us", median(cCpu), median(nCpu), 1.05);
    return { rows: [row, cpuRow], data: { iters: o.iters, reps: o.reps, noneUs: n, cprUs: c, paired, noneCpuUs: nCpu, cprCpuUs: cCpu } };
  } finally {
    await Promise.all([none.stop(), cpr.stop()]).catch(() => undefined);
    ctrl.close();
  }
}

// ---- launcher runs with --json events ---------------------------------------------------------

// ---- (b) heat, checkpoint every 1 s vs none ---------------------------------------------------

async function benchHeat(tmpDir: string, o: { runs: number; iters: number }): Promise<{ rows: Row[]; data: Record<string, unknown> }> {
  const args = ["examples/heat.ts", "--rows", "512", "--cols", "512", "--iters", String(o.iters), "--tol", "0"];
  const one = async (mode: "none" | "cpr", k: number): Promise<{ wallMs: number; computeMs: number; cpuS: number; lines: number }> => {
    const flags = mode === "none" ? ["--mode", "none"] : ["--mode", "cpr", "--checkpoint-every", "1s"];
    const r = await launchJson(ROOT, `heat-${mode}-${k}`, ["-n", "4", "--store", path.join(tmpDir, `heat-${mode}-${k}`), ...flags, ...args], 300_000);
    const fin = r.events.find((e) => e.event === "job-finished");
    const started = r.events.find((e) => e.event === "job-started");
    if (r.code !== 0 || fin === undefined || started === undefined) throw new Error(`heat ${mode}: exit ${r.code}\n${r.tail}`);
    return {
      wallMs: fin.wallMs as number,
      computeMs: fin.t - started.t,
      cpuS: r.cpuS ?? NaN,
      lines: r.events.filter((e) => e.event === "line-committed").length,
    };
  };
  const n: { wallMs: number; computeMs: number; cpuS: number; lines: number }[] = [];
  const c: { wallMs: number; computeMs: number; cpuS: number; lines: number }[] = [];
  for (let k = 0; k < o.runs; k++) {
    progress(`heat: run ${k + 1}/${o.runs}`);
    if (k % 2 === 0) {
      n.push(await one("none", k));
      c.push(await one("cpr", k));
    } else {
      c.push(await one("cpr", k));
      n.push(await one("none", k));
    }
  }
  const med = (xs: typeof n, f: (x: (typeof n)[number]) => number): number => median(xs.map(f));
  const lines = median(c.map((x) => x.lines));
  return {
    rows: [
      ratioRow(
        `heat 4 ranks 512x512 x ${o.iters} iters, wall, cpr --checkpoint-every 1s (${lines} lines) vs none`,
        "s",
        med(c, (x) => x.wallMs) / 1000,
        med(n, (x) => x.wallMs) / 1000,
        1.05,
      ),
      ratioRow("  same, compute part only (job-started → job-finished)", "s", med(c, (x) => x.computeMs) / 1000, med(n, (x) => x.computeMs) / 1000, 1.05),
      ratioRow(
        "  same, CPU time of launcher + ranks (user + system; steadier on a loaded machine)",
        "s",
        med(c, (x) => x.cpuS),
        med(n, (x) => x.cpuS),
        1.05,
      ),
    ],
    data: { iters: o.iters, runs: o.runs, none: n, cpr: c },
  };
}

// ---- main ------------------------------------------------------------------------------------

function progress(line: string): void {
  process.stderr.write(`${line}\n`);
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      only: { type: "string" },
      quick: { type: "boolean", default: false },
      reps: { type: "string" },
      "heat-runs": { type: "string" },
      "heat-iters": { type: "string" },
      "recovery-runs": { type: "string" },
      out: { type: "string" },
      help: { type: "boolean", short: "h", default: false },
    },
  });
  if (values.help) {
    process.stdout.write(
      "Usage: node --import tsx bench/cpr-bench.ts [--only pingpong,heat,store,recovery] [--quick] [--reps 15] [--heat-runs 2] [--heat-iters 1500] [--recovery-runs 3] [--out file]\n",
    );
    return;
  }
  const only = new Set<Part>((values.only ?? PARTS.join(",")).split(",").map((s) => s.trim() as Part));
  for (const p of only) if (!PARTS.includes(p)) throw new RangeError(`--only ${p}: expected some of ${PARTS.join(", ")}`);
  const quick = values.quick;
  const int = (v: string | undefined, d: number): number => {
    const n = v === undefined ? d : Number(v);
    if (!Number.isInteger(n) || n < 1) throw new RangeError(`expected a positive integer, got ${v}`);
    return n;
  };
  const startedAt = new Date();
  const tmpDir = mkdtempSync(path.join(os.tmpdir(), "lfcprbench-"));
  installCleanup(() => rmSync(tmpDir, { recursive: true, force: true }));
  const rows: Row[] = [];
  const data: Record<string, unknown> = {};
  let storeResult: StoreBenchResult | undefined;
  const recovery: RecoveryParts[] = [];
  let recoveryMib = 0;
  try {
    if (only.has("pingpong")) {
      progress("pingpong: cpr (nothing due) vs none, 2 ranks, alternating blocks");
      const r = await benchPingpong(tmpDir, { reps: int(values.reps, quick ? 5 : 15), iters: quick ? 200 : 1000 });
      rows.push(...r.rows);
      data.pingpong = r.data;
    }
    if (only.has("heat")) {
      const r = await benchHeat(tmpDir, { runs: int(values["heat-runs"], quick ? 1 : 2), iters: int(values["heat-iters"], quick ? 150 : 1500) });
      rows.push(...r.rows);
      data.heat = r.data;
    }
    if (only.has("store")) {
      progress("store: bench/store-bench.ts runStoreBench");
      storeResult = await runStoreBench({ reps: quick ? 3 : 5, mib: quick ? 4 : 64, dir: path.join(tmpDir, "store"), levelPut: false });
      const w = storeResult.cases.find((c) => c.name.startsWith("write"));
      if (w !== undefined)
        rows.push(
          ratioRow(
            `${storeResult.bytes >> 20} MiB part write: store vs ${w.baseline}`,
            "ms",
            w.storeMedianMs,
            w.baselineMedianMs,
            1.25,
            ` (paired ${w.pairedRatio.toFixed(2)}x)`,
          ),
        );
      data.store = storeResult;
    }
    if (only.has("recovery")) {
      const runs = int(values["recovery-runs"], quick ? 1 : 3);
      const o = quick ? { mib: 8, steps: 30, failStep: 20 } : { mib: 64, steps: 60, failStep: 40 };
      recoveryMib = o.mib;
      for (let k = 0; k < runs; k++) {
        progress(`recovery: run ${k + 1}/${runs} (4 ranks x ${o.mib} MiB, kill at step ${o.failStep})`);
        recovery.push(
          await recoveryRun({
            root: ROOT,
            dir: tmpDir,
            name: `recovery-${k}`,
            mode: "cpr",
            np: 4,
            globalMib: 0,
            localMib: o.mib,
            steps: o.steps,
            failStep: o.failStep,
            stepMs: 20,
            checkpointEvery: "10steps",
          }),
        );
      }
      data.recovery = { ...o, ranks: 4, runs: recovery };
    }
  } finally {
    killAllSync();
    rmSync(tmpDir, { recursive: true, force: true });
  }

  const f = (x: number | null): string => (x === null ? "" : `${x.toFixed(3)}x`);
  const table = [
    "### Coordinated checkpoint-restart (cpr) overheads",
    "",
    "| case | cpr / store | none / baseline | ratio | target | met |",
    "| --- | ---: | ---: | ---: | --- | --- |",
    ...rows.map((r) => `| ${r.name} | ${r.value} | ${r.baseline} | ${f(r.ratio)} | ${r.target} | ${r.met === null ? "" : r.met ? "yes" : "NO"} |`),
  ];
  if (recovery.length > 0) {
    table.push(
      "",
      renderRecoveryTable(recovery, `### Recovery, 4 ranks x ${recoveryMib} MiB state, rank 1 killed (median of ${recovery.length}; seconds)`).trimEnd(),
    );
  }
  const text = table.join("\n") + "\n" + (storeResult === undefined ? "" : `\n${renderStoreTable(storeResult)}`);
  process.stdout.write(`\n${text}`);
  const out = values.out ?? path.join(ROOT, "bench", "results", `cpr-${startedAt.toISOString().replace(/[:.]/g, "-")}.json`);
  mkdirSync(path.dirname(out), { recursive: true });
  writeFileSync(
    out,
    `${JSON.stringify({ schema: "lifeline-cpr-bench/1", startedAt: startedAt.toISOString(), finishedAt: new Date().toISOString(), machine: { node: process.version, cpus: os.cpus().length, loadavgAtEnd: os.loadavg() }, quick, rows, ...data, table: text }, null, 2)}\n`,
  );
  progress(`results: ${path.relative(process.cwd(), out)}`);
}

await main().catch((err: unknown) => {
  process.stderr.write(`cpr-bench: ${(err as Error).stack ?? String(err)}\n`);
  killAllSync();
  process.exit(1);
});
process.exit(process.exitCode ?? 0);
