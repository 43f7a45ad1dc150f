/**
 * The rank side of the store, written once over a {@link KvDb} and a {@link BlobDir} so that
 * the LevelDB/file store and the in-memory store follow the same rules.
 *
 * Key-value separation (as in WiscKey): a part of at most {@link INLINE_BYTES_MAX} bytes is
 * stored inside its record in the rank's key-value database (one synced write); a larger part
 * goes to a blob file of its own, written and synced *before* the small record that names it.
 * The record is the commit point of a part: a crash before it leaves an unreferenced blob,
 * which the next open deletes; a crash after it leaves a durable part. LevelDB thus never
 * copies large parts into its log and tables, which is where a plain synced 64 MiB put loses
 * about 2x against a file write (the reference row of `node --import tsx bench/store-bench.ts`).
 *
 * Deleting is the reverse: records go first (one synced batch), blob files after; a crash in
 * between leaves unreferenced blobs for the next open.
 *
 * @example
 * const parts = await KvRankPartStore.open({ rank: 0, kv, blobs, nowMs: Date.now, gc: true });
 * const ref = await parts.putPart(1, bytes);
 */
import { randomBytes } from "node:crypto";
import { isLifelineError } from "../errors.ts";
import type { BlobDir, KvDb, KvOp } from "./backend.ts";
import { KvHandle } from "./kv-handle.ts";
import { crc32, formatChecksum } from "./checksum.ts";
import { crc32OffThread, sha256Each } from "./checksum-thread.ts";
import {
  BLOB_HEADER_BYTES,
  BLOB_NAME_RE,
  BLOCK_NAME_RE,
  FORMAT_VERSION,
  PART_PREFIX,
  blobHeader,
  blobName,
  blockName,
  bytesField,
  checkEpoch,
  checkRank,
  checksumField,
  corrupt,
  decodeRecord,
  encodeRecord,
  epochKeyPart,
  epochOfKey,
  parseBlobHeader,
  partKey,
  storeError,
  uintField,
} from "./records.ts";
import {
  BLOCK_BYTES,
  BLOCKED_BYTES_MIN,
  INLINE_BYTES_MAX,
  type BlockOptions,
  type KnownSha256,
  type PartCheck,
  type PartInfo,
  type PartRef,
  type RankPartStore,
} from "./types.ts";

/**
 * A run of a blocked part's bytes (see BLOCKED_BYTES_MIN): a block file, which other parts may
 * name too, or a few bytes kept in the record (the small chunks between large ones).
 * In the record: `{ f: file, n: bytes, h: sha256 }` or `{ d: bytes }`.
 */
type Segment = { readonly file: string; readonly bytes: number; readonly sha256: Buffer } | { readonly data: Buffer };

interface PartRecord extends PartInfo {
  /** The blob file's name when `location` is "blob". */
  readonly blob: string | undefined;
  /** The part's bytes when `location` is "inline". */
  readonly data: Buffer | undefined;
  /** The part's runs when `location` is "blocks". */
  readonly segments: readonly Segment[] | undefined;
}

type Loaded =
  | { readonly kind: "ok"; readonly record: PartRecord; readonly data: Buffer }
  | { readonly kind: "missing"; readonly message: string }
  | { readonly kind: "corrupt"; readonly message: string };

/**
 * Options of {@link KvRankPartStore.open}.
 *
 * @example
 * const opts: KvRankPartStoreOptions = { rank: 0, kv, blobs, nowMs: Date.now, gc: true };
 * const parts = await KvRankPartStore.open(opts);
 */
export interface KvRankPartStoreOptions {
  readonly rank: number;
  readonly kv: KvDb;
  readonly blobs: BlobDir;
  readonly nowMs: () => number;
  /** Delete unreferenced blob files now (false for read-only inspection). */
  readonly gc: boolean;
  /** Reject writes with TypeError (inspection tools). */
  readonly readOnly?: boolean;
  /** Called once when the store is closed, after the database is; releases locks. */
  readonly onClose?: () => void;
}

