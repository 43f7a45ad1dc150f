/**
 * Goal: the benchmark's plan and tables — in particular the retry-one benchmark (allreduce,
 * a Lifeline job under --mode retry-one vs one under --mode none) — are built and
 * labelled as documented in bench/README.md, without starting any process.
 *
 * Method: call bench/lib/plan.ts and bench/lib/report.ts directly: case lists for the full,
 * quick and overridden sizes, the jobs and block each case uses, the targets, and the tables
 * rendered from hand-made results. Milliseconds; the end-to-end run is bench-smoke.test.ts.
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
  type Benchmark,
  type Case,
  type JobKind,
  type PeersFile,
} from "../../bench/lib/plan.ts";
import { columnsOf, renderTables, type CaseResult, type VariantResult } from "../../bench/lib/report.ts";

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
    const over = buildCases({ ...FULL_SIZES, retryOne: [8, MiB], retryOneNps: [2, 4] }, only);
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
    expect(jobsOf("barrier", "retry-one")).toEqual({ subject: "lifeline:retry-one", baseline: undefined });
    expect(describeKind("lifeline:retry-one")).toBe("lifeline --mode retry-one");
    expect(describeKind("raw-pushpull")).toBe("raw-pushpull");
  });

  it("--curve compares a Lifeline job with CURVE against the same under --insecure, with issue 12's targets", () => {
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

  it("targets: 8 B <= 1.5x and 16 MiB <= 1.05x the mode-none time; none in between", () => {
    const c = (bytes: number, bench: Benchmark = "retry-one"): Case => ({ bench, np: 4, bytes, label: "" });
    expect(unitOf("retry-one")).toBe("us");
    expect(ratioOf(c(8), 3e-3, 2e-3)).toBeCloseTo(1.5); // retry-one time / none time
    const small = targetFor(c(8))!;
    expect(small.text).toBe("<= 1.5x none");
    expect([small.met(1.5), small.met(1.51)]).toEqual([true, false]);
    const big = targetFor(c(16 * MiB))!;
    expect(big.text).toBe("<= 1.05x none");
    expect([big.met(1.05), big.met(1.06)]).toEqual([true, false]);
    expect(targetFor(c(64 * KiB))).toBeUndefined();
    expect(targetFor(c(MiB))).toBeUndefined(); // not allreduce's ">= 1 MiB <= 1.0x raw ring"
    expect(targetFor(c(MiB, "allreduce"))?.text).toBe("<= 1.0x raw ring");
    const peers = JSON.parse(readFileSync(path.join(ROOT, "bench/peers.json"), "utf8")) as PeersFile;
    expect(peerFigure(peers, c(8))).toBeUndefined();
    expect(peerFigure(peers, c(8, "allreduce"))).toBeGreaterThan(0);
  });
});

function variant(job: string, kind: JobKind, us: number, cpuUs: number): VariantResult {
  return {
    job,
    kind,
    iters: 10,
    calibration: [[1, 1e-3]],
    warmupPerOpS: us / 1e6,
    perOpS: [us / 1e6, us / 1e6],
    medianPerOpS: us / 1e6,
    value: us,
    spread: 0.1,
    cpuPerOpS: [cpuUs / 1e6],
    medianCpuUs: cpuUs,
    medianLoopUs: cpuUs / 2,
    medianMinorFaults: 1,
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
    target: t === undefined ? null : { text: t.text, met: ratio === null ? null : t.met(ratio), withinNoise: false },
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
    expect(lines[2]).toBe("| np 4, 8 B | 1200 | 1000 | 1.20x [1.20x–1.20x] | 10% / 10% | 2400 / 2000 | <= 1.5x none | met |");
    expect(lines[3]).toBe("| np 4, 16 MiB | 220000 | 200000 | 1.10x [1.10x–1.10x] | 10% / 10% | 440000 / 400000 | <= 1.05x none | NOT met |");
    expect(lines[4]).toBe("| np 4, 64 KiB | error | 5000 | — | — / 10% | — / 10000 |  |  |");
    expect(columnsOf("retry-one")).toMatchObject({ subject: "retry-one", baseline: "none", peers: false });
  });

  it("leaves the Lifeline vs raw tables as they were", () => {
    const s = section("### Allreduce, Float64Array sum, per op, slowest rank (us); raw = hand-written ring");
    expect(s).toContain(
      "| case | Lifeline us | raw us | L/raw (time) [IQR] | Open MPI TCP us | L/MPI-TCP | spread L / raw | CPU us/op L / raw | target | met |",
    );
    expect(s).toContain("| np 4, 8 B | 900.0 | 1000 | 0.90x [0.90x–0.90x] | 31.69 | 28.4x | 10% / 10% | 1000 / 900.0 | <= 0.4x raw ring | NOT met |");
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

  it("lists errors and counts the retry-one targets with the others", () => {
    expect(tables).toContain("- retry-one np4 64 KiB: subject (lifeline --mode retry-one): boom");
    expect(tables).toContain("Targets met: 1 of 3.");
  });
});
