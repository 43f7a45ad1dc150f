/**
 * `npm run bench`: Lifeline's message layer next to raw zeromq.js, measured in the same run,
 * with the same sizes and process layout, timed in alternation; and (benchmarks `retry-one`,
 * `retry-one-pingpong`, `retry-one-stream`, and `cpr`, `cpr-pingpong`, `cpr-stream`) allreduce,
 * ping-pong and streaming in a Lifeline job under `--mode retry-one` (or `--mode cpr` with
 * nothing due) next to one under `--mode none`, the same way. Whole-job benchmarks
 * follow: `recovery` (bench/lib/recovery.ts), `heat-recovery` (bench/lib/heat-recovery.ts: a
 * killed rank of examples/heat.ts, retry-one vs cpr, through `lifeline drill`), `durable`
 * (bench/lib/durable.ts: what retry-one's durable floor costs), `startup`, and with `--hosts`
 * `partner`.
 *
 * Every case compares a subject job with a baseline job (bench/lib/plan.ts, `jobsOf`). For
 * each group of cases with one rank count, the harness starts the jobs they need — Lifeline
 * jobs (the real launcher running bench/programs/mpi-bench.ts, one per recovery mode needed)
 * and raw baseline processes (bench/programs/raw-*.ts) — keeps them all running, and drives
 * them over a control channel (bench/lib/ctrl.ts). For each case: calibrate each variant to
 * ~`--target-ms` per timed block, untimed warm-up blocks for ~`--warmup-ms`, then `--reps` timed blocks
 * alternating S B, B S, ...; every block starts with a barrier inside the job. The figure is
 * the median over the blocks.
 *
 * Usage: see `--help` and bench/README.md.
 */
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { CtrlServer } from "./lib/ctrl.ts";
import { LifelineJob, RawJob, type HostsEnv, type Job, type JobEnv } from "./lib/jobs.ts";
import { clusterSupport, netnsRshAgent, TestCluster } from "../src/testing/netns.ts";
import {
  BENCHMARKS,
  FULL_SIZES,
  QUICK_SIZES,
  buildCases,
  caseKey,
  cpuPerOpSeconds,
  describeKind,
  insecureKind,
  display,
  jobsOf,
  lifelineModeOf,
  opOf,
  peerFigure,
  peerPerOpSeconds,
  perOpSeconds,
  ratioOf,
  STREAM_WINDOW,
  targetFor,
  warmupOf,
  MODE_WARMUP_OPS,
  MODE_WARMUP_MS_MAX,
  unitOf,
  type Benchmark,
  type Case,
  type JobKind,
  type LifelineMode,
  type PeersFile,
  type Sizes,
} from "./lib/plan.ts";
import { installCleanup, killAllSync } from "./lib/procs.ts";
import { chartPathFor, renderChart } from "./lib/chart.ts";
import { columnsOf, renderTables, type CaseResult, type VariantResult } from "./lib/report.ts";
import { recoveryRun, renderRecoveryTable, type RecoveryConfig, type RecoveryParts } from "./lib/recovery.ts";
import {
  HEAT_RECOVERY_FULL,
  HEAT_RECOVERY_QUICK,
  HEAT_RECOVERY_TARGET,
  heatRecoveryRatio,
  heatRecoveryRun,
  renderHeatRecoveryTable,
  type HeatRecoveryConfig,
  type HeatRecoveryMode,
  type HeatRecoveryRun,
} from "./lib/heat-recovery.ts";
import {
  DURABLE_FULL,
  DURABLE_QUICK,
  DURABLE_TARGET,
  durableRun,
  renderDurableTable,
  smallestMeeting,
  summarizeDurable,
  type DurableConfig,
  type DurableRun,
} from "./lib/durable.ts";
import { hostRecoveryRun } from "./lib/host-recovery.ts";
import { elasticBench, elasticText, type ElasticBenchResult } from "./lib/elastic.ts";
import { calibrate, fmt, fmtRatio, median, quantile, spread } from "./lib/stats.ts";
import { partnerCostRun, renderPartnerTable, type PartnerCostRun } from "./lib/partner-cost.ts";
import { renderStartupTable, STARTUP_TARGET, startupRatio, startupRuns, type StartupResult } from "./lib/startup.ts";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

/** Default of `--warmup-ms` (see warmUp). */
const WARMUP_MS = 1500;
/** Benchmarks of whole jobs, run after the timed-block ones (`--only` names them too). */
const JOB_BENCHMARKS = ["recovery", "heat-recovery", "durable", "elastic", "startup", "partner"] as const;

const HELP = `Usage: npm run bench -- [options]
       node --import tsx bench/run.ts [options]      (after npm run build)

  --quick               tiny sizes, 3 reps, 5 ms per timing, 1 run per whole-job variant (a smoke run)
  --only <names>        comma list of: ${[...BENCHMARKS, ...JOB_BENCHMARKS].join(", ")}
                        (default: all but partner; with --hosts: all but heat-recovery,
                        durable, elastic and startup)
                        stream-isend: streaming with the sender's isends in windows of
                        ${STREAM_WINDOW}, each window waited for (MPI's way), vs raw's stream;
                        retry-one: allreduce under --mode retry-one vs --mode none, np 4;
                        retry-one-pingpong, retry-one-stream: ping-pong (8 B, 64 KiB, 1 MiB)
                        and streaming (1 MiB, 16 MiB) on 2 ranks, --mode retry-one vs --mode
                        none (the retry-one jobs run with --durable-every 0);
                        cpr, cpr-pingpong, cpr-stream: the same under --mode cpr with nothing
                        due (--checkpoint-every 1000000s) vs --mode none;
                        recovery: rank 1 killed, retry-one next to cpr, 4 ranks, 64 MiB global
                        + 1 MiB local state: kill → caught up;
                        heat-recovery: examples/heat.ts 512x512 x 400 on 4 ranks, rank 1
                        killed at step 200, lifeline drill in retry-one vs cpr --checkpoint-every
                        10steps (alternating; results must match the reference): kill → caught
                        up, target retry-one <= 0.5x cpr;
                        durable: bench/programs/recovery.ts on 4 ranks, 100 steps, no fault,
                        --mode retry-one --durable-every 0 vs 5, 10, 20, 50 (rotating): program
                        wall time and durable lines committed, target <= 1.05x;
                        elastic: --mode elastic, 4 ranks, 64 MiB model: rank 1 killed → the 3
                        others computing again, and a late rank joining → its model received;
                        partner: --hosts only, what a cpr partner copy costs a line,
                        --store-scope host vs shared; startup: a whole 4-rank job of
                        examples/heat.ts as .ts next to the same as .js
  --recovery-runs <n>   runs per variant of recovery, heat-recovery (per mode), durable
                        (per --durable-every value) and elastic (default 3; quick 1)
  --transport <t>       ipc (default; endpoints in a temp dir) or tcp (127.0.0.1, port 0)
  --hosts               across hosts: rank r of every job (Lifeline and raw) on test host r, a
                        network namespace with its own address (src/testing/netns.ts; needs
                        root), over tcp; the Lifeline launcher on host 0 starts its ranks
                        through the ssh-like agent (implies --transport tcp); recovery then
                        kills a whole host (bench/lib/host-recovery.ts)
  --curve               CURVE's cost: pingpong, stream and allreduce (and bcast, barrier) of a Lifeline
                        job over tcp (CURVE on, the default) against the same job under --insecure,
                        in the same run, instead of against raw zeromq.js (implies --transport tcp)
  --mode <m>            the Lifeline job's recovery mode: none (default), cpr or retry-one;
                        not used by the retry-one and cpr families, which set their own
  --reps <n>            timed repetitions per case and variant (default 15; quick 3)
  --target-ms <ms>      calibrate each timed block to about this long (default 50; quick 5)
  --warmup-ms <ms>      run each case's blocks untimed for about this long per variant before
                        timing it, so that processes are measured in their steady state, not
                        while V8 still compiles and sizes its heap (default 1500; quick 0:
                        one warm-up block); the retry-one and cpr families also run at least
                        12,000 operations, within 12 s (retry-one's path settles later)
  --variant <v>         both (default); lifeline: the subject only (the Lifeline job; for
                        the retry-one and cpr families that mode's job); raw: the raw
                        zeromq.js baselines only (no build needed; skips bcast, the two
                        families and the whole-job benchmarks)
  --payload <p>         f64 (default; Float64Array) or u8 (Uint8Array) for ping-pong/stream
  --sizes <list>        override the payload sizes in bytes of the selected benchmarks (e.g. 8,1048576)
  --np <list>           override the rank counts of the collectives (default 2,4) and of
                        retry-one and cpr (default 4); their -pingpong/-stream always run on 2
  --cpu-prof <dir>      write a V8 CPU profile of every measuring process to <dir>
                        (summarize with: node --import tsx bench/tools/cpuprofile-top.ts <dir>/*.cpuprofile)
  --out <file>          JSON output (default bench/results/<timestamp>.json)
  --timeout-s <s>       bound on the whole run (default 1200; quick 180)
  --verbose             echo the children's output
  -h, --help
`;

