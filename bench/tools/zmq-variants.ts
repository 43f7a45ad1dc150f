/**
 * Where does a small message's time go? Ping-pong between two processes over raw zeromq.js,
 * in variants that add Lifeline's message-path choices one at a time, timed in alternation:
 *
 *   pair-1f       Pair socket, 1 frame (the bench's raw baseline)
 *   pair-2f       Pair, 2 frames: a 40-byte header + the payload (Lifeline's framing)
 *   pushpull-1f   a Push/Pull pair per direction (Lifeline's sockets), 1 frame
 *   pushpull-2f   Push/Pull, 2 frames
 *   pushpull-2f-loop  Push/Pull, 2 frames, received by a `for await` reader loop that hands
 *                 each message to a waiting promise (Lifeline's reader pattern)
 *   pair-1f-curve Pair, 1 frame, with CURVE (tcp only; not in the default list)
 *
 * Reports one-way latency (round trip / 2) and CPU per one-way message (both processes, all
 * threads) as medians over alternating rounds. With pair-1f-curve and pair-1f both measured it
 * also reports what CURVE's cipher costs per byte (each one-way message is encrypted once and
 * decrypted once, by libzmq's I/O threads) and, from that, the least CPU CURVE adds to an
 * allreduce of that size on 4 ranks (each rank sends and receives 2(p-1)/p of the data).
 *
 *   node --import tsx bench/tools/zmq-variants.ts [--sizes 8,65536] [--rounds 15] [--transport ipc|tcp]
 *        [--variants pair-1f,pair-1f-curve]
 */
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { curveKeyPair, Pair, Pull, Push } from "zeromq";
import { programArgs } from "../lib/ctrl.ts";
import { median } from "../lib/stats.ts";

const ALL = ["pair-1f", "pair-2f", "pushpull-1f", "pushpull-2f", "pushpull-2f-loop", "pair-1f-curve"] as const;
type Variant = (typeof ALL)[number];

const args = programArgs(process.argv.slice(2));
const VARIANTS = (args.get("variants") ?? "pair-1f,pair-2f,pushpull-1f,pushpull-2f,pushpull-2f-loop").split(",") as Variant[];
for (const v of VARIANTS) if (!(ALL as readonly string[]).includes(v)) throw new RangeError(`unknown variant ${v}; one of ${ALL.join(", ")}`);
if (!VARIANTS.includes("pair-1f")) throw new RangeError("--variants must include pair-1f, the baseline of every ratio");
if (VARIANTS.includes("pair-1f-curve") && (args.get("transport") ?? "ipc") !== "tcp") throw new RangeError("pair-1f-curve needs --transport tcp");
const role = args.get("role") ?? "main";
const transport = args.get("transport") ?? "ipc";
const dir = args.get("dir") ?? mkdtempSync(path.join(os.tmpdir(), "zmqvar-"));
const side = role === "main" ? 0 : 1;

function addr(name: string): string {
  return transport === "ipc" ? `ipc://${dir}/${name}` : "tcp://127.0.0.1:0";
}

interface Link {
  send(frames: Uint8Array[]): Promise<void>;
  receive(): Promise<Buffer[]>;
}

/** One endpoint table exchange over the control Pair: main binds everything and tells the child. */
const ctrl = new Pair({ linger: 0 });
const pairs = new Map<Variant, Pair>();
const pulls = new Map<Variant, Pull>();
const pushes = new Map<Variant, Push>();

