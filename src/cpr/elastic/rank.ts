/**
 * One rank of an elastic job as a pure state machine: `step(input) → effects`. No await, no
 * clock, no socket: the driver (driver.ts) binds it to a World, the simulator runs the same.
 *
 * What it keeps:
 * - its **world**: the id of the coordinator's view it runs in, the members in rank order and
 *   the checkpoint version the world started from; none while it joins and has no state yet;
 * - its **checkpoints**: every checkpoint() is one (encoded copies, so the program may change
 *   its objects), kept from `committed` — the smallest version it knows every member of its
 *   world reached — up to its own newest. Each checkpoint() tells the other members it was
 *   reached (a `reached` frame) and returns once every member reached the one before, so a
 *   rank is never more than one checkpoint ahead of the slowest and keeps at most three;
 * - the **bootstrap results** of the job, which a joiner receives with its state.
 *
 * A change of the world (decide.ts has the agreement and its correctness argument):
 * 1. news of the next world arrives: the rank sends its summary to the coordinator. If a
 *    member is gone (`rollback`), the rank stops at once: running collectives, a checkpoint()
 *    waiting for the others and a finalize() waiting for the release end with
 *    MPI_WORLD_CHANGED, and every call but restore() is refused until the change is done. If
 *    not (ranks join), the rank runs on, but waits at its next checkpoint() for the decision;
 * 2. the decision arrives (target T, root, joiners). A rollback switches at once: the rank
 *    keeps only checkpoint T and becomes a rank of the new world, and restore() returns T. A
 *    grow switches when the rank reaches checkpoint T: that checkpoint() rejects with
 *    MPI_WORLD_CHANGED, and restore() then returns T. Either way the root sends T, the
 *    lineage and the bootstrap results to every joiner, which becomes a member on receipt;
 * 3. a rank that leaves the world (a replayed change) stops at T, and its process ends at the
 *    release (until then, the frames it sent last may still be on their way).
 *
 * `rank` and `size` change only there: at a switch, which happens at a checkpoint location —
 * T is a checkpoint version, and the program learns of it by MPI_WORLD_CHANGED from the call
 * it is in (or by restore() returning with the new world, for a change at the start).
 *
 * @example
 * const m = new ElasticRank({ slot: 1, attempt: 0, members: [{ slot: 0, attempt: 0 }, { slot: 1, attempt: 0 }], plan: [] });
 * m.step({ kind: "restore" }); // [{ kind: "restored", ckpt: { state: undefined, global: undefined }, version: 0 }]
 */
import type { Checkpoint, Decision, ElasticEffect, ElasticInput, Member, ProtoFrame, Summary, ViewNews } from "./types.ts";

/** Frames for worlds or lineages this rank does not know yet are kept at most this many. */
export const HELD_MAX = 4096;

const NOTHING: Checkpoint = { state: undefined, global: undefined };

export interface ElasticRankOptions {
  readonly slot: number;
  readonly attempt: number;
  /** The world this rank starts in (members in rank order); undefined: it joins a running job. */
  readonly members: readonly Member[] | undefined;
  /** Checkpoint versions at which a replayed change of the world is due. */
  readonly plan: readonly number[];
}

/** The world a rank runs in. */
interface World {
  readonly id: number;
  readonly members: readonly Member[];
  readonly start: number;
}

/** A decision this rank applies, with the news it decides. */
interface Settled {
  readonly news: ViewNews;
  readonly decision: Decision;
}

interface Held {
  readonly from: number;
  readonly attempt: number;
  readonly frame: ProtoFrame;
}

type Call = { readonly kind: "checkpoint" } | { readonly kind: "restore" } | { readonly kind: "boot"; readonly key: string };

/** What a collective frame from a peer is to this rank: delivered, kept for a later world, or void. */
export type Arrival = "accept" | "hold" | "drop";

export class ElasticRank {
  readonly slot: number;
  readonly attempt: number;
  private world: World | undefined;
  /** The id of the last world that rolled back (0 at the start); `reached` frames carry it. */
  private lineage = 0;
  /** The newest checkpoint version reached (entered checkpoint() with). */
  private version = 0;
  private readonly retained = new Map<number, Checkpoint>();
  /** Checkpoints sent to a peer: a socket may still read them, so their memory is never reused. */
  private readonly sentOut = new WeakSet<Checkpoint>();
  /** Per member slot, the newest version it reached in this lineage, as far as this rank knows. */
  private readonly reachedBy = new Map<number, number>();
  private boot = new Map<string, Buffer>();
  private started = false;
  /** A change reached the program (interrupted or switched), and restore() was not called since. */
  private changedValue = false;
  /** The newest news answered, and its decision once it came. */
  private news: ViewNews | undefined;
  private decided = true;
  /** The checkpoint version this rank had reached when it answered the newest news. */
  private answeredAt = 0;
  /** A rollback news answered and not decided yet: the rank stands still. */
  private stopped = false;
  /** Grow decisions to switch at when their checkpoint is reached, in order. */
  private switches: Settled[] = [];
  /** A decision in which this rank lacks the target checkpoint: it waits for the root's state. */
  private awaiting: Settled | undefined;
  private readonly plan: number[];
  private held: Held[] = [];
  private call: Call | undefined;
  private over = false;
  private out: ElasticEffect[] = [];

