/**
 * Goal: one rank machine's rules, seen through its effects: the failure-free path sends no
 * agreement traffic; a checkpoint is the rank's own and is safe once its successors hold it
 * and every rank has done the collectives before it; determinants close the gate until every
 * successor holds them; lazy checkpoints are materialized only when a copy is needed; program
 * misuse and dead peers fail with clear codes; frames of dead incarnations or old views never
 * mix in. Method: drive machines by hand; a tiny synchronous router where several are needed.
 */
import { describe, expect, it } from "vitest";
import { RetryOneRank } from "../../src/cpr/retry-one/rank.ts";
import type { CollIdentity, Lazy, ProtoFrame, RankEffect, RankInput } from "../../src/cpr/retry-one/types.ts";
import { emptySummary } from "./summaries.ts";

const sum: CollIdentity = { op: "allreduce:sum", root: -1, type: "Float64Array", length: 2 };
const val = (value: unknown): Lazy => ({ kind: "value", value });
const ckpt = (state: unknown, size: number, key: string | null = "g"): RankInput => ({
  kind: "checkpoint",
  state: val(state),
  global: val(key),
  key,
  consumed: new Array<number>(size).fill(0),
});

function machines(size: number, replicas = 1): RetryOneRank[] {
  const attempts = new Array<number>(size).fill(0);
  return Array.from({ length: size }, (_, rank) => new RetryOneRank({ rank, size, attempt: 0, attempts, replicas, failureTimeoutMs: 1000 }));
}

/** Steps `input` on rank `r` and routes every protocol frame until quiet; collects non-send effects per rank. */
function route(ms: RetryOneRank[], r: number, input: RankInput, seen: RankEffect[][], sent?: ProtoFrame[]): void {
  const queue: { to: number; input: RankInput }[] = [{ to: r, input }];
  while (queue.length > 0) {
    const { to, input: i } = queue.shift()!;
    for (const e of ms[to]!.step(i)) {
      if (e.kind === "send") {
        sent?.push(e.frame);
        queue.push({ to: e.to, input: { kind: "frame", from: to, attempt: ms[to]!.attempt, frame: e.frame } });
      } else seen[to]!.push(e);
    }
  }
}

const kinds = (es: readonly RankEffect[]): string[] => es.map((e) => e.kind);
/** Every rank runs one collective with result `result` (the wire is not modelled here). */
function collectiveAll(ms: RetryOneRank[], seen: RankEffect[][], result: unknown, ranks = ms.map((_, r) => r)): void {
  for (const r of ranks) route(ms, r, { kind: "collective", ident: sum }, seen);
  for (const r of ranks) route(ms, r, { kind: "executed", result }, seen);
}

