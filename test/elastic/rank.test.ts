/**
 * Goal: one elastic rank, as a pure machine, does what the protocol says (src/cpr/elastic/rank.ts):
 * checkpoints return once every member reached the one before and are kept only while a
 * rollback may need them; a member that is gone stops the rank at once and the decision puts
 * it into the new world at the target checkpoint (restore() returns it, the root sends it to
 * joiners); ranks join at a checkpoint, not before the decision; a joiner gets its state and the
 * bootstrap results; a rank not in the news, or leaving in a replay, ends. Method: ElasticRank
 * fed inputs by hand, its effects checked.
 */
import { describe, expect, it } from "vitest";
import { ElasticRank } from "../../src/cpr/elastic/rank.ts";
import type { Checkpoint, ElasticEffect, Member, ProtoFrame } from "../../src/cpr/elastic/types.ts";

const m = (slot: number, attempt = 0): Member => ({ slot, attempt });
const ck = (n: number): Checkpoint => ({ state: Buffer.from([n]), global: Buffer.from([100 + n]) });
const kinds = (effects: ElasticEffect[]): string[] => effects.map((e) => e.kind);
const reached = (version: number, lineage = 0): ProtoFrame => ({ t: "reached", lineage, version });

/** A member of the world of slots 0..n-1. */
function member(slot: number, n = 3, plan: number[] = []): ElasticRank {
  const r = new ElasticRank({ slot, attempt: 0, members: Array.from({ length: n }, (_, s) => m(s)), plan });
  expect(r.step({ kind: "restore" })).toEqual([{ kind: "restored", ckpt: { state: undefined, global: undefined }, version: 0 }]);
  return r;
}

/** Checkpoints 1..v, with every peer reaching each first. */
function advance(r: ElasticRank, v: number, peers: number[]): void {
  for (let i = 1; i <= v; i++) {
    for (const p of peers) r.step({ kind: "frame", from: p, attempt: 0, frame: reached(i) });
    expect(kinds(r.step({ kind: "checkpoint", ckpt: ck(i) }))).toContain("checkpointed");
  }
}

