/**
 * The result buffer (results of every collective that some rank's safe checkpoint has not yet
 * passed, by collective index) and the bootstrap cache (results of bootstrap collectives, by
 * key, for the job's lifetime).
 *
 * Both check identity on every read: a replayed call must be the same collective (op, root,
 * type, length) at the same collective index as the one whose result is served. Rabit checked
 * only the seqno, so a restarted rank that ran a bootstrap allreduce got the result of an
 * unrelated broadcast (the "bootstrap operations" problem of Rabit's design notes): its worst
 * bug. Here a
 * mismatch is an error, never a silently mixed result.
 *
 * @example
 * const buf = new ResultBuffer({ entriesMax: 1024, bytesMax: 1 << 20 });
 * buf.add({ index: 0, ident, result, bytes: 8 }); // throws ProtocolError when full
 * buf.take(0, ident);                               // the entry, or CPR_REPLAY on another identity
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
  /** Index of entries[0]: results below it were dropped (every rank checkpointed past them). */
  private base = 0;
  private readonly entries: ResultEntry[] = [];
  private bytesNow = 0;
  /** Indices handed out (served or sent: other code may still hold their results). */
  private readonly lent = new Set<number>();

  constructor(private readonly limits: { readonly entriesMax: number; readonly bytesMax: number }) {}

  /** Results held: indices from..to-1. */
  get from(): number {
    return this.base;
  }

  get to(): number {
    return this.base + this.entries.length;
  }

  get count(): number {
    return this.entries.length;
  }

  get bytes(): number {
    return this.bytesNow;
  }

  /**
   * No rank can need results below `index` any more (every rank's safe checkpoint is past
   * them). Returns the dropped results that were never handed out (their memory may be reused).
   */
  dropBelow(index: number): unknown[] {
    const n = Math.min(Math.max(0, index - this.base), this.entries.length);
    if (n === 0) return [];
    const unlent: unknown[] = [];
    for (let i = 0; i < n; i++) {
      const e = this.entries[i]!;
      this.bytesNow -= e.bytes;
      if (!this.lent.delete(e.index)) unlent.push(e.result);
    }
    this.entries.splice(0, n);
    this.base += n;
    return unlent;
  }

  /** Starts over at `index` (a restored rank: what it holds begins at its checkpoint). */
  resetTo(index: number): void {
    this.entries.length = 0;
    this.bytesNow = 0;
    this.base = index;
    this.lent.clear();
  }

  /**
   * Appends the result of collective `index`, which must be the next one. An entry that is
   * already held must be the same collective (a second source for it, e.g. a transfer).
   * `received`: it came from another rank (its memory is not ours to reuse when dropped).
   */
  add(e: ResultEntry, received = false): void {
    if (e.index < this.base) return; // below every checkpoint: nobody will ask for it
    if (e.index < this.to) {
      this.check(this.entries[e.index - this.base]!, e.index, e.ident);
      return;
    }
    if (e.index !== this.to) {
      throw new ProtocolError("CPR_PROTOCOL", `result of collective #${e.index} offered out of order; the buffer holds #${this.base}..#${this.to - 1}`);
    }
    if (this.entries.length + 1 > this.limits.entriesMax || this.bytesNow + e.bytes > this.limits.bytesMax) {
      throw new ProtocolError(
        "CPR_CHECKPOINT",
        `retry-one keeps every collective result since the oldest rank's checkpoint, and that reached ${this.entries.length + 1} results / ${this.bytesNow + e.bytes} bytes (resultEntriesMax ${this.limits.entriesMax}, resultBytesMax ${this.limits.bytesMax}); every rank must call checkpoint() more often, or raise the limits`,
      );
    }
    this.entries.push(e);
    this.bytesNow += e.bytes;
    if (received) this.lent.add(e.index);
  }

  /** The held result of collective `index`, identity-checked (and handed out); undefined when not held. */
  take(index: number, ident: CollIdentity): ResultEntry | undefined {
    if (index < this.base || index >= this.to) return undefined;
    const e = this.entries[index - this.base]!;
    this.check(e, index, ident);
    this.lent.add(index); // served to the program: handed out
    return e;
  }

  /** Entries from `index` on, for a transfer: they are handed out (never listed by {@link dropBelow}). */
  slice(index: number): ResultEntry[] {
    const out = this.entries.slice(Math.max(index, this.base) - this.base);
    for (const e of out) this.lent.add(e.index);
    return out;
  }

  private check(e: ResultEntry, index: number, ident: CollIdentity): void {
    if (e.index !== index || !sameIdentity(e.ident, ident)) {
      throw new ProtocolError(
        "CPR_REPLAY",
        `replay diverged at collective #${index}: this call is ${describeIdentity(ident)}, but the collective that ran there was ${describeIdentity(e.ident)}; the program must make the same collective calls after a restart (retry-one needs a program that is deterministic apart from what the library logs)`,
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
