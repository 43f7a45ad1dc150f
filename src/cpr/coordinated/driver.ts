/**
 * The rank-side driver of coordinated checkpointing: binds the pure {@link RankMachine} to a
 * World (through the {@link CprHook} seam of src/mpi) and to the rank's part store.
 *
 * The driver owns what the machine must not: serializing the program's and the library's
 * state at a checkpoint location, copying late frames, writing the part (never awaited by
 * the program: the write runs while the program continues, and its outcome goes to the
 * initiator as cpr-part / cpr-part-failed), and, on recovery, reading the part, restoring the
 * library state, re-injecting the logged frames before the transport delivers anything, and
 * exchanging early-id lists with every peer before init() returns.
 *
 * Time and I/O come from the World's Host and the part store given at construction, so the
 * simulator runs this same code over a MemoryRecoveryStore.
 *
 * @example
 * const world = await World.join(place, { cpr: coordinatedHook(() => new LevelRecoveryStore(place.store).openRank(place.rank)) });
 */
import { LifelineError } from "../../errors.ts";
import { decodeValue, encodeValue } from "../../mpi/codec.ts";
import type { CoordinatorToRank } from "../../mpi/control.ts";
import type { CprHook, CprHookFactory, CprWorldAccess, LibState, NondetEntry, NondetTicket, RawFrame } from "../../mpi/cpr-hook.ts";
import { PROTO_CPR_BASE } from "../../mpi/cpr-hook.ts";
import type { Host, Timer } from "../../mpi/host.ts";
import { Flag, frameId, type Header } from "../../mpi/wire.ts";
import { RankMachine, type RankEffect } from "./rank.ts";

/** The part store operations the driver needs (RankPartStore satisfies it). */
export interface PartStoreLike {
  putPart(epoch: number, bytes: Uint8Array): Promise<{ rank: number; epoch: number; checksum: number; bytes: number }>;
  readPart(ref: { rank: number; epoch: number; checksum: number; bytes: number }): Promise<Buffer>;
  retain(keep: readonly number[], opts?: { dropNewer?: boolean }): Promise<number[]>;
  dropParts(epochs: readonly number[]): Promise<number[]>;
  close(): Promise<void>;
}

/** Protocol-frame tags. */
export const PROTO_CPR_MARKER = PROTO_CPR_BASE;
export const PROTO_CPR_EARLY = PROTO_CPR_BASE + 1;

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
const PART_FORMAT = 1;

/** A rank's part of a recovery line, as stored. */
interface Part {
  v: number;
  epoch: number;
  state: Buffer;
  global: Buffer | null;
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
}

export class CoordinatedDriver implements CprHook {
  private readonly machine: RankMachine;
  private parts: PartStoreLike | undefined;
  private partsOpening: Promise<PartStoreLike> | undefined;
  /** State serialized at the current round's checkpoint, until its part is written. */
  private saved: { epoch: number; state: Buffer; global: Buffer | null; lib: Buffer } | undefined;
  private lateBytes = 0;
  private restoredPart: { state: unknown; global: unknown; version: number } | undefined;
  private restoreTaken = false;
  private bootstrap = new Map<string, Buffer>();
  private restoring = false;
  private readonly earlyLists = new Map<number, number[]>();
  private earlyWaiter: (() => void) | undefined;
  private writes: Promise<void> = Promise.resolve();
  /** Lines the initiator aborted: their parts are deleted, or never written. */
  private readonly abortedEpochs = new Set<number>();
  private failed = false;
  private recordingTimer: Timer | undefined;
  private readonly recordingTimeoutMs: number;

  constructor(private readonly access: CprWorldAccess, private readonly host: Host, private readonly openParts: () => Promise<PartStoreLike>, opts: CoordinatedDriverOptions = {}) {
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
    const spec = table.restore;
    if (spec === undefined) return;
    if (spec.ref.rank !== this.access.rank || spec.ref.epoch !== spec.epoch) {
      throw new LifelineError("CPR_RESTORE", `rank ${this.access.rank} was told to restore line ${spec.epoch} from rank ${spec.ref.rank}'s part of line ${spec.ref.epoch}`);
    }
    const bytes = await parts.readPart(spec.ref);
    const part = decodeValue(bytes) as Part;
    if (part.v !== PART_FORMAT || part.epoch !== spec.epoch) {
      throw new LifelineError("CPR_RESTORE", `rank ${this.access.rank}'s part of line ${spec.epoch} has format ${part.v} and epoch ${part.epoch}; expected format ${PART_FORMAT}, epoch ${spec.epoch}`);
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
      global: part.global === null ? undefined : decodeValue(part.global),
      version: part.epoch,
    };
    this.restoring = true;
  }

