/**
 * Checksums of large data in shared memory, computed on a thread of their own.
 *
 * A cpr line hashes its global (SHA-256, so other ranks can name it) and checksums its part
 * (CRC-32) while the program runs. On the main thread that work can only take the turns of the
 * event loop between the program's calls: a program that computes for 20 ms between two calls
 * makes a 35 ms SHA-256 of 64 MiB take several of its steps, and the line waits for it. Data
 * in a SharedArrayBuffer (the driver saves large globals there) is hashed on this module's
 * worker thread instead, without a copy, whatever the program does meanwhile. Anything else,
 * and everything when the thread cannot run, goes through {@link sliced} on the main thread.
 *
 * @example
 * const pool = new BouncePool(1 << 30, 8, { shared: true });
 * const global = pool.acquire(64 << 20);
 * const digest = await sha256OffThread(global); // the same bytes as createHash("sha256").update(global).digest()
 */
import { createHash } from "node:crypto";
import { Worker } from "node:worker_threads";
import * as zlib from "node:zlib";
import { crc32, crc32Yielding, sliced } from "./checksum.ts";

/** Below this many bytes in shared memory a checksum stays on the main thread (a message costs more). */
export const OFF_THREAD_BYTES_MIN = 1 << 20;

/**
 * The checksum jobs, written once: the thread runs this source, and the main thread evaluates
 * the same source for its fallback (see {@link startJob}). A job is started for a kind and
 * the views' sizes, fed the views' bytes in order in slices that never span two views
 * (`update`), and gives its result at the end (`finish`). Plain JavaScript in a string, so it
 * needs no file and no TypeScript loader and runs the same from src/ (tsx, vitest) and dist/.
 */
const JOBS_SOURCE = `
function startJob(job) {
  switch (job.kind) {
    case "sha256": {
      const hash = createHash("sha256");
      return { update: (s) => hash.update(s), finish: () => hash.digest() };
    }
    case "crc32": {
      let sum = 0;
      return { update: (s) => { sum = crc32(s, sum); }, finish: () => sum };
    }
    case "each": {
      // One digest per view: the sizes tell where each ends (empty views included).
      const out = [];
      let i = 0;
      let hash = createHash("sha256");
      let left = job.sizes[0] ?? 0;
      const advance = () => {
        while (i < job.sizes.length && left === 0) {
          out.push(hash.digest());
          hash = createHash("sha256");
          i++;
          left = job.sizes[i] ?? 0;
        }
      };
      advance();
      return { update: (s) => { hash.update(s); left -= s.length; advance(); }, finish: () => out };
    }
    case "blocks": {
      // One digest per blockBytes of the concatenation (the last may be shorter; none: one, empty).
      const out = [];
      let hash = createHash("sha256");
      let filled = 0;
      const update = (s) => {
        for (let off = 0; off < s.length; ) {
          const n = Math.min(job.blockBytes - filled, s.length - off);
          hash.update(s.subarray(off, off + n));
          off += n;
          filled += n;
          if (filled === job.blockBytes) {
            out.push(hash.digest());
            hash = createHash("sha256");
            filled = 0;
          }
        }
      };
      return { update, finish: () => { if (filled > 0 || out.length === 0) out.push(hash.digest()); return out; } };
    }
  }
  throw new Error("unknown checksum job " + job.kind);
}
`;

// The thread's whole program: the jobs, over whole views at once.
const WORKER_SOURCE = `
const { parentPort } = require("node:worker_threads");
const { createHash } = require("node:crypto");
const { crc32 } = require("node:zlib");
${JOBS_SOURCE}
parentPort.on("message", (job) => {
  try {
    const j = startJob(job);
    for (const v of job.views) j.update(v);
    parentPort.postMessage({ id: job.id, result: j.finish() });
  } catch (err) {
    parentPort.postMessage({ id: job.id, error: String((err && err.message) || err) });
  }
});
`;

type Job = { kind: "sha256" | "each" | "crc32" } | { kind: "blocks"; blockBytes: number };
interface Started {
  update(slice: Uint8Array): void;
  finish(): unknown;
}

/** The jobs of {@link JOBS_SOURCE} on this thread, with this module's CRC-32 (zlib's, or the portable one). */
const startJob = new Function("createHash", "crc32", `${JOBS_SOURCE}\nreturn startJob;`)(createHash, crc32) as (job: Job & { sizes: number[] }) => Started;

type Pending = { resolve: (result: unknown) => void; onThread: () => void };

let worker: Worker | undefined;
/** Set once the thread failed to start or died: every later checksum stays on the main thread. */
let broken = false;
let nextId = 0;
const pending = new Map<number, Pending>();

/** Whether zlib.crc32 exists (Node ≥ 20.15), which the thread's CRC-32 uses. */
const nativeCrc32 = typeof (zlib as { crc32?: unknown }).crc32 === "function";

function thread(): Worker | undefined {
  if (broken) return undefined;
  if (worker !== undefined) return worker;
  try {
    const w = new Worker(WORKER_SOURCE, { eval: true, execArgv: [] });
    w.unref();
    w.on("message", (m: { id: number; result?: unknown; error?: string }) => {
      const p = pending.get(m.id);
      if (p === undefined) return;
      pending.delete(m.id);
      if (pending.size === 0) w.unref();
      if (m.error === undefined) p.resolve(m.result);
      else p.onThread();
    });
    const fail = (): void => {
      broken = true;
      worker = undefined;
      // What the thread had not answered is computed here after all.
      const left = [...pending.values()];
      pending.clear();
      for (const p of left) p.onThread();
    };
    w.on("error", fail);
    w.on("exit", fail);
    worker = w;
    return w;
  } catch {
    broken = true;
    return undefined;
  }
}

