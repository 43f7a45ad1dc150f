/**
 * Vocabulary of retry-one mode (Rabit-style recovery, seeds 000 and 002): collective
 * identities, positions of a rank in its program, round summaries, protocol frames, and the
 * machine's inputs and effects.
 *
 * Results, states and globals are opaque to the machines (`unknown`): the driver stores them
 * encoded (Buffers), the test harness stores plain values. The machines never look inside.
 *
 * @example
 * const ident: CollIdentity = { op: "allreduce:sum", root: -1, type: "Float64Array", length: 8 };
 */
import type { LifelineErrorCode } from "../../errors.ts";

/**
 * What a collective call is, as far as replay must check it (op, root, type, length,
 * and the sequence number). The sequence number is not part of it: it is the position.
 * `root` is -1 for rootless collectives.
 */
export interface CollIdentity {
  readonly op: string;
  readonly root: number;
  readonly type: string;
  readonly length: number;
}

/**
 * True when two calls are the same collective (op, root, type and length all equal).
 *
 * @example
 * sameIdentity(ident, { ...ident, length: 9 }); // → false
 */
export function sameIdentity(a: CollIdentity, b: CollIdentity): boolean {
  return a.op === b.op && a.root === b.root && a.type === b.type && a.length === b.length;
}

/**
 * A collective's identity for error messages.
 *
 * @example
 * describeIdentity({ op: "bcast", root: 0, type: "Float64Array", length: 8 }); // → "bcast(Float64Array[8] root=0)"
 */
export function describeIdentity(i: CollIdentity): string {
  const root = i.root >= 0 ? ` root=${i.root}` : "";
  return `${i.op}(${i.type}[${i.length}]${root})`;
}

/**
 * A checkpoint value or, for the lazy form `checkpoint(() => state)`, a function producing it,
 * called only when a copy is really needed (Rabit's LazyCheckPoint).
 */
export type Lazy<T = unknown> = { readonly kind: "value"; readonly value: T } | { readonly kind: "thunk"; readonly thunk: () => T };

/** Where a rank stands when it cannot go on without the others (a sync point). */
export type Position =
  /** A bootstrap collective under `key` (before the first checkpoint). */
  | { readonly kind: "boot"; readonly key: string; readonly ident: CollIdentity }
  /** A restarted rank at restore(): it needs its checkpoint from peers. */
  | { readonly kind: "restore" }
  /** Collective number `seqno` of `version` (since checkpoint `version`). */
  | { readonly kind: "coll"; readonly version: number; readonly seqno: number; readonly ident: CollIdentity }
  /** checkpoint() that ends `version` (making `version + 1`) after `count` collectives. */
  | { readonly kind: "ckpt"; readonly version: number; readonly count: number }
  /** finalize() after `count` collectives of `version`; the rank stays to serve peers. */
  | { readonly kind: "final"; readonly version: number; readonly count: number };

/**
 * A sync point for error messages.
 *
 * @example
 * describePosition({ kind: "ckpt", version: 2, count: 5 }); // → "checkpoint 3 after 5 collective(s) of version 2"
 */
export function describePosition(p: Position): string {
  switch (p.kind) {
    case "boot":
      return `bootstrap ${JSON.stringify(p.key)} ${describeIdentity(p.ident)}`;
    case "restore":
      return "restore()";
    case "coll":
      return `collective (version ${p.version}, seqno ${p.seqno}) ${describeIdentity(p.ident)}`;
    case "ckpt":
      return `checkpoint ${p.version + 1} after ${p.count} collective(s) of version ${p.version}`;
    case "final":
      return `finalize() after ${p.count} collective(s) of version ${p.version}`;
  }
}

/** One replica (or own copy) of a rank's state that a rank holds. */
export interface Holding {
  readonly owner: number;
  readonly version: number;
}

/**
 * What a rank tells every peer at the start of an agreement round: where it is and what it
 * can serve. Every rank gets all N summaries, so every rank computes the same decision
 * (see agreement.ts).
 */
export interface Summary {
  readonly rank: number;
  readonly pos: Position;
  /** A restarted rank that has not restored yet: it holds nothing (its memory died). */
  readonly restoring: boolean;
  /** Latest committed checkpoint version (0: the program's start). -1 while restoring. */
  readonly committed: number;
  /** The result buffer covers seqnos 0..bufCount-1 of version bufVersion. */
  readonly bufVersion: number;
  readonly bufCount: number;
  /** Keys of the bootstrap cache. */
  readonly cacheKeys: readonly string[];
  /** States held (own and replicas; committed and pending). */
  readonly holds: readonly Holding[];
  /** Collective executions started so far on the wire (World's collective sequence). */
  readonly wireSeq: number;
}

/** A buffered collective result, with the identity it was produced under. */
export interface ResultEntry {
  readonly version: number;
  readonly seqno: number;
  readonly ident: CollIdentity;
  readonly result: unknown;
  readonly bytes: number;
}

export interface CacheEntry {
  readonly key: string;
  readonly ident: CollIdentity;
  readonly result: unknown;
}

/** A piece of data one rank sends another after a round's decision. */
export type TransferPart =
  | { readonly kind: "results"; readonly version: number; readonly entries: readonly ResultEntry[] }
  | { readonly kind: "cache"; readonly entries: readonly CacheEntry[] }
  /** A restarted rank's checkpoint: its own state and the global (version 0: none). */
  | { readonly kind: "restore"; readonly version: number; readonly state: unknown; readonly global: unknown }
  /** A replica the restarted rank holds for a ring predecessor (coverage restored at once). */
  | { readonly kind: "replica"; readonly owner: number; readonly version: number; readonly state: unknown };

