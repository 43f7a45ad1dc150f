/**
 * Goal: the benchmark's plan and tables — in particular the retry-one family (allreduce,
 * ping-pong and streaming in a Lifeline job under --mode retry-one vs one under --mode none)
 * and the heat-recovery and durable tables — are built and labelled as documented in
 * bench/README.md, without starting any process.
 *
 * Method: call bench/lib/plan.ts, bench/lib/report.ts, bench/lib/heat-recovery.ts and
 * bench/lib/durable.ts directly: case lists for the full, quick and overridden sizes, the jobs
 * and block each case uses, the targets, and the tables rendered from hand-made results.
 * Milliseconds; the end-to-end run is bench-smoke.test.ts.
 */
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import {
  BENCHMARKS,
  BENCH_NAMES,
  FULL_SIZES,
  MiB,
  KiB,
  QUICK_SIZES,
  buildCases,
  caseKey,
  sizeLabel,
  describeKind,
  insecureKind,
  jobsOf,
  lifelineModeOf,
  opOf,
  peerFigure,
  ratioOf,
  targetFor,
  unitOf,
  warmupOf,
  MODE_WARMUP_OPS,
  MODE_WARMUP_MS_MAX,
  type Benchmark,
  type Case,
  type JobKind,
  type PeersFile,
} from "../../bench/lib/plan.ts";
import { columnsOf, renderTables, type CaseResult, type VariantResult } from "../../bench/lib/report.ts";
import { chartPathFor, renderChart, verdictOf } from "../../bench/lib/chart.ts";
import { HEAT_RECOVERY_FULL, heatRecoveryRatio, renderHeatRecoveryTable, type HeatRecoveryRun } from "../../bench/lib/heat-recovery.ts";
import { DURABLE_FULL, renderDurableTable, smallestMeeting, summarizeDurable, type DurableRun } from "../../bench/lib/durable.ts";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");

