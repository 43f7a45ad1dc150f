/**
 * Goal: `npm run bench` keeps working — its programs start, rendezvous, run every kind of
 * timed block, shut down, and write a JSON report of the documented shape.
 *
 * Method: run bench/run.ts with `--quick` (tiny sizes, 3 reps of ~5 ms) once with the raw
 * zeromq.js baselines only, and once with the Lifeline side too when the package is built
 * (`npm test` builds first) — which includes the retry-one family (allreduce, ping-pong and
 * streaming in a Lifeline job under --mode retry-one next to one under --mode none) — and,
 * separately, the whole-job heat-recovery and durable benchmarks at their quick sizes (one run
 * per variant). Check the report's shape, which job each figure came from, and that every
 * figure is a positive number. No timing assertions: this machine is shared and noisy. Case
 * building and table rendering: bench-plan.test.ts.
 */
import { execFile } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const tmp = mkdtempSync(path.join(os.tmpdir(), "lfbench-smoke-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

interface Variant {
  job: string;
  kind: string;
  iters: number;
  perOpS: number[];
  medianPerOpS: number;
  value: number;
  spread: number;
  calibration: [number, number][];
  warmupPerOpS: number[];
  medianYoungMiB: number;
}
interface Result {
  key: string;
  label: string;
  bench: string;
  op: string;
  np: number;
  bytes: number;
  unit: string;
  kinds: { subject: string | null; baseline: string | null };
  subject: Variant | null;
  baseline: Variant | null;
  ratio: number | null;
  mpiTcp: number | null;
  ratioMpiTcp: number | null;
  target: { text: string; met: boolean | null } | null;
  errors: string[];
}
interface RecoveryRun {
  mode: string;
  detectMs: number;
  restartMs: number;
  loadMs: number;
  catchUpMs: number;
  totalMs: number;
  restarted: number;
  restoredStep: number;
  failStep: number;
  replayed?: number;
}
interface HeatRecoveryRun {
  mode: string;
  totalMs: number;
  detectMs: number;
  restartMs: number;
  catchUpMs: number;
  totalLowMs: number;
  workLostSteps?: number;
}
interface DurableRun {
  every: number;
  computeMs: number;
  lines: number;
}
interface Report {
  schema: string;
  durationS: number;
  options: { quick: boolean; reps: number };
  results: Result[];
  jobs: Record<string, unknown>[];
  tables: string;
  recovery?: { runs: RecoveryRun[]; errors: string[]; targetS: number };
  elastic?: {
    shrink: { detectMs: number; agreeMs: number; firstStepMs: number; restoredMs: number; at: number; failStep: number; spawned: number }[];
    join: { transferMs: number; pauseMs: number; at: number; mib: number }[];
    errors: string[];
  };
  partner?: { runs: { scope: string; lineMs: number }[]; errors: string[] };
  heatRecovery?: { runs: HeatRecoveryRun[]; errors: unknown[]; ratio: number | null; target: number };
  durable?: { runs: DurableRun[]; errors: string[]; summary: { every: number; ratio: number | null }[]; smallestMeeting: number | null; target: number };
}

/** The whole-job runs' errors in full (progress shows only their first line), if the report was written. */
function failedRuns(out: string): string {
  if (!existsSync(out)) return "";
  const doc = JSON.parse(readFileSync(out, "utf8")) as Record<string, { errors?: unknown[] } | undefined>;
  const errors = Object.entries(doc).flatMap(([k, v]) => (Array.isArray(v?.errors) ? v.errors.map((e) => `${k}: ${String(e)}`) : []));
  return errors.length === 0 ? "" : `\nerrors in the report:\n${errors.join("\n").slice(-8000)}`;
}

function runBench(args: string[], timeoutMs: number): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = execFile(
      process.execPath,
      ["--import", "tsx", "bench/run.ts", ...args],
      { cwd: ROOT, timeout: timeoutMs, killSignal: "SIGTERM", maxBuffer: 16 << 20 },
      (err, stdout, stderr) => {
        resolve({ code: err ? ((err as { code?: number }).code ?? null) : 0, stdout, stderr });
      },
    );
    child.stdin?.end();
  });
}

