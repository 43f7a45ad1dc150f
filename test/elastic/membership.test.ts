/**
 * Goal: the coordinator's machine of elastic jobs — which the real coordinator and the
 * simulator both run — forms the first world of `-n` slots, takes spare and restarted slots in
 * one change at a time, rolls the world back when a member dies (waiting below --min-np, then
 * giving up), settles every change in one round (a death in it voids it), releases the world
 * whose members all finalized in it, and replays recorded changes; and the recorder turns its
 * events into the changes a replay takes.
 *
 * Method: the pure machines fed inputs by hand (time is a number); each test reads the effects.
 */
import { describe, expect, it } from "vitest";
import type { Member } from "../../src/cpr/elastic/types.ts";
import { ChangeRecorder, type ElasticEvent, ElasticMembership, type ElasticMembershipOptions } from "../../src/launch/elastic-membership.ts";
import type { CoordinatorEvent, MembershipEffect } from "../../src/launch/membership.ts";
import { encodeValue } from "../../src/mpi/codec.ts";
import { controlIdentity as id, type CoordinatorToRank, heartbeatIdentity, type RankToCoordinator } from "../../src/mpi/control.ts";

function machine(opts: Partial<ElasticMembershipOptions> = {}): ElasticMembership {
  const m = new ElasticMembership({
    slots: 4,
    initial: 3,
    minNp: 2,
    maxNp: 4,
    waitMs: 1000,
    channelKeys: new Uint32Array(16).fill(42),
    identity: id,
    heartbeatIdentity,
    ...opts,
  });
  m.step({ kind: "start", nowMs: 0 });
  return m;
}

const hello = (slot: number, attempt = 0, slots = 4): RankToCoordinator => ({
  t: "hello",
  rank: slot,
  attempt,
  pid: 100 + slot,
  endpoint: `tcp://h:${slot}.${attempt}`,
  size: slots,
});

function from(m: ElasticMembership, msg: RankToCoordinator): MembershipEffect[] {
  const attempt = "attempt" in msg ? msg.attempt : m.link(msg.rank).attempt;
  return m.step({ kind: "message", identity: id(msg.rank, attempt), msg });
}

const sends = (effects: readonly MembershipEffect[]): { to: string; msg: CoordinatorToRank }[] =>
  effects.flatMap((e) => (e.kind === "send" ? [{ to: e.to, msg: e.msg }] : []));
const events = (effects: readonly MembershipEffect[]): CoordinatorEvent[] => effects.flatMap((e) => (e.kind === "event" ? [e.event] : []));
const elastic = (effects: readonly MembershipEffect[]): ElasticEvent[] => events(effects).flatMap((e) => (e.kind === "elastic" ? [e.detail] : []));
const news = (effects: readonly MembershipEffect[]) => sends(effects).flatMap((s) => (s.msg.t === "elastic-view" ? [{ to: s.to, msg: s.msg }] : []));

/** Every participant of the newest news answers; returns the effects of the last answer. */
function answer(m: ElasticMembership, view: number, who: { slot: number; reached: number; hasState?: boolean; attempt?: number }[]): MembershipEffect[] {
  let out: MembershipEffect[] = [];
  for (const w of who) {
    out = m.step({
      kind: "message",
      identity: id(w.slot, w.attempt ?? 0),
      msg: { t: "elastic-summary", rank: w.slot, view, hasState: w.hasState ?? true, reached: w.reached, oldest: Math.max(0, w.reached - 1), started: true },
    });
  }
  return out;
}

const switched = (m: ElasticMembership, slot: number, view: number, at: number, attempt = 0): MembershipEffect[] =>
  m.step({ kind: "message", identity: id(slot, attempt), msg: { t: "elastic-switched", rank: slot, view, at } });
const finalize = (m: ElasticMembership, slot: number, result: unknown, attempt = 0): MembershipEffect[] =>
  m.step({ kind: "message", identity: id(slot, attempt), msg: { t: "finalize", rank: slot, result: encodeValue(result) } });

/** Slots 0..2 up: the first world runs; slot 3 (a spare) has not said hello. */
function running(opts: Partial<ElasticMembershipOptions> = {}): ElasticMembership {
  const m = machine(opts);
  for (let s = 0; s < 3; s++) from(m, hello(s));
  expect(m.phase).toBe("running");
  return m;
}

