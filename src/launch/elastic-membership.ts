/**
 * The coordinator's machine for `--mode elastic` jobs: {@link Membership} — whose checks of
 * every message, hellos, heartbeats and leases it keeps — with the job's worlds on top: who is
 * in the world, when it changes, and the round that settles each change. Same inputs, effects
 * and read-outs, so the Coordinator and the simulator drive either.
 *
 * Slots and worlds. The job has `slots` rank processes at most (`--max-np`; `LIFELINE_RANK` is
 * a process's slot); the first world is slots 0..initial-1 (`-n`), formed once they all said
 * hello. A world is a list of slots in rank order. It changes:
 * - when a member dies (`rank-down`): the next world keeps the others in their order and takes
 *   the ranks ready to join (up to `maxNp`), and its members roll back (`rollback`) — as long
 *   as at least `minNp` are there; below that the machine waits for ranks to join for `waitMs`,
 *   then reports `too-few` (the supervisor stops the job);
 * - when ranks are ready to join (a slot's new process said hello) and nobody is gone: the next
 *   world appends them, and the members switch at a checkpoint without going back;
 * - in a replay (`plan`), exactly as recorded: at checkpoint `at`, keep these ranks, take so
 *   many joiners.
 *
 * A change is one round: the news (`elastic-view`) to every participant, each one's summary
 * back (`elastic-summary`), then the decision (src/cpr/elastic/decide.ts) to all of them
 * (`elastic-decision`). A participant that dies in a round voids it: the next news supersedes
 * it, and as nobody applied anything of it, every rank's state stays consistent (decide.ts has
 * the argument). Joins wait until every member of the last decided world reported that it
 * entered it (`elastic-switched`), so a grow round finds every rank in one world.
 *
 * The job is released when every member of a world finalized in that world (a member's
 * finalize counts in the world it last reported) and no later world rolls back; its results
 * are those members', in rank order. A finalize of a world that a later rollback supersedes
 * does not count: the rollback's news sends its ranks round their loop again, to finalize again.
 *
 * @example
 * const m = new ElasticMembership({ slots: 5, initial: 4, minNp: 2, maxNp: 5, waitMs: 30_000, channelKeys, identity, heartbeatIdentity });
 * m.step({ kind: "start", nowMs: 0 }); // then feed hellos; a rank-down starts a round
 */
import assert from "node:assert/strict";
import type { LifelineErrorCode } from "../errors.ts";
import { decide } from "../cpr/elastic/decide.ts";
import type { Member, Summary, ViewNews } from "../cpr/elastic/types.ts";
import type { CoordinatorToRank, ElasticMember, RankToCoordinator } from "../mpi/control.ts";
import { Membership, type MembershipOptions, type RankLink, type TableMessage } from "./membership.ts";

/** One change of a recorded run, as a replay takes it: at checkpoint `at`, the world of `size` ranks keeps ranks `keep` (in order) and takes `joined` new ones. */
export interface PlannedChange {
  readonly at: number;
  readonly size: number;
  readonly keep: readonly number[];
  readonly joined: number;
}

/** What the elastic machine reports to its owner, besides the coordinator's usual events. */
export type ElasticEvent =
  /** World `view` was decided: it starts from checkpoint `target` (`joiners` get it from its rank 0). */
  | {
      kind: "decided";
      view: number;
      members: Member[];
      leaving: Member[];
      rollback: boolean;
      target: number;
      joiners: number[];
    }
  /** The first member entered world `view`, at checkpoint `at`. */
  | { kind: "switched"; view: number; at: number }
  /** A member is gone and fewer than `minNp` ranks are left: waiting up to `waitMs` for ranks to join. */
  | { kind: "waiting"; left: number; minNp: number; waitMs: number }
  /** Still fewer than `minNp` ranks after waiting `waitedMs`: the job cannot go on. */
  | { kind: "too-few"; left: number; minNp: number; waitedMs: number }
  /** A round found that the job cannot go on (e.g. nobody holding state is left). */
  | { kind: "failed"; code: LifelineErrorCode; message: string }
  /** Every member of world `view` finalized in it: the job is released with their results, `members` in rank order. */
  | { kind: "released"; view: number; members: number[] };