describe("RetryOneRank: failure-free path", () => {
  it("a collective runs straight on the wire with no agreement frames, and its result is buffered", () => {
    const [m] = machines(3);
    expect(m!.step({ kind: "collective", ident: sum })).toEqual([{ kind: "execute", ident: sum, wireSeq: 0, viewId: 0, purgeBelow: 0 }]);
    expect(m!.step({ kind: "executed", result: [1, 2], bytes: 16 })).toEqual([{ kind: "complete", result: [1, 2], replayed: false }]);
    expect(m!.progress).toEqual({ version: 0, seqno: 1, index: 1 });
    expect(m!.buffered.entries).toBe(1);
    expect(m!.step({ kind: "collective", ident: sum })[0]).toMatchObject({ kind: "execute", wireSeq: 1 });
  });

  it("a checkpoint is the rank's own: safe once its successor holds it and every rank did the collectives before it", () => {
    const ms = machines(3, 1);
    const seen: RankEffect[][] = [[], [], []];
    const sent: ProtoFrame[] = [];
    collectiveAll(ms, seen, [0, 0], [0, 1]); // rank 2 has not done collective #0 yet
    seen.forEach((s) => (s.length = 0));
    route(ms, 0, ckpt("s0", 3), seen, sent);
    // Its successor (rank 1) holds it, but rank 2 has not done collective #0: not safe yet.
    // The replica is also rank 0's ask to rank 1 (which answers `done`); rank 2 gets an ask.
    expect(sent.map((f) => f.t)).toEqual(["replica", "ask", "rack", "done"]);
    expect(seen[0]).toEqual([]);
    // Rank 2 does the collective: it tells rank 0, whose checkpoint is safe; the others need not checkpoint.
    collectiveAll(ms, seen, [0, 0], [2]);
    expect(seen[0]).toEqual([{ kind: "checkpointed", version: 1 }]);
    expect(ms[0]!.progress).toEqual({ version: 1, seqno: 0, index: 1 });
    // `stored` to every peer: each learns that rank 0 consumed nothing of theirs.
    expect(seen[1]).toContainEqual({ kind: "peer-safe", rank: 0, consumed: 0 });
    expect(seen[2]).toContainEqual({ kind: "peer-safe", rank: 0, consumed: 0 });
  });

  it("an ask, or a replica, says its sender has done the collectives: checkpoints at the same index send no done", () => {
    // Crossing asks: every rank checkpoints before any frame is delivered.
    const ms = machines(3, 1);
    const seen: RankEffect[][] = [[], [], []];
    collectiveAll(ms, seen, [0, 0]);
    const inFlight: { from: number; to: number; frame: ProtoFrame }[] = [];
    for (let r = 0; r < 3; r++) for (const e of ms[r]!.step(ckpt(`s${r}`, 3))) if (e.kind === "send") inFlight.push({ from: r, to: e.to, frame: e.frame });
    const sent: ProtoFrame[] = inFlight.map((f) => f.frame);
    for (const f of inFlight) route(ms, f.to, { kind: "frame", from: f.from, attempt: 0, frame: f.frame }, seen, sent);
    const count = (t: string): number => sent.filter((f) => f.t === t).length;
    // Each rank's replica asks its successor; its one ask goes to the other rank.
    expect(count("replica")).toBe(3);
    expect(count("ask")).toBe(3);
    expect(count("done")).toBe(0);
    for (let r = 0; r < 3; r++) expect(seen[r]).toContainEqual({ kind: "checkpointed", version: 1 });

    // One after another: the first rank's replica and ask tell the others where it is, so they
    // do not ask it back. Rank 0 asks rank 2 (its replica asks rank 1), and ranks 1 and 2 answer
    // `done`; rank 1's replica asks rank 2, which answers; rank 2's replica asks rank 0, which
    // told rank 2 already. One ask and three dones, against an ask and a done per pair (six)
    // when replicas did not ask.
    const ms2 = machines(3, 1);
    const seen2: RankEffect[][] = [[], [], []];
    const sent2: ProtoFrame[] = [];
    collectiveAll(ms2, seen2, [0, 0]);
    for (let r = 0; r < 3; r++) route(ms2, r, ckpt(`s${r}`, 3), seen2, sent2);
    expect(sent2.filter((f) => f.t === "ask").length).toBe(1);
    expect(sent2.filter((f) => f.t === "done").length).toBe(3);
    for (let r = 0; r < 3; r++) expect(seen2[r]).toContainEqual({ kind: "checkpointed", version: 1 });
  });

  it("globals: every rank keeps that of each rank's safe checkpoint, however far the others got since", () => {
    // Point-to-point only (no collectives): ranks 0 and 2 run through six checkpoints while
    // rank 1 has made one. Rank 1 restores its checkpoint 1 if it fails now, and needs its global.
    const ms = machines(3, 1);
    const seen: RankEffect[][] = [[], [], []];
    route(ms, 1, ckpt("s1", 3, "g1"), seen);
    for (let v = 1; v <= 6; v++) for (const r of [0, 2]) route(ms, r, ckpt(`s${r}`, 3, `g${v}`), seen);
    const recycled = (r: number): unknown[] => seen[r]!.flatMap((e) => (e.kind === "recycle" ? e.results : []));
    for (const r of [0, 2]) {
      expect(seen[r]).toContainEqual({ kind: "checkpointed", version: 6 });
      expect(recycled(r)).toContain("g2"); // neither a safe checkpoint nor among the four newest
      expect(recycled(r)).not.toContain("g1");
    }
  });

  it("results are dropped (and recycled) once every rank's safe checkpoint is past them", () => {
    const ms = machines(3, 1);
    const seen: RankEffect[][] = [[], [], []];
    collectiveAll(ms, seen, [0, 0]);
    route(ms, 0, ckpt("s0", 3), seen);
    route(ms, 1, ckpt("s1", 3), seen);
    expect(seen.flat().filter((e) => e.kind === "recycle")).toEqual([]); // rank 2's safe checkpoint is still at the start
    route(ms, 2, ckpt("s2", 3), seen);
    for (let r = 0; r < 3; r++) {
      expect(seen[r]).toContainEqual({ kind: "recycle", results: [[0, 0]] });
      expect(ms[r]!.buffered).toMatchObject({ entries: 0, held: 1 });
    }
  });

  it("lazy checkpoint: the state function runs once (for the replicas), the global function never without a restore", () => {
    const ms = machines(2, 1);
    const seen: RankEffect[][] = [[], []];
    const calls = { state: 0, global: 0 };
    for (let r = 0; r < 2; r++) {
      route(
        ms,
        r,
        {
          kind: "checkpoint",
          state: { kind: "thunk", thunk: () => (calls.state++, r) },
          global: { kind: "thunk", thunk: () => (calls.global++, "g") },
          key: "g",
          consumed: [0, 0],
        },
        seen,
      );
    }
    expect(calls).toEqual({ state: 2, global: 0 });
    const solo = machines(1, 2);
    let n = 0;
    solo[0]!.step({ kind: "checkpoint", state: { kind: "thunk", thunk: () => ++n }, global: val(undefined), key: null, consumed: [0] });
    expect(n).toBe(0); // one rank: no replica, no copy needed
  });

  it("restore() on a fresh start is undefined at once; twice is CPR_RESTORE", () => {
    const [m] = machines(2);
    expect(m!.step({ kind: "restore" })).toEqual([{ kind: "restored", restored: { value: undefined, dets: [], detFrom: 0 } }]);
    expect(m!.step({ kind: "restore" })).toMatchObject([{ kind: "fail", code: "CPR_RESTORE" }]);
  });
});

