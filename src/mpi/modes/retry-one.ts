/**
 * Mode retry-one: only a failed rank restarts; it restores its own newest checkpoint from its
 * peers' memory, gets the results of the collectives it missed from their buffers, and is sent
 * again every message it had received after that checkpoint. The protocol's driver
 * (src/cpr/retry-one, plugged in through the {@link RetryOneHook} seam) decides, for each
 * collective call, whether it runs on the wire (with the sequence number and view id the
 * driver chose) or is answered from a buffer, keeps and replicates checkpoints and
 * determinants, and holds the output gate. This adapter binds it to the communicator.
 *
 * ## Point-to-point: sender-based message logging
 * (Johnson and Zwaenepoel, "Sender-based message logging", FTCS 1987; pessimistic, as in
 * MPICH-V2 and Open MPI's pessimist message-logging component.)
 * - Every application message a rank sends is kept in its *sender log* (its own copy of the
 *   body, which is also what goes out), per destination, until the destination's checkpoint
 *   that has consumed it is safe (`peerSafe`). The log is part of the sender's checkpoint, so
 *   a restarted sender still has the messages it sent before its checkpoint.
 * - Every channel numbers its application messages (`appSeq`). A receiver accepts them in
 *   order, once: below the next expected number a message is a copy it already has (dropped),
 *   above it the message waits for the ones before it.
 * - Every non-deterministic outcome (which message a wildcard receive or probe matched, what
 *   an iprobe or a poll saw, the index `waitAny` returned, a `nondet()` value) is a
 *   determinant: the driver logs it at the rank's successors, and no application or collective
 *   frame leaves the rank until every successor holds every determinant so far (the gate).
 * - A rank's checkpoint holds its program state, its channel counters, how many of each
 *   peer's messages it had consumed, and its sender log.
 *
 * Why a restarted rank then re-executes exactly as before and nobody else rolls back:
 * 1. It starts from its own checkpoint C. Every message it consumed after C is still in its
 *    sender's log (a sender drops a message only after a safe checkpoint of the receiver that
 *    consumed it, and C is at least the newest checkpoint any survivor knows to be safe); the
 *    senders resend them when it is back (and a restarted sender resends its whole restored
 *    log), and its counters drop the copies it already had at C.
 * 2. Deterministic receives (a named source) match the same messages as before: channels are
 *    FIFO and messages are accepted in `appSeq` order. Every outcome that depends on timing
 *    is replayed from its determinant, and every determinant whose effects reached anyone is
 *    held by every successor (the gate), so a live successor can give it back. Outcomes that
 *    were never made safe had no effects outside the rank: re-executing them anew is
 *    indistinguishable from a run where the rank failed before them.
 * 3. So its re-execution sends the same messages with the same numbers: the receivers drop
 *    the copies they already have, keep the rest. Its collectives are answered from the
 *    survivors' buffers (identity-checked) until it is where they are.
 * 4. Several ranks restarting at once each follow 1–3: a restarted sender's log holds what it
 *    sent before its checkpoint, its re-execution regenerates the rest.
 *
 * Collectives are as in Rabit: run on the wire or answered from a buffer; reduce, gather,
 * scatter and alltoall are rewritten into ones whose result is the same on every rank (so a
 * buffered result serves any rank).
 *
 * @example
 * const mode = new RetryOneMode(core, retryOneHook({ replicas: 2, failureTimeoutMs: 5000 }));
 */
import { LifelineError } from "../../errors.ts";
import { BouncePool } from "../bounce-pool.ts";
import type { AppLog, LoggedFrame } from "../channel.ts";
import { byteLengthOf, decodeValueOwned, encodedValueHead, encodeValue, isTypedArray } from "../codec.ts";
import type { CollKind } from "../coll-runner.ts";
import * as coll from "../collectives.ts";
import type { CoordinatorToRank } from "../control.ts";
import type { NondetEntry, NondetTicket, RawFrame } from "../cpr-hook.ts";
import {
  PROTO_RETRY_BASE,
  type ReplicaCodec,
  type RetryCollIdentity,
  type RetryDecision,
  type RetryOneHook,
  type RetryOneHookFactory,
  type RetryWorldAccess,
} from "../retry-hook.ts";
import type { ReduceOp } from "../types.ts";
import { decodeHeader, Encoding, type Header, Kind } from "../wire.ts";
import { LoggedMode } from "./logged.ts";
import type { CollectiveCall, ModeCore, RestoredState } from "./none.ts";

/** Steps of a second algorithm run in the same collective (reduce, then bcast). */
const RETRY_STEP_SHIFT = 1 << 20;
/**
 * Results of at least this size are copied for the result buffer into pooled memory, reused
 * once the protocol drops them (fresh memory faults in every page: several times the copy
 * itself).
 */
const RESULT_POOL_BYTES_MIN = 64 * 1024;
/**
 * Results from this size up to {@link RESULT_CHUNKS_BYTES_FROM} are kept as a pooled copy even
 * when the algorithm offers its own immutable chunks: those chunks (ZeroMQ's receive buffers,
 * mostly) are fresh memory for every call while they are kept, and faulting in their pages
 * costs more than the copy into reused memory. Measured with `node --import tsx
 * bench/tools/mode-ab.ts --modes none,retry-one --checkpoint-every 10`: the copy wins at 1 MiB,
 * the two are even at 256 KiB; below the bound the chunks spare the copy.
 */