  async afterStart(): Promise<void> {
    if (!this.restoring) return;
    // Tell every peer which of its frames we already hold (early messages, slide 13): it
    // must not send them again. Wait for every peer's list before the program runs, so no
    // re-send can leave before its suppression is known.
    for (let d = 0; d < this.access.size; d++) {
      if (d !== this.access.rank) this.access.sendProtocol(d, PROTO_CPR_EARLY, { epoch: this.machine.epoch, ids: this.machine.earlyFrom(d) });
    }
    await new Promise<void>((resolve, reject) => {
      const timer = this.host.after(RECOVERY_EXCHANGE_TIMEOUT_MS, () =>
        reject(new LifelineError("CPR_RESTORE", `rank ${this.access.rank}: early-message lists from ${this.access.size - 1 - this.earlyLists.size} peer(s) did not arrive within ${RECOVERY_EXCHANGE_TIMEOUT_MS / 1000} s of the restore`)));
      this.earlyWaiter = () => {
        if (this.earlyLists.size < this.access.size - 1) return;
        timer.stop();
        this.earlyWaiter = undefined;
        resolve();
      };
      this.earlyWaiter();
    });
    this.restoring = false;
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
        effects.push(...this.machine.abandonRecording(`more than ${LATE_BYTES_MAX >> 20} MiB of late messages to log while recording epoch ${this.machine.epoch}`));
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
      default:
        return;
    }
  }

  onControl(msg: CoordinatorToRank): void {
    if (msg.t === "cpr-committed") {
      const keep = msg.keep;
      this.writes = this.writes.then(async () => {
        const parts = await this.store();
        await parts.retain(keep);
      }).catch((err: unknown) => this.host.warn(`lifeline: rank ${this.access.rank}: could not delete old parts: ${(err as Error).message}`));
      return;
    }
    if (msg.t === "cpr-aborted") {
      // An aborted line leaves nothing behind: a part written (or being written: the chain
      // orders it) goes now; one not yet written is never written (writePart).
      const epoch = msg.epoch;
      this.abortedEpochs.add(epoch);
      this.writes = this.writes.then(async () => {
        const parts = await this.store();
        await parts.dropParts([epoch]);
      }).catch((err: unknown) => this.host.warn(`lifeline: rank ${this.access.rank}: could not delete its part of aborted line ${epoch}: ${(err as Error).message}`));
      return;
    }
    this.apply(this.machine.onControl(msg));
  }

  checkpoint(state: unknown, global: unknown, flushSelf: () => void): void {
    if (!this.machine.mayCheckpoint || this.failed) return;
    // Nothing to self may cross the line: deliver what is pending into the matcher, where
    // it is channel state saved below.
    flushSelf();
    const value = typeof state === "function" ? (state as () => unknown)() : state;
    const saved = {
      epoch: this.machine.epoch + 1,
      state: encodeValue(value),
      global: global === undefined ? null : encodeValue(global),
      lib: encodeValue(this.access.captureLibState()),
    };
    this.saved = saved;
    this.lateBytes = 0;
    this.apply(this.machine.takeCheckpoint());
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
    return r;
  }

  bootstrapResult(key: string): { value: unknown } | undefined {
    const b = this.bootstrap.get(key);
    return b === undefined ? undefined : { value: decodeValue(b) };
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
        effects.push(...this.machine.abandonRecording(`more than ${LATE_BYTES_MAX >> 20} MiB of late and polled messages to log while recording epoch ${this.machine.epoch}`));
      }
    }
    this.apply(effects);
  }

  async close(): Promise<void> {
    this.recordingTimer?.stop();
    await this.writes.catch(() => undefined);
    await this.parts?.close();
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
          this.host.warn(`lifeline: rank ${this.access.rank}: ${e.reason}; line ${e.epoch} will not be committed, the last committed line stays the recovery point`);
          this.access.sendControl({ t: "cpr-part-failed", rank: this.access.rank, epoch: e.epoch, message: `recording abandoned: ${e.reason}` });
          break;
        case "fatal":
          this.failed = true;
          this.access.fatal(e.code, e.message);
          break;
      }
    }
  }

  /** Builds the part of `epoch` and writes it in the background; reports the outcome. */
  private writePart(epoch: number): void {
    const saved = this.saved;
    const logs = this.machine.partLogs();
    this.saved = undefined;
    if (saved === undefined || saved.epoch !== epoch) {
      this.access.sendControl({ t: "cpr-part-failed", rank: this.access.rank, epoch, message: "no local checkpoint of this epoch" });
      return;
    }
    const part: Part = {
      v: PART_FORMAT,
      epoch,
      state: saved.state,
      global: saved.global,
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
        const parts = await this.store();
        const ref = await parts.putPart(epoch, encodeValue(part));
        this.access.sendControl({ t: "cpr-part", rank, epoch, ref: { rank: ref.rank, epoch: ref.epoch, checksum: ref.checksum, bytes: ref.bytes } });
      } catch (err) {
        this.access.sendControl({ t: "cpr-part-failed", rank, epoch, message: (err as Error).message });
      }
    });
  }
}