interface Options {
  quick: boolean;
  mode: LifelineMode;
  only: Set<Benchmark>;
  /** The recovery benchmark (bench/lib/recovery.ts), and its runs per mode. */
  recovery: boolean;
  /** `--hosts`: what a partner copy costs a checkpoint (bench/lib/partner-cost.ts). */
  partner: boolean;
  /** Start-up of a .ts program against the same as .js (bench/lib/startup.ts). */
  startup: boolean;
  /** A killed rank of examples/heat.ts, retry-one vs cpr (bench/lib/heat-recovery.ts). */
  heatRecovery: boolean;
  /** retry-one's durable floor, --durable-every N vs 0 (bench/lib/durable.ts). */
  durable: boolean;
  /** `--mode elastic`: a loss and a join (bench/lib/elastic.ts), `recoveryRuns` runs each. */
  elastic: boolean;
  recoveryRuns: number;
  transport: "ipc" | "tcp";
  /** `--hosts`: every rank on a test host of its own. */
  hosts: boolean;
  /** `--curve`: Lifeline with CURVE vs Lifeline under --insecure (see plan.ts `jobsOf`). */
  curve: boolean;
  reps: number;
  targetMs: number;
  /** Untimed blocks of each case per variant, for about this long, before the timed ones (at least one). */
  warmupMs: number;
  variant: "both" | "lifeline" | "raw";
  payload: "f64" | "u8";
  out: string;
  timeoutS: number;
  verbose: boolean;
  sizes: number[] | undefined;
  nps: number[] | undefined;
  cpuProf: string | undefined;
}

function usage(msg: string): never {
  process.stderr.write(`bench: ${msg}\n\n${HELP}`);
  process.exit(2);
}

function parseOptions(argv: string[]): Options {
  let v;
  try {
    v = parseArgs({
      args: argv,
      options: {
        quick: { type: "boolean", default: false },
        only: { type: "string" },
        transport: { type: "string", default: "ipc" },
        mode: { type: "string", default: "none" },
        reps: { type: "string" },
        "target-ms": { type: "string" },
        "warmup-ms": { type: "string" },
        "recovery-runs": { type: "string" },
        variant: { type: "string", default: "both" },
        payload: { type: "string", default: "f64" },
        out: { type: "string" },
        "timeout-s": { type: "string" },
        sizes: { type: "string" },
        np: { type: "string" },
        "cpu-prof": { type: "string" },
        hosts: { type: "boolean", default: false },
        curve: { type: "boolean", default: false },
        verbose: { type: "boolean", default: false },
        help: { type: "boolean", short: "h", default: false },
      },
      strict: true,
      allowPositionals: false,
    }).values;
  } catch (err) {
    usage((err as Error).message);
  }
  if (v.help) {
    process.stdout.write(HELP);
    process.exit(0);
  }
  const only = new Set<Benchmark>();
  let recovery = false;
  let partner = false;
  let startup = false;
  let heatRecovery = false;
  let durable = false;
  let elastic = false;
  for (const name of (v.only ?? [...BENCHMARKS, "recovery", ...(v.hosts ? ["partner"] : ["heat-recovery", "durable", "elastic", "startup"])].join(","))
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean)) {
    if (name === "recovery") {
      recovery = true;
      continue;
    }
    if (name === "heat-recovery" || name === "durable" || name === "elastic") {
      if (v.hosts) usage(`--only ${name} runs on this host: drop --hosts`);
      if (name === "durable") durable = true;
      else if (name === "elastic") elastic = true;
      else heatRecovery = true;
      continue;
    }
    if (name === "startup") {
      if (v.hosts) usage("--only startup runs on this host: drop --hosts");
      startup = true;
      continue;
    }
    if (name === "partner") {
      if (!v.hosts) usage("--only partner needs --hosts (a partner copy goes to another host)");
      partner = true;
      continue;
    }
    if (!BENCHMARKS.includes(name as Benchmark)) usage(`--only ${name}: expected one of ${[...BENCHMARKS, ...JOB_BENCHMARKS].join(", ")}`);
    only.add(name as Benchmark);
  }
  if (v.transport !== "ipc" && v.transport !== "tcp") usage(`--transport ${v.transport}: expected ipc or tcp`);
  if (v.hosts && v.transport === "ipc" && argv.includes("--transport"))
    usage("--hosts runs over tcp (the hosts have their own addresses): drop --transport ipc");
  if (v.curve && v.transport === "ipc" && argv.includes("--transport")) usage("--curve measures tcp links (ipc has no CURVE): drop --transport ipc");
  if (v.curve && v.variant !== "both") usage("--curve compares two Lifeline jobs: drop --variant");
  if (v.mode !== "none" && v.mode !== "cpr" && v.mode !== "retry-one") usage(`--mode ${v.mode}: expected none, cpr or retry-one`);
  if (v.variant !== "both" && v.variant !== "lifeline" && v.variant !== "raw") usage(`--variant ${v.variant}: expected both, lifeline or raw`);
  if (v.payload !== "f64" && v.payload !== "u8") usage(`--payload ${v.payload}: expected f64 or u8`);
  const posInt = (name: string, raw: string | undefined, dflt: number): number => {
    if (raw === undefined) return dflt;
    const n = Number(raw);
    if (!Number.isInteger(n) || n < 1) usage(`--${name} ${raw}: expected a positive integer`);
    return n;
  };
  const nonNegInt = (name: string, raw: string): number => {
    const n = Number(raw);
    if (!Number.isInteger(n) || n < 0) usage(`--${name} ${raw}: expected an integer >= 0`);
    return n;
  };
  const list = (name: string, raw: string | undefined, min: number): number[] | undefined => {
    if (raw === undefined) return undefined;
    const xs = raw.split(",").map((x) => Number(x.trim()));
    if (xs.length === 0 || xs.some((x) => !Number.isInteger(x) || x < min)) usage(`--${name} ${raw}: expected a comma list of integers >= ${min}`);
    return xs;
  };
  const quick = v.quick;
  const stamp = new Date().toISOString().replace(/[:.]/g, "-");
  return {
    quick,
    mode: v.mode,
    only,
    recovery: recovery && v.variant !== "raw",
    partner: partner && v.variant !== "raw",
    startup: startup && v.variant !== "raw",
    heatRecovery: heatRecovery && v.variant !== "raw",
    durable: durable && v.variant !== "raw",
    elastic: elastic && v.variant !== "raw",
    hosts: v.hosts,
    curve: v.curve,
    recoveryRuns: posInt("recovery-runs", v["recovery-runs"], quick ? 1 : 3),
    transport: v.hosts || v.curve ? "tcp" : v.transport,
    reps: posInt("reps", v.reps, quick ? 3 : 15),
    targetMs: posInt("target-ms", v["target-ms"], quick ? 5 : 50),
    warmupMs: v["warmup-ms"] === undefined ? (quick ? 0 : WARMUP_MS) : nonNegInt("warmup-ms", v["warmup-ms"]),
    variant: v.variant,
    payload: v.payload,
    out: path.resolve(v.out ?? path.join(ROOT, "bench", "results", `${stamp}.json`)),
    timeoutS: posInt("timeout-s", v["timeout-s"], quick ? 180 : 1200),
    verbose: v.verbose,
    sizes: list("sizes", v.sizes, 8),
    nps: list("np", v.np, 2),
    cpuProf: v["cpu-prof"] === undefined ? undefined : path.resolve(v["cpu-prof"]),
  };
}

