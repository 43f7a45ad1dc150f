/**
 * The seam between the communicator and `--mode elastic` (src/cpr/elastic): as cpr-hook.ts
 * and retry-hook.ts, `src/mpi` defines it and never imports `src/cpr`; `src/index.ts` plugs the
 * driver in when the mode is `elastic`.
 *
 * The mode's adapter (modes/elastic.ts) calls the hook at checkpoint(), restore() and
 * bootstrap collectives, for every arriving collective frame (deliver it, or hold it for a world
 * this rank has not entered yet), for its protocol frames and for the coordinator's elastic
 * messages. The hook calls back through {@link ElasticWorldAccess}: to stop what runs when a
 * member is gone, to make this process rank r of a new world, to deliver held frames.
 *
 * @example
 * const world = await World.join(place, { elastic: (access, host) => new ElasticDriver(access, host) });
 */
import { LifelineError, type LifelineErrorCode } from "../errors.ts";
import type { CoordinatorToRank, RankToCoordinator } from "./control.ts";
import type { RawFrame } from "./cpr-hook.ts";
import type { Host } from "./host.ts";
import type { Header } from "./wire.ts";

/** Protocol-frame tags of elastic (reached, state); distinct from cpr's 0x200 and retry-one's 0x300. */
export const PROTO_ELASTIC_BASE = 0x400;

/** The error a call gets when the world changed under it: the program calls restore() and goes round its loop again. */
export function worldChanged(what: string): LifelineError {
  return new LifelineError(
    "MPI_WORLD_CHANGED",
    `${what}: the world changed (a rank left or joined); call restore() and go on with the new world.rank and world.size (--mode elastic)`,
  );
}

/** What World lets the elastic driver do. */
export interface ElasticWorldAccess {
  /** This process's slot (`LIFELINE_RANK`) and incarnation. */
  readonly slot: number;
  readonly attempt: number;
  /** The longest message the job's links carry (`--max-message`): a longer frame is dropped. */
  readonly maxMessageBytes: number;
  /** Sends one protocol frame (kind protocol, not counted on any channel) to a slot. */
  sendProtocol(dest: number, tag: number, body: unknown): void;
  sendControl(msg: RankToCoordinator): void;
  /** A member is gone: the collectives that run and a finalize() waiting for the release end with MPI_WORLD_CHANGED. */
  interrupt(): void;
  /**
   * This process is rank `rank` of world `view` from now on, `slots` each rank's slot: rank
   * and size change, and collectives are numbered afresh (frames of other worlds never mix in).
   */
  reshape(view: number, rank: number, slots: readonly number[]): void;
  /** A checkpoint buffer given to {@link ElasticHook.checkpoint} that nothing refers to any more: its memory may be reused. */
  recycle(buf: Buffer): void;
  /** Delivers a held collective frame now (it passed classification). */
  inject(frame: RawFrame): void;
  /** This process leaves the job (a replayed change without it, or a release before it got state): it ends. */
  retire(): void;
  /** Fails this rank's pending and future calls and asks the coordinator to stop the job. */
  fatal(code: LifelineErrorCode, message: string): void;
}

/** A checkpoint as restore() hands it back, encoded (`version` 0: nothing saved yet). */
export interface ElasticRestored {
  readonly state: Buffer | undefined;
  readonly global: Buffer | undefined;
  readonly version: number;
}

/** The elastic protocol's side of the seam. */
export interface ElasticHook {
  /** The table arrived (the world this rank starts in, or none: it joins); before the transport delivers. */
  beforeStart(table: Extract<CoordinatorToRank, { t: "table" }>): void;
  /** `elastic-view`, `elastic-decision` (after World connected the members' endpoints) and `release`. */
  onControl(msg: CoordinatorToRank): void;
  /** A protocol frame with an elastic tag ({@link PROTO_ELASTIC_BASE}..). */
  onProtocol(header: Header, body: unknown): void;
  /** An arriving collective frame from a peer: deliver it (true) or not (dropped, or held for a later world). */
  arrive(header: Header, frame: RawFrame): boolean;
  /** checkpoint(): resolves when the program may go on; rejects with MPI_WORLD_CHANGED when the world changes here. */
  checkpoint(state: Buffer, global: Buffer): Promise<void>;
  /** restore(): this rank's checkpoint in the world it runs in (after a change: the one the world starts from). */
  restore(): Promise<ElasticRestored>;
  /** A bootstrap collective: undefined to run it on the wire (then {@link booted}), else its encoded result from the job's cache. */
  bootstrap(key: string): Promise<Buffer | undefined>;
  booted(key: string, result: Buffer): void;
  /** Every call but restore() is refused (MPI_WORLD_CHANGED) until the program calls restore(). */
  readonly changed: boolean;
  /** No state yet (a rank that joins, before its state came): only bootstrap collectives and restore() may run. */
  readonly stateless: boolean;
  /** The world this rank runs in, stamped in collective frames (-1: none yet). */
  readonly viewId: number;
  /** A change is under way: ranks may be at different points (signature queries are off). */
  readonly inChange: boolean;
  /** The newest checkpoint version reached. */
  readonly version: number;
  /** The rank finalized or failed. */
  close(): void;
}

/** Builds a hook for one World. */
export type ElasticHookFactory = (access: ElasticWorldAccess, host: Host) => ElasticHook;