  constructor(opts: ElasticRankOptions) {
    this.slot = opts.slot;
    this.attempt = opts.attempt;
    this.plan = [...opts.plan];
    if (opts.members !== undefined) {
      this.world = { id: 0, members: opts.members, start: 0 };
      this.retained.set(0, NOTHING);
      for (const m of opts.members) this.reachedBy.set(m.slot, 0);
    }
  }

  /** Calls other than restore() are refused (MPI_WORLD_CHANGED) until the program calls restore(). */
  get changed(): boolean {
    return this.changedValue;
  }

  /** The world this rank runs in (-1: none yet, it joins). */
  get viewId(): number {
    return this.world?.id ?? -1;
  }

  /** A change is under way (news answered and not applied here yet): ranks may be at different points. */
  get inChange(): boolean {
    return !this.decided || this.stopped || this.awaiting !== undefined || this.switches.length > 0;
  }

  /** No state yet: a rank that joins a running job, before the root's state arrived. */
  get stateless(): boolean {
    return this.world === undefined;
  }

  /** The newest checkpoint version reached. */
  get progress(): number {
    return this.version;
  }

  /** The rank ended (retired or failed). */
  get ended(): boolean {
    return this.over;
  }

  /** What a collective frame of world `epoch` from `source` (incarnation `attempt`) is to this rank. */
  classify(source: number, attempt: number, epoch: number): Arrival {
    const w = this.world;
    if (w === undefined || epoch > w.id) return "hold";
    if (epoch < w.id) return "drop";
    return w.members.some((m) => m.slot === source && m.attempt === attempt) ? "accept" : "drop";
  }

  step(input: ElasticInput): ElasticEffect[] {
    this.out = [];
    if (!this.over) {
      switch (input.kind) {
        case "view":
          this.onNews(input.news);
          break;
        case "decision":
          this.onDecision(input.decision);
          break;
        case "frame":
          this.onFrame(input.from, input.attempt, input.frame);
          break;
        case "checkpoint":
          this.onCheckpoint(input.ckpt);
          break;
        case "restore":
          this.started = true;
          this.call = { kind: "restore" };
          this.evalRestore();
          break;
        case "boot":
          this.onBoot(input.key);
          break;
        case "booted":
          this.boot.set(input.key, input.result);
          break;
        default: {
          const never: never = input;
          void never;
        }
      }
    }
    const out = this.out;
    this.out = [];
    return out;
  }

  // ---- a change of the world ------------------------------------------------------------------

  private onNews(news: ViewNews): void {
    if (this.news !== undefined && news.id <= this.news.id) return;
    const me = [...news.members, ...news.leaving].find((m) => m.slot === this.slot);
    if (me === undefined || me.attempt !== this.attempt) {
      // Not in it: this incarnation was declared gone (and is being replaced or left out).
      this.end({ kind: "retire", now: true });
      return;
    }
    this.news = news;
    this.decided = false;
    this.answeredAt = this.version;
    // A decision this rank waited on as a joiner is superseded: its summary says it holds nothing.
    this.awaiting = undefined;
    if (news.rollback && this.world !== undefined) {
      this.stopped = true;
      this.changedValue = true;
      this.emit({ kind: "interrupt" });
      if (this.call?.kind === "checkpoint") {
        this.call = undefined;
        this.emit({ kind: "checkpoint-changed" });
      }
    }
    const summary: Summary = {
      hasState: this.world !== undefined,
      reached: this.version,
      oldest: this.world === undefined ? this.version : Math.min(...this.retained.keys()),
      started: this.started,
    };
    this.emit({ kind: "summary", view: news.id, summary });
  }