function progress(line: string): void {
  process.stderr.write(`${line}\n`);
}

/**
 * The commit the run measured: `abc1234`, or `abc1234-dirty` when what the jobs run (src/,
 * bench/, the package files) differs from it, so that a figure is never pinned on a commit
 * that did not have the code measured; null outside a git checkout.
 */
function gitCommit(): string | null {
  const git = (args: string[]): string => execFileSync("git", args, { cwd: ROOT, encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }).trim();
  let commit: string;
  try {
    commit = git(["rev-parse", "--short", "HEAD"]);
  } catch {
    return null; // not a git checkout
  }
  try {
    git(["diff", "--quiet", "HEAD", "--", "src", "bench", "package.json", "package-lock.json"]);
    return commit;
  } catch {
    return `${commit}-dirty`;
  }
}

/** One group of cases sharing a rank count, and the jobs they need. */
interface Session {
  np: number;
  cases: Case[];
}

function sessionsOf(cases: readonly Case[]): Session[] {
  const byNp = new Map<number, Case[]>();
  for (const c of cases) {
    let list = byNp.get(c.np);
    if (list === undefined) byNp.set(c.np, (list = []));
    list.push(c);
  }
  return [...byNp.entries()].sort((a, b) => a[0] - b[0]).map(([np, list]) => ({ np, cases: list }));
}

/** Which variant of a case a job measures: the numerator or the denominator of the ratio. */
type Role = "subject" | "baseline";
const ROLES: readonly Role[] = ["subject", "baseline"];

/**
 * The jobs a case uses under `--variant`: both; `lifeline`, the subject only; `raw`, the
 * baseline only, and only where it is a raw zeromq.js program (so that `--variant raw` needs
 * no build: bcast, which has no baseline, and the retry-one and cpr families, whose baseline
 * is a Lifeline job, measure nothing).
 */
function jobsFor(c: Case, opts: Options): Partial<Record<Role, JobKind>> {
  const { subject, baseline } = jobsOf(c.bench, opts.mode, opts.curve);
  const out: Partial<Record<Role, JobKind>> = {};
  if (opts.variant !== "raw") out.subject = subject;
  if (opts.variant !== "lifeline" && baseline !== undefined && (opts.variant !== "raw" || lifelineModeOf(baseline) === undefined)) out.baseline = baseline;
  return out;
}

/**
 * Jobs of one session, keyed by kind, started on first use and restarted (a bounded number
 * of times) after a failure. Lifeline jobs of different modes (e.g. `lifeline4` and
 * `lifeline4-retry-one`) are different kinds and run side by side.
 */
class JobPool {
  private readonly jobs = new Map<JobKind, Job>();
  private readonly starts = new Map<JobKind, number>();
  readonly summaries: Record<string, unknown>[] = [];
  private static readonly STARTS_MAX = 2;

  constructor(
    private readonly np: number,
    private readonly env: JobEnv,
  ) {}

  async get(kind: JobKind): Promise<Job> {
    const have = this.jobs.get(kind);
    if (have !== undefined && have.broken === undefined) return have;
    if (have !== undefined) await this.retire(kind, have);
    const n = this.starts.get(kind) ?? 0;
    if (n >= JobPool.STARTS_MAX) throw new Error(`${describeKind(kind)} np ${this.np} failed ${n} times; not starting it again`);
    this.starts.set(kind, n + 1);
    const job =
      kind === "raw-pingpong" || kind === "raw-pushpull"
        ? new RawJob(kind, this.np, this.env, n)
        : new LifelineJob(this.np, this.env, n, lifelineModeOf(kind), insecureKind(kind));
    progress(`  starting ${job.name} (${this.np} processes${job instanceof LifelineJob ? ` via \`lifeline run --mode ${job.mode}\`` : ""})`);
    const t0 = performance.now();
    this.jobs.set(kind, job);
    await job.start();
    if (job instanceof LifelineJob) {
      const reported = new Set(job.hellos.map((h) => (h.t === "hello" ? (h.transport ?? "(unset)") : "")));
      if (!reported.has(this.env.transport)) {
        progress(`  WARNING: ${job.name} ranks report LIFELINE_TRANSPORT=${[...reported].join(",")}, the raw baselines use ${this.env.transport}`);
      }
    }
    progress(`  ${job.name} up in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
    return job;
  }

  private async retire(kind: JobKind, job: Job): Promise<void> {
    this.jobs.delete(kind);
    const summary = await job.stop().catch((err: Error) => ({ stopError: err.message }));
    this.summaries.push({ job: job.name, kind, np: this.np, broken: job.broken?.message.split("\n")[0] ?? null, ...summary });
  }

  async closeAll(): Promise<void> {
    for (const [kind, job] of [...this.jobs]) await this.retire(kind, job);
  }
}

/**
 * Starts every job of a session, then runs each case's code once or a few times in every job
 * it uses before anything is timed: freshly started processes are still compiling (tsx, JIT)
 * and settling, which would otherwise tilt the session's first cases against whichever
 * variant is measured first. Failures here are left for the cases to report.
 */
