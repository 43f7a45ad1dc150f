/**
 * taskfarm.ts — a master/worker task farm with dynamic load balancing.
 *
 * Demonstrates: wildcard receives (`recv(ANY_SOURCE, ANY_TAG)`) whose match order depends on
 * timing, and `nondet(Math.random)` values that decide how long a worker spins. Both are the
 * non-deterministic events that cpr logs while a checkpoint is being recorded and replays on
 * recovery. They change only the schedule (which worker gets which task, in which order), never
 * the answer: results are stored by task id, so the digest is the same on every run.
 *
 * Run (2..N ranks; rank 0 is the master, the others work):
 *   npx lifeline run -n 4 --mode none examples/taskfarm.ts
 *   npx lifeline run -n 3 --mode cpr --checkpoint-every 10steps examples/taskfarm.ts --tasks 200
 *
 * Args: --tasks T (default 48), --steps S (Simpson intervals per task, default 4000),
 *       --spin-ms M (a worker spins up to M ms before each task, default 4).
 *
 * Task k is the integral over [0, 1] of exp(-x) cos((k + 1) x) + x^(k mod 5), by Simpson's rule.
 * At the end the master broadcasts the result table, and every rank finalizes its SHA-256.
 */
import { createHash } from "node:crypto";
import { parseArgs } from "node:util";
import { init, ANY_SOURCE, ANY_TAG } from "lifeline";

const TAG_TASK = 1; // master -> worker: a task id
const TAG_STOP = 2; // master -> worker: no more tasks
const TAG_RESULT = 3; // worker -> master: { task, value }

interface TaskResult {
  task: number;
  value: number;
}

interface MasterState {
  kind: "master";
  /** True once every worker has been sent its first task (or a stop). */
  started: boolean;
  /** Next task id to hand out. */
  next: number;
  /** Results received so far. */
  received: number;
  /** results[k] is task k's value, whatever order the results came in. */
  results: Float64Array;
  /** Tasks done per rank: a picture of the schedule, printed but kept out of the digest. */
  perWorker: Int32Array;
}

interface WorkerState {
  kind: "worker";
  /** Tasks this worker has done (depends on the schedule). */
  done: number;
  stopped: boolean;
}

type State = MasterState | WorkerState;

const { values: args } = parseArgs({
  options: {
    tasks: { type: "string", default: "48" },
    steps: { type: "string", default: "4000" },
    "spin-ms": { type: "string", default: "4" },
  },
});
const nTasks = intArg("tasks", args.tasks, 1);
const steps = intArg("steps", args.steps, 2);
const spinMs = Number(args["spin-ms"]);
if (!(spinMs >= 0)) throw new RangeError(`--spin-ms must be a non-negative number, got ${args["spin-ms"]}`);

const world = await init();
const { rank, size } = world;
if (size < 2) throw new RangeError("taskfarm needs at least 2 ranks: one master and one worker");

const saved = await world.restore<State>();
const s: State =
  saved?.state ??
  (rank === 0
    ? { kind: "master", started: false, next: 0, received: 0, results: new Float64Array(nTasks), perWorker: new Int32Array(size) }
    : { kind: "worker", done: 0, stopped: false });

if (s.kind === "master") await master(s);
else await worker(s);

// Every rank ends with the master's table, so every rank's digest is the same.
const table = await world.bcast(s.kind === "master" ? s.results : null, 0);
if (!(table instanceof Float64Array) || table.length !== nTasks) throw new Error("bcast of the result table returned the wrong shape");
const counts = await world.gather(s.kind === "worker" ? s.done : 0, 0);
if (rank === 0) {
  let sum = 0;
  for (const v of table) sum += v;
  console.log(`taskfarm: ${nTasks} tasks on ${size - 1} workers, sum ${sum.toFixed(12)}, tasks per worker [${counts!.slice(1).join(", ")}]`);
}
await world.finalize(sha256Hex(table));

async function master(m: MasterState): Promise<void> {
  if (!m.started) {
    for (let w = 1; w < size; w++) {
      if (m.next < nTasks) await world.send(m.next++, w, TAG_TASK);
      else await world.send(null, w, TAG_STOP);
    }
    m.started = true;
    await world.checkpoint(m);
  }
  while (m.received < nTasks) {
    // Whichever worker finishes first is served first: this match is the non-deterministic event.
    const msg = await world.recv<TaskResult>(ANY_SOURCE, ANY_TAG);
    if (msg.tag !== TAG_RESULT) throw new Error(`master: unexpected tag ${msg.tag} from rank ${msg.source}`);
    const { task, value } = msg.data;
    if (!Number.isInteger(task) || task < 0 || task >= nTasks) throw new Error(`master: bad task id ${task} from rank ${msg.source}`);
    m.results[task] = value;
    m.received++;
    m.perWorker[msg.source]++;
    if (m.next < nTasks) await world.send(m.next++, msg.source, TAG_TASK);
    else await world.send(null, msg.source, TAG_STOP);
    await world.checkpoint(m);
  }
}

async function worker(w: WorkerState): Promise<void> {
  while (!w.stopped) {
    const msg = await world.recv<number | null>(0, ANY_TAG);
    if (msg.tag === TAG_STOP) {
      w.stopped = true;
    } else if (msg.tag === TAG_TASK && typeof msg.data === "number") {
      // The cost is logged by cpr while recording, so a replay spins the same way; it only
      // changes timing (and so which worker gets the next task), not the value computed.
      const cost = world.nondet(Math.random);
      spin(cost * spinMs);
      const result: TaskResult = { task: msg.data, value: integrate(msg.data) };
      await world.send(result, 0, TAG_RESULT);
      w.done++;
    } else {
      throw new Error(`worker ${rank}: unexpected message with tag ${msg.tag}`);
    }
    await world.checkpoint(w);
  }
}

/** Task k: Simpson's rule for the integral over [0, 1] of exp(-x) cos((k + 1) x) + x^(k mod 5). */
function integrate(k: number): number {
  const n = steps % 2 === 0 ? steps : steps + 1;
  const h = 1 / n;
  const f = (x: number) => Math.exp(-x) * Math.cos((k + 1) * x) + x ** (k % 5);
  let acc = f(0) + f(1);
  for (let i = 1; i < n; i++) acc += (i % 2 === 1 ? 4 : 2) * f(i * h);
  return (acc * h) / 3;
}

/** Busy-waits, as a real task of uneven cost would keep the CPU. */
function spin(ms: number): void {
  const until = performance.now() + ms;
  while (performance.now() < until) {
    // burn
  }
}

function sha256Hex(bytes: ArrayBufferView): string {
  return createHash("sha256")
    .update(new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength))
    .digest("hex");
}

function intArg(name: string, raw: string | undefined, min: number): number {
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min) throw new RangeError(`--${name} must be an integer >= ${min}, got ${raw}`);
  return n;
}
