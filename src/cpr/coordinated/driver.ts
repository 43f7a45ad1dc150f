/**
 * The rank-side driver of coordinated checkpointing: binds the pure {@link RankMachine} to a
 * World (through the {@link CprHook} seam of src/mpi) and to the rank's part store.
 *
 * The driver owns what the machine must not: serializing the program's and the library's
 * state at a checkpoint location, copying late frames, writing the part (never awaited by
 * the program: the write runs while the program continues, and its outcome goes to the
 * initiator as cpr-part / cpr-part-failed), and, on recovery, reading the part, restoring the
 * library state, re-injecting the logged frames before the transport delivers anything, and
 * exchanging early-id lists with every peer before init() returns. It also keeps a line's
 * `global` in one part only (see PROTO_CPR_GLOBAL_SUM), aligning the ranks' checkpoint counts
 * so that their globals are equal (PROTO_CPR_COUNT), and, with per-host stores, copies each
 * part to its partner (PROTO_CPR_AHEAD, PROTO_CPR_COPY).
 *
 * Time and I/O come from the World's Host and the part store given at construction, so the
 * simulator runs this same code over a MemoryRecoveryStore.
 *
 * @example
 * const world = await World.join(place, { cpr: coordinatedHook(() => new LevelRecoveryStore(place.store).openRank(place.rank)) });
 */
import { LifelineError, errorMessage } from "../../errors.ts";
import { BouncePool } from "../../mpi/bounce-pool.ts";
import { bytesOf, decodeValue, decodeValueChunks, decodeValueOwned, encodedValueChunks, encodeValue, encodeValueChunks } from "../../mpi/codec.ts";
import type { CoordinatorToRank, PartRefWire } from "../../mpi/control.ts";
import type { CprHook, CprHookFactory, CprWorldAccess, LibState, NondetEntry, NondetTicket, RawFrame } from "../../mpi/cpr-hook.ts";
import { PROTO_CPR_BASE } from "../../mpi/cpr-hook.ts";
import type { Host, Timer } from "../../mpi/host.ts";
import { Flag, frameId, type Header } from "../../mpi/wire.ts";
import { crc32 } from "../../store/checksum.ts";
import { blockSha256s, listSha256, sha256OffThread } from "../../store/checksum-thread.ts";
import { BLOCK_BYTES, type BlockOptions, type JobRecord, type KnownSha256, type LineManifest } from "../../store/types.ts";
import { RankMachine, type RankEffect } from "./rank.ts";

/** The part store operations the driver needs (RankPartStore satisfies it). */
export interface PartStoreLike {
  putPart(
    epoch: number,
    bytes: Uint8Array | readonly Uint8Array[],
    signal?: AbortSignal,
    blocks?: BlockOptions,
  ): Promise<{ rank: number; epoch: number; checksum: number; bytes: number }>;
  readPart(ref: { rank: number; epoch: number; checksum: number; bytes: number }): Promise<Buffer>;
  retain(keep: readonly number[], opts?: { dropNewer?: boolean }): Promise<number[]>;
  dropParts(epochs: readonly number[]): Promise<number[]>;
  close(): Promise<void>;
}

/**
 * Per-host stores (src/store/partners.ts): where this rank keeps the copies it holds of its
 * partners' parts, its copy of the commit records, and, for the launcher before a table, the
 * whole host's store. Used only when the launcher asks (a table naming a partner or the lines
 * to keep, `cpr-inventory`, `cpr-fetch`, a `cpr-committed` with its record).
 */
export interface HostStores {
  /** The store of the copies this rank keeps of rank `of`'s parts (opened once). */
  held(of: number): Promise<PartStoreLike>;
  /** The ranks whose copies this rank's host keeps for it (from earlier runs too). */
  heldRanks(): Promise<number[]>;
  /** This rank's copy of the commit records and the job record. */
  replica(): Promise<LineManifest>;
  /** Every part the host's store holds that verifies, with its database; `problems` say what could not be read. */
  scan(): Promise<{ parts: { ref: PartRefWire; where: string }[]; problems: string[] }>;
  /** Part `ref` from database `where` of the host's store, verified. */
  read(where: string, ref: PartRefWire): Promise<Buffer>;
  /** Closes the copies' stores and the replica (not the rank's own part store). */
  close(): Promise<void>;
}

/** Protocol-frame tags. */
export const PROTO_CPR_MARKER = PROTO_CPR_BASE;
export const PROTO_CPR_EARLY = PROTO_CPR_BASE + 1;
/**
 * Per-host stores: a part for the partner to keep, and the partner's answer. The part travels
 * as the chunks of its encoding; those that are the checkpoint's serialized state, sent ahead
 * when the checkpoint was taken (PROTO_CPR_AHEAD), are named by their place in that message.
 * The global writer's global is named (`{ global: name }`, see globalName) and never travels:
 * the partner took the same line's checkpoint and holds an equal global, whose bytes it writes
 * in its place. A partner whose global differs answers `resend`, and the part goes again whole.
 */
export const PROTO_CPR_COPY = PROTO_CPR_BASE + 2;
export const PROTO_CPR_COPIED = PROTO_CPR_BASE + 3;
/**
 * Per-host stores: a checkpoint's serialized state, sent to the partner as soon as it is taken,
 * so that the bulk of the copy crosses the network while the round records, not after it.
 */
export const PROTO_CPR_AHEAD = PROTO_CPR_BASE + 4;
/** States sent ahead that a partner keeps per source rank, waiting for their parts. */
const AHEAD_KEPT_MAX = 3;
/** Lines whose saved globals a rank keeps (see keptGlobals): a line that never ended goes after this many newer ones. */
const KEPT_GLOBALS_MAX = 2;
/**
 * A line's `global` — identical on every rank by the API's contract — is stored once: by the
 * global writer (GLOBAL_WRITER), whose part holds it. Each other rank compares the name of
 * its own (globalName: a SHA-256 of its blocks' SHA-256s) with the writer's
 * (PROTO_CPR_GLOBAL_SUM) and, when they are equal,
 * its part names the writer's instead of holding a copy; a rank whose global differs (it
 * checkpointed at another count, or the program broke the contract) stores its own. On a
 * restore such a rank asks the writer (PROTO_CPR_GLOBAL_WANT), which sends the bytes from its
 * restored part (PROTO_CPR_GLOBAL); they are checked against the SHA-256 the part recorded.
 */
export const PROTO_CPR_GLOBAL_SUM = PROTO_CPR_BASE + 5;
export const PROTO_CPR_GLOBAL_WANT = PROTO_CPR_BASE + 6;
export const PROTO_CPR_GLOBAL = PROTO_CPR_BASE + 7;
/**
 * The rank that writes every line's global: always the same one, so that its store holds the
 * previous line's blocks, and a large global that changed in few places costs a line few new
 * blocks (BLOCKED_BYTES_MIN in src/store/types.ts).
 */
const GLOBAL_WRITER = 0;
/** Globals smaller than this are stored by every rank: the exchange would cost more than the bytes. */
const GLOBAL_SHARED_BYTES_MIN = 64 * 1024;
/**
 * A global of at least this size is saved into memory that the next checkpoint reuses once its
 * line is committed: a copy into fresh memory faults in every page, which took 48-125 ms for a
 * 64 MiB global here, several times the copy itself.
 */