async function warmUpSession(session: Session, pool: JobPool, opts: Options): Promise<void> {
  const t0 = performance.now();
  const kinds = new Set<JobKind>();
  for (const c of session.cases) for (const k of Object.values(jobsFor(c, opts))) kinds.add(k);
  const jobs = new Map<JobKind, Job>();
  for (const k of kinds) {
    try {
      jobs.set(k, await pool.get(k));
    } catch {
      // reported by the first case that needs this job
    }
  }
  await new Promise((resolve) => setTimeout(resolve, 500));
  for (const c of session.cases) {
    const uses = new Set(Object.values(jobsFor(c, opts)));
    for (const [k, job] of jobs) {
      if (!uses.has(k)) continue;
      const iters = c.bytes >= 16 * 1024 * 1024 ? 1 : c.bytes >= 1024 * 1024 ? 3 : 20;
      try {
        await job.run(opOf(c.bench), c.bytes, iters);
      } catch {
        // the job is now marked broken; the case will restart it and report
      }
    }
  }
  progress(`  warm-up of ${jobs.size} job(s) done in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
}

interface Measured {
  wallS: number;
  perOpS: number;
  cpuPerOpS: number;
  loopPerOpS: number;
  faultsPerOp: number;
  gcPerOpS: number;
  majorGcsPerOp: number;
  /** The processes' mean young-generation size at the block's end (MiB). */
  youngMiB: number;
}

async function measure(job: Job, c: Case, iters: number): Promise<Measured> {
  const op = opOf(c.bench);
  const { seconds, cpuS, loopS, minorFaults, gcS, majorGcs, youngMiB } = await job.run(op, c.bytes, iters);
  return {
    wallS: Math.max(...seconds),
    perOpS: perOpSeconds(op, iters, seconds),
    cpuPerOpS: cpuPerOpSeconds(op, iters, cpuS),
    loopPerOpS: cpuPerOpSeconds(op, iters, loopS),
    faultsPerOp: cpuPerOpSeconds(op, iters, minorFaults),
    gcPerOpS: cpuPerOpSeconds(op, iters, gcS),
    majorGcsPerOp: cpuPerOpSeconds(op, iters, majorGcs),
    youngMiB: youngMiB.reduce((a, b) => a + b, 0) / youngMiB.length,
  };
}

/** One variant of a case while it warms up (see warmUp). */
interface Warming {
  readonly role: Role;
  readonly job: Job;
  /** Operations per block (the calibrated count). */
  readonly iters: number;
  /** The calibration's probes, `[iters, seconds]`. */
  readonly calibration: [number, number][];
  /** Seconds per operation of each warm-up block, in order. */
  readonly perOpS: number[];
  /** The wall time of the last block (the slowest rank's), to scale the timed blocks by. */
  lastWallS: number;
  ops: number;
  /** The harness's time spent on this variant's blocks, in ms. */
  ownMs: number;
}

/**
 * Untimed blocks of case `c` in every variant, alternating between them as the timed blocks
 * do (S B, B S, ...), until each has run about `w.ms` of its own blocks (at least one block;
 * for the mode families also `w.minOps` operations, within `w.maxMs`). A variant that is done
 * keeps running blocks while another is not, so that none of them sits idle before the timing.
 *
 * Why warm up: a process runs the message path up to 3x slower for its first thousands of
 * operations, while V8 compiles it and grows its heap (a 4-rank allreduce of 8 B: 400–810 us
 * per operation in its first warm-up blocks, 256–276 in its last, in one run; bench/README.md,
 * Method); timing inside that window measures the warm-up, not the message path, and tilts
 * each session's first cases against the larger program. Why alternate: warmed one after the
 * other, the first variant sat idle while the others warmed (12 s in the mode families). V8
 * resizes a process's young generation at its collections, and shrinks it when the process
 * allocated less than about 1 MB a second lately (V8's Heap::ShouldResizeNewSpace), as an idle
 * one does; it grows again only as more survives. A smaller one is collected more often: that
 * variant was timed out of its steady state (the retry-one family at 64 KiB: retry-one's ranks
 * at 2 MiB against mode none's 4, and 1.22x mode none's time; see bench/README.md, Method).
 * `drop` takes out a variant whose block failed.
 */
async function warmUp(c: Case, variants: Warming[], w: { ms: number; minOps: number; maxMs: number }, drop: (role: Role, err: unknown) => void): Promise<void> {
  const done = (v: Warming): boolean => v.perOpS.length > 0 && v.ownMs >= w.ms && (v.ops >= w.minOps || v.ownMs >= w.maxMs);
  let live = variants;
  for (let round = 0; live.some((v) => !done(v)); round++) {
    for (const v of round % 2 === 0 ? live : [...live].reverse()) {
      const t0 = performance.now();
      try {
        const m = await measure(v.job, c, v.iters);
        v.perOpS.push(m.perOpS);
        v.lastWallS = m.wallS;
        v.ops += v.iters;
        v.ownMs += performance.now() - t0;
      } catch (err) {
        drop(v.role, err);
        live = live.filter((x) => x !== v);
      }
    }
  }
}

async function runCase(c: Case, pool: JobPool, opts: Options, peers: PeersFile): Promise<CaseResult> {
  const errors: string[] = [];
  const kinds = jobsFor(c, opts);
  const what = (role: Role): string => `${role} (${describeKind(kinds[role]!)})`;

  const jobs = new Map<Role, Job>();
  for (const role of ROLES) {
    const kind = kinds[role];
    if (kind === undefined) continue;
    try {
      jobs.set(role, await pool.get(kind));
    } catch (err) {
      errors.push(`${what(role)}: ${(err as Error).message}`);
    }
  }

  const targetS = opts.targetMs / 1000;
  const state = new Map<
    Role,
    {
      iters: number;
      calibration: [number, number][];
      warmupPerOpS: number[];
      /** The timed blocks, in run order. */
      blocks: Measured[];
    }
  >();
  const drop = (role: Role, err: unknown): void => {
    errors.push(`${what(role)}: ${(err as Error).message}`);
    progress(`    ${what(role)} FAILED: ${(err as Error).message.split("\n")[0]}`);
    jobs.delete(role);
    state.delete(role);
  };
  const warming: Warming[] = [];
  for (const [role, job] of jobs) {
    try {
      const cal = await calibrate(async (iters) => (await measure(job, c, iters)).wallS, { targetS, itersMax: 100_000 });
      warming.push({ role, job, iters: cal.iters, calibration: cal.probes, perOpS: [], lastWallS: 0, ops: 0, ownMs: 0 });
    } catch (err) {
      drop(role, err);
    }
  }
  await warmUp(c, warming, warmupOf(c, opts.warmupMs), drop);
  for (const warm of warming) {
    if (!jobs.has(warm.role)) continue; // dropped during the warm-up
    // Calibrated while still warming up: scaled to the target by the last warm-up block.
    const iters = opts.warmupMs === 0 ? warm.iters : Math.min(100_000, Math.max(1, Math.round((warm.iters * targetS) / Math.max(warm.lastWallS, 1e-9))));
    state.set(warm.role, {
      iters,
      calibration: warm.calibration,
      warmupPerOpS: warm.perOpS,
      blocks: [],
    });
  }
  for (let rep = 0; rep < opts.reps; rep++) {
    const order = [...jobs.keys()];
    if (rep % 2 === 1) order.reverse(); // S B, B S, S B, ...
    for (const role of order) {
      const s = state.get(role);
      if (s === undefined) continue;
      try {
        s.blocks.push(await measure(jobs.get(role)!, c, s.iters));
      } catch (err) {
        drop(role, err);
      }
    }
  }

  const variant = (role: Role): VariantResult | null => {
    const s = state.get(role);
    const job = jobs.get(role);
    if (s === undefined || job === undefined || s.blocks.length === 0) return null;
    const of = (f: (m: Measured) => number): number[] => s.blocks.map(f);
    const perOpS = of((m) => m.perOpS);
    const cpuPerOpS = of((m) => m.cpuPerOpS);
    const med = median(perOpS);
    return {
      job: job.name,
      kind: kinds[role]!,
      iters: s.iters,
      calibration: s.calibration,
      warmupPerOpS: s.warmupPerOpS,
      perOpS,
      medianPerOpS: med,
      value: display(c, med),
      spread: spread(perOpS),
      cpuPerOpS,
      medianCpuUs: median(cpuPerOpS) * 1e6,
      medianLoopUs: median(of((m) => m.loopPerOpS)) * 1e6,
      medianMinorFaults: median(of((m) => m.faultsPerOp)),
      medianGcUs: median(of((m) => m.gcPerOpS)) * 1e6,
      medianMajorGcs: median(of((m) => m.majorGcsPerOp)),
      medianYoungMiB: median(of((m) => m.youngMiB)),
    };
  };
  const subject = variant("subject");
  const baseline = variant("baseline");
  let ratio: number | null = null;
  let ratioQ1: number | null = null;
  let ratioQ3: number | null = null;
  if (subject !== null && baseline !== null) {
    ratio = ratioOf(c, subject.medianPerOpS, baseline.medianPerOpS);
    const n = Math.min(subject.perOpS.length, baseline.perOpS.length);
    const paired = Array.from({ length: n }, (_, i) => ratioOf(c, subject.perOpS[i]!, baseline.perOpS[i]!));
    ratioQ1 = quantile(paired, 0.25);
    ratioQ3 = quantile(paired, 0.75);
  }
  const mpiTcp = peerFigure(peers, c) ?? null;
  const ratioMpiTcp = subject !== null && mpiTcp !== null ? ratioOf(c, subject.medianPerOpS, peerPerOpSeconds(c, mpiTcp)) : null;
  const t = targetFor(c, opts.curve);
  return {
    key: caseKey(c),
    bench: c.bench,
    op: opOf(c.bench),
    np: c.np,
    bytes: c.bytes,
    label: c.label,
    unit: unitOf(c.bench),
    kinds: { subject: kinds.subject ?? null, baseline: kinds.baseline ?? null },
    subject,
    baseline,
    ratio,
    ratioQ1,
    ratioQ3,
    mpiTcp,
    ratioMpiTcp,
    target:
      t === undefined
        ? null
        : {
            text: t.text,
            bound: t.bound,
            atMost: t.atMost,
            met: ratio === null ? null : t.met(ratio),
            withinNoise: ratioQ1 === null || ratioQ3 === null ? null : t.met(ratioQ1) !== t.met(ratioQ3),
          },
    errors,
  };
}

async function main(): Promise<void> {
  const opts = parseOptions(process.argv.slice(2));
  const startedAt = new Date();
  const tmpDir = mkdtempSync(path.join(os.tmpdir(), "lfbench-"));
  let ctrl: CtrlServer | undefined;
  installCleanup(() => rmSync(tmpDir, { recursive: true, force: true }));
  const watchdog = setTimeout(() => {
    progress(`bench: the run exceeded --timeout-s ${opts.timeoutS}; killing every child process`);
    killAllSync();
    process.exit(1);
  }, opts.timeoutS * 1000);
  watchdog.unref();

  const peers = JSON.parse(readFileSync(path.join(ROOT, "bench", "peers.json"), "utf8")) as PeersFile;
  const base = opts.quick ? QUICK_SIZES : FULL_SIZES;
  const s = opts.sizes;
  const sizes: Sizes = {
    pingpong: s ?? base.pingpong,
    stream: s ?? base.stream,
    allreduce: s ?? base.allreduce,
    bcast: s ?? base.bcast,
    collectiveNps: opts.nps ?? base.collectiveNps,
    modeAllreduce: s ?? base.modeAllreduce,
    modeNps: opts.nps ?? base.modeNps,
    modePingpong: s ?? base.modePingpong,
    modeStream: s ?? base.modeStream,
  };
  // Cases left without a job by --variant (e.g. bcast under --variant raw) have nothing to measure.
  const selected = buildCases(sizes, opts.only);
  const cases = selected.filter((c) => Object.keys(jobsFor(c, opts)).length > 0);
  for (const b of opts.only) {
    if (selected.some((c) => c.bench === b) && !cases.some((c) => c.bench === b)) {
      progress(`bench: skipping ${b}: it has no job to measure under --variant ${opts.variant}`);
    }
  }
  if (
    opts.recovery ||
    opts.heatRecovery ||
    opts.durable ||
    opts.partner ||
    opts.startup ||
    opts.elastic ||
    cases.some((c) => Object.values(jobsFor(c, opts)).some((k) => lifelineModeOf(k) !== undefined))
  ) {
    const missing = LifelineJob.available(ROOT);
    if (missing !== undefined) usage(`the Lifeline jobs need the built package: ${missing}`);
  }
  const sessions = sessionsOf(cases);
  const loadAtStart = os.loadavg();
  progress(
    `bench: ${cases.length} cases, ${opts.reps} reps, ~${opts.targetMs} ms per timing, transport ${opts.transport}, variant ${opts.variant}` +
      `, ${os.cpus().length} CPUs, load ${loadAtStart.map((x) => x.toFixed(2)).join(" ")}`,
  );

  const results: CaseResult[] = [];
  const jobSummaries: Record<string, unknown>[] = [];
  const recovery = opts.recovery ? recoveryPlan(opts) : undefined;
  const heat = opts.heatRecovery ? heatRecoveryPlan(opts) : undefined;
  const durable = opts.durable ? durablePlan(opts) : undefined;
  const partner = opts.partner ? partnerPlan(opts) : undefined;
  let cluster: TestCluster | undefined;
  let hostsEnv: HostsEnv | undefined;
  let startup: StartupResult | undefined;
  let elasticResult: ElasticBenchResult | undefined;
  try {
    ctrl = await CtrlServer.open(`ipc://${tmpDir}/ctrl`);
    if (opts.hosts) {
      const problem = await clusterSupport();
      if (problem !== undefined) usage(`--hosts needs test hosts, and here ${problem}`);
      const n = Math.max(2, ...sessions.map((s) => s.np));
      cluster = await TestCluster.create(n, { diskMb: 16 });
      const hostfile = path.join(tmpDir, "hostfile");
      writeFileSync(hostfile, cluster.hosts.map((h) => `${h.address} slots=1\n`).join(""));
      const c = cluster;
      progress(`bench: ${n} test hosts, ${c.hosts.map((h) => h.address).join(", ")}`);
      hostsEnv = {
        wrap: (i, argv, cwd) => c.wrap(i, argv, cwd),
        addresses: c.hosts.map((h) => h.address),
        hostfile,
        agent: netnsRshAgent,
        agentEnv: c.agentEnv,
      };
    }
    const env: JobEnv = {
      ctrl,
      root: ROOT,
      tmpDir,
      transport: opts.transport,
      mode: opts.mode,
      payload: opts.payload,
      echo: opts.verbose,
      startTimeoutMs: 90_000,
      commandTimeoutMs: opts.quick ? 30_000 : 60_000,
      idleMs: 60_000,
      cpuProf: opts.cpuProf,
      hosts: hostsEnv,
    };
    let done = 0;
    for (const session of sessions) {
      progress(`\n== ${session.np} processes: ${[...new Set(session.cases.map((c) => c.bench))].join(", ")}`);
      const pool = new JobPool(session.np, env);
      try {
        await warmUpSession(session, pool, opts);
        for (const c of session.cases) {
          done++;
          const t0 = performance.now();
          progress(`[${done}/${cases.length}] ${c.bench} ${c.label}`);
          const r = await runCase(c, pool, opts, peers);
          results.push(r);
          const u = r.unit;
          const col = columnsOf(c.bench, r.kinds.baseline);
          progress(
            `    ${col.subject} ${fmt(r.subject?.value)} ${u} (${r.subject?.iters ?? "-"} ops/timing)` +
              `, ${col.baseline} ${fmt(r.baseline?.value)} ${u} (${r.baseline?.iters ?? "-"} ops/timing)` +
              `, CPU/op ${fmt(r.subject?.medianCpuUs)} / ${fmt(r.baseline?.medianCpuUs)} us` +
              ` (main loop ${fmt(r.subject?.medianLoopUs)} / ${fmt(r.baseline?.medianLoopUs)} us; page faults ${fmt(r.subject?.medianMinorFaults)} / ${fmt(r.baseline?.medianMinorFaults)}; GC ${fmt(r.subject?.medianGcUs)} / ${fmt(r.baseline?.medianGcUs)} us, mark-compacts ${fmt(r.subject?.medianMajorGcs)} / ${fmt(r.baseline?.medianMajorGcs)}; young gen ${fmt(r.subject?.medianYoungMiB)} / ${fmt(r.baseline?.medianYoungMiB)} MiB)` +
              `, ${col.subjectShort}/${col.baselineShort} ${fmtRatio(r.ratio)}` +
              (col.peers ? `, ${col.subjectShort}/MPI-TCP ${fmtRatio(r.ratioMpiTcp)}` : "") +
              (r.target ? `, target ${r.target.text}: ${r.target.met === null ? "n/a" : r.target.met ? "met" : "NOT met"}` : "") +
              ` [${((performance.now() - t0) / 1000).toFixed(1)} s]`,
          );
        }
      } finally {
        await pool.closeAll();
        jobSummaries.push(...pool.summaries);
      }
    }
    if (recovery !== undefined && opts.hosts) await runHostRecovery(recovery, tmpDir);
    else if (recovery !== undefined) await runRecovery(recovery, tmpDir);
    if (heat !== undefined) await runHeatRecovery(heat, tmpDir);
    if (durable !== undefined) await runDurable(durable, tmpDir);
    if (partner !== undefined) await runPartnerCost(partner, tmpDir);
    if (opts.elastic) elasticResult = await elasticBench(ROOT, opts.recoveryRuns, opts.quick, progress);
    if (opts.startup) {
      progress(`\n== startup: lifeline run -n 4 of examples/heat.ts as .ts and as .js, alternating`);
      startup = await startupRuns({ root: ROOT, runs: opts.quick ? 1 : 5, np: 4, progress });
    }
  } finally {
    ctrl?.close();
    await cluster?.destroy();
    rmSync(tmpDir, { recursive: true, force: true });
  }

  const finishedAt = new Date();
  const tables =
    renderTables(results, opts.transport) +
    (recovery === undefined ? "" : `\n${recoveryText(recovery)}`) +
    (heat === undefined ? "" : `\n${renderHeatRecoveryTable(heat.runs, heat.errors, heat.config)}`) +
    (durable === undefined ? "" : `\n${renderDurableTable(durable.runs, durable.errors, durable.config)}`) +
    (partner === undefined ? "" : `\n${partnerText(partner)}`) +
    (elasticResult === undefined ? "" : `\n${elasticText(elasticResult)}`) +
    (startup === undefined ? "" : `\n${renderStartupTable(startup)}`);
  process.stdout.write(`\n${tables}\n`);
  const report = {
    schema: "lifeline-bench/2",
    startedAt: startedAt.toISOString(),
    finishedAt: finishedAt.toISOString(),
    durationS: (finishedAt.getTime() - startedAt.getTime()) / 1000,
    commit: gitCommit(),
    machine: {
      node: process.version,
      platform: `${os.platform()} ${os.release()}`,
      cpus: os.cpus().length,
      cpuModel: os.cpus()[0]?.model ?? null,
      totalMemGiB: os.totalmem() / 2 ** 30,
      loadavgAtEnd: os.loadavg(),
    },
    options: { ...opts, only: [...opts.only] },
    method: {
      cpu: "CPU seconds per op summed over the job's processes (process.cpuUsage, all threads)",
      minorFaults: "minor page faults per op summed over the job's processes (process.resourceUsage)",
      gc: "garbage-collection pauses (us) and full mark-compacts per op summed over the job's processes (Node's gc performance entries; one that ends a block may count toward the next)",
      young: "the capacity of V8's young generation (new space) at each timed block's end, MiB, mean over the job's processes; median over the blocks",
      loop: "event-loop-active seconds per op summed over the job's processes (performance.eventLoopUtilization: main thread not waiting in epoll)",
      variants:
        "each case compares a subject job with a baseline job (results[].kinds; each figure names its job and kind): " +
        (opts.curve
          ? `every benchmark but the retry-one and cpr families: lifeline --mode ${opts.mode} over tcp with CURVE (the default) vs the same job with --insecure; `
          : `pingpong, stream, stream-isend, allreduce: lifeline --mode ${opts.mode} vs the raw zeromq.js program (stream-isend: the sender's isends in windows of ${STREAM_WINDOW}, each window waited for, against raw's stream); barrier: lifeline --mode ${opts.mode} vs the raw ring's 8 B allreduce; bcast: lifeline --mode ${opts.mode} alone; `) +
        "retry-one, retry-one-pingpong, retry-one-stream: allreduce, pingpong, stream blocks in lifeline --mode retry-one --durable-every 0 (checkpoint(null), untimed, after each block) vs lifeline --mode none; " +
        "cpr, cpr-pingpong, cpr-stream: the same blocks in lifeline --mode cpr --checkpoint-every 1000000s (nothing due) vs lifeline --mode none",
      timing: `calibrated to ~${opts.targetMs} ms per timed block, untimed warm-up blocks for ~${opts.warmupMs} ms (at least 1; the retry-one and cpr families also at least ${MODE_WARMUP_OPS} operations, within ${MODE_WARMUP_MS_MAX} ms), ${opts.reps} timed blocks per variant, subject and baseline alternating (S B, B S, ...), barrier before each block`,
      figure: "median over the timed blocks of seconds per operation",
      ratio: "us rows: subject time / baseline time; MB/s rows: subject MB/s / baseline MB/s",
    },
    peers: { source: peers.source, date: peers.date },
    results,
    recovery: recovery === undefined ? undefined : { config: recovery.config, targetS: RECOVERY_TARGET_S, runs: recovery.runs, errors: recovery.errors },
    heatRecovery:
      heat === undefined
        ? undefined
        : {
            config: heat.config,
            runsPerMode: heat.runsPerMode,
            target: HEAT_RECOVERY_TARGET,
            ...heatRecoveryRatio(heat.runs),
            runs: heat.runs,
            errors: heat.errors,
          },
    durable:
      durable === undefined
        ? undefined
        : {
            config: durable.config,
            runsPerVariant: durable.runsPerVariant,
            target: DURABLE_TARGET,
            summary: summarizeDurable(durable.runs, durable.config),
            smallestMeeting: smallestMeeting(summarizeDurable(durable.runs, durable.config)),
            runs: durable.runs,
            errors: durable.errors,
          },
    partner: partner === undefined ? undefined : { ...partner, target: 1.3 },
    startup: startup === undefined ? undefined : { ...startup, ratio: startupRatio(startup), target: STARTUP_TARGET },
    elastic: elasticResult,
    jobs: jobSummaries,
    tables,
  };
  mkdirSync(path.dirname(opts.out), { recursive: true });
  writeFileSync(opts.out, `${JSON.stringify(report, null, 2)}\n`);
  progress(`bench: ${results.length} cases in ${report.durationS.toFixed(0)} s; JSON written to ${path.relative(process.cwd(), opts.out) || opts.out}`);
  if (results.some((r) => r.ratio !== null)) {
    // The picture of the ratios against their targets, beside the JSON.
    const svg = chartPathFor(opts.out);
    const title = `npm run bench -- ${process.argv.slice(2).join(" ")}`.trim().replace(/ --$/, "");
    const note =
      `at ${report.commit ?? "(no git checkout)"}, ${startedAt.toISOString().slice(0, 16).replace("T", " ")} UTC; transport ${opts.transport}, ` +
      `${os.cpus().length} CPUs, load ${loadAtStart.map((x) => x.toFixed(1)).join(" ")} at the start`;
    writeFileSync(svg, renderChart(results, { title, note }));
    progress(`bench: the ratios against their targets drawn in ${path.relative(process.cwd(), svg) || svg}`);
  }
  clearTimeout(watchdog);
  const failed =
    results.filter((r) => r.errors.length > 0).length +
    (recovery?.errors.length ?? 0) +
    (heat?.errors.length ?? 0) +
    (durable?.errors.length ?? 0) +
    (startup?.errors.length ?? 0) +
    (elasticResult?.errors.length ?? 0);
  process.exitCode = failed > 0 ? 1 : 0;
}

