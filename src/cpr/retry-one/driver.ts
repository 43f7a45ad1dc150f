/**
 * The rank-side driver of retry-one mode: binds the pure {@link RetryOneRank} to a World
 * (through the {@link RetryOneHook} seam of src/mpi) and carries out its effects (see
 * INTEGRATION.md): protocol frames out and in (tags {@link TAG}, from `PROTO_RETRY_BASE`),
 * collectives run on the wire or answered from a buffer, abandoned executions, checkpoints
 * that resolve when committed, restore() from peers, failure news from the coordinator and
 * the failure timeout (a tick).
 *
 * Effects are carried out in order and `step` is never re-entered: inputs that arrive while
 * effects run are queued (a state machine is never re-entered). Time comes from the World's Host, so the simulator runs
 * this same code.
 *
 * @example
 * const world = await World.join(place, { retryOne: retryOneHook({ replicas: 2, failureTimeoutMs: 5000 }) });
 */
import { errorMessage, LifelineError, type LifelineErrorCode } from "../../errors.ts";
import { byteLengthOf } from "../../mpi/codec.ts";
import { crc32 } from "../../store/checksum.ts";
import { decodeValue, encodeValue } from "../../mpi/codec.ts";
import type { CoordinatorToRank } from "../../mpi/control.ts";
import type { RawFrame } from "../../mpi/cpr-hook.ts";
import type { Host, Timer } from "../../mpi/host.ts";
import {
  PROTO_RETRY_BASE,
  type RetryDecision,
  type RetryOneHook,
  type RetryOneHookFactory,
  type RetryCheckpointLib,
  type RetryRestoredValue,
  type RetryWorldAccess,
} from "../../mpi/retry-hook.ts";
import type { Header } from "../../mpi/wire.ts";
import type { PartStoreLike } from "../coordinated/driver.ts";
import { type Deferred, deferred } from "../deferred.ts";
import { RetryOneRank } from "./rank.ts";
import type { AllRestart, CollIdentity, Lazy, ProtoFrame, RankEffect, RankInput } from "./types.ts";

/** Protocol-frame tags of retry-one (distinct from cpr's 0x200 range). */
export const TAG: Record<ProtoFrame["t"], number> = {
  summary: PROTO_RETRY_BASE,
  xfer: PROTO_RETRY_BASE + 1,
  replica: PROTO_RETRY_BASE + 2,
  stored: PROTO_RETRY_BASE + 3,
  rack: PROTO_RETRY_BASE + 4,
  dets: PROTO_RETRY_BASE + 5,
  dack: PROTO_RETRY_BASE + 6,
  ask: PROTO_RETRY_BASE + 7,
  done: PROTO_RETRY_BASE + 8,
  logs: PROTO_RETRY_BASE + 9,
  lack: PROTO_RETRY_BASE + 10,
  rnak: PROTO_RETRY_BASE + 11,
};
const TAG_LAST = PROTO_RETRY_BASE + 11;

export interface RetryOneDriverOptions {
  /** Ring successors holding each rank's state (`--replicas`, default 2). */
  readonly replicas?: number | undefined;
  /** A dead rank not running again within this long fails the survivors (`--failure-timeout`). */
  readonly failureTimeoutMs?: number | undefined;
  /** The durable floor: every `durableEvery`-th own checkpoint goes to the part store too (0: none). */
  readonly durableEvery?: number | undefined;
  /** This rank's part store (opened on first use): durable checkpoints, and a restart of every rank from them. */
  readonly openParts?: (() => Promise<PartStoreLike>) | undefined;
}

/** Collective frames of a newer view kept until the view changes (a restarted peer ran ahead of the news of it). */
const HELD_WIRE_FRAMES_MAX = 65_536;
const HELD_WIRE_BYTES_MAX = 1 << 30;

/** How long a released rank waits for a durable write still under way. */
const DURABLE_CLOSE_WAIT_MS = 5_000;
const DURABLE_FORMAT = 1;

/** A durable checkpoint as it is stored (one part per version in the rank's part store). */
interface DurablePart {
  readonly v: number;
  readonly version: number;
  readonly index: number;
  readonly key: string | null;
  readonly state: unknown;
  readonly global: Buffer | null;
  readonly cache: readonly [string, CollIdentity, unknown][];
}