const POOLED_GLOBAL_BYTES_MIN = 1024 * 1024;
/** Idle memory of saved globals kept for the next checkpoint. */
const GLOBAL_POOL_BYTES_MAX = 256 * 1024 * 1024;
/** How long a rank waits for its line's global writer's SHA-256 before it stores its own global. */
const GLOBAL_SUM_WAIT_MS = 60_000;
/**
 * Ranks that checkpoint at the same count of checkpoint() calls save the same `global`, which a
 * line then stores once. On a checkpoint request each rank tells the others which call is its
 * next (PROTO_CPR_COUNT) and passes up its calls until it has heard every rank's. When those
 * counts are at most one apart (a program whose ranks step together), every rank takes the
 * checkpoint at the call after the highest: none can have passed that one while it waited.
 * Ranks whose counts are further apart (a master and its workers) checkpoint at their next call
 * once they know. Nothing waits more than {@link ALIGN_DEFER_MAX} calls.
 */
export const PROTO_CPR_COUNT = PROTO_CPR_BASE + 8;
const ALIGN_DEFER_MAX = 2;
/**
 * How long a rank waits for its partner to keep a copy of its part. The initiator's phase
 * timeout (60 s) aborts the line first; this bound frees the rank's write chain if it does not.
 */
export const PARTNER_COPY_TIMEOUT_MS = 90_000;

/** Bound on the bytes of late frames logged in one round (…Max). */
export const LATE_BYTES_MAX = 512 * 1024 * 1024;
/**
 * How long a rank records before it abandons the round (rank.ts, "abandoned"): twice the
 * initiator's phase timeout (60 s), so that the initiator, which sees the whole round, aborts
 * first; this bound is for a round the initiator lost or stopped driving.
 */
export const RECORDING_TIMEOUT_MS = 120_000;
/** How long a restoring rank waits for every peer's early-id list. */
export const RECOVERY_EXCHANGE_TIMEOUT_MS = 60_000;
/**
 * Format 2 adds `globalFrom`; format 3 names a global by its block list (globalName), where
 * format 2 named it by its SHA-256. Parts of formats 1 (every rank its own global) and 2 are
 * still read.
 */
const PART_FORMAT = 3;
const PART_FORMATS_READ = [1, 2, 3];

/**
 * A global's name: the SHA-256 of the SHA-256s of its blocks of BLOCK_BYTES — as strong as its
 * SHA-256, computed in the same pass as the block digests that the global writer's store
 * then need not compute again (KnownSha256).
 */
function globalName(global: Uint8Array | readonly Uint8Array[]): { blocks: Promise<Buffer[]>; name: Promise<Buffer> } {
  const blocks = blockSha256s(global, BLOCK_BYTES);
  const name = blocks.then(listSha256);
  blocks.catch(() => undefined);
  name.catch(() => undefined);
  return { blocks, name };
}

/** The digests of `globals`' blocks, for the store (see KnownSha256). */
function knownBlocks(globals: readonly { bytes: Buffer; blocks: Promise<Buffer[]> | undefined }[]): KnownSha256 {
  return (piece) => {
    for (const g of globals) {
      if (g.blocks === undefined || piece.buffer !== g.bytes.buffer) continue;
      const at = piece.byteOffset - g.bytes.byteOffset;
      if (at < 0 || at >= g.bytes.length || at % BLOCK_BYTES !== 0 || piece.byteLength !== Math.min(BLOCK_BYTES, g.bytes.length - at)) continue;
      const i = at / BLOCK_BYTES;
      return g.blocks.then((d) => d[i]!);
    }
    return undefined;
  };
}

/** A checkpoint serialized, until its part is written. */
interface Saved {
  epoch: number;
  state: Buffer;
  global: Buffer | null;
  lib: Buffer;
  /** The name of `global` when it may be stored once (see shareGlobal, globalName), computed while the round records. */
  globalSha256?: Promise<Buffer>;
  /** The digests of the blocks of `global` that its name is made of. */
  globalBlocks?: Promise<Buffer[]>;
}

/** What went ahead to the partner at a checkpoint (PROTO_CPR_AHEAD), for the part's copy to name. */
interface Ahead {
  epoch: number;
  partner: number;
  frames: readonly Buffer[];
  /** The global this rank writes for the line, kept back: the copy names it by its SHA-256. */
  global?: { bytes: Buffer; sha256: Promise<Buffer> };
}

/** A chunk of a part's copy: bytes, a frame sent ahead (its place), or the partner's own equal global. */
type CopyChunk = Buffer | number | { global: Buffer };

/** A partner's answer to a copy: the checksum of what it kept, why it kept nothing, or that its global differs. */
type CopyAnswer = { checksum: number } | { failure: string } | { resend: string };

/** A rank's part of a recovery line, as stored. */
interface Part {
  v: number;
  epoch: number;
  state: Buffer;
  /** This rank's global, or null: none, or the same as `globalFrom`'s. */
  global: Buffer | null;
  /** The global is the one in rank `rank`'s part of this line (its SHA-256 and length). */
  globalFrom?: { rank: number; sha256: Buffer; bytes: number } | null;
  /** encodeValue(LibState) */
  lib: Buffer;
  early: [number, number, number][];
  late: RawFrame[];
  nondet: [number, NondetEntry][];
}

/** The factory World.join takes in mode cpr. */
export function coordinatedHook(openParts: () => Promise<PartStoreLike>, opts: CoordinatedDriverOptions = {}): CprHookFactory {
  return (access, host) => new CoordinatedDriver(access, host, openParts, opts);
}

export interface CoordinatedDriverOptions {
  /** See {@link RECORDING_TIMEOUT_MS}. */
  readonly recordingTimeoutMs?: number;
  /** Per-host stores; without them a launcher asking for them gets a fatal CPR_RESTORE. */
  readonly hostStores?: HostStores;
}