// ---- recovery: retry-one next to cpr on the same program ------------------------------------

/** Issue 4: a killed rank caught up within this long (retry-one, 4 ranks, 64 MiB + 1 MiB). */
const RECOVERY_TARGET_S = 1;

interface RecoveryPlan {
  config: Omit<RecoveryConfig, "root" | "dir" | "name" | "mode">;
  /** What runs, in turn: retry-one, retry-one without its warm spare (full runs), cpr. */
  variants: { mode: "retry-one" | "cpr"; spare: boolean }[];
  runsPerMode: number;
  runs: RecoveryParts[];
  errors: string[];
  /** `--hosts`: the runs lost a whole host instead of one rank. */
  hostLoss?: boolean;
}

function recoveryPlan(opts: Options): RecoveryPlan {
  const size = opts.quick ? { globalMib: 8, steps: 30, failStep: 20 } : { globalMib: 64, steps: 60, failStep: 40 };
  const variants: RecoveryPlan["variants"] = [
    { mode: "retry-one", spare: true },
    ...(opts.quick ? [] : [{ mode: "retry-one" as const, spare: false }]),
    { mode: "cpr", spare: true },
  ];
  return { config: { np: 4, localMib: 1, stepMs: 20, checkpointEvery: "5steps", ...size }, variants, runsPerMode: opts.recoveryRuns, runs: [], errors: [] };
}