/**
 * {@link RankPartStore} over a key-value database and a blob directory.
 * Errors as documented on {@link RankPartStore}.
 *
 * @example
 * const parts = await KvRankPartStore.open({ rank, kv, blobs, nowMs: Date.now, gc: true });
 * await parts.close();
 */
export class KvRankPartStore extends KvHandle implements RankPartStore {
  readonly rank: number;
  private readonly blobs: BlobDir;
  private readonly nowMs: () => number;
  /** The block files the records name, by the hex SHA-256 of their bytes; built when first needed, dropped when records go. */
  private blockIndex: Map<string, { file: string; bytes: number }> | undefined;

  // Writes run one at a time, in call order (KvHandle.serial): simpler to reason about than interleaved ones.
  private constructor(opts: KvRankPartStoreOptions) {
    super(opts.kv, { what: `rank ${opts.rank}'s part store`, readOnly: opts.readOnly, onClose: opts.onClose });
    this.rank = opts.rank;
    this.blobs = opts.blobs;
    this.nowMs = opts.nowMs;
  }

  /**
   * Wraps opened backends; with `gc`, first deletes blob files no record references.
   * Rejects with `STORE_IO` (the backends are closed again then).
   *
   * @example
   * const parts = await KvRankPartStore.open({ rank: 2, kv, blobs, nowMs: Date.now, gc: true });
   * parts.rank; // 2
   */
  static async open(opts: KvRankPartStoreOptions): Promise<KvRankPartStore> {
    checkRank(opts.rank);
    const store = new KvRankPartStore(opts);
    if (opts.gc) {
      try {
        await store.collectOrphanBlobs();
      } catch (err) {
        await store.close();
        throw storeError(err, `rank ${opts.rank}: collecting unreferenced blob files`, opts.blobs.location);
      }
    }
    return store;
  }

  async putPart(epoch: number, bytes: Uint8Array | readonly Uint8Array[], signal?: AbortSignal, blocks?: BlockOptions): Promise<PartRef> {
    checkEpoch(epoch);
    const chunks = bytes instanceof Uint8Array ? [bytes] : bytes;
    if (!Array.isArray(chunks) || !chunks.every((c) => c instanceof Uint8Array)) {
      throw new TypeError("putPart: bytes must be a Uint8Array or Buffer, or an array of them");
    }
    let length = 0;
    for (const c of chunks) length += c.byteLength;
    this.checkWritable("putPart");
    this.ensureOpen(); // at call time: writes queued before close() still run
    return this.serial(async () => {
      try {
        // The part it replaces (if any) is looked up while the new one is written.
        const replaced = this.recordOrUndefined(epoch);
        replaced.catch(() => undefined);
        const timeMs = this.nowMs();
        let checksum: number;
        let blob: string | undefined;
        let inline: Buffer | undefined;
        let segments: Segment[] | undefined;
        if (length <= INLINE_BYTES_MAX) {
          inline = Buffer.concat(chunks);
          checksum = crc32(inline);
        } else if (blocks !== undefined && length >= BLOCKED_BYTES_MIN) {
          const summed = crc32OffThread(chunks);
          summed.catch(() => undefined);
          segments = await this.writeBlocks(epoch, chunks, signal, blocks.knownSha256);
          checksum = await summed;
        } else {
          blob = blobName(epoch, randomBytes(4).toString("hex"));
          checksum = await this.blobs.write(blob, blobHeader({ rank: this.rank, epoch, bytes: length }), chunks, signal);
        }
        const old = await replaced;
        const ref: PartRef = { rank: this.rank, epoch, checksum, bytes: length };
        const record = encodeRecord({
          v: FORMAT_VERSION,
          rank: this.rank,
          epoch,
          checksum,
          bytes: length,
          timeMs,
          blob: blob ?? null,
          data: inline ?? null,
          ...(segments === undefined ? {} : { blocks: segments.map((g) => ("data" in g ? { d: g.data } : { f: g.file, n: g.bytes, h: g.sha256 })) }),
        });
        // The commit point of the part: synced, and only after its blob or blocks (if any) are
        // durable. (An abandoned put leaves them unreferenced: the next open deletes them.)
        signal?.throwIfAborted();
        await this.kv.write([{ type: "put", key: partKey(epoch), value: record }], { sync: true });
        if (segments !== undefined && this.blockIndex !== undefined) {
          for (const g of segments) if ("file" in g) this.blockIndex.set(g.sha256.toString("hex"), { file: g.file, bytes: g.bytes });
        }
        if (old !== undefined) {
          // The replaced part's files that no record names now. The new part is already
          // durable, so a failure here must not fail the put: the next open deletes them.
          await this.removeUnreferenced(filesOf(old)).catch(() => undefined);
        }
        return ref;
      } catch (err) {
        throw storeError(err, `rank ${this.rank}: writing its part of line ${epoch}`, this.location);
      }
    });
  }

