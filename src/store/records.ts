/**
 * On-disk formats shared by both stores: keys, checksummed records, the blob file header,
 * argument checks and the mapping of backend errors to `STORE_*` codes.
 *
 * Every record is `msgpack(body) ++ crc32(msgpack(body))` (4 bytes, little-endian): LevelDB
 * checksums its own blocks, but it silently skips damaged log records unless paranoid checks
 * are on (classic-level does not expose them), and a record that decodes to the wrong shape is
 * damage too. Decoding checks the checksum, the shape and that the record belongs under its
 * key, and says `STORE_CORRUPT` otherwise.
 *
 * @example
 * const buf = encodeRecord({ v: 1, epoch: 7 });
 * decodeRecord(buf, "line 7 in /s/manifest"); // { v: 1, epoch: 7 }
 */
import { Packr } from "msgpackr";
import { LifelineError, isLifelineError } from "../errors.ts";
import { crc32, formatChecksum } from "./checksum.ts";

/** Record format version, in every record's `v` field; a reader rejects other versions. */
export const FORMAT_VERSION = 1;

const packr = new Packr({ useRecords: false, structuredClone: false, moreTypes: false });

/**
 * An epoch as 16 zero-padded hex digits, so that LevelDB's byte order is numeric order.
 * Never throws (callers check the epoch first).
 *
 * @example
 * epochKeyPart(255); // "00000000000000ff"
 * partKey(255);      // "part/00000000000000ff"
 */
export function epochKeyPart(epoch: number): string {
  return epoch.toString(16).padStart(16, "0");
}

/** Key prefix of part records in a rank's database. */
export const PART_PREFIX = "part/";
/** Key prefix of commit records in the manifest. */
export const LINE_PREFIX = "line/";
/** Key prefix of abort markers in the manifest. */
export const ABORT_PREFIX = "abort/";
/** Key of the job record in the manifest (no epoch; sorts apart from the prefixed keys). */
export const JOB_KEY = "job";

/** Key of rank's part record of `epoch` (see {@link epochKeyPart}). */
export function partKey(epoch: number): string {
  return PART_PREFIX + epochKeyPart(epoch);
}
/** Key of line `epoch`'s commit record (see {@link epochKeyPart}). */
export function lineKey(epoch: number): string {
  return LINE_PREFIX + epochKeyPart(epoch);
}
/** Key of line `epoch`'s abort marker (see {@link epochKeyPart}). */
export function abortKey(epoch: number): string {
  return ABORT_PREFIX + epochKeyPart(epoch);
}

/**
 * The epoch in a key made by the functions above, or `undefined` if it is not one.
 * Never throws.
 *
 * @example
 * epochOfKey("line/0000000000000007", LINE_PREFIX); // 7
 * epochOfKey("line/7", LINE_PREFIX);                // undefined
 */
export function epochOfKey(key: string, prefix: string): number | undefined {
  const hex = key.slice(prefix.length);
  if (!key.startsWith(prefix) || !/^[0-9a-f]{16}$/.test(hex)) return undefined;
  const n = parseInt(hex, 16);
  return Number.isSafeInteger(n) ? n : undefined;
}

/**
 * `msgpack(body) ++ crc32` (see the file comment). Never throws for plain objects of
 * numbers, strings, null and bytes.
 *
 * @example
 * const buf = encodeRecord({ v: FORMAT_VERSION, epoch: 3 });
 * decodeRecord(buf, "test")["epoch"]; // 3
 */
export function encodeRecord(body: object): Buffer {
  const packed = packr.pack(body);
  const out = Buffer.allocUnsafe(packed.length + 4);
  packed.copy(out, 0);
  out.writeUInt32LE(crc32(packed), packed.length);
  return out;
}

/**
 * Checks and unpacks a record. `what` names it for the error ("line 7 in /s/manifest").
 * Throws `STORE_CORRUPT` if it is truncated, fails its checksum, is not a msgpack object, or
 * has another format version.
 *
 * @example
 * decodeRecord(encodeRecord({ v: 1, x: 2 }), "a record"); // { v: 1, x: 2 }
 * decodeRecord(Buffer.from("junk"), "a record");          // throws STORE_CORRUPT
 */
