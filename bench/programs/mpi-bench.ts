/**
 * The Lifeline side of the benchmark: an ordinary Lifeline program, started by the real
 * launcher, that times the communicator's point-to-point calls and collectives.
 *
 * Two ways to run it:
 *
 * - Driven by bench/run.ts (`--ctrl <endpoint> --id <job>`): every rank connects to the
 *   harness and runs the timed blocks it is told to run, so the harness can alternate them
 *   with the raw zeromq.js baseline. Each rank finalizes with the list of blocks it timed.
 * - Alone, as a user would: it sweeps the cases itself (calibrate to ~50 ms per timing, one
 *   warm-up, `--reps` timed repetitions, median) and rank 0 finalizes with the table:
 *
 *     node dist/cli.js run -n 4 --mode none --results r.json bench/programs/mpi-bench.ts \
 *          --bench allreduce,bcast,barrier --sizes 8,1048576 --reps 7
 *
 * Every timed block starts with `world.barrier()`, so all ranks start together.
 */
import path from "node:path";
import { init } from "lifeline";
import { CtrlClient, exitWithHarness, programArgs } from "../lib/ctrl.ts";
import { BENCH_NAMES, FULL_SIZES, STREAM_WINDOW, perOpSeconds, display, sizeLabel, unitOf, type BenchName, type Case } from "../lib/plan.ts";
import { isendInWindows } from "../lib/isend-window.ts";
import { makePayload, startClock, type BlockTime, type PayloadKind } from "../lib/raw-proc.ts";
import { startProfile } from "../lib/profile.ts";
import { calibrate, median, spread } from "../lib/stats.ts";

type World = Awaited<ReturnType<typeof init>>;

const TAG_DATA = 7;
const TAG_ACK = 8;

const args = programArgs(process.argv.slice(2));
const payloadKind = (args.get("payload") ?? "f64") as PayloadKind;
const world: World = await init();
const rank = world.rank;
const size = world.size;
// In --mode retry-one a program must call restore() before any point-to-point call (a
// restarted rank's message counters come from its checkpoint); in every mode a fresh job gets
// undefined back (mode none always; cpr and retry-one when nothing was saved yet). The bench
// never restarts a job, so anything else means a rank failed and came back: its figures would
// mix a recovery into the timed blocks.
const restored = await world.restore();
if (restored !== undefined) throw new Error(`mpi-bench: rank ${rank} restored checkpoint ${restored.version}; a benchmark job must not restart`);

const payloads = new Map<string, Float64Array | Uint8Array>();
function payload(bench: BenchName, bytes: number): Float64Array | Uint8Array {
  const key = `${bench}:${bytes}`; // per benchmark: allreduce fills with rank + 1, the others with 1
  let buf = payloads.get(key);
  if (buf === undefined) {
    buf = bench === "allreduce" ? makePayload(bytes, "f64", rank + 1) : makePayload(bytes, payloadKind, 1);
    payloads.set(key, buf);
  }
  return buf;
}

function byteLength(data: unknown): number {
  return ArrayBuffer.isView(data) ? data.byteLength : -1;
}

/** Barrier, then `iters` operations; returns this rank's wall time in seconds. */
async function runBlock(bench: BenchName, bytes: number, iters: number): Promise<BlockTime> {
  const buf = payload(bench, bytes);
  await world.barrier();
  const stop = startClock();
  switch (bench) {
    case "pingpong": {
      if (rank === 0) {
        for (let i = 0; i < iters; i++) {
          await world.send(buf, 1, TAG_DATA);
          const back = await world.recv(1, TAG_DATA);
          if (byteLength(back.data) !== bytes) throw new Error(`echo of ${byteLength(back.data)} bytes, sent ${bytes}`);
        }
      } else if (rank === 1) {
        for (let i = 0; i < iters; i++) {
          const m = await world.recv(0, TAG_DATA);
          await world.send(m.data, 0, TAG_DATA);
        }
      }
      break;
    }
    case "stream":
    case "stream-isend": {
      if (rank === 0) {
        if (bench === "stream") {
          for (let i = 0; i < iters; i++) await world.send(buf, 1, TAG_DATA);
        } else {
          await isendInWindows(world, buf, 1, TAG_DATA, iters, STREAM_WINDOW);
        }
        await world.recv(1, TAG_ACK);
      } else if (rank === 1) {
        let received = 0;
        for (let i = 0; i < iters; i++) received += byteLength((await world.recv(0, TAG_DATA)).data);
        await world.send(1, 0, TAG_ACK);
        if (received !== iters * bytes) throw new Error(`received ${received} bytes, expected ${iters * bytes}`);
      }
      break;
    }
    case "allreduce": {
      let out: unknown = buf;
      for (let i = 0; i < iters; i++) out = await world.allreduce(buf, "sum");
      const res = out as Float64Array;
      const expect = (size * (size + 1)) / 2;
      if (res[0] !== expect || res[res.length - 1] !== expect) throw new Error(`allreduce gave ${res[0]}, expected ${expect}`);
      break;
    }
    case "bcast": {
      for (let i = 0; i < iters; i++) {
        const got = await world.bcast(buf, 0);
        if (byteLength(got) !== bytes) throw new Error(`bcast delivered ${byteLength(got)} bytes, expected ${bytes}`);
      }
      break;
    }
    case "barrier": {
      for (let i = 0; i < iters; i++) await world.barrier();
      break;
    }
  }
  return stop();
}