const RESULT_CHUNKS_BYTES_MAX = 512 * 1024;
/**
 * Results of at least this size are kept as the algorithm's chunks again: copying them costs
 * more than their pages. One job at a time (`node --import tsx bench/tools/mode-ab.ts --sizes
 * 16777216,67108864 --iters 24 --rounds 3 --checkpoint-every 10`), retry-one took 1.04x mode
 * none's time at 16 MiB and 1.05-1.16x at 64 MiB with the chunks, against 1.25x and 1.32x with
 * the copy; at 4 and 8 MiB the copy was as fast or faster.
 */
const RESULT_CHUNKS_BYTES_FROM = 16 * 1024 * 1024;

/**
 * Whether a result of `bytes` whose algorithm offered its own chunks is kept as those chunks
 * (true) or as a pooled copy (see RESULT_CHUNKS_BYTES_MAX and RESULT_CHUNKS_BYTES_FROM).
 */
export function keepsResultChunks(bytes: number): boolean {
  return bytes < RESULT_CHUNKS_BYTES_MAX || bytes >= RESULT_CHUNKS_BYTES_FROM;
}

/** Idle memory of results and checkpoint copies kept for reuse. */
const RESULT_POOL_BYTES_MAX = 512 * 1024 * 1024;
/** Messages kept in the sender log, all destinations together (see logBytesMax). */
export const LOG_BYTES_MAX_DEFAULT = 1024 * 1024 * 1024;
/** Messages that arrived ahead of their turn (or before the rank restored), per rank. */
const HELD_APP_FRAMES_MAX = 65_536;
/** Bytes of all such messages together (a hostile or broken peer could send many). */
const HELD_APP_BYTES_MAX = 1024 * 1024 * 1024;

const frameBytes = (f: RawFrame): number => f.header.byteLength + byteLengthOf(f.body);

/** The collective queue with nothing in flight (see RetryOneMode.queue). */
const IDLE: Promise<unknown> = Promise.resolve();

/** The internal signal that ends a collective the protocol abandoned (never user-visible). */
class Abandoned extends Error {}

/** The collective running on the wire: abandoned by the protocol, and how its wait ends then. */
interface RetryRun {
  readonly seq: number;
  abandoned: boolean;
  /**
   * Ends the program's wait for the run (set once the run started): the wait's own reject, not
   * a closure (see runOne).
   */
  abandon: ((err: Abandoned) => void) | undefined;
}

/** A collective call as the protocol checks it on replay: op, root, type, length. */
function identOf(op: string, root: number, data: unknown): RetryCollIdentity {
  if (isTypedArray(data)) return { op, root, type: (data as object).constructor.name, length: (data as ArrayLike<unknown>).length };
  if (Array.isArray(data)) return { op, root, type: "msgpack", length: data.length };
  return { op, root, type: data === undefined ? "none" : "msgpack", length: 0 };
}

/** The library's part of a checkpoint (beside the program's encoded state). */
interface PackedLib {
  readonly channelSeqOut: number[];
  readonly appSeqOut: number[];
  /** Per peer, its messages consumed at the checkpoint (the next one to accept). */
  readonly consumed: number[];
  /** Non-deterministic calls before the checkpoint (the next ticket's ordinal). */
  readonly ordinal: number;
  /** `checkpoint()` calls up to this one (absent in checkpoints of older versions: 0). */
  readonly calls?: number;
}

/** A checkpoint as it travels to the successors: program state, library counters, sender log. */
interface Packed {
  readonly s: Buffer;
  readonly lib: PackedLib;
  /** [destination, appSeq, header, ...body] per logged message. */
  readonly log: readonly LogEntry[];
}

type LogEntry = readonly [number, number, Buffer, ...Buffer[]];

/** A checkpoint as a successor that holds an older one (`base`) is sent it (see packedLogCodec). */
interface PackedDelta {
  readonly s: Buffer;
  readonly lib: PackedLib;
  /** Per destination, the first message the checkpoint's log holds: the base's older ones are gone. */
  readonly logFrom: readonly number[];
  /** The log's messages the base did not have (sent after it), in the log's order. */
  readonly logAdd: readonly LogEntry[];
}

/** The state Buffer and the library's counters, which a checkpoint and a difference both carry. */
function hasStateAndLib(v: unknown): v is { s: Buffer; lib: PackedLib } {
  if (typeof v !== "object" || v === null) return false;
  const p = v as Partial<Packed>;
  return Buffer.isBuffer(p.s) && typeof p.lib === "object" && p.lib !== null && Array.isArray(p.lib.appSeqOut);
}

function isPacked(v: unknown): v is Packed {
  return hasStateAndLib(v) && Array.isArray((v as Partial<Packed>).log);
}

function isPackedDelta(v: unknown): v is PackedDelta {
  return hasStateAndLib(v) && Array.isArray((v as Partial<PackedDelta>).logFrom) && Array.isArray((v as Partial<PackedDelta>).logAdd);
}