export function decodeRecord(buf: Uint8Array, what: string): Record<string, unknown> {
  const b = Buffer.from(buf.buffer, buf.byteOffset, buf.byteLength);
  if (b.length < 5) throw corrupt(`${what}: record is truncated (${b.length} bytes)`);
  const body = b.subarray(0, b.length - 4);
  const stored = b.readUInt32LE(b.length - 4);
  const actual = crc32(body);
  if (stored !== actual) {
    throw corrupt(`${what}: record checksum mismatch (stored ${formatChecksum(stored)}, computed ${formatChecksum(actual)})`);
  }
  let value: unknown;
  try {
    value = packr.unpack(body);
  } catch (err) {
    throw corrupt(`${what}: record is not valid msgpack (${(err as Error).message})`, err);
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) throw corrupt(`${what}: record is not an object`);
  const rec = value as Record<string, unknown>;
  if (rec["v"] !== FORMAT_VERSION) {
    throw corrupt(`${what}: record format version ${String(rec["v"])} is not ${FORMAT_VERSION} (written by another Lifeline version?)`);
  }
  return rec;
}

/**
 * A field of a decoded record that must be a non-negative safe integer; `STORE_CORRUPT`
 * naming `what` and the field otherwise.
 *
 * @example
 * uintField({ epoch: 7 }, "epoch", "line 7"); // 7
 * uintField({ epoch: -1 }, "epoch", "line 7"); // throws STORE_CORRUPT
 */
export function uintField(rec: Record<string, unknown>, name: string, what: string): number {
  const v = rec[name];
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0) throw corrupt(`${what}: field ${name} is ${JSON.stringify(v)}, not a non-negative integer`);
  return v;
}

/**
 * A field that must be a 32-bit unsigned checksum; `STORE_CORRUPT` otherwise.
 *
 * @example
 * checksumField({ checksum: 0xcbf43926 }, "checksum", "line 7"); // 3421780262
 * checksumField({ checksum: 2 ** 32 }, "checksum", "line 7");   // throws STORE_CORRUPT
 */
export function checksumField(rec: Record<string, unknown>, name: string, what: string): number {
  const v = uintField(rec, name, what);
  if (v > 0xffffffff) throw corrupt(`${what}: field ${name} is not a 32-bit checksum`);
  return v;
}

/**
 * A field that must be bytes, or null/absent (`undefined`); `STORE_CORRUPT` otherwise.
 *
 * @example
 * bytesField({ meta: null }, "meta", "line 7");               // undefined
 * bytesField({ meta: Buffer.from("x") }, "meta", "line 7");  // <Buffer 78>
 */
export function bytesField(rec: Record<string, unknown>, name: string, what: string): Buffer | undefined {
  const v = rec[name];
  if (v === null || v === undefined) return undefined;
  if (!(v instanceof Uint8Array)) throw corrupt(`${what}: field ${name} is not bytes`);
  return Buffer.from(v.buffer, v.byteOffset, v.byteLength);
}

// ---- blob files -----------------------------------------------------------------------------

/**
 * A blob file is a 64-byte header followed by the part's bytes. The header makes a blob
 * self-describing (which rank, which line, how long), so a blob that ends up under the wrong
 * record, or is truncated, is caught before its bytes are trusted, and a person can tell what
 * a stray file is. 64 bytes keep the payload 8-byte aligned in the file.
 *
 * The payload's CRC-32 is not in the header but in the part record (and the commit record):
 * so the CRC can be computed while the file is written and fsynced, instead of the header
 * write — and the fsync after it — waiting for the CRC.
 *
 *   0  8  magic "LLPART\0\x02"
 *   8  4  rank (u32 LE)
 *  12  8  epoch (u64 LE)
 *  20  8  payload bytes (u64 LE)
 *  28 32  zero
 *  60  4  crc32 of bytes 0..59
 */