export class CoordinatedDriver implements CprHook {
  private readonly machine: RankMachine;
  private parts: PartStoreLike | undefined;
  private partsOpening: Promise<PartStoreLike> | undefined;
  /** State serialized at the current round's checkpoint, until its part is written. */
  private saved: Saved | undefined;
  private lateBytes = 0;
  /**
   * What restore() gives back. `encodedGlobal`: the global, still encoded, the very bytes this
   * rank serves to the peers whose parts name it (PROTO_CPR_GLOBAL_WANT); restored() decodes
   * them into memory of its own (see there).
   */
  private restoredPart: { state: unknown; global: unknown; version: number; encodedGlobal?: Buffer } | undefined;
  private restoreTaken = false;
  private bootstrap = new Map<string, Buffer>();
  private restoring = false;
  private readonly earlyLists = new Map<number, number[]>();
  private earlyWaiter: (() => void) | undefined;
  private writes: Promise<void> = Promise.resolve();
  /** Lines the initiator aborted: their parts are deleted, or never written. */
  private readonly abortedEpochs = new Set<number>();
  private failed = false;
  /** close() has begun: no partner copy is started or kept any more (its timer would keep the process alive). */
  private closing = false;
  private recordingTimer: Timer | undefined;
  private readonly recordingTimeoutMs: number;
  /** Per-host stores: the rank that keeps copies of this rank's parts (from the table). */
  private partner: number | undefined;
  /** Copies sent to the partner, waiting for its word (by epoch). */
  private readonly copying = new Map<number, (answer: CopyAnswer) => void>();
  /** The epoch whose state went ahead to the partner (and to which partner). */
  private ahead: Ahead | undefined;
  /**
   * This rank's saved globals, by epoch, kept until their line commits or aborts when a
   * partner's copy may name one (per-host stores, a global that may be stored once: the copy is
   * completed from these bytes, PROTO_CPR_COPY) or when they are in pooled memory (`pooled`:
   * back to the pool once committed and hashed, since then nothing reads them any more; an
   * aborted line's part may still be being written from it, so that memory is left to the
   * garbage collector).
   */
  private readonly keptGlobals = new Map<
    number,
    { bytes: Buffer; sha256: Promise<Buffer> | undefined; blocks: Promise<Buffer[]> | undefined; pooled: boolean }
  >();
  /**
   * Per source rank: the states it sent ahead of its parts, oldest first, until each part comes
   * (a part's copy may leave after the next checkpoint's state went ahead); at most
   * {@link AHEAD_KEPT_MAX} per source.
   */
  private readonly aheadOf = new Map<number, { epoch: number; frames: Buffer[] }[]>();
  /** Global writers' SHA-256 of their globals, by epoch (null: none to share). */
  private readonly globalSums = new Map<number, { sha256: Buffer | null; bytes: number }>();
  /** writePart waiting for the writer's SHA-256 of `epoch`. */
  private readonly globalSumWaiters = new Map<number, () => void>();
  /** Restoring: the global this rank's part names, still to come from its writer. */
  private pendingGlobal: { epoch: number; rank: number; sha256: Buffer; bytes: number; byBlocks: boolean } | undefined;
  private globalWaiter: ((err?: LifelineError) => void) | undefined;
  /** Restoring: why the global this rank's part names cannot be restored (it came wrong). */
  private globalFailure: LifelineError | undefined;
  /** Restoring: this rank's restored global, for the peers whose parts name it (until afterStart ends). */
  private servedGlobal: { epoch: number; bytes: Buffer } | undefined;
  /** checkpoint() calls in this process. */
  private calls = 0;
  /** Calls passed up in a row to align this checkpoint with the other ranks' (see PROTO_CPR_COUNT). */
  private deferred = 0;
  /** Per requested epoch: each rank's next checkpoint() call when it heard the request. */
  private readonly nextCalls = new Map<number, Map<number, number>>();
  /** Memory for saved globals (see POOLED_GLOBAL_BYTES_MIN). */
  private readonly globalPool = new BouncePool(GLOBAL_POOL_BYTES_MAX, 8, { shared: true });
  /** Writes of the copies this rank keeps for others, in arrival order. */
  private heldWrites: Promise<void> = Promise.resolve();
  private readonly heldStores = new Map<number, Promise<PartStoreLike>>();

  constructor(
    private readonly access: CprWorldAccess,
    private readonly host: Host,
    private readonly openParts: () => Promise<PartStoreLike>,
    private readonly opts: CoordinatedDriverOptions = {},
  ) {
    this.machine = new RankMachine({ rank: access.rank, size: access.size });
    this.recordingTimeoutMs = opts.recordingTimeoutMs ?? RECORDING_TIMEOUT_MS;
  }

  get epoch(): number {
    return this.machine.epoch;
  }

  private store(): Promise<PartStoreLike> {
    if (this.parts !== undefined) return Promise.resolve(this.parts);
    this.partsOpening ??= this.openParts().then((p) => (this.parts = p));
    return this.partsOpening;
  }

  async beforeStart(table: Extract<CoordinatorToRank, { t: "table" }>): Promise<void> {
    const parts = await this.store();
    this.partner = table.partner;
    // Per-host stores: what is not a kept line goes, here and in the copies kept for others
    // (the launcher cannot reach this host's disk to tidy it).
    if (table.keep !== undefined) await this.retainEverywhere(table.keep);
    const spec = table.restore;
    if (spec === undefined) return;
    if (spec.ref.rank !== this.access.rank || spec.ref.epoch !== spec.epoch) {
      throw new LifelineError(
        "CPR_RESTORE",
        `rank ${this.access.rank} was told to restore line ${spec.epoch} from rank ${spec.ref.rank}'s part of line ${spec.ref.epoch}`,
      );
    }
    let bytes: Buffer;
    if (spec.part !== undefined) {
      // This host lost the part (or never had it): the launcher fetched the partner's copy.
      bytes = Buffer.from(spec.part.buffer, spec.part.byteOffset, spec.part.byteLength);
      if (bytes.length !== spec.ref.bytes || crc32(bytes) !== spec.ref.checksum) {
        throw new LifelineError(
          "CPR_RESTORE",
          `rank ${this.access.rank}: the partner copy of its part of line ${spec.epoch} does not match the commit record (${bytes.length} bytes, expected ${spec.ref.bytes})`,
        );
      }
      // Kept here again, so the line has two copies once more: a copy of its own, for the store
      // writes it after init() returns, and the program's restored state views `bytes`.
      const kept = Buffer.from(bytes);
      this.writes = this.writes
        .then(async () => {
          await parts.putPart(spec.epoch, kept);
        })
        .catch((err: unknown) =>
          this.host.warn(`lifeline: rank ${this.access.rank}: could not keep the restored part of line ${spec.epoch} in its own store: ${errorMessage(err)}`),
        );
    } else {
      bytes = await parts.readPart(spec.ref);
    }
    const part = decodeValue(bytes) as Part;
    if (!PART_FORMATS_READ.includes(part.v) || part.epoch !== spec.epoch) {
      throw new LifelineError(
        "CPR_RESTORE",
        `rank ${this.access.rank}'s part of line ${spec.epoch} has format ${part.v} and epoch ${part.epoch}; expected format ${PART_FORMATS_READ.join(" or ")}, epoch ${spec.epoch}`,
      );
    }
    const from = part.globalFrom ?? undefined;
    if (from !== undefined && (from.rank === this.access.rank || from.rank < 0 || from.rank >= this.access.size || !(from.sha256 instanceof Uint8Array))) {
      throw new LifelineError(
        "CPR_RESTORE",
        `rank ${this.access.rank}'s part of line ${spec.epoch} names the global of rank ${from.rank}, which is not a peer`,
      );
    }
    const lib = decodeValue(part.lib) as LibState;
    this.bootstrap = new Map(lib.bootstrap);
    this.machine.restore({ epoch: part.epoch, earlyIds: part.early, nondet: part.nondet });
    // Channel state first (it arrived before our checkpoint), then the late frames (after
    // it, before the senders' markers), then — once the transport starts — everything new.
    this.access.restoreLibState(lib);
    for (const f of part.late) this.access.inject(f);
    this.restoredPart = {
      state: decodeValue(part.state),
      global: undefined,
      ...(part.global === null ? {} : { encodedGlobal: part.global }),
      version: part.epoch,
    };
    // The global comes from its writer in afterStart; this rank's own may be asked for.
    this.pendingGlobal =
      from === undefined ? undefined : { epoch: part.epoch, rank: from.rank, sha256: bytesOf(from.sha256, false), bytes: from.bytes, byBlocks: part.v >= 3 };
    this.servedGlobal = part.global === null ? undefined : { epoch: part.epoch, bytes: part.global };
    this.restoring = true;
  }

