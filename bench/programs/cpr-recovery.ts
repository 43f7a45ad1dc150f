/**
 * The rank program of the recovery benchmark (bench/cpr-bench.ts, "recovery"): every rank
 * holds `--mib` MiB of state (a Float64Array), does `--step-ms` of work per step on a slice of
 * it, an allreduce, and a checkpoint() location. Under `--mode cpr --inject R@step:K` rank R
 * dies at its K-th checkpoint() call; after the restart every rank prints, on stderr, the
 * wall-clock marks the harness turns into the recovery's parts:
 *   `cpr-bench: start <ms>`     the process is running the program (module evaluated);
 *   `cpr-bench: restored <ms> step <s>`   init() and restore() returned: the part is loaded;
 *   `cpr-bench: past <ms>`      the rank finished step K again (back past the failure point).
 * `<ms>` is performance.timeOrigin + performance.now() (the same clock as the fault line's).
 *
 * Args: --mib M (default 64), --steps N (default 60), --fail-step K (default 40), --step-ms W (default 20).
 */
import { parseArgs } from "node:util";
import { init } from "lifeline";

const nowMs = (): number => performance.timeOrigin + performance.now();
const mark = (what: string): void => void process.stderr.write(`cpr-bench: ${what}\n`);
const startedMs = nowMs();

const { values } = parseArgs({
  options: { mib: { type: "string", default: "64" }, steps: { type: "string", default: "60" }, "fail-step": { type: "string", default: "40" }, "step-ms": { type: "string", default: "20" } },
});
const mib = Number(values.mib);
const steps = Number(values.steps);
const failStep = Number(values["fail-step"]);
const stepMs = Number(values["step-ms"]);

interface State {
  step: number;
  data: Float64Array;
}

const world = await init();
const saved = await world.restore<State>();
const recovering = world.attempt > 0;
if (recovering) {
  mark(`start ${startedMs.toFixed(3)}`);
  mark(`restored ${nowMs().toFixed(3)} step ${saved?.state.step ?? 0}`);
}
const s: State = saved?.state ?? { step: 0, data: new Float64Array((mib * (1 << 20)) / 8).fill(world.rank) };

const slice = Math.max(1, Math.floor(s.data.length / 64));
while (s.step < steps) {
  const until = performance.now() + stepMs;
  const from = (s.step * slice) % s.data.length;
  do {
    for (let i = from; i < Math.min(from + slice, s.data.length); i++) s.data[i] = s.data[i]! * 0.5 + 1;
  } while (performance.now() < until);
  const sum = await world.allreduce(s.data[from]!, "sum");
  s.data[(from + 1) % s.data.length] = sum;
  s.step++;
  await world.checkpoint(s);
  if (recovering && s.step === failStep) mark(`past ${nowMs().toFixed(3)}`);
}
let digest = 0;
for (let i = 0; i < s.data.length; i += 4096) digest += s.data[i]!;
await world.finalize(digest);
