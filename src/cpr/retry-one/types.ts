/**
 * Vocabulary of retry-one mode (Rabit-style recovery of the failed rank alone, extended with
 * sender-based message logging for point-to-point programs): collective identities, positions
 * of a rank in its program, round summaries, protocol frames, and the machine's inputs and
 * effects.
 *
 * Results, states, globals and determinants are opaque to the machines (`unknown`): the
 * driver stores them encoded (Buffers), the test harness stores plain values. The machines
 * never look inside.
 *
 * @example
 * const ident: CollIdentity = { op: "allreduce:sum", root: -1, type: "Float64Array", length: 8 };
 */
import type { LifelineErrorCode } from "../../errors.ts";
import type { ReplicaCodec } from "../../mpi/retry-hook.ts";

/**
 * What a collective call is, as far as replay must check it (op, root, type, length).
 * Its position is its collective index (see {@link Position}). `root` is -1 for rootless
 * collectives.
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

/**
 * Where a rank stands, as its round summary says. Every rank makes the same collective calls
 * in the same order, so a collective's *index* (how many non-bootstrap collectives came
 * before it since the program's start) names it on every rank, whatever each rank's own
 * checkpoints were.
 */
export type Position =
  /** A bootstrap collective under `key` (before the first checkpoint). */
  | { readonly kind: "boot"; readonly key: string; readonly ident: CollIdentity }
  /** A restarted rank at restore(): it needs its checkpoint from peers. */
  | { readonly kind: "restore" }
  /** Collective number `index`. */
  | { readonly kind: "coll"; readonly index: number; readonly ident: CollIdentity }
  /** finalize() after `index` collectives; the rank stays to serve peers. */
  | { readonly kind: "final"; readonly index: number }
  /**
   * Not at a sync point: computing, in point-to-point calls, or in a checkpoint() waiting for
   * its replicas, with `index` collectives done. It answers rounds but cannot be waited for.
   */
  | { readonly kind: "run"; readonly index: number };

/**
 * A sync point for error messages.
 *
 * @example
 * describePosition({ kind: "final", index: 5 }); // → "finalize() after 5 collective(s)"
 */
export function describePosition(p: Position): string {
  switch (p.kind) {
    case "boot":
      return `bootstrap ${JSON.stringify(p.key)} ${describeIdentity(p.ident)}`;
    case "restore":
      return "restore()";
    case "coll":
      return `collective #${p.index} ${describeIdentity(p.ident)}`;
    case "final":
      return `finalize() after ${p.index} collective(s)`;
    case "run":
      return `running after ${p.index} collective(s)`;
  }
}

/**
 * What a rank knows of the others that its data may reflect: every rank's newest safe
 * checkpoint, `[version, collective index]` (results, logged messages and held checkpoints
 * older than it may have been dropped), and the ranks known to have logged non-deterministic
 * outcomes. It travels with every piece of data a restarted rank gets, and with the round that
 * planned those transfers (what its summaries knew together: the data nobody gave, results no
 * survivor kept, reflects it too), and with each checkpoint, as the owner knew it then: a rank
 * whose memory reflects a fact must know it, or a later failure could be decided on knowledge
 * that died with the ranks that had it.
 */
export interface Knowledge {
  readonly safe: readonly (readonly [number, number])[];
  readonly logs: readonly number[];
}

/** A checkpoint of one rank as its holders describe it in their summaries. */
export interface HeldVersion {
  readonly version: number;
  /** Collectives the owner had done at the checkpoint. */
  readonly index: number;
  /** The global's key (see {@link RankInput} checkpoint), or null for no global. */
  readonly key: string | null;
  /** Determinants the owner had logged at the checkpoint. */
  readonly detCount: number;
}

/**
 * What a rank holds of a predecessor's recovery data: checkpoints (the newest safe one and
 * newer ones still being acknowledged) and the determinants logged since the safe one.
 */