  async afterStart(): Promise<void> {
    if (!this.restoring) return;
    // The global this part names, asked for before the early list: the writer, which waits
    // for every early list, has then had every request for its global.
    const wanted = this.pendingGlobal;
    if (wanted !== undefined) this.access.sendProtocol(wanted.rank, PROTO_CPR_GLOBAL_WANT, { epoch: wanted.epoch });
    // Tell every peer which of its frames we already hold (early messages): it
    // must not send them again. Wait for every peer's list before the program runs, so no
    // re-send can leave before its suppression is known.
    for (let d = 0; d < this.access.size; d++) {
      if (d !== this.access.rank) this.access.sendProtocol(d, PROTO_CPR_EARLY, { epoch: this.machine.epoch, ids: this.machine.earlyFrom(d) });
    }
    await new Promise<void>((resolve, reject) => {
      const timer = this.host.after(RECOVERY_EXCHANGE_TIMEOUT_MS, () =>
        reject(
          new LifelineError(
            "CPR_RESTORE",
            `rank ${this.access.rank}: early-message lists from ${this.access.size - 1 - this.earlyLists.size} peer(s) did not arrive within ${RECOVERY_EXCHANGE_TIMEOUT_MS / 1000} s of the restore`,
          ),
        ),
      );
      this.earlyWaiter = () => {
        if (this.earlyLists.size < this.access.size - 1) return;
        timer.stop();
        this.earlyWaiter = undefined;
        resolve();
      };
      this.earlyWaiter();
    });
    this.servedGlobal = undefined;
    if (this.globalFailure !== undefined) throw this.globalFailure;
    if (this.pendingGlobal !== undefined) await this.globalArrival();
    this.restoring = false;
  }

  /** Resolves once the global this rank's part names has arrived and checked out (see onGlobal). */
  private globalArrival(): Promise<void> {
    const wanted = this.pendingGlobal!;
    return new Promise<void>((resolve, reject) => {
      const timer = this.host.after(RECOVERY_EXCHANGE_TIMEOUT_MS, () =>
        this.globalWaiter?.(
          new LifelineError(
            "CPR_RESTORE",
            `rank ${this.access.rank}: the global of line ${wanted.epoch} did not arrive from rank ${wanted.rank} within ${RECOVERY_EXCHANGE_TIMEOUT_MS / 1000} s of the restore`,
          ),
        ),
      );
      this.globalWaiter = (err) => {
        timer.stop();
        this.globalWaiter = undefined;
        if (err === undefined) resolve();
        else reject(err);
      };
      if (this.pendingGlobal === undefined) this.globalWaiter();
    });
  }

  /** The global this rank's part names, from its writer: checked against the part's SHA-256, then restored. */
  private async onGlobal(source: number, body: { epoch?: unknown; global?: unknown; missing?: unknown }): Promise<void> {
    const wanted = this.pendingGlobal;
    if (wanted === undefined || source !== wanted.rank || body.epoch !== wanted.epoch) return;
    const fail = (why: string): void => {
      const err = new LifelineError("CPR_RESTORE", `rank ${this.access.rank}: the global of line ${wanted.epoch} from rank ${source} ${why}`);
      this.globalFailure ??= err;
      this.globalWaiter?.(err);
    };
    const g = body.global;
    const chunks =
      g instanceof Uint8Array ? [bytesOf(g, false)] : Array.isArray(g) && g.every((c) => c instanceof Uint8Array) ? g.map((c) => bytesOf(c, false)) : undefined;
    if (chunks === undefined) return fail(typeof body.missing === "string" ? `is missing: ${body.missing}` : "came without its bytes");
    const length = chunks.reduce((n, c) => n + c.length, 0);
    const name = length !== wanted.bytes ? undefined : wanted.byBlocks ? await globalName(chunks).name : await sha256OffThread(chunks);
    if (name?.equals(wanted.sha256) !== true) {
      return fail(
        `does not match the ${wanted.byBlocks ? "name (its blocks' SHA-256s)" : "SHA-256"} this rank's part recorded (${length} bytes, expected ${wanted.bytes})`,
      );
    }
    if (this.pendingGlobal !== wanted) return;
    this.pendingGlobal = undefined;
    if (this.restoredPart !== undefined) this.restoredPart.global = decodeValueChunks(chunks);
    this.globalWaiter?.();
  }

  /** The global writer's SHA-256 of line `epoch`'s global, or undefined if it does not come. */
  private writerSum(epoch: number): Promise<{ sha256: Buffer | null; bytes: number } | undefined> {
    const known = this.globalSums.get(epoch);
    if (known !== undefined || this.closing || this.abortedEpochs.has(epoch)) return Promise.resolve(known);
    return new Promise((resolve) => {
      const timer = this.host.after(GLOBAL_SUM_WAIT_MS, () => this.globalSumWaiters.get(epoch)?.());
      this.globalSumWaiters.set(epoch, () => {
        timer.stop();
        this.globalSumWaiters.delete(epoch);
        resolve(this.globalSums.get(epoch));
      });
    });
  }

  stamp(dest: number): { epoch: number; flags: number } {
    const s = this.machine.stamp(dest);
    return { epoch: s.epoch, flags: s.recording ? Flag.recording : 0 };
  }

  suppress(dest: number, channelSeq: number): boolean {
    return this.machine.suppress(dest, channelSeq);
  }

  arrive(header: Header, frame: RawFrame): void {
    // Late frames are kept: copy them, since the program may get (and mutate) views of the
    // received buffers.
    const late = header.epoch + 1 === this.machine.epoch;
    const payload = late ? { header: Buffer.from(frame.header), body: frame.body.map((b) => Buffer.from(b)) } : undefined;
    const { verdict, effects } = this.machine.arrive(
      { source: header.source, epoch: header.epoch, recording: (header.flags & Flag.recording) !== 0, channelSeq: header.channelSeq, id: frameId(header) },
      payload,
    );
    if (verdict === "late" && payload !== undefined) {
      this.lateBytes += payload.header.length + payload.body.reduce((n, b) => n + b.length, 0);
      if (this.lateBytes > LATE_BYTES_MAX) {
        effects.push(
          ...this.machine.abandonRecording(`more than ${LATE_BYTES_MAX >> 20} MiB of late messages to log while recording epoch ${this.machine.epoch}`),
        );
      }
    }
    this.apply(effects);
  }