function expectVariant(v: Variant | null, reps: number, what: string): void {
  expect(v, what).not.toBeNull();
  expect(v!.iters).toBeGreaterThanOrEqual(1);
  expect(v!.perOpS).toHaveLength(reps);
  for (const x of v!.perOpS) expect(x, what).toBeGreaterThan(0);
  expect(v!.medianPerOpS).toBeGreaterThan(0);
  expect(v!.value).toBeGreaterThan(0);
  expect(Number.isFinite(v!.spread)).toBe(true);
  expect(v!.calibration.length).toBeGreaterThanOrEqual(1);
  // Every variant warms up (one block each under --quick), and reports its young generation.
  expect(v!.warmupPerOpS.length, what).toBeGreaterThanOrEqual(1);
  for (const x of v!.warmupPerOpS) expect(x, what).toBeGreaterThan(0);
  expect(v!.medianYoungMiB, what).toBeGreaterThan(0);
}

async function quickReport(name: string, args: string[], timeoutMs: number): Promise<Report> {
  const out = path.join(tmp, `${name}.json`);
  const r = await runBench(["--quick", ...args, "--out", out, "--timeout-s", String(Math.floor(timeoutMs / 1000) - 5)], timeoutMs);
  if (r.code !== 0) throw new Error(`bench exited with ${r.code}\n${r.stderr.slice(-4000)}${failedRuns(out)}`);
  return JSON.parse(readFileSync(out, "utf8")) as Report;
}

/** The timed-block benchmarks, recovery and startup: all the default run has but the heat-recovery and durable jobs. */
const BLOCKS_ONLY =
  "pingpong,stream,stream-isend,allreduce,bcast,barrier,retry-one,retry-one-pingpong,retry-one-stream,cpr,cpr-pingpong,cpr-stream,recovery,elastic,startup";

