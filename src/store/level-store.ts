/**
 * The on-disk store: LevelDB (classic-level) for records, plain files for large parts.
 *
 * Layout of a store directory (`--store`, default `./.lifeline`):
 *
 *   LIFELINE-STORE            marker: {"format":"lifeline-store","version":1}; what tools look for
 *   manifest/                 LevelDB of the coordinator: commit records, abort markers
 *   rank-<r>/parts/           LevelDB of rank r: one record per part (small parts inline)
 *   rank-<r>/blobs/           rank r's large parts: <epoch>-<tag>.part, header + bytes
 *
 * One process per LevelDB, as LevelDB requires: the coordinator holds `manifest/`, rank r
 * holds `rank-<r>/parts/` (whose lock also guards `rank-<r>/blobs/`). Nothing is shared between
 * ranks, so a rank's directory can as well live on its own host's disk.
 *
 * Durability: blob files are written, fsynced, and their directory fsynced before the record
 * naming them is written with `sync: true`; databases are created under a temporary name and
 * renamed into place, so a directory named `manifest` or `parts` always holds a whole
 * database and opening never silently creates an empty one over a damaged one. A LevelDB
 * write that fails (a full disk) makes the handle reopen its database before the next
 * operation, so that LevelDB never appends acknowledged records behind a partial one (see
 * `LevelKv`).
 *
 * Inspection while a job runs (`snapshot: true`): each database is copied consistently into a
 * private temporary directory and the copy is opened, so the job's locks are never touched
 * (see `snapshot.ts`).
 *
 * @example
 * const store = new LevelRecoveryStore(".lifeline");
 * const manifest = await store.openManifest();
 */
import { randomBytes } from "node:crypto";
import { constants as fsConstants } from "node:fs";
import { mkdir, open, readdir, readFile, rename, rm, stat, unlink, writeFile, type FileHandle } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { Level } from "level";
import { LifelineError } from "../errors.ts";
import type { BlobDir, KvDb, KvOp } from "./backend.ts";
import { crc32OffThread } from "./checksum-thread.ts";
import { KvLineManifest } from "./manifest.ts";
import { KvRankPartStore } from "./part-store.ts";
import { checkRank, corrupt, deepestMessage, notOpen, storeError } from "./records.ts";
import { snapshotLevelDb, type LevelSnapshot } from "./snapshot.ts";
import type { LineManifest, RankPartStore, RecoveryStore } from "./types.ts";

/**
 * The marker file that makes a directory a Lifeline store; `lifeline lines` and writers
 * refuse directories without it (unless empty, for writers).
 *
 * @example
 * existsSync(join(dir, STORE_MARKER)); // true for a store
 */
export const STORE_MARKER = "LIFELINE-STORE";
const MARKER_BODY = JSON.stringify({ format: "lifeline-store", version: 1 }) + "\n";
/**
 * The launcher's record of a job's failures in the store directory (unless `--error-file` puts
 * it elsewhere). It is written there in every mode, also by a job that never made the directory a
 * store (mode none, or a job that failed before its first checkpoint), so it counts as the
 * store's own: a later job with a store in the same directory must not refuse it.
 */
export const ERROR_FILE_NAME = "errors.json";
/** Entries a store directory may hold; anything else means it is someone else's directory. */
const OWN_ENTRY_RE = /^(LIFELINE-STORE(\.tmp-[0-9a-f]+)?|manifest(\.tmp-[0-9a-f]+)?|rank-\d+|held-by-\d+|replica-\d+|errors\.json(\.\d+\.tmp)?)$/;
const RANK_DIR_RE = /^rank-(\d+)$/;

/**
 * Options of {@link LevelRecoveryStore}.
 *
 * @example
 * new LevelRecoveryStore(dir, { readOnly: true });          // for inspection
 * new LevelRecoveryStore(dir, { readOnly: true, snapshot: true }); // while a job holds the store
 * new LevelRecoveryStore(dir, { nowMs: () => 1_700_000_000_000 }); // a fixed clock in tests
 */