/** A {@link Membership}'s options (its `size` is `slots`; it makes its own tables) and the job's elastic limits. */
export interface ElasticMembershipOptions extends Omit<MembershipOptions, "size" | "tableFor" | "prepareTables"> {
  /** Rank processes at most (`LIFELINE_SIZE`); every slot's process says hello with this size. */
  readonly slots: number;
  /** The first world: slots 0..initial-1. */
  readonly initial: number;
  readonly minNp: number;
  readonly maxNp: number;
  /** How long to wait for ranks when fewer than `minNp` are left (`--elastic-timeout`). */
  readonly waitMs: number;
  /** A replay: exactly these changes, in order (no others). */
  readonly plan?: readonly PlannedChange[] | undefined;
}

interface Round {
  readonly news: ViewNews;
  readonly summaries: Map<number, Summary>;
}

interface DecidedWorld {
  readonly members: readonly number[];
  readonly leaving: readonly number[];
}

export class ElasticMembership extends Membership {
  /** The last world sent out (decided, or in its round), without its members that died since: the base of the next one. */
  private world: number[];
  private helloed = 0;
  private lastView = 0;
  private pending: Round | undefined;
  /** Decided worlds (and the first one, 0), by id. */
  private readonly decided = new Map<number, DecidedWorld>();
  /** The last decided world, and its members that have not reported entering it yet. */
  private unswitched: { view: number; slots: Set<number> } = { view: 0, slots: new Set() };
  /** A member of the last world is gone: the next world rolls back. */
  private lost = false;
  /**
   * The newest world that rolls back (as sent out): finalizes in worlds before it do not
   * count, since its news sends their ranks round their loop again.
   */
  private rollbackFloor = 0;
  /** Slots up and ready to join, in the order they said hello. */
  private ready: number[] = [];
  private readonly dead = new Set<number>();
  /** Each slot's world as it last reported (the first world's members: 0). */
  private readonly effective = new Map<number, number>();
  /** The world each slot finalized in, and its result. */
  private readonly finalizedIn = new Map<number, number>();
  private readonly results = new Map<number, unknown>();
  private readonly switchedViews = new Set<number>();
  private waitingSince: number | undefined;
  private waitDeadline: number | undefined;
  private nowMs = 0;
  private planIndex = 0;

  constructor(private readonly elastic: ElasticMembershipOptions) {
    // The table's elastic part needs this machine, which exists only once super() returned.
    const self: { m?: ElasticMembership } = {};
    super({ ...elastic, size: elastic.slots, tableFor: (slot) => self.m!.tableExtras(slot), prepareTables: false });
    self.m = this;
    assert(elastic.initial >= 1 && elastic.initial <= elastic.slots, "the first world must fit the slots");
    this.world = Array.from({ length: elastic.initial }, (_, s) => s);
    this.decided.set(0, { members: [...this.world], leaving: [] });
  }

  /** The next deadline to tick at: the rendezvous's, or the wait for ranks below `minNp`. */
  override get rendezvousDeadlineMs(): number | undefined {
    return super.rendezvousDeadlineMs ?? (this.phase === "running" ? this.waitDeadline : undefined);
  }

  /** Slots of the first world that have not said hello yet. */
  override missingRanks(): number[] {
    return super.missingRanks().filter((s) => s < this.elastic.initial);
  }

  // ---- processes coming and going --------------------------------------------------------------

  protected override admit(identity: string, msg: Extract<RankToCoordinator, { t: "hello" }>): void {
    const slot = msg.rank;
    if (this.phaseValue === "released") {
      // Came to join a job that is over: it has nothing to do but end.
      this.linkUp(identity, msg);
      this.send(slot, { t: "release" }, true);
      return;
    }
    if (this.phaseValue !== "rendezvous" && this.phaseValue !== "running") {
      this.warn(`ignored hello from rank ${slot} (${this.phaseValue})`);
      return;
    }
    this.linkUp(identity, msg);
    if (this.phaseValue === "rendezvous" && slot < this.elastic.initial) {
      this.helloed++;
      if (this.helloed === this.elastic.initial) this.onWorldUp();
      return;
    }
    this.ready.push(slot);
    if (this.phaseValue === "running") {
      this.send(slot, this.tableOf(slot, this.endpointsNow()));
      this.reconsider();
    }
  }

