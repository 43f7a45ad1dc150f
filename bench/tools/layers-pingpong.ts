/**
 * Where does Lifeline's small-message latency go? Ping-pong between two processes through
 * successively more of Lifeline's own message path (imported from src/, unchanged), timed in
 * alternation with the raw baseline:
 *
 *   raw-pair        zeromq.js Pair, 1 frame (the bench's raw baseline)
 *   transport       Lifeline's ZmqTransport (Push/Pull per direction, SerialSender, one
 *                   `for await` reader loop), a constant 40-byte header + payload
 *   + wire          + encodeHeader/decodeHeader and encodeBody(copy)/decodeBody per message
 *   + match         + Matcher and RequestImpl, as World.recv/irecv use them
 *   (the full World is the bench's own `lifeline` column)
 *
 * Reports, per variant: one-way latency, CPU per one-way message (both processes, all
 * threads), and main-thread event-loop-active time per message, as medians over rounds.
 *
 *   node --import tsx bench/tools/layers-pingpong.ts [--sizes 8,65536] [--rounds 15] [--transport ipc|tcp]
 */
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { Pair } from "zeromq";
import { decodeBody, encodeBody } from "../../src/mpi/codec.ts";
import { Matcher } from "../../src/mpi/matching.ts";
import { RequestImpl } from "../../src/mpi/request.ts";
import { decodeHeader, encodeHeader, Kind } from "../../src/mpi/wire.ts";
import { ZmqTransport } from "../../src/mpi/zmq/zmq-transport.ts";
import { programArgs } from "../lib/ctrl.ts";
import { median } from "../lib/stats.ts";

const VARIANTS = ["raw-pair", "transport", "+wire", "+match"] as const;
type Variant = (typeof VARIANTS)[number];

const args = programArgs(process.argv.slice(2));
const side = args.get("role") === "echo" ? 1 : 0;
const transport = (args.get("transport") ?? "ipc") as "ipc" | "tcp";
const dir = args.get("dir") ?? mkdtempSync(path.join(os.tmpdir(), "layers-"));
const JOB_KEY = 0x1234;

interface Link {
  send(data: Float64Array): Promise<void>;
  recv(): Promise<unknown>;
}

const ctrl = new Pair({ linger: 0 });

async function exchange(mine: Record<string, string>): Promise<Record<string, string>> {
  if (side === 0) {
    await ctrl.send(JSON.stringify(mine));
    return JSON.parse((await ctrl.receive())[0]!.toString()) as Record<string, string>;
  }
  const theirs = JSON.parse((await ctrl.receive())[0]!.toString()) as Record<string, string>;
  await ctrl.send(JSON.stringify(mine));
  return theirs;
}

async function setup(): Promise<Map<Variant, Link>> {
  if (side === 0) {
    await ctrl.bind(transport === "ipc" ? `ipc://${dir}/ctrl` : "tcp://127.0.0.1:0");
    const child = spawn(
      process.execPath,
      ["--import", "tsx", fileURLToPath(import.meta.url), "--role", "echo", "--transport", transport, "--dir", dir, "--ctrl", ctrl.lastEndpoint!],
      { stdio: ["pipe", "inherit", "inherit"] },
    );
    process.on("exit", () => child.kill("SIGKILL"));
  } else {
    ctrl.connect(args.get("ctrl")!);
  }
  const pair = new Pair({ linger: 0 });
  const transports = new Map<Variant, ZmqTransport>();
  const mine: Record<string, string> = {};
  if (side === 0) {
    await pair.bind(transport === "ipc" ? `ipc://${dir}/pair` : "tcp://127.0.0.1:0");
    mine["raw-pair"] = pair.lastEndpoint!;
  }
  for (const v of VARIANTS.slice(1)) {
    const t = await ZmqTransport.bind({ transport, runDir: dir, name: `${v.replace("+", "")}-${side}` });
    transports.set(v, t);
    mine[v] = t.endpoint;
  }
  const theirs = await exchange(mine);
  const peer = 1 - side;
  const links = new Map<Variant, Link>();
  if (side === 1) pair.connect(theirs["raw-pair"]!);
  links.set("raw-pair", { send: (d) => pair.send(d), recv: async () => (await pair.receive())[0] });

  for (const v of VARIANTS.slice(1)) {
    const t = transports.get(v)!;
    t.connect(peer, theirs[v]!);
    let seq = 0;
    const constHeader = encodeHeader({
      kind: Kind.app,
      flags: 0,
      encoding: 2,
      key: JOB_KEY,
      source: side,
      tag: 7,
      channelSeq: 0,
      epoch: 0,
      collSeq: 0,
      signature: 0,
      arrayType: 9,
      attempt: 0,
    });
    const waiting: ((x: unknown) => void)[] = [];
    const queued: unknown[] = [];
    const matcher = new Matcher<{ source: number; tag: number; data: unknown }>(2);
    const deliver = (x: unknown): void => {
      const w = waiting.shift();
      if (w !== undefined) w(x);
      else queued.push(x);
    };
    t.start(
      (frames) => {
        if (v === "transport") return deliver(frames[1]);
        const h = decodeHeader(frames[0], { keysIn: [JOB_KEY, JOB_KEY], size: 2 });
        const data = decodeBody(h.encoding, h.arrayType, frames.slice(1));
        if (v === "+wire") return deliver(data);
        matcher.arrive({ source: h.source, tag: h.tag, data });
      },
      (err) => {
        throw err;
      },
    );
    const send = (d: Float64Array): Promise<void> => {
      if (v === "transport") return t.send(peer, [constHeader, new Uint8Array(d.buffer, d.byteOffset, d.byteLength)]);
      const body = encodeBody(d, { copy: true });
      const header = encodeHeader({
        kind: Kind.app,
        flags: 0,
        encoding: body.encoding,
        key: JOB_KEY,
        source: side,
        tag: 7,
        channelSeq: seq++,
        epoch: 0,
        collSeq: 0,
        signature: 0,
        arrayType: body.arrayType,
        attempt: 0,
      });
      return t.send(peer, [header, ...body.frames]);
    };
    const recv = (): Promise<unknown> => {
      if (v !== "+match") {
        const q = queued.shift();
        return q !== undefined ? Promise.resolve(q) : new Promise((resolve) => waiting.push(resolve));
      }
      // As World.irecv + wait: take from the unexpected queue, else post a receive.
      const req = new RequestImpl<{ data: unknown }>();
      const now = matcher.take(peer, 7);
      if (now !== undefined) req.complete(now);
      else matcher.post({ source: peer, tag: 7, consume: true, onMatch: (env) => req.complete(env) });
      return req.wait().then((m) => m.data);
    };
    links.set(v, { send, recv });
  }
  return links;
}