  private onDecision(d: Decision): void {
    const news = this.news;
    // The coordinator decides only the newest news it sent, and the decision comes before any later news.
    if (news === undefined || d.view !== news.id || this.decided) return;
    this.decided = true;
    const settled: Settled = { news, decision: d };
    const lacks = d.joiners.includes(this.slot);
    if (news.rollback) {
      this.stopped = false;
      this.switches = [];
      if (lacks) {
        // A member that joined after the target checkpoint: it takes the root's, like a joiner.
        this.dropState();
        this.awaiting = settled;
      } else if (this.world !== undefined) {
        this.switchTo(settled);
      }
    } else if (lacks || this.world === undefined) {
      this.awaiting = settled;
    } else {
      this.switches.push(settled);
      // A rank already at the target (blocked in checkpoint(), or in restore() at the start) switches now.
      if (this.call?.kind === "checkpoint") this.evalCheckpoint();
      else if (this.call?.kind === "restore") this.evalRestore();
    }
    this.replayHeld();
  }

  /** Becomes a rank of the decided world at its target checkpoint, which this rank holds. */
  private switchTo(s: Settled): void {
    const { news, decision: d } = s;
    this.switches = this.switches.filter((x) => x !== s);
    const ckpt = this.retained.get(d.target);
    if (ckpt === undefined) {
      this.end({
        kind: "fail",
        code: "CPR_PROTOCOL",
        message: `elastic: world ${news.id} starts from checkpoint ${d.target}, which rank slot ${this.slot} does not hold`,
      });
      return;
    }
    if (news.leaving.some((m) => m.slot === this.slot)) {
      if (d.root === this.slot) this.sendState(news, d, ckpt);
      this.end({ kind: "retire", now: false });
      return;
    }
    if (news.rollback) {
      this.lineage = news.id;
      this.forgetAll(d.target);
      this.reachedBy.clear();
    }
    for (const m of news.leaving) this.reachedBy.delete(m.slot);
    for (const m of news.members) if (news.rollback || d.joiners.includes(m.slot)) this.reachedBy.set(m.slot, d.target);
    this.version = d.target;
    this.enter(news, d.target);
    if (d.root === this.slot) this.sendState(news, d, ckpt);
    this.changedValue = true;
    this.replayHeld();
    if (this.call?.kind === "checkpoint") {
      this.call = undefined;
      this.emit({ kind: "checkpoint-changed" });
    } else if (this.call?.kind === "restore") {
      this.evalRestore();
    }
  }

  /** The root sends the checkpoint the world starts from to every member that lacks it. */
  private sendState(news: ViewNews, d: Decision, ckpt: Checkpoint): void {
    if (d.joiners.length > 0) this.sentOut.add(ckpt);
    for (const j of d.joiners) {
      this.send(j, {
        t: "state",
        view: news.id,
        lineage: this.lineage,
        version: d.target,
        state: ckpt.state ?? null,
        global: ckpt.global ?? null,
        boot: [...this.boot],
      });
    }
  }

  /** The root's state arrived: this rank becomes a member of the decided world. */
  private adopt(s: Settled, f: Extract<ProtoFrame, { t: "state" }>): void {
    this.awaiting = undefined;
    this.lineage = f.lineage;
    this.version = f.version;
    this.forgetAll(undefined);
    this.retained.set(f.version, { state: f.state ?? undefined, global: f.global ?? undefined });
    this.reachedBy.clear();
    for (const m of s.news.members) this.reachedBy.set(m.slot, f.version);
    this.boot = new Map(f.boot);
    this.enter(s.news, f.version);
    this.replayHeld();
    if (this.call?.kind === "restore") this.evalRestore();
    else if (this.call?.kind === "boot") this.onBoot(this.call.key);
  }

  /** This rank runs in world `news` from checkpoint `at` on. */
  private enter(news: ViewNews, at: number): void {
    this.world = { id: news.id, members: news.members, start: at };
    const i = this.plan.indexOf(at);
    if (i >= 0) this.plan.splice(i, 1);
    const rank = news.members.findIndex((m) => m.slot === this.slot);
    this.emit({ kind: "reshape", view: news.id, rank, members: news.members });
    this.emit({ kind: "report", view: news.id, at });
  }

  private dropState(): void {
    this.world = undefined;
    this.forgetAll(undefined);
    this.reachedBy.clear();
  }

  /** Drops every kept checkpoint but version `keep`. */
  private forgetAll(keep: number | undefined): void {
    for (const v of [...this.retained.keys()]) if (v !== keep) this.forget(v);
  }

  private forget(v: number): void {
    const c = this.retained.get(v);
    this.retained.delete(v);
    if (c !== undefined && c !== NOTHING && !this.sentOut.has(c)) this.emit({ kind: "drop", ckpt: c });
  }

  // ---- frames from peers ------------------------------------------------------------------------

