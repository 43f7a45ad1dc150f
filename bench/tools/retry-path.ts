/**
 * What retry-one's protocol costs per collective, alone: the driver and the protocol machine
 * of src/cpr/retry-one (imported unchanged) decide a collective, and keep its result encoded
 * as a rank does after a run on the wire, in a loop in one process with nothing sent. With
 * `--touch-mib N` the loop reads N MiB of other memory between calls, as the other ranks and
 * ZeroMQ do to a rank's caches when 4 ranks share 2 cores; the timer covers only the
 * protocol's part. Per variant: the median over rounds of µs per collective.
 *
 *   node --import tsx bench/tools/retry-path.ts [--calls 20000] [--rounds 5] [--touch-mib 0,1,8]
 */
import { RetryOneDriver } from "../../src/cpr/retry-one/driver.ts";
import { encodeValue } from "../../src/mpi/codec.ts";
import type { Host, Timer } from "../../src/mpi/host.ts";
import type { RetryWorldAccess } from "../../src/mpi/retry-hook.ts";
import { programArgs } from "../lib/ctrl.ts";
import { median } from "../lib/stats.ts";

const args = programArgs(process.argv.slice(2));
const calls = Number(args.get("calls") ?? 20_000);
const rounds = Number(args.get("rounds") ?? 5);
const touches = (args.get("touch-mib") ?? "0,1,8").split(",").map(Number);
// A fresh driver per round: a round's results stay below the buffer's bound without checkpoints.
if (!(Number.isInteger(calls) && calls > 0 && calls <= 60_000) || !(rounds > 0) || touches.some((t) => !(t >= 0))) {
  console.error("usage: retry-path.ts [--calls 1..60000] [--rounds N] [--touch-mib 0,1,8]");
  process.exit(2);
}

const SIZE = 4;
const none = (): undefined => undefined;
const timer = (): Timer => ({ stop: none });
const host = {
  now: () => 0,
  defer: (fn: () => void) => queueMicrotask(fn),
  every: timer,
  after: timer,
  exit: none,
  warn: none,
  pid: process.pid,
} as unknown as Host;
const access = {
  rank: 0,
  size: SIZE,
  attempt: 0,
  sendProtocol: none,
  caughtUp: none,
  recycle: none,
  ownReleased: none,
  abandonCollective: none,
  inject: none,
  fatal: (code: string, message: string) => {
    throw new Error(`${code}: ${message}`);
  },
  afterAbort: (fn: () => void) => fn(),
  setGate: none,
  peerSafe: none,
  sendControl: none,
} as unknown as RetryWorldAccess;

async function round(touchMib: number): Promise<number> {
  const driver = new RetryOneDriver(access, host, { replicas: 1 });
  const zeros = Array.from({ length: SIZE }, () => 0);
  await driver.beforeStart({ t: "table", keysIn: zeros, keysOut: zeros, endpoints: [], attempts: zeros } as never);
  const other = new Float64Array((touchMib * 1024 * 1024) / 8);
  const result = new Float64Array(1);
  let sum = 0;
  let ns = 0n;
  for (let i = 0; i < calls; i++) {
    for (let j = 0; j < other.length; j += 8) sum += other[j]!; // one read per cache line
    const t0 = process.hrtime.bigint();
    // As a barrier and an allreduce alternate in bench/programs/allreduce-loop.ts.
    const data = i % 2 === 0 ? undefined : result;
    const ident = {
      op: data === undefined ? "barrier" : "allreduce:sum",
      root: -1,
      type: data === undefined ? "none" : "Float64Array",
      length: data === undefined ? 0 : 1,
    };
    const d = driver.beforeCollective({ ident });
    if (!("run" in (d instanceof Promise ? await d : d))) throw new Error("the protocol did not run the collective");
    driver.afterCollective(encodeValue(data));
    ns += process.hrtime.bigint() - t0;
  }
  await driver.close();
  if (sum !== 0) throw new Error("unreachable");
  return Number(ns) / calls / 1000;
}

console.log(`retry-one's protocol per collective, one process, ${calls} calls per round, median of ${rounds} rounds`);
for (let w = 0; w < 3; w++) await round(1); // warm-up: compiled code
for (const t of touches) {
  const us: number[] = [];
  for (let r = 0; r < rounds; r++) us.push(await round(t));
  console.log(`  ${t} MiB read between calls: ${median(us).toFixed(2)} µs per collective (rounds ${us.map((u) => u.toFixed(2)).join(", ")})`);
}