interface Sample {
  oneWayUs: number;
  cpuUs: number;
  loopUs: number;
}

async function main(): Promise<void> {
  const links = await setup();
  if (side === 1) {
    for (;;) {
      const [cmd] = await ctrl.receive();
      const { v, n } = JSON.parse(cmd!.toString()) as { v: Variant | "quit"; n: number };
      if (v === "quit") process.exit(0);
      const link = links.get(v)!;
      const elu0 = performance.eventLoopUtilization();
      const c0 = process.cpuUsage();
      for (let i = 0; i < n; i++) await link.send((await link.recv()) as Float64Array);
      const c = process.cpuUsage(c0);
      const elu = performance.eventLoopUtilization(elu0);
      await ctrl.send(JSON.stringify({ cpuUs: c.user + c.system, loopUs: elu.active * 1000 }));
    }
  }
  const sizes = (args.get("sizes") ?? "8,65536").split(",").map(Number);
  const rounds = Number(args.get("rounds") ?? 15);
  const out: string[] = [];
  for (const bytes of sizes) {
    const payload = new Float64Array(Math.max(1, bytes / 8));
    const run = async (v: Variant, n: number): Promise<Sample> => {
      const link = links.get(v)!;
      await ctrl.send(JSON.stringify({ v, n }));
      const elu0 = performance.eventLoopUtilization();
      const c0 = process.cpuUsage();
      const t0 = process.hrtime.bigint();
      for (let i = 0; i < n; i++) {
        await link.send(payload);
        await link.recv();
      }
      const wallUs = Number(process.hrtime.bigint() - t0) / 1e3;
      const c = process.cpuUsage(c0);
      const elu = performance.eventLoopUtilization(elu0);
      const peer = JSON.parse((await ctrl.receive())[0]!.toString()) as { cpuUs: number; loopUs: number };
      return { oneWayUs: wallUs / (2 * n), cpuUs: (c.user + c.system + peer.cpuUs) / (2 * n), loopUs: (elu.active * 1000 + peer.loopUs) / (2 * n) };
    };
    const iters = new Map<Variant, number>();
    for (const v of VARIANTS) {
      await run(v, 50); // warm-up
      const probe = await run(v, 200);
      iters.set(v, Math.max(5, Math.round(50_000 / (2 * probe.oneWayUs))));
    }
    const samples = new Map<Variant, Sample[]>(VARIANTS.map((v) => [v, []]));
    for (let r = 0; r < rounds; r++) {
      const order = r % 2 === 0 ? [...VARIANTS] : [...VARIANTS].reverse();
      for (const v of order) samples.get(v)!.push(await run(v, iters.get(v)!));
    }
    const med = (v: Variant, k: keyof Sample): number => median(samples.get(v)!.map((s) => s[k]));
    out.push(`\n${bytes} B over ${transport}, medians of ${rounds} alternating rounds of ~50 ms:`);
    out.push("| variant | one-way us | vs raw | CPU us/msg (2 procs) | main-loop active us/msg (2 procs) |");
    out.push("| --- | ---: | ---: | ---: | ---: |");
    for (const v of VARIANTS) {
      out.push(
        `| ${v} | ${med(v, "oneWayUs").toFixed(1)} | ${(med(v, "oneWayUs") / med("raw-pair", "oneWayUs")).toFixed(2)}x | ${med(v, "cpuUs").toFixed(1)} | ${med(v, "loopUs").toFixed(1)} |`,
      );
    }
  }
  await ctrl.send(JSON.stringify({ v: "quit", n: 0 }));
  process.stdout.write(`${out.join("\n")}\n`);
  if (!args.has("dir")) rmSync(dir, { recursive: true, force: true });
  process.exit(0);
}

await main();