describe("elastic membership", () => {
  it("the first world is slots 0..n-1: their tables name it; a spare that says hello gets a table without it and a change that adds it", () => {
    const m = machine();
    const all = [...from(m, hello(3)), ...from(m, hello(1)), ...from(m, hello(0))];
    expect(sends(all)).toEqual([]); // slot 2 is missing, and the spare does not count
    const up = from(m, hello(2));
    const tables = sends(up).filter((s) => s.msg.t === "table");
    expect(tables.map((t) => t.to)).toEqual([id(0, 0), id(1, 0), id(2, 0), id(3, 0)]);
    const first = [0, 1, 2].map((s) => ({ slot: s, attempt: 0, endpoint: `tcp://h:${s}.0` }));
    expect(tables[0]!.msg).toMatchObject({ t: "table", elastic: { members: first, plan: [] } });
    expect((tables[3]!.msg as Extract<CoordinatorToRank, { t: "table" }>).elastic).toEqual({ plan: [] });
    // The spare is taken in at once: a grow news to all four.
    const n = news(up);
    expect(n.map((x) => x.to)).toEqual([0, 1, 2, 3].map((s) => id(s, 0)));
    expect(n[0]!.msg).toMatchObject({ view: 1, rollback: false, leaving: [] });
    expect(n[0]!.msg.members.map((x) => x.slot)).toEqual([0, 1, 2, 3]);
  });

  it("a member dies: the others roll back, without it; the decision goes to every participant", () => {
    const m = running();
    const down = m.step({ kind: "rank-down", rank: 1, attempt: 0, nowMs: 10 });
    const n = news(down);
    expect(n.map((x) => x.to)).toEqual([id(0, 0), id(2, 0)]);
    expect(n[0]!.msg).toMatchObject({ view: 1, rollback: true });
    const decided = answer(m, 1, [
      { slot: 0, reached: 7 },
      { slot: 2, reached: 6 },
    ]);
    expect(sends(decided)).toEqual([0, 2].map((s) => ({ to: id(s, 0), msg: { t: "elastic-decision", view: 1, target: 6, root: 0, joiners: [] } })));
    expect(elastic(decided)).toEqual([
      {
        kind: "decided",
        view: 1,
        members: [
          { slot: 0, attempt: 0 },
          { slot: 2, attempt: 0 },
        ],
        leaving: [],
        rollback: true,
        target: 6,
        joiners: [],
      },
    ]);
    expect(elastic(switched(m, 2, 1, 6))).toEqual([{ kind: "switched", view: 1, at: 6 }]);
    expect(elastic(switched(m, 0, 1, 6))).toEqual([]); // reported once
  });

  it("a restarted slot joins once every member entered the last world, appended to it", () => {
    const m = running();
    m.step({ kind: "rank-down", rank: 1, attempt: 0, nowMs: 10 });
    answer(m, 1, [
      { slot: 0, reached: 3 },
      { slot: 2, reached: 3 },
    ]);
    m.step({ kind: "restart-rank", rank: 1, attempt: 1 });
    const back = from(m, hello(1, 1));
    expect(sends(back).map((s) => s.msg.t)).toEqual(["table"]); // no change while world 1 is being entered
    switched(m, 0, 1, 3);
    const grow = news(switched(m, 2, 1, 3));
    expect(grow[0]!.msg).toMatchObject({ view: 2, rollback: false });
    expect(grow[0]!.msg.members).toEqual([
      { slot: 0, attempt: 0, endpoint: "tcp://h:0.0" },
      { slot: 2, attempt: 0, endpoint: "tcp://h:2.0" },
      { slot: 1, attempt: 1, endpoint: "tcp://h:1.1" },
    ]);
    const d = answer(m, 2, [
      { slot: 0, reached: 5 },
      { slot: 2, reached: 4 },
      { slot: 1, reached: 0, hasState: false, attempt: 1 },
    ]);
    expect(sends(d)[0]!.msg).toEqual({ t: "elastic-decision", view: 2, target: 6, root: 0, joiners: [1] });
  });

  it("a participant dying in a round voids it: the next news supersedes it (and rolls back)", () => {
    const m = running({ minNp: 1 });
    m.step({ kind: "rank-down", rank: 2, attempt: 0, nowMs: 5 });
    answer(m, 1, [{ slot: 0, reached: 2 }]);
    const again = m.step({ kind: "rank-down", rank: 1, attempt: 0, nowMs: 6 });
    expect(news(again)[0]!.msg).toMatchObject({ view: 2, rollback: true, members: [{ slot: 0, attempt: 0, endpoint: "tcp://h:0.0" }] });
    // Answers to the void round change nothing.
    expect(sends(answer(m, 1, [{ slot: 1, reached: 2 }]))).toEqual([]);
    expect(sends(answer(m, 2, [{ slot: 0, reached: 2 }]))[0]!.msg).toMatchObject({ t: "elastic-decision", view: 2, target: 2 });
  });

  it("below --min-np: waits --elastic-timeout for ranks to join, then reports too-few; a rank joining in time rescues it", () => {
    const m = running({ minNp: 3 });
    const down = m.step({ kind: "rank-down", rank: 0, attempt: 0, nowMs: 100 });
    expect(news(down)).toEqual([]);
    expect(elastic(down)).toEqual([{ kind: "waiting", left: 2, minNp: 3, waitMs: 1000 }]);
    expect(m.rendezvousDeadlineMs).toBe(1100);
    expect(elastic(m.step({ kind: "tick", nowMs: 1099 }))).toEqual([]);
    expect(elastic(m.step({ kind: "tick", nowMs: 1100 }))).toEqual([{ kind: "too-few", left: 2, minNp: 3, waitedMs: 1000 }]);

    const saved = running({ minNp: 3 });
    saved.step({ kind: "rank-down", rank: 0, attempt: 0, nowMs: 100 });
    const spare = from(saved, hello(3));
    expect(news(spare)[0]!.msg).toMatchObject({ view: 1, rollback: true });
    expect(news(spare)[0]!.msg.members.map((x) => x.slot)).toEqual([1, 2, 3]);
    expect(saved.rendezvousDeadlineMs).toBeUndefined();
  });

  it("releases the world whose members all finalized in it, with their results in rank order; a finalize of a world rolled back since does not count", () => {
    const m = running({ minNp: 1 });
    finalize(m, 0, "a");
    finalize(m, 2, "c");
    m.step({ kind: "rank-down", rank: 1, attempt: 0, nowMs: 5 });
    expect(events(finalize(m, 1, "late"))).toEqual([]); // a dead incarnation's
    answer(m, 1, [
      { slot: 0, reached: 9 },
      { slot: 2, reached: 9 },
    ]);
    switched(m, 0, 1, 9);
    switched(m, 2, 1, 9);
    expect(events(finalize(m, 2, "c2"))).toEqual([]);
    const done = finalize(m, 0, "a2");
    expect(events(done).map((e) => e.kind)).toEqual(["finalized", "finalized", "elastic", "released"]);
    expect(elastic(done)).toEqual([{ kind: "released", view: 1, members: [0, 2] }]);
    expect(m.link(0).result).toBe("a2");
    expect(sends(done).map((s) => s.msg.t)).toEqual(["release", "release"]);
    // A process that says hello after the release is told to end.
    m.step({ kind: "restart-rank", rank: 1, attempt: 1 });
    expect(sends(from(m, hello(1, 1)))).toEqual([{ to: id(1, 1), msg: { t: "release" } }]);
  });

  it("a world whose members all finalized before a grow took effect is released: the grow is moot", () => {
    const m = running();
    from(m, hello(3)); // a grow news (world 1) goes out
    answer(m, 1, [
      { slot: 0, reached: 20 },
      { slot: 1, reached: 20 },
      { slot: 2, reached: 20 },
      { slot: 3, reached: 0, hasState: false },
    ]);
    finalize(m, 0, 1);
    finalize(m, 1, 1);
    expect(elastic(finalize(m, 2, 1))).toEqual([{ kind: "released", view: 0, members: [0, 1, 2] }]);
  });

  it("a replay: the recorded changes in order, each once its joiners are up and the one before is entered; the first ranks' tables list their checkpoints", () => {
    const plan = [
      { at: 3, size: 3, keep: [0, 2], joined: 1 },
      { at: 8, size: 3, keep: [0, 1, 2], joined: 0 },
    ];
    const m = machine({ plan });
    for (let s = 0; s < 3; s++) from(m, hello(s));
    const up = from(m, hello(3)); // the joiner the first change needs
    const table = sends(up).find((x) => x.msg.t === "table")!.msg as Extract<CoordinatorToRank, { t: "table" }>;
    expect(table.elastic).toEqual({ plan: [3, 8] });
    const first = news(up);
    expect(first.map((x) => x.to)).toEqual([0, 2, 3, 1].map((s) => id(s, 0)));
    expect(first[0]!.msg).toMatchObject({ view: 1, rollback: false, at: 3, leaving: [{ slot: 1, attempt: 0, endpoint: "tcp://h:1.0" }] });
    expect(first[0]!.msg.members.map((x) => x.slot)).toEqual([0, 2, 3]);
    const d = answer(m, 1, [
      { slot: 0, reached: 2 },
      { slot: 2, reached: 3 },
      { slot: 3, reached: 0, hasState: false },
      { slot: 1, reached: 3 },
    ]);
    expect(sends(d)[0]!.msg).toEqual({ t: "elastic-decision", view: 1, target: 3, root: 0, joiners: [3] });
    switched(m, 0, 1, 3);
    switched(m, 2, 1, 3);
    const second = news(switched(m, 3, 1, 3));
    expect(second[0]!.msg).toMatchObject({ view: 2, at: 8, leaving: [] });
    expect(second[0]!.msg.members.map((x) => x.slot)).toEqual([0, 2, 3]);
  });

  it("a replay that does not fit the job is reported", () => {
    const m = machine({ plan: [{ at: 2, size: 5, keep: [0], joined: 0 }] });
    let out: MembershipEffect[] = [];
    for (let s = 0; s < 3; s++) out = from(m, hello(s));
    expect(elastic(out)).toEqual([{ kind: "failed", code: "LAUNCH_USAGE", message: expect.stringMatching(/for a world of 5 ranks, but the world has 3/) }]);
  });

  it("refuses malformed elastic messages with a warning", () => {
    const m = running();
    const out = m.step({ kind: "message", identity: id(0, 0), msg: { t: "elastic-summary", rank: 0, view: -1 } as unknown as RankToCoordinator });
    expect(events(out)).toEqual([{ kind: "warning", message: expect.stringMatching(/elastic-summary needs view/) }]);
  });
});