/** The factory World.join takes in mode retry-one. */
export function retryOneHook(opts: RetryOneDriverOptions = {}): RetryOneHookFactory {
  return (access, host) => new RetryOneDriver(access, host, opts);
}

/**
 * An encoded value as one buffer: msgpack may hand back a Uint8Array where a Buffer went in,
 * and a kept result may be the list of buffers whose concatenation is its encoding.
 */
function asBuffer(v: unknown): Buffer {
  if (Buffer.isBuffer(v)) return v;
  if (v instanceof Uint8Array) return Buffer.from(v.buffer, v.byteOffset, v.byteLength);
  if (Array.isArray(v) && v.every((p) => p instanceof Uint8Array)) return Buffer.concat(v);
  throw new LifelineError("CPR_PROTOCOL", `retry-one: expected an encoded value, got ${typeof v}`);
}

function lazyOf(v: unknown): Lazy {
  return typeof v === "function" ? { kind: "thunk", thunk: v as () => unknown } : { kind: "value", value: v };
}

/** What restore() gives the communicator: the checkpoint (undefined: the start) and the determinants after it. */
export type RetryRestored = RetryRestoredValue;

export class RetryOneDriver implements RetryOneHook {
  private machine: RetryOneRank | undefined;
  private readonly early: RankInput[] = [];
  private readonly queue: RankInput[] = [];
  private stepping = false;
  /** The pending collective's next decision (a new one after each abandon). */
  private call: Deferred<RetryDecision> | undefined;
  private decision: Promise<RetryDecision> | undefined;
  /** beforeCollective's step runs: a decision taken now is returned, not resolved (see decide). */
  private deciding = false;
  private decided: RetryDecision | undefined;
  private ckpt: Deferred<void> | undefined;
  private restoring: Deferred<RetryRestored> | undefined;
  /** The restored checkpoint's global, when the machine restored without it (`globalPending`). */
  private globalWait: Deferred<Buffer> | undefined;
  private failure: LifelineError | undefined;
  /** Collective frames of a newer view than ours, until the coordinator's news arrives. */
  private held: { header: Header; frame: RawFrame }[] = [];
  /** Bytes of the collective frames held for a newer view (bounded: a hostile peer could send many). */
  private heldBytes = 0;
  private timer: Timer | undefined;
  private readonly failureTimeoutMs: number;
  /** Wire executions below this were abandoned. */
  private abandonedBelow = 0;
  /** A restarted rank: collectives answered from buffers so far; undefined once it caught up. */
  private replaying: number | undefined;
  /** The checkpoint version restore() got from the peers (0: none). */
  private restoredVersion = 0;
  /** A restarted rank: the checkpoint count its previous incarnation had reached (caught up past it). */
  private reached = Infinity;
  /** The checkpoint being taken: its global and counters (a durable one writes them). */
  private taking: { version: number; global: Buffer | undefined; key: string | null; lib: RetryCheckpointLib } | undefined;
  /** Durable writes, one at a time; the newest due one waits while another runs. */
  private durableWrite: Promise<void> | undefined;
  /** Cancels the durable write under way (see close()). */
  private durableAbort: AbortController | undefined;
  /** Every rank finalized: the job is over, and no restart can use a durable checkpoint any more. */
  private released = false;
  private durableNext: { version: number; global: Buffer | undefined; key: string | null; lib: RetryCheckpointLib } | undefined;
  private parts: Promise<PartStoreLike> | undefined;
  private closing = false;

  constructor(
    private readonly access: RetryWorldAccess,
    private readonly host: Host,
    private readonly opts: RetryOneDriverOptions = {},
  ) {
    this.failureTimeoutMs = opts.failureTimeoutMs ?? 60_000;
    this.replaying = access.attempt > 0 ? 0 : undefined;
  }