  /** The first world is up: its members get their tables, and ranks waiting to join theirs. */
  private onWorldUp(): void {
    this.deadlineMs = undefined;
    this.phaseValue = "running";
    for (const s of this.world) this.effective.set(s, 0);
    const fields = this.endpointsNow();
    for (const s of [...this.world, ...this.ready]) this.send(s, this.tableOf(s, fields));
    this.emit({ kind: "ready", endpoints: fields.endpoints });
    this.reconsider();
  }

  private endpointsNow(): Pick<TableMessage, "endpoints" | "attempts" | "curveKeys"> {
    return {
      endpoints: this.linksValue.map((l) => (l.up ? (l.endpoint ?? "") : "")),
      attempts: this.linksValue.map((l) => l.attempt),
      ...this.curveKeys(),
    };
  }

  /** A slot's table: the first world (for its members) and the replayed changes still due. */
  private tableExtras(slot: number): Partial<TableMessage> {
    const first = this.phaseValue === "running" && this.world.includes(slot) && this.lastView === 0;
    const members = first ? this.world.map((s) => this.member(s)) : undefined;
    return { elastic: { ...(members === undefined ? {} : { members }), plan: (this.elastic.plan ?? []).slice(this.planIndex).map((p) => p.at) } };
  }

  private member(s: number): ElasticMember {
    const l = this.linksValue[s]!;
    return { slot: s, attempt: l.attempt, endpoint: l.endpoint ?? "", ...(l.curveKey === undefined ? {} : { curveKey: l.curveKey }) };
  }

  protected override rankDown(slot: number, attempt: number, nowMs?: number): void {
    if (nowMs !== undefined) this.nowMs = nowMs;
    const link = this.linksValue[slot]!;
    if (link.attempt !== attempt || (this.phaseValue !== "running" && this.phaseValue !== "rendezvous")) return;
    link.up = false;
    this.byIdentity.delete(link.identity);
    this.gone.add(link.identity);
    this.gone.add(this.elastic.heartbeatIdentity(slot, attempt));
    this.dead.add(slot);
    this.ready = this.ready.filter((s) => s !== slot);
    this.unswitched.slots.delete(slot);
    if (this.phaseValue !== "running") return;
    if (this.world.includes(slot)) {
      this.lost = true;
      this.world = this.world.filter((s) => s !== slot);
    }
    // A participant of the round in progress is gone: nobody applied anything of it; the next news supersedes it.
    const r = this.pending;
    if (r !== undefined && [...r.news.members, ...r.news.leaving].some((m) => m.slot === slot)) this.pending = undefined;
    this.reconsider();
  }

  protected override restartRank(slot: number, attempt: number): void {
    const link = this.linksValue[slot]!;
    this.byIdentity.delete(link.identity);
    // Died before the first world formed: the new incarnation's hello counts in the rendezvous instead.
    if (this.phaseValue === "rendezvous" && link.up && slot < this.elastic.initial) this.helloed--;
    Object.assign(link, this.incarnation(slot, attempt));
    this.dead.delete(slot);
    // A new process: what the slot's last one reported is not its.
    this.effective.delete(slot);
    this.finalizedIn.delete(slot);
  }

  protected override onTick(nowMs: number): void {
    super.onTick(nowMs);
    this.nowMs = nowMs;
    if (this.waitDeadline !== undefined && nowMs >= this.waitDeadline && this.phaseValue === "running") {
      this.waitDeadline = undefined;
      this.elasticEvent({
        kind: "too-few",
        left: this.world.length + this.ready.length,
        minNp: this.elastic.minNp,
        waitedMs: nowMs - (this.waitingSince ?? nowMs),
      });
    }
  }

  // ---- changes of the world ------------------------------------------------------------------------