export const BLOB_HEADER_BYTES = 64;
/** Bytes 0..7 of every blob file. */
const BLOB_MAGIC = Buffer.from("LLPART\0\x02", "latin1");

/**
 * What a blob header says about its part.
 *
 * @example
 * const info: BlobHeaderInfo = { rank: 1, epoch: 7, bytes: 100 };
 * parseBlobHeader(blobHeader(info)); // { rank: 1, epoch: 7, bytes: 100 }
 */
export interface BlobHeaderInfo {
  readonly rank: number;
  readonly epoch: number;
  readonly bytes: number;
}

/**
 * The header of a blob file holding the part `info` describes. Never throws for valid input.
 *
 * @example
 * const h = blobHeader({ rank: 1, epoch: 7, bytes: 100 });
 * parseBlobHeader(h); // { rank: 1, epoch: 7, bytes: 100 }
 */
export function blobHeader(info: BlobHeaderInfo): Buffer {
  const h = Buffer.alloc(BLOB_HEADER_BYTES);
  BLOB_MAGIC.copy(h, 0);
  h.writeUInt32LE(info.rank, 8);
  h.writeBigUInt64LE(BigInt(info.epoch), 12);
  h.writeBigUInt64LE(BigInt(info.bytes), 20);
  h.writeUInt32LE(crc32(h.subarray(0, 60)), 60);
  return h;
}

/**
 * Parses a blob header; a string says what is wrong with it (never throws: damage is a
 * result here, reported by the caller with the file's path).
 *
 * @example
 * parseBlobHeader(Buffer.alloc(64)); // "not a Lifeline part file (bad magic)"
 * parseBlobHeader(blobHeader(info)); // info
 */
export function parseBlobHeader(h: Buffer): BlobHeaderInfo | string {
  if (h.length < BLOB_HEADER_BYTES) return `header truncated (${h.length} of ${BLOB_HEADER_BYTES} bytes)`;
  if (!h.subarray(0, 8).equals(BLOB_MAGIC)) return "not a Lifeline part file (bad magic)";
  if (h.readUInt32LE(60) !== crc32(h.subarray(0, 60))) return "header checksum mismatch";
  const epoch = Number(h.readBigUInt64LE(12));
  const bytes = Number(h.readBigUInt64LE(20));
  return { rank: h.readUInt32LE(8), epoch, bytes };
}

/**
 * A blob's file name: the epoch, then a random tag, so that a rewrite of the same epoch gets
 * a fresh file and the old one stays valid until the new record replaces it.
 *
 * @example
 * blobName(7, "1a2b3c4d"); // "0000000000000007-1a2b3c4d.part"
 * BLOB_NAME_RE.test(blobName(7, "1a2b3c4d")); // true
 */
export function blobName(epoch: number, tag: string): string {
  return `${epochKeyPart(epoch)}-${tag}.part`;
}

/** What {@link blobName} makes; garbage collection deletes only files named like this. */
export const BLOB_NAME_RE = /^[0-9a-f]{16}-[0-9a-f]{8}\.part$/;

/**
 * A block file's name (see BLOCKED_BYTES_MIN): the epoch of the part that first wrote it, then
 * a random tag. It has the header of a blob file (its rank, that epoch, its bytes).
 *
 * @example
 * blockName(7, "1a2b3c4d"); // "0000000000000007-1a2b3c4d.blk"
 */
export function blockName(epoch: number, tag: string): string {
  return `${epochKeyPart(epoch)}-${tag}.blk`;
}

/** What {@link blockName} makes; garbage collection deletes only files named like this (or like blobs). */
export const BLOCK_NAME_RE = /^[0-9a-f]{16}-[0-9a-f]{8}\.blk$/;

// ---- arguments and errors -------------------------------------------------------------------

/**
 * Argument check: a non-negative safe integer, else `RangeError`.
 *
 * @example
 * checkEpoch(3);                     // ok
 * checkEpoch(-1, "retain: epoch");   // throws RangeError
 */