describe("bench plan: retry-one", () => {
  it("is a benchmark of the suite (default run, --only) but not a block any program runs", () => {
    expect(BENCHMARKS).toContain("retry-one");
    expect(BENCHMARKS.slice(0, BENCH_NAMES.length)).toEqual(BENCH_NAMES);
    expect(BENCH_NAMES as readonly string[]).not.toContain("retry-one");
    expect(opOf("retry-one")).toBe("allreduce");
    for (const b of BENCH_NAMES) expect(opOf(b)).toBe(b);
  });

  it("runs allreduce on np 4 at 8 B, 64 KiB, 1 MiB and 16 MiB; quick: 8 B and 64 KiB; --sizes/--np override", () => {
    const only = new Set<Benchmark>(["retry-one"]);
    const full = buildCases(FULL_SIZES, only);
    expect(full.map(caseKey)).toEqual(["retry-one np4 8 B", "retry-one np4 64 KiB", "retry-one np4 1 MiB", "retry-one np4 16 MiB"]);
    expect(full.map((c) => c.label)).toEqual(["np 4, 8 B", "np 4, 64 KiB", "np 4, 1 MiB", "np 4, 16 MiB"]);
    expect(buildCases(QUICK_SIZES, only).map((c) => c.bytes)).toEqual([8, 64 * KiB]);
    const over = buildCases({ ...FULL_SIZES, modeAllreduce: [8, MiB], modeNps: [2, 4] }, only);
    expect(over.map(caseKey)).toEqual(["retry-one np2 8 B", "retry-one np2 1 MiB", "retry-one np4 8 B", "retry-one np4 1 MiB"]);
  });

  it("is in a full default run, after the other collectives, and absent unless selected", () => {
    const all = buildCases(FULL_SIZES, new Set(BENCHMARKS));
    const np4 = all.filter((c) => c.np === 4).map((c) => c.bench);
    expect(np4.indexOf("retry-one")).toBeGreaterThan(np4.lastIndexOf("barrier"));
    expect(all.filter((c) => c.bench === "retry-one")).toHaveLength(4);
    expect(buildCases(FULL_SIZES, new Set<Benchmark>(["allreduce"])).some((c) => c.bench === "retry-one")).toBe(false);
  });

  it("compares a retry-one Lifeline job with a mode-none one, whatever --mode says", () => {
    for (const mode of ["none", "cpr", "retry-one"] as const) {
      expect(jobsOf("retry-one", mode)).toEqual({ subject: "lifeline:retry-one", baseline: "lifeline:none" });
    }
    // --mode keeps its meaning for the others.
    expect(jobsOf("allreduce", "cpr")).toEqual({ subject: "lifeline:cpr", baseline: "raw-pushpull" });
    expect(jobsOf("pingpong", "none")).toEqual({ subject: "lifeline:none", baseline: "raw-pingpong" });
    expect(jobsOf("bcast", "retry-one")).toEqual({ subject: "lifeline:retry-one", baseline: undefined });
    expect(describeKind("lifeline:retry-one")).toBe("lifeline --mode retry-one");
    expect(describeKind("raw-pushpull")).toBe("raw-pushpull");
  });

  it("warm-up: the mode families run at least 12,000 operations within 12 s; the others, and --warmup-ms 0, the time alone", () => {
    const c = (bench: Benchmark, bytes = 8, np = 4): Case => ({ bench, np, bytes, label: "" });
    for (const b of ["retry-one", "retry-one-pingpong", "retry-one-stream", "cpr", "cpr-pingpong", "cpr-stream"] as const) {
      expect(warmupOf(c(b), 1500), b).toEqual({ ms: 1500, minOps: MODE_WARMUP_OPS, maxMs: MODE_WARMUP_MS_MAX });
      expect(warmupOf(c(b), 0), b).toEqual({ ms: 0, minOps: 0, maxMs: 0 });
    }
    expect([MODE_WARMUP_OPS, MODE_WARMUP_MS_MAX]).toEqual([12_000, 12_000]);
    // A --warmup-ms longer than the cap stays the floor.
    expect(warmupOf(c("retry-one"), 30_000)).toEqual({ ms: 30_000, minOps: MODE_WARMUP_OPS, maxMs: 30_000 });
    for (const b of ["pingpong", "stream", "allreduce", "barrier", "bcast"] as const)
      expect(warmupOf(c(b), 1500), b).toEqual({ ms: 1500, minOps: 0, maxMs: 1500 });
  });

  it("--curve compares a Lifeline job with CURVE against the same under --insecure, with the security work's targets (8 B ping-pong, 1 MiB allreduce)", () => {
    expect(jobsOf("pingpong", "none", true)).toEqual({ subject: "lifeline:none", baseline: "lifeline-insecure:none" });
    expect(jobsOf("allreduce", "cpr", true)).toEqual({ subject: "lifeline:cpr", baseline: "lifeline-insecure:cpr" });
    expect(jobsOf("retry-one", "none", true)).toEqual({ subject: "lifeline:retry-one", baseline: "lifeline:none" });
    expect(lifelineModeOf("lifeline-insecure:cpr")).toBe("cpr");
    expect(insecureKind("lifeline-insecure:none")).toBe(true);
    expect(insecureKind("lifeline:none")).toBe(false);
    expect(describeKind("lifeline-insecure:none")).toBe("lifeline --mode none --insecure");
    const c = (bench: Benchmark, bytes: number, np = 2): Case => ({ bench, np, bytes, label: "" });
    expect(targetFor(c("pingpong", 8), true)!.text).toBe("<= 1.15x insecure");
    expect(targetFor(c("allreduce", MiB, 4), true)!.met(1.49)).toBe(true);
    expect(targetFor(c("allreduce", MiB, 4), true)!.met(1.51)).toBe(false);
    expect(targetFor(c("stream", 16 * MiB), true)).toBeUndefined();
    expect(columnsOf("pingpong", "lifeline-insecure:none")).toMatchObject({ subject: "CURVE", baseline: "insecure", peers: false });
    expect(columnsOf("pingpong", "raw-pingpong")).toMatchObject({ subject: "Lifeline", baseline: "raw" });
  });

  it("targets: retry-one within 1.1x of the mode-none time at every size", () => {
    const c = (bytes: number, bench: Benchmark = "retry-one"): Case => ({ bench, np: 4, bytes, label: "" });
    expect(unitOf("retry-one")).toBe("us");
    expect(ratioOf(c(8), 3e-3, 2e-3)).toBeCloseTo(1.5); // retry-one time / none time
    for (const bytes of [8, 64 * KiB, MiB, 16 * MiB]) {
      const t = targetFor(c(bytes))!;
      expect(t.text).toBe("<= 1.1x none");
      expect([t.met(1.1), t.met(1.11)]).toEqual([true, false]);
    }
    const peers = JSON.parse(readFileSync(path.join(ROOT, "bench/peers.json"), "utf8")) as PeersFile;
    expect(peerFigure(peers, c(8))).toBeUndefined();
    expect(peerFigure(peers, c(8, "allreduce"))).toBeGreaterThan(0);
  });

  it("targets of the message path: the message-path issue's list, against the same run's raw programs", () => {
    const c = (bench: Benchmark, bytes: number, np = 2): Case => ({ bench, np, bytes, label: "" });
    expect(targetFor(c("pingpong", 8))!.text).toBe("<= 1.15x raw");
    expect(targetFor(c("pingpong", 64 * KiB))!.text).toBe("<= 1.2x raw");
    expect(targetFor(c("pingpong", MiB))!.met(1.21)).toBe(false);
    expect(targetFor(c("pingpong", KiB))).toBeUndefined();
    expect(targetFor(c("pingpong", 16 * MiB))).toBeUndefined();
    for (const bytes of [64 * KiB, MiB, 16 * MiB]) {
      for (const bench of ["stream", "stream-isend"] as const) {
        const t = targetFor(c(bench, bytes))!;
        expect(t.text).toBe(">= 0.9x raw MB/s");
        expect([t.met(0.9), t.met(0.89)]).toEqual([true, false]);
      }
    }
    // stream-isend: the stream's sizes, the raw stream as its baseline, in MB/s.
    expect(buildCases(FULL_SIZES, new Set<Benchmark>(["stream-isend"])).map(caseKey)).toEqual([
      "stream-isend np2 64 KiB",
      "stream-isend np2 1 MiB",
      "stream-isend np2 16 MiB",
    ]);
    expect(jobsOf("stream-isend", "none").baseline).toBe("raw-pushpull");
    expect(unitOf("stream-isend")).toBe("MB/s");
    const small = targetFor(c("allreduce", 8, 4))!;
    expect(small.text).toBe("<= 0.5x raw ring");
    expect([small.met(0.5), small.met(0.51)]).toEqual([true, false]);
    for (const bytes of [64 * KiB, MiB, 16 * MiB, 64 * MiB]) expect(targetFor(c("allreduce", bytes, 4))!.text).toBe("<= 1.0x raw ring");
    expect(targetFor(c("allreduce", MiB, 2))!.text).toBe("<= 1.0x raw ring");
    expect(targetFor(c("allreduce", 64 * KiB, 2))).toBeUndefined();
    expect(targetFor(c("allreduce", 8, 2))).toBeUndefined();
    expect(targetFor(c("barrier", 0, 4))!.text).toBe("<= 0.5x raw ring 8 B");
    expect(targetFor(c("barrier", 0, 2))).toBeUndefined();
    expect(targetFor(c("bcast", MiB, 4))).toBeUndefined();
    // The barrier's baseline is the raw ring's 8 B allreduce, run by the raw push/pull program.
    expect(jobsOf("barrier", "none")).toEqual({ subject: "lifeline:none", baseline: "raw-pushpull" });
  });
});