  onProtocol(header: Header, body: unknown): void {
    const b = body as { epoch?: unknown; sent?: unknown; ids?: unknown };
    switch (header.tag) {
      case PROTO_CPR_MARKER:
        if (typeof b.epoch !== "number" || typeof b.sent !== "number") return;
        this.apply(this.machine.onMarker(header.source, b.epoch, b.sent));
        return;
      case PROTO_CPR_EARLY:
        if (!Array.isArray(b.ids)) return;
        this.machine.addSuppress(header.source, b.ids as number[]);
        this.earlyLists.set(header.source, b.ids as number[]);
        this.earlyWaiter?.();
        return;
      case PROTO_CPR_AHEAD: {
        const a = body as { epoch?: unknown; frames?: unknown };
        if (typeof a.epoch !== "number" || !Array.isArray(a.frames) || !a.frames.every((f) => f instanceof Uint8Array)) return;
        const kept = (this.aheadOf.get(header.source) ?? []).filter((k) => k.epoch !== a.epoch);
        kept.push({ epoch: a.epoch, frames: a.frames.map((f) => bytesOf(f, false)) });
        // The oldest goes first: a part that has not come by now belongs to a round long over.
        if (kept.length > AHEAD_KEPT_MAX) kept.shift();
        this.aheadOf.set(header.source, kept);
        return;
      }
      case PROTO_CPR_COPY:
        this.keepCopy(header.source, body);
        return;
      case PROTO_CPR_GLOBAL_SUM: {
        const g = body as { epoch?: unknown; sha256?: unknown; bytes?: unknown };
        if (typeof g.epoch !== "number" || typeof g.bytes !== "number" || header.source !== GLOBAL_WRITER) return;
        this.globalSums.set(g.epoch, { sha256: g.sha256 instanceof Uint8Array ? bytesOf(g.sha256, false) : null, bytes: g.bytes });
        // Older lines' sums are of no use any more (their parts are written or abandoned).
        for (const e of this.globalSums.keys()) if (e < g.epoch - 2) this.globalSums.delete(e);
        this.globalSumWaiters.get(g.epoch)?.();
        return;
      }
      case PROTO_CPR_GLOBAL_WANT: {
        const w = body as { epoch?: unknown };
        const served = this.servedGlobal;
        if (typeof w.epoch !== "number") return;
        const max = this.access.maxMessageBytes ?? Infinity;
        this.access.sendProtocol(
          header.source,
          PROTO_CPR_GLOBAL,
          served?.epoch !== w.epoch
            ? { epoch: w.epoch, missing: `rank ${this.access.rank} holds no global of line ${w.epoch}` }
            : served.bytes.length + 1024 > max
              ? // A run resumed with a lower --max-message than the one that wrote the line: say so, not time out.
                {
                  epoch: w.epoch,
                  missing: `it is ${served.bytes.length} bytes, longer than this run's --max-message of ${max}; run with a larger --max-message`,
                }
              : // As its chunks: the array inside arrives as a frame of its own, which the asker views, not copies.
                { epoch: w.epoch, global: encodedValueChunks(served.bytes) },
        );
        return;
      }
      case PROTO_CPR_GLOBAL:
        void this.onGlobal(header.source, body as { epoch?: unknown; global?: unknown; missing?: unknown });
        return;
      case PROTO_CPR_COUNT: {
        const c = body as { epoch?: unknown; next?: unknown };
        if (typeof c.epoch !== "number" || typeof c.next !== "number" || c.epoch <= this.machine.epoch) return;
        this.countsOf(c.epoch).set(header.source, c.next);
        return;
      }
      case PROTO_CPR_COPIED: {
        const c = body as { epoch?: unknown; checksum?: unknown; failure?: unknown; resend?: unknown };
        if (typeof c.epoch !== "number") return;
        const done = this.copying.get(c.epoch);
        this.copying.delete(c.epoch);
        done?.(
          typeof c.checksum === "number"
            ? { checksum: c.checksum }
            : typeof c.resend === "string"
              ? { resend: c.resend }
              : { failure: typeof c.failure === "string" ? c.failure : "no answer" },
        );
        return;
      }
      default:
        return;
    }
  }

  onControl(msg: CoordinatorToRank): void {
    if (msg.t === "cpr-committed") {
      const keep = msg.keep;
      // Every copy of the line is kept by now: the globals kept for them may go, and pooled
      // memory is the next checkpoint's.
      for (const [e, g] of this.keptGlobals) {
        if (e > msg.epoch) continue;
        this.keptGlobals.delete(e);
        if (g.pooled) {
          void (g.sha256 ?? Promise.resolve())
            .catch(() => undefined)
            .then(() => {
              if (!this.closing) this.globalPool.release(g.bytes);
            });
        }
      }
      this.writes = this.writes
        .then(async () => {
          const parts = await this.store();
          await parts.retain(keep);
        })
        .catch((err: unknown) => this.host.warn(`lifeline: rank ${this.access.rank}: could not delete old parts: ${(err as Error).message}`));
      if (msg.line !== undefined) this.keepCommitRecord(msg);
      if (this.heldStores.size > 0) {
        this.heldWrites = this.heldWrites
          .then(async () => {
            for (const held of this.heldStores.values()) await (await held).retain(keep);
          })
          .catch((err: unknown) => this.host.warn(`lifeline: rank ${this.access.rank}: could not delete old partner copies: ${errorMessage(err)}`));
      }
      return;
    }
    if (msg.t === "cpr-inventory") {
      void this.reportHeld();
      return;
    }
    if (msg.t === "cpr-fetch") {
      void this.sendCopy(msg.of, msg.ref, msg.where);
      return;
    }
    if (msg.t === "cpr-aborted") {
      // An aborted line leaves nothing behind: a part written (or being written: the chain
      // orders it) goes now; one not yet written is never written (writePart).
      const epoch = msg.epoch;
      this.abortedEpochs.add(epoch);
      this.keptGlobals.delete(epoch);
      this.globalSumWaiters.get(epoch)?.();
      for (const [source, kept] of this.aheadOf)
        this.aheadOf.set(
          source,
          kept.filter((k) => k.epoch !== epoch),
        );
      this.writes = this.writes
        .then(async () => {
          const parts = await this.store();
          await parts.dropParts([epoch]);
        })
        .catch((err: unknown) =>
          this.host.warn(`lifeline: rank ${this.access.rank}: could not delete its part of aborted line ${epoch}: ${(err as Error).message}`),
        );
      if (this.heldStores.size > 0) {
        this.heldWrites = this.heldWrites
          .then(async () => {
            for (const held of this.heldStores.values()) await (await held).dropParts([epoch]);
          })
          .catch((err: unknown) =>
            this.host.warn(`lifeline: rank ${this.access.rank}: could not delete the partner copies of aborted line ${epoch}: ${errorMessage(err)}`),
          );
      }
      return;
    }
    if (msg.t === "cpr-checkpoint") this.announceCount(msg.epoch);
    this.apply(this.machine.onControl(msg));
  }

  private countsOf(epoch: number): Map<number, number> {
    let counts = this.nextCalls.get(epoch);
    if (counts === undefined) {
      // Older epochs' counts are of no use any more.
      for (const e of this.nextCalls.keys()) if (e <= this.machine.epoch) this.nextCalls.delete(e);
      this.nextCalls.set(epoch, (counts = new Map()));
    }
    return counts;
  }

  /** A checkpoint of `epoch` is requested: the others hear which checkpoint() call is this rank's next. */
  private announceCount(epoch: number): void {
    if (epoch <= this.machine.epoch || this.access.size === 1) return;
    const counts = this.countsOf(epoch);
    if (counts.has(this.access.rank)) return;
    counts.set(this.access.rank, this.calls + 1);
    for (let d = 0; d < this.access.size; d++) if (d !== this.access.rank) this.access.sendProtocol(d, PROTO_CPR_COUNT, { epoch, next: this.calls + 1 });
  }