describe("RetryOneRank: determinants", () => {
  it("the gate closes on a determinant until every successor holds it; the first one tells every peer this rank logs", () => {
    const ms = machines(4, 2); // rank 0's successors: 1 and 2
    const out = ms[0]!.step({ kind: "dets", from: 0, entries: ["d0"] });
    expect(out.map((e) => (e.kind === "send" ? `${e.frame.t}->${e.to}` : e.kind))).toEqual(["logs->1", "logs->2", "logs->3", "dets->1", "dets->2", "gate"]);
    expect(out.at(-1)).toEqual({ kind: "gate", open: false });
    const feed = (from: number, f: ProtoFrame): readonly RankEffect[] => ms[0]!.step({ kind: "frame", from, attempt: 0, frame: f });
    for (const r of [1, 2, 3]) expect(feed(r, { t: "lack", view: [0, 0, 0, 0] })).toEqual([]);
    expect(feed(1, { t: "dack", view: [0, 0, 0, 0], upTo: 1 })).toEqual([]);
    expect(feed(2, { t: "dack", view: [0, 0, 0, 0], upTo: 1 })).toEqual([{ kind: "gate", open: true }]);
    expect(ms[0]!.isGateOpen).toBe(true);
    // The next one closes it again, without a second notice to the peers.
    expect(kinds(ms[0]!.step({ kind: "dets", from: 1, entries: ["d1"] }))).toEqual(["send", "send", "gate"]);
  });

  it("a successor's death reopens nothing: its new incarnation gets the checkpoint and the determinants again before the gate opens", () => {
    const ms = machines(3, 1);
    const seen: RankEffect[][] = [[], [], []];
    route(ms, 0, { kind: "dets", from: 0, entries: ["d0"] }, seen);
    expect(ms[0]!.isGateOpen).toBe(true);
    route(ms, 0, { kind: "peer-down", rank: 1, attempt: 0, nowMs: 0 }, seen);
    expect(ms[0]!.isGateOpen).toBe(false);
    ms[1] = new RetryOneRank({ rank: 1, size: 3, attempt: 1, attempts: [0, 1, 0], replicas: 1 });
    route(ms, 0, { kind: "peer-up", rank: 1, attempt: 1, nowMs: 1 }, seen);
    expect(ms[0]!.isGateOpen).toBe(true);
    expect(ms[1].buffered.dets).toBe(1); // the restarted successor holds d0 again
  });

  it("a holder keeps a predecessor's determinants until its safe checkpoint, and a newer incarnation's replace an older one's", () => {
    const [, m1] = machines(3, 1);
    const view = [0, 0, 0];
    m1!.step({ kind: "frame", from: 0, attempt: 0, frame: { t: "dets", view, from: 0, entries: ["a", "b", "c"] } });
    expect(m1!.buffered.dets).toBe(3);
    m1!.step({
      kind: "frame",
      from: 0,
      attempt: 0,
      frame: {
        t: "replica",
        view,
        version: 1,
        index: 0,
        key: null,
        detCount: 2,
        safe: false,
        state: "s",
        known: {
          safe: [
            [0, 0],
            [0, 0],
            [0, 0],
          ],
          logs: [],
        },
      },
    });
    m1!.step({ kind: "frame", from: 0, attempt: 0, frame: { t: "stored", view, version: 1, index: 0, detCount: 2, consumed: 0 } });
    expect(m1!.buffered.dets).toBe(1); // only "c", after the checkpoint
    // Rank 0's next incarnation logs its own outcome at ordinal 2 (the old "c" never took effect).
    m1!.step({ kind: "peer-up", rank: 0, attempt: 1, nowMs: 0 });
    const ack = m1!.step({ kind: "frame", from: 0, attempt: 1, frame: { t: "dets", view: [1, 0, 0], from: 2, entries: ["c2", "d2"] } });
    expect(ack).toContainEqual({ kind: "send", to: 0, frame: { t: "dack", view: [1, 0, 0], upTo: 4 } });
  });
});