  async beforeStart(table: Extract<CoordinatorToRank, { t: "table" }>): Promise<void> {
    if (table.reached !== undefined) this.reached = table.reached;
    const allRestart = table.retryStart === undefined ? undefined : await this.allRestartOf(table);
    // Every rank restarted together (the durable floor): nobody catches up with anyone.
    if (allRestart !== undefined) this.replaying = undefined;
    const nowMs = this.host.now();
    this.machine = new RetryOneRank({
      rank: this.access.rank,
      size: this.access.size,
      attempt: this.access.attempt,
      attempts: table.attempts,
      replicas: this.opts.replicas,
      groups: table.hosts,
      failureTimeoutMs: this.failureTimeoutMs,
      nowMs,
      allRestart,
      replicaCodec: this.access.replicaCodec,
    });
    for (const r of table.down ?? []) this.input({ kind: "peer-down", rank: r, attempt: table.attempts[r] ?? 0, nowMs });
    this.timer = this.host.every(Math.max(50, this.failureTimeoutMs / 4), () => this.input({ kind: "tick", nowMs: this.host.now() }));
    for (const i of this.early.splice(0)) this.input(i);
  }

  get progress(): { version: number; seqno: number } {
    const p = this.machine?.progress;
    return { version: p?.version ?? 0, seqno: p?.seqno ?? 0 };
  }

  get viewId(): number {
    return this.machine?.viewId ?? 0;
  }

  get view(): readonly number[] {
    return this.machine?.view ?? [];
  }

  get isRestoring(): boolean {
    return this.machine?.isRestoring ?? this.access.attempt > 0;
  }

  get inRecovery(): boolean {
    return this.machine?.inRecovery ?? false;
  }

  beforeCollective(call: {
    readonly ident: { op: string; root: number; type: string; length: number };
    readonly bootstrapKey?: string;
  }): RetryDecision | Promise<RetryDecision> {
    if (this.failure !== undefined) return this.failed(this.failure);
    this.call = undefined;
    this.decision = undefined;
    // The machine decides at once in the common case (run it on the wire, or answer it from
    // the buffer): that decision is returned as it is, with no promise to wait on (see decide).
    this.deciding = true;
    try {
      this.input(call.bootstrapKey === undefined ? { kind: "collective", ident: call.ident } : { kind: "boot", key: call.bootstrapKey, ident: call.ident });
    } finally {
      this.deciding = false;
    }
    const now = this.decided;
    this.decided = undefined;
    // Else a decision to come; or the one this call failed with (fail() set it).
    return now ?? this.decision ?? this.newCall();
  }

  resumeCollective(): Promise<RetryDecision> {
    if (this.failure !== undefined) return this.failed(this.failure);
    return this.decision ?? Promise.reject(new LifelineError("CPR_PROTOCOL", "retry-one: a collective resumed that the protocol is not running"));
  }

  isAbandoned(wireSeq: number): boolean {
    return wireSeq < this.abandonedBelow;
  }

  afterCollective(result: Buffer | readonly Buffer[]): void {
    const bytes = Buffer.isBuffer(result) ? result.byteLength : byteLengthOf(result);
    this.input({ kind: "executed", result, bytes });
  }

  arrive(header: Header, frame: RawFrame): boolean {
    const m = this.machine;
    if (m === undefined) return true;
    switch (m.classifyWire(header.source, header.attempt, header.epoch, header.collSeq)) {
      case "accept":
        return true;
      case "hold": {
        const bytes = byteLengthOf(frame.body) + frame.header.byteLength;
        if (this.held.length >= HELD_WIRE_FRAMES_MAX || this.heldBytes + bytes > HELD_WIRE_BYTES_MAX) {
          this.access.fatal(
            "CPR_PROTOCOL",
            `rank ${this.access.rank}: more than ${HELD_WIRE_FRAMES_MAX} collective frames or ${HELD_WIRE_BYTES_MAX} bytes held for a view no restart announced yet (the last from rank ${header.source}, attempt ${header.attempt}); the coordinator's news does not arrive, or that rank is not a member of this job`,
          );
          return false;
        }
        this.held.push({ header, frame });
        this.heldBytes += bytes;
        return false;
      }
      case "drop":
        return false;
    }
  }

  onProtocol(header: Header, body: unknown): void {
    if (header.tag < PROTO_RETRY_BASE || header.tag > TAG_LAST) return;
    this.input({ kind: "frame", from: header.source, attempt: header.attempt, frame: body as ProtoFrame });
  }