describe("bench --quick", () => {
  it("raw zeromq.js baselines: every case measured, report well formed", async () => {
    const report = await quickReport("raw", ["--variant", "raw"], 50_000);
    expect(report.tables).toContain("### Ping-pong latency");
    expect(report.schema).toBe("lifeline-bench/2");
    expect(report.options.quick).toBe(true);
    const benches = new Set(report.results.map((r) => r.bench));
    expect([...benches].sort()).toEqual(["allreduce", "barrier", "pingpong", "stream", "stream-isend"]);
    expect(report.results.some((r) => r.bench === "allreduce" && r.np === 4)).toBe(true);
    for (const r of report.results) {
      expect(r.errors, r.key).toEqual([]);
      expect(r.subject).toBeNull();
      expect(r.kinds).toEqual({ subject: null, baseline: r.bench === "pingpong" ? "raw-pingpong" : "raw-pushpull" });
      expectVariant(r.baseline, report.options.reps, r.key);
      expect(r.baseline!.kind).toBe(r.kinds.baseline);
      expect(r.unit).toBe(r.bench === "stream" || r.bench === "stream-isend" ? "MB/s" : "us");
      expect(r.mpiTcp === null || r.mpiTcp > 0).toBe(true);
    }
    // No ratio in the run, so no picture beside its JSON.
    expect(existsSync(path.join(tmp, "raw.svg"))).toBe(false);
  }, 60_000);

  const built = existsSync(path.join(ROOT, "dist/cli.js")) && existsSync(path.join(ROOT, "dist/index.js"));
  it.skipIf(!built)(
    "Lifeline next to raw, retry-one and cpr next to none, recovery in both modes, elastic: ratios, jobs, peers, parts and targets filled in",
    async () => {
      // The start-up benchmark's cold run must leave the examples' compile cache alone: jobs
      // running an example meanwhile (other test files) load their compiled program from it.
      const sentinel = path.join(ROOT, "examples", ".lifeline-cache", `bench-smoke-${process.pid}.mjs`);
      mkdirSync(path.dirname(sentinel), { recursive: true });
      writeFileSync(sentinel, "");
      let report: Report;
      try {
        report = await quickReport("both", ["--variant", "both", "--only", BLOCKS_ONLY], 90_000);
        expect(existsSync(sentinel)).toBe(true);
      } finally {
        rmSync(sentinel, { force: true });
      }
      expect(report.tables).toContain("### Ping-pong latency");
      const benches = new Set(report.results.map((r) => r.bench));
      expect([...benches].sort()).toEqual([
        "allreduce",
        "barrier",
        "bcast",
        "cpr",
        "cpr-pingpong",
        "cpr-stream",
        "pingpong",
        "retry-one",
        "retry-one-pingpong",
        "retry-one-stream",
        "stream",
        "stream-isend",
      ]);
      for (const r of report.results) {
        expect(r.errors, r.key).toEqual([]);
        expectVariant(r.subject, report.options.reps, `${r.key} subject`);
        expect(r.subject!.kind).toBe(r.kinds.subject);
        if (r.bench === "bcast") {
          expect(r.baseline).toBeNull();
        } else {
          expectVariant(r.baseline, report.options.reps, `${r.key} baseline`);
          expect(r.baseline!.kind).toBe(r.kinds.baseline);
          expect(r.ratio).toBeGreaterThan(0);
        }
        if (r.bench.startsWith("retry-one")) {
          // Both sides are Lifeline jobs, told apart by mode; allreduce (ping-pong, stream) blocks in each.
          expect(r.op).toBe({ "retry-one": "allreduce", "retry-one-pingpong": "pingpong", "retry-one-stream": "stream" }[r.bench]);
          expect(r.np).toBe(r.bench === "retry-one" ? 4 : 2);
          expect(r.unit).toBe(r.bench === "retry-one-stream" ? "MB/s" : "us");
          expect(r.kinds).toEqual({ subject: "lifeline:retry-one", baseline: "lifeline:none" });
          expect(r.subject!.job).toBe(`lifeline${r.np}-retry-one`);
          expect(r.baseline!.job).toBe(`lifeline${r.np}`);
          expect(r.mpiTcp).toBeNull();
        } else if (r.bench.startsWith("cpr")) {
          // The cpr family: the same blocks, in a cpr job with nothing due against the mode-none one.
          expect(r.op).toBe({ cpr: "allreduce", "cpr-pingpong": "pingpong", "cpr-stream": "stream" }[r.bench]);
          expect(r.kinds).toEqual({ subject: "lifeline:cpr", baseline: "lifeline:none" });
          expect(r.subject!.job).toBe(`lifeline${r.np}-cpr`);
          expect(r.baseline!.job).toBe(`lifeline${r.np}`);
          expect(r.mpiTcp).toBeNull();
        } else {
          expect(r.subject!.kind).toBe("lifeline:none");
        }
        if (r.mpiTcp !== null) expect(r.ratioMpiTcp).toBeGreaterThan(0);
        if (r.target !== null) expect(typeof r.target.met).toBe("boolean");
      }
      // The picture beside the JSON: a dot for every case with a ratio, each under its label.
      const svg = readFileSync(path.join(tmp, "both.svg"), "utf8");
      const drawn = report.results.filter((r) => r.ratio !== null);
      expect(drawn.length).toBeGreaterThan(10);
      expect(svg.match(/<circle /g)?.length).toBe(drawn.length);
      for (const r of drawn) expect(svg).toContain(`>${r.label}</text>`);
      expect(svg).toMatch(/Targets met: \d+ of \d+\./);
      expect(report.results.filter((r) => r.bench === "retry-one").map((r) => r.key)).toEqual(["retry-one np4 8 B", "retry-one np4 64 KiB"]);
      expect(report.results.filter((r) => r.bench.startsWith("retry-one-")).map((r) => r.key)).toEqual([
        "retry-one-pingpong np2 8 B",
        "retry-one-pingpong np2 64 KiB",
        "retry-one-stream np2 64 KiB",
      ]);
      expect(report.results.find((r) => r.key === "retry-one-pingpong np2 8 B")!.target?.text).toBe("<= 1.1x none");
      expect(report.tables).toContain("| case | retry-one us | none us | r1/none (time) [IQR] |");
      expect(report.tables).toContain("| case | retry-one MB/s | none MB/s | r1/none (MB/s) [IQR] |");
      const lifelineJobs = report.jobs.filter((x) => String(x.job).startsWith("lifeline"));
      const jobModes = lifelineJobs.map((j) => `${String(j.job)} ${String(j.mode)}`);
      expect(jobModes).toContain("lifeline4-retry-one retry-one");
      expect(jobModes).toContain("lifeline2-retry-one retry-one");
      // The message-path jobs run without retry-one's durable floor, and cpr's with nothing due.
      for (const j of lifelineJobs) if (j.mode === "retry-one") expect(j.durableEvery).toBe(0);
      expect(jobModes).toContain("lifeline4-cpr cpr");
      expect(jobModes).toContain("lifeline2-cpr cpr");
      for (const j of lifelineJobs) if (j.mode === "cpr") expect(j.checkpointEvery).toBe("1000000s");
      expect(report.results.filter((r) => r.bench === "cpr").map((r) => r.key)).toEqual(["cpr np4 8 B", "cpr np4 64 KiB"]);
      expect(report.results.filter((r) => r.bench.startsWith("cpr-")).map((r) => r.key)).toEqual([
        "cpr-pingpong np2 8 B",
        "cpr-pingpong np2 64 KiB",
        "cpr-stream np2 64 KiB",
      ]);
      expect(report.tables).toContain("| case | cpr us | none us | cpr/none (time) [IQR] |");
      for (const j of lifelineJobs) {
        expect(j.exitCode, JSON.stringify(j)).toBe(0);
        expect(j.restarts ?? 0).toBe(0);
      }
      // Recovery: one run per mode; the parts are finite, add up, and only retry-one keeps the survivors.
      expect(report.recovery?.errors).toEqual([]);
      expect(report.recovery!.runs.map((r) => r.mode).sort()).toEqual(["cpr", "retry-one"]);
      for (const r of report.recovery!.runs) {
        for (const k of ["detectMs", "restartMs", "loadMs", "catchUpMs", "totalMs"] as const)
          expect(Number.isFinite(r[k]) && r[k] >= 0, `${r.mode} ${k} = ${r[k]}`).toBe(true);
        expect(r.detectMs + r.restartMs + r.loadMs + r.catchUpMs).toBeCloseTo(r.totalMs, 0);
        expect(r.restarted).toBe(r.mode === "cpr" ? 4 : 1);
        expect(r.restoredStep).toBeLessThan(r.failStep);
      }
      expect(report.tables).toMatch(/### Recovery, 4 ranks, \d+ MiB global \+ 1 MiB local state per rank/);
      expect(report.tables).toMatch(/Target \(retry-one, kill → restarted rank caught up\) <= 1 s: (met|NOT met)/);
      // Elastic: a loss with no process started, parts that add up; a joiner that got the model.
      expect(report.elastic?.errors).toEqual([]);
      for (const r of report.elastic!.shrink) {
        expect(r.spawned).toBe(4);
        expect(r.detectMs + r.agreeMs).toBeCloseTo(r.restoredMs, 0);
        expect(r.at).toBeLessThanOrEqual(r.failStep);
      }
      expect(report.elastic!.join).toHaveLength(1);
      expect(report.elastic!.join[0]!.transferMs).toBeGreaterThanOrEqual(0);
      expect(report.tables).toMatch(/Target \(fault → every survivor computing again, no process started: none was\) <= 0.3 s: (met|NOT met)/);
    },
    95_000,
  );

  it.skipIf(!built)(
    "heat-recovery (lifeline drill, retry-one vs cpr) and durable (--durable-every N vs 0): runs, parts, ratios",
    async () => {
      const report = await quickReport("jobs", ["--only", "heat-recovery,durable"], 75_000);
      expect(report.results).toEqual([]);
      expect(report.heatRecovery?.errors).toEqual([]);
      expect(report.heatRecovery!.runs.map((r) => r.mode).sort()).toEqual(["cpr", "retry-one"]);
      for (const r of report.heatRecovery!.runs) {
        for (const k of ["detectMs", "restartMs", "catchUpMs", "totalMs", "totalLowMs"] as const)
          expect(Number.isFinite(r[k]) && r[k] >= 0, `${r.mode} ${k} = ${r[k]}`).toBe(true);
        expect(r.detectMs + r.restartMs + r.catchUpMs).toBeCloseTo(r.totalMs, 0);
        expect(r.totalLowMs).toBeLessThanOrEqual(r.totalMs);
        if (r.mode === "retry-one") expect(r.workLostSteps, `retry-one run: ${JSON.stringify(r)}`).toBe(0);
      }
      expect(report.heatRecovery!.ratio).toBeGreaterThan(0);
      expect(report.heatRecovery!.target).toBe(0.5);
      expect(report.tables).toMatch(/### Recovery of one killed rank in examples\/heat\.ts: 4 ranks/);
      expect(report.tables).toMatch(/Ratio retry-one \/ cpr \(kill → caught up, medians [\d.]+ s \/ [\d.]+ s\): [\d.]+x; target <= 0\.5x: (met|NOT met)/);
      expect(report.durable?.errors).toEqual([]);
      expect(report.durable!.runs.map((r) => r.every).sort((a, b) => a - b)).toEqual([0, 10]);
      for (const r of report.durable!.runs) {
        expect(r.computeMs).toBeGreaterThan(0);
        // No floor, no durable lines; with one (30 steps, every 10th), some.
        if (r.every === 0) expect(r.lines).toBe(0);
        else expect(r.lines).toBeGreaterThan(0);
      }
      expect(report.durable!.summary.find((x) => x.every === 10)!.ratio).toBeGreaterThan(0);
      expect(report.tables).toMatch(/### The durable floor's cost: bench\/programs\/recovery\.ts on 4 ranks/);
      expect(report.tables).toMatch(/N meeting <= 1\.05x: .*; smallest: .*\./);
    },
    80_000,
  );

  it("--hosts: ping-pong and allreduce across test hosts (network namespaces), Lifeline next to raw zeromq.js; recovery after a lost host", async () => {
    const out = path.join(tmp, "hosts.json");
    const r = await runBench(
      [
        "--hosts",
        "--quick",
        "--only",
        "pingpong,allreduce,recovery,partner",
        "--sizes",
        "8",
        "--np",
        "2",
        "--recovery-runs",
        "1",
        "--out",
        out,
        "--timeout-s",
        "170",
      ],
      180_000,
    );
    if (r.code !== 0) throw new Error(`bench exited with ${r.code}\n${r.stderr.slice(-4000)}${failedRuns(out)}`);
    expect(r.stderr).toMatch(/bench: 2 test hosts, 198\.18\.0\.1, 198\.18\.0\.2/);
    const report = JSON.parse(readFileSync(out, "utf8")) as Report;
    expect(report.results.map((x) => x.key)).toEqual(["pingpong np2 8 B", "allreduce np2 8 B"]);
    for (const x of report.results) {
      expectVariant(x.subject, 3, `${x.key} Lifeline`);
      expectVariant(x.baseline, 3, `${x.key} raw`);
      expect(x.ratio).toBeGreaterThan(0);
    }
    expect(report.tables).toContain("transport tcp");
    for (const j of report.jobs.filter((x) => String(x.job).startsWith("lifeline"))) expect(j.exitCode, JSON.stringify(j)).toBe(0);
    // Host 2 of 3 lost with ranks 2 and 3: retry-one restarts those two, cpr all four, on the spare host.
    expect(report.recovery?.errors).toEqual([]);
    expect(report.recovery!.runs.map((x) => [x.mode, x.restarted]).sort()).toEqual([
      ["cpr", 4],
      ["retry-one", 2],
    ]);
    for (const x of report.recovery!.runs) {
      expect(x.detectMs).toBeGreaterThan(0);
      expect(x.detectMs + x.restartMs + x.loadMs + x.catchUpMs).toBeCloseTo(x.totalMs, 0);
    }
    expect(report.tables).toMatch(/### Recovery after a lost host, 4 ranks on 2 test hosts \+ 1 spare/);
    // Partner copies: a run with and one without, each with lines measured, and the ratio.
    expect(report.partner?.errors).toEqual([]);
    expect(report.partner!.runs.map((x) => x.scope).sort()).toEqual(["host", "shared"]);
    for (const x of report.partner!.runs) expect(x.lineMs).toBeGreaterThan(0);
    expect(report.tables).toMatch(/Partner copy: \d+\.\d\dx the local write alone \(target <= 1\.3: (met|NOT met)\)/);
  }, 190_000);
});