describe("bench plan: retry-one-pingpong and retry-one-stream", () => {
  it("are benchmarks of the suite running ping-pong and stream blocks, retry-one vs none", () => {
    expect(BENCHMARKS).toEqual([...BENCH_NAMES, "retry-one", "retry-one-pingpong", "retry-one-stream", "cpr", "cpr-pingpong", "cpr-stream"]);
    expect(opOf("retry-one-pingpong")).toBe("pingpong");
    expect(opOf("retry-one-stream")).toBe("stream");
    for (const b of ["retry-one-pingpong", "retry-one-stream"] as const) {
      for (const mode of ["none", "cpr", "retry-one"] as const) expect(jobsOf(b, mode)).toEqual({ subject: "lifeline:retry-one", baseline: "lifeline:none" });
    }
    expect(unitOf("retry-one-pingpong")).toBe("us");
    expect(unitOf("retry-one-stream")).toBe("MB/s");
  });

  it("run on 2 ranks: ping-pong 8 B, 64 KiB, 1 MiB and stream 1 MiB, 16 MiB; quick: 8 B, 64 KiB and 64 KiB; in the default run", () => {
    const only = new Set<Benchmark>(["retry-one-pingpong", "retry-one-stream"]);
    expect(buildCases(FULL_SIZES, only).map(caseKey)).toEqual([
      "retry-one-pingpong np2 8 B",
      "retry-one-pingpong np2 64 KiB",
      "retry-one-pingpong np2 1 MiB",
      "retry-one-stream np2 1 MiB",
      "retry-one-stream np2 16 MiB",
    ]);
    expect(buildCases(QUICK_SIZES, only).map(caseKey)).toEqual(["retry-one-pingpong np2 8 B", "retry-one-pingpong np2 64 KiB", "retry-one-stream np2 64 KiB"]);
    expect(buildCases(FULL_SIZES, only).map((c) => c.label)).toEqual(["8 B", "64 KiB", "1 MiB", "1 MiB", "16 MiB"]);
    const all = buildCases(FULL_SIZES, new Set(BENCHMARKS));
    expect(all.filter((c) => c.bench === "retry-one-pingpong" || c.bench === "retry-one-stream")).toHaveLength(5);
    expect(buildCases(FULL_SIZES, new Set<Benchmark>(["pingpong", "stream"])).some((c) => c.bench.startsWith("retry-one"))).toBe(false);
  });

  it("targets: within 1.1x of none's time (ping-pong) and bandwidth (stream) at every size", () => {
    const c = (bench: Benchmark, bytes: number): Case => ({ bench, np: 2, bytes, label: "" });
    for (const bytes of [8, 64 * KiB, MiB]) {
      const pp = targetFor(c("retry-one-pingpong", bytes))!;
      expect(pp.text).toBe("<= 1.1x none");
      expect([pp.met(1.1), pp.met(1.11)]).toEqual([true, false]);
    }
    for (const bytes of [MiB, 16 * MiB]) {
      const st = targetFor(c("retry-one-stream", bytes))!;
      expect(st.text).toBe(">= 0.9x none MB/s");
      expect([st.met(1 / 1.1), st.met(0.9)]).toEqual([true, false]);
    }
    // Bandwidth ratio: retry-one MB/s / none MB/s = none time / retry-one time.
    expect(ratioOf(c("retry-one-stream", 16 * MiB), 2e-2, 1e-2)).toBeCloseTo(0.5);
    const peers = JSON.parse(readFileSync(path.join(ROOT, "bench/peers.json"), "utf8")) as PeersFile;
    expect(peerFigure(peers, c("retry-one-pingpong", 8))).toBeUndefined();
  });
});

