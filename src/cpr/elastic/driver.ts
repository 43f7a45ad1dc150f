/**
 * The rank-side driver of `--mode elastic`: binds the pure {@link ElasticRank} to a World
 * (through the {@link ElasticHook} seam of src/mpi) and carries out its effects — protocol
 * frames out and in (tags {@link TAG}), summaries and reports to the coordinator, the program's
 * checkpoint()/restore()/bootstrap calls as promises, collective frames held for a world this
 * rank has not entered yet and delivered when it does.
 *
 * Effects are carried out in order and `step` is never re-entered: inputs that arrive while
 * effects run are queued. The machine needs no clock (the coordinator times the waits), and
 * everything else goes through the World, so the simulator runs this same code.
 *
 * @example
 * const world = await World.join(place, { elastic: elasticHook() });
 */
import { LifelineError } from "../../errors.ts";
import type { CoordinatorToRank } from "../../mpi/control.ts";
import type { RawFrame } from "../../mpi/cpr-hook.ts";
import {
  type ElasticHook,
  type ElasticHookFactory,
  type ElasticRestored,
  type ElasticWorldAccess,
  PROTO_ELASTIC_BASE,
  worldChanged,
} from "../../mpi/elastic-hook.ts";
import type { Header } from "../../mpi/wire.ts";
import { type Deferred, deferred } from "../deferred.ts";
import { ElasticRank, HELD_MAX } from "./rank.ts";
import type { ElasticEffect, ElasticInput, ProtoFrame } from "./types.ts";

/** Protocol-frame tags of elastic. */
export const TAG: Record<ProtoFrame["t"], number> = {
  reached: PROTO_ELASTIC_BASE,
  state: PROTO_ELASTIC_BASE + 1,
};
const TAG_LAST = PROTO_ELASTIC_BASE + 1;
/** What a state frame adds to its buffers: msgpack's framing and the small fields (view, lineage, version). */
const STATE_FRAME_SLACK_BYTES = 1024;

/** The factory World.join takes in mode elastic. */
export function elasticHook(): ElasticHookFactory {
  return (access) => new ElasticDriver(access);
}

/** msgpack may hand back a Uint8Array where a Buffer went in. */
function asBuffer(v: unknown): Buffer | undefined {
  if (v === null || v === undefined) return undefined;
  if (Buffer.isBuffer(v)) return v;
  if (v instanceof Uint8Array) return Buffer.from(v.buffer, v.byteOffset, v.byteLength);
  throw new LifelineError("CPR_PROTOCOL", `elastic: expected an encoded value, got ${typeof v}`);
}

export class ElasticDriver implements ElasticHook {
  private machine: ElasticRank | undefined;
  private readonly early: ElasticInput[] = [];
  private readonly queue: ElasticInput[] = [];
  private stepping = false;
  private ckpt: Deferred<void> | undefined;
  private restoring: Deferred<ElasticRestored> | undefined;
  private booting: Deferred<Buffer | undefined> | undefined;
  /** Collective frames of worlds this rank has not entered yet, in arrival order. */
  private held: { header: Header; frame: RawFrame }[] = [];
  private closed = false;
  /** This rank left the world (a replayed change): it ends at the release. */
  private left = false;

  constructor(private readonly access: ElasticWorldAccess) {}

  beforeStart(table: Extract<CoordinatorToRank, { t: "table" }>): void {
    const e = table.elastic;
    this.machine = new ElasticRank({
      slot: this.access.slot,
      attempt: this.access.attempt,
      members: e?.members?.map((m) => ({ slot: m.slot, attempt: m.attempt })),
      plan: e?.plan ?? [],
    });
    const members = e?.members;
    if (members !== undefined) {
      const rank = members.findIndex((m) => m.slot === this.access.slot);
      this.access.reshape(
        0,
        rank,
        members.map((m) => m.slot),
      );
    }
    for (const i of this.early.splice(0)) this.input(i);
  }

  get changed(): boolean {
    return this.machine?.changed ?? false;
  }

  get stateless(): boolean {
    return this.machine?.stateless ?? true;
  }

  get viewId(): number {
    return this.machine?.viewId ?? -1;
  }

  get inChange(): boolean {
    return this.machine?.inChange ?? false;
  }

  get version(): number {
    return this.machine?.progress ?? 0;
  }

  onControl(msg: CoordinatorToRank): void {
    switch (msg.t) {
      case "elastic-view":
        this.input({
          kind: "view",
          news: {
            id: msg.view,
            members: msg.members.map((m) => ({ slot: m.slot, attempt: m.attempt })),
            leaving: msg.leaving.map((m) => ({ slot: m.slot, attempt: m.attempt })),
            rollback: msg.rollback,
            at: msg.at,
          },
        });
        return;
      case "elastic-decision":
        this.input({ kind: "decision", decision: { view: msg.view, target: msg.target, root: msg.root, joiners: msg.joiners } });
        return;
      case "release":
        // A rank that came to join and never got its state, or that left the world, has nothing to finalize: it just ends.
        if (this.machine === undefined || this.machine.stateless || this.left) this.access.retire();
        return;
      default:
        return;
    }
  }