/** Runs each variant `runsPerMode` times, rotating which goes first. */
async function runRecovery(plan: RecoveryPlan, tmpDir: string): Promise<void> {
  const c = plan.config;
  progress(
    `\n== recovery: ${c.np} ranks, ${c.globalMib} MiB global + ${c.localMib} MiB local state, rank 1 killed at step ${c.failStep}; ${plan.runsPerMode} run(s) per mode`,
  );
  for (let k = 0; k < plan.runsPerMode; k++) {
    const n = plan.variants.length;
    const turn = plan.variants.map((_, i) => plan.variants[(i + k) % n]!);
    for (const { mode, spare } of turn) {
      const label = spare ? mode : `${mode} --no-spare`;
      try {
        const r = await recoveryRun({ ...c, root: ROOT, dir: tmpDir, name: `recovery-${mode}${spare ? "" : "-cold"}-${k}`, mode, spare });
        plan.runs.push(r);
        progress(
          `  ${label} run ${k + 1}: detect ${fmtS(r.detectMs)}, restart ${fmtS(r.restartMs)}, load ${fmtS(r.loadMs)}, catch up ${fmtS(r.catchUpMs)}` +
            ` → total ${fmtS(r.totalMs)} (${r.restarted} process${r.restarted === 1 ? "" : "es"} restarted from step ${r.restoredStep})`,
        );
      } catch (err) {
        plan.errors.push(`${label} run ${k + 1}: ${(err as Error).message}`);
        progress(`  ${label} run ${k + 1} FAILED: ${(err as Error).message.split("\n")[0]}`);
      }
    }
  }
}

