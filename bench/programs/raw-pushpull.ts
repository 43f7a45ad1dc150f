/**
 * Raw zeromq.js baselines over `Push`/`Pull` in a ring: each process binds one `Pull` and
 * connects one `Push` to its successor's `Pull` (with 2 processes the successor is the peer).
 *
 * - stream (2 processes): rank 0 pushes `iters` messages as fast as the socket takes them,
 *   rank 1 pulls them all and pushes a 1-byte ack; rank 0's time includes the ack.
 * - allreduce: a hand-written ring allreduce of a Float64Array (sum): reduce-scatter, then
 *   allgather, p - 1 steps each, every step one chunk to the successor and one from the
 *   predecessor. Chunks are sent as views of the result array (zeromq.js sends them
 *   zero-copy); a chunk is overwritten only after a message that causally depends on its
 *   delivery has arrived, so no copy is needed. The result is a new array, as the
 *   communicator's allreduce returns one.
 *
 * - barrier: the same ring allreduce of one Float64 (8 B), the baseline of Lifeline's barrier.
 *
 * Started by bench/run.ts:
 *   node --import tsx bench/programs/raw-pushpull.ts --ctrl <ep> --id raw4 --rank 0 --size 4 \
 *        --transport ipc --dir <tmp>
 */
import { Pull, Push } from "zeromq";
import type { BenchName } from "../lib/plan.ts";
import { bindAddress, type BlockTime, startClock, makePayload, receivePeers, serveCommands, startRaw } from "../lib/raw-proc.ts";

const { a, ctrl } = await startRaw(process.argv.slice(2));
const p = a.size;
const r = a.rank;

const mod = (x: number): number => ((x % p) + p) % p;
const payloads = new Map<string, Float64Array | Uint8Array>();
const ack = new Uint8Array([1]);
const syncBuf = new Float64Array(1);

const pull = new Pull({ linger: 0 });
const push = new Push({ linger: 0 });
await pull.bind(bindAddress(a, "ring"));
await ctrl.send({ t: "hello", rank: r, size: p, pid: process.pid, endpoint: pull.lastEndpoint ?? undefined, transport: a.transport });
const endpoints = await receivePeers(ctrl, a);
push.connect(endpoints[(r + 1) % p]!);
await sync();
await ctrl.send({ t: "ready", rank: r });

/** A Float64Array over a received frame: a view when aligned (large frames are), else a copy. */
function f64(msg: Buffer): Float64Array {
  if (msg.byteOffset % 8 === 0) return new Float64Array(msg.buffer, msg.byteOffset, msg.byteLength / 8);
  return new Float64Array(new Uint8Array(msg).buffer);
}

type Combine = "sum" | "max";

/** Ring allreduce: reduce-scatter then allgather, 2(p - 1) steps. */
async function ringAllreduce(input: Float64Array, combine: Combine): Promise<Float64Array> {
  const out = input.slice();
  if (p === 1) return out;
  const n = out.length;
  const lo = (c: number): number => Math.floor((c * n) / p);
  const chunk = (c: number): Uint8Array => new Uint8Array(out.buffer, out.byteOffset + lo(c) * 8, (lo(c + 1) - lo(c)) * 8);
  for (let s = 0; s < p - 1; s++) {
    await push.send(chunk(mod(r - s)));
    const [msg] = await pull.receive();
    const src = f64(msg!);
    const base = lo(mod(r - s - 1));
    if (combine === "sum") for (let i = 0; i < src.length; i++) out[base + i]! += src[i]!;
    else for (let i = 0; i < src.length; i++) out[base + i] = Math.max(out[base + i]!, src[i]!);
  }
  for (let s = 0; s < p - 1; s++) {
    await push.send(chunk(mod(r + 1 - s)));
    const [msg] = await pull.receive();
    out.set(f64(msg!), lo(mod(r - s)));
  }
  return out;
}

/** A barrier: a 1-element ring allreduce cannot finish on any rank before all ranks entered it. */
async function sync(): Promise<void> {
  await ringAllreduce(syncBuf, "max");
}

async function runBlock(bench: BenchName, bytes: number, iters: number): Promise<BlockTime> {
  const key = `${bench}:${bytes}`;
  let buf = payloads.get(key);
  if (buf === undefined) {
    // allreduce sums Float64Arrays filled with rank + 1; stream honours --payload
    buf = bench === "allreduce" ? makePayload(bytes, "f64", r + 1) : makePayload(bytes, a.payload, 1);
    payloads.set(key, buf);
  }
  await sync();
  const stop = startClock();
  switch (bench) {
    case "stream":
    case "stream-isend": {
      // The raw side of both: a zeromq.js send hands the buffer to the socket as it is.
      if (p !== 2) throw new Error("stream runs with exactly 2 ranks");
      if (r === 0) {
        for (let i = 0; i < iters; i++) await push.send(buf);
        await pull.receive();
      } else {
        let received = 0;
        for (let i = 0; i < iters; i++) {
          const [msg] = await pull.receive();
          received += msg!.length;
        }
        await push.send(ack);
        if (received !== iters * bytes) throw new Error(`received ${received} bytes, expected ${iters * bytes}`);
      }
      break;
    }
    case "allreduce": {
      if (!(buf instanceof Float64Array)) throw new Error(`allreduce of ${bytes} bytes is not a whole Float64Array`);
      let out = buf;
      for (let i = 0; i < iters; i++) out = await ringAllreduce(buf, "sum");
      const expect = (p * (p + 1)) / 2;
      if (out[0] !== expect || out[out.length - 1] !== expect) throw new Error(`ring allreduce gave ${out[0]}, expected ${expect}`);
      break;
    }
    case "barrier":
      // The baseline of Lifeline's barrier: the ring's allreduce of one Float64 (8 B).
      for (let i = 0; i < iters; i++) await sync();
      break;
    default:
      throw new Error(`raw-pushpull cannot run ${bench}`);
  }
  return stop();
}

await serveCommands(ctrl, a, runBlock);
push.close();
pull.close();
ctrl.close();
process.exit(0);
