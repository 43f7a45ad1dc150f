/**
 * The seam between the communicator and retry-one mode (Rabit-style recovery: restart only the
 * failed rank, restore it from its peers' memory, replay collective results;
 * `src/cpr/retry-one`). Like cpr-hook.ts, `src/mpi` defines it and never imports `src/cpr`;
 * `src/index.ts` plugs the driver in when the mode is `retry-one`.
 *
 * World calls the hook around every collective (answer it from a buffer, or run it on the
 * wire with a sequence number and view id the protocol chose), on every arriving collective
 * frame (the protocol may drop or hold it), at checkpoint()/restore()/finalize(), for its
 * protocol frames and for the coordinator's `peer`/`peer-down` news. The hook calls back
 * through {@link RetryWorldAccess}.
 *
 * @example
 * const world = await World.join(place, { retryOne: (access, host) => new RetryOneDriver(access, host, opts) });
 */
import type { LifelineErrorCode } from "../errors.ts";
import type { CoordinatorToRank, RankToCoordinator } from "./control.ts";
import type { RawFrame } from "./cpr-hook.ts";
import type { Host } from "./host.ts";
import type { Header } from "./wire.ts";

/** What replay checks about a collective call (op, root, type, length). */
export interface RetryCollIdentity {
  readonly op: string;
  readonly root: number;
  readonly type: string;
  readonly length: number;
}

/** How a collective call goes on: run it on the wire as given, or take this (encoded) result. */
export type RetryDecision = { readonly run: { readonly wireSeq: number; readonly viewId: number; readonly purgeBelow: number } } | { readonly result: Buffer };

/** What World lets the retry-one driver do. */
export interface RetryWorldAccess {
  readonly rank: number;
  readonly size: number;
  readonly attempt: number;
  /** Sends one protocol frame (kind protocol, not counted on any channel) to a peer. */
  sendProtocol(dest: number, tag: number, body: unknown): void;
  /**
   * A result given to {@link RetryOneHook.afterCollective} that nothing refers to any more
   * (dropped at a checkpoint, never sent or served): its memory may be reused.
   */
  recycle(result: Buffer): void;
  /**
   * This rank's checkpoint `version` is gone; `clean`: nothing reads what it referred to any
   * more (otherwise the garbage collector decides when its memory goes).
   */
  ownReleased(version: number, clean: boolean): void;
  /** A restarted rank caught up with the others (tells the launcher; see control.ts `retry-caught-up`). */
  caughtUp(info: { readonly restored: number; readonly version: number; readonly seqno: number; readonly replayed: number }): void;
  /**
   * Gives up the collective running as wire sequence `wireSeq`: its pending receives end with
   * an internal retry signal and World asks {@link RetryOneHook.resumeCollective} again.
   */
  abandonCollective(wireSeq: number): void;
  /** Delivers a held collective frame now (it passed classification). */
  inject(frame: RawFrame): void;
  /** Fails this rank's pending and future calls and asks the coordinator to stop the job. */
  fatal(code: LifelineErrorCode, message: string): void;
  /**
   * Runs `fn` once the coordinator has heard this rank's abort (at once when none is on its
   * way): the driver fails the program's calls there, so that a program dying of the error
   * cannot overtake the abort.
   */
  afterAbort(fn: () => void): void;
  /**
   * Opens or closes the output gate: while closed, no application or collective frame leaves
   * the rank (a determinant is not yet held by every successor; pessimistic logging).
   */
  setGate(open: boolean): void;
  /** Rank `rank`'s checkpoint is safe and it had consumed `consumed` of this rank's messages. */
  peerSafe(rank: number, consumed: number): void;
  /** Sends a control message to the coordinator (the durable floor's reports). */
  sendControl(msg: RankToCoordinator): void;
  /**
   * How a checkpoint's state travels to a successor that holds the rank's safe checkpoint
   * already: as what changed since it (see {@link ReplicaCodec}). Without it every replica
   * carries the whole state.
   */
  readonly replicaCodec?: ReplicaCodec | undefined;
}

/**
 * Ships a checkpoint's state to a holder as a difference from an older checkpoint of the same
 * rank that the holder keeps (retry-one's sender log: what the older one had and the receivers
 * still need is not sent again). Pure functions of the states; neither may change its inputs.
 */
export interface ReplicaCodec {
  /** What `next` adds to `base`, or undefined when it cannot be said more briefly than `next` itself. */
  diff(base: unknown, next: unknown): unknown;
  /** `next` again, from `base` and diff(base, next); throws on a difference it cannot apply. */
  patch(base: unknown, delta: unknown): unknown;
}

