/**
 * Bookkeeping of collective calls: sequence numbers, the inbox of collective messages keyed by
 * (sequence, source, step), and mismatch detection.
 *
 * Ranks that call different collectives (or the same one with different roots, ops, types or
 * lengths) must get an error, never a hang and never a silently mixed result. Three checks
 * together catch every mismatch:
 * 1. each collective message carries its call's signature; a receiver with another signature
 *    fails at once;
 * 2. a message for a collective this rank has already finished (or that is still unread when
 *    it finishes) means the sender ran a different algorithm: fail at once;
 * 3. a collective blocked for longer than `QUERY_AFTER_MS` asks its peers for their signature
 *    of the same sequence number (the layer answers; the program is not involved): a
 *    disagreement fails it. This catches the mismatches in which nobody receives a wrong
 *    message, e.g. a gather where two ranks both believe they are the root.
 *
 * @example
 * const c = reg.begin("bcast", ["root=0"]);  // → { seq, signature, call }
 * await reg.recv(c, source, step);           // rejects MPI_COLLECTIVE_MISMATCH on disagreement
 * reg.end(c);
 */
import { LifelineError } from "../errors.ts";
import { byteLengthOf } from "./codec.ts";
import type { Arrival } from "./collectives.ts";
import { StableMap } from "./stable-map.ts";

/** After this long blocked in one collective, a rank asks its peers for their signatures. */
export const QUERY_AFTER_MS = 1000;
/** Signatures of finished collectives kept for peers' queries. */
export const HISTORY_MAX = 4096;

export interface ActiveCollective {
  readonly seq: number;
  readonly signature: number;
  /** Human description, e.g. `bcast(root=1)`. */
  readonly call: string;
  readonly startedMs: number;
  nextQueryMs: number;
  /** Fails the collective: its pending receives reject with `err`, and so do later ones. */
  fail: (err: LifelineError) => void;
  /** Why the collective failed (the first error given to {@link fail}). */
  error: LifelineError | undefined;
}

export class CollectiveRegistry {
  private nextSeq = 0;
  // Every collective adds and deletes entries here: StableMaps, not Maps (see stable-map.ts).
  private readonly inbox = new StableMap<string, Arrival>();
  private inboxBytes = 0;
  private readonly unreadBySeq = new StableMap<number, number>();
  private readonly waiters = new StableMap<string, { resolve: (a: Arrival) => void; reject: (e: unknown) => void }>();
  private readonly active = new StableMap<number, ActiveCollective>();
  /** The last HISTORY_MAX finished collectives, by seq % HISTORY_MAX (a ring: nothing allocated per call). */
  private readonly historySeq = new Float64Array(HISTORY_MAX).fill(-1);
  private readonly historySignature = new Uint32Array(HISTORY_MAX);
  private readonly historyCall = new Array<string>(HISTORY_MAX).fill("");

  /**
   * retry-one: a filed message may be superseded by one with the same (sequence, source,
   * step) from a newer view (the older belongs to an abandoned execution); see {@link arrive}.
   */
  supersede = false;

  constructor(private readonly rank: number) {}

  /** Number of collectives started so far (the next sequence number). */
  get started(): number {
    return this.nextSeq;
  }

  /** Collectives started here and not finished yet. */
  get activeCount(): number {
    return this.active.size;
  }

  /** Bytes of the messages filed and not read yet (they count against the bound on unmatched messages). */
  get filedBytes(): number {
    return this.inboxBytes;
  }

  /** Messages of collectives not started yet, in arrival order (for a checkpoint). */
  inboxInOrder(): Arrival[] {
    return [...this.inbox.values()];
  }

  /** A restored rank continues its collective numbering from its checkpoint. */
  restoreNextSeq(seq: number): void {
    this.nextSeq = seq;
  }

  begin(signature: number, call: string, nowMs: number): ActiveCollective {
    const seq = this.nextSeq++;
    // No promise per call for the failure and no race per receive: fail() rejects the
    // waiting receives itself, and later ones see `error`.
    const c: ActiveCollective = {
      seq,
      signature,
      call,
      startedMs: nowMs,
      nextQueryMs: nowMs + QUERY_AFTER_MS,
      error: undefined,
      fail: (err) => {
        c.error ??= err;
        this.rejectWaiters(seq, c.error);
      },
    };
    this.active.set(seq, c);
    return c;
  }

  /** Rejects every receive of collective `seq` waiting for a message. */
  private rejectWaiters(seq: number, err: unknown): void {
    if (this.waiters.size === 0) return;
    const prefix = `${seq}.`;
    for (const [key, w] of this.waiters) {
      if (key.startsWith(prefix)) {
        this.waiters.delete(key);
        w.reject(err);
      }
    }
  }

  /** The collective finished on this rank. Throws if a peer's message for it is still unread. */
  end(c: ActiveCollective): void {
    this.active.delete(c.seq);
    const slot = c.seq % HISTORY_MAX;
    this.historySeq[slot] = c.seq;
    this.historySignature[slot] = c.signature;
    this.historyCall[slot] = c.call;
    const unread = this.unreadBySeq.get(c.seq);
    if (unread !== undefined && unread > 0) {
      const source = this.firstUnreadSource(c.seq);
      throw this.stray(c.seq, source, c.call);
    }
  }

  private firstUnreadSource(seq: number): number {
    for (const [key, a] of this.inbox) if (key.startsWith(`${seq}.`)) return a.header.source;
    return -1;
  }

  private stray(seq: number, source: number, call: string): LifelineError {
    return new LifelineError(
      "MPI_COLLECTIVE_MISMATCH",
      `collective #${seq}: rank ${source} sent this rank a message that ${call} on rank ${this.rank} does not use, so the two ran different collectives (kind, root, op, type or length differ); every rank must make the same collective calls in the same order`,
    );
  }