function variant(job: string, kind: JobKind, us: number, cpuUs: number): VariantResult {
  return {
    job,
    kind,
    iters: 10,
    calibration: [[1, 1e-3]],
    warmupPerOpS: [us / 1e6],
    perOpS: [us / 1e6, us / 1e6],
    medianPerOpS: us / 1e6,
    value: us,
    spread: 0.1,
    cpuPerOpS: [cpuUs / 1e6],
    medianCpuUs: cpuUs,
    medianLoopUs: cpuUs / 2,
    medianMinorFaults: 1,
    medianGcUs: cpuUs / 10,
    medianMajorGcs: 0,
    medianYoungMiB: 8,
  };
}

function result(bench: Benchmark, bytes: number, subject: VariantResult | null, baseline: VariantResult | null, extra: Partial<CaseResult> = {}): CaseResult {
  const c: Case = { bench, np: 4, bytes, label: `np 4, ${sizeLabel(bytes)}` };
  const t = targetFor(c);
  const ratio = subject && baseline ? ratioOf(c, subject.medianPerOpS, baseline.medianPerOpS) : null;
  return {
    key: caseKey(c),
    bench,
    op: opOf(bench),
    np: 4,
    bytes,
    label: c.label,
    unit: unitOf(bench),
    kinds: { subject: subject?.kind ?? null, baseline: baseline?.kind ?? null },
    subject,
    baseline,
    ratio,
    ratioQ1: ratio,
    ratioQ3: ratio,
    mpiTcp: null,
    ratioMpiTcp: null,
    target: t === undefined ? null : { text: t.text, bound: t.bound, atMost: t.atMost, met: ratio === null ? null : t.met(ratio), withinNoise: false },
    errors: [],
    ...extra,
  };
}

