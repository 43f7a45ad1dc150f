/**
 * What the benchmark measures: the cases (benchmark × ranks × size), how each timed block
 * turns into one figure, the targets from the issue, and where the peer figures come from.
 *
 * Every figure is stored as seconds per operation; `display` converts it to the unit of the
 * table (µs per one-way message or per collective, MB/s = 1e6 B/s for streaming).
 */

export type BenchName = "pingpong" | "stream" | "allreduce" | "bcast" | "barrier";
export const BENCH_NAMES: readonly BenchName[] = ["pingpong", "stream", "allreduce", "bcast", "barrier"];

export const KiB = 1024;
export const MiB = 1024 * 1024;

export interface Case {
  bench: BenchName;
  np: number;
  bytes: number;
  /** Row label inside its table, e.g. "np 4, 1 MiB". */
  label: string;
}

export interface Sizes {
  pingpong: number[];
  stream: number[];
  allreduce: number[];
  bcast: number[];
  /** Rank counts of the collectives. */
  collectiveNps: number[];
}

export const FULL_SIZES: Sizes = {
  pingpong: [8, KiB, 64 * KiB, MiB, 16 * MiB],
  stream: [64 * KiB, MiB, 16 * MiB],
  allreduce: [8, 64 * KiB, MiB, 16 * MiB, 64 * MiB],
  bcast: [MiB, 16 * MiB],
  collectiveNps: [2, 4],
};

/** `--quick`: small payloads only, for the smoke test. */
export const QUICK_SIZES: Sizes = {
  pingpong: [8, 64 * KiB],
  stream: [64 * KiB],
  allreduce: [8, 64 * KiB],
  bcast: [64 * KiB],
  collectiveNps: [2, 4],
};

export function sizeLabel(bytes: number): string {
  if (bytes >= MiB && bytes % MiB === 0) return `${bytes / MiB} MiB`;
  if (bytes >= KiB && bytes % KiB === 0) return `${bytes / KiB} KiB`;
  return `${bytes} B`;
}

export function caseKey(c: Case): string {
  return `${c.bench} np${c.np} ${sizeLabel(c.bytes)}`;
}

export function buildCases(sizes: Sizes, only: ReadonlySet<BenchName>): Case[] {
  const out: Case[] = [];
  const p2p = (bench: BenchName, list: number[]): void => {
    if (!only.has(bench)) return;
    for (const bytes of list) out.push({ bench, np: 2, bytes, label: sizeLabel(bytes) });
  };
  p2p("pingpong", sizes.pingpong);
  p2p("stream", sizes.stream);
  for (const np of sizes.collectiveNps) {
    if (only.has("allreduce")) for (const bytes of sizes.allreduce) out.push({ bench: "allreduce", np, bytes, label: `np ${np}, ${sizeLabel(bytes)}` });
    if (only.has("bcast")) for (const bytes of sizes.bcast) out.push({ bench: "bcast", np, bytes, label: `np ${np}, ${sizeLabel(bytes)}` });
    if (only.has("barrier")) out.push({ bench: "barrier", np, bytes: 0, label: `np ${np}` });
  }
  return out;
}

/** Which raw program measures a benchmark, if any (bcast and barrier have no raw baseline). */
export function rawProgramFor(bench: BenchName): "raw-pingpong" | "raw-pushpull" | undefined {
  switch (bench) {
    case "pingpong": return "raw-pingpong";
    case "stream":
    case "allreduce": return "raw-pushpull";
    case "bcast":
    case "barrier": return undefined;
  }
}

/**
 * One timed block → seconds per operation. `seconds[r]` is rank r's wall time for `iters`
 * operations after a barrier.
 * - pingpong: rank 0 times `iters` round trips; one way = round trip / 2;
 * - stream: rank 0 (the sender) times `iters` messages plus the receiver's final ack;
 * - collectives: the slowest rank's time per operation.
 */
export function perOpSeconds(bench: BenchName, iters: number, seconds: readonly number[]): number {
  switch (bench) {
    case "pingpong": return seconds[0]! / (2 * iters);
    case "stream": return seconds[0]! / iters;
    case "allreduce":
    case "bcast":
    case "barrier": return Math.max(...seconds) / iters;
  }
}

/**
 * CPU seconds per operation, summed over the job's processes (every thread, so libzmq's I/O
 * threads count): per one-way message for pingpong, per message for stream, per call for
 * collectives. Less sensitive than wall time to other load on the machine.
 */
export function cpuPerOpSeconds(bench: BenchName, iters: number, cpuS: readonly number[]): number {
  const total = cpuS.reduce((a, b) => a + b, 0);
  return bench === "pingpong" ? total / (2 * iters) : total / iters;
}

export type Unit = "us" | "MB/s";

export function unitOf(bench: BenchName): Unit {
  return bench === "stream" ? "MB/s" : "us";
}

/** Seconds per op → the table's unit. */
export function display(c: Case, perOpS: number): number {
  return unitOf(c.bench) === "MB/s" ? c.bytes / perOpS / 1e6 : perOpS * 1e6;
}

/**
 * Lifeline relative to a reference, in the direction of the table: time ratio (lower is
 * better) for latencies and collectives, bandwidth ratio (higher is better) for streaming.
 */
export function ratioOf(c: Case, lifelinePerOpS: number, referencePerOpS: number): number {
  return unitOf(c.bench) === "MB/s" ? referencePerOpS / lifelinePerOpS : lifelinePerOpS / referencePerOpS;
}

export interface Target {
  text: string;
  met: (ratioToRaw: number) => boolean;
}

/** The targets (item 8), all relative to the raw baseline measured in the same run. */
export function targetFor(c: Case): Target | undefined {
  if (c.bench === "pingpong" && c.bytes === 8) return { text: "<= 1.15x raw", met: (r) => r <= 1.15 };
  if (c.bench === "stream" && c.bytes === 16 * MiB) return { text: ">= 0.9x raw MB/s", met: (r) => r >= 0.9 };
  if (c.bench === "allreduce" && c.bytes === 8 && c.np === 4) return { text: "<= 0.4x raw ring", met: (r) => r <= 0.4 };
  if (c.bench === "allreduce" && c.bytes >= MiB) return { text: "<= 1.0x raw ring", met: (r) => r <= 1.0 };
  return undefined;
}

// ---- peer figures ----------------------------------------------------------------------------

export interface PeersFile {
  source: string;
  date: string;
  note: string;
  /** Open MPI 4.1.4, ob1 + tcp BTL on loopback: `table → np → size label → value` (µs or MB/s). */
  mpiTcp: Record<BenchName, Record<string, Record<string, number>>>;
}

/** The Open MPI TCP figure for a case, in the case's display unit, if the peers file has it. */
export function peerFigure(peers: PeersFile, c: Case): number | undefined {
  const byNp = peers.mpiTcp[c.bench]?.[String(c.np)];
  if (byNp === undefined) return undefined;
  return byNp[c.bench === "barrier" ? "-" : sizeLabel(c.bytes)];
}

/** A peer figure (display unit) → seconds per op, so that ratios are computed one way. */
export function peerPerOpSeconds(c: Case, value: number): number {
  return unitOf(c.bench) === "MB/s" ? c.bytes / (value * 1e6) : value / 1e6;
}