export interface Holding {
  readonly owner: number;
  readonly versions: readonly HeldVersion[];
  /** Determinants held: ordinals detFrom..detTo-1. */
  readonly detFrom: number;
  readonly detTo: number;
}

/** A global a rank keeps of its own checkpoint `version` (to give a restarted peer). */
export interface OwnGlobal {
  readonly version: number;
  readonly index: number;
  readonly key: string;
}

/**
 * What a rank tells every peer in an agreement round: where it is and what it can serve.
 * Every rank gets all N summaries, so every rank computes the same decision (agreement.ts).
 */
export interface Summary {
  readonly rank: number;
  readonly pos: Position;
  /** A restarted rank that has not restored yet (its memory died with its predecessor). */
  readonly restoring: boolean;
  /** Its own checkpoints so far (the version it is in; 0 while restoring). */
  readonly version: number;
  /** Per rank, the newest checkpoint version this rank knows to be safe (0: none). */
  readonly knownSafe: readonly number[];
  /** Per rank, the collective index of that checkpoint. */
  readonly safeIndex: readonly number[];
  /** Collective results held: indices bufFrom..bufTo-1. */
  readonly bufFrom: number;
  readonly bufTo: number;
  /** Keys of the bootstrap cache. */
  readonly cacheKeys: readonly string[];
  /**
   * Recovery data held for predecessors: only whole records (a restarted holder's record is
   * whole once its owner's pushed determinants arrived, not with the pushed checkpoint alone).
   */
  readonly holds: readonly Holding[];
  /** Globals of its own checkpoints it keeps. */
  readonly globals: readonly OwnGlobal[];
  /** Ranks known to have logged determinants (a rank that never did can restart from its start anywhere). */
  readonly logsKnown: readonly number[];
  /** Collective executions started so far on the wire (World's collective sequence). */
  readonly wireSeq: number;
  /**
   * A restarted rank restored from checkpoint `version`, whose global (`key`) no rank kept when
   * it restored: its program waits in restore() until a peer that reaches that checkpoint gives
   * it (see `globalPending` of {@link RestoredValue}).
   */
  readonly awaitsGlobal?: { readonly version: number; readonly key: string };
}