describe("bench tables: retry-one", () => {
  const r1 = (us: number): VariantResult => variant("lifeline4-retry-one", "lifeline:retry-one", us, us * 2);
  const none = (us: number): VariantResult => variant("lifeline4", "lifeline:none", us, us * 2);
  const tables = renderTables(
    [
      result("allreduce", 8, variant("lifeline4", "lifeline:none", 900, 1000), variant("rawpush4", "raw-pushpull", 1000, 900), {
        mpiTcp: 31.69,
        ratioMpiTcp: 28.4,
      }),
      result("retry-one", 8, r1(1200), none(1000)),
      result("retry-one", 16 * MiB, r1(220_000), none(200_000)),
      result("retry-one", 64 * KiB, null, none(5000), { errors: ["subject (lifeline --mode retry-one): boom\nstack"] }),
    ],
    "ipc",
  );
  const section = (title: string): string => {
    const from = tables.indexOf(title);
    expect(from, title).toBeGreaterThanOrEqual(0);
    const next = tables.indexOf("###", from + 3);
    return tables.slice(from, next < 0 ? undefined : next);
  };

  it("labels the columns retry-one / none, with no raw or Open MPI column", () => {
    const s = section("### Allreduce, Float64Array sum, per op, slowest rank (us): Lifeline job under --mode retry-one vs Lifeline job under --mode none");
    const lines = s.split("\n").filter((l) => l.startsWith("|"));
    expect(lines[0]).toBe("| case | retry-one us | none us | r1/none (time) [IQR] | spread r1 / none | CPU us/op r1 / none | target | met |");
    expect(lines[1]).toBe("| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |");
    expect(s).not.toMatch(/raw|Open MPI|MPI-TCP/);
    expect(lines[2]).toBe("| np 4, 8 B | 1200 | 1000 | 1.20x [1.20x–1.20x] | 10% / 10% | 2400 / 2000 | <= 1.1x none | NOT met |");
    expect(lines[3]).toBe("| np 4, 16 MiB | 220000 | 200000 | 1.10x [1.10x–1.10x] | 10% / 10% | 440000 / 400000 | <= 1.1x none | met |");
    expect(lines[4]).toBe("| np 4, 64 KiB | error | 5000 | — | — / 10% | — / 10000 | <= 1.1x none | n/a |");
    expect(columnsOf("retry-one")).toMatchObject({ subject: "retry-one", baseline: "none", peers: false });
  });

  it("leaves the Lifeline vs raw tables as they were", () => {
    const s = section("### Allreduce, Float64Array sum, per op, slowest rank (us); raw = hand-written ring");
    expect(s).toContain(
      "| case | Lifeline us | raw us | L/raw (time) [IQR] | Open MPI TCP us | L/MPI-TCP | spread L / raw | CPU us/op L / raw | target | met |",
    );
    expect(s).toContain("| np 4, 8 B | 900.0 | 1000 | 0.90x [0.90x–0.90x] | 31.69 | 28.4x | 10% / 10% | 1000 / 900.0 | <= 0.5x raw ring | NOT met |");
  });

  it("names a Lifeline mode other than none (--mode) in the Lifeline vs raw titles only", () => {
    expect(tables).not.toContain("Lifeline = ");
    const cpr = renderTables(
      [
        result("allreduce", 8, variant("lifeline4-cpr", "lifeline:cpr", 900, 1000), variant("rawpush4", "raw-pushpull", 1000, 900)),
        result("retry-one", 8, r1(1200), none(1000)),
      ],
      "tcp",
    );
    expect(cpr).toContain("raw = hand-written ring — transport tcp, Lifeline = lifeline --mode cpr\n");
    expect(cpr).toContain("both in this run — transport tcp\n");
  });

  it("labels the point-to-point tables retry-one / none, in us and MB/s", () => {
    const p2p = (bench: Benchmark, bytes: number, s: VariantResult, b: VariantResult): CaseResult =>
      result(bench, bytes, s, b, { np: 2, label: sizeLabel(bytes), key: caseKey({ bench, np: 2, bytes, label: "" }) });
    const t = renderTables(
      [
        p2p("retry-one-pingpong", 8, variant("lifeline2-retry-one", "lifeline:retry-one", 60, 100), variant("lifeline2", "lifeline:none", 50, 90)),
        // Stream: the unit is MB/s, the ratio retry-one MB/s / none MB/s (16 MiB in 20 ms vs 16 ms).
        p2p("retry-one-stream", 16 * MiB, variant("lifeline2-retry-one", "lifeline:retry-one", 20_000, 100), variant("lifeline2", "lifeline:none", 16_000, 90)),
      ],
      "ipc",
    );
    expect(t).toContain(
      "### Ping-pong latency, one way = round trip / 2, 2 processes (us): Lifeline job under --mode retry-one vs Lifeline job under --mode none",
    );
    expect(t).toContain("| case | retry-one us | none us | r1/none (time) [IQR] | spread r1 / none | CPU us/op r1 / none | target | met |");
    expect(t).toContain("| 8 B | 60.00 | 50.00 | 1.20x [1.20x–1.20x] | 10% / 10% | 100.0 / 90.00 | <= 1.1x none | NOT met |");
    expect(t).toContain(
      "### Unidirectional streaming bandwidth, 2 processes (MB/s, 1 MB = 1e6 B): Lifeline job under --mode retry-one vs Lifeline job under --mode none",
    );
    expect(t).toContain("| case | retry-one MB/s | none MB/s | r1/none (MB/s) [IQR] | spread r1 / none | CPU us/op r1 / none | target | met |");
    expect(t).toContain("| 16 MiB | 20000 | 16000 | 0.80x [0.80x–0.80x] | 10% / 10% | 100.0 / 90.00 | >= 0.9x none MB/s | NOT met |");
    expect(t).not.toMatch(/Open MPI|MPI-TCP/);
    expect(columnsOf("retry-one-stream")).toMatchObject({ subject: "retry-one", baseline: "none", peers: false });
  });

  it("lists errors and counts the retry-one targets with the others", () => {
    expect(tables).toContain("- retry-one np4 64 KiB: subject (lifeline --mode retry-one): boom");
    expect(tables).toContain("Targets met: 1 of 4.");
  });
});

