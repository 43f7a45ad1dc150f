/**
 * Raw zeromq.js ping-pong baseline: two processes joined by one `Pair` socket (rank 0 binds,
 * rank 1 connects), no framing of our own, payload sent as the typed array itself (zeromq.js
 * sends views zero-copy above 128 B), echoed back as the Buffer that arrived.
 *
 * Started by bench/run.ts (it spawns ranks 0 and 1 and drives them over the control channel):
 *   node --import tsx bench/programs/raw-pingpong.ts --ctrl <ep> --id rawpp --rank 0 --size 2 \
 *        --transport ipc --dir <tmp>
 */
import { Pair } from "zeromq";
import type { BenchName } from "../lib/plan.ts";
import { bindAddress, type BlockTime, startClock, makePayload, receivePeers, serveCommands, startRaw } from "../lib/raw-proc.ts";

const { a, ctrl } = await startRaw(process.argv.slice(2));
if (a.size !== 2) throw new Error("raw-pingpong runs with exactly 2 ranks");

const payloads = new Map<number, Float64Array | Uint8Array>();
const one = new Uint8Array([1]);

const pair = new Pair({ linger: 0 });
let endpoint: string | undefined;
if (a.rank === 0) {
  await pair.bind(bindAddress(a, "pingpong"));
  endpoint = pair.lastEndpoint ?? undefined;
}
await ctrl.send({ t: "hello", rank: a.rank, size: a.size, pid: process.pid, endpoint, transport: a.transport });
const endpoints = await receivePeers(ctrl, a);
if (a.rank === 1) pair.connect(endpoints[0]!);
await sync(); // the connection is up before the first timed message
await ctrl.send({ t: "ready", rank: a.rank });

/** One round trip of a 1-byte message: both processes leave it together (to within one hop). */
async function sync(): Promise<void> {
  if (a.rank === 0) {
    await pair.send(one);
    await pair.receive();
  } else {
    await pair.receive();
    await pair.send(one);
  }
}

async function runBlock(bench: BenchName, bytes: number, iters: number): Promise<BlockTime> {
  if (bench !== "pingpong") throw new Error(`raw-pingpong cannot run ${bench}`);
  let buf = payloads.get(bytes);
  if (buf === undefined) payloads.set(bytes, (buf = makePayload(bytes, a.payload, 1)));
  await sync();
  const stop = startClock();
  if (a.rank === 0) {
    for (let i = 0; i < iters; i++) {
      await pair.send(buf);
      const [back] = await pair.receive();
      if (back!.length !== bytes) throw new Error(`echo of ${back!.length} bytes, sent ${bytes}`);
    }
  } else {
    for (let i = 0; i < iters; i++) {
      const [msg] = await pair.receive();
      await pair.send(msg!);
    }
  }
  return stop();
}

await serveCommands(ctrl, a, runBlock);
pair.close();
ctrl.close();
process.exit(0);