/** Per destination, the first message a checkpoint's log holds (its appSeqOut when none). */
function logFromOf(p: Packed): number[] {
  const from = [...p.lib.appSeqOut];
  const seen = new Set<number>();
  for (const [dest, seq] of p.log) {
    if (seen.has(dest)) continue;
    seen.add(dest);
    from[dest] = seq;
  }
  return from;
}

/**
 * A checkpoint's sender log is most of what its replica carries, and each message in it stays
 * there until its receiver's next safe checkpoint: a rank that checkpoints more often than its
 * receivers would send the same messages to its successors at every checkpoint. So a successor
 * that holds the rank's safe checkpoint is sent only what the log gained since (with the first
 * message it still holds per destination), and rebuilds the whole checkpoint from the two. The
 * messages are the same Buffers in both: nothing is copied.
 */
export const packedLogCodec: ReplicaCodec = {
  diff(base: unknown, next: unknown): PackedDelta | undefined {
    if (!isPacked(base) || !isPacked(next) || base.lib.appSeqOut.length !== next.lib.appSeqOut.length) return undefined;
    const baseFrom = logFromOf(base);
    const logFrom = logFromOf(next);
    // The base must hold every message of `next` that it could have (logs lose messages only at their start).
    if (logFrom.some((from, dest) => from < baseFrom[dest]!)) return undefined;
    const logAdd = next.log.filter(([dest, seq]) => seq >= base.lib.appSeqOut[dest]!);
    if (logAdd.length === next.log.length) return undefined; // nothing saved
    return { s: next.s, lib: next.lib, logFrom, logAdd };
  },
  patch(base: unknown, delta: unknown): Packed {
    if (!isPacked(base) || !isPackedDelta(delta) || delta.logFrom.length !== base.lib.appSeqOut.length) {
      throw new LifelineError("CPR_PROTOCOL", "retry-one: a checkpoint sent as a difference does not fit the checkpoint it is based on");
    }
    const baseFrom = logFromOf(base);
    delta.logFrom.forEach((from, dest) => {
      if (from < baseFrom[dest]!) {
        throw new LifelineError(
          "CPR_PROTOCOL",
          `retry-one: a checkpoint's log starts at message ${from} to rank ${dest}, before its base's (${baseFrom[dest]})`,
        );
      }
    });
    const log: LogEntry[] = [];
    for (const e of base.log) if (e[1] >= delta.logFrom[e[0]]!) log.push(e);
    for (const e of delta.logAdd) log.push(e);
    return { s: delta.s, lib: delta.lib, log };
  },
};

/**
 * A message in the sender log. Its large body frames are copies in pooled memory (fresh memory
 * faults in every page: copying 16 MiB into it costs about eight times the copy into warm
 * memory), which go back to the pool once nothing can read them (`holds` reaches 0):
 * - the log holds it until the receiver's safe checkpoint consumed it — by then the receiver
 *   had every byte, so ZeroMQ is done reading it (it is sent once, from this very copy);
 * - each of this rank's checkpoints that took it (the log is part of the checkpoint) holds it
 *   until the checkpoint is released clean (`ownReleased`: sent to its successors only, and
 *   each has received what was sent after it).
 * A frame sent again (to a restarted receiver) or taken by a checkpoint that went elsewhere is
 * never reused: the garbage collector frees it once ZeroMQ and everyone let go of it.
 */
interface KeptFrame extends LoggedFrame {
  holds: number;
  /** Its pooled body frames (undefined: none, or never to be reused). */
  pooled: Buffer[] | undefined;
}

export interface RetryOneModeOptions {
  /** Bound on the sender log (bytes of bodies, all destinations); beyond it the job stops with CPR_CHECKPOINT. */
  readonly logBytesMax?: number;
}

export class RetryOneMode extends LoggedMode implements AppLog {
  private readonly hook: RetryOneHook;
  /** The epoch field of collective frames (the protocol's view id). */
  private collEpoch = 0;
  /** The collective running on the wire, and whether the protocol abandoned it. */
  private retryRun: RetryRun | undefined;
  /** Memory of kept collective results, and the buffers it lent out (see recycle). */
  private readonly resultPool = new BouncePool(RESULT_POOL_BYTES_MAX, 8);
  private readonly pooledResults = new WeakSet<Buffer>();

  /** The sender log: per destination, the messages it may still need, by appSeq. */
  private log: KeptFrame[][];
  /** Body copies made in pooled memory by copyBody (until record() takes them). */
  private readonly logPooled = new WeakSet<Buffer>();
  /** This rank's checkpoints by version, with the log frames each took (see KeptFrame). */
  private readonly captured = new Map<number, KeptFrame[]>();
  private logBytes = 0;
  private readonly logBytesMax: number;
  /** Per source, the appSeq of the next message to accept. */
  private readonly expected: number[];
  /** Per source, messages that arrived ahead of their turn, by appSeq. */
  private readonly ahead: Map<number, RawFrame>[];
  /** Messages held until the rank restored, or until the coordinator's news of their sender's incarnation. */
  private heldApp: RawFrame[] = [];
  /** Bytes in heldApp and every ahead map. */
  private heldAppBytes = 0;
  private restoreCalled = false;
  /** A restarted rank until its restore() got the checkpoint (its counters are unknown). */
  private awaitingRestore: boolean;
  /** `--checkpoint-every Nsteps`: only every Nth `checkpoint()` call is a checkpoint (undefined: every call). */
  private checkpointSteps: number | undefined;
  /** `checkpoint()` calls so far, and up to the last one that was a checkpoint (both restored with it). */
  private checkpointCalls = 0;
  private checkpointCallsAtLast = 0;
  /** Non-deterministic calls so far (the next ticket's ordinal). */
  private ordinal = 0;
  /** Determinants logged so far (the machine's count). */
  private logged = 0;
  /** After a restore: outcomes to replay, by the ordinal of their call. */
  private replay: Map<number, NondetEntry> | undefined;