/** Whether `data` is worth a trip to the thread: all of it, or all but a little, in shared memory. */
function offThread(views: readonly Uint8Array[]): boolean {
  let shared = 0;
  let copied = 0;
  for (const v of views) {
    if (v.buffer instanceof SharedArrayBuffer) shared += v.byteLength;
    else copied += v.byteLength;
  }
  return shared >= OFF_THREAD_BYTES_MIN && copied <= shared / 16;
}

/**
 * Runs `job` over `views`: on the thread when they lie in shared memory (and the thread runs),
 * else here in slices over a few turns of the event loop (see sliced), as when the thread dies
 * before it answers. `wrap` turns the job's result into the caller's type.
 */
function run<T>(job: Job, views: readonly Uint8Array[], wrap: (result: unknown) => T): Promise<T> {
  const sized = { ...job, sizes: views.map((v) => v.byteLength) };
  const onMain = async (): Promise<T> => {
    const j = startJob(sized);
    await sliced(views, (slice) => j.update(slice));
    return wrap(j.finish());
  };
  const w = offThread(views) ? thread() : undefined;
  if (w === undefined) return onMain();
  return new Promise<T>((resolve, reject) => {
    const id = nextId++;
    pending.set(id, { resolve: (r) => resolve(wrap(r)), onThread: () => void onMain().then(resolve, reject) });
    w.ref();
    // Views of a SharedArrayBuffer cross without a copy; the few small others are copied.
    w.postMessage({ id, ...sized, views });
  });
}

/** Digests as Buffers (they cross from the thread as plain Uint8Arrays). */
const asBuffer = (d: unknown): Buffer => {
  const u = d as Uint8Array;
  return Buffer.from(u.buffer, u.byteOffset, u.byteLength);
};

const asViews = (data: Uint8Array | readonly Uint8Array[]): readonly Uint8Array[] => (data instanceof Uint8Array ? [data] : data);

/**
 * SHA-256 of `data` (the concatenation of its chunks): on the checksum thread when it lies in
 * shared memory, else in slices over a few turns of the event loop.
 *
 * @example
 * (await sha256OffThread([a, b])).equals(createHash("sha256").update(a).update(b).digest()); // true
 */
export function sha256OffThread(data: Uint8Array | readonly Uint8Array[]): Promise<Buffer> {
  return run({ kind: "sha256" }, asViews(data), asBuffer);
}

/**
 * The SHA-256 of each of `views`, in order: on the checksum thread when they lie in shared
 * memory, else in slices over a few turns of the event loop (one pass, not one per view).
 *
 * @example
 * const [a, b] = await sha256Each([x, y]); // createHash("sha256").update(x).digest(), and y's
 */
export function sha256Each(views: readonly Uint8Array[]): Promise<Buffer[]> {
  return run({ kind: "each" }, views, (r) => (r as unknown[]).map(asBuffer));
}

/**
 * The SHA-256 of each `blockBytes` of `data` (the concatenation of its chunks; the last block
 * may be shorter; empty data has one, empty, block): on the checksum thread when it lies in
 * shared memory, else in slices over a few turns of the event loop.
 *
 * @example
 * (await blockSha256s(bytes, 1 << 20)).length === Math.max(1, Math.ceil(bytes.length / (1 << 20))); // true
 */
export function blockSha256s(data: Uint8Array | readonly Uint8Array[], blockBytes: number): Promise<Buffer[]> {
  if (!Number.isSafeInteger(blockBytes) || blockBytes <= 0) throw new RangeError(`blockSha256s: blockBytes must be a positive integer, got ${blockBytes}`);
  return run({ kind: "blocks", blockBytes }, asViews(data), (r) => (r as unknown[]).map(asBuffer));
}

/**
 * The SHA-256 of a list of block digests (from {@link blockSha256s}): a name for the data they
 * cover that is as strong as its SHA-256, and that a store keeping the data in those blocks
 * can check block by block.
 *
 * @example
 * const name = listSha256(await blockSha256s(global, BLOCK_BYTES));
 */
export function listSha256(digests: readonly Uint8Array[]): Buffer {
  const hash = createHash("sha256");
  for (const d of digests) hash.update(d);
  return hash.digest();
}

/**
 * CRC-32 of `data` (the concatenation of its chunks), as {@link crc32Yielding}: on the checksum
 * thread when it lies in shared memory, else in slices over a few turns of the event loop.
 *
 * @example
 * (await crc32OffThread(bytes)) === crc32(bytes); // true
 */
export function crc32OffThread(data: Uint8Array | readonly Uint8Array[]): Promise<number> {
  const views = asViews(data);
  // Without zlib's CRC-32 (Node < 20.15) the thread has none: the portable one runs here.
  if (!nativeCrc32) return crc32Yielding(views);
  return run({ kind: "crc32" }, views, (r) => r as number);
}

/** For tests: how many checksums the thread has not answered yet, and whether it is usable. */
export function checksumThreadState(): { pending: number; broken: boolean } {
  return { pending: pending.size, broken };
}