/** The library's counters at a checkpoint, per peer rank (the durable floor records them). */
export interface RetryCheckpointLib {
  /** Messages consumed from each rank. */
  readonly consumed: readonly number[];
  /** Messages sent to each rank. */
  readonly sent: readonly number[];
  /** Per destination, the first message the sender log holds (= sent when it holds none). */
  readonly logFrom: readonly number[];
}

/** What restore() gives back: the checkpoint (undefined: the program's start) and the determinants logged after it. */
export interface RetryRestoredValue {
  /**
   * `globalLater`: the checkpoint's global arrives later (no rank kept it yet; a peer that
   * reaches that checkpoint will). Restore everything else now — the sender log goes out again,
   * and peers may need it to get there — and hand the program its state once it resolves.
   */
  readonly value:
    { readonly state: unknown; readonly global: Buffer | undefined; readonly version: number; readonly globalLater?: Promise<Buffer> } | undefined;
  readonly dets: readonly unknown[];
  /** The ordinal of dets[0]. */
  readonly detFrom: number;
}

/** The retry-one protocol's side of the seam. */
export interface RetryOneHook {
  /**
   * The table arrived (every rank's attempt; ranks down now; for a restart of every rank, the
   * durable line); before the transport delivers.
   */
  beforeStart(table: Extract<CoordinatorToRank, { t: "table" }>): Promise<void>;
  /**
   * A collective call, before anything is sent. `bootstrapKey` for bootstrap collectives. The
   * decision itself when the protocol took it at once (the common case), else its promise.
   */
  beforeCollective(call: { readonly ident: RetryCollIdentity; readonly bootstrapKey?: string }): RetryDecision | Promise<RetryDecision>;
  /** The collective of the last `run` decision was abandoned: how it goes on now. */
  resumeCollective(): Promise<RetryDecision>;
  /**
   * The protocol gave up wire execution `wireSeq` (possibly before World started it: the
   * abandon and the decision may arrive in either order); World then asks resumeCollective().
   */
  isAbandoned(wireSeq: number): boolean;
  /**
   * The collective of the last `run` decision finished on the wire with this encoded result
   * (one buffer, or buffers whose concatenation is the encoding; none is written again).
   */
  afterCollective(result: Buffer | readonly Buffer[]): void;
  /** An arriving collective frame from a peer: deliver it (true) or not (dropped or held). */
  arrive(header: Header, frame: RawFrame): boolean;
  /** A protocol frame with a retry-one tag ({@link PROTO_RETRY_BASE}..). */
  onProtocol(header: Header, body: unknown): void;
  /** `peer` (after World reconnected) and `peer-down` from the coordinator. */
  onControl(msg: CoordinatorToRank): void;
  /**
   * checkpoint(): resolves when every successor holds it. `state` is opaque (a thunk for the
   * lazy form), `global` encoded or undefined, `lib` the message counters at this point.
   */
  checkpoint(state: unknown, global: Buffer | undefined, lib: RetryCheckpointLib): Promise<void>;
  /** restore(): the checkpoint from peers and the determinants to replay after it. */
  restore(): Promise<RetryRestoredValue>;
  /** Non-deterministic outcomes, ordinals from..: logged at the successors (the gate closes meanwhile). */
  logDets(from: number, entries: readonly unknown[]): void;
  /** finalize() passed its barrier: the rank keeps serving peers until release. */
  finalize(): void;
  /** The version the program is in and the seqno of its next collective. */
  readonly progress: { readonly version: number; readonly seqno: number };
  /** The view id stamped in collective frames; signature queries of another view are ignored. */
  readonly viewId: number;
  /** Every rank's incarnation as this rank knows it (frames of older ones are void). */
  readonly view: readonly number[];
  /** A restarted rank that has not got its checkpoint back yet. */
  readonly isRestoring: boolean;
  /** In recovery (rounds running): World's signature queries are off. */
  readonly inRecovery: boolean;
  /**
   * The rank finalized or failed. A durable write under way may finish first, briefly; once
   * the job was released (every rank finalized) it is abandoned instead: nothing can use it.
   */
  close(): Promise<void>;
}

/** Builds a hook for one World. */
export type RetryOneHookFactory = (access: RetryWorldAccess, host: Host) => RetryOneHook;

/** Protocol-frame tags of retry-one (summary, xfer, replica, stored, rack, dets, dack); distinct from cpr's 0x200 range. */
export const PROTO_RETRY_BASE = 0x300;