export interface LevelRecoveryStoreOptions {
  /** Clock for commit and part times (tests pass a fixed one). Default `Date.now`. */
  readonly nowMs?: () => number;
  /**
   * Inspection mode (`lifeline lines`): create nothing, collect no garbage, reject writes with
   * `TypeError`; a location that is not a store yet is `STORE_NOT_FOUND`.
   */
  readonly readOnly?: boolean;
  /**
   * Inspection of a store that a running job holds (implies `readOnly`): each database is
   * copied into a private temporary directory and the copy is opened, so the job's locks are
   * neither taken nor waited for, and the job can open its databases at any moment (see
   * `snapshot.ts`). Each `openManifest()` / `openRank()` takes its own snapshot, so the
   * manifest and the ranks are copied at slightly different moments: a line committed after
   * the manifest was copied is not listed, and a line pruned after it may miss its parts.
   * Blob files are read in place; one deleted by the job meanwhile reads as missing. `close()`
   * deletes the copy.
   */
  readonly snapshot?: boolean;
}

/**
 * A {@link RecoveryStore} in a directory, for real jobs. Errors as documented on
 * {@link RecoveryStore}; the constructor does no I/O.
 *
 * @example
 * const store = new LevelRecoveryStore("/var/tmp/job1");
 * const parts = await store.openRank(0); // STORE_LOCKED if another process holds rank 0
 *
 * const view = new LevelRecoveryStore("/var/tmp/job1", { readOnly: true, snapshot: true });
 * const lines = await (await view.openManifest()).list(); // even while the job runs
 */
export class LevelRecoveryStore implements RecoveryStore {
  readonly location: string;
  private readonly nowMs: () => number;
  private readonly readOnly: boolean;
  private readonly snapshot: boolean;

  constructor(dir: string, opts?: LevelRecoveryStoreOptions) {
    if (typeof dir !== "string" || dir === "") throw new TypeError("LevelRecoveryStore: dir must be a non-empty path");
    this.location = resolve(dir);
    this.nowMs = opts?.nowMs ?? Date.now;
    this.snapshot = opts?.snapshot ?? false;
    if (this.snapshot && opts?.readOnly === false)
      throw new TypeError("LevelRecoveryStore: a snapshot is read-only; do not pass readOnly: false with snapshot: true");
    this.readOnly = this.snapshot || (opts?.readOnly ?? false);
  }

  async openManifest(): Promise<LineManifest> {
    await this.ensureStore();
    const path = join(this.location, "manifest");
    const kv = await LevelKv.open(path, { create: !this.readOnly, what: "the line manifest", snapshot: this.snapshot });
    if (!this.readOnly) await removeTempSiblings(this.location, "manifest", kv);
    return new KvLineManifest({ kv, nowMs: this.nowMs, readOnly: this.readOnly });
  }

  async openRank(rank: number): Promise<RankPartStore> {
    checkRank(rank);
    await this.ensureStore();
    const rankDir = join(this.location, `rank-${rank}`);
    const blobsDir = join(rankDir, "blobs");
    if (!this.readOnly) {
      try {
        await mkdirDurable(blobsDir);
      } catch (err) {
        throw storeError(err, `opening rank ${rank}'s part store`, rankDir);
      }
    }
    const kv = await LevelKv.open(join(rankDir, "parts"), { create: !this.readOnly, what: `rank ${rank}'s part database`, snapshot: this.snapshot });
    if (!this.readOnly) await removeTempSiblings(rankDir, "parts", kv);
    return KvRankPartStore.open({ rank, kv, blobs: new FileBlobDir(blobsDir), nowMs: this.nowMs, gc: !this.readOnly, readOnly: this.readOnly });
  }

  async ranks(): Promise<number[]> {
    await this.ensureStore();
    let names: string[];
    try {
      names = await readdir(this.location);
    } catch (err) {
      throw storeError(err, "listing the store's ranks", this.location);
    }
    return names
      .flatMap((n) => {
        const m = RANK_DIR_RE.exec(n);
        return m === null ? [] : [Number(m[1])];
      })
      .sort((a, b) => a - b);
  }