  constructor(core: ModeCore, factory: RetryOneHookFactory, opts: RetryOneModeOptions = {}) {
    super(core);
    this.hook = factory(this.access(), core.host);
    core.runner.colls.supersede = true;
    core.channel.appLog = this;
    this.logBytesMax = opts.logBytesMax ?? LOG_BYTES_MAX_DEFAULT;
    this.log = Array.from({ length: core.size }, () => []);
    this.expected = new Array<number>(core.size).fill(0);
    this.ahead = Array.from({ length: core.size }, () => new Map<number, RawFrame>());
    // Until restore() the counters of what to accept are unknown: a restarted rank's, and every
    // rank's when the whole job starts again from durable checkpoints (a resumed job runs
    // attempt 0 again). No receive can come before restore() anyway (pointToPoint()).
    this.awaitingRestore = true;
  }

  /** What the retry-one driver may do with this communicator. */
  private access(): RetryWorldAccess {
    const core = this.core;
    return {
      rank: core.rank,
      size: core.size,
      attempt: core.attempt,
      sendProtocol: (dest, tag, body) => core.channel.sendProtocol(dest, tag, body),
      caughtUp: (info) => core.sendControl({ t: "retry-caught-up", rank: core.rank, attempt: core.attempt, ...info }),
      recycle: (buf) => {
        if (!this.pooledResults.delete(buf)) return; // not ours (e.g. a transfer's), or given back twice
        this.resultPool.release(buf);
      },
      ownReleased: (version, clean) => this.ownReleased(version, clean),
      abandonCollective: (seq) => {
        const err = new Abandoned(`collective #${seq} abandoned`);
        if (this.retryRun !== undefined && this.retryRun.seq === seq) {
          this.retryRun.abandoned = true;
          this.retryRun.abandon?.(err);
        }
        core.runner.colls.abandon(seq, err);
      },
      inject: (frame) => core.channel.inject(frame),
      fatal: (code, message) => {
        const err = new LifelineError(code, message);
        core.fatal(err);
        core.failPending(err);
      },
      afterAbort: (fn) => core.afterAbort(fn),
      setGate: (open) => core.channel.setGate(open),
      peerSafe: (rank, consumed) => this.dropLogged(rank, consumed),
      sendControl: (msg) => core.sendControl(msg),
      replicaCodec: packedLogCodec,
    };
  }

  override get viewId(): number {
    return this.hook.viewId;
  }

  override get queriesPaused(): boolean {
    return this.hook.inRecovery;
  }

  override get stepEpoch(): number {
    return this.core.versions;
  }

  override stamp(h: Header, _dest: number): void {
    if (h.kind === Kind.collective) h.epoch = this.collEpoch;
  }

  override classify(header: Header, rawHeader: Buffer, body: Buffer[]): boolean {
    if (header.kind === Kind.collective) return this.hook.arrive(header, { header: rawHeader, body });
    if (header.kind !== Kind.app) return true;
    return this.acceptApp(header, { header: rawHeader, body });
  }

  override onProtocol(header: Header, body: unknown): boolean {
    if (header.tag < PROTO_RETRY_BASE) return false;
    this.hook.onProtocol(header, body);
    return true;
  }

  override onControl(msg: CoordinatorToRank): void {
    if (msg.t === "peer") {
      // The peer runs again (World connected its new endpoint): it gets every message we
      // still keep for it, in order; it drops the ones its checkpoint already has.
      if (msg.rank !== this.core.rank) {
        for (const f of this.log[msg.rank] ?? []) {
          f.pooled = undefined; // ZeroMQ reads it again, for as long as it takes: never reused
          this.core.channel.resend(msg.rank, f);
        }
      }
      this.hook.onControl(msg);
      this.reclassifyHeld();
      return;
    }
    if (msg.t === "peer-down" || msg.t === "cpr-durable-keep" || msg.t === "release") this.hook.onControl(msg);
  }

  override beforeStart(table: Extract<CoordinatorToRank, { t: "table" }>): Promise<void> {
    this.checkpointSteps = typeof table.checkpointSteps === "number" && table.checkpointSteps > 0 ? table.checkpointSteps : undefined;
    return this.hook.beforeStart(table);
  }

  // ---- point-to-point: the sender log and ordered, once-only arrival ---------------------------