describe("bench plan and tables: the cpr family (cpr with nothing due vs none)", () => {
  it("runs retry-one's blocks and sizes in a cpr job against a mode-none one, whatever --mode says", () => {
    for (const b of ["cpr", "cpr-pingpong", "cpr-stream"] as const) expect(BENCHMARKS).toContain(b);
    expect([opOf("cpr"), opOf("cpr-pingpong"), opOf("cpr-stream")]).toEqual(["allreduce", "pingpong", "stream"]);
    for (const mode of ["none", "cpr", "retry-one"] as const) {
      for (const curve of [false, true]) expect(jobsOf("cpr-stream", mode, curve)).toEqual({ subject: "lifeline:cpr", baseline: "lifeline:none" });
    }
    const only = new Set<Benchmark>(["cpr", "cpr-pingpong", "cpr-stream"]);
    expect(buildCases(FULL_SIZES, only).map(caseKey)).toEqual([
      "cpr np4 8 B",
      "cpr np4 64 KiB",
      "cpr np4 1 MiB",
      "cpr np4 16 MiB",
      "cpr-pingpong np2 8 B",
      "cpr-pingpong np2 64 KiB",
      "cpr-pingpong np2 1 MiB",
      "cpr-stream np2 1 MiB",
      "cpr-stream np2 16 MiB",
    ]);
    // In a full default run, as the retry-one family is.
    expect(buildCases(FULL_SIZES, new Set(BENCHMARKS)).filter((c) => c.bench === "cpr")).toHaveLength(4);
    expect(buildCases(FULL_SIZES, new Set<Benchmark>(["retry-one"])).some((c) => c.bench.startsWith("cpr"))).toBe(false);
  });

  it("targets: within 1.1x of none's time, streaming at least 1/1.1 of its bandwidth", () => {
    const c = (bench: Benchmark, bytes: number): Case => ({ bench, np: 2, bytes, label: "" });
    for (const bench of ["cpr", "cpr-pingpong"] as const) {
      const t = targetFor(c(bench, 64 * KiB))!;
      expect(t.text).toBe("<= 1.1x none");
      expect([t.met(1.1), t.met(1.11)]).toEqual([true, false]);
    }
    const s = targetFor(c("cpr-stream", 16 * MiB))!;
    expect(s.text).toBe(">= 0.9x none MB/s");
    expect([s.met(0.91), s.met(0.9)]).toEqual([true, false]);
    expect(unitOf("cpr-stream")).toBe("MB/s");
  });

  it("labels its tables cpr / none, with no raw or Open MPI column", () => {
    const t = renderTables(
      [
        result("cpr", 8, variant("lifeline4-cpr", "lifeline:cpr", 1050, 2100), variant("lifeline4", "lifeline:none", 1000, 2000)),
        result("cpr-stream", 16 * MiB, variant("lifeline2-cpr", "lifeline:cpr", 16_000, 100), variant("lifeline2", "lifeline:none", 16_000, 90), {
          np: 2,
          label: "16 MiB",
        }),
      ],
      "ipc",
    );
    expect(t).toContain(
      "### Allreduce, Float64Array sum, per op, slowest rank (us): Lifeline job under --mode cpr with nothing due vs Lifeline job under --mode none, both in this run — transport ipc\n",
    );
    expect(t).toContain("| case | cpr us | none us | cpr/none (time) [IQR] | spread cpr / none | CPU us/op cpr / none | target | met |");
    expect(t).toContain("| np 4, 8 B | 1050 | 1000 | 1.05x [1.05x–1.05x] | 10% / 10% | 2100 / 2000 | <= 1.1x none | met |");
    expect(t).toContain("| case | cpr MB/s | none MB/s | cpr/none (MB/s) [IQR] | spread cpr / none | CPU us/op cpr / none | target | met |");
    // (The hand-made figures are in the table's unit already: `value` is what it prints.)
    expect(t).toContain("| 16 MiB | 16000 | 16000 | 1.00x [1.00x–1.00x] | 10% / 10% | 100.0 / 90.00 | >= 0.9x none MB/s | met |");
    expect(t).not.toMatch(/Open MPI|MPI-TCP|Lifeline = /);
    expect(columnsOf("cpr-pingpong")).toMatchObject({ subject: "cpr", baseline: "none", peers: false });
  });
});

