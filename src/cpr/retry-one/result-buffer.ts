/**
 * The result buffer (results of every collective since the last checkpoint, by seqno) and the
 * bootstrap cache (results of bootstrap collectives, by key, for the job's lifetime).
 *
 * Both check identity on every read: a replayed call must be the same collective (op, root,
 * type, length) at the same (version, seqno) as the one whose result is served. Rabit checked
 * only the seqno, so a restarted rank that ran a bootstrap allreduce got the result of an
 * unrelated broadcast (the "bootstrap operations" problem of Rabit's design notes): its worst
 * bug. Here a
 * mismatch is an error, never a silently mixed result.
 *
 * @example
 * const buf = new ResultBuffer({ entriesMax: 1024, bytesMax: 1 << 20 });
 * buf.add({ version: 3, seqno: 0, ident, result, bytes: 8 }); // throws BufferError when full
 * buf.take(3, 0, ident);                                       // entry, or IdentityError
 */
import type { LifelineErrorCode } from "../../errors.ts";
import { type CacheEntry, type CollIdentity, describeIdentity, type ResultEntry, sameIdentity } from "./types.ts";

/** An operating error of the protocol, carried out of a machine as a `fail` effect. */
export class ProtocolError extends Error {
  constructor(
    readonly code: LifelineErrorCode,
    message: string,
  ) {
    super(message);
  }
}

export class ResultBuffer {
  private versionNow = 0;
  private readonly entries: ResultEntry[] = [];
  private bytesNow = 0;
  /** Seqnos from here on were handed out in a transfer (other code may still hold them). */
  private lentFrom = Infinity;

  constructor(private readonly limits: { readonly entriesMax: number; readonly bytesMax: number }) {}

  /** The version whose results are held (the last committed checkpoint's). */
  get version(): number {
    return this.versionNow;
  }

  /** Results held: seqnos 0..count-1. */
  get count(): number {
    return this.entries.length;
  }

  get bytes(): number {
    return this.bytesNow;
  }

  /**
   * A checkpoint committed: results of older versions are never needed again. Returns the
   * dropped results that were never handed out by {@link from} (their memory may be reused).
   */
  reset(version: number): unknown[] {
    const unlent = this.entries.slice(0, Math.min(this.lentFrom, this.entries.length)).map((e) => e.result);
    this.versionNow = version;
    this.entries.length = 0;
    this.bytesNow = 0;
    this.lentFrom = Infinity;
    return unlent;
  }

  /**
   * Appends the result of (version, seqno), which must be the next one. An entry that is
   * already held must be the same collective (a second source for it, e.g. a transfer).
   */
  add(e: ResultEntry): void {
    if (e.version !== this.versionNow) {
      throw new ProtocolError("CPR_PROTOCOL", `result of version ${e.version} offered to the buffer of version ${this.versionNow}`);
    }
    if (e.seqno < this.entries.length) {
      this.check(this.entries[e.seqno]!, e.version, e.seqno, e.ident);
      return;
    }
    if (e.seqno !== this.entries.length) {
      throw new ProtocolError("CPR_PROTOCOL", `result (version ${e.version}, seqno ${e.seqno}) offered out of order; the buffer holds ${this.entries.length}`);
    }
    if (this.entries.length + 1 > this.limits.entriesMax || this.bytesNow + e.bytes > this.limits.bytesMax) {
      throw new ProtocolError(
        "CPR_CHECKPOINT",
        `retry-one keeps every collective result since the last checkpoint, and version ${e.version} reached ${this.entries.length + 1} results / ${this.bytesNow + e.bytes} bytes (resultEntriesMax ${this.limits.entriesMax}, resultBytesMax ${this.limits.bytesMax}); call checkpoint() more often or raise the limits`,
      );
    }
    this.entries.push(e);
    this.bytesNow += e.bytes;
  }

  /** The held result of (version, seqno), identity-checked (and handed out); undefined when not held. */
  take(version: number, seqno: number, ident: CollIdentity): ResultEntry | undefined {
    if (version !== this.versionNow || seqno >= this.entries.length) return undefined;
    const e = this.entries[seqno]!;
    this.check(e, version, seqno, ident);
    this.lentFrom = Math.min(this.lentFrom, seqno); // served to the program: handed out
    return e;
  }

  /** Entries from `fromSeqno` on, for a transfer: they are handed out (never listed by {@link reset}). */
  from(fromSeqno: number): ResultEntry[] {
    this.lentFrom = Math.min(this.lentFrom, fromSeqno);
    return this.entries.slice(fromSeqno);
  }

  private check(e: ResultEntry, version: number, seqno: number, ident: CollIdentity): void {
    if (e.seqno !== seqno || e.version !== version || !sameIdentity(e.ident, ident)) {
      throw new ProtocolError(
        "CPR_REPLAY",
        `replay diverged at collective (version ${version}, seqno ${seqno}): this call is ${describeIdentity(ident)}, but the collective that ran there was ${describeIdentity(e.ident)}; the program must make the same collective calls after a restart (retry-one needs a deterministic program between checkpoints)`,
      );
    }
  }
}

export class BootstrapCache {
  private readonly entries = new Map<string, CacheEntry>();

  constructor(private readonly entriesMax: number) {}

  get keys(): string[] {
    return [...this.entries.keys()];
  }

  get size(): number {
    return this.entries.size;
  }

  has(key: string): boolean {
    return this.entries.has(key);
  }

  /** Keeps a result for the job's lifetime; a second entry for a key must be the same collective. */
  put(e: CacheEntry): void {
    const old = this.entries.get(e.key);
    if (old !== undefined) {
      this.check(old, e.key, e.ident);
      return;
    }
    if (this.entries.size + 1 > this.entriesMax) {
      throw new ProtocolError(
        "MPI_BOOTSTRAP",
        `more than ${this.entriesMax} bootstrap collectives (cacheEntriesMax); bootstrap collectives are for the few calls before the main loop`,
      );
    }
    this.entries.set(e.key, e);
  }

  /** The cached result of `key`, identity-checked; undefined when not cached. */
  get(key: string, ident: CollIdentity): CacheEntry | undefined {
    const e = this.entries.get(key);
    if (e === undefined) return undefined;
    this.check(e, key, ident);
    return e;
  }

  pick(keys: readonly string[]): CacheEntry[] {
    return keys.map((k) => this.entries.get(k)).filter((e): e is CacheEntry => e !== undefined);
  }

  private check(e: CacheEntry, key: string, ident: CollIdentity): void {
    if (!sameIdentity(e.ident, ident)) {
      throw new ProtocolError(
        "CPR_REPLAY",
        `bootstrap key ${JSON.stringify(key)} is ${describeIdentity(ident)} here, but it was ${describeIdentity(e.ident)} when its result was cached; give each bootstrap collective its own key`,
      );
    }
  }
}
