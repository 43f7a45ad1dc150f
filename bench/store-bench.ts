/**
 * Store benchmark: writing and reading one rank's 64 MiB part through the recovery store,
 * next to plain `node:fs` doing the same with the same bytes, in the same run.
 *
 * Cases (each timed --reps times, variants interleaved in rotating order so that drift of a
 * shared machine hits all alike; the figure is the median):
 * - write: `RankPartStore.putPart` (CRC-32, blob file write + fsync, directory fsync, synced
 *   LevelDB record) vs `fh.writeFile` + `fh.sync()` of a new file; and, for reference, a plain
 *   synced LevelDB put of the same bytes (the layout the store avoids).
 *   Target: store / fs <= 1.25.
 * - read: `readPart` (read + CRC check) vs `readFile`, both from the page cache.
 * - restart: a fresh process's view: open the manifest, find the newest line, open the rank
 *   store, read and verify its part; vs `readFile` again.
 * Previous repetitions' parts and files are deleted outside the timed sections.
 *
 * Usage: node --import tsx bench/store-bench.ts [--reps 9] [--mib 64] [--dir <dir>] [--out <file>] [--quick]
 * Also importable: `runStoreBench(opts)` and `renderStoreTable(result)` (for bench/run.ts).
 *
 * @example
 * const result = await runStoreBench({ reps: 5, mib: 64 });
 * console.log(renderStoreTable(result));
 */
import { createHash, randomBytes } from "node:crypto";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { open, readFile, unlink } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { parseArgs } from "node:util";
import { Level } from "level";
import { crc32 } from "../src/store/checksum.ts";
import { LevelRecoveryStore } from "../src/store/level-store.ts";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

/**
 * Options of {@link runStoreBench}.
 *
 * @example
 * await runStoreBench({ reps: 3, mib: 4 });           // a quick smoke run
 * await runStoreBench({ dir: "/mnt/ssd/bench" });     // measure another disk
 */
export interface StoreBenchOptions {
  /** Timed repetitions per variant (>= 1). Default 9. */
  readonly reps?: number;
  /** Part size in MiB. Default 64. */
  readonly mib?: number;
  /** Where to write; default a temporary directory under os.tmpdir(), removed afterwards. */
  readonly dir?: string;
  /** Also time a plain synced LevelDB put (the 2x reference). Default true. */
  readonly levelPut?: boolean;
}

/**
 * One row of the table: the store's and the baseline's times, and their ratio.
 *
 * @example
 * const write = result.cases[0]!;
 * console.log(write.ratio <= write.target! ? "met" : "not met");
 */
export interface StoreBenchCase {
  readonly name: string;
  /** Per-repetition milliseconds, in the order they ran. */
  readonly storeMs: number[];
  readonly baselineMs: number[];
  readonly storeMedianMs: number;
  readonly baselineMedianMs: number;
  /** store median / baseline median. */
  readonly ratio: number;
  /** Median of the per-repetition ratios (repetition k with repetition k). */
  readonly pairedRatio: number;
  readonly baseline: string;
  readonly target: number | null;
}

/**
 * What {@link runStoreBench} measured; saved as JSON under bench/results/.
 *
 * @example
 * const result = await runStoreBench();
 * writeFileSync("store.json", JSON.stringify(result));
 */
export interface StoreBenchResult {
  readonly date: string;
  readonly node: string;
  readonly cpus: string;
  readonly dir: string;
  readonly bytes: number;
  readonly reps: number;
  readonly crc32Ms: number;
  /** SHA-256 of the same bytes, for comparison (the checksum the store does not use). */
  readonly sha256Ms: number;
  /** Median CPU time per write (user + system, all threads), store and fs. */
  readonly writeCpuMs: { readonly store: number; readonly fs: number };
  /** os.loadavg()[0] before and after: a loaded machine stretches CPU-bound steps. */
  readonly loadAvg: readonly [number, number];
  readonly cases: StoreBenchCase[];
}

