/**
 * The in-memory store used by the deterministic simulator and by tests.
 *
 * It runs the very same store logic (`part-store.ts`, `manifest.ts`) as the LevelDB store,
 * over maps instead of LevelDB and files, so records, checksums, rules and errors are the
 * same: a second open of a rank or of the manifest is `STORE_LOCKED`, damage is
 * `STORE_CORRUPT`, a handle used after close is `STORE_NOT_OPEN`, a broken "disk"
 * ({@link MemoryRecoveryStore.breakBlobs}) is `STORE_IO`. Each map operation is atomic and
 * "durable" at once, like a synced write; {@link MemoryRecoveryStore.crash} models every
 * process using the store being killed at that moment: open handles die, locks are released,
 * whatever was written stays.
 *
 * Values are copied in and out, so callers cannot change stored data by mutating buffers.
 *
 * @example
 * const store = new MemoryRecoveryStore({ nowMs: () => sim.tick });
 * const parts = await store.openRank(0);
 */
import type { BlobDir, KvDb, KvOp } from "./backend.ts";
import { crc32 } from "./checksum.ts";
import { KvLineManifest } from "./manifest.ts";
import { KvRankPartStore } from "./part-store.ts";
import { LINE_PREFIX, PART_PREFIX, BLOB_HEADER_BYTES, checkEpoch, checkRank, decodeRecord, epochKeyPart, notOpen, storeError } from "./records.ts";
import type { LineManifest, RankPartStore, RecoveryStore, StoreFaults } from "./types.ts";

/**
 * Options of {@link MemoryRecoveryStore}.
 *
 * @example
 * new MemoryRecoveryStore({ name: "sim-42", nowMs: () => cluster.tick });
 * // messages then say "memory:sim-42/rank-0/parts"
 */
export interface MemoryRecoveryStoreOptions {
  /** Shown in messages as `memory:<name>`. Default "store". */
  readonly name?: string;
  /** Clock for commit and part times; the simulator passes its tick. Default `Date.now`. */
  readonly nowMs?: () => number;
}

interface RankData {
  readonly kv: Map<string, Buffer>;
  readonly blobs: Map<string, Buffer>;
  broken: boolean;
}

/** What a lock is held by: the handle, so that crash() can kill it. */
interface Holder {
  invalidate(): void;
  kill(): void;
}

/**
 * A {@link RecoveryStore} in memory, which also implements {@link StoreFaults}.
 * Errors as documented on {@link RecoveryStore}.
 *
 * @example
 * const store = new MemoryRecoveryStore();
 * const manifest = await store.openManifest(); // a second openManifest() is STORE_LOCKED
 */
export class MemoryRecoveryStore implements RecoveryStore, StoreFaults {
  readonly location: string;
  private readonly nowMs: () => number;
  private readonly manifestKv = new Map<string, Buffer>();
  private readonly rankData = new Map<number, RankData>();
  private readonly locks = new Map<string, Holder>();

  constructor(opts?: MemoryRecoveryStoreOptions) {
    this.location = `memory:${opts?.name ?? "store"}`;
    this.nowMs = opts?.nowMs ?? Date.now;
  }

  async openManifest(): Promise<LineManifest> {
    const path = `${this.location}/manifest`;
    this.lock(path);
    const kv = new MapKv(path, this.manifestKv);
    const manifest = new KvLineManifest({ kv, nowMs: this.nowMs, onClose: () => this.locks.delete(path) });
    this.locks.set(path, { invalidate: () => manifest.invalidate(), kill: () => kv.kill() });
    return manifest;
  }

  async openRank(rank: number): Promise<RankPartStore> {
    checkRank(rank);
    const path = `${this.location}/rank-${rank}/parts`;
    this.lock(path);
    let data = this.rankData.get(rank);
    if (data === undefined) {
      data = { kv: new Map(), blobs: new Map(), broken: false };
      this.rankData.set(rank, data);
    }
    const kv = new MapKv(path, data.kv);
    const blobs = new MemoryBlobDir(`${this.location}/rank-${rank}/blobs`, data);
    const holder: Holder = {
      invalidate: () => undefined,
      kill: () => {
        kv.kill();
        blobs.kill();
      },
    };
    this.locks.set(path, holder);
    try {
      const parts = await KvRankPartStore.open({ rank, kv, blobs, nowMs: this.nowMs, gc: true, onClose: () => this.locks.delete(path) });
      holder.invalidate = () => parts.invalidate();
      return parts;
    } catch (err) {
      this.locks.delete(path);
      throw err;
    }
  }

