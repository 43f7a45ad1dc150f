/**
 * Streaming bandwidth, one job at a time: a Lifeline job (the real launcher and World,
 * bench/programs/stream-loop.ts, mode none) and raw zeromq.js Push/Pull between two plain
 * processes (the same loop: each `send` awaited, a 1-byte ack at the end), alternating
 * between rounds, so that neither shares the machine with the other (the harness of `npm run
 * bench` keeps both alive and alternates short blocks). Per size: the median bandwidth of
 * each and their ratio, and each side's CPU per message (sender / receiver, every thread).
 * Each side warms up for 1.5 s before it is timed (V8 compiles the message path meanwhile).
 *
 * `--window <n>`: the Lifeline sender isends in windows of n, each waited for (stream-loop.ts).
 *
 *   npm run build && node --import tsx bench/tools/stream-ab.ts [--sizes 65536,1048576] [--iters 400] [--rounds 3] [--window 64]
 */
import { execFileSync, fork } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { Pull, Push } from "zeromq";
import { sizeLabel } from "../lib/plan.ts";
import { median } from "../lib/stats.ts";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const { values } = parseArgs({
  options: {
    sizes: { type: "string", default: "65536,1048576" },
    iters: { type: "string", default: "400" },
    rounds: { type: "string", default: "3" },
    role: { type: "string" },
    dir: { type: "string" },
    bytes: { type: "string" },
    window: { type: "string", default: "0" },
  },
});
const iters = Number(values.iters);
/** Warm-up of each side before its timed blocks (stream-loop.ts's `--warmup-ms` default). */
const WARMUP_MS = 1500;

interface Side {
  mbps: number[];
  cpuUs: number[];
}

/** One side of the raw pair (a child process of this tool): the same loop as stream-loop.ts. */
async function rawSide(rank: number, dir: string, bytes: number): Promise<void> {
  const pull = new Pull({ linger: 0 });
  await pull.bind(`ipc://${dir}/r${rank}`);
  const push = new Push({ linger: 0 });
  push.connect(`ipc://${dir}/r${1 - rank}`);
  const buf = Buffer.alloc(bytes, 1);
  const ack = Buffer.alloc(1);
  const block = async (n: number): Promise<void> => {
    if (rank === 0) {
      for (let i = 0; i < n; i++) await push.send(buf);
      await pull.receive();
    } else {
      for (let i = 0; i < n; i++) await pull.receive();
      await push.send(ack);
    }
  };
  // Both ends up before the first block: an exchange of acks.
  if (rank === 0) {
    await push.send(ack);
    await pull.receive();
  } else {
    await pull.receive();
    await push.send(ack);
  }
  // Warm-up as stream-loop.ts's: blocks of an eighth while rank 0 has spent less than 1.5 s
  // (after each, rank 0 sends 1 for another block, 0 for the end).
  const w0 = performance.now();
  for (;;) {
    await block(Math.max(10, iters >> 3));
    if (rank === 0) {
      const more = performance.now() - w0 < WARMUP_MS;
      await push.send(Buffer.from([more ? 1 : 0]));
      if (!more) break;
    } else if ((await pull.receive())[0]![0] !== 1) break;
  }
  const out: Side = { mbps: [], cpuUs: [] };
  for (let b = 0; b < 3; b++) {
    const r0 = process.resourceUsage();
    const t0 = performance.now();
    await block(iters);
    const ms = performance.now() - t0;
    const r1 = process.resourceUsage();
    out.mbps.push((bytes * iters) / ms / 1000);
    out.cpuUs.push((r1.userCPUTime + r1.systemCPUTime - r0.userCPUTime - r0.systemCPUTime) / iters);
  }
  process.send!(out);
  push.close();
  pull.close();
}

async function runRaw(bytes: number): Promise<Side[]> {
  const dir = mkdtempSync(path.join(os.tmpdir(), "stream-ab-raw-"));
  try {
    const out: Side[] = [];
    const kids = [0, 1].map((r) =>
      fork(fileURLToPath(import.meta.url), ["--role", String(r), "--dir", dir, "--bytes", String(bytes), "--iters", String(iters)], {
        execArgv: ["--import", "tsx"],
      }),
    );
    kids.forEach((k, r) => k.on("message", (m) => (out[r] = m as Side)));
    await Promise.all(kids.map((k) => new Promise<void>((resolve) => k.on("exit", () => resolve()))));
    if (out.length !== 2) throw new Error("a raw streaming process ended without its figures");
    return out;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function runLifeline(bytes: number, dir: string): Side[] {
  const results = path.join(dir, "r.json");
  execFileSync(
    process.execPath,
    [
      path.join(ROOT, "dist/cli.js"),
      "run",
      "-n",
      "2",
      "--mode",
      "none",
      "--quiet",
      "--results",
      results,
      "bench/programs/stream-loop.ts",
      "--bytes",
      String(bytes),
      "--iters",
      String(iters),
      "--window",
      values.window,
    ],
    { cwd: ROOT, stdio: ["ignore", "ignore", "inherit"], timeout: 600_000 },
  );
  return (JSON.parse(readFileSync(results, "utf8")) as { ranks: Side[] }).ranks;
}

async function main(): Promise<void> {
  const sizes = values.sizes.split(",").map(Number);
  const rounds = Number(values.rounds);
  const dir = mkdtempSync(path.join(os.tmpdir(), "stream-ab-"));
  const rows: string[] = [];
  try {
    for (const bytes of sizes) {
      const lif: Side[][] = [];
      const raw: Side[][] = [];
      for (let r = 0; r < rounds; r++) {
        const order = r % 2 === 0 ? ["lifeline", "raw"] : ["raw", "lifeline"];
        for (const which of order) {
          if (which === "lifeline") lif.push(runLifeline(bytes, dir));
          else raw.push(await runRaw(bytes));
        }
        process.stderr.write(`${sizeLabel(bytes)} round ${r + 1} done\n`);
      }
      const bw = (runs: Side[][]): number => median(runs.flatMap((s) => s[0]!.mbps));
      const cpu = (runs: Side[][], rank: number): number => median(runs.flatMap((s) => s[rank]!.cpuUs));
      rows.push(
        `| ${sizeLabel(bytes)} | ${bw(lif).toFixed(0)} | ${bw(raw).toFixed(0)} | ${(bw(lif) / bw(raw)).toFixed(2)}x | ` +
          `${cpu(lif, 0).toFixed(0)} / ${cpu(lif, 1).toFixed(0)} | ${cpu(raw, 0).toFixed(0)} / ${cpu(raw, 1).toFixed(0)} |`,
      );
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  process.stdout.write(
    `\n### stream, 2 processes, one job at a time (medians of ${rounds} rounds x 3 blocks of ${iters} messages; load ${os.loadavg()[0]!.toFixed(2)})\n\n` +
      "| size | Lifeline MB/s | raw MB/s | L/raw | CPU us/msg Lifeline send / recv | raw send / recv |\n| --- | ---: | ---: | ---: | ---: | ---: |\n" +
      `${rows.join("\n")}\n`,
  );
}

if (values.role !== undefined) await rawSide(Number(values.role), values.dir!, Number(values.bytes));
else await main();
