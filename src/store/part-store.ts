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
import {
  BLOB_HEADER_BYTES,
  BLOB_NAME_RE,
  FORMAT_VERSION,
  PART_PREFIX,
  blobHeader,
  blobName,
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
import { INLINE_BYTES_MAX, type PartCheck, type PartInfo, type PartRef, type RankPartStore } from "./types.ts";

interface PartRecord extends PartInfo {
  /** The blob file's name when `location` is "blob". */
  readonly blob: string | undefined;
  /** The part's bytes when `location` is "inline". */
  readonly data: Buffer | undefined;
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

  async putPart(epoch: number, bytes: Uint8Array | readonly Uint8Array[], signal?: AbortSignal): Promise<PartRef> {
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
        if (length <= INLINE_BYTES_MAX) {
          inline = Buffer.concat(chunks);
          checksum = crc32(inline);
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
        });
        // The commit point of the part: synced, and only after its blob (if any) is durable.
        // (An abandoned put leaves its blob unreferenced: the next open deletes it.)
        signal?.throwIfAborted();
        await this.kv.write([{ type: "put", key: partKey(epoch), value: record }], { sync: true });
        if (old?.blob !== undefined && old.blob !== blob) {
          // The replaced part's blob is unreferenced now. The new part is already durable, so a
          // failure here must not fail the put: the next open deletes unreferenced blobs.
          await this.blobs.remove([old.blob]).catch(() => undefined);
        }
        return ref;
      } catch (err) {
        throw storeError(err, `rank ${this.rank}: writing its part of line ${epoch}`, this.location);
      }
    });
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
    const blobs = rows.flatMap(([key, value]) => {
      const blob = this.blobOfRecord(key, value);
      return blob === undefined ? [] : [blob];
    });
    await this.kv.write(
      rows.map(([key]): KvOp => ({ type: "del", key })),
      { sync: true },
    );
    await this.blobs.remove(blobs);
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
    if ((blob === undefined) === (data === undefined)) throw corrupt(`${what}: record must hold either the bytes or a blob name`);
    if (data !== undefined && data.length !== bytes) throw corrupt(`${what}: record holds ${data.length} bytes, says ${bytes}`);
    return { rank, epoch, bytes, checksum, timeMs, location: blob === undefined ? "inline" : "blob", blob, data };
  }

  /** The blob a record names, or undefined if the record is inline or unreadable. */
  private blobOfRecord(key: string, value: Buffer): string | undefined {
    try {
      return this.decodePart(key, value).blob;
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

  private async collectOrphanBlobs(): Promise<void> {
    const referenced = new Set<string>();
    for (const [key, value] of await this.kv.scan(PART_PREFIX, {})) {
      const blob = this.blobOfRecord(key, value);
      if (blob !== undefined) referenced.add(blob);
    }
    // Only files named like our blobs: anything else in the directory is not ours to delete.
    const orphans = (await this.blobs.list()).filter((name) => BLOB_NAME_RE.test(name) && !referenced.has(name));
    if (orphans.length > 0) await this.blobs.remove(orphans);
  }
}