  /** Starts the next change if one is due and none is under way. */
  private reconsider(): void {
    if (this.phaseValue !== "running" || this.pending !== undefined) return;
    if (this.elastic.plan !== undefined) {
      this.nextPlanned();
      return;
    }
    const left = this.world;
    if (this.lost) {
      const members = [...left, ...this.ready].slice(0, this.elastic.maxNp);
      if (members.length < this.elastic.minNp) {
        if (this.waitingSince === undefined) {
          this.waitingSince = this.nowMs;
          this.waitDeadline = this.nowMs + this.elastic.waitMs;
          this.elasticEvent({ kind: "waiting", left: members.length, minNp: this.elastic.minNp, waitMs: this.elastic.waitMs });
        }
        return;
      }
      this.issue(members, [], true, undefined);
      return;
    }
    // Joins one change at a time, once every member entered the last world (see the file comment).
    if (this.unswitched.slots.size > 0 || this.ready.length === 0 || left.length >= this.elastic.maxNp) return;
    this.issue([...left, ...this.ready].slice(0, this.elastic.maxNp), [], false, undefined);
  }

  /** A replay: the next recorded change, once its joiners are up and the change before is entered. */
  private nextPlanned(): void {
    const plan = this.elastic.plan!;
    const p = plan[this.planIndex];
    if (p === undefined || this.unswitched.slots.size > 0 || this.ready.length < p.joined) return;
    if (p.size !== this.world.length || p.keep.some((r) => r >= this.world.length)) {
      this.elasticEvent({
        kind: "failed",
        code: "LAUNCH_USAGE",
        message: `the replayed change at checkpoint ${p.at} is for a world of ${p.size} ranks, but the world has ${this.world.length}: the recorded changes do not fit this job`,
      });
      return;
    }
    this.planIndex++;
    const members = [...p.keep.map((r) => this.world[r]!), ...this.ready.slice(0, p.joined)];
    this.issue(
      members,
      this.world.filter((s) => !members.includes(s)),
      false,
      p.at,
    );
  }

  private issue(members: readonly number[], leaving: readonly number[], rollback: boolean, at: number | undefined): void {
    const id = ++this.lastView;
    const bare = (s: number): Member => ({ slot: s, attempt: this.linksValue[s]!.attempt });
    const news: ViewNews = { id, members: members.map(bare), leaving: leaving.map(bare), rollback, ...(at === undefined ? {} : { at }) };
    this.pending = { news, summaries: new Map() };
    if (rollback) this.rollbackFloor = id;
    this.world = [...members];
    this.ready = this.ready.filter((s) => !members.includes(s));
    this.waitingSince = this.waitDeadline = undefined;
    const msg: CoordinatorToRank = {
      t: "elastic-view",
      view: id,
      members: members.map((s) => this.member(s)),
      leaving: leaving.map((s) => this.member(s)),
      rollback,
      ...(at === undefined ? {} : { at }),
    };
    for (const s of [...members, ...leaving]) this.send(s, msg, true);
  }

  protected override onElastic(slot: number, msg: Extract<RankToCoordinator, { t: `elastic-${string}` }>): void {
    if (msg.t === "elastic-switched") {
      this.onSwitched(slot, msg.view, msg.at);
      return;
    }
    const r = this.pending;
    if (r === undefined || msg.view !== r.news.id) return; // of a superseded round
    if (![...r.news.members, ...r.news.leaving].some((m) => m.slot === slot)) return;
    r.summaries.set(slot, { hasState: msg.hasState, reached: msg.reached, oldest: msg.oldest, started: msg.started });
    if (r.summaries.size < r.news.members.length + r.news.leaving.length) return;
    this.pending = undefined;
    const d = decide(r.news, r.summaries);
    if ("fail" in d) {
      this.elasticEvent({ kind: "failed", code: d.fail.code, message: d.fail.message });
      return;
    }
    const members = r.news.members.map((m) => m.slot);
    const leaving = r.news.leaving.map((m) => m.slot);
    this.decided.set(d.view, { members, leaving });
    if (r.news.rollback) this.lost = false;
    this.unswitched = { view: d.view, slots: new Set(members) };
    const decision: CoordinatorToRank = { t: "elastic-decision", view: d.view, target: d.target, root: d.root, joiners: [...d.joiners] };
    for (const s of [...members, ...leaving]) this.send(s, decision, true);
    this.elasticEvent({
      kind: "decided",
      view: d.view,
      members: [...r.news.members],
      leaving: [...r.news.leaving],
      rollback: r.news.rollback,
      target: d.target,
      joiners: [...d.joiners],
    });
    this.reconsider();
  }

