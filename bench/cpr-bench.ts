/**
 * Coordinated checkpoint-restart benchmarks (issue 3, item 6), in one run:
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
 * - **recovery**: bench/programs/cpr-recovery.ts, 4 ranks × 64 MiB state, a line every 10
 *   steps, rank 1 SIGKILLed at its 40th checkpoint() (`--inject 1@step:40`); from the
 *   launcher's --json events and the ranks' wall-clock marks: detect (the fault's wall time →
 *   the launcher sees the exit), restart (→ every rank is up again: survivors stopped, back-off,
 *   spawn, rendezvous), load (→ every rank's restore() returned: part read, verified,
 *   decoded), replay (→ every rank is past the failure point again). Rank marks are put on
 *   the launcher's clock with the smallest (arrival − wall) offset seen over the run's marked
 *   lines (the fault line is written unbuffered just before the kill).
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
import { installCleanup, killAllSync, spawnChild } from "./lib/procs.ts";
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
  return { name, value: `${v.toFixed(unit === "s" ? 2 : 1)} ${unit}`, baseline: `${base.toFixed(unit === "s" ? 2 : 1)} ${unit}${note}`, ratio, target: `<= ${target.toFixed(2)}x`, met: ratio <= target };
}

// ---- (a) ping-pong, cpr with nothing due vs none --------------------------------------------

async function benchPingpong(tmpDir: string, o: { reps: number; iters: number }): Promise<{ rows: Row[]; data: Record<string, unknown> }> {
  const ctrl = await CtrlServer.open(`ipc://${tmpDir}/ctrl`);
  const env: JobEnv = { ctrl, root: ROOT, tmpDir, transport: "ipc", mode: "none", payload: "f64", echo: false, startTimeoutMs: 90_000, commandTimeoutMs: 60_000, idleMs: 60_000, cpuProf: undefined };
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
    const row = ratioRow("8 B ping-pong one-way, cpr (nothing due) vs none", "us", median(c), median(n), 1.05, ` (paired ${median(paired).toFixed(3)}x, IQR ${quantile(paired, 0.25).toFixed(3)}..${quantile(paired, 0.75).toFixed(3)})`);
    const cpuRow = ratioRow("  same, CPU per one-way message, both ranks (all threads; steadier on a loaded machine)", "us", median(cCpu), median(nCpu), 1.05);
    return { rows: [row, cpuRow], data: { iters: o.iters, reps: o.reps, noneUs: n, cprUs: c, paired, noneCpuUs: nCpu, cprCpuUs: cCpu } };
  } finally {
    await Promise.all([none.stop(), cpr.stop()]).catch(() => undefined);
    ctrl.close();
  }
}

// ---- launcher runs with --json events ---------------------------------------------------------

interface Ev {
  readonly event: string;
  readonly t: number;
  readonly [k: string]: unknown;
}

/**
 * Runs the launcher with --json under bash, whose `times` then reports the CPU time of the
 * launcher and every process it waited for (the ranks): user + system seconds of the job.
 */
async function launch(name: string, argv: readonly string[], timeoutMs: number): Promise<{ code: number | null; events: Ev[]; spawnToExitMs: number; cpuS: number | undefined; tail: string }> {
  const t0 = performance.now();
  const quoted = [process.execPath, path.join(ROOT, "dist", "cli.js"), "run", "--json", ...argv].map((a) => `'${a.replaceAll("'", "'\\''")}'`).join(" ");
  const child = spawnChild(name, "bash", ["-c", `${quoted}; rc=$?; times >&2; exit $rc`], { cwd: ROOT });
  const events: Ev[] = [];
  let cpuS: number | undefined;
  let partial = "";
  child.proc.stderr!.setEncoding("utf8").on("data", (chunk: string) => {
    const lines = (partial + chunk).split("\n");
    partial = lines.pop() ?? "";
    for (const line of lines) {
      // `times`: the shell's own line, then its children's "<m>m<s>s <m>m<s>s" (user, system).
      const t = /^(\d+)m([\d.]+)s (\d+)m([\d.]+)s$/.exec(line);
      if (t !== null) cpuS = Number(t[1]) * 60 + Number(t[2]) + Number(t[3]) * 60 + Number(t[4]);
      if (!line.startsWith("{")) continue;
      try {
        events.push(JSON.parse(line) as Ev);
      } catch {
        continue; // a rank's own line that happens to start with "{"
      }
    }
  });
  const status = await child.waitOrKill(timeoutMs);
  return { code: status.code, events, spawnToExitMs: performance.now() - t0, cpuS, tail: child.tail() };
}