  async ranks(): Promise<number[]> {
    return [...this.rankData.keys()].sort((a, b) => a - b);
  }

  /**
   * Every process using the store dies now: open handles reject with `STORE_NOT_OPEN` from
   * here on (also their operations in flight, at their next step), and locks are released.
   * Data written so far stays, as on a disk after `kill -9`.
   *
   * @example
   * store.crash();
   * const manifest = await store.openManifest(); // succeeds: the lock died with its holder
   */
  crash(): void {
    for (const holder of this.locks.values()) {
      holder.kill();
      holder.invalidate();
    }
    this.locks.clear();
  }

  /**
   * The process holding rank `rank`'s part store dies now (one rank killed, the others run
   * on): that handle dies as in {@link crash} and its lock is released.
   *
   * @example
   * store.crashRank(2);
   * const parts = await store.openRank(2); // the restarted rank opens it again
   */
  crashRank(rank: number): void {
    const path = `${this.location}/rank-${rank}/parts`;
    const holder = this.locks.get(path);
    if (holder === undefined) return;
    holder.kill();
    holder.invalidate();
    this.locks.delete(path);
  }

  // ---- StoreFaults ------------------------------------------------------------------------

  async corruptPart(rank: number, epoch: number): Promise<void> {
    const { data, key, record } = this.partRecord(rank, epoch);
    const blob = record["blob"] ?? middleBlock(record);
    if (typeof blob === "string") {
      const file = data.blobs.get(blob);
      if (file === undefined) throw new Error(`corruptPart: rank ${rank}'s blob ${blob} does not exist`);
      flipByte(file, BLOB_HEADER_BYTES + Math.floor((file.length - BLOB_HEADER_BYTES) / 2));
    } else {
      // Inline: flip a byte in the middle of the record, which its checksum catches.
      flipByte(data.kv.get(key)!, Math.floor(data.kv.get(key)!.length / 2));
    }
  }

  async removePart(rank: number, epoch: number): Promise<void> {
    const { data, key, record } = this.partRecord(rank, epoch);
    const blob = record["blob"] ?? middleBlock(record);
    if (typeof blob === "string") data.blobs.delete(blob);
    else data.kv.delete(key);
  }

  async corruptLineRecord(epoch: number): Promise<void> {
    checkEpoch(epoch);
    const value = this.manifestKv.get(LINE_PREFIX + epochKeyPart(epoch));
    if (value === undefined) throw new Error(`corruptLineRecord: line ${epoch} has no commit record`);
    flipByte(value, Math.floor(value.length / 2));
  }

  async breakBlobs(rank: number): Promise<void> {
    checkRank(rank);
    let data = this.rankData.get(rank);
    if (data === undefined) {
      data = { kv: new Map(), blobs: new Map(), broken: true };
      this.rankData.set(rank, data);
    }
    data.broken = true;
  }

  // ---- internals --------------------------------------------------------------------------

  private lock(path: string): void {
    if (this.locks.has(path)) {
      // The same words as LevelDB's, through the same mapping, so both stores say the same.
      const err = Object.assign(new Error(`lock ${path}/LOCK: already held by process`), { code: "LEVEL_LOCKED" });
      throw storeError(err, path.endsWith("/manifest") ? "opening the line manifest" : "opening a rank's part database", path);
    }
  }

  private partRecord(rank: number, epoch: number): { data: RankData; key: string; record: Record<string, unknown> } {
    const data = this.rankData.get(rank);
    const key = PART_PREFIX + epochKeyPart(epoch);
    const value = data?.kv.get(key);
    if (data === undefined || value === undefined) throw new Error(`rank ${rank} has no part of line ${epoch}`);
    return { data, key, record: decodeRecord(value, `rank ${rank}'s part of line ${epoch}`) };
  }
}

