/**
 * Plumbing shared by the raw zeromq.js baseline processes (`bench/programs/raw-*.ts`):
 * arguments, endpoints, payloads and the command loop. The timed code itself lives in each
 * program, next to the socket it uses.
 */
import { CtrlClient, exitWithParent, programArgs, type HarnessMessage } from "./ctrl.ts";
import path from "node:path";
import { constants as perfConstants, type PerformanceEntry, PerformanceObserver } from "node:perf_hooks";
import { getHeapSpaceStatistics } from "node:v8";
import type { BenchName } from "./plan.ts";
import { startProfile } from "./profile.ts";

export interface RawArgs {
  ctrl: string;
  id: string;
  rank: number;
  size: number;
  transport: "ipc" | "tcp";
  dir: string;
  payload: PayloadKind;
  idleMs: number;
  /** Directory for a CPU profile of this process (`--cpu-prof`), or undefined. */
  cpuProf: string | undefined;
  /** tcp: the address to bind (a test host's, `--host`), default the loopback address. */
  host: string | undefined;
}

export type PayloadKind = "f64" | "u8";

export function rawArgs(argv: readonly string[]): RawArgs {
  const m = programArgs(argv);
  const need = (k: string): string => {
    const v = m.get(k);
    if (v === undefined) throw new Error(`missing --${k}`);
    return v;
  };
  const transport = m.get("transport") ?? "ipc";
  if (transport !== "ipc" && transport !== "tcp") throw new Error(`--transport ${transport}: expected ipc or tcp`);
  const payload = m.get("payload") ?? "f64";
  if (payload !== "f64" && payload !== "u8") throw new Error(`--payload ${payload}: expected f64 or u8`);
  return {
    ctrl: need("ctrl"),
    id: need("id"),
    rank: Number(need("rank")),
    size: Number(need("size")),
    transport,
    dir: need("dir"),
    payload,
    idleMs: Number(m.get("idle-ms") ?? 120_000),
    cpuProf: m.get("cpu-prof"),
    host: m.get("host"),
  };
}

/** Where a raw process binds: an ipc path in the run's temp dir, or an ephemeral tcp port. */
export function bindAddress(a: RawArgs, name: string): string {
  return a.transport === "ipc" ? `ipc://${a.dir}/${name}-${a.rank}` : `tcp://${a.host ?? "127.0.0.1"}:0`;
}

/**
 * A payload of `bytes` bytes: a Float64Array (filled with `fill`) when the size allows and
 * `kind` is f64, else a Uint8Array. The same rule is used on the Lifeline side.
 */
export function makePayload(bytes: number, kind: PayloadKind, fill: number): Float64Array | Uint8Array {
  if (kind === "f64" && bytes % 8 === 0) return new Float64Array(bytes / 8).fill(fill);
  return new Uint8Array(bytes).fill(fill & 0xff);
}

/**
 * A timed block's cost on one rank: wall time; CPU time of the whole process (every thread,
 * libzmq's I/O thread included); and the time the main thread's event loop was active
 * (not waiting in epoll), which is where the JavaScript side of the message path runs.
 */
export interface BlockTime {
  seconds: number;
  cpuS: number;
  loopS: number;
  /** Minor page faults of the process during the block (fresh memory being touched). */
  minorFaults: number;
  /** V8's garbage-collection pauses on the main thread during the block (seconds; see gcTally). */
  gcS: number;
  /** Full (mark-compact) collections during the block. */
  majorGcs: number;
  /**
   * The capacity of V8's young generation (its new space) at the block's end, in MiB. V8 grows
   * it as more survives its collections and shrinks it when the process allocates little (an
   * idle one does); a smaller one is collected more often.
   */
  youngMiB: number;
}

/** The young generation's capacity now, in MiB (read after a block's clocks stopped). */
function youngGenerationMiB(): number {
  for (const s of getHeapSpaceStatistics()) if (s.space_name === "new_space") return s.space_size / (1024 * 1024);
  return 0;
}

/**
 * Garbage collections of this process so far, as Node reports them (`gc` performance entries:
 * every pause, and whether it was a full mark-compact). Node delivers an entry shortly after
 * its pause, so one at the very end of a block may count toward the next block; over many
 * blocks that evens out.
 */
const gcTally = { s: 0, majors: 0, observer: undefined as PerformanceObserver | undefined };

function countGc(entries: readonly PerformanceEntry[]): void {
  for (const e of entries) {
    gcTally.s += e.duration / 1000;
    if ((e as PerformanceEntry & { detail?: { kind?: number } }).detail?.kind === perfConstants.NODE_PERFORMANCE_GC_MAJOR) gcTally.majors++;
  }
}

/** Starts the clocks; the returned function reads them all. */
export function startClock(): () => BlockTime {
  if (gcTally.observer === undefined) {
    gcTally.observer = new PerformanceObserver((list) => countGc(list.getEntries()));
    gcTally.observer.observe({ entryTypes: ["gc"] });
  }
  const gcS0 = gcTally.s;
  const majors0 = gcTally.majors;
  const faults0 = process.resourceUsage().minorPageFault;
  const elu0 = performance.eventLoopUtilization();
  const cpu0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  return () => {
    const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
    const cpu = process.cpuUsage(cpu0);
    const elu = performance.eventLoopUtilization(elu0);
    const minorFaults = process.resourceUsage().minorPageFault - faults0;
    countGc(gcTally.observer?.takeRecords() ?? []);
    return {
      seconds,
      cpuS: (cpu.user + cpu.system) / 1e6,
      loopS: elu.active / 1000,
      minorFaults,
      gcS: gcTally.s - gcS0,
      majorGcs: gcTally.majors - majors0,
      youngMiB: youngGenerationMiB(),
    };
  };
}

/** Runs the command loop until `quit`: each `run` → the program's timed block → `done`. */
export async function serveCommands(
  ctrl: CtrlClient,
  a: RawArgs,
  runBlock: (bench: BenchName, bytes: number, iters: number) => Promise<BlockTime>,
): Promise<void> {
  const stopProfile = a.cpuProf !== undefined ? await startProfile() : undefined;
  for (;;) {
    const cmd: HarnessMessage = await ctrl.receive(a.idleMs);
    if (cmd.t === "quit") {
      await stopProfile?.(path.join(a.cpuProf!, `${a.id}-${a.rank}.cpuprofile`));
      return;
    }
    if (cmd.t !== "run") throw new Error(`unexpected command ${cmd.t}`);
    try {
      const t = await runBlock(cmd.bench, cmd.bytes, cmd.iters);
      await ctrl.send({ t: "done", seq: cmd.seq, rank: a.rank, ...t });
    } catch (err) {
      await ctrl.send({ t: "error", seq: cmd.seq, rank: a.rank, message: (err as Error).stack ?? String(err) });
      throw err;
    }
  }
}

/** Start-up shared by the raw programs: stdin watch, control connection. */
export async function startRaw(argv: readonly string[]): Promise<{ a: RawArgs; ctrl: CtrlClient }> {
  exitWithParent();
  const a = rawArgs(argv);
  const ctrl = await CtrlClient.connect(a.ctrl, `${a.id}:${a.rank}`);
  return { a, ctrl };
}

/** Waits for the harness's endpoint table. */
export async function receivePeers(ctrl: CtrlClient, a: RawArgs): Promise<string[]> {
  const msg = await ctrl.receive(a.idleMs);
  if (msg.t !== "peers") throw new Error(`expected the peer table, got ${msg.t}`);
  return msg.endpoints;
}
