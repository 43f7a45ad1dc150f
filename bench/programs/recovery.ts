/**
 * The rank program of the recovery benchmark (`npm run bench -- --only recovery`, bench/lib/recovery.ts):
 * a data-parallel job in the shape retry-one is built for — a model of `--global-mib` MiB identical
 * on every rank (the `global` part of the checkpoint) and `--local-mib` MiB of per-rank state.
 * Each step does `--step-ms` of work on a slice of the local state, an allreduce of one number,
 * folds the sum into the model and calls `checkpoint(local, model)` (both copied when saved:
 * retry-one at every call, cpr when a line is due).
 *
 * Runs unchanged in `--mode retry-one` (every checkpoint() is a version) and `--mode cpr` (a line
 * when the initiator asks). With `--inject R@step:K` rank R dies at its K-th checkpoint() call;
 * after the restart the ranks that run again print, on stderr, wall-clock marks the harness turns
 * into the recovery's parts:
 *   `recovery-bench: start <ms>`               the process is running the program (module evaluated);
 *   `recovery-bench: restored <ms> step <s>`   init() and restore() returned;
 *   `recovery-bench: first <ms>`               the rank finished its first step after the restore (computing again);
 *   `recovery-bench: past <ms>`                the rank finished step K again (caught up with the failure point).
 * `<ms>` is performance.timeOrigin + performance.now() (the same clock as the fault line's).
 *
 * Args: --global-mib G (64), --local-mib L (1), --steps N (40), --fail-step K (25), --step-ms W (20).
 */
import { parseArgs } from "node:util";
import { init } from "lifeline";

const nowMs = (): number => performance.timeOrigin + performance.now();
const mark = (what: string): void => void process.stderr.write(`recovery-bench: ${what}\n`);
const startedMs = nowMs();

const { values } = parseArgs({
  options: {
    "global-mib": { type: "string", default: "64" },
    "local-mib": { type: "string", default: "1" },
    steps: { type: "string", default: "40" },
    "fail-step": { type: "string", default: "25" },
    "step-ms": { type: "string", default: "20" },
  },
});
const globalMib = Number(values["global-mib"]);
const localMib = Number(values["local-mib"]);
const steps = Number(values.steps);
const failStep = Number(values["fail-step"]);
const stepMs = Number(values["step-ms"]);

/**
 * Distinct values, as a trained model's are (a constant model would be all equal blocks, which
 * a cpr line stores once: see BLOCKED_BYTES_MIN in src/store/types.ts).
 */
function initialModel(n: number): Float64Array {
  const m = new Float64Array(n);
  for (let i = 0; i < n; i++) m[i] = 1 + i * 2 ** -30;
  return m;
}

interface Local {
  step: number;
  data: Float64Array;
}

const world = await init();
const saved = await world.restore<Local, Float64Array>();
const recovering = world.attempt > 0 || saved !== undefined;
if (recovering) {
  mark(`start ${startedMs.toFixed(3)}`);
  mark(`restored ${nowMs().toFixed(3)} step ${saved?.state.step ?? 0}`);
}
const model = saved?.global ?? initialModel((globalMib * (1 << 20)) / 8);
const local: Local = saved?.state ?? { step: 0, data: new Float64Array(Math.max(1, (localMib * (1 << 20)) / 8)).fill(world.rank + 1) };

const slice = Math.max(1, Math.floor(local.data.length / 16));
let firstMarked = false;
while (local.step < steps) {
  const data = local.data;
  const until = performance.now() + stepMs;
  const from = (local.step * slice) % data.length;
  do {
    for (let i = from; i < Math.min(from + slice, data.length); i++) data[i] = data[i]! * 0.5 + 1;
  } while (performance.now() < until);
  const sum = await world.allreduce(data[from]!, "sum");
  if (model.length > 0) model[local.step % model.length] = sum;
  else data[(from + 1) % data.length] = sum;
  local.step++;
  await world.checkpoint(local, model);
  if (recovering && !firstMarked) {
    firstMarked = true;
    mark(`first ${nowMs().toFixed(3)}`);
  }
  if (recovering && local.step === failStep) mark(`past ${nowMs().toFixed(3)}`);
}
let digest = 0;
for (let i = 0; i < model.length; i += 4096) digest += model[i]!;
for (let i = 0; i < local.data.length; i += 512) digest += local.data[i]!;
await world.finalize(digest);