  onControl(msg: CoordinatorToRank): void {
    if (msg.t === "cpr-durable-keep") {
      this.keepDurable(msg.keep);
      return;
    }
    if (msg.t === "release") {
      this.released = true;
      return;
    }
    const nowMs = this.host.now();
    if (msg.t === "peer") this.input({ kind: "peer-up", rank: msg.rank, attempt: msg.attempt, nowMs });
    else if (msg.t === "peer-down") this.input({ kind: "peer-down", rank: msg.rank, attempt: msg.attempt, nowMs });
  }

  checkpoint(state: unknown, global: Buffer | undefined, lib: RetryCheckpointLib): Promise<void> {
    const d = deferred<void>();
    this.ckpt = d;
    // The global's content names it: a restarted peer takes the global of its checkpoint from
    // any rank that kept its own with the same key (the global is the same on every rank).
    const key = global === undefined ? null : `${crc32(global).toString(16)}:${global.byteLength}`;
    this.taking = { version: (this.machine?.progress.version ?? 0) + 1, global, key, lib };
    this.input({ kind: "checkpoint", state: lazyOf(state), global: { kind: "value", value: global }, key, consumed: lib.consumed });
    return d.promise;
  }

  restore(): Promise<RetryRestored> {
    const d = deferred<RetryRestored>();
    this.restoring = d;
    this.input({ kind: "restore" });
    return d.promise;
  }

  logDets(from: number, entries: readonly unknown[]): void {
    this.input({ kind: "dets", from, entries });
  }

  finalize(): void {
    // A restarted rank whose every collective, up to finalize()'s barrier, was answered from
    // the others' buffers (they had finalized already) caught up here.
    this.reportCaughtUp();
    this.input({ kind: "finalize" });
  }

  async close(): Promise<void> {
    this.timer?.stop();
    this.timer = undefined;
    this.closing = true;
    this.durableNext = undefined;
    // After the release a write under way is abandoned before its fsync (the job's end should
    // not wait for a checkpoint that nothing will restore; the unfinished file is removed, or
    // collected as an orphan when the store next opens). Otherwise it finishes (or not: a store
    // stuck on a dead disk must not keep this rank alive; no line depends on an unreported part).
    if (this.released) this.durableAbort?.abort(new LifelineError("CPR_CHECKPOINT", "the job was released"));
    let timer: Timer | undefined;
    await Promise.race([this.durableWrite, new Promise<void>((resolve) => (timer = this.host.after(DURABLE_CLOSE_WAIT_MS, resolve)))]);
    timer?.stop();
    const parts = await this.parts?.catch(() => undefined);
    await parts?.close().catch(() => undefined);
  }

  // ---- the durable floor ---------------------------------------------------------------------

  private partStore(): Promise<PartStoreLike> {
    const open = this.opts.openParts;
    if (open === undefined) return Promise.reject(new LifelineError("CPR_RESTORE", `rank ${this.access.rank} has no part store (LIFELINE_STORE)`));
    this.parts ??= open();
    return this.parts;
  }

  /** A restart of every rank: this rank's part of the line (none: it starts from its program's start). */
  private async allRestartOf(table: Extract<CoordinatorToRank, { t: "table" }>): Promise<AllRestart> {
    const start = table.retryStart!;
    const spec = table.restore;
    if (spec === undefined) return { part: undefined, versions: start.versions, index: start.index };
    if (spec.ref.rank !== this.access.rank || spec.ref.epoch !== start.versions[this.access.rank]) {
      throw new LifelineError("CPR_RESTORE", `rank ${this.access.rank} was told to restore rank ${spec.ref.rank}'s durable checkpoint ${spec.ref.epoch}`);
    }
    const part = decodeValue(await (await this.partStore()).readPart(spec.ref)) as DurablePart;
    if (part.v !== DURABLE_FORMAT || part.version !== spec.ref.epoch || part.index !== start.index) {
      throw new LifelineError(
        "CPR_RESTORE",
        `rank ${this.access.rank}'s durable checkpoint ${spec.ref.epoch} has format ${part.v}, version ${part.version} and collective index ${part.index}; expected format ${DURABLE_FORMAT}, version ${spec.ref.epoch}, index ${start.index}`,
      );
    }
    return {
      part: {
        version: part.version,
        index: part.index,
        key: part.key,
        state: part.state,
        global: part.global === null ? undefined : part.global,
        cache: part.cache.map(([key, ident, result]) => ({ key, ident, result })),
      },
      versions: start.versions,
      index: start.index,
    };
  }