/** `--hosts`: host 2 of 3 killed with ranks 2-3, each mode `runsPerMode` times, modes alternating. */
async function runHostRecovery(plan: RecoveryPlan, tmpDir: string): Promise<void> {
  const c = plan.config;
  plan.hostLoss = true;
  const hostfile = path.join(tmpDir, "recovery-hosts");
  progress(
    `\n== recovery after a lost host: 4 ranks on 2 test hosts (a third spare), ${c.globalMib} MiB global + ${c.localMib} MiB local state, host 2 killed at rank 2's step ${c.failStep}; ${plan.runsPerMode} run(s) per mode`,
  );
  for (let k = 0; k < plan.runsPerMode; k++) {
    const modes: ("retry-one" | "cpr")[] = k % 2 === 0 ? ["retry-one", "cpr"] : ["cpr", "retry-one"];
    for (const mode of modes) {
      // A cluster per run: each run kills its host 2.
      const fresh = await TestCluster.create(3, { diskMb: 16 });
      try {
        writeFileSync(hostfile, fresh.hosts.map((h) => `${h.address} slots=2\n`).join(""));
        const r = await hostRecoveryRun({
          cluster: fresh,
          hostfile,
          root: ROOT,
          dir: tmpDir,
          name: `hostloss-${mode}-${k}`,
          mode,
          globalMib: c.globalMib,
          localMib: c.localMib,
          steps: c.steps,
          killStep: c.failStep,
          stepMs: c.stepMs,
        });
        plan.runs.push(r);
        progress(
          `  ${mode} run ${k + 1}: detect ${fmtS(r.detectMs)}, restart ${fmtS(r.restartMs)}, load ${fmtS(r.loadMs)}, first step ${fmtS(r.catchUpMs)} → total ${fmtS(r.totalMs)} (${r.restarted} process${r.restarted === 1 ? "" : "es"} restarted on the spare host, from step ${r.restoredStep})`,
        );
      } catch (err) {
        plan.errors.push(`${mode} host loss run ${k + 1}: ${(err as Error).message}`);
        progress(`  ${mode} run ${k + 1} FAILED: ${(err as Error).message.split("\n")[0]}`);
      } finally {
        await fresh.destroy();
      }
    }
  }
}

// ---- heat-recovery: a killed rank of examples/heat.ts, retry-one vs cpr, via lifeline drill ---

interface HeatRecoveryPlan {
  config: HeatRecoveryConfig;
  runsPerMode: number;
  runs: HeatRecoveryRun[];
  errors: { mode: HeatRecoveryMode; round: number; message: string }[];
}

function heatRecoveryPlan(opts: Options): HeatRecoveryPlan {
  return { config: opts.quick ? HEAT_RECOVERY_QUICK : HEAT_RECOVERY_FULL, runsPerMode: opts.recoveryRuns, runs: [], errors: [] };
}

/** `runsPerMode` rounds; in each, one drill per mode, retry-one first in even rounds. */
async function runHeatRecovery(plan: HeatRecoveryPlan, tmpDir: string): Promise<void> {
  const c = plan.config;
  progress(
    `\n== heat-recovery: examples/heat.ts ${c.rows}x${c.cols} x ${c.iters} on ${c.np} ranks, rank ${c.victim} killed at step ${c.killStep}; lifeline drill, retry-one vs cpr --checkpoint-every ${c.cprCheckpointEvery}; ${plan.runsPerMode} run(s) per mode`,
  );
  for (let round = 0; round < plan.runsPerMode; round++) {
    const modes: HeatRecoveryMode[] = round % 2 === 0 ? ["retry-one", "cpr"] : ["cpr", "retry-one"];
    for (const mode of modes) {
      try {
        const r = await heatRecoveryRun({ root: ROOT, scratch: tmpDir, config: c, mode, round });
        plan.runs.push(r);
        progress(
          `  ${mode} run ${round + 1}: detect ${fmtS(r.detectMs)}, restart ${fmtS(r.restartMs)}, catch up ${fmtS(r.catchUpMs)} → total ${fmtS(r.totalMs)}` +
            `${mode === "cpr" ? ` (earliest possible ${fmtS(r.totalLowMs)})` : ""}; ${r.workLostSteps ?? "?"} steps redone; runs ${fmtS(r.faultyWallMs)} (reference ${fmtS(r.referenceWallMs)})`,
        );
      } catch (err) {
        const message = (err as Error).message;
        plan.errors.push({ mode, round, message });
        progress(`  ${mode} run ${round + 1} FAILED: ${message}`);
      }
    }
  }
}