describe("bench tables: heat-recovery and durable", () => {
  const heat = (mode: "retry-one" | "cpr", round: number, totalMs: number, lowMs = totalMs): HeatRecoveryRun => ({
    mode,
    round,
    totalMs,
    detectMs: 10,
    restartMs: totalMs / 2,
    catchUpMs: totalMs / 2 - 10,
    totalLowMs: lowMs,
    restoreEpoch: mode === "cpr" ? 3 : 199,
    workLostSteps: mode === "cpr" ? 20 : 0,
    restarts: 1,
    faultyWallMs: 5000,
    referenceWallMs: 2000,
  });

  it("heat-recovery: medians per mode, the ratio retry-one / cpr on the drill's figures and on cpr's earliest, error rows", () => {
    const runs = [heat("retry-one", 0, 300), heat("cpr", 0, 1600, 1400), heat("retry-one", 1, 500), heat("cpr", 1, 1000, 900), heat("retry-one", 2, 400)];
    expect(heatRecoveryRatio(runs)).toEqual({ retryOneMs: 400, cprMs: 1300, cprLowMs: 1150, ratio: 400 / 1300, ratioLow: 400 / 1150 });
    const t = renderHeatRecoveryTable(
      runs,
      [{ mode: "cpr", round: 2, message: "heat-recovery cpr round 3: verdict results differ on ranks 1\ntail" }],
      HEAT_RECOVERY_FULL,
    );
    expect(t).toContain("### Recovery of one killed rank in examples/heat.ts: 4 ranks, 512x512, 400 iterations, rank 1 killed at its 200th checkpoint()");
    expect(t).toContain("| retry-one | 3 | 1 rank | 0.010 | 0.200 | 0.190 | 0.400 | 0.400 | 0 | 199, 199, 199 | identical |");
    expect(t).toContain("| cpr --checkpoint-every 10steps | 2 | all 4 | 0.010 | 0.650 | 0.640 | 1.300 | 1.150 | 20 | 3, 3 | identical |");
    expect(t).toContain("| cpr (round 3) | error |");
    expect(t).toContain(
      "Ratio retry-one / cpr (kill → caught up, medians 0.400 s / 1.300 s): 0.31x; target <= 0.5x: met (with cpr's earliest possible catch-up, 1.150 s: 0.35x, met).",
    );
    expect(renderHeatRecoveryTable([heat("cpr", 0, 1000)], [], HEAT_RECOVERY_FULL)).toContain("Ratio retry-one / cpr: n/a");
  });

  it("durable: each N's median and ratio to N = 0, paired ratios, lines, and the smallest N meeting <= 1.05x", () => {
    const run = (every: number, round: number, computeMs: number, lines: number): DurableRun => ({
      every,
      round,
      computeMs,
      untilFinalizeMs: computeMs - 100,
      lines,
      wallMs: computeMs + 1000,
      cpuS: 10 + lines / 8,
      load1: 1,
    });
    const runs = [
      run(0, 0, 2000, 0),
      run(5, 0, 2400, 18),
      run(10, 0, 2200, 9),
      run(20, 0, 2080, 4),
      run(50, 0, 2000, 1),
      run(0, 1, 2100, 0),
      run(5, 1, 2500, 19),
      run(10, 1, 2150, 9),
      run(20, 1, 2090, 5),
      run(50, 1, 2050, 2),
    ];
    const SWEEP = { ...DURABLE_FULL, candidates: [5, 10, 20, 50] };
    const summary = summarizeDurable(runs, SWEEP);
    expect(summary.map((x) => [x.every, x.runs, x.computeMs, x.lines, x.met])).toEqual([
      [0, 2, 2050, 0, null],
      [5, 2, 2450, 18.5, false],
      [10, 2, 2175, 9, false],
      [20, 2, 2085, 4.5, true],
      [50, 2, 2025, 1.5, true],
    ]);
    expect(summary[2]!.pairedRatios).toEqual([2200 / 2000, 2150 / 2100]);
    expect(summary[2]!.cpuS).toBeCloseTo(11.125);
    expect(summary[2]!.cpuRatio).toBeCloseTo(1.1125);
    expect(smallestMeeting(summary)).toBe(20);
    const t = renderDurableTable(runs, ["--durable-every 5 run 3: exit 1"], SWEEP);
    expect(t).toContain(
      "| --durable-every | runs | program s | ratio to 0 [paired min–max] | to last finalize() s | its ratio | CPU s | CPU ratio to 0 | durable lines committed | target | met |",
    );
    expect(t).toContain("| 0 (off) | 2 | 2.050 | 1.000x | 1.950 | 1.000x | 10.0 | 1.00x | 0 |  |  |");
    expect(t).toContain("| 20 | 2 | 2.085 | 1.017x [1.00–1.04] | 1.985 | 1.018x | 10.6 | 1.06x | 4.5 | <= 1.05x | met |");
    expect(t).toContain("| 5 | 2 | 2.450 | 1.195x [1.19–1.20] | 2.350 | 1.205x | 12.3 | 1.23x | 18.5 | <= 1.05x | NOT met |");
    expect(t).toContain("| error | | | | | | | | | | --durable-every 5 run 3: exit 1 |");
    expect(t).toContain("N meeting <= 1.05x: 20, 50; smallest: 20.");
  });
});