  /** The log's copy of a body frame (AppLog): large ones to another rank in pooled memory. */
  copyBody(dest: number, bytes: Uint8Array): Buffer {
    // A message to itself is delivered from the copy: the program may keep views of it.
    if (dest === this.core.rank || bytes.byteLength < RESULT_POOL_BYTES_MIN) return Buffer.from(bytes);
    const buf = this.resultPool.acquire(bytes.byteLength);
    buf.set(bytes);
    this.logPooled.add(buf);
    return buf;
  }

  /** Every message the channel sends (AppLog): kept until its receiver's safe checkpoint covers it. */
  record(dest: number, frame: LoggedFrame): void {
    const pooled = frame.body.filter((b) => this.logPooled.delete(b));
    this.log[dest]!.push({ ...frame, holds: 1, pooled: pooled.length > 0 ? pooled : undefined });
    this.logBytes += byteLengthOf(frame.body);
    if (this.logBytes > this.logBytesMax) {
      let worst = 0;
      for (let d = 0; d < this.log.length; d++)
        if (byteLengthOf(this.log[d]!.flatMap((f) => f.body)) > byteLengthOf(this.log[worst]!.flatMap((f) => f.body))) worst = d;
      const err = new LifelineError(
        "CPR_CHECKPOINT",
        `rank ${this.core.rank} keeps ${this.logBytes} bytes of messages that their receivers have not covered with a safe checkpoint yet (most for rank ${worst}: ${this.log[worst]!.length} messages), above the bound of ${this.logBytesMax} bytes; in retry-one every rank must call checkpoint() now and then (each message is kept until its receiver's next checkpoint), or raise the bound (--log-limit)`,
      );
      this.core.fatal(err);
      this.core.failPending(err);
    }
  }

  /** `rank`'s safe checkpoint had consumed `consumed` of our messages: those are never needed again. */
  private dropLogged(rank: number, consumed: number): void {
    const l = this.log[rank];
    if (l === undefined) return;
    let n = 0;
    while (n < l.length && l[n]!.appSeq < consumed) {
      this.logBytes -= byteLengthOf(l[n]!.body);
      this.unhold(l[n]!);
      n++;
    }
    if (n > 0) l.splice(0, n);
  }

  private unhold(f: KeptFrame): void {
    if (--f.holds > 0 || f.pooled === undefined) return;
    for (const b of f.pooled) this.resultPool.release(b);
    f.pooled = undefined;
  }

  /** Checkpoint `version` is gone (see KeptFrame); older ones without this news are gone too. */
  private ownReleased(version: number, clean: boolean): void {
    for (const [v, frames] of this.captured) {
      if (v > version) continue;
      this.captured.delete(v);
      for (const f of frames) {
        if (v === version && clean) this.unhold(f);
        else f.pooled = undefined;
      }
    }
  }

  /**
   * An application frame from a peer: accepted if it is the next of its channel; a copy of
   * one already accepted, or from a dead incarnation, is dropped; one ahead of its turn, or
   * from an incarnation we have not heard of, or arriving before this restarted rank has its
   * checkpoint back, waits.
   */
  private acceptApp(h: Header, frame: RawFrame): boolean {
    const src = h.source;
    if (this.awaitingRestore) return this.holdApp(frame);
    const known = this.hook.view[src] ?? 0;
    if (h.attempt < known) return false;
    if (h.attempt > known) return this.holdApp(frame);
    const want = this.expected[src]!;
    const seq = h.collSeq;
    if (seq < want) return false;
    if (seq > want) {
      const ahead = this.ahead[src]!;
      if (ahead.has(seq)) return false; // a copy (resent while the first was on its way)
      if (ahead.size >= HELD_APP_FRAMES_MAX || !this.hold(frame)) this.overflow(`messages from rank ${src} ahead of #${want}`);
      else ahead.set(seq, frame);
      return false;
    }
    this.expected[src] = want + 1;
    if (this.ahead[src]!.size > 0) this.core.host.defer(() => this.drainAhead(src));
    return true;
  }

  private holdApp(frame: RawFrame): false {
    if (this.heldApp.length >= HELD_APP_FRAMES_MAX || !this.hold(frame)) this.overflow("messages waiting for this rank's restore or for news of their sender");
    else this.heldApp.push(frame);
    return false;
  }

  /** Counts a frame kept out of the matcher for now; false if that would pass the bound. */
  private hold(frame: RawFrame): boolean {
    const bytes = frameBytes(frame);
    if (this.heldAppBytes + bytes > HELD_APP_BYTES_MAX) return false;
    this.heldAppBytes += bytes;
    return true;
  }

  private overflow(what: string): void {
    const err = new LifelineError("CPR_PROTOCOL", `rank ${this.core.rank}: more than ${HELD_APP_FRAMES_MAX} (or ${HELD_APP_BYTES_MAX} bytes of) ${what}`);
    this.core.fatal(err);
    this.core.failPending(err);
  }

  /** Delivers the messages that waited for the one just accepted, in order. */
  private drainAhead(src: number): void {
    const ahead = this.ahead[src]!;
    for (;;) {
      const want = this.expected[src]!;
      const f = ahead.get(want);
      if (f === undefined) return;
      ahead.delete(want);
      this.heldAppBytes -= frameBytes(f);
      this.expected[src] = want + 1;
      this.core.channel.inject(f);
    }
  }