  private onSwitched(slot: number, view: number, at: number): void {
    this.effective.set(slot, view);
    if (!this.switchedViews.has(view)) {
      this.switchedViews.add(view);
      this.elasticEvent({ kind: "switched", view, at });
    }
    if (view === this.unswitched.view) this.unswitched.slots.delete(slot);
    this.reconsider();
  }

  // ---- the end ------------------------------------------------------------------------------------

  protected override onResult(slot: number, _link: RankLink, result: unknown): void {
    const view = this.effective.get(slot);
    if (view === undefined || this.phaseValue !== "running") return;
    this.finalizedIn.set(slot, view);
    this.results.set(slot, result);
    const world = this.decided.get(view);
    if (world === undefined || view < this.rollbackFloor) return;
    if (!world.members.every((s) => this.linksValue[s]!.up && this.finalizedIn.get(s) === view)) return;
    this.phaseValue = "released";
    this.waitDeadline = undefined;
    for (const s of world.members) {
      const link = this.linksValue[s]!;
      link.finalized = true;
      link.result = this.results.get(s);
      this.emit({ kind: "finalized", rank: s, result: link.result });
    }
    this.elasticEvent({ kind: "released", view, members: [...world.members] });
    this.linksValue.forEach((l, s) => {
      if (l.up) this.send(s, { t: "release" }, true);
    });
    this.emit({ kind: "released" });
  }

  private elasticEvent(detail: ElasticEvent): void {
    this.emit({ kind: "elastic", detail });
  }
}

/**
 * The changes of the world a run went through, as a replay takes them ({@link PlannedChange}),
 * from the machine's events: each decided world that a member entered, at the checkpoint it
 * entered it. A world that a rollback to an earlier checkpoint undid never happened for the
 * program (its steps were redone), so it drops out; worlds entered at one checkpoint are
 * composed into one change. A rank is a process: a slot started again is a new rank.
 *
 * @example
 * const rec = new ChangeRecorder([{ slot: 0, attempt: 0 }, { slot: 1, attempt: 0 }]);
 * rec.add(event); // every ElasticEvent
 * rec.changes(); // [{ at: 12, size: 2, keep: [0], joined: 0 }]
 */
export class ChangeRecorder {
  private readonly worlds = new Map<number, readonly Member[]>();
  private readonly starts = new Map<number, number>();

  constructor(first: readonly Member[]) {
    this.worlds.set(0, first);
    this.starts.set(0, 0);
  }

  add(ev: ElasticEvent): void {
    if (ev.kind === "decided") this.worlds.set(ev.view, ev.members);
    else if (ev.kind === "switched" && !this.starts.has(ev.view)) this.starts.set(ev.view, ev.at);
  }

  /** The worlds the program ran in, in order, each with the checkpoint it started from. */
  timeline(): { members: readonly Member[]; at: number }[] {
    const out: { members: readonly Member[]; at: number }[] = [];
    for (const id of [...this.starts.keys()].sort((a, b) => a - b)) {
      const at = this.starts.get(id)!;
      const members = this.worlds.get(id);
      if (members === undefined) continue;
      while (out.length > 1 && out[out.length - 1]!.at > at) out.pop();
      out.push({ members, at });
    }
    return out;
  }

  changes(): PlannedChange[] {
    const t = this.timeline();
    const out: PlannedChange[] = [];
    const same = (a: Member, b: Member): boolean => a.slot === b.slot && a.attempt === b.attempt;
    for (let i = 1; i < t.length; i++) {
      // Worlds entered at one checkpoint: only the last one computed from there.
      if (i + 1 < t.length && t[i + 1]!.at === t[i]!.at) continue;
      let j = i - 1;
      while (j > 0 && t[j]!.at === t[i]!.at) j--;
      const from = t[j]!.members;
      const to = t[i]!.members;
      const keep = to.flatMap((m) => {
        const r = from.findIndex((f) => same(f, m));
        return r < 0 ? [] : [r];
      });
      out.push({ at: t[i]!.at, size: from.length, keep, joined: to.length - keep.length });
    }
    return out;
  }
}