/**
 * Protocol frames between rank machines (the driver sends them as `protocol` frames with the
 * tags in INTEGRATION.md). `view` is the sender's attempt vector.
 */
export type ProtoFrame =
  | { readonly t: "summary"; readonly view: readonly number[]; readonly round: number; readonly summary: Summary }
  | { readonly t: "xfer"; readonly view: readonly number[]; readonly round: number; readonly part: TransferPart }
  /** Checkpoint `version`: the sender's state, for a ring successor to hold. */
  | { readonly t: "replica"; readonly view: readonly number[]; readonly version: number; readonly state: unknown }
  /** Checkpoint `version`: the sender has arrived and holds every replica of its predecessors. */
  | { readonly t: "stored"; readonly view: readonly number[]; readonly version: number };

export type RestoredValue = { readonly state: unknown; readonly global: unknown; readonly version: number } | undefined;

/** Inputs of {@link RetryOneRank.step}. Time is an input (`nowMs`), never read. */
export type RankInput =
  /** The program calls a bootstrap collective (`opts.bootstrap`), `key` from the option or the call site. */
  | { readonly kind: "boot"; readonly key: string; readonly ident: CollIdentity }
  | { readonly kind: "restore" }
  /** The program calls a collective. */
  | { readonly kind: "collective"; readonly ident: CollIdentity }
  /** The collective the machine asked to `execute` finished on the wire. */
  | { readonly kind: "executed"; readonly result: unknown; readonly bytes?: number }
  | { readonly kind: "checkpoint"; readonly state: Lazy; readonly global: Lazy }
  | { readonly kind: "finalize" }
  /** A protocol frame from `from` (incarnation `attempt`). */
  | { readonly kind: "frame"; readonly from: number; readonly attempt: number; readonly frame: ProtoFrame }
  /** The detector or coordinator says `rank` died (its incarnation `attempt`). */
  | { readonly kind: "peer-down"; readonly rank: number; readonly attempt: number; readonly nowMs: number }
  /** `rank` runs again as incarnation `attempt` (the coordinator's `peer` message). */
  | { readonly kind: "peer-up"; readonly rank: number; readonly attempt: number; readonly nowMs: number }
  | { readonly kind: "tick"; readonly nowMs: number };

/** Effects of {@link RetryOneRank.step}, to carry out in order. */
export type RankEffect =
  | { readonly kind: "send"; readonly to: number; readonly frame: ProtoFrame }
  /**
   * Run the pending collective on the wire now, as World's collective number `wireSeq`, with
   * `viewId` in the frames' epoch field; then input `executed`. Collective frames already
   * filed whose view id is not `viewId`, or whose sequence number is below `purgeBelow`,
   * belong to abandoned executions (a dead incarnation may have used the same sequence
   * number in an older view): discard them before running.
   */
  | { readonly kind: "execute"; readonly ident: CollIdentity; readonly wireSeq: number; readonly viewId: number; readonly purgeBelow: number }
  /** Give up the collective running on the wire (a peer failed); its frames are void. */
  | { readonly kind: "abandon"; readonly wireSeq: number }
  /** Resolve the program's pending collective (or bootstrap collective) with `result`. */
  | { readonly kind: "complete"; readonly result: unknown; readonly replayed: boolean }
  | { readonly kind: "restored"; readonly value: RestoredValue }
  /** checkpoint() returns: `version` is committed (every rank's state is at its replicas). */
  | { readonly kind: "checkpointed"; readonly version: number }
  /**
   * Values the machine dropped at a commit and never handed out — results of the older version
   * (never sent in a transfer, never served to the program) and its own encoded state and
   * global of the previous checkpoint (never sent to a peer): nothing refers to them any more,
   * so their memory may be reused. Values that were handed out are not listed.
   */
  | { readonly kind: "recycle"; readonly results: readonly unknown[] }
  /** Fail the pending call and every later one with this error; the job cannot go on. */
  | { readonly kind: "fail"; readonly code: LifelineErrorCode; readonly message: string };

export interface RetryOneOptions {
  readonly rank: number;
  readonly size: number;
  /** This process's incarnation (0 on the first start). */
  readonly attempt: number;
  /** Every rank's current incarnation (the coordinator's table). */
  readonly attempts: readonly number[];
  /** Ring successors that keep a copy of each rank's state (default 2, capped at size-1). */
  readonly replicas?: number;
  /** Each rank's host (index) at the job's start: replicas go to other hosts first (see agreement.ts). */
  readonly groups?: readonly number[] | undefined;
  /** Bounds on the result buffer (entries, bytes) between two checkpoints. */
  readonly resultEntriesMax?: number;
  readonly resultBytesMax?: number;
  /** Bootstrap cache entries. */
  readonly cacheEntriesMax?: number;
  /** A dead rank not running again within this long fails the survivors. */
  readonly failureTimeoutMs?: number;
  /** Frames held for a newer view than ours. */
  readonly heldFramesMax?: number;
  /** The time at construction (for the failure timeout of ranks already down). */
  readonly nowMs?: number;
}

export const REPLICAS_DEFAULT = 2;
export const RESULT_ENTRIES_MAX_DEFAULT = 65_536;
export const RESULT_BYTES_MAX_DEFAULT = 1 << 30;
export const CACHE_ENTRIES_MAX_DEFAULT = 4096;
export const FAILURE_TIMEOUT_MS_DEFAULT = 60_000;
export const HELD_FRAMES_MAX_DEFAULT = 65_536;