function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 === 1 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

/** CPU time (user + system, all threads of this process) of the last {@link timed} call. */
let lastCpuMs = 0;

async function timed(fn: () => Promise<unknown>): Promise<number> {
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  await fn();
  const ms = performance.now() - t0;
  const c = process.cpuUsage(c0);
  lastCpuMs = (c.user + c.system) / 1000;
  return ms;
}

/**
 * Runs the benchmark; see the file comment. Rejects with the store's errors (`STORE_IO`,
 * `STORE_LOCKED` if `dir` is in use, `STORE_NOT_FOUND` if `dir/store` is someone else's).
 *
 * @example
 * const result = await runStoreBench({ reps: 5 });
 * console.log(renderStoreTable(result));
 */
export async function runStoreBench(opts: StoreBenchOptions = {}): Promise<StoreBenchResult> {
  const reps = opts.reps ?? 9;
  const mib = opts.mib ?? 64;
  const bytesCount = Math.round(mib * (1 << 20));
  const ownDir = opts.dir === undefined;
  const base = opts.dir ?? mkdtempSync(path.join(os.tmpdir(), "lifeline-store-bench-"));
  mkdirSync(base, { recursive: true });
  const storeDir = path.join(base, "store");
  const filesDir = path.join(base, "files");
  const levelDir = path.join(base, "level");
  rmSync(storeDir, { recursive: true, force: true });
  mkdirSync(filesDir, { recursive: true });
  const bytes = randomBytes(bytesCount);
  const loadBefore = os.loadavg()[0]!;

  const crcTimes: number[] = [];
  for (let i = 0; i < 5; i++) crcTimes.push(await timed(async () => crc32(bytes)));
  // The checksum's alternative (src/store/checksum.ts says why CRC-32): SHA-256 of the same bytes.
  const shaTimes: number[] = [];
  for (let i = 0; i < 5; i++) shaTimes.push(await timed(async () => createHash("sha256").update(bytes).digest()));

  const store = new LevelRecoveryStore(storeDir);
  const manifest = await store.openManifest();
  const parts = await store.openRank(0);
  const level = new Level<string, Buffer>(levelDir, { keyEncoding: "utf8", valueEncoding: "buffer" });
  await level.open();
  const withLevel = opts.levelPut ?? true;

  const write = { store: [] as number[], fs: [] as number[] };
  const writeCpu = { store: [] as number[], fs: [] as number[] };
  const levelWrite = { level: [] as number[], fs: [] as number[] };
  try {
    // ---- write ------------------------------------------------------------------------
    // Two phases: store vs fs first; the plain LevelDB reference after, on its own, because
    // a 64 MiB LevelDB put leaves background work (memtable flush, compaction: another
    // 64 MiB of writes) that would slow whichever variant runs next.
    type Variant = "store" | "fs" | "level";
    let serial = 0;
    const runOne = async (v: Variant): Promise<number> => {
      const n = serial++;
      switch (v) {
        case "store": {
          const ms = await timed(() => parts.putPart(n, bytes));
          await parts.retain([n]); // untimed: drop the previous repetition's part
          return ms;
        }
        case "fs": {
          const file = path.join(filesDir, `part-${n}.bin`);
          const ms = await timed(async () => {
            const fh = await open(file, "w");
            try {
              await fh.writeFile(bytes);
              await fh.sync();
            } finally {
              await fh.close();
            }
          });
          await unlink(file);
          return ms;
        }
        case "level": {
          const key = `part-${n}`;
          const ms = await timed(() => level.put(key, bytes, { sync: true }));
          await level.del(key);
          return ms;
        }
      }
    };
    const phase = async (a: Variant, b: Variant, into: Record<string, number[]>, cpuInto?: Record<string, number[]>): Promise<void> => {
      for (let rep = -1; rep < reps; rep++) {
        // rep -1: warm-up, not recorded
        const order: Variant[] = rep % 2 === 0 ? [a, b] : [b, a];
        for (const v of order) {
          const ms = await runOne(v);
          if (rep >= 0) {
            into[v]!.push(ms);
            cpuInto?.[v]!.push(lastCpuMs);
          }
        }
      }
    };
    await phase("store", "fs", write, writeCpu);
    if (withLevel) await phase("level", "fs", levelWrite);

    // ---- read and restart -----------------------------------------------------------------
    const epoch = serial++;
    const ref = await parts.putPart(epoch, bytes);
    await manifest.commitLine(epoch, [ref]);
    await parts.retain([epoch]);
    const file = path.join(filesDir, "part.bin");
    writeFileSync(file, bytes);
    const read = { store: [] as number[], fs: [] as number[] };
    const restart = { store: [] as number[], fs: [] as number[] };
    await manifest.close();
    await parts.close();
    for (let rep = -1; rep < reps; rep++) {
      const first = rep % 2 === 0;
      const runFs = async (): Promise<number> =>
        timed(async () => {
          const back = await readFile(file);
          if (back.length !== bytesCount) throw new Error("short read");
        });
      const runStoreRead = async (): Promise<number> => {
        const p = await store.openRank(0);
        try {
          return await timed(async () => {
            await p.readPart(ref);
          });
        } finally {
          await p.close();
        }
      };
      const runRestart = async (): Promise<number> => {
        let handles: { close(): Promise<void> }[] = [];
        try {
          return await timed(async () => {
            const fresh = new LevelRecoveryStore(storeDir);
            const m = await fresh.openManifest();
            handles.push(m);
            const line = await m.latestCommitted();
            const p = await fresh.openRank(0);
            handles.push(p);
            const back = await p.readPart(line!.parts[0]!);
            if (back.length !== bytesCount) throw new Error("short read");
          });
        } finally {
          for (const h of handles) await h.close();
          handles = [];
        }
      };
      const pairs: [number, number][] = [];
      if (first) pairs.push([await runStoreRead(), await runFs()]);
      else {
        const f = await runFs();
        pairs.push([await runStoreRead(), f]);
      }
      if (first) pairs.push([await runRestart(), await runFs()]);
      else {
        const f = await runFs();
        pairs.push([await runRestart(), f]);
      }
      if (rep >= 0) {
        read.store.push(pairs[0]![0]);
        read.fs.push(pairs[0]![1]);
        restart.store.push(pairs[1]![0]);
        restart.fs.push(pairs[1]![1]);
      }
    }

    const mk = (name: string, s: number[], b: number[], baseline: string, target: number | null): StoreBenchCase => ({
      name,
      storeMs: s,
      baselineMs: b,
      storeMedianMs: median(s),
      baselineMedianMs: median(b),
      ratio: median(s) / median(b),
      pairedRatio: median(s.map((x, i) => x / b[i]!)),
      baseline,
      target,
    });
    const label = `${mib} MiB`;
    const cases = [
      mk(`write ${label}, synced`, write.store, write.fs, "fs.writeFile + fsync", 1.25),
      mk(`read ${label}, verified`, read.store, read.fs, "fs.readFile", null),
      mk(`restart: open + read ${label}`, restart.store, restart.fs, "fs.readFile", null),
    ];
    if (withLevel) cases.push(mk(`(reference) plain LevelDB put ${label}, synced`, levelWrite.level, levelWrite.fs, "fs.writeFile + fsync", null));
    return {
      date: new Date().toISOString(),
      node: process.version,
      cpus: `${os.cpus().length} x ${os.cpus()[0]?.model ?? "?"}`,
      dir: base,
      bytes: bytesCount,
      reps,
      crc32Ms: median(crcTimes),
      sha256Ms: median(shaTimes),
      writeCpuMs: { store: median(writeCpu.store), fs: median(writeCpu.fs) },
      loadAvg: [loadBefore, os.loadavg()[0]!],
      cases,
    };
  } finally {
    await manifest.close();
    await parts.close();
    await level.close();
    if (ownDir) rmSync(base, { recursive: true, force: true });
    else rmSync(storeDir, { recursive: true, force: true });
  }
}

