/**
 * The program of bench/tools/mode-ab.ts: `--iters` iterations of barrier, one allreduce of a
 * `--bytes` Float64Array (sum, checked) and, every `--checkpoint-every` iterations (default 1),
 * checkpoint(null) — the shape of a data-parallel training step that checkpoints every
 * iteration, or every few (retry-one keeps every collective result since the last
 * checkpoint). Finalizes with this rank's median time of the allreduce (ms), the allreduce's CPU
 * time per iteration (ms, process.cpuUsage: every thread of the process, ZeroMQ's I/O thread
 * included) and its main thread's share of that (ms; JavaScript, garbage collection and the
 * native calls made from it, as bench/lib/thread-cpu.ts reads it; 0 where the system does not
 * say) and the minor page faults of the process (every thread) during the allreduce, all over
 * the `--iters` iterations after the warm-up (`--warmup` iterations, and more until
 * `--warmup-ms`, default 1500); and, when some of those iterations checkpointed, the median
 * time of a checkpoint() call (ms) and the process's CPU time during one (ms, every thread; what
 * the checkpoint's messages cost the rank after the call returned is not in it).
 * `--cpu-prof <dir>`: a V8 CPU profile per rank (summarize with bench/tools/cpuprofile-top.ts).
 * `--settle-ms` (default 1500): the ranks wait this long after joining before they start, so
 * that what starts with the job (cpr's and retry-one's warm spare processes booting, the
 * launcher's own start-up) is done and does not take the cores from the first iterations of
 * one mode but not another. `--v8-flags <flags>`:
 * V8 flags set in each rank before it joins (diagnostics, e.g. `--v8-flags=--trace-gc`: each
 * garbage collection on the rank's output; Node refuses most such flags in NODE_OPTIONS).
 */
import path from "node:path";
import { parseArgs } from "node:util";
import v8 from "node:v8";
import { init } from "lifeline";
import { startProfile } from "../lib/profile.ts";
import { threadCpuClock } from "../lib/thread-cpu.ts";

const { values } = parseArgs({
  options: {
    bytes: { type: "string", default: "16777216" },
    iters: { type: "string", default: "40" },
    warmup: { type: "string", default: "5" },
    "warmup-ms": { type: "string", default: "1500" },
    "checkpoint-every": { type: "string", default: "1" },
    "settle-ms": { type: "string", default: "1500" },
    "cpu-prof": { type: "string" },
    "v8-flags": { type: "string" },
  },
});
if (values["v8-flags"] !== undefined) v8.setFlagsFromString(values["v8-flags"]);
const n = Math.max(1, Math.floor(Number(values.bytes) / 8));
const iters = Number(values.iters);
const warmup = Number(values.warmup);
const checkpointEvery = Math.max(1, Number(values["checkpoint-every"]));

const world = await init();
await world.restore();
await new Promise((resolve) => setTimeout(resolve, Number(values["settle-ms"])));
const data = new Float64Array(n).fill(world.rank + 1);
const expect = (world.size * (world.size + 1)) / 2;
let done = 0;

const mainCpu = threadCpuClock();

/**
 * One iteration; its allreduce's time, CPU and main-thread CPU (ms), the process's minor page
 * faults, and the wall and CPU time (ms) of its checkpoint() call (undefined: no checkpoint).
 */
async function iteration(): Promise<{ ms: number; cpuMs: number; mainMs: number; faults: number; ckpt: { ms: number; cpuMs: number } | undefined }> {
  await world.barrier();
  const f0 = process.resourceUsage().minorPageFault;
  const c0 = process.cpuUsage();
  const m0 = mainCpu?.() ?? 0;
  const t0 = performance.now();
  const r = (await world.allreduce(data, "sum")) as Float64Array;
  const ms = performance.now() - t0;
  const m = (mainCpu?.() ?? 0) - m0;
  const c = process.cpuUsage(c0);
  const faults = process.resourceUsage().minorPageFault - f0;
  if (r[0] !== expect || r[n - 1] !== expect) throw new Error(`allreduce gave ${r[0]}, expected ${expect}`);
  let ckpt: { ms: number; cpuMs: number } | undefined;
  if (++done % checkpointEvery === 0) {
    const k0 = process.cpuUsage();
    const tk = performance.now();
    await world.checkpoint(null);
    const kc = process.cpuUsage(k0);
    ckpt = { ms: performance.now() - tk, cpuMs: (kc.user + kc.system) / 1000 };
  }
  return { ms, cpuMs: (c.user + c.system) / 1000, mainMs: m / 1e6, faults, ckpt };
}

// Warm-up: `--warmup` iterations, then 20 more at a time while rank 0 has spent less than
// `--warmup-ms` (its decision goes to every rank by a bcast, so that all run the same
// collectives). A rank runs the message path up to 3x slower for its first thousands of
// operations, while V8 compiles it.
const w0 = performance.now();
for (let i = 0; i < warmup; i++) await iteration();
while ((await world.bcast(performance.now() - w0 < Number(values["warmup-ms"]), 0)) === true) for (let i = 0; i < 20; i++) await iteration();

const times: number[] = [];
let cpuMs = 0;
let mainMs = 0;
let faults = 0;
const ckptMs: number[] = [];
let ckptCpuMs = 0;
const stopProfile = values["cpu-prof"] === undefined ? undefined : await startProfile();
for (let i = 0; i < iters; i++) {
  const it = await iteration();
  times.push(it.ms);
  cpuMs += it.cpuMs;
  mainMs += it.mainMs;
  faults += it.faults;
  if (it.ckpt !== undefined) {
    ckptMs.push(it.ckpt.ms);
    ckptCpuMs += it.ckpt.cpuMs;
  }
}
await stopProfile?.(path.join(values["cpu-prof"]!, `${world.mode}-${world.rank}.cpuprofile`));
times.sort((a, b) => a - b);
ckptMs.sort((a, b) => a - b);
await world.finalize({
  medianMs: times[Math.floor(times.length / 2)]!,
  cpuMsPerIter: cpuMs / iters,
  mainMsPerIter: mainMs / iters,
  faultsPerIter: faults / iters,
  // Absent when no measured iteration checkpointed.
  ...(ckptMs.length > 0 ? { checkpointMedianMs: ckptMs[Math.floor(ckptMs.length / 2)]!, checkpointCpuMs: ckptCpuMs / ckptMs.length } : {}),
});