  /**
   * Whether to pass up this checkpoint() call, though the checkpoint is due, to take it at the
   * same count as the other ranks (see PROTO_CPR_COUNT): while some rank's count has not come,
   * and, when all of them are at most one apart, before the call after the highest; never more
   * than ALIGN_DEFER_MAX calls in a row.
   */
  private deferToAlign(): boolean {
    const size = this.access.size;
    if (size === 1) return false;
    const counts = this.nextCalls.get(this.machine.epoch + 1);
    let defer: boolean;
    if (counts === undefined || counts.size < size) {
      defer = true;
    } else {
      const all = [...counts.values()];
      const highest = Math.max(...all);
      defer = highest - Math.min(...all) <= 1 && this.calls <= highest;
    }
    if (defer && this.deferred < ALIGN_DEFER_MAX) {
      this.deferred++;
      return true;
    }
    this.deferred = 0;
    return false;
  }

  checkpoint(state: unknown, global: unknown, flushSelf: () => void): void {
    this.calls++;
    if (!this.machine.mayCheckpoint || this.failed || this.deferToAlign()) return;
    // Nothing to self may cross the line: deliver what is pending into the matcher, where
    // it is channel state saved below.
    flushSelf();
    const value = typeof state === "function" ? (state as () => unknown)() : state;
    let pooled: Buffer | undefined;
    const saved: Saved = {
      epoch: this.machine.epoch + 1,
      state: encodeValue(value),
      global:
        global === undefined ? null : encodeValue(global, (n) => (n < POOLED_GLOBAL_BYTES_MIN ? Buffer.allocUnsafe(n) : (pooled = this.globalPool.acquire(n)))),
      lib: encodeValue(this.access.captureLibState()),
    };
    // Hashed in the background while the round records: the part needs it (shareGlobal).
    if (saved.global !== null && this.mayShareGlobal(saved.global)) {
      const { blocks, name } = globalName(saved.global);
      saved.globalBlocks = blocks;
      saved.globalSha256 = name;
    }
    this.announceGlobalSum(saved);
    if (saved.global !== null && (pooled !== undefined || (this.partner !== undefined && saved.globalSha256 !== undefined))) {
      this.keptGlobals.set(saved.epoch, { bytes: saved.global, sha256: saved.globalSha256, blocks: saved.globalBlocks, pooled: pooled !== undefined });
      for (const e of this.keptGlobals.keys()) if (e <= saved.epoch - KEPT_GLOBALS_MAX) this.keptGlobals.delete(e);
    }
    this.saved = saved;
    this.lateBytes = 0;
    this.apply(this.machine.takeCheckpoint());
    this.sendAhead(saved);
    if (this.machine.recording) {
      const epoch = this.machine.epoch;
      this.recordingTimer?.stop();
      this.recordingTimer = this.host.after(this.recordingTimeoutMs, () => this.apply(this.machine.onRecordingTimeout(epoch, this.recordingTimeoutMs)));
    }
  }

  restored(): { state: unknown; global: unknown; version: number } | undefined {
    if (this.restoreTaken) return undefined;
    this.restoreTaken = true;
    const r = this.restoredPart;
    this.restoredPart = undefined;
    if (r === undefined) return undefined;
    const { encodedGlobal, ...value } = r;
    // A copy, never a view of the bytes served: the transport may still be reading them (init()
    // does not wait for those sends) while the program changes its global. Made here rather than
    // at the restore, the copy runs while the sends go on instead of before they start.
    if (encodedGlobal !== undefined) value.global = decodeValueOwned(encodedGlobal);
    return value;
  }

  bootstrapResult(key: string): { value: unknown } | undefined {
    const b = this.bootstrap.get(key);
    // Memory of its own: the kept bytes go into every later checkpoint while the program may
    // change what it got.
    return b === undefined ? undefined : { value: decodeValueOwned(b) };
  }

  nondet(kind: NondetEntry["k"]): NondetTicket {
    const t = this.machine.nondet(kind);
    this.apply(t.effects);
    return { ordinal: t.ordinal, replay: t.replay };
  }

  logNondet(ordinal: number, entry: NondetEntry): void {
    const effects = this.machine.logNondet(ordinal, entry);
    if (entry.k === "test" && entry.msg !== undefined && this.machine.recording) {
      // Messages logged by polls count against the same bound as late frames.
      this.lateBytes += entry.msg.header.length + entry.msg.body.reduce((n, b) => n + b.length, 0);
      if (this.lateBytes > LATE_BYTES_MAX) {
        effects.push(
          ...this.machine.abandonRecording(
            `more than ${LATE_BYTES_MAX >> 20} MiB of late and polled messages to log while recording epoch ${this.machine.epoch}`,
          ),
        );
      }
    }
    this.apply(effects);
  }

  async close(): Promise<void> {
    this.closing = true;
    this.recordingTimer?.stop();
    for (const done of this.copying.values()) done({ failure: "the rank is closing" });
    this.copying.clear();
    this.aheadOf.clear();
    this.keptGlobals.clear();
    for (const wake of [...this.globalSumWaiters.values()]) wake();
    this.globalWaiter?.(new LifelineError("CPR_RESTORE", `rank ${this.access.rank} closed while waiting for its line's global`));
    await this.writes.catch(() => undefined);
    await this.heldWrites.catch(() => undefined);
    await this.parts?.close();
    await this.opts.hostStores?.close();
  }

  // ---- per-host stores (src/store/partners.ts) ----

  private hostStores(): HostStores {
    const hs = this.opts.hostStores;
    if (hs === undefined)
      throw new LifelineError(
        "CPR_RESTORE",
        `rank ${this.access.rank}: the launcher keeps recovery lines on every host (per-host stores), which this rank cannot do`,
      );
    return hs;
  }

  private heldStore(of: number): Promise<PartStoreLike> {
    let s = this.heldStores.get(of);
    if (s === undefined) {
      s = this.hostStores().held(of);
      s.catch(() => undefined);
      this.heldStores.set(of, s);
    }
    return s;
  }

  /** Deletes every part and kept copy that is not of a line in `keep` (newer ones too). */
  private async retainEverywhere(keep: readonly number[]): Promise<void> {
    const parts = await this.store();
    await parts.retain(keep, { dropNewer: true });
    if (this.opts.hostStores === undefined) return;
    for (const of of await this.opts.hostStores.heldRanks()) await (await this.heldStore(of)).retain(keep, { dropNewer: true });
  }

  /** `cpr-inventory`: every part this host's store holds, for the launcher. */
  private async reportHeld(): Promise<void> {
    const rank = this.access.rank;
    try {
      const { parts, problems } = await this.hostStores().scan();
      for (const p of problems) this.host.warn(`lifeline: rank ${rank}: cannot read part of this host's store, leaving it out: ${p}`);
      this.access.sendControl({ t: "cpr-held", rank, parts });
    } catch (err) {
      this.fatalError(err);
    }
  }

  /** `cpr-fetch`: part `ref` from database `where` of this host's store, to the launcher. */
  private async sendCopy(of: number, ref: PartRefWire, where: string): Promise<void> {
    const rank = this.access.rank;
    try {
      const bytes = await this.hostStores().read(where, ref);
      this.access.sendControl({ t: "cpr-copy", rank, of, epoch: ref.epoch, part: bytes });
    } catch (err) {
      this.access.sendControl({ t: "cpr-copy", rank, of, epoch: ref.epoch, error: errorMessage(err) });
    }
  }

