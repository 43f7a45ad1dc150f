/**
 * The program of bench/tools/stream-ab.ts: rank 0 sends `--iters` messages of `--bytes`
 * (a Float64Array, each `send` awaited) to rank 1, which receives them and answers with a
 * 1-value ack; `--blocks` such blocks after ~`--warmup-ms` (default 1500) of warm-up blocks. Finalizes, per block, the
 * bandwidth (MB/s, rank 0's time including the ack), this rank's CPU per message (us,
 * every thread) and its minor page faults per message (every thread: ZeroMQ's I/O thread
 * faults in the pages of each received message it copies into new memory). `--cpu-prof <dir>`: a V8 CPU profile per rank of its timed blocks (summarize
 * with bench/tools/cpuprofile-top.ts); `--v8-flags <flags>`: V8 flags set before the rank joins
 * (diagnostics, e.g. `--v8-flags=--trace-gc`); `--window <n>`: rank 0 `isend`s in windows of n
 * and `waitAll`s each window instead of awaiting each `send` (MPI's way to stream: an isend's
 * payload goes without a copy).
 */
import path from "node:path";
import { parseArgs } from "node:util";
import v8 from "node:v8";
import { init } from "lifeline";
import { isendInWindows } from "../lib/isend-window.ts";
import { startProfile } from "../lib/profile.ts";

const { values } = parseArgs({
  options: {
    bytes: { type: "string", default: "1048576" },
    iters: { type: "string", default: "400" },
    blocks: { type: "string", default: "3" },
    "warmup-ms": { type: "string", default: "1500" },
    "cpu-prof": { type: "string" },
    "v8-flags": { type: "string" },
    window: { type: "string", default: "0" },
  },
});
if (values["v8-flags"] !== undefined) v8.setFlagsFromString(values["v8-flags"]);
const bytes = Number(values.bytes);
const iters = Number(values.iters);
const world = await init();
await world.restore();
const buf = new Float64Array(Math.max(1, bytes / 8)).fill(1);
const window = Number(values.window);

async function block(n: number): Promise<void> {
  if (world.rank === 0) {
    if (window > 0) await isendInWindows(world, buf, 1, 7, n, window);
    else for (let i = 0; i < n; i++) await world.send(buf, 1, 7);
    await world.recv(1, 8);
  } else if (world.rank === 1) {
    for (let i = 0; i < n; i++) await world.recv(0, 7);
    await world.send(1, 0, 8);
  }
}

// Warm-up: blocks of an eighth while rank 0 has spent less than `--warmup-ms` (its decision
// goes to both by a bcast). A rank runs the message path up to 3x slower for its first
// thousands of operations, while V8 compiles it.
const w0 = performance.now();
do await block(Math.max(10, iters >> 3));
while ((await world.bcast(performance.now() - w0 < Number(values["warmup-ms"]), 0)) === true);
const mbps: number[] = [];
const cpuUs: number[] = [];
const faults: number[] = [];
const stopProfile = values["cpu-prof"] === undefined ? undefined : await startProfile();
for (let b = 0; b < Number(values.blocks); b++) {
  await world.barrier();
  const r0 = process.resourceUsage();
  const t0 = performance.now();
  await block(iters);
  const ms = performance.now() - t0;
  const r1 = process.resourceUsage();
  mbps.push((bytes * iters) / ms / 1000);
  cpuUs.push((r1.userCPUTime + r1.systemCPUTime - r0.userCPUTime - r0.systemCPUTime) / iters);
  faults.push((r1.minorPageFault - r0.minorPageFault) / iters);
}
await stopProfile?.(path.join(values["cpu-prof"]!, `stream-${world.rank}.cpuprofile`));
await world.finalize({ mbps, cpuUs, faults });