// ---- (b) heat, checkpoint every 1 s vs none ---------------------------------------------------

async function benchHeat(tmpDir: string, o: { runs: number; iters: number }): Promise<{ rows: Row[]; data: Record<string, unknown> }> {
  const args = ["examples/heat.ts", "--rows", "512", "--cols", "512", "--iters", String(o.iters), "--tol", "0"];
  const one = async (mode: "none" | "cpr", k: number): Promise<{ wallMs: number; computeMs: number; cpuS: number; lines: number }> => {
    const flags = mode === "none" ? ["--mode", "none"] : ["--mode", "cpr", "--checkpoint-every", "1s"];
    const r = await launch(`heat-${mode}-${k}`, ["-n", "4", "--store", path.join(tmpDir, `heat-${mode}-${k}`), ...flags, ...args], 300_000);
    const fin = r.events.find((e) => e.event === "job-finished");
    const started = r.events.find((e) => e.event === "job-started");
    if (r.code !== 0 || fin === undefined || started === undefined) throw new Error(`heat ${mode}: exit ${r.code}\n${r.tail}`);
    return { wallMs: fin.wallMs as number, computeMs: fin.t - started.t, cpuS: r.cpuS ?? NaN, lines: r.events.filter((e) => e.event === "line-committed").length };
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
      ratioRow(`heat 4 ranks 512x512 x ${o.iters} iters, wall, cpr --checkpoint-every 1s (${lines} lines) vs none`, "s", med(c, (x) => x.wallMs) / 1000, med(n, (x) => x.wallMs) / 1000, 1.05),
      ratioRow("  same, compute part only (job-started → job-finished)", "s", med(c, (x) => x.computeMs) / 1000, med(n, (x) => x.computeMs) / 1000, 1.05),
      ratioRow("  same, CPU time of launcher + ranks (user + system; steadier on a loaded machine)", "s", med(c, (x) => x.cpuS), med(n, (x) => x.cpuS), 1.05),
    ],
    data: { iters: o.iters, runs: o.runs, none: n, cpr: c },
  };
}

// ---- (d) recovery with 4 ranks x 64 MiB ------------------------------------------------------

interface RecoveryParts {
  detectMs: number;
  restartMs: number;
  loadMs: number;
  replayMs: number;
  totalMs: number;
  rolledBackToEpoch: number;
  restoredStep: number;
  failStep: number;
}

async function recoveryOnce(tmpDir: string, k: number, o: { mib: number; steps: number; failStep: number }): Promise<RecoveryParts> {
  const r = await launch(`recovery-${k}`, [
    "-n", "4", "--mode", "cpr", "--checkpoint-every", "10steps", "--inject", `1@step:${o.failStep}`, "--store", path.join(tmpDir, `recovery-${k}`),
    "bench/programs/cpr-recovery.ts", "--mib", String(o.mib), "--steps", String(o.steps), "--fail-step", String(o.failStep),
  ], 300_000);
  if (r.code !== 0) throw new Error(`recovery run: exit ${r.code}\n${r.tail}`);
  const out = r.events.filter((e) => e.event === "output").map((e) => ({ t: e.t, rank: e.rank as number, line: e.line as string }));
  const fault = out.map((l) => ({ l, m: /injected fault: killing this rank .* at ([\d.]+)$/.exec(l.line) })).find((x) => x.m !== null);
  if (fault === undefined) throw new Error("recovery run: no fault line");
  const marks = out.map((l) => ({ ...l, m: /^cpr-bench: (start|restored|past) ([\d.]+)/.exec(l.line) })).filter((x) => x.m !== null);
  // Launcher clock = wall + offset; every line arrives after it was written, so the smallest
  // (arrival − wall) is the best estimate of the offset.
  const timed = [{ t: fault.l.t, wall: Number(fault.m![1]) }, ...marks.map((x) => ({ t: x.t, wall: Number(x.m![2]) }))];
  const offset = Math.min(...timed.map((x) => x.t - x.wall));
  const killAt = Number(fault.m![1]) + offset;
  const victim = fault.l.rank;
  const exited = r.events.find((e) => e.event === "rank-exited" && e.rank === victim && e.t >= fault.l.t - 1);
  const restarting = r.events.find((e) => e.event === "job-restarting");
  const started = r.events.filter((e) => e.event === "job-started")[1];
  if (exited === undefined || restarting === undefined || started === undefined) throw new Error("recovery run: missing launcher events");
  const lastOf = (kind: string): number => {
    const ts = marks.filter((x) => x.m![1] === kind).map((x) => Number(x.m![2]) + offset);
    if (ts.length !== 4) throw new Error(`recovery run: ${ts.length} '${kind}' marks, expected 4`);
    return Math.max(...ts);
  };
  const restored = lastOf("restored");
  const past = lastOf("past");
  const restoredStep = Number(/step (\d+)/.exec(marks.find((x) => x.m![1] === "restored")!.line)![1]);
  return {
    detectMs: exited.t - killAt,
    restartMs: started.t - exited.t,
    loadMs: restored - started.t,
    replayMs: past - restored,
    totalMs: past - killAt,
    rolledBackToEpoch: restarting.epoch as number,
    restoredStep,
    failStep: o.failStep,
  };
}