  onProtocol(header: Header, body: unknown): void {
    if (header.tag < PROTO_ELASTIC_BASE || header.tag > TAG_LAST) return;
    const frame = body as ProtoFrame;
    if (frame.t === "state") {
      const state = asBuffer(frame.state);
      const global = asBuffer(frame.global);
      const boot = (frame.boot ?? []).map(([k, v]) => [k, asBuffer(v)!] as [string, Buffer]);
      this.input({ kind: "frame", from: header.source, attempt: header.attempt, frame: { ...frame, state: state ?? null, global: global ?? null, boot } });
      return;
    }
    this.input({ kind: "frame", from: header.source, attempt: header.attempt, frame });
  }

  arrive(header: Header, frame: RawFrame): boolean {
    const m = this.machine;
    if (m === undefined) return true;
    switch (m.classify(header.source, header.attempt, header.epoch)) {
      case "accept":
        return true;
      case "hold":
        this.held.push({ header, frame });
        if (this.held.length > HELD_MAX) this.held.shift();
        return false;
      case "drop":
        return false;
    }
  }

  checkpoint(state: Buffer, global: Buffer): Promise<void> {
    const d = deferred<void>();
    this.ckpt = d;
    this.input({ kind: "checkpoint", ckpt: { state, global } });
    return d.promise;
  }

  restore(): Promise<ElasticRestored> {
    const d = deferred<ElasticRestored>();
    this.restoring = d;
    this.input({ kind: "restore" });
    return d.promise;
  }

  bootstrap(key: string): Promise<Buffer | undefined> {
    const d = deferred<Buffer | undefined>();
    this.booting = d;
    this.input({ kind: "boot", key });
    return d.promise;
  }

  booted(key: string, result: Buffer): void {
    this.input({ kind: "booted", key, result });
  }

  close(): void {
    this.closed = true;
  }

  // ---- the machine --------------------------------------------------------------------------

  private input(i: ElasticInput): void {
    if (this.closed) return;
    if (this.machine === undefined) {
      this.early.push(i);
      return;
    }
    this.queue.push(i);
    if (this.stepping) return;
    this.stepping = true;
    try {
      for (let next = this.queue.shift(); next !== undefined; next = this.queue.shift()) {
        for (const e of this.machine.step(next)) this.perform(e);
      }
    } finally {
      this.stepping = false;
    }
  }

  private perform(e: ElasticEffect): void {
    const a = this.access;
    switch (e.kind) {
      case "send": {
        // The links drop a frame longer than the job's limit; a joiner would wait for its state
        // for ever. The job stops instead, saying what to raise.
        const f = e.frame;
        const bytes =
          f.t === "state" ? (f.state?.byteLength ?? 0) + (f.global?.byteLength ?? 0) + f.boot.reduce((n, [k, v]) => n + k.length + v.byteLength, 0) : 0;
        if (bytes + STATE_FRAME_SLACK_BYTES > a.maxMessageBytes) {
          a.fatal(
            "MPI_LIMIT",
            `the checkpoint a joining rank needs (${bytes} bytes of state, global and bootstrap results) is longer than the job's limit of ${a.maxMessageBytes} bytes (--max-message); raise the limit, or keep less in checkpoint()`,
          );
          return;
        }
        a.sendProtocol(e.to, TAG[e.frame.t], e.frame);
        return;
      }
      case "summary":
        a.sendControl({ t: "elastic-summary", rank: a.slot, view: e.view, ...e.summary });
        return;
      case "report":
        a.sendControl({ t: "elastic-switched", rank: a.slot, view: e.view, at: e.at });
        return;
      case "interrupt":
        a.interrupt();
        return;
      case "reshape": {
        a.reshape(
          e.view,
          e.rank,
          e.members.map((m) => m.slot),
        );
        // Frames of the world entered now go to the (fresh) collective runner; older ones are void.
        const held = this.held;
        this.held = [];
        for (const h of held) {
          if (h.header.epoch === e.view) a.inject(h.frame);
          else if (h.header.epoch > e.view) this.held.push(h);
        }
        return;
      }
      case "checkpointed":
        this.ckpt?.resolve();
        this.ckpt = undefined;
        return;
      case "checkpoint-changed":
        this.ckpt?.reject(worldChanged("checkpoint()"));
        this.ckpt = undefined;
        return;
      case "restored":
        this.restoring?.resolve({ state: e.ckpt.state, global: e.ckpt.global, version: e.version });
        this.restoring = undefined;
        return;
      case "boot-run":
        this.booting?.resolve(undefined);
        this.booting = undefined;
        return;
      case "boot-answer":
        this.booting?.resolve(e.result);
        this.booting = undefined;
        return;
      case "drop":
        if (e.ckpt.state !== undefined) a.recycle(e.ckpt.state);
        if (e.ckpt.global !== undefined) a.recycle(e.ckpt.global);
        return;
      case "retire":
        if (e.now) a.retire();
        else this.left = true;
        return;
      case "fail": {
        const err = new LifelineError(e.code, e.message);
        for (const d of [this.ckpt, this.restoring, this.booting]) d?.reject(err);
        a.fatal(e.code, e.message);
        return;
      }
      default: {
        const never: never = e;
        void never;
      }
    }
  }
}