describe("ElasticRank", () => {
  it("checkpoint(v) tells the others and returns once every member reached v-1", () => {
    const r = member(0);
    const first = r.step({ kind: "checkpoint", ckpt: ck(1) });
    expect(first).toEqual([{ kind: "send", to: 1, frame: reached(1) }, { kind: "send", to: 2, frame: reached(1) }, { kind: "checkpointed" }]);
    expect(kinds(r.step({ kind: "checkpoint", ckpt: ck(2) }))).toEqual(["send", "send"]); // waits: nobody else reached 1
    expect(r.step({ kind: "frame", from: 1, attempt: 0, frame: reached(1) })).toEqual([]);
    expect(r.step({ kind: "frame", from: 2, attempt: 0, frame: reached(1) })).toEqual([{ kind: "checkpointed" }]);
    // A dead incarnation's frame and one of an older lineage do not count.
    expect(r.step({ kind: "frame", from: 1, attempt: 3, frame: reached(9) })).toEqual([]);
  });

  it("a member gone: stops at once (interrupt, a waiting checkpoint fails), answers the coordinator, and restores the target on the decision", () => {
    const r = member(0);
    advance(r, 1, [1, 2]);
    expect(kinds(r.step({ kind: "checkpoint", ckpt: ck(2) }))).toContain("checkpointed");
    expect(kinds(r.step({ kind: "checkpoint", ckpt: ck(3) }))).toEqual(["send", "send"]); // blocked: 1 and 2 at 1
    const news = r.step({ kind: "view", news: { id: 1, members: [m(0), m(2), m(3, 1)], leaving: [], rollback: true } });
    expect(news).toEqual([
      { kind: "interrupt" },
      { kind: "checkpoint-changed" },
      { kind: "summary", view: 1, summary: { hasState: true, reached: 3, oldest: 1, started: true } },
    ]);
    expect(r.changed).toBe(true);
    expect(r.step({ kind: "restore" })).toEqual([]); // until the decision
    const d = r.step({ kind: "decision", decision: { view: 1, target: 2, root: 0, joiners: [3] } });
    // Only checkpoint 2 is kept: 1 and 3 (of a lineage undone) go back to the memory pool.
    expect(d.filter((e) => e.kind === "drop")).toEqual([
      { kind: "drop", ckpt: ck(1) },
      { kind: "drop", ckpt: ck(3) },
    ]);
    expect(d.filter((e) => e.kind !== "drop")).toEqual([
      { kind: "reshape", view: 1, rank: 0, members: [m(0), m(2), m(3, 1)] },
      { kind: "report", view: 1, at: 2 },
      { kind: "send", to: 3, frame: { t: "state", view: 1, lineage: 1, version: 2, state: ck(2).state, global: ck(2).global, boot: [] } },
      { kind: "restored", ckpt: ck(2), version: 2 },
    ]);
    expect(r.changed).toBe(false);
    // The new world is a new lineage: checkpoint 3 again, counted among its members only.
    expect(kinds(r.step({ kind: "checkpoint", ckpt: ck(3) }))).toEqual(["send", "send", "checkpointed"]);
    expect(r.step({ kind: "frame", from: 2, attempt: 0, frame: reached(3, 0) })).toEqual([]); // the old lineage's: void
  });

  it("a checkpoint no rollback can need any more is dropped (its memory reused), unless it was sent to a joiner", () => {
    const r = member(0, 2);
    const c1 = ck(1);
    r.step({ kind: "checkpoint", ckpt: c1 });
    r.step({ kind: "frame", from: 1, attempt: 0, frame: reached(1) });
    expect(r.step({ kind: "checkpoint", ckpt: ck(2) })).not.toContainEqual({ kind: "drop", ckpt: c1 }); // slot 1 may still be at 1
    r.step({ kind: "frame", from: 1, attempt: 0, frame: reached(2) });
    expect(r.step({ kind: "checkpoint", ckpt: ck(3) })).toContainEqual({ kind: "drop", ckpt: c1 });
    // Sent to a joiner as the state of a new world: a socket may still read it; never reused.
    r.step({ kind: "view", news: { id: 1, members: [m(0), m(1), m(2)], leaving: [], rollback: true } });
    const sent = r.step({ kind: "decision", decision: { view: 1, target: 2, root: 0, joiners: [2] } });
    expect(kinds(sent)).toContain("send");
    r.step({ kind: "restore" });
    expect(kinds(r.step({ kind: "checkpoint", ckpt: ck(3) }))).toContain("checkpointed");
    r.step({ kind: "view", news: { id: 2, members: [m(0), m(1)], leaving: [], rollback: true } });
    const again = r.step({ kind: "decision", decision: { view: 2, target: 3, root: 0, joiners: [] } });
    expect(kinds(again)).toEqual(["reshape", "report"]); // checkpoint 2 goes, but it was sent: not reused
  });

  it("ranks join: the rank runs on, waits at its next checkpoint for the decision, and changes world at the target", () => {
    const r = member(1);
    advance(r, 1, [0, 2]);
    expect(kinds(r.step({ kind: "view", news: { id: 1, members: [m(0), m(1), m(2), m(3)], leaving: [], rollback: false } }))).toEqual(["summary"]);
    expect(r.changed).toBe(false);
    expect(kinds(r.step({ kind: "checkpoint", ckpt: ck(2) }))).toEqual(["send", "send"]); // the change may be due here
    // Not here: checkpoint 2 returns (the others reached 1), and the world changes at 3.
    expect(r.step({ kind: "decision", decision: { view: 1, target: 3, root: 0, joiners: [3] } })).toEqual([{ kind: "checkpointed" }]);
    r.step({ kind: "frame", from: 0, attempt: 0, frame: reached(2) });
    r.step({ kind: "frame", from: 2, attempt: 0, frame: reached(2) });
    const at3 = r.step({ kind: "checkpoint", ckpt: ck(3) });
    expect(kinds(at3)).toEqual(["send", "send", "reshape", "report", "checkpoint-changed"]);
    expect(at3).toContainEqual({ kind: "reshape", view: 1, rank: 1, members: [m(0), m(1), m(2), m(3)] });
    expect(r.step({ kind: "restore" })).toEqual([{ kind: "restored", ckpt: ck(3), version: 3 }]);
  });

  it("a rank that joins: stateless until the root's state comes; bootstrap calls and restore() are answered from it", () => {
    const j = new ElasticRank({ slot: 3, attempt: 1, members: undefined, plan: [] });
    expect(j.stateless).toBe(true);
    expect(j.classify(0, 0, 1)).toBe("hold");
    expect(j.step({ kind: "boot", key: "seed" })).toEqual([]); // waits for the state
    j.step({ kind: "view", news: { id: 1, members: [m(0), m(1), m(3, 1)], leaving: [], rollback: false } });
    const state: ProtoFrame = { t: "state", view: 1, lineage: 0, version: 4, state: ck(4).state!, global: ck(4).global!, boot: [["seed", Buffer.from([42])]] };
    // Ahead of the decision (it came through the coordinator): kept until it is there.
    expect(j.step({ kind: "frame", from: 0, attempt: 0, frame: state })).toEqual([]);
    const got = j.step({ kind: "decision", decision: { view: 1, target: 4, root: 0, joiners: [3] } });
    expect(got).toEqual([
      { kind: "reshape", view: 1, rank: 2, members: [m(0), m(1), m(3, 1)] },
      { kind: "report", view: 1, at: 4 },
      { kind: "boot-answer", key: "seed", result: Buffer.from([42]) },
    ]);
    expect(j.step({ kind: "restore" })).toEqual([{ kind: "restored", ckpt: ck(4), version: 4 }]);
    expect(j.classify(0, 0, 1)).toBe("accept");
    expect(j.classify(0, 0, 0)).toBe("drop");
    expect(j.classify(2, 0, 1)).toBe("drop"); // not a member
  });

  it("a joiner whose program runs a bootstrap collective the job never ran: a clear error", () => {
    const j = new ElasticRank({ slot: 2, attempt: 0, members: undefined, plan: [] });
    j.step({ kind: "view", news: { id: 1, members: [m(0), m(2)], leaving: [], rollback: false } });
    j.step({ kind: "decision", decision: { view: 1, target: 1, root: 0, joiners: [2] } });
    j.step({ kind: "boot", key: "other" });
    const out = j.step({ kind: "frame", from: 0, attempt: 0, frame: { t: "state", view: 1, lineage: 0, version: 1, state: null, global: null, boot: [] } });
    expect(out.at(-1)).toEqual({ kind: "fail", code: "MPI_BOOTSTRAP", message: expect.stringMatching(/bootstrap key "other" was not run by the job's ranks/) });
  });

  it("news without this incarnation ends it at once; leaving in a replayed change ends it at the release, after sending the state as root", () => {
    const gone = member(2);
    expect(gone.step({ kind: "view", news: { id: 1, members: [m(0), m(1)], leaving: [], rollback: true } })).toEqual([{ kind: "retire", now: true }]);
    const leaving = member(0, 2, [1]);
    leaving.step({ kind: "view", news: { id: 1, members: [m(1), m(5)], leaving: [m(0)], rollback: false, at: 1 } });
    leaving.step({ kind: "decision", decision: { view: 1, target: 1, root: 0, joiners: [1, 5] } });
    leaving.step({ kind: "frame", from: 1, attempt: 0, frame: reached(1) });
    const out = leaving.step({ kind: "checkpoint", ckpt: ck(1) });
    expect(kinds(out)).toEqual(["send", "send", "send", "retire"]);
    expect(out.at(-1)).toEqual({ kind: "retire", now: false });
    expect(leaving.ended).toBe(true);
  });

  it("a replayed change at the start: restore() waits for it and returns into the new world", () => {
    const r = new ElasticRank({ slot: 1, attempt: 0, members: [m(0), m(1)], plan: [0] });
    expect(r.step({ kind: "restore" })).toEqual([]);
    r.step({ kind: "view", news: { id: 1, members: [m(1), m(2)], leaving: [m(0)], rollback: false, at: 0 } });
    const out = r.step({ kind: "decision", decision: { view: 1, target: 0, root: 1, joiners: [2] } });
    expect(kinds(out)).toEqual(["reshape", "report", "send", "restored"]);
    expect(out).toContainEqual({ kind: "reshape", view: 1, rank: 0, members: [m(1), m(2)] });
  });

  it("a replayed change later on: the rank waits at that checkpoint until the change is decided", () => {
    const r = member(0, 2, [2]);
    advance(r, 1, [1]);
    r.step({ kind: "frame", from: 1, attempt: 0, frame: reached(2) });
    expect(kinds(r.step({ kind: "checkpoint", ckpt: ck(2) }))).toEqual(["send"]); // held at 2
    r.step({ kind: "view", news: { id: 1, members: [m(0), m(1), m(2)], leaving: [], rollback: false, at: 2 } });
    expect(kinds(r.step({ kind: "decision", decision: { view: 1, target: 2, root: 0, joiners: [2] } }))).toEqual([
      "reshape",
      "report",
      "send",
      "checkpoint-changed",
    ]);
  });

  it("a superseded round: a decision that is not for the newest news is ignored", () => {
    const r = member(0);
    r.step({ kind: "view", news: { id: 1, members: [m(0), m(1)], leaving: [], rollback: true } });
    r.step({ kind: "view", news: { id: 2, members: [m(0)], leaving: [], rollback: true } });
    expect(r.step({ kind: "decision", decision: { view: 1, target: 0, root: 0, joiners: [] } })).toEqual([]);
    expect(kinds(r.step({ kind: "decision", decision: { view: 2, target: 0, root: 0, joiners: [] } }))).toEqual(["reshape", "report"]);
  });
});