  /**
   * Writes the block files of a blocked part that the store does not hold yet (see
   * BLOCKED_BYTES_MIN); resolves with the part's runs. A failure removes what it wrote.
   */
  private async writeBlocks(epoch: number, chunks: readonly Uint8Array[], signal: AbortSignal | undefined, known: KnownSha256 | undefined): Promise<Segment[]> {
    const pieces = piecesOf(chunks);
    const index = await this.blocks();
    // The caller's digests where it has them; the others in one pass (not one each: that would
    // hash a large part in one turn of the event loop).
    const given = pieces.map((p) => (p instanceof Uint8Array ? known?.(p) : undefined));
    const missing = pieces.flatMap((p, i) => (p instanceof Uint8Array && given[i] === undefined ? [p] : []));
    const hashed = await sha256Each(missing);
    let next = 0;
    const sums = await Promise.all(
      pieces.map((p, i) => (p instanceof Uint8Array ? (given[i] ?? Promise.resolve(hashed[next++]!)) : Promise.resolve(undefined))),
    );
    const written = new Map<string, string>();
    const writes: Promise<number>[] = [];
    const segments = pieces.map((p, i): Segment => {
      if (!(p instanceof Uint8Array)) return { data: p.data };
      const sha256 = sums[i]!;
      const hex = sha256.toString("hex");
      const held = index.get(hex);
      let file = held !== undefined && held.bytes === p.byteLength ? held.file : written.get(hex);
      if (file === undefined) {
        file = blockName(epoch, randomBytes(4).toString("hex"));
        written.set(hex, file);
        writes.push(this.blobs.write(file, blobHeader({ rank: this.rank, epoch, bytes: p.byteLength }), [p], signal));
      }
      return { file, bytes: p.byteLength, sha256 };
    });
    const failed = (await Promise.allSettled(writes)).find((r) => r.status === "rejected");
    if (failed !== undefined) {
      await this.blobs.remove([...written.values()]).catch(() => undefined);
      throw failed.reason;
    }
    return segments;
  }

  /** The index of the block files the records name (see {@link blockIndex}). */
  private async blocks(): Promise<Map<string, { file: string; bytes: number }>> {
    if (this.blockIndex !== undefined) return this.blockIndex;
    const index = new Map<string, { file: string; bytes: number }>();
    for (const [key, value] of await this.kv.scan(PART_PREFIX, {})) {
      const record = this.recordOf(key, value);
      for (const g of record?.segments ?? []) if ("file" in g) index.set(g.sha256.toString("hex"), { file: g.file, bytes: g.bytes });
    }
    return (this.blockIndex = index);
  }

  /** Deletes those of `files` (blobs, blocks) that no record names. */
  private async removeUnreferenced(files: readonly string[]): Promise<void> {
    if (files.length === 0) return;
    const named = await this.namedFiles();
    this.blockIndex = undefined;
    await this.blobs.remove(files.filter((f) => !named.has(f)));
  }

  async getPart(epoch: number): Promise<Buffer | undefined> {
    checkEpoch(epoch);
    this.ensureOpen();
    const loaded = await this.load(epoch, undefined);
    switch (loaded.kind) {
      case "ok":
        return loaded.data;
      case "missing":
        return undefined;
      case "corrupt":
        throw corrupt(loaded.message);
    }
  }

