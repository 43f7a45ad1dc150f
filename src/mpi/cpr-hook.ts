/**
 * The seam between the communicator and a checkpoint-restart protocol (today: coordinated
 * checkpointing, `src/cpr/coordinated`). `src/mpi` defines it and never imports `src/cpr`;
 * `src/index.ts` plugs an implementation in when the mode asks for one.
 *
 * World calls the hook at the points where the protocol must see or steer the message path:
 * stamping outgoing frames, classifying arriving ones, suppressing re-sent early messages,
 * the program's checkpoint locations, every non-deterministic outcome, and the control
 * messages of the protocol. The hook calls back through {@link CprWorldAccess}, which lets it
 * capture and restore the library's own state (counters, queues, caches) without reaching
 * into World's fields.
 *
 * @example
 * const world = await World.join(place, { cpr: (access, host) => new CoordinatedDriver(access, host, partsFactory) });
 */
import type { CoordinatorToRank, RankToCoordinator } from "./control.ts";
import type { Host } from "./host.ts";
import type { Header } from "./wire.ts";

/** A frame as it travels: its 40-byte header and its body frames. */
export interface RawFrame {
  readonly header: Buffer;
  readonly body: Buffer[];
}

/**
 * The library's own state at a checkpoint location: what a rank needs besides the program's
 * state to continue exactly where it was (as the protocol asks: "save internal state of MPI
 * library").
 */
export interface LibState {
  /** Frames sent so far on each channel this → dest (the next channelSeq). */
  readonly channelSeqOut: number[];
  /** Application frames sent so far on each channel (see frameId in wire.ts). */
  readonly appSeqOut?: number[];
  /** The next collective sequence number. */
  readonly collNextSeq: number;
  /** Messages of collectives not yet started here (arrived early), in arrival order. */
  readonly collInbox: RawFrame[];
  /** Application messages that arrived but were not received yet, in arrival order. */
  readonly unexpected: RawFrame[];
  /** Results of bootstrap collectives by key (encoded values). */
  readonly bootstrap: [string, Buffer][];
  /** checkpoint() calls that were checkpoints so far (the `version`). */
  readonly versions: number;
}

/** What World lets a protocol driver do. */
export interface CprWorldAccess {
  readonly rank: number;
  readonly size: number;
  readonly attempt: number;
  /** Captures the library state; call only at a checkpoint location (nothing half-done). */
  captureLibState(): LibState;
  /** Sets the library state of a restored rank, before any frame is delivered. */
  restoreLibState(lib: LibState): void;
  /**
   * Delivers a frame from the restored part as if it had just arrived, without classifying it
   * again (recovery). Its job key is not checked: an earlier run of a resumed job wrote it.
   */
  inject(frame: RawFrame): void;
  /** Sends one protocol frame (kind protocol, not counted on any channel) to a peer. */
  sendProtocol(dest: number, tag: number, body: unknown): void;
  /** The longest message body the job's links carry (`--max-message`); unbounded when absent. */
  readonly maxMessageBytes?: number;
  /** Sends a control message to the coordinator. */
  sendControl(msg: RankToCoordinator): void;
  /** Fails this rank's pending and future calls and asks the coordinator to stop the job. */
  fatal(code: "CPR_PROTOCOL" | "CPR_REPLAY" | "CPR_CHECKPOINT" | "CPR_RESTORE", message: string): void;
}

/** A non-deterministic outcome as logged while recording and replayed on recovery. */
export type NondetEntry =
  /** A `nondet(fn)` value. */
  | { readonly k: "value"; readonly v: unknown }
  /** The message a wildcard receive (or probe) matched: replay receives exactly this one. */
  | { readonly k: "match"; readonly source: number; readonly tag: number }
  /** An `iprobe` result (`null`: nothing matched). */
  | { readonly k: "iprobe"; readonly source: number; readonly tag: number; readonly found: boolean }
  /** The index `waitAny` returned. */
  | { readonly k: "any"; readonly index: number }
  /**
   * What a poll of a request (`test()` or `done`) saw. For a receive seen done, `msg` is the
   * message as it arrived (raw frames, so typed arrays come back as they were): a replay
   * returns it from the log, and the re-sent copy is swallowed when it arrives.
   */
  | { readonly k: "test"; readonly done: boolean; readonly msg?: RawFrame };

/** What World asks about one non-deterministic call. */
export interface NondetTicket {
  /** The call's ordinal since the last checkpoint. */
  readonly ordinal: number;
  /** On recovery, the logged outcome to reproduce; otherwise undefined. */
  readonly replay: NondetEntry | undefined;
}

/** The protocol's side of the seam. */
export interface CprHook {
  /** The rank's current epoch (for progress reports). */
  readonly epoch: number;
  /**
   * Called once the table arrived and before the transport starts delivering: restore the
   * library state and re-inject logged messages (so per-channel order is kept).
   */
  beforeStart(table: Extract<CoordinatorToRank, { t: "table" }>): Promise<void>;
  /** Called after the transport started, before init() returns (e.g. exchange early-id lists). */
  afterStart(): Promise<void>;
  /** Epoch and flag bits for an outgoing app or collective frame to `dest` (also counts it). */
  stamp(dest: number): { epoch: number; flags: number };
  /** true: drop this send (an early message the receiver already has). */
  suppress(dest: number, channelSeq: number): boolean;
  /** An app or collective frame from a peer, before it is delivered. */
  arrive(header: Header, frame: RawFrame): void;
  /** A protocol frame of the recovery protocol (tags from {@link PROTO_CPR_BASE}). */
  onProtocol(header: Header, body: unknown): void;
  /** A cpr-* control message from the coordinator. */
  onControl(msg: CoordinatorToRank): void;
  /**
   * A checkpoint location. Synchronous: the program's state is serialized before it returns.
   * `flushSelf` moves pending sends-to-self into the matcher first.
   */
  checkpoint(state: unknown, global: unknown, flushSelf: () => void): void;
  /** restore()'s answer: the state saved at the recovery line, or undefined on a fresh start. */
  restored(): { state: unknown; global: unknown; version: number } | undefined;
  /** A cached bootstrap collective result (recovery), or undefined. */
  bootstrapResult(key: string): { value: unknown } | undefined;
  /** A non-deterministic call is starting. */
  nondet(kind: NondetEntry["k"]): NondetTicket;
  /** Its outcome (logged if the ticket's ordinal was taken while recording). */
  logNondet(ordinal: number, entry: NondetEntry): void;
  /** The rank finalized or failed. */
  close(): Promise<void>;
}

/** Builds a hook for one World (given World's access and its host). */
export type CprHookFactory = (access: CprWorldAccess, host: Host) => CprHook;

/** Protocol-frame tags reserved for the recovery protocol (the layer's own use 0x100..0x1ff). */
export const PROTO_CPR_BASE = 0x200;
