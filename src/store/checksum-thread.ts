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
import { crc32Yielding, sliced } from "./checksum.ts";

/** Below this many bytes in shared memory a checksum stays on the main thread (a message costs more). */
export const OFF_THREAD_BYTES_MIN = 1 << 20;

// The thread's whole program: small enough to need no file, so it runs the same from src/ (tsx,
// vitest) and from dist/, and it needs no TypeScript loader.
const WORKER_SOURCE = `
const { parentPort } = require("node:worker_threads");
const { createHash } = require("node:crypto");
const zlib = require("node:zlib");
parentPort.on("message", (job) => {
  try {
    let result;
    if (job.kind === "sha256") {
      const hash = createHash("sha256");
      for (const v of job.views) hash.update(v);
      result = hash.digest();
    } else if (job.kind === "each") {
      result = job.views.map((v) => createHash("sha256").update(v).digest());
    } else if (job.kind === "blocks") {
      result = [];
      let hash = createHash("sha256");
      let filled = 0;
      for (const v of job.views) {
        for (let off = 0; off < v.length; ) {
          const n = Math.min(job.blockBytes - filled, v.length - off);
          hash.update(v.subarray(off, off + n));
          off += n;
          filled += n;
          if (filled === job.blockBytes) {
            result.push(hash.digest());
            hash = createHash("sha256");
            filled = 0;
          }
        }
      }
      if (filled > 0 || result.length === 0) result.push(hash.digest());
    } else {
      result = 0;
      for (const v of job.views) result = zlib.crc32(v, result);
    }
    parentPort.postMessage({ id: job.id, result });
  } catch (err) {
    parentPort.postMessage({ id: job.id, error: String((err && err.message) || err) });
  }
});
`;

type Job = { kind: "sha256" | "each" | "crc32" } | { kind: "blocks"; blockBytes: number };
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

function run<T>(job: Job, views: readonly Uint8Array[], onMain: () => Promise<T>, wrap: (result: unknown) => T): Promise<T> {
  const w = offThread(views) ? thread() : undefined;
  if (w === undefined) return onMain();
  return new Promise<T>((resolve, reject) => {
    const id = nextId++;
    pending.set(id, { resolve: (r) => resolve(wrap(r)), onThread: () => void onMain().then(resolve, reject) });
    w.ref();
    // Views of a SharedArrayBuffer cross without a copy; the few small others are copied.
    w.postMessage({ id, ...job, views });
  });
}

const asViews = (data: Uint8Array | readonly Uint8Array[]): readonly Uint8Array[] => (data instanceof Uint8Array ? [data] : data);

/**
 * SHA-256 of `data` (the concatenation of its chunks): on the checksum thread when it lies in
 * shared memory, else in slices over a few turns of the event loop.
 *
 * @example
 * (await sha256OffThread([a, b])).equals(createHash("sha256").update(a).update(b).digest()); // true
 */
export function sha256OffThread(data: Uint8Array | readonly Uint8Array[]): Promise<Buffer> {
  const views = asViews(data);
  const onMain = async (): Promise<Buffer> => {
    const hash = createHash("sha256");
    await sliced(views, (slice) => hash.update(slice));
    return hash.digest();
  };
  return run({ kind: "sha256" }, views, onMain, (r) => Buffer.from(r as Uint8Array));
}

/**
 * The SHA-256 of each of `views`, in order: on the checksum thread when they lie in shared
 * memory, else in slices over a few turns of the event loop (one pass, not one per view).
 *
 * @example
 * const [a, b] = await sha256Each([x, y]); // createHash("sha256").update(x).digest(), and y's
 */
export function sha256Each(views: readonly Uint8Array[]): Promise<Buffer[]> {
  const onMain = async (): Promise<Buffer[]> => {
    const out: Buffer[] = [];
    let i = 0;
    let hash = createHash("sha256");
    let left = views[0]?.byteLength ?? 0;
    // Done with view i (and any empty ones after it): its digest, then the next.
    const advance = (): void => {
      while (i < views.length && left === 0) {
        out.push(hash.digest());
        hash = createHash("sha256");
        i++;
        left = views[i]?.byteLength ?? 0;
      }
    };
    advance();
    // sliced() never lets a slice span two views.
    await sliced(views, (slice) => {
      hash.update(slice);
      left -= slice.byteLength;
      advance();
    });
    return out;
  };
  return run({ kind: "each" }, views, onMain, (r) => (r as Uint8Array[]).map((d) => Buffer.from(d.buffer, d.byteOffset, d.byteLength)));
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
  const views = asViews(data);
  const onMain = async (): Promise<Buffer[]> => {
    const out: Buffer[] = [];
    let hash = createHash("sha256");
    let filled = 0;
    await sliced(views, (slice) => {
      for (let off = 0; off < slice.length;) {
        const n = Math.min(blockBytes - filled, slice.length - off);
        hash.update(slice.subarray(off, off + n));
        off += n;
        filled += n;
        if (filled === blockBytes) {
          out.push(hash.digest());
          hash = createHash("sha256");
          filled = 0;
        }
      }
    });
    if (filled > 0 || out.length === 0) out.push(hash.digest());
    return out;
  };
  return run({ kind: "blocks", blockBytes }, views, onMain, (r) => (r as Uint8Array[]).map((d) => Buffer.from(d.buffer, d.byteOffset, d.byteLength)));
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
  const onMain = (): Promise<number> => crc32Yielding(views);
  if (!nativeCrc32) return onMain();
  return run({ kind: "crc32" }, views, onMain, (r) => r as number);
}

/** For tests: how many checksums the thread has not answered yet, and whether it is usable. */
export function checksumThreadState(): { pending: number; broken: boolean } {
  return { pending: pending.size, broken };
}
