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
import { LifelineError, type LifelineErrorCode } from "../../errors.ts";
import { byteLengthOf } from "../../mpi/codec.ts";
import { crc32 } from "../../store/checksum.ts";
import type { CoordinatorToRank } from "../../mpi/control.ts";
import type { RawFrame } from "../../mpi/cpr-hook.ts";
import type { Host, Timer } from "../../mpi/host.ts";
import {
  PROTO_RETRY_BASE,
  type RetryDecision,
  type RetryOneHook,
  type RetryOneHookFactory,
  type RetryRestoredValue,
  type RetryWorldAccess,
} from "../../mpi/retry-hook.ts";
import type { Header } from "../../mpi/wire.ts";
import { type Deferred, deferred } from "../deferred.ts";
import { RetryOneRank } from "./rank.ts";
import type { Lazy, ProtoFrame, RankEffect, RankInput } from "./types.ts";

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
};
const TAG_LAST = PROTO_RETRY_BASE + 10;

export interface RetryOneDriverOptions {
  /** Ring successors holding each rank's state (`--replicas`, default 2). */
  readonly replicas?: number | undefined;
  /** A dead rank not running again within this long fails the survivors (`--failure-timeout`). */
  readonly failureTimeoutMs?: number | undefined;
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
  private ckpt: Deferred<void> | undefined;
  private restoring: Deferred<RetryRestored> | undefined;
  private failure: LifelineError | undefined;
  /** Collective frames of a newer view than ours, until the coordinator's news arrives. */
  private held: { header: Header; frame: RawFrame }[] = [];
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

  constructor(
    private readonly access: RetryWorldAccess,
    private readonly host: Host,
    private readonly opts: RetryOneDriverOptions = {},
  ) {
    this.failureTimeoutMs = opts.failureTimeoutMs ?? 60_000;
    this.replaying = access.attempt > 0 ? 0 : undefined;
  }

  beforeStart(table: Extract<CoordinatorToRank, { t: "table" }>): void {
    const nowMs = this.host.now();
    if (table.reached !== undefined) this.reached = table.reached;
    this.machine = new RetryOneRank({
      rank: this.access.rank,
      size: this.access.size,
      attempt: this.access.attempt,
      attempts: table.attempts,
      replicas: this.opts.replicas,
      groups: table.hosts,
      failureTimeoutMs: this.failureTimeoutMs,
      nowMs,
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
  }): Promise<RetryDecision> {
    const d = this.newCall();
    this.input(call.bootstrapKey === undefined ? { kind: "collective", ident: call.ident } : { kind: "boot", key: call.bootstrapKey, ident: call.ident });
    return d;
  }

  resumeCollective(): Promise<RetryDecision> {
    if (this.failure !== undefined) return Promise.reject(this.failure);
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
      case "hold":
        this.held.push({ header, frame });
        return false;
      case "drop":
        return false;
    }
  }

  onProtocol(header: Header, body: unknown): void {
    if (header.tag < PROTO_RETRY_BASE || header.tag > TAG_LAST) return;
    this.input({ kind: "frame", from: header.source, attempt: header.attempt, frame: body as ProtoFrame });
  }

  onControl(msg: CoordinatorToRank): void {
    const nowMs = this.host.now();
    if (msg.t === "peer") this.input({ kind: "peer-up", rank: msg.rank, attempt: msg.attempt, nowMs });
    else if (msg.t === "peer-down") this.input({ kind: "peer-down", rank: msg.rank, attempt: msg.attempt, nowMs });
  }

  checkpoint(state: unknown, global: Buffer | undefined, consumed: readonly number[]): Promise<void> {
    const d = deferred<void>();
    this.ckpt = d;
    // The global's content names it: a restarted peer takes the global of its checkpoint from
    // any rank that kept its own with the same key (the global is the same on every rank).
    const key = global === undefined ? null : `${crc32(global).toString(16)}:${global.byteLength}`;
    this.input({ kind: "checkpoint", state: lazyOf(state), global: { kind: "value", value: global }, key, consumed });
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

  close(): void {
    this.timer?.stop();
    this.timer = undefined;
  }

  // ---- the machine loop ----------------------------------------------------------------------

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
      case "execute": {
        // The first collective a restarted rank runs on the wire: it has caught up.
        this.reportCaughtUp();
        const c = this.call;
        this.call = undefined;
        c?.resolve({ run: { wireSeq: e.wireSeq, viewId: e.viewId, purgeBelow: e.purgeBelow } });
        return;
      }
      case "abandon":
        // World asks resumeCollective() for the next decision of the same call.
        this.abandonedBelow = Math.max(this.abandonedBelow, e.wireSeq + 1);
        void this.newCall(); // its decision is taken by resumeCollective()
        this.access.abandonCollective(e.wireSeq);
        return;
      case "complete": {
        if (!e.replayed) return; // World has the result of its own run already
        if (this.replaying !== undefined) this.replaying++;
        const c = this.call;
        this.call = undefined;
        c?.resolve({ result: asBuffer(e.result) });
        return;
      }
      case "restored": {
        const d = this.restoring;
        this.restoring = undefined;
        const v = e.restored.value;
        this.restoredVersion = v?.version ?? 0;
        d?.resolve({
          value: v === undefined ? undefined : { state: v.state, global: v.global === undefined ? undefined : asBuffer(v.global), version: v.version },
          dets: e.restored.dets,
          detFrom: e.restored.detFrom,
        });
        return;
      }
      case "checkpointed": {
        // A point-to-point program may run no collective for long: past the checkpoint count
        // its previous incarnation had reached (the step it died in redone), it has caught up.
        if (e.version > this.reached) this.reportCaughtUp();
        const d = this.ckpt;
        this.ckpt = undefined;
        d?.resolve();
        return;
      }
      case "recycle":
        for (const r of e.results) if (Buffer.isBuffer(r)) this.access.recycle(r);
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
    this.call?.reject(err);
    this.ckpt?.reject(err);
    this.restoring?.reject(err);
    this.call = undefined;
    this.ckpt = undefined;
    this.restoring = undefined;
    this.decision = Promise.reject(err);
    this.decision.catch(() => undefined);
    if (first) this.access.fatal(code, message);
  }

  /** After a view change: frames held for it are delivered, kept or dropped. */
  private reclassifyHeld(): void {
    const m = this.machine!;
    const held = this.held;
    this.held = [];
    for (const h of held) {
      const v = m.classifyWire(h.header.source, h.header.attempt, h.header.epoch, h.header.collSeq);
      if (v === "accept") this.access.inject(h.frame);
      else if (v === "hold") this.held.push(h);
    }
  }
}