  private onFrame(from: number, attempt: number, f: ProtoFrame): void {
    if (f.t === "state") {
      const s = this.awaiting;
      if (s !== undefined && f.view === s.news.id) {
        if (from === s.decision.root) this.adopt(s, f);
        return;
      }
      // Ahead of the decision (it comes from the coordinator, the state from the root): keep it.
      if (this.news === undefined || f.view > this.news.id || (f.view === this.news.id && !this.decided)) this.hold({ from, attempt, frame: f });
      return;
    }
    const w = this.world;
    const member = w?.members.find((m) => m.slot === from);
    if (w === undefined || member === undefined || f.lineage > this.lineage) {
      // A member of a world or lineage this rank has not entered yet.
      this.hold({ from, attempt, frame: f });
      return;
    }
    if (member.attempt !== attempt || f.lineage < this.lineage) return;
    if (f.version > (this.reachedBy.get(from) ?? w.start)) this.reachedBy.set(from, f.version);
    if (this.call?.kind === "checkpoint") this.evalCheckpoint();
  }

  private hold(h: Held): void {
    this.held.push(h);
    if (this.held.length > HELD_MAX) this.held.shift();
  }

  private replayHeld(): void {
    const held = this.held;
    this.held = [];
    for (const h of held) if (!this.over) this.onFrame(h.from, h.attempt, h.frame);
  }

  // ---- the program's calls ----------------------------------------------------------------------

  private onCheckpoint(ckpt: Checkpoint): void {
    const w = this.world;
    if (w === undefined) {
      this.end({ kind: "fail", code: "CPR_CHECKPOINT", message: "elastic: checkpoint() before restore() in a rank that joins the job" });
      return;
    }
    this.version++;
    this.retained.set(this.version, ckpt);
    this.reachedBy.set(this.slot, this.version);
    for (const m of w.members) if (m.slot !== this.slot) this.send(m.slot, { t: "reached", lineage: this.lineage, version: this.version });
    this.call = { kind: "checkpoint" };
    this.evalCheckpoint();
  }

  /** A checkpoint() call goes on: switch here, wait (decision, replayed change, slower members) or return. */
  private evalCheckpoint(): void {
    const w = this.world;
    if (this.call?.kind !== "checkpoint" || w === undefined || this.stopped) return;
    const next = this.switches[0];
    if (next !== undefined && next.decision.target === this.version) {
      this.switchTo(next);
      return;
    }
    // A grow news answered at an earlier checkpoint: the change may be due here (its target is
    // later than every answer), so wait for the decision.
    if (!this.decided && this.version > this.answeredAt) return;
    if (this.plan.includes(this.version)) return;
    let committed = this.version;
    for (const m of w.members) committed = Math.min(committed, this.reachedBy.get(m.slot) ?? w.start);
    // Never needed again: a rollback target is at least `committed` (decide.ts).
    for (const v of [...this.retained.keys()]) if (v < committed) this.forget(v);
    if (committed >= this.version - 1) {
      this.call = undefined;
      this.emit({ kind: "checkpointed" });
    }
  }

  private evalRestore(): void {
    if (this.call?.kind !== "restore" || this.world === undefined || this.stopped) return;
    const next = this.switches[0];
    if (next !== undefined && next.decision.target === this.version) {
      this.switchTo(next); // a replayed change at the start: restore() returns into the new world
      return;
    }
    if (this.version === 0 && this.plan.includes(0)) return;
    this.call = undefined;
    this.changedValue = false;
    this.emit({ kind: "restored", ckpt: this.retained.get(this.version) ?? NOTHING, version: this.version });
  }

  private onBoot(key: string): void {
    const cached = this.boot.get(key);
    if (cached !== undefined) {
      this.call = undefined;
      this.emit({ kind: "boot-answer", key, result: cached });
      return;
    }
    if (this.world === undefined) {
      this.call = { kind: "boot", key };
      return;
    }
    if (this.call?.kind === "boot") {
      // A joiner's bootstrap call that the job's ranks never made.
      this.end({
        kind: "fail",
        code: "MPI_BOOTSTRAP",
        message: `elastic: bootstrap key ${JSON.stringify(key)} was not run by the job's ranks, so a rank that joins cannot be answered it; run the same bootstrap collectives on every rank`,
      });
      return;
    }
    this.emit({ kind: "boot-run", key });
  }

  // ---- effects -----------------------------------------------------------------------------------

  private send(to: number, frame: ProtoFrame): void {
    this.emit({ kind: "send", to, frame });
  }

  private emit(e: ElasticEffect): void {
    this.out.push(e);
  }

  private end(e: Extract<ElasticEffect, { kind: "retire" | "fail" }>): void {
    this.over = true;
    this.emit(e);
  }
}
