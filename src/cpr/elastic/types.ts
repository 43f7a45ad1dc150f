/**
 * The vocabulary of `--mode elastic` on the rank side: members of a world, the coordinator's
 * news of the next world, the checkpoints a rank keeps, the protocol frames ranks exchange, and
 * the inputs and effects of the pure machine ({@link ElasticRank} in rank.ts).
 *
 * @example
 * const news: ViewNews = { id: 1, members: [{ slot: 0, attempt: 0 }, { slot: 2, attempt: 0 }], leaving: [], rollback: true };
 */
import type { LifelineErrorCode } from "../../errors.ts";

/** One rank process: its slot (`LIFELINE_RANK`, fixed for the job) and its incarnation. */
export interface Member {
  readonly slot: number;
  readonly attempt: number;
}

/**
 * The coordinator's next world (`elastic-view`). `members` in rank order: the members of the
 * world before that stay, in their order, then the ranks that join. `leaving`: members of the
 * world before that take part in the change and then end (a replayed change only). With
 * `rollback` (a member is gone) the members go back to the newest checkpoint they all reached;
 * otherwise the world changes at checkpoint `at`, or at the next one every member reaches.
 */
export interface ViewNews {
  readonly id: number;
  readonly members: readonly Member[];
  readonly leaving: readonly Member[];
  readonly rollback: boolean;
  readonly at?: number | undefined;
}

/** A checkpoint as the program gave it to checkpoint(), encoded (version 0, the start, has neither). */
export interface Checkpoint {
  readonly state: Buffer | undefined;
  readonly global: Buffer | undefined;
}

/** What one rank says about itself in the round that settles a change of the world. */
export interface Summary {
  /** The rank holds checkpoints of the job (false: it joins and has nothing yet). */
  readonly hasState: boolean;
  /** The newest checkpoint version it reached (entered checkpoint() with). */
  readonly reached: number;
  /** The oldest checkpoint version it still holds. */
  readonly oldest: number;
  /** It has called restore(): its bootstrap collectives are done. */
  readonly started: boolean;
}

/**
 * The coordinator's decision on the world `view` (computed by {@link decide} from every
 * participant's summary): the checkpoint version the new world starts from (`target`), the
 * member that sends it to those that lack it (`root`, the new world's first member that holds
 * it) and those (`joiners`).
 */
export interface Decision {
  readonly view: number;
  readonly target: number;
  readonly root: number;
  readonly joiners: readonly number[];
}

/** Protocol frames between ranks (kind protocol; tags from `PROTO_ELASTIC_BASE`). */
export type ProtoFrame =
  /** The sender reached checkpoint `version` of lineage `lineage` (the id of the last world that rolled back). */
  | { t: "reached"; lineage: number; version: number }
  /**
   * From the new world's root to a member that lacks the checkpoint the world starts from: that
   * checkpoint (`null`: version 0, nothing saved yet), its lineage and the bootstrap results.
   */
  | { t: "state"; view: number; lineage: number; version: number; state: Buffer | null; global: Buffer | null; boot: [string, Buffer][] };

/** What the driver feeds the machine. */
export type ElasticInput =
  /** The coordinator's news of the next world (answer: a summary). */
  | { readonly kind: "view"; readonly news: ViewNews }
  /** The coordinator's decision on the newest news. */
  | { readonly kind: "decision"; readonly decision: Decision }
  /** A protocol frame from slot `from`, incarnation `attempt`. */
  | { readonly kind: "frame"; readonly from: number; readonly attempt: number; readonly frame: ProtoFrame }
  /** The program's checkpoint() (state encoded now: later changes do not reach it). */
  | { readonly kind: "checkpoint"; readonly ckpt: Checkpoint }
  /** The program's restore(). */
  | { readonly kind: "restore" }
  /** A bootstrap collective with this key: run it, or take its result from the job's cache. */
  | { readonly kind: "boot"; readonly key: string }
  /** The bootstrap collective `key` ran on the wire with this (encoded) result. */
  | { readonly kind: "booted"; readonly key: string; readonly result: Buffer };

/** What the machine asks the driver to do, in order. */
export type ElasticEffect =
  | { readonly kind: "send"; readonly to: number; readonly frame: ProtoFrame }
  /** Tell the coordinator this rank's summary for the news `view`. */
  | { readonly kind: "summary"; readonly view: number; readonly summary: Summary }
  /** Tell the coordinator: this rank now runs in world `view`, entered at checkpoint `at`. */
  | { readonly kind: "report"; readonly view: number; readonly at: number }
  /** A member is gone: running collectives and a finalize() waiting for the release end with MPI_WORLD_CHANGED. */
  | { readonly kind: "interrupt" }
  /** This rank is rank `rank` of world `view` from now on (`members` in rank order). */
  | { readonly kind: "reshape"; readonly view: number; readonly rank: number; readonly members: readonly Member[] }
  /** checkpoint() returns. */
  | { readonly kind: "checkpointed" }
  /** checkpoint() rejects with MPI_WORLD_CHANGED (the world changes at it, or a member is gone). */
  | { readonly kind: "checkpoint-changed" }
  /** restore() returns this checkpoint (`version` 0: nothing saved yet). */
  | { readonly kind: "restored"; readonly ckpt: Checkpoint; readonly version: number }
  /** The bootstrap collective runs on the wire (feed `booted` with its result). */
  | { readonly kind: "boot-run"; readonly key: string }
  /** The bootstrap collective's result, from the job's cache. */
  | { readonly kind: "boot-answer"; readonly key: string; readonly result: Buffer }
  /** A kept checkpoint is not needed any more and was never sent to a peer: its memory may be reused. */
  | { readonly kind: "drop"; readonly ckpt: Checkpoint }
  /**
   * This rank leaves the job: at once (`now`: news of a world without this incarnation, which
   * was declared gone), or at the release (a replayed change without it: what it sent last may
   * still be on its way to the others, so its process stays until the job is over).
   */
  | { readonly kind: "retire"; readonly now: boolean }
  /** A job-fatal error. */
  | { readonly kind: "fail"; readonly code: LifelineErrorCode; readonly message: string };