  /** Held messages, classified again (the rank restored, or heard of a restart). */
  private reclassifyHeld(): void {
    if (this.awaitingRestore || this.heldApp.length === 0) return;
    const held = this.heldApp;
    this.heldApp = [];
    for (const f of held) {
      this.heldAppBytes -= frameBytes(f);
      let h: Header;
      try {
        h = decodeHeader(f.header, { keysIn: "stored", size: this.core.size });
      } catch {
        continue; // it was checked on arrival
      }
      if (this.acceptApp(h, f)) this.core.channel.inject(f);
    }
  }

  /** Point-to-point calls are recoverable here, but only after restore() (a restarted rank's counters come from it). */
  override pointToPoint(what: string): void {
    if (!this.restoreCalled) {
      throw new LifelineError(
        "CPR_RESTORE",
        `${what}() before restore(); in --mode retry-one a program must call restore() before any point-to-point call (a restarted rank's message counters come from its checkpoint)`,
      );
    }
  }

  // ---- determinants --------------------------------------------------------------------------

  override ticket(kind: NondetEntry["k"]): NondetTicket | undefined {
    const ordinal = this.ordinal++;
    const replay = this.replay?.get(ordinal);
    if (replay === undefined) return { ordinal, replay: undefined };
    this.replay!.delete(ordinal);
    if (this.replay!.size === 0) this.replay = undefined;
    if (replay.k !== kind) {
      const err = new LifelineError(
        "CPR_REPLAY",
        `rank ${this.core.rank}: replay diverged at non-deterministic call #${ordinal}: it is a ${kind} here, but a ${replay.k} was logged there; the program must make the same calls after a restart`,
      );
      this.core.fatal(err);
      throw err;
    }
    return { ordinal, replay };
  }

  override logNondet(ordinal: number, entry: NondetEntry): void {
    // Closes the gate at once (the driver's machine does, synchronously), before anything that
    // depends on this outcome can be sent.
    this.hook.logDets(this.logged, [[ordinal, entry]]);
    this.logged++;
  }

  // ---- collectives -------------------------------------------------------------------------------

  /**
   * The collective calls not finished yet, in program order: each starts when the one before
   * ended. Back to {@link IDLE} once none is in flight, so that it holds no finished call's
   * result (the program may have dropped it; the protocol keeps its own copy).
   */
  private queue: Promise<unknown> = IDLE;
  private inFlight = 0;

  /**
   * Collectives in flight at once (`Promise.all` of two allreduces) run one after another in
   * the order the program called them — the same order on every rank — since the protocol
   * decides, replays and counts one call at a time. Each gets the result it would alone.
   */
  override collective<R>(
    kind: CollKind,
    identity: readonly (string | number)[],
    algorithm: (io: coll.CollectiveIo) => Promise<R>,
    op?: string,
    root = -1,
    data?: unknown,
    bootstrapKey?: string,
  ): Promise<R> {
    // Nothing in flight (the common case): at once, without a hop through the queue. runOne
    // counts the call out when it ends.
    this.inFlight++;
    const go = (): Promise<R> => this.runOne(kind, identity, algorithm, op, root, data, bootstrapKey);
    const run = this.inFlight === 1 ? go() : this.queue.then(go, go);
    // A call that ended at once (a replay answered from the buffer, or a failure) counted itself
    // out already and left the queue IDLE: keep it so, not holding the result it returned.
    if (this.inFlight !== 0) this.queue = run;
    return run;
  }