  /**
   * Per-host stores: the checkpoint just taken, serialized, goes to the partner now; its part
   * (writePart) then sends only what the round added and names these frames.
   */
  private sendAhead(saved: Saved): void {
    const partner = this.partner;
    this.ahead = undefined;
    // Not when the round ended at once (abandoned): no part of this epoch will follow.
    if (partner === undefined || this.saved !== saved || this.closing) return;
    // Another rank's part most likely names the writer's global instead of holding its own; the
    // writer's own goes neither ahead nor with the copy, which names it (the partner has it too).
    const global = saved.global !== null && this.writesGlobal(saved.global) ? saved.global : null;
    const byName = global !== null && saved.globalSha256 !== undefined ? { bytes: global, sha256: saved.globalSha256 } : undefined;
    const frames = global === null || byName !== undefined ? [saved.state, saved.lib] : [saved.state, global, saved.lib];
    this.ahead = { epoch: saved.epoch, partner, frames, ...(byName === undefined ? {} : { global: byName }) };
    this.access.sendProtocol(partner, PROTO_CPR_AHEAD, { epoch: saved.epoch, frames });
  }

  /**
   * The chunks of a part for its partner: those that went ahead (sendAhead) by their place
   * there, and the global this rank writes by its SHA-256 (`globalSum`, when known).
   */
  private copyChunks(ahead: Ahead | undefined, epoch: number, partner: number, chunks: readonly Buffer[], globalSum: Buffer | undefined): CopyChunk[] {
    if (ahead === undefined || ahead.epoch !== epoch || ahead.partner !== partner) return [...chunks];
    const same = (f: Buffer, c: Buffer): boolean => f.buffer === c.buffer && f.byteOffset === c.byteOffset && f.byteLength === c.byteLength;
    return chunks.map((c) => {
      if (globalSum !== undefined && ahead.global !== undefined && same(ahead.global.bytes, c)) return { global: globalSum };
      const i = ahead.frames.findIndex((f) => same(f, c));
      return i < 0 ? c : i;
    });
  }

  /** A partner's part: kept in this rank's store of its copies, then acknowledged with its checksum. */
  private keepCopy(source: number, body: unknown): void {
    const b = body as { epoch?: unknown; chunks?: unknown };
    if (typeof b.epoch !== "number" || !Array.isArray(b.chunks)) return;
    const epoch = b.epoch;
    const kept = this.aheadOf.get(source) ?? [];
    const ahead = kept.find((k) => k.epoch === epoch);
    // This part's state, and any older one whose part will not come now.
    const newer = kept.filter((k) => k.epoch > epoch);
    if (newer.length > 0) this.aheadOf.set(source, newer);
    else this.aheadOf.delete(source);
    // The part: the chunks that came with it, those that came ahead, and the global it names (this
    // rank's own), in order (written as they are).
    let part: (Uint8Array | { global: Buffer })[] | string;
    try {
      part = (b.chunks as unknown[]).map((c) => {
        if (c instanceof Uint8Array) return c;
        if (typeof c === "object" && c !== null && (c as { global?: unknown }).global instanceof Uint8Array)
          return { global: bytesOf((c as { global: Uint8Array }).global, false) };
        if (typeof c !== "number") throw new Error("a chunk of the part is neither bytes nor a reference to its state");
        const f = ahead?.frames[c];
        if (f === undefined) throw new Error(`the state of line ${epoch}, sent ahead of the part, did not arrive`);
        return f;
      });
    } catch (err) {
      part = errorMessage(err);
    }
    this.heldWrites = this.heldWrites.then(async () => {
      let answer: { epoch: number } & CopyAnswer;
      const own = typeof part === "string" ? [] : await this.ownGlobalsNamed(epoch, part);
      if (this.closing) {
        answer = { epoch, failure: "the partner is closing" };
      } else if (this.abortedEpochs.has(epoch)) {
        answer = { epoch, failure: `line ${epoch} was aborted` };
      } else if (typeof part === "string") {
        answer = { epoch, failure: part };
      } else if (own === undefined) {
        answer = { epoch, resend: `rank ${this.access.rank} holds no global of line ${epoch} with that name` };
      } else {
        let g = 0;
        part = part.map((c) => (c instanceof Uint8Array ? c : own[g++]!.bytes));
        try {
          answer = {
            epoch,
            checksum: (await (await this.heldStore(source)).putPart(epoch, part as Uint8Array[], undefined, { knownSha256: knownBlocks(own) })).checksum,
          };
        } catch (err) {
          answer = { epoch, failure: errorMessage(err) };
        }
      }
      this.access.sendProtocol(source, PROTO_CPR_COPIED, answer);
    });
  }

  /**
   * This rank's own globals of line `epoch` for the chunks of a copy that name one (globalName),
   * in order; undefined when it holds no global of that name.
   */
  private async ownGlobalsNamed(
    epoch: number,
    chunks: readonly (Uint8Array | { global: Buffer })[],
  ): Promise<{ bytes: Buffer; blocks: Promise<Buffer[]> | undefined }[] | undefined> {
    const own = this.keptGlobals.get(epoch);
    const out: { bytes: Buffer; blocks: Promise<Buffer[]> | undefined }[] = [];
    for (const c of chunks) {
      if (c instanceof Uint8Array) continue;
      const sum = await own?.sha256?.catch(() => undefined);
      if (own === undefined || sum === undefined || !sum.equals(c.global)) return undefined;
      out.push(own);
    }
    return out;
  }

  /**
   * Sends the part (its `chunks`) to the partner, naming what went ahead and the global this
   * rank writes (`global`, once its SHA-256 is known); when the partner's global differs, the
   * part goes again whole. Resolves with the checksum of what the partner kept, or why it did not.
   */
  private async copyPart(partner: number, epoch: number, chunks: readonly Buffer[], ahead: Ahead | undefined, global: Buffer | null): Promise<CopyAnswer> {
    const globalSum = ahead?.global === undefined || global !== ahead.global.bytes ? undefined : await ahead.global.sha256.catch(() => undefined);
    const answer = await this.copyToPartner(partner, epoch, this.copyChunks(ahead, epoch, partner, chunks, globalSum));
    return "resend" in answer ? this.copyToPartner(partner, epoch, [...chunks]) : answer;
  }

  /** Sends a part's chunks to the partner; resolves with its answer (or a failure when none comes). */
  private copyToPartner(partner: number, epoch: number, chunks: CopyChunk[]): Promise<CopyAnswer> {
    // A write chained behind others may reach here after close() settled the waiting copies.
    if (this.closing) return Promise.resolve({ failure: "the rank is closing" });
    return new Promise((resolve) => {
      const timer = this.host.after(PARTNER_COPY_TIMEOUT_MS, () => {
        this.copying.delete(epoch);
        resolve({ failure: `rank ${partner} did not confirm the copy within ${PARTNER_COPY_TIMEOUT_MS / 1000} s` });
      });
      this.copying.get(epoch)?.({ failure: "superseded by a newer copy of the same line" });
      this.copying.set(epoch, (answer) => {
        timer.stop();
        resolve(answer);
      });
      this.access.sendProtocol(partner, PROTO_CPR_COPY, { epoch, chunks });
    });
  }

