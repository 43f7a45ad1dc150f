/**
 * What a recovery mode may change in the communicator, and mode none, which changes nothing.
 *
 * World (the facade) does everything that is the same in every mode — argument checks, the
 * matcher, requests, the order of collective calls — and asks its mode at the points where
 * the recovery modes differ: what a frame carries (`stamp`, `suppress`), whether an arriving
 * frame is delivered (`classify`), non-deterministic outcomes (`ticket`, pollers, `nondet`),
 * how a collective runs (`collective` and the rewrites of reduce, gather, scatter and
 * alltoall), checkpoint/restore, and the end of the rank. {@link NoneMode} is the base: its
 * answers are the plain MPI behaviour, with no branches; CprMode and RetryOneMode override
 * what their protocol needs.
 *
 * @example
 * const mode = new NoneMode(core);   // World.connect picks NoneMode, CprMode or RetryOneMode
 * mode.stamp(header, dest);           // mode none: nothing to add
 */
import type { LifelineError } from "../../errors.ts";
import type { Channel, FrameStamper } from "../channel.ts";
import type { CollectiveRunner, CollKind, QueryScope } from "../coll-runner.ts";
import * as coll from "../collectives.ts";
import type { CoordinatorToRank, RankToCoordinator } from "../control.ts";
import type { NondetEntry, NondetTicket, RawFrame } from "../cpr-hook.ts";
import type { Mode } from "../env.ts";
import type { Host } from "../host.ts";
import type { Matcher, Waiter } from "../matching.ts";
import type { Poller } from "../request.ts";
import type { Message, ReduceOp } from "../types.ts";
import type { Header } from "../wire.ts";

/** An application message after decoding, as the matcher holds it. */
export interface AppEnvelope {
  readonly source: number;
  readonly tag: number;
  readonly data: unknown;
  /** The frame as it arrived (kept for checkpoints of the unexpected queue). */
  readonly raw?: RawFrame;
}

/** An irecv as its poller sees it: its posted receive (until matched) and its message's frame. */
export interface PolledRecv {
  waiter: Waiter<AppEnvelope> | undefined;
  readonly raw: () => RawFrame | undefined;
}

/** What World's facade gives its mode: the layers below it and the rank's shared counters. */
export interface ModeCore {
  readonly rank: number;
  readonly size: number;
  readonly attempt: number;
  readonly mode: Mode;
  readonly host: Host;
  readonly channel: Channel;
  readonly runner: CollectiveRunner;
  readonly matcher: Matcher<AppEnvelope>;
  /** checkpoint() calls that were checkpoints so far (the `version`). */
  versions: number;
  /** The rank's failure, if it failed. */
  failure(): LifelineError | undefined;
  sendControl(msg: RankToCoordinator): void;
  /** Reports `err` and asks the coordinator to stop the job. */
  fatal(err: LifelineError): void;
  /** Fails every pending call with `err` (once the coordinator has this rank's abort, if one is on its way). */
  failPending(err: LifelineError): void;
  /**
   * Runs `fn` once the coordinator has heard this rank's abort (or gave no word in time), at
   * once when no abort is on its way: an error a program may die of must not reach it before
   * the abort, or the launcher takes the abort for a crash.
   */
  afterAbort(fn: () => void): void;
  /** A posted receive was completed from a replay log (it no longer counts as outstanding). */
  recvCompletedFromLog(): void;
  /** Collectives since the last checkpoint start from 0 again (fault coordinates). */
  resetCollectiveCount(): void;
  /** A progress report to the launcher (at most one per interval unless forced). */
  reportStep(force: boolean): void;
  /** elastic: this process is rank `rank` of a world of `size` ranks from now on (`world.rank`, `world.size`). */
  reshape(rank: number, size: number): void;
  /** elastic: a finalize() waiting for the release fails with `err` (the program goes round its loop again). */
  interruptFinalize(err: LifelineError): void;
}

/** World's collective entry (order, faults, then the mode's `collective`). */
export type CollectiveCall = <R>(
  kind: CollKind,
  identity: readonly (string | number)[],
  algorithm: (io: coll.CollectiveIo) => Promise<R>,
  op?: string,
  root?: number,
  data?: unknown,
) => Promise<R>;

/** What restore() hands back, decoded. */
export interface RestoredState {
  readonly state: unknown;
  readonly global: unknown;
  readonly version: number;
}