  /**
   * The protocol answers the call from a buffer (a replay) or has it run on the wire as the
   * given sequence number in the given view; an abandoned run (a peer failed) asks the
   * protocol again.
   */
  private async runOne<R>(
    kind: CollKind,
    identity: readonly (string | number)[],
    algorithm: (io: coll.CollectiveIo) => Promise<R>,
    op?: string,
    root = -1,
    data?: unknown,
    bootstrapKey?: string,
  ): Promise<R> {
    // Counted out when it ends, however it ends (see collective()).
    try {
      const hook = this.hook;
      const { runner } = this.core;
      const ident = identOf(op ?? kind, root, data);
      const first = hook.beforeCollective(bootstrapKey === undefined ? { ident } : { ident, bootstrapKey });
      // Run at once when the protocol decided at once, as in mode none: no hop through a promise.
      let d: RetryDecision = first instanceof Promise ? await first : first;
      for (;;) {
        const failure = this.core.failure();
        if (failure !== undefined) throw failure;
        // A copy: the buffer's result may be served again (to another restarted peer), so the
        // program must not get a view of it that it could change.
        if ("result" in d) return decodeValueOwned(d.result) as R;
        const { wireSeq, viewId, purgeBelow } = d.run;
        runner.colls.restoreNextSeq(wireSeq);
        runner.colls.purge((a) => a.header.epoch === viewId && a.header.collSeq >= purgeBelow);
        this.collEpoch = viewId;
        const mine: RetryRun = { seq: wireSeq, abandoned: hook.isAbandoned(wireSeq), abandon: undefined };
        this.retryRun = mine;
        let ran = false;
        let value!: R;
        let retained: { arrayType: number; parts: readonly Buffer[] } | undefined;
        // Abandoned before it started (the abandon overtook the decision): not run at all.
        if (!mine.abandoned) {
          try {
            const running = runner.run(kind, identity, algorithm, (arrayType, parts) => {
              retained = { arrayType, parts };
            });
            // A run blocked in a send to a dead peer never ends by itself: the abandon ends the
            // wait (and the run, which may end later, is left to itself; nobody waits for it).
            // `abandon` is the wait's own reject, not a closure that calls it: with such a
            // closure, minor GCs kept every collective's result and received chunks until a
            // mark-compact (300 allreduces of 1 MiB on 4 ranks: 70-73 mark-compacts against 13-21;
            // `--v8-flags=--trace-gc` of bench/programs/allreduce-loop.ts).
            value = await new Promise<R>((resolve, reject) => {
              mine.abandon = reject;
              if (mine.abandoned) reject(new Abandoned(`collective #${mine.seq} abandoned`)); // while it started
              running.then(resolve, reject);
            });
            ran = true;
          } catch (err) {
            if (!(err instanceof Abandoned) && !mine.abandoned) throw err;
          }
        }
        if (this.retryRun === mine) this.retryRun = undefined;
        if (ran && !mine.abandoned) {
          // The algorithm's own immutable chunks when it offered them, below one bound or from
          // the other (no copy), else a copy (see keepsResultChunks).
          const bytes = retained === undefined ? 0 : byteLengthOf(retained.parts);
          hook.afterCollective(
            retained !== undefined && retained.parts.length > 0 && keepsResultChunks(bytes)
              ? [encodedValueHead(Encoding.typedArray, retained.arrayType, [bytes]), ...retained.parts]
              : encodeValue(value, this.allocResult),
          );
          return value;
        }
        d = await hook.resumeCollective();
      }
    } finally {
      if (--this.inFlight === 0) this.queue = IDLE;
    }
  }

  /** resultBuffer as a function to hand out: one for every call, not a closure per collective. */
  private readonly allocResult = (bytes: number): Buffer => this.resultBuffer(bytes);

  /** Memory for a kept result or checkpoint copy (pooled when large; see recycle in access()). */
  private resultBuffer(bytes: number): Buffer {
    if (bytes < RESULT_POOL_BYTES_MIN) return Buffer.allocUnsafe(bytes);
    const buf = this.resultPool.acquire(bytes);
    this.pooledResults.add(buf);
    return buf;
  }

  override reduce<T>(call: CollectiveCall, data: T, op: ReduceOp, root: number, opName: string, shape: string): Promise<T | undefined> {
    // A buffered result must serve any rank: the reduce runs as in the other modes (so the
    // root's result is bit for bit theirs: float sums depend on the combining order), then
    // the root broadcasts it, in the same collective with its steps shifted.
    return call(
      "reduce",
      [`root=${root}`, opName, shape, "retry-one"],
      async (io) => {
        const r = await coll.reduce(io, data, op, root);
        const shifted: coll.CollectiveIo = {
          ...io,
          send: (d, step, b) => io.send(d, step + RETRY_STEP_SHIFT, b),
          recv: (src, step) => io.recv(src, step + RETRY_STEP_SHIFT),
        };
        return coll.bcast(shifted, r, root);
      },
      `reduce:${opName}`,
      root,
      data,
    ).then((r) => (this.core.rank === root ? r : undefined));
  }

  override gather<T>(call: CollectiveCall, data: T, root: number): Promise<T[] | undefined> {
    return call("allgather", [`gather root=${root}`], (io) => coll.allgather(io, data), "gather", root).then((r) => (this.core.rank === root ? r : undefined));
  }

  override scatter<T>(call: CollectiveCall, items: readonly T[] | undefined, root: number): Promise<T> {
    // Every rank gets the root's items (a bcast) and picks its own: replayable for any rank.
    return call("bcast", [`scatter root=${root}`], (io) => coll.bcast(io, items, root), "scatter", root).then(
      (all) => (all as readonly T[])[this.core.rank] as T,
    );
  }

  override alltoall<T>(call: CollectiveCall, items: readonly T[]): Promise<T[]> {
    // Every rank gets every row (an allgather: p times the data) and picks its column.
    return call("allgather", ["alltoall"], (io) => coll.allgather(io, items), "alltoall", -1, items).then((rows) =>
      (rows as T[][]).map((row) => row[this.core.rank]!),
    );
  }

  // ---- checkpoint and restore ------------------------------------------------------------------

