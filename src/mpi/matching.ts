/**
 * MPI message matching, pure (no I/O): posted receives and the unexpected-message queue.
 *
 * Rules (MPI-3.1 §3.5): a receive names a source or ANY_SOURCE and a tag or ANY_TAG; an
 * arriving message goes to the first *posted* receive (in posting order) that matches it;
 * otherwise it waits in the unexpected queue, and a later receive takes the earliest-arrived
 * matching message. Messages from one sender are kept in arrival order, which is their send
 * order (the transport is FIFO per channel), so two messages between one pair with one tag
 * never overtake each other.
 *
 * @example
 * const m = new Matcher<Env>(4);
 * m.arrive(env);                      // → the posted receive it completes, or undefined (queued)
 * m.take(ANY_SOURCE, 7);              // → the earliest queued match, or undefined
 */
import { ANY_SOURCE, ANY_TAG } from "./types.ts";

export interface Envelope {
  readonly source: number;
  readonly tag: number;
}

/** A posted receive (or a probe) waiting for a match. */
export interface Waiter<E extends Envelope> {
  readonly source: number;
  readonly tag: number;
  /** true: consumes the message (recv); false: only observes it (probe). */
  readonly consume: boolean;
  readonly onMatch: (env: E) => void;
}

interface Queued<E> {
  readonly env: E;
  readonly arrival: number;
  /** What it counts against the bound on unmatched messages (see {@link Matcher.unexpectedBytes}). */
  readonly bytes: number;
}

export function matches(wantSource: number, wantTag: number, env: Envelope): boolean {
  return (wantSource === ANY_SOURCE || wantSource === env.source) && (wantTag === ANY_TAG || wantTag === env.tag);
}

export class Matcher<E extends Envelope> {
  /** Unexpected messages, one FIFO per source. */
  private readonly bySource: Queued<E>[][];
  private readonly posted: Waiter<E>[] = [];
  private arrivals = 0;
  private queued = 0;
  private queuedBytes = 0;

  constructor(size: number) {
    this.bySource = Array.from({ length: size }, () => []);
  }

  /** Number of messages waiting in the unexpected queue. */
  get unexpectedCount(): number {
    return this.queued;
  }

  /** Bytes of the messages in the unexpected queue, as `arrive` counted them. */
  get unexpectedBytes(): number {
    return this.queuedBytes;
  }

  /** The source whose queued messages count the most bytes (for an error about the bound), or -1. */
  largestSource(): number {
    let best = -1;
    let most = 0;
    this.bySource.forEach((q, s) => {
      let n = 0;
      for (const x of q) n += x.bytes;
      if (n > most) [best, most] = [s, n];
    });
    return best;
  }

  /** Number of posted receives (not probes) still waiting. */
  get postedCount(): number {
    let n = 0;
    for (const w of this.posted) if (w.consume) n++;
    return n;
  }

  /**
   * A message arrives. Probes that match are told (and removed); the first matching posted
   * receive consumes it. Returns true if it was consumed, false if it is now queued (counting
   * `bytes` until it is taken).
   */
  arrive(env: E, bytes = 0): boolean {
    for (let i = 0; i < this.posted.length; i++) {
      const w = this.posted[i]!;
      if (!matches(w.source, w.tag, env)) continue;
      this.posted.splice(i, 1);
      if (w.consume) {
        w.onMatch(env);
        return true;
      }
      // A probe only observes: tell it and keep looking (it matched the message the next
      // matching receive will take, which is this one, since nothing consumed it yet).
      w.onMatch(env);
      i--;
    }
    this.bySource[env.source]!.push({ env, arrival: this.arrivals++, bytes });
    this.queued++;
    this.queuedBytes += bytes;
    return false;
  }

  /** Index of the first queued message of `source` matching `tag`, or -1. */
  private firstIn(source: number, tag: number): number {
    const q = this.bySource[source]!;
    if (tag === ANY_TAG) return q.length > 0 ? 0 : -1;
    for (let i = 0; i < q.length; i++) if (q[i]!.env.tag === tag) return i;
    return -1;
  }

  /** The earliest queued match as [source, index], or undefined. */
  private find(source: number, tag: number): [number, number] | undefined {
    if (source !== ANY_SOURCE) {
      const i = this.firstIn(source, tag);
      return i < 0 ? undefined : [source, i];
    }
    let best: [number, number] | undefined;
    let bestArrival = Infinity;
    for (let s = 0; s < this.bySource.length; s++) {
      const i = this.firstIn(s, tag);
      if (i >= 0 && this.bySource[s]![i]!.arrival < bestArrival) {
        bestArrival = this.bySource[s]![i]!.arrival;
        best = [s, i];
      }
    }
    return best;
  }

  /** Removes and returns the earliest queued message matching (source, tag), if any. */
  take(source: number, tag: number): E | undefined {
    const at = this.find(source, tag);
    if (at === undefined) return undefined;
    const [s, i] = at;
    const q = this.bySource[s]!;
    const [item] = i === 0 ? [q.shift()!] : q.splice(i, 1);
    this.queued--;
    this.queuedBytes -= item!.bytes;
    return item!.env;
  }

  /** The earliest queued message matching (source, tag), left in place. */
  peek(source: number, tag: number): E | undefined {
    const at = this.find(source, tag);
    return at === undefined ? undefined : this.bySource[at[0]]![at[1]]!.env;
  }

  /** Registers a waiter; call only after take/peek found nothing. */
  post(w: Waiter<E>): void {
    this.posted.push(w);
  }

  /** Puts `next` where `prev` is in posting order (e.g. to narrow what it matches). Returns whether `prev` was there. */
  replace(prev: Waiter<E>, next: Waiter<E>): boolean {
    const i = this.posted.indexOf(prev);
    if (i < 0) return false;
    this.posted[i] = next;
    return true;
  }

  /** Removes a waiter that has not matched yet (e.g. on abort). Returns whether it was there. */
  cancel(w: Waiter<E>): boolean {
    const i = this.posted.indexOf(w);
    if (i < 0) return false;
    this.posted.splice(i, 1);
    return true;
  }

  /** All waiters, removed (for failing them on abort/finalize). */
  drainWaiters(): Waiter<E>[] {
    return this.posted.splice(0, this.posted.length);
  }

  /** All queued messages in arrival order, left in place (channel state for a checkpoint). */
  queuedInOrder(): E[] {
    return this.bySource
      .flat()
      .sort((a, b) => a.arrival - b.arrival)
      .map((q) => q.env);
  }

  /** All queued messages in arrival order, removed (channel state for a checkpoint). */
  drainQueued(): E[] {
    const all = this.bySource
      .flat()
      .sort((a, b) => a.arrival - b.arrival)
      .map((q) => q.env);
    for (const q of this.bySource) q.length = 0;
    this.queued = 0;
    this.queuedBytes = 0;
    return all;
  }
}