  async readPart(ref: PartRef): Promise<Buffer> {
    this.checkRef(ref);
    this.ensureOpen();
    const loaded = await this.load(ref.epoch, ref);
    switch (loaded.kind) {
      case "ok":
        return loaded.data;
      case "missing":
      case "corrupt":
        throw corrupt(`${loaded.message}. Recover from an older committed line (latestLine() falls back by itself), or move the store aside to start fresh.`);
    }
  }

  async checkPart(ref: PartRef): Promise<PartCheck> {
    this.checkRef(ref);
    this.ensureOpen();
    const loaded = await this.load(ref.epoch, ref);
    return loaded.kind === "ok" ? { kind: "ok", ref } : { kind: loaded.kind, ref, message: loaded.message };
  }

  async listParts(): Promise<PartInfo[]> {
    this.ensureOpen();
    let rows: [string, Buffer][];
    try {
      rows = await this.kv.scan(PART_PREFIX, {});
    } catch (err) {
      throw storeError(err, `rank ${this.rank}: listing parts`, this.location);
    }
    return rows.map(([key, value]) => {
      const { blob: _blob, data: _data, ...info } = this.decodePart(key, value);
      return info;
    });
  }

  async retain(keep: readonly number[], opts?: { dropNewer?: boolean }): Promise<number[]> {
    if (!Array.isArray(keep)) throw new TypeError("retain: keep must be an array of epochs");
    for (const e of keep) checkEpoch(e, "retain: every kept epoch");
    this.checkWritable("retain");
    const keepSet = new Set(keep);
    const newestKept = keep.length > 0 ? Math.max(...keep) : -1;
    const dropNewer = opts?.dropNewer ?? false;
    this.ensureOpen(); // at call time: writes queued before close() still run
    return this.serial(async () => {
      try {
        const rows = (await this.kv.scan(PART_PREFIX, {})).filter(([key]) => {
          const epoch = epochOfKey(key, PART_PREFIX);
          return epoch !== undefined && !keepSet.has(epoch) && (dropNewer || epoch < newestKept);
        });
        return await this.deleteRecords(rows);
      } catch (err) {
        throw storeError(err, `rank ${this.rank}: deleting old parts`, this.location);
      }
    });
  }

  async dropParts(epochs: readonly number[]): Promise<number[]> {
    if (!Array.isArray(epochs)) throw new TypeError("dropParts: epochs must be an array");
    for (const e of epochs) checkEpoch(e, "dropParts: every epoch");
    this.checkWritable("dropParts");
    const wanted = new Set(epochs);
    this.ensureOpen(); // at call time: writes queued before close() still run
    return this.serial(async () => {
      try {
        const rows = (await this.kv.scan(PART_PREFIX, {})).filter(([key]) => wanted.has(epochOfKey(key, PART_PREFIX) ?? -1));
        return await this.deleteRecords(rows);
      } catch (err) {
        throw storeError(err, `rank ${this.rank}: deleting the parts of line(s) ${epochs.join(", ")}`, this.location);
      }
    });
  }

  /**
   * Deletes part records (one synced batch), then their blob files: a crash in between leaves
   * unreferenced blobs, which the next open deletes. A damaged record is deleted all the same;
   * its blob (unknown now) becomes such an orphan. Resolves to the deleted epochs.
   */
  private async deleteRecords(rows: readonly [string, Buffer][]): Promise<number[]> {
    if (rows.length === 0) return [];
    const files = rows.flatMap(([key, value]) => filesOf(this.recordOf(key, value)));
    await this.kv.write(
      rows.map(([key]): KvOp => ({ type: "del", key })),
      { sync: true },
    );
    // Block files other parts still name stay.
    await this.removeUnreferenced(files);
    return rows.map(([key]) => epochOfKey(key, PART_PREFIX)!);
  }