  /**
   * Writes the checkpoint just made safe to the part store, in the background (the program
   * goes on), and tells the launcher, which records it for a durable line. One write at a
   * time; while one runs, only the newest due checkpoint waits.
   */
  private writeDurable(c: { version: number; global: Buffer | undefined; key: string | null; lib: RetryCheckpointLib }): void {
    if (this.closing) return;
    if (this.durableWrite !== undefined) {
      this.durableNext = c;
      return;
    }
    const m = this.machine!;
    const safe = m.safeCheckpoint(c.version);
    if (safe === undefined) return; // superseded already
    const part: DurablePart = {
      v: DURABLE_FORMAT,
      version: c.version,
      index: safe.index,
      key: c.key,
      state: safe.state,
      global: c.global ?? null,
      cache: m.bootstrapEntries.map((e) => [e.key, e.ident, e.result] as [string, CollIdentity, unknown]),
    };
    const rank = this.access.rank;
    // Encoded now: the checkpoint's state may refer to memory that is reused once it is released.
    let bytes: Buffer;
    try {
      bytes = encodeValue(part);
    } catch (err) {
      this.host.warn(
        `lifeline: rank ${rank}: could not encode durable checkpoint ${c.version}: ${errorMessage(err)} (the durable floor stays at an older one)`,
      );
      return;
    }
    const abort = new AbortController();
    this.durableAbort = abort;
    this.durableWrite = (async () => {
      try {
        const ref = await (await this.partStore()).putPart(c.version, bytes, abort.signal);
        this.access.sendControl({
          t: "cpr-durable",
          rank,
          epoch: c.version,
          ref: { rank: ref.rank, epoch: ref.epoch, checksum: ref.checksum, bytes: ref.bytes },
          index: part.index,
          sent: [...c.lib.sent],
          consumed: [...c.lib.consumed],
          logFrom: [...c.lib.logFrom],
        });
      } catch (err) {
        if (abort.signal.aborted) return;
        this.host.warn(
          `lifeline: rank ${rank}: could not write durable checkpoint ${c.version}: ${errorMessage(err)} (the durable floor stays at an older one)`,
        );
      }
    })().finally(() => {
      this.durableWrite = undefined;
      this.durableAbort = undefined;
      const next = this.durableNext;
      this.durableNext = undefined;
      if (next !== undefined) this.writeDurable(next);
    });
  }

  /** The launcher's word on which durable checkpoints lines still use (older others go). */
  private keepDurable(keep: readonly number[]): void {
    if (this.opts.openParts === undefined) return;
    void this.partStore()
      .then((parts) => parts.retain(keep))
      .catch((err: unknown) => this.host.warn(`lifeline: rank ${this.access.rank}: could not delete old durable checkpoints: ${errorMessage(err)}`));
  }

  // ---- the machine loop ----------------------------------------------------------------------

  /**
   * The pending collective's decision: returned by beforeCollective when it was taken there,
   * else the waiting call's.
   */
  private decide(d: RetryDecision): void {
    const c = this.call;
    if (c === undefined && this.deciding) {
      this.decided = d;
      return;
    }
    this.call = undefined;
    c?.resolve(d);
  }

  private newCall(): Promise<RetryDecision> {
    const d = deferred<RetryDecision>();
    this.call = d;
    this.decision = d.promise;
    return d.promise;
  }

  private input(i: RankInput): void {
    if (this.machine === undefined) {
      this.early.push(i);
      return;
    }
    this.queue.push(i);
    if (this.stepping) return;
    this.stepping = true;
    try {
      while (this.queue.length > 0) {
        const next = this.queue.shift()!;
        for (const e of this.machine.step(next)) this.effect(e);
        if (next.kind === "peer-up") this.reclassifyHeld();
      }
    } finally {
      this.stepping = false;
    }
  }