  /**
   * Checks that the location is a Lifeline store, making it one (if it is new or empty, and
   * not read-only). Rejects with `STORE_NOT_FOUND`, `STORE_CORRUPT` (unreadable marker),
   * `STORE_IO`.
   *
   * @example
   * await new LevelRecoveryStore("/tmp/x", { readOnly: true }).ensureStore(); // STORE_NOT_FOUND
   * await new LevelRecoveryStore("/tmp/x").ensureStore(); // creates /tmp/x/LIFELINE-STORE
   */
  async ensureStore(): Promise<void> {
    const root = this.location;
    const notAStore = (why: string): LifelineError => new LifelineError("STORE_NOT_FOUND", `no Lifeline store at ${root}: ${why}`);
    try {
      let st;
      try {
        st = await stat(root);
      } catch (err) {
        if (errno(err) !== "ENOENT") throw err;
        if (this.readOnly) throw notAStore("the directory does not exist");
        await mkdirDurable(root);
        st = await stat(root);
      }
      if (!st.isDirectory()) throw notAStore("it is not a directory");
      let marker: string | undefined;
      try {
        marker = await readFile(join(root, STORE_MARKER), "utf8");
      } catch (err) {
        if (errno(err) !== "ENOENT") throw err;
      }
      if (marker !== undefined) {
        let parsed: unknown;
        try {
          parsed = JSON.parse(marker);
        } catch {
          parsed = undefined;
        }
        const p = parsed as { format?: unknown; version?: unknown } | undefined;
        if (p?.format !== "lifeline-store")
          throw corrupt(`the store marker ${join(root, STORE_MARKER)} is unreadable; if this is a Lifeline store, it is damaged: move it aside`);
        if (p.version !== 1) throw corrupt(`the store at ${root} has format version ${String(p.version)}, this Lifeline reads version 1`);
        return;
      }
      const foreign = (await readdir(root)).filter((n) => !OWN_ENTRY_RE.test(n));
      if (this.readOnly) throw notAStore(`the directory has no ${STORE_MARKER} file`);
      if (foreign.length > 0) {
        const shown = foreign.slice(0, 3).join(", ") + (foreign.length > 3 ? ", ..." : "");
        throw notAStore(
          `the directory is not empty (${shown}) and has no ${STORE_MARKER} file; refusing to write into it. Choose a new or empty --store directory.`,
        );
      }
      // Written under a temporary name and renamed, so a reader never sees half a marker.
      const tmp = join(root, `${STORE_MARKER}.tmp-${randomBytes(4).toString("hex")}`);
      await writeFile(tmp, MARKER_BODY, { flag: "wx" });
      await syncFile(tmp);
      await rename(tmp, join(root, STORE_MARKER));
      await fsyncDir(root);
    } catch (err) {
      throw storeError(err, "opening the store", root);
    }
  }
}

// ---- LevelDB -------------------------------------------------------------------------------

/**
 * {@link KvDb} on classic-level.
 *
 * A failed write breaks the database until it is reopened. When a write fails (ENOSPC on a
 * full disk, EIO), LevelDB may have left part of its record in the log. If the append itself
 * failed, LevelDB goes on accepting writes and appends them after that partial record, where
 * the next open's log reader drops them together with it: writes that were acknowledged as
 * durable are lost (test/store/disk-full.test.ts sees exactly that without the reopen). If
 * the sync failed, LevelDB refuses every further write instead (its "background error" is
 * sticky for the life of the handle). So after any failed write the handle is marked broken, and the next operation (get, write,
 * scan) first closes the database and opens it again: the open replays the log's valid
 * records — everything acknowledged — into a table and starts a fresh log, so nothing is
 * appended after the partial record. The failed write itself was never acknowledged, so it
 * may be there or not, as after a crash. If the reopen fails (the disk is still full: the
 * replay writes a table), that operation rejects with the mapped store error and the next one
 * tries again. Close and reopen are by this process, one right after the other, so the
 * database stays this handle's as before (a process that grabbed the free lock in between
 * would make the reopen fail with `STORE_LOCKED`, like any open of a held database).
 *
 * In snapshot mode the database opened is a private copy (see `snapshot.ts`), deleted by
 * {@link close} (and when opening it fails).
 */
class LevelKv implements KvDb {
  /** The open database; `undefined` while a reopen is under way or after one failed. */
  private db: Level<string, Buffer> | undefined;
  /** A write failed: reopen before the next operation. */
  private broken = false;
  private reopening: Promise<void> | undefined;
  private closed = false;
  /** Operations issued on {@link db}; a reopen waits for them before it closes it. */
  private readonly inflight = new Set<Promise<unknown>>();