function flipByte(buf: Buffer, at: number): void {
  buf[at] = buf[at]! ^ 0xff;
}

/** {@link KvDb} over a sorted-on-read map. Killed handles fail like closed ones. */
class MapKv implements KvDb {
  private dead = false;
  constructor(
    readonly location: string,
    private readonly map: Map<string, Buffer>,
  ) {}

  kill(): void {
    this.dead = true;
  }

  async get(key: string): Promise<Buffer | undefined> {
    this.check();
    const v = this.map.get(key);
    return v === undefined ? undefined : Buffer.from(v);
  }

  async write(ops: readonly KvOp[], _opts: { sync: boolean }): Promise<void> {
    this.check();
    // Synchronous, hence atomic with respect to crash(): all or nothing, like a LevelDB batch.
    for (const op of ops) {
      if (op.type === "put") this.map.set(op.key, Buffer.from(op.value));
      else this.map.delete(op.key);
    }
  }

  async scan(prefix: string, opts: { reverse?: boolean; limit?: number }): Promise<[string, Buffer][]> {
    this.check();
    const keys = [...this.map.keys()].filter((k) => k.startsWith(prefix)).sort();
    if (opts.reverse === true) keys.reverse();
    const limited = opts.limit === undefined || opts.limit < 0 ? keys : keys.slice(0, opts.limit);
    return limited.map((k) => [k, Buffer.from(this.map.get(k)!)]);
  }

  async close(): Promise<void> {
    this.dead = true;
  }

  private check(): void {
    if (this.dead) throw notOpen(`the database ${this.location}`);
  }
}

/** {@link BlobDir} over a map of "files" (header and payload in one buffer). */
class MemoryBlobDir implements BlobDir {
  private dead = false;
  constructor(
    readonly location: string,
    private readonly data: RankData,
  ) {}

  kill(): void {
    this.dead = true;
  }

  pathOf(name: string): string {
    return `${this.location}/${name}`;
  }

  async write(name: string, header: Buffer, payload: readonly Uint8Array[], signal?: AbortSignal): Promise<number> {
    this.check();
    signal?.throwIfAborted();
    if (this.data.broken) throw osError("ENOTDIR", `ENOTDIR: not a directory, open '${this.pathOf(name)}'`);
    if (this.data.blobs.has(name)) throw osError("EEXIST", `EEXIST: file already exists, open '${this.pathOf(name)}'`);
    const checksum = payload.reduce((sum, chunk) => crc32(chunk, sum), 0);
    this.data.blobs.set(name, Buffer.concat([header, ...payload]));
    return checksum;
  }

  async read(name: string, headerBytes: number, into?: Buffer): Promise<{ header: Buffer; payload: Buffer } | undefined> {
    this.check();
    const file = this.data.blobs.get(name);
    if (file === undefined) return undefined;
    const rest = file.subarray(headerBytes);
    const payload = into !== undefined && rest.length === into.length ? into : Buffer.alloc(rest.length);
    rest.copy(payload);
    return { header: Buffer.from(file.subarray(0, headerBytes)), payload };
  }

  async remove(names: readonly string[]): Promise<void> {
    this.check();
    for (const name of names) this.data.blobs.delete(name);
  }

  async list(): Promise<string[]> {
    this.check();
    return [...this.data.blobs.keys()];
  }

  private check(): void {
    if (this.dead) throw notOpen(`the blob directory ${this.location}`);
  }
}

function osError(code: string, message: string): Error {
  return Object.assign(new Error(message), { code });
}

/**
 * The block file in the middle of a blocked part's record (see BLOCKED_BYTES_MIN), which the
 * fault helpers damage or remove; null for other records. Other parts may name the same file.
 */
export function middleBlock(record: Record<string, unknown>): string | null {
  const runs = Array.isArray(record["blocks"]) ? (record["blocks"] as { f?: unknown }[]).filter((g) => typeof g.f === "string") : [];
  return runs.length === 0 ? null : (runs[Math.floor(runs.length / 2)]!.f as string);
}
