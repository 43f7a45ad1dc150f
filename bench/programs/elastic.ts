/**
 * The rank program of the elastic benchmark (`npm run bench -- --only elastic`, bench/lib/elastic.ts):
 * a data-parallel job in the elastic loop — a model of `--global-mib` MiB identical on every rank
 * (the `global` part of the checkpoint) and `--local-mib` MiB of per-rank state. Each step does
 * `--step-ms` of work on a slice of the local state, an allreduce of one number, folds the sum
 * into the model and calls `checkpoint(local, model)`.
 *
 * A rank of slot `--late-slot` waits `--late-ms` before init(): a rank that joins the running
 * job (with `--max-np` above `-n`). Wall-clock marks on stderr (`<ms>` is performance.timeOrigin +
 * performance.now(), the clock of the fault line):
 *   `elastic-bench: changed <ms> slot <s>`                  a call ended with MPI_WORLD_CHANGED;
 *   `elastic-bench: restored <ms> slot <s> size <n> step <k>` restore() returned into a new world
 *                                                          (for a joiner: with the state it got);
 *   `elastic-bench: first <ms> slot <s>`                    the first step after that is done (computing again).
 *
 * Args: --global-mib G (64), --local-mib L (1), --steps N (60), --step-ms W (20), --late-slot S (-1), --late-ms T (0).
 */
import { parseArgs } from "node:util";
import { init, isLifelineError } from "lifeline";

const nowMs = (): number => performance.timeOrigin + performance.now();
const mark = (what: string): void => void process.stderr.write(`elastic-bench: ${what}\n`);

const { values } = parseArgs({
  options: {
    "global-mib": { type: "string", default: "64" },
    "local-mib": { type: "string", default: "1" },
    steps: { type: "string", default: "60" },
    "step-ms": { type: "string", default: "20" },
    "late-slot": { type: "string", default: "-1" },
    "late-ms": { type: "string", default: "0" },
  },
});
const globalMib = Number(values["global-mib"]);
const localMib = Number(values["local-mib"]);
const steps = Number(values.steps);
const stepMs = Number(values["step-ms"]);
const slot = process.env.LIFELINE_RANK;
if (slot === values["late-slot"]) await new Promise((resolve) => setTimeout(resolve, Number(values["late-ms"])));

interface Local {
  step: number;
  data: Float64Array;
}

const world = await init();
let changed = false;
let joiner = true;
for (;;) {
  const saved = await world.restore<Local, Float64Array>();
  // A rank that joins gets its first state here; a member of the first world gets none.
  if (saved === undefined) joiner = false;
  const fresh = changed || (joiner && saved !== undefined);
  if (fresh) mark(`restored ${nowMs().toFixed(3)} slot ${slot} size ${world.size} step ${saved?.state.step ?? 0}`);
  const model = saved?.global ?? new Float64Array((globalMib * (1 << 20)) / 8).fill(1);
  const local: Local = saved?.state ?? { step: 0, data: new Float64Array(Math.max(1, (localMib * (1 << 20)) / 8)).fill(1) };
  const slice = Math.max(1, Math.floor(local.data.length / 16));
  let first = fresh;
  changed = false;
  joiner = false;
  try {
    while (local.step < steps) {
      const data = local.data;
      const until = performance.now() + stepMs;
      const from = (local.step * slice) % data.length;
      do {
        for (let i = from; i < Math.min(from + slice, data.length); i++) data[i] = data[i]! * 0.5 + 1;
      } while (performance.now() < until);
      const sum = await world.allreduce(data[from]!, "sum");
      model[local.step % model.length] = sum;
      local.step++;
      await world.checkpoint(local, model);
      if (first) {
        first = false;
        mark(`first ${nowMs().toFixed(3)} slot ${slot}`);
      }
    }
    let digest = 0;
    for (let i = 0; i < model.length; i += 4096) digest += model[i]!;
    await world.finalize(digest);
    break;
  } catch (err) {
    if (!isLifelineError(err, "MPI_WORLD_CHANGED")) throw err;
    changed = true;
    mark(`changed ${nowMs().toFixed(3)} slot ${slot}`);
  }
}