/** Mode none: plain MPI semantics; the base of the recovery modes. */
export class NoneMode implements FrameStamper, QueryScope {
  /** App envelopes keep their arrived frame (cpr checkpoints the unexpected queue). */
  readonly keepsFrames: boolean = false;

  constructor(protected readonly core: ModeCore) {}

  get viewId(): number {
    return 0;
  }

  get queriesPaused(): boolean {
    return false;
  }

  /** restore() may be called again (elastic, after a change of the world). */
  get restoresAgain(): boolean {
    return false;
  }

  /** The epoch in progress reports. */
  get stepEpoch(): number {
    return 0;
  }

  stamp(_h: Header, _dest: number): void {}

  suppress(_dest: number, _h: Header): boolean {
    return false;
  }

  /** An app or collective frame from a peer, on first arrival: deliver it (true) or not. */
  classify(_header: Header, _rawHeader: Buffer, _body: Buffer[]): boolean {
    return true;
  }

  /** A protocol frame with a tag of the recovery protocols' range: handled (true) or not. */
  onProtocol(_header: Header, _body: unknown): boolean {
    return false;
  }

  /** A coordinator message for the mode (`peer`, `peer-down`, `cpr-*`). */
  onControl(_msg: CoordinatorToRank): void {}

  /** The table arrived; the transport has not started delivering yet. */
  async beforeStart(_table: Extract<CoordinatorToRank, { t: "table" }>): Promise<void> {}

  /** The transport runs; init() returns after this. */
  async afterStart(): Promise<void> {}

  /** Throws if the mode cannot recover point-to-point calls. */
  pointToPoint(_what: string): void {}

  /** A non-deterministic call: its ticket, or undefined when nothing is logged. */
  ticket(_kind: NondetEntry["k"]): NondetTicket | undefined {
    return undefined;
  }

  logNondet(_ordinal: number, _entry: NondetEntry): void {}

  recvPoller<T>(_recv: PolledRecv): Poller<Message<T>> | undefined {
    return undefined;
  }

  sendPoller(): Poller<void> | undefined {
    return undefined;
  }

  /** A receive completed from a replay log swallowed the re-sent copy of its message. */
  ghostSwallowed(): void {}

  /**
   * Runs one collective (World already gave it its place in the program's order). `op`,
   * `root` and `data` identify the call for a replay (retry-one); `op` defaults to `kind`.
   */
  collective<R>(
    kind: CollKind,
    identity: readonly (string | number)[],
    algorithm: (io: coll.CollectiveIo) => Promise<R>,
    _op?: string,
    _root?: number,
    _data?: unknown,
    _bootstrapKey?: string,
  ): Promise<R> {
    return this.core.runner.run(kind, identity, algorithm);
  }

  /** A bootstrap collective (`key`) or a plain one (`key` undefined). */
  bootstrapped<R>(_key: string | undefined, run: () => Promise<R>): Promise<R> {
    return run();
  }

  reduce<T>(call: CollectiveCall, data: T, op: ReduceOp, root: number, opName: string, shape: string): Promise<T | undefined> {
    return call("reduce", [`root=${root}`, opName, shape], (io) => coll.reduce(io, data, op, root));
  }

  gather<T>(call: CollectiveCall, data: T, root: number): Promise<T[] | undefined> {
    return call("gather", [`root=${root}`], (io) => coll.gather(io, data, root));
  }

  scatter<T>(call: CollectiveCall, items: readonly T[] | undefined, root: number): Promise<T> {
    return call("scatter", [`root=${root}`], (io) => coll.scatter(io, items, root));
  }

  alltoall<T>(call: CollectiveCall, items: readonly T[]): Promise<T[]> {
    return call("alltoall", [], (io) => coll.alltoall(io, items));
  }

  /** restore()'s answer: the saved state, or undefined (nothing saved: a fresh start). */
  async restore(): Promise<RestoredState | undefined> {
    return undefined;
  }

  /** A checkpoint location (World checked that nothing is half-done). */
  async checkpoint(_state: unknown, _global: unknown): Promise<void> {
    this.core.versions++;
    this.core.reportStep(false);
  }

  nondet<T>(fn: () => T): T {
    if (typeof fn !== "function") throw new TypeError("nondet(fn) needs a function");
    return fn();
  }

  /** finalize() passed its barrier. */
  finalize(): void {}

  /** The rank is done (after the release, or on a failed start). */
  async close(): Promise<void> {}
}