  private constructor(
    /** The live database's path (what messages name). */
    readonly location: string,
    /** Where the opened database is: `location`, or the snapshot copy. */
    private readonly dbPath: string,
    private readonly what: string,
    db: Level<string, Buffer>,
    private readonly snapshot: LevelSnapshot | undefined,
  ) {
    this.db = db;
  }

  /**
   * Opens the database at `path`. A missing database is created (if `create`) under a
   * temporary name and renamed into place; an existing one is opened with
   * `createIfMissing: false`, so that a damaged one (no CURRENT file) is reported instead of
   * replaced by an empty one. With `snapshot`, a copy of it is opened instead (never created).
   */
  static async open(path: string, opts: { create: boolean; what: string; snapshot?: boolean }): Promise<LevelKv> {
    let exists = true;
    try {
      await stat(path);
    } catch (err) {
      if (errno(err) !== "ENOENT") throw storeError(err, `opening ${opts.what}`, path);
      exists = false;
    }
    if (!exists) {
      if (!opts.create || opts.snapshot === true) throw new LifelineError("STORE_NOT_FOUND", `opening ${opts.what}: no database at ${path}`);
      await createDatabase(path, opts.what);
    }
    const snapshot = opts.snapshot === true ? await snapshotLevelDb(path, opts.what) : undefined;
    const dbPath = snapshot?.dbPath ?? path;
    const db = newLevel(dbPath);
    try {
      await db.open();
    } catch (err) {
      await snapshot?.remove();
      throw openError(err, path, opts.what);
    }
    return new LevelKv(path, dbPath, opts.what, db, snapshot);
  }

  get(key: string): Promise<Buffer | undefined> {
    return this.run((db) => db.get(key));
  }

  write(ops: readonly KvOp[], opts: { sync: boolean }): Promise<void> {
    const batch = ops.map((op) => (op.type === "put" ? { type: "put" as const, key: op.key, value: op.value } : { type: "del" as const, key: op.key }));
    return this.run(async (db) => {
      try {
        await db.batch(batch, { sync: opts.sync });
      } catch (err) {
        this.broken = true;
        throw err;
      }
    });
  }

  scan(prefix: string, opts: { reverse?: boolean; limit?: number }): Promise<[string, Buffer][]> {
    // Keys are ASCII, so every key with the prefix sorts below prefix + U+FFFF (UTF-8 EF BF BF).
    return this.run((db) => db.iterator({ gte: prefix, lt: prefix + "\uffff", reverse: opts.reverse ?? false, limit: opts.limit ?? -1 }).all());
  }

  async close(): Promise<void> {
    this.closed = true;
    try {
      await this.reopening?.catch(() => undefined);
      await Promise.allSettled([...this.inflight]);
      const db = this.db;
      this.db = undefined;
      await db?.close();
    } finally {
      await this.snapshot?.remove();
    }
  }

  /**
   * Runs `op` on the open database, reopening it first if a write failed. `op` is called
   * synchronously once the database is ready, so a reopen never closes it under an
   * operation that has not been counted in {@link inflight} yet.
   */
  private run<T>(op: (db: Level<string, Buffer>) => Promise<T>): Promise<T> {
    if (this.closed) return Promise.reject(notOpen(`${this.what} (${this.location})`));
    const db = this.db;
    if (!this.broken && db !== undefined && this.reopening === undefined) return this.track(op(db));
    return this.reopenThen(op);
  }

  private async reopenThen<T>(op: (db: Level<string, Buffer>) => Promise<T>): Promise<T> {
    this.reopening ??= this.reopen().finally(() => {
      this.reopening = undefined;
    });
    await this.reopening;
    const db = this.db;
    if (this.closed || db === undefined) throw notOpen(`${this.what} (${this.location})`);
    return this.track(op(db));
  }

  private track<T>(p: Promise<T>): Promise<T> {
    const settled = p.then(
      () => undefined,
      () => undefined,
    );
    this.inflight.add(settled);
    void settled.then(() => this.inflight.delete(settled));
    return p;
  }