  /** A committed line's record (and the job's), kept in this rank's copy of the manifest. */
  private keepCommitRecord(msg: Extract<CoordinatorToRank, { t: "cpr-committed" }>): void {
    const line = msg.line!;
    const keep = msg.keep;
    this.writes = this.writes
      .then(async () => {
        const replica = await this.hostStores().replica();
        if (msg.job !== undefined) await replica.putJob(msg.job as unknown as JobRecord);
        // Lines this copy lists that the launcher no longer has (retracted ones whose epochs are
        // reused, pruned ones) go first: the copy mirrors the launcher's manifest.
        for (const l of await replica.list()) if (l.epoch >= line.epoch || !keep.includes(l.epoch)) await replica.abortLine(l.epoch);
        await replica.commitLine(line.epoch, line.parts, line.job === undefined ? undefined : { job: line.job });
      })
      .catch((err: unknown) =>
        this.host.warn(`lifeline: rank ${this.access.rank}: could not keep a copy of the commit record of line ${line.epoch}: ${errorMessage(err)}`),
      );
  }

  private fatalError(err: unknown): void {
    this.failed = true;
    this.access.fatal("CPR_RESTORE", errorMessage(err));
  }

  private apply(effects: readonly RankEffect[]): void {
    for (const e of effects) {
      switch (e.kind) {
        case "marker":
          this.access.sendProtocol(e.dest, PROTO_CPR_MARKER, { epoch: e.epoch, sent: e.sent });
          break;
        case "control":
          this.access.sendControl(e.msg);
          break;
        case "write-part":
          this.recordingTimer?.stop();
          this.writePart(e.epoch);
          break;
        case "abandon":
          this.recordingTimer?.stop();
          this.saved = undefined;
          this.ahead = undefined;
          this.host.warn(
            `lifeline: rank ${this.access.rank}: ${e.reason}; line ${e.epoch} will not be committed, the last committed line stays the recovery point`,
          );
          this.access.sendControl({ t: "cpr-part-failed", rank: this.access.rank, epoch: e.epoch, message: `recording abandoned: ${e.reason}` });
          break;
        case "fatal":
          this.failed = true;
          this.access.fatal(e.code, e.message);
          break;
      }
    }
  }

  /**
   * Whether this rank's part holds `global` itself: always on one rank or for a small one;
   * else only on the global writer.
   */
  private writesGlobal(global: Buffer): boolean {
    return !this.mayShareGlobal(global) || this.access.rank === GLOBAL_WRITER;
  }

  /** Whether a global may be stored once: not on one rank, not when small, not when a restore could not send it. */
  private mayShareGlobal(global: Buffer): boolean {
    if (this.access.size === 1 || global.length < GLOBAL_SHARED_BYTES_MIN) return false;
    return global.length + 1024 <= (this.access.maxMessageBytes ?? Infinity);
  }

  /**
   * The global writer of a checkpoint's line tells the others the SHA-256 of its global as soon
   * as it is known, while the line still records: the others' parts wait for it (shareGlobal).
   */
  private announceGlobalSum(saved: Saved): void {
    const size = this.access.size;
    if (size === 1 || this.access.rank !== GLOBAL_WRITER) return;
    const send = (sha256: Buffer | null): void => {
      for (let d = 0; d < size; d++)
        if (d !== GLOBAL_WRITER) this.access.sendProtocol(d, PROTO_CPR_GLOBAL_SUM, { epoch: saved.epoch, sha256, bytes: saved.global?.length ?? 0 });
    };
    if (saved.globalSha256 === undefined) send(null);
    else void saved.globalSha256.then(send, () => send(null));
  }

  /**
   * A rank other than the line's global writer whose global equals the writer's (by the
   * SHA-256 the writer announced) drops its own from the part and names the writer's.
   */
  private async shareGlobal(part: Part, sha256Of: Promise<Buffer> | undefined): Promise<void> {
    const global = part.global;
    if (this.access.size === 1 || this.access.rank === GLOBAL_WRITER || global === null || sha256Of === undefined) return;
    const [theirs, mine] = await Promise.all([this.writerSum(part.epoch), sha256Of]);
    this.globalSums.delete(part.epoch);
    if (theirs?.sha256 === undefined || theirs.sha256 === null || theirs.bytes !== global.length || !theirs.sha256.equals(mine)) return;
    part.global = null;
    part.globalFrom = { rank: GLOBAL_WRITER, sha256: mine, bytes: global.length };
  }

  /** Builds the part of `epoch` and writes it in the background; reports the outcome. */
  private writePart(epoch: number): void {
    const saved = this.saved;
    const logs = this.machine.partLogs();
    this.saved = undefined;
    const ahead = this.ahead;
    this.ahead = undefined;
    if (saved === undefined || saved.epoch !== epoch) {
      this.access.sendControl({ t: "cpr-part-failed", rank: this.access.rank, epoch, message: "no local checkpoint of this epoch" });
      return;
    }
    const part: Part = {
      v: PART_FORMAT,
      epoch,
      state: saved.state,
      global: saved.global,
      globalFrom: null,
      lib: saved.lib,
      early: logs.earlyIds,
      late: logs.lateLog as RawFrame[],
      nondet: logs.nondet,
    };
    const rank = this.access.rank;
    this.writes = this.writes.then(async () => {
      if (this.abortedEpochs.has(epoch)) {
        this.access.sendControl({ t: "cpr-part-failed", rank, epoch, message: `line ${epoch} was aborted before this rank wrote its part` });
        return;
      }
      try {
        await this.shareGlobal(part, saved.globalSha256);
        const parts = await this.store();
        const chunks = encodeValueChunks(part);
        // Per-host stores: the part counts as durable once a partner on another host keeps a
        // copy too, so losing this host loses no committed line. The copy travels while the
        // local write runs — its state went ahead already (sendAhead) — and the partner's
        // checksum of what it kept must match the local one.
        const partner = this.partner;
        // A part that holds a global whose block digests are known (globalName) goes in blocks:
        // the writer's store holds the previous line's, and a global changes little from line
        // to line. Other parts are not hashed for the store's sake (see BLOCKED_BYTES_MIN).
        const global = part.global;
        const blocks =
          global !== null && saved.globalBlocks !== undefined ? { knownSha256: knownBlocks([{ bytes: global, blocks: saved.globalBlocks }]) } : undefined;
        const put = parts.putPart(epoch, chunks, undefined, blocks);
        put.catch(() => undefined);
        const copied = partner === undefined ? undefined : this.copyPart(partner, epoch, chunks, ahead, part.global);
        const ref = await put.catch(async (err: unknown) => {
          await copied;
          throw err;
        });
        const copy = copied === undefined ? undefined : await copied;
        const failure =
          copy === undefined
            ? undefined
            : "failure" in copy
              ? copy.failure
              : "resend" in copy
                ? copy.resend
                : copy.checksum !== ref.checksum
                  ? `the copy it kept has crc32 ${copy.checksum}, the part ${ref.checksum}`
                  : undefined;
        if (failure !== undefined) {
          this.access.sendControl({ t: "cpr-part-failed", rank, epoch, message: `its partner rank ${partner} could not keep a copy: ${failure}` });
          return;
        }
        this.access.sendControl({ t: "cpr-part", rank, epoch, ref: { rank: ref.rank, epoch: ref.epoch, checksum: ref.checksum, bytes: ref.bytes } });
      } catch (err) {
        this.access.sendControl({ t: "cpr-part-failed", rank, epoch, message: (err as Error).message });
      }
    });
  }
}
