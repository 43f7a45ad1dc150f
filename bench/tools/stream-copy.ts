/**
 * How much of Lifeline's streaming gap is the send-side copy? One-direction streaming between
 * two processes through Lifeline's own ZmqTransport and wire code (imported from src/,
 * unchanged), with and without the copy that `encodeBody(data, { copy: true })` makes so
 * that the program may reuse its array as soon as `send` resolves; raw Push/Pull alongside.
 * Variants alternate; medians over rounds.
 *
 *   node --import tsx bench/tools/stream-copy.ts [--sizes 1048576,16777216] [--rounds 11]
 */
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Pair, Pull, Push } from "zeromq";
import { decodeBody, encodeBody } from "../../src/mpi/codec.ts";
import { decodeHeader, encodeHeader, Kind } from "../../src/mpi/wire.ts";
import { ZmqTransport } from "../../src/mpi/zmq/zmq-transport.ts";
import { programArgs } from "../lib/ctrl.ts";
import { median } from "../lib/stats.ts";

const VARIANTS = ["raw-pushpull", "lifeline-wire-copy", "lifeline-wire-nocopy"] as const;
type Variant = (typeof VARIANTS)[number];
const JOB_KEY = 7;

const args = programArgs(process.argv.slice(2));
const side = args.get("role") === "recv" ? 1 : 0;
const dir = args.get("dir") ?? mkdtempSync(path.join(os.tmpdir(), "streamcopy-"));
const ctrl = new Pair({ linger: 0 });

async function main(): Promise<void> {
  if (side === 0) {
    await ctrl.bind(`ipc://${dir}/ctrl`);
    const child = spawn(process.execPath, ["--import", "tsx", fileURLToPath(import.meta.url), "--role", "recv", "--dir", dir], {
      stdio: ["pipe", "inherit", "inherit"],
    });
    process.on("exit", () => child.kill("SIGKILL"));
  } else {
    ctrl.connect(`ipc://${dir}/ctrl`);
  }
  // raw: rank 0 pushes to rank 1's pull, acks come back on rank 0's pull.
  const pull = new Pull({ linger: 0 });
  await pull.bind(`ipc://${dir}/raw-${side}`);
  const push = new Push({ linger: 0 });
  push.connect(`ipc://${dir}/raw-${1 - side}`);
  const t = await ZmqTransport.bind({ transport: "ipc", runDir: dir, name: `lf-${side}` });
  t.connect(1 - side, `ipc://${dir}/lf-${1 - side}.sock`);
  let waiter: (() => void) | undefined;
  let count = 0;
  let want = 0;
  t.start(
    (frames) => {
      const h = decodeHeader(frames[0], { keysIn: [JOB_KEY, JOB_KEY], size: 2 });
      decodeBody(h.encoding, h.arrayType, frames.slice(1));
      if (++count === want) waiter?.();
    },
    (err) => {
      throw err;
    },
  );
  const lfSend = (data: Float64Array | number, copy: boolean): Promise<void> => {
    const body = encodeBody(data, { copy });
    const header = encodeHeader({
      kind: Kind.app,
      flags: 0,
      encoding: body.encoding,
      key: JOB_KEY,
      source: side,
      tag: 1,
      channelSeq: 0,
      epoch: 0,
      collSeq: 0,
      signature: 0,
      arrayType: body.arrayType,
      attempt: 0,
    });
    return t.send(1 - side, [header, ...body.frames]);
  };
  const lfExpect = (n: number): Promise<void> => {
    count = 0;
    want = n;
    return new Promise((resolve) => (waiter = resolve));
  };

  if (side === 1) {
    for (;;) {
      const [cmd] = await ctrl.receive();
      const { v, n } = JSON.parse(cmd!.toString()) as { v: Variant | "quit"; n: number };
      if (v === "quit") process.exit(0);
      if (v === "raw-pushpull") {
        await ctrl.send("ready");
        for (let i = 0; i < n; i++) await pull.receive();
        await push.send(new Uint8Array([1]));
      } else {
        const got = lfExpect(n);
        await ctrl.send("ready");
        await got;
        await lfSend(1, true);
      }
    }
  }

  const sizes = (args.get("sizes") ?? "1048576,16777216").split(",").map(Number);
  const rounds = Number(args.get("rounds") ?? 11);
  const out: string[] = [];
  for (const bytes of sizes) {
    const data = new Float64Array(bytes / 8).fill(1);
    const run = async (v: Variant, n: number): Promise<number> => {
      await ctrl.send(JSON.stringify({ v, n }));
      await ctrl.receive(); // receiver ready
      const ack = v === "raw-pushpull" ? pull.receive() : lfExpect(1);
      const t0 = process.hrtime.bigint();
      for (let i = 0; i < n; i++) {
        if (v === "raw-pushpull") await push.send(data);
        else await lfSend(data, v === "lifeline-wire-copy");
      }
      await ack;
      return (n * bytes) / (Number(process.hrtime.bigint() - t0) / 1e9) / 1e6;
    };
    const n = Math.max(2, Math.round((0.05 * 2e9) / bytes)); // ~50 ms at 2 GB/s
    for (const v of VARIANTS) await run(v, n); // warm-up
    const mbs = new Map<Variant, number[]>(VARIANTS.map((v) => [v, []]));
    for (let r = 0; r < rounds; r++) {
      for (const v of r % 2 === 0 ? [...VARIANTS] : [...VARIANTS].reverse()) mbs.get(v)!.push(await run(v, n));
    }
    const base = median(mbs.get("raw-pushpull")!);
    out.push(`\n${bytes} B x ${n} messages per timing, ipc, medians of ${rounds} alternating rounds:`);
    out.push("| variant | MB/s | vs raw |", "| --- | ---: | ---: |");
    for (const v of VARIANTS) out.push(`| ${v} | ${median(mbs.get(v)!).toFixed(0)} | ${(median(mbs.get(v)!) / base).toFixed(2)}x |`);
  }
  await ctrl.send(JSON.stringify({ v: "quit", n: 0 }));
  process.stdout.write(`${out.join("\n")}\n`);
  rmSync(dir, { recursive: true, force: true });
  process.exit(0);
}

await main();