/** A buffered collective result, with the identity it was produced under. */
export interface ResultEntry {
  readonly index: number;
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
  | { readonly kind: "results"; readonly entries: readonly ResultEntry[]; readonly known: Knowledge }
  | { readonly kind: "cache"; readonly entries: readonly CacheEntry[]; readonly known: Knowledge }
  /**
   * A restarted rank's checkpoint (version 0: the program's start, no state) with the
   * determinants it logged after it, and what the sender knows merged with what the owner
   * knew at the checkpoint.
   */
  | {
      readonly kind: "restore";
      readonly version: number;
      readonly index: number;
      readonly key: string | null;
      readonly detCount: number;
      readonly state: unknown;
      readonly dets: readonly unknown[];
      readonly known: Knowledge;
    }
  /**
   * The globals the sender keeps of its own checkpoints (that of the restarted rank's
   * checkpoint among them): the restarted rank keeps them as its own, as it would have.
   */
  | { readonly kind: "global"; readonly globals: readonly (OwnGlobal & { readonly global: unknown })[]; readonly known: Knowledge }
  /** What the sender holds of `owner` (a predecessor of the restarted rank), for it to hold again. */
  | {
      readonly kind: "held";
      readonly owner: number;
      readonly versions: readonly (HeldVersion & { readonly state: unknown; readonly known: Knowledge })[];
      readonly detFrom: number;
      readonly dets: readonly unknown[];
      readonly known: Knowledge;
    };

/**
 * Protocol frames between rank machines (the driver sends them as `protocol` frames with the
 * tags in driver.ts). `view` is the sender's attempt vector.
 */
export type ProtoFrame =
  | { readonly t: "summary"; readonly view: readonly number[]; readonly round: number; readonly summary: Summary }
  | { readonly t: "xfer"; readonly view: readonly number[]; readonly round: number; readonly part: TransferPart }
  /**
   * The sender's checkpoint `version`, for a successor to hold (`safe`: already safe, a push
   * after a restart). Not yet safe, it is also the sender's `ask` for `index`.
   */
  | {
      readonly t: "replica";
      readonly view: readonly number[];
      readonly version: number;
      readonly index: number;
      readonly key: string | null;
      readonly detCount: number;
      readonly safe: boolean;
      /** The state, or with `base` what it adds to the sender's checkpoint `base` (ReplicaCodec.diff). */
      readonly state: unknown;
      /** The sender's checkpoint that `state` is a difference from, which the receiver holds. */
      readonly base?: number;
      /** What the sender knew when it took the checkpoint (its state reflects it). */
      readonly known: Knowledge;
    }
  /** The holder keeps the sender's checkpoint `version`. */
  | { readonly t: "rack"; readonly view: readonly number[]; readonly version: number }
  /** The holder cannot take checkpoint `version` as a difference (it lacks the base): send it whole. */
  | { readonly t: "rnak"; readonly view: readonly number[]; readonly version: number }
  /** The sender's determinants with ordinals from..from+entries.length-1 (later ones are void). */
  | { readonly t: "dets"; readonly view: readonly number[]; readonly from: number; readonly entries: readonly unknown[] }
  /** The holder keeps the sender's determinants up to ordinal upTo-1. */
  | { readonly t: "dack"; readonly view: readonly number[]; readonly upTo: number }
  /**
   * Tell me once you have done `index` collectives (a checkpoint at that index waits for it).
   * The sender is at that index: the ask tells the receiver so, as a `done` would.
   */
  | { readonly t: "ask"; readonly view: readonly number[]; readonly index: number }
  /** The sender has done `index` collectives. */
  | { readonly t: "done"; readonly view: readonly number[]; readonly index: number }
  /** The sender logs determinants (so it can never restart from its start without them). */
  | { readonly t: "logs"; readonly view: readonly number[] }
  /** The receiver knows the sender of `logs` logs determinants. */
  | { readonly t: "lack"; readonly view: readonly number[] }
  /**
   * The sender's checkpoint `version` is safe (every successor holds it): the receiver may
   * drop what only older checkpoints need — the messages it sent the sender that the sender
   * had consumed (`consumed`), its copies of the sender's older checkpoints and determinants.
   */
  | {
      readonly t: "stored";
      readonly view: readonly number[];
      readonly version: number;
      readonly index: number;
      readonly detCount: number;
      readonly consumed: number;
    };

/** What restore() gives back: the checkpoint, and the determinants to replay after it. */
export interface RestoredValue {
  /**
   * `globalPending`: the checkpoint has a global that no rank kept yet (`global` is undefined);
   * the rank is restored all the same — its sender log goes out again, which its peers may need
   * to reach that checkpoint and keep the global — and a `global` effect brings it later.
   */
  readonly value: { readonly state: unknown; readonly global: unknown; readonly version: number; readonly globalPending?: boolean } | undefined;
  /** Determinants logged after the checkpoint, in order (ordinals detFrom..). */
  readonly dets: readonly unknown[];
  readonly detFrom: number;
}

/** Inputs of {@link RetryOneRank.step}. Time is an input (`nowMs`), never read. */
export type RankInput =
  /** The program calls a bootstrap collective (`opts.bootstrap`), `key` from the option or the call site. */
  | { readonly kind: "boot"; readonly key: string; readonly ident: CollIdentity }
  | { readonly kind: "restore" }
  /** The program calls a collective. */
  | { readonly kind: "collective"; readonly ident: CollIdentity }
  /** The collective the machine asked to `execute` finished on the wire. */
  | { readonly kind: "executed"; readonly result: unknown; readonly bytes?: number }
  /**
   * The program calls checkpoint(). `key` names the global's content (equal keys: equal
   * globals; null: no global); `consumed[r]` is how many of rank r's messages this rank had
   * received at this point (each peer gets its own count when the checkpoint is safe).
   */
  | {
      readonly kind: "checkpoint";
      readonly state: Lazy;
      readonly global: Lazy;
      readonly key: string | null;
      readonly consumed: readonly number[];
    }
  | { readonly kind: "finalize" }
  /** Non-deterministic outcomes of the program, ordinals from..: logged at the successors. */
  | { readonly kind: "dets"; readonly from: number; readonly entries: readonly unknown[] }
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
  | { readonly kind: "restored"; readonly restored: RestoredValue }
  /** The global of the restored checkpoint that `restored` said was pending. */
  | { readonly kind: "global"; readonly global: unknown }
  /** checkpoint() returns: `version` is safe (every successor holds it). */
  | { readonly kind: "checkpointed"; readonly version: number }
  /**
   * Values the machine dropped and never handed out (results below every rank's safe
   * checkpoint, its own older checkpoint copies): their memory may be reused.
   */
  | { readonly kind: "recycle"; readonly results: readonly unknown[] }
  /**
   * This rank's checkpoint `version` was dropped (a newer one is safe). `clean`: it was sent
   * only to the successors, and each has received everything sent after it, so nothing reads
   * what its state referred to any more (the sender log's copies in it may be reused).
   */
  | { readonly kind: "own-released"; readonly version: number; readonly clean: boolean }
  /**
   * Whether every determinant logged so far is held by every successor. While it is not,
   * nothing that could depend on them may leave the rank: the driver holds back every
   * application and collective frame (pessimistic logging).
   */
  | { readonly kind: "gate"; readonly open: boolean }
  /**
   * Rank `rank`'s checkpoint is safe and it had consumed `consumed` of this rank's messages:
   * the messages below that need not be kept for it any more.
   */
  | { readonly kind: "peer-safe"; readonly rank: number; readonly consumed: number }
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
  /** Bounds on the result buffer (entries, bytes) above every rank's safe checkpoint. */
  readonly resultEntriesMax?: number;
  readonly resultBytesMax?: number;
  /** Bootstrap cache entries. */
  readonly cacheEntriesMax?: number;
  /** Determinants logged since this rank's safe checkpoint. */
  readonly detEntriesMax?: number;
  /** A dead rank not running again within this long fails the survivors. */
  readonly failureTimeoutMs?: number;
  /** Frames held for a newer view than ours. */
  readonly heldFramesMax?: number;
  /**
   * Replicas to a successor that holds this rank's safe checkpoint carry only what changed
   * since it (see ReplicaCodec); without one they carry the whole state.
   */
  readonly replicaCodec?: ReplicaCodec | undefined;
  /** The time at construction (for the failure timeout of ranks already down). */
  readonly nowMs?: number;
  /**
   * Every rank restarts at once from the durable floor (or a resumed job): this rank starts
   * from its checkpoint `part` of the line (its program start when undefined), the line's
   * versions of every rank and its collective index. Nobody restores from peers.
   */
  readonly allRestart?: AllRestart | undefined;
}

/** See {@link RetryOneOptions.allRestart}. */
export interface AllRestart {
  readonly part:
    | {
        readonly version: number;
        readonly index: number;
        readonly key: string | null;
        readonly state: unknown;
        readonly global: unknown;
        readonly cache: readonly CacheEntry[];
      }
    | undefined;
  readonly versions: readonly number[];
  readonly index: number;
}

export const REPLICAS_DEFAULT = 2;
export const RESULT_ENTRIES_MAX_DEFAULT = 65_536;
export const RESULT_BYTES_MAX_DEFAULT = 1 << 30;
export const CACHE_ENTRIES_MAX_DEFAULT = 4096;
export const DET_ENTRIES_MAX_DEFAULT = 1 << 20;
export const FAILURE_TIMEOUT_MS_DEFAULT = 60_000;
export const HELD_FRAMES_MAX_DEFAULT = 65_536;
/**
 * Own globals kept for restarted peers (newest first), beyond those of every rank's safe
 * checkpoint as this rank knows it (always kept).
 */
export const OWN_GLOBALS_MAX = 4;