  override async restore(): Promise<RestoredState | undefined> {
    const got = await this.hook.restore();
    this.restoreCalled = true;
    this.logged = got.detFrom + got.dets.length;
    if (got.dets.length > 0) {
      this.replay = new Map();
      for (const item of got.dets) {
        const [ordinal, entry] = item as [number, NondetEntry];
        this.replay.set(ordinal, entry);
      }
    }
    const v = got.value;
    let restored: RestoredState | undefined;
    if (v !== undefined) {
      const packed = v.state as Packed;
      const lib = packed.lib;
      const { channel } = this.core;
      channel.restoreCounters(lib);
      lib.consumed.forEach((n, r) => {
        this.expected[r] = n;
        for (const [seq, f] of this.ahead[r]!) {
          if (seq >= n) continue;
          this.ahead[r]!.delete(seq);
          this.heldAppBytes -= frameBytes(f);
        }
      });
      this.ordinal = lib.ordinal;
      this.checkpointCalls = this.checkpointCallsAtLast = lib.calls ?? 0;
      this.logBytes = 0;
      this.log = Array.from({ length: this.core.size }, () => []);
      for (const [dest, appSeq, header, ...body] of packed.log) {
        this.log[dest]!.push({ appSeq, header: Buffer.from(header), body: body.map((b) => Buffer.from(b)), holds: 1, pooled: undefined });
        this.logBytes += byteLengthOf(body);
      }
      // What this rank sent before its checkpoint goes out again (the receivers keep what
      // they lack); its own messages to itself that it had not consumed come back at once.
      for (let dest = 0; dest < this.core.size; dest++) {
        const minSeq = dest === this.core.rank ? lib.consumed[dest]! : 0;
        for (const f of this.log[dest]!) if (f.appSeq >= minSeq) channel.resend(dest, f);
      }
      this.core.versions = v.version;
      // The global into memory of its own: this rank keeps the bytes it came as and gives them to
      // a peer that restarts from the same checkpoint, while its program changes its global.
      restored = { state: decodeValueOwned(packed.s), global: v.global === undefined ? undefined : decodeValueOwned(v.global), version: v.version };
    }
    // Counted as in the run that took the checkpoint (fault coordinates: version, seqno).
    this.core.resetCollectiveCount();
    this.awaitingRestore = false;
    this.reclassifyHeld();
    for (let r = 0; r < this.core.size; r++) this.drainAhead(r);
    // The checkpoint's global, if no rank kept it when this rank restored: a peer gives it once
    // it reaches that checkpoint (our log went out again above: it may need it to get there).
    if (restored !== undefined && v?.globalLater !== undefined) restored = { ...restored, global: decodeValueOwned(await v.globalLater) };
    return restored;
  }

  override async checkpoint(state: unknown, global: unknown): Promise<void> {
    // With a step count, a call is a checkpoint once that many calls went by since the last
    // one; the counts come back with a restore, so a restarted rank chooses the same calls.
    this.checkpointCalls++;
    const every = this.checkpointSteps;
    if (every !== undefined && this.checkpointCalls - this.checkpointCallsAtLast < every) {
      this.core.reportStep(false);
      return;
    }
    if (this.ghosts > 0) {
      // A replayed poll completed a receive from the log and its re-sent copy is still on its
      // way: a checkpoint now would count it as not consumed. Not a checkpoint location this
      // time; the next one is.
      this.core.reportStep(false);
      return;
    }
    const { channel, matcher, rank, size } = this.core;
    // Messages to self still queued are part of the channel: into the matcher first.
    channel.deliverSelf(Infinity);
    const counters = channel.counters();
    const queued = new Array<number>(size).fill(0);
    for (const env of matcher.queuedInOrder()) queued[env.source]!++;
    const consumed = this.expected.map((n, r) => (r === rank ? counters.appSeqOut[r]! : n) - queued[r]!);
    const lib: PackedLib = {
      channelSeqOut: counters.channelSeqOut,
      appSeqOut: counters.appSeqOut,
      consumed,
      ordinal: this.ordinal,
      calls: this.checkpointCalls,
    };
    this.checkpointCallsAtLast = this.checkpointCalls;
    const log: [number, number, Buffer, ...Buffer[]][] = [];
    const taken: KeptFrame[] = [];
    this.log.forEach((l, dest) => {
      for (const f of l) {
        log.push([dest, f.appSeq, f.header, ...f.body]);
        if (f.pooled === undefined) continue;
        f.holds++;
        taken.push(f);
      }
    });
    // The version the driver gives this checkpoint (its count so far + 1).
    if (taken.length > 0) this.captured.set(this.hook.progress.version + 1, taken);
    // The program state now (a copy: later changes must not reach the checkpoint), or, for the
    // function form, when a copy is first needed; the library's part is taken now either way.
    const alloc = this.allocResult;
    const packed =
      typeof state === "function"
        ? (): Packed => ({ s: encodeValue((state as () => unknown)(), alloc), lib, log })
        : { s: encodeValue(state, alloc), lib, log };
    const g = global === undefined ? undefined : encodeValue(global, alloc);
    // Per destination, the first message the log holds: the durable floor checks that what was
    // in flight at a checkpoint can be sent again.
    const logFrom = this.log.map((l, dest) => l[0]?.appSeq ?? counters.appSeqOut[dest]!);
    await this.hook.checkpoint(packed, g, { consumed, sent: counters.appSeqOut, logFrom });
    // Our own messages to ourselves that the checkpoint consumed are never needed again.
    this.dropLogged(rank, consumed[rank]!);
    this.core.versions = this.hook.progress.version;
    this.core.reportStep(true);
  }

  /** The rank stays to serve restarted peers until the release. */
  override finalize(): void {
    this.hook.finalize();
  }

  override close(): Promise<void> {
    return this.hook.close();
  }
}