  /**
   * A collective message arrived. Returns an error if it is a stray (its collective already
   * finished here); the caller then fails the job.
   */
  arrive(a: Arrival, step: number): LifelineError | undefined {
    const seq = a.header.collSeq;
    if (seq < this.nextSeq && !this.active.has(seq)) {
      return this.stray(seq, a.header.source, this.history(seq)?.call ?? "the collective");
    }
    const key = `${seq}.${a.header.source}.${step}`;
    const w = this.waiters.get(key);
    if (w !== undefined) {
      this.waiters.delete(key);
      w.resolve(a);
      return undefined;
    }
    const filed = this.inbox.get(key);
    if (this.supersede && filed !== undefined) {
      // The newer view's frame wins; the abandoned execution's is void (counted once).
      if (a.header.epoch >= filed.header.epoch) {
        this.inbox.set(key, a);
        this.inboxBytes += byteLengthOf(a.frames) - byteLengthOf(filed.frames);
      }
      return undefined;
    }
    if (filed !== undefined) this.inboxBytes -= byteLengthOf(filed.frames);
    this.inbox.set(key, a);
    this.inboxBytes += byteLengthOf(a.frames);
    this.unreadBySeq.set(seq, (this.unreadBySeq.get(seq) ?? 0) + 1);
    return undefined;
  }

  /** The message of collective `c` from `source` at `step`, signature-checked. */
  recv(c: ActiveCollective, source: number, step: number): Promise<Arrival> {
    if (c.error !== undefined) return Promise.reject(c.error);
    const key = `${c.seq}.${source}.${step}`;
    const check = (a: Arrival): Arrival => {
      if (a.header.signature !== c.signature) {
        throw new LifelineError(
          "MPI_COLLECTIVE_MISMATCH",
          `collective #${c.seq}: rank ${this.rank} called ${c.call}, but rank ${source} called a different collective or the same one with another root, op, type or length; every rank must make the same collective calls in the same order`,
        );
      }
      return a;
    };
    const ready = this.inbox.get(key);
    if (ready !== undefined) {
      this.inbox.delete(key);
      this.inboxBytes -= byteLengthOf(ready.frames);
      this.unreadBySeq.set(c.seq, this.unreadBySeq.get(c.seq)! - 1);
      if (this.unreadBySeq.get(c.seq) === 0) this.unreadBySeq.delete(c.seq);
      try {
        return Promise.resolve(check(ready));
      } catch (err) {
        return Promise.reject(err);
      }
    }
    return new Promise<Arrival>((resolve, reject) => {
      this.waiters.set(key, {
        resolve: (a) => {
          try {
            resolve(check(a));
          } catch (err) {
            reject(err);
          }
        },
        reject,
      });
    });
  }

  /** Collectives blocked long enough to query peers about; advances their next query time. */
  overdue(nowMs: number): ActiveCollective[] {
    const out: ActiveCollective[] = [];
    for (const c of this.active.values()) {
      if (nowMs >= c.nextQueryMs) {
        // Back off: a long legitimate wait (a slow peer) costs one small query per few seconds.
        c.nextQueryMs = nowMs + Math.min(10_000, 2 * (nowMs - c.startedMs));
        out.push(c);
      }
    }
    return out;
  }

  /** This rank's signature for `seq`, for a peer's query; undefined if not reached yet. */
  signatureOf(seq: number): { signature: number; call: string } | undefined {
    const a = this.active.get(seq);
    if (a !== undefined) return { signature: a.signature, call: a.call };
    return this.history(seq);
  }

  /** A finished collective's signature, if it is among the last HISTORY_MAX. */
  private history(seq: number): { signature: number; call: string } | undefined {
    const slot = seq % HISTORY_MAX;
    if (seq < 0 || !Number.isInteger(seq) || this.historySeq[slot] !== seq) return undefined;
    return { signature: this.historySignature[slot]!, call: this.historyCall[slot]! };
  }

  activeCollective(seq: number): ActiveCollective | undefined {
    return this.active.get(seq);
  }

  /**
   * retry-one: gives up collective `seq` (a peer failed): its pending receives reject with
   * `err`, and it leaves the active set and the inbox.
   */
  abandon(seq: number, err: Error): void {
    const c = this.active.get(seq);
    this.active.delete(seq);
    this.rejectWaiters(seq, err);
    c?.fail(err as LifelineError);
    this.purge((a) => a.header.collSeq !== seq);
  }

  /** retry-one: drops every filed message that `keep` rejects (frames of abandoned executions). */
  purge(keep: (a: Arrival) => boolean): void {
    if (this.inbox.size === 0) return; // the common case: retry-one purges before every collective
    for (const [key, a] of this.inbox) {
      if (keep(a)) continue;
      this.inbox.delete(key);
      this.inboxBytes -= byteLengthOf(a.frames);
      const seq = a.header.collSeq;
      const n = (this.unreadBySeq.get(seq) ?? 1) - 1;
      if (n <= 0) this.unreadBySeq.delete(seq);
      else this.unreadBySeq.set(seq, n);
    }
  }

  /**
   * elastic: a new world starts: pending collectives fail with `err`, and numbering, inbox and
   * history start afresh (a signature query about sequence n is then about the new world's n).
   */
  reset(err: Error): void {
    this.failAll(err);
    this.active.clear();
    this.inbox.clear();
    this.unreadBySeq.clear();
    this.historySeq.fill(-1);
    this.nextSeq = 0;
  }

  /** Fails every pending collective receive (abort, finalize). */
  failAll(err: unknown): void {
    for (const w of this.waiters.values()) w.reject(err);
    this.waiters.clear();
    for (const c of this.active.values()) c.fail(err as LifelineError);
  }
}