// ---- main ------------------------------------------------------------------------------------

function progress(line: string): void {
  process.stderr.write(`${line}\n`);
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      only: { type: "string" }, quick: { type: "boolean", default: false }, reps: { type: "string" }, "heat-runs": { type: "string" },
      "heat-iters": { type: "string" }, "recovery-runs": { type: "string" }, out: { type: "string" }, help: { type: "boolean", short: "h", default: false },
    },
  });
  if (values.help) {
    process.stdout.write("Usage: node --import tsx bench/cpr-bench.ts [--only pingpong,heat,store,recovery] [--quick] [--reps 15] [--heat-runs 2] [--heat-iters 1500] [--recovery-runs 3] [--out file]\n");
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
      if (w !== undefined) rows.push(ratioRow(`${storeResult.bytes >> 20} MiB part write: store vs ${w.baseline}`, "ms", w.storeMedianMs, w.baselineMedianMs, 1.25, ` (paired ${w.pairedRatio.toFixed(2)}x)`));
      data.store = storeResult;
    }
    if (only.has("recovery")) {
      const runs = int(values["recovery-runs"], quick ? 1 : 3);
      const o = quick ? { mib: 8, steps: 30, failStep: 20 } : { mib: 64, steps: 60, failStep: 40 };
      for (let k = 0; k < runs; k++) {
        progress(`recovery: run ${k + 1}/${runs} (4 ranks x ${o.mib} MiB, kill at step ${o.failStep})`);
        recovery.push(await recoveryOnce(tmpDir, k, o));
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
    const m = (k: keyof RecoveryParts): string => (median(recovery.map((x) => x[k])) / 1000).toFixed(2);
    const d = data.recovery as { mib: number };
    table.push(
      "",
      `### Recovery, 4 ranks x ${d.mib} MiB state, rank 1 killed (median of ${recovery.length}; seconds)`,
      "",
      "| detect | restart (stop, back-off, spawn, rendezvous) | load (read + verify + restore) | replay (back past the failure point) | total | rolled back to |",
      "| ---: | ---: | ---: | ---: | ---: | --- |",
      `| ${m("detectMs")} | ${m("restartMs")} | ${m("loadMs")} | ${m("replayMs")} | ${m("totalMs")} | ${recovery.map((r) => `epoch ${r.rolledBackToEpoch} (step ${r.restoredStep} of failure step ${r.failStep})`).join("; ")} |`,
    );
  }
  const text = table.join("\n") + "\n" + (storeResult === undefined ? "" : `\n${renderStoreTable(storeResult)}`);
  process.stdout.write(`\n${text}`);
  const out = values.out ?? path.join(ROOT, "bench", "results", `cpr-${startedAt.toISOString().replace(/[:.]/g, "-")}.json`);
  mkdirSync(path.dirname(out), { recursive: true });
  writeFileSync(out, `${JSON.stringify({ schema: "lifeline-cpr-bench/1", startedAt: startedAt.toISOString(), finishedAt: new Date().toISOString(), machine: { node: process.version, cpus: os.cpus().length, loadavgAtEnd: os.loadavg() }, quick, rows, ...data, table: text }, null, 2)}\n`);
  progress(`results: ${path.relative(process.cwd(), out)}`);
}

await main().catch((err: unknown) => {
  process.stderr.write(`cpr-bench: ${(err as Error).stack ?? String(err)}\n`);
  killAllSync();
  process.exit(1);
});
process.exit(process.exitCode ?? 0);