  private checkRef(ref: PartRef): void {
    if (ref === null || typeof ref !== "object") throw new TypeError("expected a PartRef");
    checkEpoch(ref.epoch, "ref.epoch");
    if (ref.rank !== this.rank) throw new RangeError(`a part of rank ${ref.rank} was asked of rank ${this.rank}'s store`);
  }

  private what(epoch: number): string {
    return `rank ${this.rank}'s part of line ${epoch}`;
  }

  private decodePart(key: string, value: Buffer): PartRecord {
    const keyEpoch = epochOfKey(key, PART_PREFIX);
    const what = `${keyEpoch === undefined ? `rank ${this.rank}'s part record ${JSON.stringify(key)}` : this.what(keyEpoch)} (record in ${this.location})`;
    const rec = decodeRecord(value, what);
    const rank = uintField(rec, "rank", what);
    const epoch = uintField(rec, "epoch", what);
    const bytes = uintField(rec, "bytes", what);
    const checksum = checksumField(rec, "checksum", what);
    const timeMs = uintField(rec, "timeMs", what);
    if (rank !== this.rank) throw corrupt(`${what}: record belongs to rank ${rank}`);
    if (epoch !== keyEpoch) throw corrupt(`${what}: record belongs to line ${epoch}`);
    const data = bytesField(rec, "data", what);
    const blobRaw = rec["blob"];
    let blob: string | undefined;
    if (blobRaw !== null && blobRaw !== undefined) {
      if (typeof blobRaw !== "string" || !BLOB_NAME_RE.test(blobRaw) || !blobRaw.startsWith(epochKeyPart(epoch))) {
        throw corrupt(`${what}: record names an invalid blob file ${JSON.stringify(blobRaw)}`);
      }
      blob = blobRaw;
    }
    const segments = rec["blocks"] === undefined || rec["blocks"] === null ? undefined : segmentsField(rec["blocks"], what);
    if ([blob, data, segments].filter((x) => x !== undefined).length !== 1) throw corrupt(`${what}: record must hold one of the bytes, a blob name or blocks`);
    if (data !== undefined && data.length !== bytes) throw corrupt(`${what}: record holds ${data.length} bytes, says ${bytes}`);
    if (segments !== undefined) {
      const total = segments.reduce((n, g) => n + ("data" in g ? g.data.length : g.bytes), 0);
      if (total !== bytes) throw corrupt(`${what}: record's blocks hold ${total} bytes, it says ${bytes}`);
    }
    const location = blob !== undefined ? "blob" : segments !== undefined ? "blocks" : "inline";
    return { rank, epoch, bytes, checksum, timeMs, location, blob, data, segments };
  }

  /** A record, or undefined if it is unreadable (its files become orphans, which the next open deletes). */
  private recordOf(key: string, value: Buffer): PartRecord | undefined {
    try {
      return this.decodePart(key, value);
    } catch (err) {
      if (isLifelineError(err, "STORE_CORRUPT")) return undefined;
      throw err;
    }
  }

  /** The current record of `epoch`; a damaged one counts as absent (it is being replaced). */
  private async recordOrUndefined(epoch: number): Promise<PartRecord | undefined> {
    const value = await this.kv.get(partKey(epoch));
    if (value === undefined) return undefined;
    try {
      return this.decodePart(partKey(epoch), value);
    } catch (err) {
      if (isLifelineError(err, "STORE_CORRUPT")) return undefined;
      throw err;
    }
  }