  private effect(e: RankEffect): void {
    switch (e.kind) {
      case "send":
        this.access.sendProtocol(e.to, TAG[e.frame.t], e.frame);
        return;
      case "execute":
        // The first collective a restarted rank runs on the wire: it has caught up.
        this.reportCaughtUp();
        this.decide({ run: { wireSeq: e.wireSeq, viewId: e.viewId, purgeBelow: e.purgeBelow } });
        return;
      case "abandon":
        // World asks resumeCollective() for the next decision of the same call.
        this.abandonedBelow = Math.max(this.abandonedBelow, e.wireSeq + 1);
        void this.newCall(); // its decision is taken by resumeCollective()
        this.access.abandonCollective(e.wireSeq);
        return;
      case "complete": {
        if (!e.replayed) return; // World has the result of its own run already
        if (this.replaying !== undefined) this.replaying++;
        this.decide({ result: asBuffer(e.result) });
        return;
      }
      case "restored": {
        const d = this.restoring;
        this.restoring = undefined;
        const v = e.restored.value;
        this.restoredVersion = v?.version ?? 0;
        if (v?.globalPending === true) this.globalWait = deferred<Buffer>();
        const later = v?.globalPending === true ? { globalLater: this.globalWait!.promise } : {};
        d?.resolve({
          value:
            v === undefined ? undefined : { state: v.state, global: v.global === undefined ? undefined : asBuffer(v.global), version: v.version, ...later },
          dets: e.restored.dets,
          detFrom: e.restored.detFrom,
        });
        return;
      }
      case "global": {
        const g = this.globalWait;
        this.globalWait = undefined;
        g?.resolve(asBuffer(e.global));
        return;
      }
      case "checkpointed": {
        // A point-to-point program may run no collective for long: past the checkpoint count
        // its previous incarnation had reached (the step it died in redone), it has caught up.
        if (e.version > this.reached) this.reportCaughtUp();
        const every = this.opts.durableEvery ?? 0;
        if (every > 0 && e.version % every === 0 && this.taking?.version === e.version) this.writeDurable(this.taking);
        this.taking = undefined;
        const d = this.ckpt;
        this.ckpt = undefined;
        d?.resolve();
        return;
      }
      case "recycle":
        for (const r of e.results) if (Buffer.isBuffer(r)) this.access.recycle(r);
        return;
      case "own-released":
        this.access.ownReleased(e.version, e.clean);
        return;
      case "gate":
        this.access.setGate(e.open);
        return;
      case "peer-safe":
        this.access.peerSafe(e.rank, e.consumed);
        return;
      case "fail":
        this.fail(e.code, e.message);
        return;
    }
  }

  private reportCaughtUp(): void {
    if (this.replaying === undefined || this.failure !== undefined) return;
    const p = this.progress;
    this.access.caughtUp({ restored: this.restoredVersion, version: p.version, seqno: p.seqno, replayed: this.replaying });
    this.replaying = undefined;
  }

  private fail(code: LifelineErrorCode, message: string): void {
    const err = new LifelineError(code, message);
    const first = this.failure === undefined;
    this.failure ??= err;
    const waiting = [this.call, this.ckpt, this.restoring, this.globalWait];
    this.globalWait = undefined;
    this.call = undefined;
    this.ckpt = undefined;
    this.restoring = undefined;
    this.decision = this.failed(err);
    this.decision.catch(() => undefined);
    // The abort first: a program that dies of this error before the coordinator has the abort
    // would be taken for a crash (a restart of this rank, where CPR_LOST must restart all).
    if (first) this.access.fatal(code, message);
    this.access.afterAbort(() => {
      for (const w of waiting) w?.reject(err);
    });
  }

  /** A promise that rejects with `err` once the coordinator has this rank's abort. */
  private failed<T>(err: LifelineError): Promise<T> {
    return new Promise<T>((_, reject) => this.access.afterAbort(() => reject(err)));
  }

  /** After a view change: frames held for it are delivered, kept or dropped. */
  private reclassifyHeld(): void {
    const m = this.machine!;
    const held = this.held;
    this.held = [];
    this.heldBytes = 0;
    for (const h of held) {
      const v = m.classifyWire(h.header.source, h.header.attempt, h.header.epoch, h.header.collSeq);
      if (v === "accept") this.access.inject(h.frame);
      else if (v === "hold") {
        this.held.push(h);
        this.heldBytes += byteLengthOf(h.frame.body) + h.frame.header.byteLength;
      }
    }
  }
}