  /** Closes the broken database (once operations on it settled) and opens it again. */
  private async reopen(): Promise<void> {
    const old = this.db;
    if (old !== undefined) {
      this.db = undefined;
      await Promise.allSettled([...this.inflight]);
      // Closing may report the same failure again; the reopen is what matters.
      await old.close().catch(() => undefined);
    }
    if (this.closed) return;
    const db = newLevel(this.dbPath);
    try {
      await db.open();
    } catch (err) {
      throw openError(err, this.location, `${this.what} again after a failed write`);
    }
    if (this.closed) {
      await db.close();
      return;
    }
    this.db = db;
    this.broken = false;
  }
}

function newLevel(path: string, opts?: { create?: boolean }): Level<string, Buffer> {
  const create = opts?.create ?? false;
  return new Level<string, Buffer>(path, { keyEncoding: "utf8", valueEncoding: "buffer", createIfMissing: create, errorIfExists: create });
}

async function createDatabase(path: string, what: string): Promise<void> {
  const tmp = `${path}.tmp-${randomBytes(4).toString("hex")}`;
  const db = newLevel(tmp, { create: true });
  try {
    await db.open();
    await db.close();
    await fsyncDir(tmp);
  } catch (err) {
    await rm(tmp, { recursive: true, force: true });
    throw storeError(err, `creating ${what}`, path);
  }
  try {
    await rename(tmp, path);
  } catch (err) {
    // Another process created it first (rename onto a non-empty directory fails): use theirs.
    await rm(tmp, { recursive: true, force: true });
    if (errno(err) !== "ENOTEMPTY" && errno(err) !== "EEXIST") throw storeError(err, `creating ${what}`, path);
    return;
  }
  await fsyncDir(dirname(path));
}

function openError(err: unknown, path: string, what: string): LifelineError {
  const mapped = storeError(err, `opening ${what}`, path);
  if (mapped.code !== "STORE_IO") return mapped;
  // With createIfMissing false, an existing directory that LevelDB will not open (no CURRENT
  // file, an unparsable MANIFEST) is damage, not an I/O failure.
  const causeCode = (err as { cause?: { code?: unknown } }).cause?.code;
  if (causeCode === "LEVEL_IO_ERROR") return mapped;
  return corrupt(
    `opening ${what}: the LevelDB database at ${path} is damaged or incomplete (${deepestMessage(err)}). ` +
      "Move the store directory aside and start the job fresh.",
    err,
  );
}

/** Deletes `<name>.tmp-*` left by a crash while creating a database; call while holding its lock. */
async function removeTempSiblings(dir: string, name: string, kv: LevelKv): Promise<void> {
  try {
    const prefix = `${name}.tmp-`;
    for (const entry of await readdir(dir)) {
      if (entry.startsWith(prefix)) await rm(join(dir, entry), { recursive: true, force: true });
    }
  } catch (err) {
    await kv.close();
    throw storeError(err, "removing a half-created database", dir);
  }
}

// ---- blob files ----------------------------------------------------------------------------

/** {@link BlobDir} on a directory of files. */
class FileBlobDir implements BlobDir {
  constructor(readonly location: string) {}

  pathOf(name: string): string {
    return join(this.location, name);
  }

  async write(name: string, header: Buffer, payload: readonly Uint8Array[], signal?: AbortSignal): Promise<number> {
    signal?.throwIfAborted();
    const path = this.pathOf(name);
    // 'wx': the name carries a random tag, so an existing file is a bug, not something to replace.
    // O_SYNC: each write returns once its bytes (and the file's size) are durable, as a write
    // and an fsync would, in one operation of the thread pool instead of two.
    const fh = await open(path, fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_EXCL | fsConstants.O_SYNC, 0o644);
    // The file's directory entry must be durable before a record may name the file: it exists
    // now, so it is synced while the bytes are written (each step a turn of the event loop, which
    // a program computing between calls may hold for a while).
    const entrySynced = fsyncDir(this.location);
    entrySynced.catch(() => undefined);
    let checksum: number;
    try {
      // The synced write runs in libuv's thread pool; the CRC meanwhile, on the checksum thread
      // for bytes in shared memory (a cpr rank's saved global), else on this thread in slices.
      const durable = writevFully(fh, [header, ...payload], 0);
      const [written, summed] = await Promise.allSettled([durable, crc32OffThread(payload)]);
      if (written.status === "rejected") throw written.reason;
      if (summed.status === "rejected") throw summed.reason;
      checksum = summed.value;
    } catch (err) {
      await Promise.allSettled([fh.close(), entrySynced]); // the write error is the one to report
      await unlink(path).catch(() => undefined); // a partial blob; the next open would delete it anyway
      throw err;
    }
    const [closed, synced] = await Promise.allSettled([fh.close(), entrySynced]);
    if (signal?.aborted === true) {
      await unlink(path).catch(() => undefined);
      signal.throwIfAborted();
    }
    if (closed.status === "rejected") throw closed.reason;
    if (synced.status === "rejected") throw synced.reason;
    return checksum;
  }