describe("change recorder", () => {
  const w = (...slots: number[]): Member[] => slots.map((s) => ({ slot: s, attempt: 0 }));
  const decided = (view: number, members: Member[], rollback = false): ElasticEvent => ({
    kind: "decided",
    view,
    members,
    leaving: [],
    rollback,
    target: 0,
    joiners: [],
  });

  it("records each world entered, at its checkpoint, relative to the one before", () => {
    const r = new ChangeRecorder(w(0, 1, 2, 3));
    r.add(decided(1, w(0, 2, 3), true));
    r.add({ kind: "switched", view: 1, at: 19 });
    r.add(decided(2, [...w(0, 2, 3), { slot: 1, attempt: 1 }]));
    r.add({ kind: "switched", view: 2, at: 40 });
    expect(r.changes()).toEqual([
      { at: 19, size: 4, keep: [0, 2, 3], joined: 0 },
      { at: 40, size: 3, keep: [0, 1, 2], joined: 1 },
    ]);
  });

  it("drops a world a rollback to an earlier checkpoint undid, and composes worlds entered at one checkpoint", () => {
    const r = new ChangeRecorder(w(0, 1, 2));
    r.add(decided(1, w(0, 1, 2, 3)));
    r.add({ kind: "switched", view: 1, at: 10 }); // grow at 10 ...
    r.add(decided(2, w(0, 2, 3), true));
    r.add({ kind: "switched", view: 2, at: 9 }); // ... undone: slot 1 died before everyone reached 10
    r.add(decided(3, w(0, 2), true));
    r.add({ kind: "switched", view: 3, at: 9 });
    expect(r.timeline().map((t) => t.at)).toEqual([0, 9, 9]);
    expect(r.changes()).toEqual([{ at: 9, size: 3, keep: [0, 2], joined: 0 }]);
  });
});