/**
 * The result as a Markdown table, like bench/run.ts prints its own. Never throws.
 *
 * @example
 * process.stdout.write(renderStoreTable(await runStoreBench()));
 * // ### Checkpoint store, one rank part (ms; median of 7, interleaved) ...
 */
export function renderStoreTable(r: StoreBenchResult): string {
  const f = (ms: number): string => ms.toFixed(1);
  const lines = [
    `### Checkpoint store, one rank part (ms; median of ${r.reps}, interleaved)`,
    "",
    "| case | store | baseline | baseline is | store / baseline | target |",
    "| --- | ---: | ---: | --- | ---: | --- |",
    ...r.cases.map((c) => {
      const verdict = c.target === null ? "" : `<= ${c.target}x: ${c.ratio <= c.target ? "met" : "NOT met"}`;
      return `| ${c.name} | ${f(c.storeMedianMs)} | ${f(c.baselineMedianMs)} | ${c.baseline} | ${c.ratio.toFixed(2)}x (paired ${c.pairedRatio.toFixed(2)}x) | ${verdict} |`;
    }),
    "",
    `CRC-32 of ${(r.bytes / (1 << 20)).toFixed(0)} MiB alone: ${f(r.crc32Ms)} ms (overlapped with the write and fsync in putPart; SHA-256 would take ${f(r.sha256Ms)} ms). ` +
      `CPU per write, all threads: store ${f(r.writeCpuMs.store)} ms, fs ${f(r.writeCpuMs.fs)} ms. ` +
      `Load average ${r.loadAvg[0].toFixed(1)} -> ${r.loadAvg[1].toFixed(1)} on ${os.cpus().length} CPUs (a loaded machine stretches the CPU-bound steps). ` +
      `Reads hit the page cache. The LevelDB reference is timed in a separate phase (its background compaction would slow whatever runs next). ${r.node}, ${r.cpus}, in ${r.dir}.`,
  ];
  return lines.join("\n") + "\n";
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      reps: { type: "string" },
      mib: { type: "string" },
      dir: { type: "string" },
      out: { type: "string" },
      quick: { type: "boolean", default: false },
      "no-level-put": { type: "boolean", default: false },
      help: { type: "boolean", short: "h", default: false },
    },
  });
  if (values.help) {
    process.stdout.write("Usage: node --import tsx bench/store-bench.ts [--reps 9] [--mib 64] [--dir <dir>] [--out <file>] [--quick] [--no-level-put]\n");
    return;
  }
  const reps = Number(values.reps ?? (values.quick ? 3 : 9));
  const mib = Number(values.mib ?? (values.quick ? 4 : 64));
  if (!Number.isInteger(reps) || reps < 1) throw new RangeError(`--reps must be an integer >= 1, got ${values.reps}`);
  if (!(mib > 0)) throw new RangeError(`--mib must be positive, got ${values.mib}`);
  const result = await runStoreBench({ reps, mib, dir: values.dir, levelPut: !values["no-level-put"] });
  process.stdout.write(renderStoreTable(result));
  const out = values.out ?? path.join(ROOT, "bench", "results", `store-${result.date.replace(/[:.]/g, "-")}.json`);
  mkdirSync(path.dirname(out), { recursive: true });
  writeFileSync(out, JSON.stringify(result, null, 2) + "\n");
  process.stdout.write(`results: ${path.relative(process.cwd(), out)}\n`);
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(path.resolve(process.argv[1])).href) {
  main().catch((err: unknown) => {
    process.stderr.write(`store-bench: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exitCode = 1;
  });
}