export function checkEpoch(epoch: unknown, what = "epoch"): asserts epoch is number {
  if (typeof epoch !== "number" || !Number.isSafeInteger(epoch) || epoch < 0) {
    throw new RangeError(`${what} must be a non-negative safe integer, got ${String(epoch)}`);
  }
}

/**
 * Argument check: an integer in 0..2^32-1 (it goes into a blob header's u32), else
 * `RangeError`.
 *
 * @example
 * checkRank(0);  // ok
 * checkRank(-1); // throws RangeError
 */
export function checkRank(rank: unknown): asserts rank is number {
  if (typeof rank !== "number" || !Number.isInteger(rank) || rank < 0 || rank > 0xffffffff) {
    throw new RangeError(`rank must be an integer in 0..2^32-1, got ${String(rank)}`);
  }
}

/**
 * A `STORE_CORRUPT` error (to throw).
 *
 * @example
 * throw corrupt("line 7: record checksum mismatch");
 * throw corrupt("the database is damaged", levelErr);
 */
export function corrupt(message: string, cause?: unknown): LifelineError {
  return new LifelineError("STORE_CORRUPT", message, cause === undefined ? undefined : { cause });
}

/**
 * A `STORE_NOT_OPEN` error (to throw) for a closed handle.
 *
 * @example
 * throw notOpen("the line manifest (/s/manifest)");
 * // "the line manifest (/s/manifest) is closed; open it again before using it"
 */
export function notOpen(what: string): LifelineError {
  return new LifelineError("STORE_NOT_OPEN", `${what} is closed; open it again before using it`);
}

/** The `code` of a Node or LevelDB error, looking through abstract-level's wrapper. */
function codesOf(err: unknown): string[] {
  const out: string[] = [];
  for (let e = err, depth = 0; e !== null && typeof e === "object" && depth < 4; e = (e as { cause?: unknown }).cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string") out.push(code);
  }
  return out;
}

/**
 * Maps a backend failure to a `STORE_*` error: LevelDB's lock error to `STORE_LOCKED`, its
 * corruption error to `STORE_CORRUPT`, anything else to `STORE_IO` (the original as `cause`).
 * `doing` says what we were doing, `path` where. `LifelineError`s pass through unchanged.
 *
 * @example
 * try { await db.open(); } catch (err) { throw storeError(err, "opening the manifest", path); }
 * storeError(Object.assign(new Error("x"), { code: "EIO" }), "reading", "/s").code; // "STORE_IO"
 */
export function storeError(err: unknown, doing: string, path: string): LifelineError {
  if (isLifelineError(err)) return err;
  const codes = codesOf(err);
  const detail = deepestMessage(err);
  if (codes.includes("LEVEL_LOCKED")) {
    return new LifelineError(
      "STORE_LOCKED",
      `${doing}: ${path} is locked by another process or handle (${detail}). ` +
        "Is another job, rank or `lifeline lines` using this store? Wait for it to end or use another --store.",
      { cause: err },
    );
  }
  if (codes.includes("LEVEL_CORRUPTION")) {
    return corrupt(
      `${doing}: the LevelDB database at ${path} is damaged (${detail}). ` +
        "Move the store directory aside and start the job fresh; its recovery lines cannot be trusted.",
      err,
    );
  }
  return new LifelineError("STORE_IO", `${doing}: I/O error at ${path}: ${detail}`, { cause: err });
}

/**
 * The innermost message of an error chain (LevelDB's own words under abstract-level's).
 *
 * @example
 * deepestMessage(new Error("Database failed to open", { cause: new Error("IO error: lock") })); // "IO error: lock"
 * deepestMessage("plain"); // "plain"
 */
export function deepestMessage(err: unknown): string {
  let msg = err instanceof Error ? err.message : String(err);
  for (let e = err, depth = 0; e instanceof Error && depth < 4; e = e.cause, depth++) msg = e.message;
  return msg;
}