  /**
   * Reads and verifies a part: its record, its blob's header against the record, its bytes
   * against the checksum, and all of it against `expected` (the commit record's view).
   * Damage is a result, I/O failure an exception.
   */
  private async load(epoch: number, expected: PartRef | undefined): Promise<Loaded> {
    const what = this.what(epoch);
    let value: Buffer | undefined;
    try {
      value = await this.kv.get(partKey(epoch));
    } catch (err) {
      throw storeError(err, `reading ${what}`, this.location);
    }
    if (value === undefined) return { kind: "missing", message: `${what} is missing: no part record in ${this.location}` };
    let record: PartRecord;
    try {
      record = this.decodePart(partKey(epoch), value);
    } catch (err) {
      if (isLifelineError(err, "STORE_CORRUPT")) return { kind: "corrupt", message: err.message };
      throw err;
    }
    if (expected !== undefined && (expected.checksum !== record.checksum || expected.bytes !== record.bytes)) {
      return {
        kind: "corrupt",
        message:
          `${what} does not match the commit record: the store holds ${record.bytes} bytes with crc32 ${formatChecksum(record.checksum)}, ` +
          `the line was committed with ${expected.bytes} bytes with crc32 ${formatChecksum(expected.checksum)} (the part was rewritten after the commit)`,
      };
    }
    let data: Buffer;
    let where: string;
    if (record.data !== undefined) {
      data = record.data;
      where = `inline record in ${this.location}`;
    } else if (record.segments !== undefined) {
      where = `the block files of ${this.blobs.location}`;
      const read = await this.readBlocks(what, record);
      if (read.kind !== "ok") return read;
      data = read.data;
    } else {
      const blob = record.blob!;
      where = this.blobs.pathOf(blob);
      let file: { header: Buffer; payload: Buffer } | undefined;
      try {
        file = await this.blobs.read(blob, BLOB_HEADER_BYTES);
      } catch (err) {
        throw storeError(err, `reading ${what}`, where);
      }
      if (file === undefined) return { kind: "missing", message: `${what} is missing: blob file ${where} does not exist` };
      const header = parseBlobHeader(file.header);
      if (typeof header === "string") return { kind: "corrupt", message: `${what} is damaged: blob file ${where}: ${header}` };
      if (header.rank !== this.rank || header.epoch !== epoch || header.bytes !== record.bytes) {
        return {
          kind: "corrupt",
          message:
            `${what} is damaged: blob file ${where} describes rank ${header.rank}, line ${header.epoch}, ${header.bytes} bytes; ` +
            `its record says rank ${this.rank}, line ${epoch}, ${record.bytes} bytes`,
        };
      }
      if (file.payload.length !== record.bytes) {
        return {
          kind: "corrupt",
          message: `${what} is damaged: blob file ${where} holds ${file.payload.length} bytes after its header, expected ${record.bytes} (truncated or appended to)`,
        };
      }
      data = file.payload;
    }
    const actual = crc32(data);
    if (actual !== record.checksum) {
      return {
        kind: "corrupt",
        message: `${what} is damaged: checksum mismatch in ${where} (stored crc32 ${formatChecksum(record.checksum)}, computed ${formatChecksum(actual)})`,
      };
    }
    return { kind: "ok", record, data };
  }

  /** A blocked part's bytes, each block checked against its header and the record. */
  private async readBlocks(what: string, record: PartRecord): Promise<{ kind: "ok"; data: Buffer } | Exclude<Loaded, { kind: "ok" }>> {
    const segments = record.segments!;
    const data = Buffer.allocUnsafe(record.bytes);
    const offsets: number[] = [];
    let at = 0;
    for (const g of segments) {
      offsets.push(at);
      at += "data" in g ? g.data.length : g.bytes;
    }
    const results = await Promise.all(
      segments.map(async (g, i): Promise<Exclude<Loaded, { kind: "ok" }> | undefined> => {
        if ("data" in g) {
          g.data.copy(data, offsets[i]);
          return undefined;
        }
        const where = this.blobs.pathOf(g.file);
        const into = data.subarray(offsets[i], offsets[i]! + g.bytes);
        let file: { header: Buffer; payload: Buffer } | undefined;
        try {
          file = await this.blobs.read(g.file, BLOB_HEADER_BYTES, into);
        } catch (err) {
          throw storeError(err, `reading ${what}`, where);
        }
        if (file === undefined) return { kind: "missing", message: `${what} is missing: block file ${where} does not exist` };
        const header = parseBlobHeader(file.header);
        if (typeof header === "string") return { kind: "corrupt", message: `${what} is damaged: block file ${where}: ${header}` };
        if (header.rank !== this.rank || header.bytes !== g.bytes || file.payload.length !== g.bytes) {
          return {
            kind: "corrupt",
            message: `${what} is damaged: block file ${where} describes rank ${header.rank} and ${header.bytes} bytes and holds ${file.payload.length}; its record says rank ${this.rank}, ${g.bytes} bytes`,
          };
        }
        return undefined;
      }),
    );
    return results.find((r) => r !== undefined) ?? { kind: "ok", data };
  }