describe("RetryOneRank: misuse and failures", () => {
  it("a bootstrap key used twice is MPI_BOOTSTRAP, and so is a bootstrap call after the first checkpoint", () => {
    const [m] = machines(1);
    m!.step({ kind: "boot", key: "seed", ident: sum });
    m!.step({ kind: "executed", result: 1 });
    expect(m!.step({ kind: "boot", key: "seed", ident: sum })).toMatchObject([
      { kind: "fail", code: "MPI_BOOTSTRAP", message: expect.stringMatching(/used twice/) },
    ]);
    const [m2] = machines(1);
    m2!.step(ckpt(1, 1));
    expect(m2!.step({ kind: "boot", key: "late", ident: sum })).toMatchObject([
      { kind: "fail", code: "MPI_BOOTSTRAP", message: expect.stringMatching(/after the first checkpoint/) },
    ]);
  });

  it("after a failure every later call fails with the same error", () => {
    const [m] = machines(1);
    m!.step({ kind: "restore" });
    m!.step({ kind: "restore" });
    expect(m!.failed).toBe(true);
    expect(m!.step({ kind: "collective", ident: sum })).toMatchObject([{ kind: "fail", code: "CPR_RESTORE" }]);
  });

  it("a restarted rank calling a collective before restore() fails with CPR_RESTORE", () => {
    const m = new RetryOneRank({ rank: 1, size: 2, attempt: 1, attempts: [0, 1] });
    expect(m.step({ kind: "collective", ident: sum })).toMatchObject([
      { kind: "fail", code: "CPR_RESTORE", message: expect.stringMatching(/before restore\(\)/) },
    ]);
  });

  it("a dead rank never restarted fails the survivor within the failure timeout (MPI_TIMEOUT)", () => {
    const [m] = machines(3);
    m!.step({ kind: "collective", ident: sum });
    expect(kinds(m!.step({ kind: "peer-down", rank: 2, attempt: 0, nowMs: 100 }))).toEqual(["abandon"]);
    expect(m!.step({ kind: "tick", nowMs: 1099 })).toEqual([]);
    expect(m!.step({ kind: "tick", nowMs: 1100 })).toMatchObject([
      { kind: "fail", code: "MPI_TIMEOUT", message: expect.stringMatching(/rank 2 failed and was not running again/) },
    ]);
  });

  it("a view change abandons the collective on the wire and starts a round at the sync point", () => {
    const [m] = machines(3);
    m!.step({ kind: "collective", ident: sum });
    m!.step({ kind: "peer-down", rank: 1, attempt: 0, nowMs: 0 });
    const out = m!.step({ kind: "peer-up", rank: 1, attempt: 1, nowMs: 5 });
    // Rank 1 is rank 0's successor: it gets rank 0's (empty) determinant log again, then the summaries go out.
    expect(out.map((e) => (e.kind === "send" ? `${e.frame.t}->${e.to}` : e.kind))).toEqual(["dets->1", "summary->1", "summary->2"]);
    expect(m!.viewId).toBe(1);
    expect(m!.inRecovery).toBe(true);
  });

  it("a running rank answers a round with a `run` position", () => {
    const [, m1] = machines(2);
    const s = emptySummary(0, 2, { kind: "coll", index: 0, ident: sum });
    const out = m1!.step({ kind: "frame", from: 0, attempt: 0, frame: { t: "summary", view: [0, 0], round: 0, summary: s } });
    const answer = out.find((e) => e.kind === "send");
    expect(answer).toMatchObject({ to: 0, frame: { t: "summary", round: 0, summary: { rank: 1, pos: { kind: "run", index: 0 } } } });
  });

  it("wire frames: a dead incarnation's are dropped, a newer one's held, older views and abandoned sequences dropped", () => {
    const [m] = machines(3);
    m!.step({ kind: "collective", ident: sum }); // wire 0
    m!.step({ kind: "peer-up", rank: 1, attempt: 1, nowMs: 0 }); // abandons wire 0
    expect(m!.classifyWire(1, 0, 0, 0)).toBe("drop"); // dead incarnation
    expect(m!.classifyWire(2, 0, 0, 1)).toBe("drop"); // older view
    expect(m!.classifyWire(2, 1, 2, 1)).toBe("hold"); // a restart we have not heard of
    expect(m!.classifyWire(2, 0, 2, 1)).toBe("hold"); // a newer view
    expect(m!.classifyWire(2, 0, 1, 0)).toBe("drop"); // abandoned sequence number
    expect(m!.classifyWire(2, 0, 1, 1)).toBe("accept");
  });

  it("protocol frames of a newer view wait for the coordinator's news; stale agreement traffic is dropped", () => {
    const [m0, m1] = machines(2);
    const s: ProtoFrame = {
      t: "summary",
      view: [0, 1],
      round: 0,
      summary: emptySummary(1, 2, { kind: "restore" }, { restoring: true }),
    };
    m0!.step({ kind: "collective", ident: sum });
    m0!.step({ kind: "executed", result: 1 });
    expect(m0!.step({ kind: "frame", from: 1, attempt: 1, frame: s })).toEqual([]); // held
    m0!.step({ kind: "peer-up", rank: 1, attempt: 1, nowMs: 0 });
    expect(m0!.inRecovery).toBe(true);
    const stale: ProtoFrame = { t: "summary", view: [0, 0], round: 0, summary: { ...s.summary, rank: 0 } };
    m1!.step({ kind: "peer-up", rank: 0, attempt: 1, nowMs: 0 });
    expect(m1!.step({ kind: "frame", from: 0, attempt: 1, frame: stale })).toEqual([]);
  });

  it("a sent frame keeps the view it was sent in (regression: a live view array let an old transfer pass for a new one)", () => {
    const [m] = machines(3);
    m!.step({ kind: "peer-up", rank: 1, attempt: 1, nowMs: 0 });
    const sent = m!.step({ kind: "collective", ident: sum }).filter((e) => e.kind === "send");
    expect(sent.length).toBe(2);
    m!.step({ kind: "peer-up", rank: 2, attempt: 1, nowMs: 1 });
    for (const e of sent) if (e.kind === "send") expect(e.frame.view).toEqual([0, 1, 0]);
  });

  it("the result buffer bound fails a rank that never checkpoints with CPR_CHECKPOINT", () => {
    const m = new RetryOneRank({ rank: 0, size: 1, attempt: 0, attempts: [0], resultEntriesMax: 2 });
    for (let i = 0; i < 2; i++) {
      m.step({ kind: "collective", ident: sum });
      m.step({ kind: "executed", result: i });
    }
    m.step({ kind: "collective", ident: sum });
    expect(m.step({ kind: "executed", result: 9 })).toMatchObject([{ kind: "fail", code: "CPR_CHECKPOINT" }]);
  });

  it("the determinant bound fails a rank that never checkpoints with CPR_CHECKPOINT", () => {
    const m = new RetryOneRank({ rank: 0, size: 2, attempt: 0, attempts: [0, 0], detEntriesMax: 3 });
    m.step({ kind: "dets", from: 0, entries: [1, 2, 3] });
    expect(m.step({ kind: "dets", from: 3, entries: [4] })).toMatchObject([
      { kind: "fail", code: "CPR_CHECKPOINT", message: expect.stringMatching(/detEntriesMax 3.*call checkpoint\(\) more often/) },
    ]);
  });
});