  async read(name: string, headerBytes: number, into?: Buffer): Promise<{ header: Buffer; payload: Buffer } | undefined> {
    let fh: FileHandle;
    try {
      fh = await open(this.pathOf(name), "r");
    } catch (err) {
      if (errno(err) === "ENOENT") return undefined;
      throw err;
    }
    try {
      const size = (await fh.stat()).size;
      const header = Buffer.alloc(Math.min(size, headerBytes));
      await readFully(fh, header, 0);
      // A buffer of its own (not a slice after the header), so the part starts aligned.
      const rest = Math.max(0, size - headerBytes);
      const payload = into !== undefined && into.length === rest ? into : Buffer.allocUnsafe(rest);
      await readFully(fh, payload, headerBytes);
      return { header, payload };
    } finally {
      await fh.close();
    }
  }

  async remove(names: readonly string[]): Promise<void> {
    for (const name of names) {
      try {
        await unlink(this.pathOf(name));
      } catch (err) {
        if (errno(err) !== "ENOENT") throw err;
      }
    }
  }

  async list(): Promise<string[]> {
    try {
      return await readdir(this.location);
    } catch (err) {
      if (errno(err) === "ENOENT") return [];
      throw err;
    }
  }
}

/** One writev for header and payload; continues piecewise after a short write. */
async function writevFully(fh: FileHandle, bufs: readonly Uint8Array[], position: number): Promise<void> {
  const total = bufs.reduce((n, b) => n + b.byteLength, 0);
  let done = (await fh.writev(bufs as Uint8Array[], position)).bytesWritten;
  if (done === total) return;
  let start = 0;
  for (const b of bufs) {
    const end = start + b.byteLength;
    if (done < end) {
      await writeFully(fh, b.subarray(Math.max(0, done - start)), position + Math.max(done, start));
      done = end;
    }
    start = end;
  }
}

async function writeFully(fh: FileHandle, buf: Uint8Array, position: number): Promise<void> {
  let done = 0;
  while (done < buf.byteLength) {
    const { bytesWritten } = await fh.write(buf, done, buf.byteLength - done, position + done);
    done += bytesWritten;
  }
}

async function readFully(fh: FileHandle, buf: Buffer, position: number): Promise<void> {
  let done = 0;
  while (done < buf.length) {
    const { bytesRead } = await fh.read(buf, done, buf.length - done, position + done);
    if (bytesRead === 0) throw new Error(`unexpected end of file at byte ${position + done}`);
    done += bytesRead;
  }
}

// ---- fs helpers ----------------------------------------------------------------------------

function errno(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === "string" ? code : undefined;
}

/** fsync of a directory, which makes the creation, rename or deletion of its entries durable. */
async function fsyncDir(path: string): Promise<void> {
  const fh = await open(path, "r");
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

async function syncFile(path: string): Promise<void> {
  const fh = await open(path, "r+");
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

/** mkdir -p, and fsync the parent of every directory it created, so the entries survive a crash. */
async function mkdirDurable(path: string): Promise<void> {
  const first = await mkdir(path, { recursive: true });
  if (first === undefined) return;
  for (let dir = path; ; dir = dirname(dir)) {
    await fsyncDir(dirname(dir));
    if (dir === first || dirname(dir) === dir) break;
  }
}
