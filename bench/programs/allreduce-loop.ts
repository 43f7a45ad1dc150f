/**
 * The program of bench/tools/mode-ab.ts: `--iters` iterations of barrier, one allreduce of a
 * `--bytes` Float64Array (sum, checked) and, every `--checkpoint-every` iterations (default 1),
 * checkpoint(null) — the shape of a data-parallel training step that checkpoints every
 * iteration, or every few (retry-one keeps every collective result since the last
 * checkpoint). Finalizes with this rank's median time of the allreduce (ms) and its CPU time
 * per iteration (ms, process.cpuUsage: every thread), both over the iterations after `--warmup`. `--cpu-prof <dir>`: a V8 CPU profile per rank
 * (summarize with bench/tools/cpuprofile-top.ts).
 */
import path from "node:path";
import { parseArgs } from "node:util";
import { init } from "lifeline";
import { startProfile } from "../lib/profile.ts";

const { values } = parseArgs({
  options: {
    bytes: { type: "string", default: "16777216" },
    iters: { type: "string", default: "40" },
    warmup: { type: "string", default: "5" },
    "checkpoint-every": { type: "string", default: "1" },
    "cpu-prof": { type: "string" },
  },
});
const n = Math.max(1, Math.floor(Number(values.bytes) / 8));
const iters = Number(values.iters);
const warmup = Number(values.warmup);
const checkpointEvery = Math.max(1, Number(values["checkpoint-every"]));

const world = await init();
await world.restore();
const data = new Float64Array(n).fill(world.rank + 1);
const expect = (world.size * (world.size + 1)) / 2;
const times: number[] = [];
let cpuMs = 0;
const stopProfile = values["cpu-prof"] === undefined ? undefined : await startProfile();
for (let i = 0; i < warmup + iters; i++) {
  await world.barrier();
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  const r = (await world.allreduce(data, "sum")) as Float64Array;
  const ms = performance.now() - t0;
  const c = process.cpuUsage(c0);
  if (r[0] !== expect || r[n - 1] !== expect) throw new Error(`allreduce gave ${r[0]}, expected ${expect}`);
  if ((i + 1) % checkpointEvery === 0) await world.checkpoint(null);
  if (i < warmup) continue;
  times.push(ms);
  cpuMs += (c.user + c.system) / 1000;
}
await stopProfile?.(path.join(values["cpu-prof"]!, `${world.mode}-${world.rank}.cpuprofile`));
times.sort((a, b) => a - b);
await world.finalize({ medianMs: times[Math.floor(times.length / 2)]!, cpuMsPerIter: cpuMs / iters });