describe("bench picture: the ratios against their targets", () => {
  const raw = (us: number): VariantResult => variant("rawpush4", "raw-pushpull", us, us);
  const ll = (us: number): VariantResult => variant("lifeline4", "lifeline:none", us, us);
  const p2p = (bench: Benchmark, bytes: number, s: VariantResult, b: VariantResult, extra: Partial<CaseResult> = {}): CaseResult =>
    result(bench, bytes, s, b, { np: 2, label: sizeLabel(bytes), key: caseKey({ bench, np: 2, bytes, label: "" }), ...extra });
  /** The attribute `name` of every `tag` element, in order. */
  const attrs = (svg: string, tag: string, name: string): number[] =>
    [...svg.matchAll(new RegExp(`<${tag} [^>]*\\b${name}="([^"]+)"`, "g"))].map((m) => Number(m[1]));
  const circles = (svg: string): { cx: number; cls: string; fill: string }[] =>
    [...svg.matchAll(/<circle cx="([^"]+)"[^>]*fill="([^"]+)"[^>]*class="([^"]+)"/g)].map((m) => ({ cx: Number(m[1]), fill: m[2]!, cls: m[3]! }));

  it("targets carry their bound and direction", () => {
    const c = (bench: Benchmark, bytes: number, np = 2): Case => ({ bench, np, bytes, label: "" });
    expect(targetFor(c("pingpong", 8))).toMatchObject({ bound: 1.15, atMost: true });
    expect(targetFor(c("stream", MiB))).toMatchObject({ bound: 0.9, atMost: false });
    expect(targetFor(c("retry-one-stream", MiB))!.bound).toBeCloseTo(1 / 1.1);
    expect(targetFor(c("allreduce", 8, 4))).toMatchObject({ bound: 0.5, atMost: true });
    for (const t of [targetFor(c("pingpong", 8))!, targetFor(c("stream", MiB))!]) {
      expect(t.met(t.bound)).toBe(true);
      expect(t.met(t.atMost ? t.bound * 1.01 : t.bound * 0.99)).toBe(false);
    }
  });

  it("a dot per case with a ratio, in the tables' order, placed on a log scale and coloured by verdict", () => {
    const results = [
      // Listed out of order: the picture groups by benchmark as the tables do.
      result("allreduce", 8, ll(400), raw(1000)), // 0.40x, target <= 0.5x: met
      p2p("pingpong", 8, ll(130), raw(100)), // 1.30x, target <= 1.15x: missed
      p2p("pingpong", 1024, ll(100), raw(100)), // 1.00x, no target
      p2p("stream", MiB, ll(1000), raw(950), { ratioQ1: 0.8, ratioQ3: 1.1 }), // 0.95x, IQR across 0.9: cannot tell
      result("retry-one", 8, null, ll(1000), { errors: ["subject: boom"] }), // no ratio: not drawn
    ];
    results[3]!.target!.withinNoise = true;
    const svg = renderChart(results, { title: "t", note: "n" });
    const dots = circles(svg);
    expect(dots.map((d) => d.cls)).toEqual(["missed", "none", "unclear", "met"]);
    expect(results.map(verdictOf)).toEqual(["met", "missed", "none", "unclear", "none"]);
    // Hollow when the run cannot tell; the others filled.
    expect(dots.map((d) => d.fill === "#ffffff")).toEqual([false, false, true, false]);
    // 0.40x < 0.95x < 1.00x < 1.30x on the scale.
    const [miss, none, unclear, met] = dots.map((d) => d.cx);
    expect(met!).toBeLessThan(unclear!);
    expect(unclear!).toBeLessThan(none!);
    expect(none!).toBeLessThan(miss!);
    // Equal ratios of the scale's powers of two are equal steps apart (log scale).
    const grid = attrs(svg, "line", "x1").slice(0, 4);
    expect(grid[1]! - grid[0]!).toBeCloseTo(grid[2]! - grid[1]!, 5);
    expect(svg).toContain("1.30x (≤ 1.15x) missed</text>");
    expect(svg).toContain("0.95x (≥ 0.90x) met?</text>");
    // Counted as the tables count: the retry-one case that failed to measure is a target not met.
    expect(svg).toContain("Targets met: 2 of 4.");
    expect(renderTables(results, "ipc")).toContain("Targets met: 2 of 4.");
    expect(svg).not.toContain("retry-one");
  });

  it("shades the side of each target that meets it: left of a time bound, right of a bandwidth bound", () => {
    const svg = renderChart([p2p("pingpong", 8, ll(100), raw(100)), p2p("stream", MiB, ll(100), raw(100))], { title: "t" });
    const bands = [...svg.matchAll(/<rect x="([^"]+)" y="[^"]+" width="([^"]+)"[^>]*fill="#e3f3e8"/g)].map((m) => [Number(m[1]), Number(m[2])]);
    const bounds = [...svg.matchAll(/<line x1="([^"]+)" y1="[^"]+" x2="[^"]+" y2="[^"]+" stroke="#2e8b57" stroke-width="2"/g)].map((m) => Number(m[1]));
    expect(bands).toHaveLength(2);
    const [[timeFrom, timeWidth], [bwFrom, bwWidth]] = bands as [[number, number], [number, number]];
    expect(timeFrom + timeWidth).toBeCloseTo(bounds[0]!, 0); // the band ends at the 1.15x bound
    expect(bwFrom).toBeCloseTo(bounds[1]!, 0); // the band starts at the 0.9x bound
    expect(timeFrom).toBeLessThan(bwFrom);
    expect(bwFrom + bwWidth).toBeGreaterThan(bounds[0]!);
  });

  it("escapes text, and says so when there is nothing to draw", () => {
    const svg = renderChart([p2p("pingpong", 8, ll(100), raw(100), { label: "8 B <&>" })], { title: 'a "b" <c>' });
    expect(svg).toContain(">8 B &lt;&amp;&gt;</text>");
    expect(svg).toContain("a &quot;b&quot; &lt;c&gt;");
    expect(svg).not.toMatch(/<c>|<&>/);
    const empty = renderChart([result("retry-one", 8, null, ll(1000))], { title: "t" });
    expect(empty).toContain("No case of this run has a ratio to draw.");
    expect(empty).not.toContain("<circle");
  });

  it("goes beside its report: .svg for .json", () => {
    expect(chartPathFor("bench/results/2026-11-30T12-00-00-000Z.json")).toBe("bench/results/2026-11-30T12-00-00-000Z.svg");
    expect(chartPathFor("/tmp/run")).toBe("/tmp/run.svg");
    expect(chartPathFor("/tmp/a.json.json")).toBe("/tmp/a.json.svg");
  });
});
