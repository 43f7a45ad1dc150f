/**
 * The ping-pong program of bench/tools/mode-ab.ts (`--bench pingpong`), for 2 ranks: `--iters`
 * round trips of a `--bytes` Uint8Array (rank 0 sends and awaits the echo, rank 1 echoes what it
 * received) and, every `--checkpoint-every` round trips (default 250), checkpoint(null) on both
 * ranks (rank 1 every `--checkpoint-every-1` round trips instead, if given: a multiple of rank
 * 0's, as a master and its workers checkpoint at different rates). retry-one keeps every
 * message in its sender's log until the receiver's next checkpoint, and the log is part of the
 * sender's checkpoint. Finalizes with this rank's median
 * round trip (ms), its CPU time per round trip (ms, process.cpuUsage: every thread of the
 * process — ZeroMQ's I/O thread included) and its main thread's share of that (ms; JavaScript,
 * garbage collection and the native calls made from it, as bench/lib/thread-cpu.ts reads it; 0
 * where the system does not say), all over the `--iters` round trips after the warm-up (blocks
 * of `--checkpoint-every` round trips until rank 0 has spent `--warmup-ms`, default 3000, agreed
 * by a bcast), and the median time of the checkpoint() calls among them (ms). The checkpoints'
 * CPU falls in the measured figures, as in a program that checkpoints every so often; their
 * time does not fall in the round trips'.
 * `--settle-ms`, `--cpu-prof <dir>` and `--v8-flags` as in allreduce-loop.ts.
 */
import path from "node:path";
import { parseArgs } from "node:util";
import v8 from "node:v8";
import { init } from "lifeline";
import { startProfile } from "../lib/profile.ts";
import { threadCpuClock } from "../lib/thread-cpu.ts";

const { values } = parseArgs({
  options: {
    bytes: { type: "string", default: "65536" },
    iters: { type: "string", default: "2000" },
    "warmup-ms": { type: "string", default: "3000" },
    "checkpoint-every": { type: "string", default: "250" },
    "checkpoint-every-1": { type: "string" },
    "settle-ms": { type: "string", default: "1500" },
    "cpu-prof": { type: "string" },
    "v8-flags": { type: "string" },
  },
});
if (values["v8-flags"] !== undefined) v8.setFlagsFromString(values["v8-flags"]);
const bytes = Number(values.bytes);
const iters = Number(values.iters);
const every = Math.max(1, Number(values["checkpoint-every"]));
// Rank 1's own interval (a multiple of rank 0's): ranks that checkpoint at different rates.
const every1 = values["checkpoint-every-1"] === undefined ? every : Number(values["checkpoint-every-1"]);
if (!Number.isInteger(every1) || every1 < every || every1 % every !== 0) {
  throw new Error(`pingpong-loop: --checkpoint-every-1 ${values["checkpoint-every-1"]}: expected a multiple of --checkpoint-every (${every})`);
}
let roundTrips = 0;
const TAG = 1;

const world = await init();
if (world.size !== 2) throw new Error(`pingpong-loop: needs exactly 2 ranks, got ${world.size}`);
await world.restore();
await new Promise((resolve) => setTimeout(resolve, Number(values["settle-ms"])));
const buf = new Uint8Array(bytes).fill(world.rank + 1);

/** The timed checkpoint() calls' times (ms). */
const checkpointTimes: number[] = [];

/** `n` round trips, then a checkpoint; each round trip's time (ms) goes to `times` if given, the checkpoint's to checkpointTimes. */
async function block(n: number, times?: number[]): Promise<void> {
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    if (world.rank === 0) {
      await world.send(buf, 1, TAG);
      const back = await world.recv(1, TAG);
      if ((back.data as Uint8Array).byteLength !== bytes) throw new Error(`echo of ${(back.data as Uint8Array).byteLength} bytes, sent ${bytes}`);
    } else {
      const m = await world.recv(0, TAG);
      await world.send(m.data, 0, TAG);
    }
    times?.push(performance.now() - t0);
  }
  roundTrips += n;
  if (world.rank === 1 && roundTrips % every1 !== 0) return;
  const t0 = performance.now();
  await world.checkpoint(null);
  if (times !== undefined) checkpointTimes.push(performance.now() - t0);
}

const w0 = performance.now();
while ((await world.bcast(performance.now() - w0 < Number(values["warmup-ms"]), 0)) === true) await block(every);

const times: number[] = [];
const stopProfile = values["cpu-prof"] === undefined ? undefined : await startProfile();
const mainCpu = threadCpuClock();
const c0 = process.cpuUsage();
const m0 = mainCpu?.() ?? 0;
for (let done = 0; done < iters; done += every) await block(Math.min(every, iters - done), times);
const m = (mainCpu?.() ?? 0) - m0;
const c = process.cpuUsage(c0);
await stopProfile?.(path.join(values["cpu-prof"]!, `${world.mode}-${world.rank}.cpuprofile`));
times.sort((a, b) => a - b);
checkpointTimes.sort((a, b) => a - b);
await world.finalize({
  medianMs: times[Math.floor(times.length / 2)]!,
  checkpointMs: checkpointTimes[Math.floor(checkpointTimes.length / 2)] ?? 0,
  cpuMsPerIter: (c.user + c.system) / 1000 / iters,
  mainMsPerIter: m / 1e6 / iters,
});