// ---- durable: retry-one's durable floor, --durable-every N vs 0 -------------------------------

interface DurablePlan {
  config: DurableConfig;
  runsPerVariant: number;
  runs: DurableRun[];
  errors: string[];
}

function durablePlan(opts: Options): DurablePlan {
  return { config: opts.quick ? DURABLE_QUICK : DURABLE_FULL, runsPerVariant: opts.recoveryRuns, runs: [], errors: [] };
}

/** `runsPerVariant` rounds over 0 and every candidate, rotating which goes first. */
async function runDurable(plan: DurablePlan, tmpDir: string): Promise<void> {
  const c = plan.config;
  const variants = [0, ...c.candidates];
  progress(
    `\n== durable: bench/programs/recovery.ts on ${c.np} ranks, ${c.globalMib} MiB global + ${c.localMib} MiB local, ${c.steps} steps of ${c.stepMs} ms, no fault; --mode retry-one --durable-every ${variants.join(", ")}; ${plan.runsPerVariant} run(s) each`,
  );
  for (let round = 0; round < plan.runsPerVariant; round++) {
    const turn = variants.map((_, i) => variants[(i + round) % variants.length]!);
    for (const every of turn) {
      try {
        const r = await durableRun({ root: ROOT, dir: tmpDir, name: `durable-${every}-${round}`, config: c, every, round });
        plan.runs.push(r);
        progress(
          `  --durable-every ${every} run ${round + 1}: program ${fmtS(r.computeMs)}, ${r.lines} durable line(s) committed, CPU ${r.cpuS === undefined ? "?" : `${r.cpuS.toFixed(1)} s`}, load ${r.load1.toFixed(1)}`,
        );
      } catch (err) {
        const message = (err as Error).message;
        plan.errors.push(`--durable-every ${every} run ${round + 1}: ${message}`);
        progress(`  --durable-every ${every} run ${round + 1} FAILED: ${message.split("\n")[0]}`);
      }
    }
  }
}

interface PartnerPlan {
  globalMib: number;
  localMib: number;
  steps: number;
  stepMs: number;
  runsPerScope: number;
  runs: PartnerCostRun[];
  errors: string[];
}

function partnerPlan(opts: Options): PartnerPlan {
  // Enough steps for several lines even on a loaded machine (the first line is left out).
  const size = opts.quick ? { globalMib: 4, steps: 60 } : { globalMib: 16, steps: 120 };
  return { ...size, localMib: 1, stepMs: 20, runsPerScope: opts.recoveryRuns, runs: [], errors: [] };
}

/** `--hosts --only partner`: cpr lines with and without partner copies, runs alternating. */
async function runPartnerCost(plan: PartnerPlan, tmpDir: string): Promise<void> {
  progress(
    `\n== partner copies: cpr on 4 ranks across 2 test hosts, ${plan.globalMib} MiB global + ${plan.localMib} MiB local state, a line every 5 steps, stores on each host's disk; --store-scope host vs shared, ${plan.runsPerScope} run(s) each`,
  );
  // Own parts, copies, and up to 3 lines of each (2 kept, 1 in progress), with room to spare.
  const diskMb = Math.ceil(2 * 2 * 3 * (plan.globalMib + plan.localMib + 1) * 1.5) + 64;
  const hostfile = path.join(tmpDir, "partner-hosts");
  for (let k = 0; k < plan.runsPerScope; k++) {
    const scopes: ("host" | "shared")[] = k % 2 === 0 ? ["shared", "host"] : ["host", "shared"];
    for (const scope of scopes) {
      // A cluster per run: every run starts on empty disks.
      const cluster = await TestCluster.create(2, { diskMb });
      try {
        writeFileSync(hostfile, cluster.hosts.map((h) => `${h.address} slots=2\n`).join(""));
        const r = await partnerCostRun({
          cluster,
          hostfile,
          root: ROOT,
          name: `partner-${scope}-${k}`,
          scope,
          globalMib: plan.globalMib,
          localMib: plan.localMib,
          steps: plan.steps,
          stepMs: plan.stepMs,
        });
        plan.runs.push(r);
        progress(`  ${scope} run ${k + 1}: ${r.lines} lines, median ${r.lineMs.toFixed(0)} ms per line of ${(r.lineBytes / 2 ** 20).toFixed(1)} MiB`);
      } catch (err) {
        plan.errors.push(`${scope} run ${k + 1}: ${(err as Error).message}`);
        progress(`  ${scope} run ${k + 1} FAILED: ${(err as Error).message.split("\n")[0]}`);
      } finally {
        await cluster.destroy();
      }
    }
  }
}

function partnerText(plan: PartnerPlan): string {
  const title = `### What a partner copy costs a cpr line: 4 ranks on 2 test hosts, ${plan.globalMib} MiB global + ${plan.localMib} MiB local state per rank, a line every 5 steps (line = request → commit durable; first line of each run left out)`;
  return [renderPartnerTable(plan.runs, title), ...plan.errors.map((e) => `- partner ${e.split("\n")[0]}`)].join("\n");
}

function fmtS(ms: number): string {
  return `${(ms / 1000).toFixed(2)} s`;
}

function recoveryText(plan: RecoveryPlan): string {
  const c = plan.config;
  if (plan.hostLoss === true) {
    const title = `### Recovery after a lost host, 4 ranks on 2 test hosts + 1 spare, ${c.globalMib} MiB global + ${c.localMib} MiB local state, host 2 killed at rank 2's step ${c.failStep}; --heartbeat 100 --failure-timeout 1s (median; seconds; "catch up" = restore → first step computed, "total" = kill → computing again)`;
    return [renderRecoveryTable(plan.runs, title), ...plan.errors.map((e) => `- recovery ${e.split("\n")[0]}`)].join("\n");
  }
  const out = [
    renderRecoveryTable(
      plan.runs,
      `### Recovery, ${c.np} ranks, ${c.globalMib} MiB global + ${c.localMib} MiB local state per rank, rank 1 killed at step ${c.failStep} (median; seconds)`,
    ),
  ];
  // The same bound for both modes (the message-path issue's for cpr: kill → every rank past the failure).
  for (const [variant, what] of [
    ["retry-one", "kill → restarted rank caught up"],
    ["cpr", "kill → every rank past the failure"],
  ] as const) {
    const runs = plan.runs.filter((r) => r.variant === variant);
    if (runs.length === 0) continue;
    const total = median(runs.map((r) => r.totalMs)) / 1000;
    const within = runs.filter((r) => r.totalMs <= RECOVERY_TARGET_S * 1000).length;
    out.push(
      `Target (${variant}, ${what}) <= ${RECOVERY_TARGET_S} s: ${total <= RECOVERY_TARGET_S ? "met" : "NOT met"} (median ${total.toFixed(2)} s; ${within} of ${runs.length} runs within).`,
    );
  }
  out.push("");
  for (const e of plan.errors) out.push(`- recovery ${e.split("\n")[0]}`);
  return out.join("\n");
}

await main().catch((err: unknown) => {
  process.stderr.write(`bench: ${(err as Error).stack ?? String(err)}\n`);
  killAllSync();
  process.exit(1);
});
process.exit(process.exitCode ?? 0);