// ---- driven by the harness --------------------------------------------------------------------

async function serveHarness(endpoint: string, id: string): Promise<void> {
  const idleMs = Number(args.get("idle-ms") ?? 120_000);
  exitWithHarness(Number(args.get("harness-pid")));
  const ctrl = await CtrlClient.connect(endpoint, `${id}:${rank}`);
  await ctrl.send({
    t: "hello",
    rank,
    size,
    pid: process.pid,
    transport: process.env.LIFELINE_TRANSPORT,
    info: { mode: world.mode, attempt: world.attempt, runDir: process.env.LIFELINE_RUN_DIR },
  });
  const blocks: [BenchName, number, number, number][] = [];
  const profileDir = args.get("cpu-prof");
  const stopProfile = profileDir !== undefined ? await startProfile() : undefined;
  for (;;) {
    const cmd = await ctrl.receive(idleMs);
    if (cmd.t === "quit") {
      await stopProfile?.(path.join(profileDir!, `${id}-${rank}.cpuprofile`));
      break;
    }
    if (cmd.t !== "run") throw new Error(`unexpected command ${cmd.t}`);
    try {
      const t = await runBlock(cmd.bench, cmd.bytes, cmd.iters);
      blocks.push([cmd.bench, cmd.bytes, cmd.iters, t.seconds]);
      // retry-one keeps every collective result since the last checkpoint, and every message
      // sent until its receiver's next checkpoint (sender-based logging); a real program that
      // checkpoints each iteration would not let them grow: a checkpoint (untimed, empty
      // state) after every block.
      if (world.mode === "retry-one") await world.checkpoint(null);
      await ctrl.send({ t: "done", seq: cmd.seq, rank, ...t });
    } catch (err) {
      await ctrl.send({ t: "error", seq: cmd.seq, rank, message: (err as Error).stack ?? String(err) });
      throw err;
    }
  }
  ctrl.close();
  await world.finalize({ rank, blocks });
}

// ---- standalone sweep -----------------------------------------------------------------------

interface Row {
  bench: BenchName;
  np: number;
  bytes: number;
  size: string;
  iters: number;
  unit: string;
  median: number;
  spread: number;
  perOpS: number[];
}

async function sweep(): Promise<void> {
  const benches = (args.get("bench") ?? BENCH_NAMES.join(",")).split(",") as BenchName[];
  for (const b of benches) if (!BENCH_NAMES.includes(b)) throw new RangeError(`--bench ${b}: expected one of ${BENCH_NAMES.join(", ")}`);
  const sizesArg = args.get("sizes")?.split(",").map(Number);
  const reps = Number(args.get("reps") ?? 7);
  const targetS = Number(args.get("target-ms") ?? 50) / 1000;
  const rows: Row[] = [];
  for (const bench of benches) {
    if ((bench === "pingpong" || bench === "stream" || bench === "stream-isend") && size < 2) continue;
    const sizes = bench === "barrier" ? [0] : (sizesArg ?? (bench === "bcast" ? FULL_SIZES.bcast : FULL_SIZES[bench === "stream-isend" ? "stream" : bench]));
    for (const bytes of sizes) {
      const c: Case = { bench, np: size, bytes, label: sizeLabel(bytes) };
      // Every rank takes every decision from the same allgathered times, so they agree.
      let lastPerOpS = 0;
      const block = async (iters: number): Promise<number> => {
        const all = await world.allgather((await runBlock(bench, bytes, iters)).seconds);
        if (world.mode === "retry-one") await world.checkpoint(null); // as in serveHarness
        lastPerOpS = perOpSeconds(bench, iters, all);
        return Math.max(...all); // calibrate on the block's wall time
      };
      const cal = await calibrate(block, { targetS, itersMax: 100_000 });
      await block(cal.iters); // warm-up
      const perOpS: number[] = [];
      for (let k = 0; k < reps; k++) {
        await block(cal.iters);
        perOpS.push(lastPerOpS);
      }
      const row: Row = {
        bench,
        np: size,
        bytes,
        size: c.label,
        iters: cal.iters,
        unit: unitOf(bench),
        median: display(c, median(perOpS)),
        spread: spread(perOpS),
        perOpS,
      };
      rows.push(row);
      if (rank === 0) process.stderr.write(`mpi-bench: ${bench} np ${size} ${c.label}: ${row.median.toPrecision(4)} ${row.unit}\n`);
    }
  }
  await world.finalize(rank === 0 ? { rank, table: rows } : { rank });
}

const ctrlEndpoint = args.get("ctrl");
if (ctrlEndpoint !== undefined) await serveHarness(ctrlEndpoint, args.get("id") ?? "lifeline");
else await sweep();