describe("RetryOneRank: a restart, step by step", () => {
  it("the restarted rank restores from its successor, replays from a survivor's buffer, then all proceed together", () => {
    const ms = machines(3, 1);
    const seen: RankEffect[][] = [[], [], []];
    collectiveAll(ms, seen, "a");
    for (let r = 0; r < 3; r++) route(ms, r, ckpt(`s${r}`, 3, "g1"), seen);
    collectiveAll(ms, seen, "b"); // #1
    // Rank 1 dies while the survivors compute; it runs again as attempt 1.
    ms[1] = new RetryOneRank({ rank: 1, size: 3, attempt: 1, attempts: [0, 1, 0], replicas: 1 });
    seen.forEach((s) => (s.length = 0));
    for (const r of [0, 2]) {
      route(ms, r, { kind: "peer-down", rank: 1, attempt: 0, nowMs: 0 }, seen);
      route(ms, r, { kind: "peer-up", rank: 1, attempt: 1, nowMs: 1 }, seen);
    }
    // Survivors wait at their next collective, #2.
    route(ms, 0, { kind: "collective", ident: sum }, seen);
    route(ms, 2, { kind: "collective", ident: sum }, seen);
    expect(seen[0]).toEqual([]);
    route(ms, 1, { kind: "restore" }, seen);
    expect(seen[1]![0]).toEqual({ kind: "restored", restored: { value: { state: "s1", global: "g1", version: 1 }, dets: [], detFrom: 0 } });
    route(ms, 1, { kind: "collective", ident: sum }, seen);
    expect(seen[1]).toContainEqual({ kind: "complete", result: "b", replayed: true });
    // Caught up: the next round finds everyone at #2 and they run it on the wire together.
    route(ms, 1, { kind: "collective", ident: sum }, seen);
    for (let r = 0; r < 3; r++) {
      expect(seen[r]!.at(-1)).toMatchObject({ kind: "execute", ident: sum });
      expect(ms[r]!.inRecovery).toBe(false);
    }
    const wire = seen.map((es) => (es.at(-1) as { wireSeq: number }).wireSeq);
    expect(new Set(wire).size).toBe(1);
    expect(ms[1].buffered.held).toBe(1); // it holds rank 0's data again
  });
});
