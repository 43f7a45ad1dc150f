/**
 * The two primitives the store logic (`part-store.ts`, `manifest.ts`) is written against, so
 * that the LevelDB/file store and the in-memory store share every rule, record format and
 * error: a key-value database with atomic synced batches, and a directory of write-once blob
 * files. `level-store.ts` implements them with classic-level and `node:fs`,
 * `memory-store.ts` with maps.
 *
 * Backends throw raw errors (OS, LevelDB); the store logic maps them with `storeError`.
 *
 * @example
 * await kv.write([{ type: "put", key: "line/…", value: record }], { sync: true });
 * const crc = await blobs.write("0000000000000007-1a2b3c4d.part", header, bytes);
 */

/**
 * One operation of an atomic batch.
 *
 * @example
 * const ops: KvOp[] = [{ type: "put", key: "line/…", value: rec }, { type: "del", key: "abort/…" }];
 */
export type KvOp = { readonly type: "put"; readonly key: string; readonly value: Buffer } | { readonly type: "del"; readonly key: string };

/**
 * A key-value database with string keys in byte order.
 *
 * @example
 * await kv.write([{ type: "del", key: "part/0000000000000003" }], { sync: true });
 * const rows = await kv.scan("part/", {});
 */
export interface KvDb {
  /** The database's path (or memory name), for messages. */
  readonly location: string;
  get(key: string): Promise<Buffer | undefined>;
  /** Applies all `ops` atomically; with `sync`, durable when resolved. */
  write(ops: readonly KvOp[], opts: { sync: boolean }): Promise<void>;
  /** Entries whose key starts with `prefix`, in key order (or reversed), at most `limit`. */
  scan(prefix: string, opts: { reverse?: boolean; limit?: number }): Promise<[string, Buffer][]>;
  close(): Promise<void>;
}

/**
 * A directory of write-once files, each a fixed-size header and a payload.
 *
 * @example
 * const crc = await blobs.write(name, blobHeader({ rank, epoch, bytes: payload.length }), payload);
 * const back = await blobs.read(name, BLOB_HEADER_BYTES); // { header, payload } or undefined
 */
export interface BlobDir {
  /** The directory's path (or memory name), for messages. */
  readonly location: string;
  /** The path of one blob, for messages. */
  pathOf(name: string): string;
  /**
   * Creates blob `name` (which must not exist) holding `header` and then `payload` (its chunks
   * in order), durably: file and directory entry are synced when it resolves. Returns the
   * payload's CRC-32, which the file backend computes while its synced write runs. With
   * `signal` aborted, it removes the unfinished file and rejects with the signal's reason.
   */
  write(name: string, header: Buffer, payload: readonly Uint8Array[], signal?: AbortSignal): Promise<number>;
  /**
   * The blob's first `headerBytes` bytes and the rest, or `undefined` if it does not exist.
   * With `into`, a rest of exactly `into.length` bytes is read into it (and `payload` is
   * `into`); a rest of another length comes in a buffer of its own, as without.
   */
  read(name: string, headerBytes: number, into?: Buffer): Promise<{ header: Buffer; payload: Buffer } | undefined>;
  /** Deletes blobs; missing ones are ignored. */
  remove(names: readonly string[]): Promise<void>;
  /** Names of all files in the directory. */
  list(): Promise<string[]>;
}