async function setup(): Promise<Map<Variant, Link>> {
  const links = new Map<Variant, Link>();
  if (side === 0) {
    await ctrl.bind(addr("ctrl"));
    const child = spawn(
      process.execPath,
      [
        "--import",
        "tsx",
        fileURLToPath(import.meta.url),
        "--role",
        "echo",
        "--transport",
        transport,
        "--dir",
        dir,
        "--ctrl",
        ctrl.lastEndpoint!,
        "--variants",
        VARIANTS.join(","),
      ],
      { stdio: ["pipe", "inherit", "inherit"] },
    );
    process.on("exit", () => child.kill("SIGKILL"));
  } else {
    ctrl.connect(args.get("ctrl")!);
  }
  // Each side binds its Pull (and side 0 its Pair); endpoints are swapped over ctrl.
  const mine: Record<string, string> = {};
  const server = side === 0 && VARIANTS.includes("pair-1f-curve") ? curveKeyPair() : undefined;
  if (server !== undefined) mine.curveServerKey = server.publicKey;
  for (const v of VARIANTS) {
    if (v === "pair-1f-curve") {
      // Side 0 is the CURVE server; side 1 connects with a key pair of its own (no ZAP: any key is let in).
      if (server !== undefined) {
        const s = new Pair({ linger: 0, curveServer: true, curveSecretKey: server.secretKey, curvePublicKey: server.publicKey });
        await s.bind(addr(`${v}-${side}`));
        mine[v] = s.lastEndpoint!;
        pairs.set(v, s);
      }
    } else if (v.startsWith("pair")) {
      const s = new Pair({ linger: 0 });
      if (side === 0) {
        await s.bind(addr(`${v}-${side}`));
        mine[v] = s.lastEndpoint!;
      }
      pairs.set(v, s);
    } else {
      const pull = new Pull({ linger: 0 });
      await pull.bind(addr(`${v}-${side}`));
      mine[v] = pull.lastEndpoint!;
      pulls.set(v, pull);
      pushes.set(v, new Push({ linger: 0 }));
    }
  }
  let theirs: Record<string, string>;
  if (side === 0) {
    await ctrl.send(JSON.stringify(mine));
    theirs = JSON.parse((await ctrl.receive())[0]!.toString());
  } else {
    theirs = JSON.parse((await ctrl.receive())[0]!.toString());
    await ctrl.send(JSON.stringify(mine));
  }
  for (const v of VARIANTS) {
    if (v === "pair-1f-curve" && side === 1) {
      const own = curveKeyPair();
      pairs.set(v, new Pair({ linger: 0, curveServerKey: theirs.curveServerKey!, curveSecretKey: own.secretKey, curvePublicKey: own.publicKey }));
    }
    if (v.startsWith("pair")) {
      const s = pairs.get(v)!;
      if (side === 1) s.connect(theirs[v]!);
      links.set(v, { send: (f) => s.send(f), receive: () => s.receive() });
    } else {
      const push = pushes.get(v)!;
      push.connect(theirs[v]!);
      const pull = pulls.get(v)!;
      if (v === "pushpull-2f-loop") {
        // Lifeline's pattern: one reader loop; receivers wait on promises it resolves.
        const waiting: ((m: Buffer[]) => void)[] = [];
        const queued: Buffer[][] = [];
        void (async () => {
          for await (const frames of pull) {
            const w = waiting.shift();
            if (w !== undefined) w(frames);
            else queued.push(frames);
          }
        })();
        links.set(v, {
          send: (f) => push.send(f),
          receive: () => {
            const q = queued.shift();
            return q !== undefined ? Promise.resolve(q) : new Promise((resolve) => waiting.push(resolve));
          },
        });
      } else {
        links.set(v, { send: (f) => push.send(f), receive: () => pull.receive() });
      }
    }
  }
  return links;
}

function framesFor(v: Variant, payload: Uint8Array): Uint8Array[] {
  return v.includes("2f") ? [Buffer.alloc(40, 1), payload] : [payload];
}