  /** The blob and block files the records name (an unreadable record names none). */
  private async namedFiles(): Promise<Set<string>> {
    const named = new Set<string>();
    for (const [key, value] of await this.kv.scan(PART_PREFIX, {})) for (const f of filesOf(this.recordOf(key, value))) named.add(f);
    return named;
  }

  private async collectOrphanBlobs(): Promise<void> {
    const referenced = await this.namedFiles();
    // Only files named like our blobs and blocks: anything else in the directory is not ours to delete.
    const orphans = (await this.blobs.list()).filter((name) => (BLOB_NAME_RE.test(name) || BLOCK_NAME_RE.test(name)) && !referenced.has(name));
    if (orphans.length > 0) await this.blobs.remove(orphans);
  }
}

/** The files a record names: its blob, or its block files; none for an unreadable record. */
function filesOf(record: PartRecord | undefined): string[] {
  if (record === undefined) return [];
  if (record.blob !== undefined) return [record.blob];
  return (record.segments ?? []).flatMap((g) => ("file" in g ? [g.file] : []));
}

/**
 * A blocked part's chunks cut into runs (see BLOCKED_BYTES_MIN): pieces of at most BLOCK_BYTES
 * of each chunk of INLINE_BYTES_MAX or more, to be stored as blocks; smaller chunks in between
 * gathered, kept in the record (`{ data }`) or, once they add up to INLINE_BYTES_MAX, a block too.
 */
function piecesOf(chunks: readonly Uint8Array[]): (Uint8Array | { data: Buffer })[] {
  const out: (Uint8Array | { data: Buffer })[] = [];
  let small: Uint8Array[] = [];
  let smallBytes = 0;
  const flush = (): void => {
    if (smallBytes === 0) return;
    const bytes = Buffer.concat(small);
    out.push(smallBytes >= INLINE_BYTES_MAX ? bytes : { data: bytes });
    small = [];
    smallBytes = 0;
  };
  for (const c of chunks) {
    if (c.byteLength < INLINE_BYTES_MAX) {
      small.push(c);
      smallBytes += c.byteLength;
      if (smallBytes >= INLINE_BYTES_MAX) flush();
      continue;
    }
    flush();
    for (let off = 0; off < c.byteLength; off += BLOCK_BYTES) out.push(c.subarray(off, Math.min(off + BLOCK_BYTES, c.byteLength)));
  }
  flush();
  return out;
}

/** A record's `blocks` field; `STORE_CORRUPT` naming `what` when it is malformed. */
function segmentsField(raw: unknown, what: string): Segment[] {
  if (!Array.isArray(raw) || raw.length === 0) throw corrupt(`${what}: field blocks is not a list of runs`);
  return raw.map((g: unknown, i): Segment => {
    const r = g as { f?: unknown; n?: unknown; h?: unknown; d?: unknown } | null;
    if (r !== null && typeof r === "object" && r.d instanceof Uint8Array) return { data: Buffer.from(r.d.buffer, r.d.byteOffset, r.d.byteLength) };
    if (
      r === null ||
      typeof r !== "object" ||
      typeof r.f !== "string" ||
      !BLOCK_NAME_RE.test(r.f) ||
      typeof r.n !== "number" ||
      !Number.isSafeInteger(r.n) ||
      r.n <= 0 ||
      !(r.h instanceof Uint8Array) ||
      r.h.length !== 32
    ) {
      throw corrupt(`${what}: run ${i} of field blocks is neither bytes nor a block file with its size and SHA-256`);
    }
    return { file: r.f, bytes: r.n, sha256: Buffer.from(r.h.buffer, r.h.byteOffset, r.h.byteLength) };
  });
}