async function main(): Promise<void> {
  const links = await setup();
  if (side === 1) {
    for (;;) {
      const [cmd] = await ctrl.receive();
      const { v, n } = JSON.parse(cmd!.toString()) as { v: Variant | "quit"; n: number };
      if (v === "quit") process.exit(0);
      const link = links.get(v)!;
      const c0 = process.cpuUsage();
      for (let i = 0; i < n; i++) await link.send(await link.receive());
      const c = process.cpuUsage(c0);
      await ctrl.send(JSON.stringify({ cpuUs: c.user + c.system }));
    }
  }
  const sizes = (args.get("sizes") ?? "8,65536").split(",").map(Number);
  const rounds = Number(args.get("rounds") ?? 15);
  const targetS = 0.05;
  const results: string[] = [];
  for (const bytes of sizes) {
    const payload = new Float64Array(Math.max(1, bytes / 8));
    const run = async (v: Variant, n: number): Promise<{ oneWayUs: number; cpuUs: number }> => {
      const link = links.get(v)!;
      await ctrl.send(JSON.stringify({ v, n }));
      const frames = framesFor(v, new Uint8Array(payload.buffer));
      const c0 = process.cpuUsage();
      const t0 = process.hrtime.bigint();
      for (let i = 0; i < n; i++) {
        await link.send(frames);
        await link.receive();
      }
      const wallUs = Number(process.hrtime.bigint() - t0) / 1e3;
      const c = process.cpuUsage(c0);
      const peer = JSON.parse((await ctrl.receive())[0]!.toString()) as { cpuUs: number };
      return { oneWayUs: wallUs / (2 * n), cpuUs: (c.user + c.system + peer.cpuUs) / (2 * n) };
    };
    const iters = new Map<Variant, number>();
    for (const v of VARIANTS) {
      await run(v, 20); // warm-up
      const probe = await run(v, 200);
      iters.set(v, Math.max(5, Math.round((targetS * 1e6) / (2 * probe.oneWayUs))));
    }
    const lat = new Map<Variant, number[]>(VARIANTS.map((v) => [v, []]));
    const cpu = new Map<Variant, number[]>(VARIANTS.map((v) => [v, []]));
    for (let r = 0; r < rounds; r++) {
      const order = r % 2 === 0 ? [...VARIANTS] : [...VARIANTS].reverse();
      for (const v of order) {
        const m = await run(v, iters.get(v)!);
        lat.get(v)!.push(m.oneWayUs);
        cpu.get(v)!.push(m.cpuUs);
      }
    }
    const base = median(lat.get("pair-1f")!);
    const baseCpu = median(cpu.get("pair-1f")!);
    results.push(`\n${bytes} B, ${transport}, ${rounds} alternating rounds of ~50 ms per variant:`);
    results.push(`| variant | one-way us | vs pair-1f | CPU us/msg (both processes) | vs pair-1f |`);
    results.push(`| --- | ---: | ---: | ---: | ---: |`);
    for (const v of VARIANTS) {
      const l = median(lat.get(v)!);
      const c = median(cpu.get(v)!);
      results.push(`| ${v} | ${l.toFixed(1)} | ${(l / base).toFixed(2)}x | ${c.toFixed(1)} | ${(c / baseCpu).toFixed(2)}x |`);
    }
    if (VARIANTS.includes("pair-1f-curve")) {
      // Per one-way message its bytes are encrypted (sender's I/O thread) and decrypted (receiver's).
      const nsPerByte = ((median(cpu.get("pair-1f-curve")!) - baseCpu) * 1000) / bytes;
      const p = 4;
      const carried = 2 * (p - 1) * bytes;
      results.push(
        `CURVE costs ${nsPerByte.toFixed(2)} ns of CPU per byte carried, encrypted and decrypted (${(1000 / nsPerByte).toFixed(0)} MB/s); ` +
          `an allreduce of ${bytes} B on ${p} ranks carries ${(carried / 1048576).toFixed(2)} MiB over its links, so CURVE adds at least ${((nsPerByte * carried) / 1e6).toFixed(1)} ms of CPU to it`,
      );
    }
  }
  await ctrl.send(JSON.stringify({ v: "quit", n: 0 }));
  process.stdout.write(`${results.join("\n")}\n`);
  if (!args.has("dir")) rmSync(dir, { recursive: true, force: true });
  process.exit(0);
}

await main();
