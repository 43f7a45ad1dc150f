/**
 * Goal: one rank machine's rules, seen through its effects: the failure-free path sends no
 * agreement traffic, a checkpoint commits only when every rank's state is at its replicas,
 * lazy checkpoints are materialized only when a copy is needed, program misuse and dead
 * peers fail with clear codes, and frames of dead incarnations or old views never mix in.
 * Method: drive machines by hand; a tiny synchronous router where several are needed.
 */
import { describe, expect, it } from "vitest";
import { RetryOneRank } from "../../src/cpr/retry-one/rank.ts";
import type { CollIdentity, Lazy, ProtoFrame, RankEffect, RankInput } from "../../src/cpr/retry-one/types.ts";

const sum: CollIdentity = { op: "allreduce:sum", root: -1, type: "Float64Array", length: 2 };
const val = (value: unknown): Lazy => ({ kind: "value", value });

function machines(size: number, replicas = 1): RetryOneRank[] {
  const attempts = new Array<number>(size).fill(0);
  return Array.from({ length: size }, (_, rank) => new RetryOneRank({ rank, size, attempt: 0, attempts, replicas, failureTimeoutMs: 1000 }));
}

/** Steps `input` on rank `r` and routes every protocol frame until quiet; returns non-send effects per rank. */
function route(ms: RetryOneRank[], r: number, input: RankInput, seen: RankEffect[][]): void {
  const queue: { to: number; input: RankInput }[] = [{ to: r, input }];
  while (queue.length > 0) {
    const { to, input: i } = queue.shift()!;
    for (const e of ms[to]!.step(i)) {
      if (e.kind === "send") queue.push({ to: e.to, input: { kind: "frame", from: to, attempt: ms[to]!.attempt, frame: e.frame } });
      else seen[to]!.push(e);
    }
  }
}

const kinds = (es: RankEffect[]): string[] => es.map((e) => e.kind);

describe("RetryOneRank: failure-free path", () => {
  it("a collective runs straight on the wire with no agreement frames, and its result is buffered", () => {
    const [m] = machines(3);
    const a = m!.step({ kind: "collective", ident: sum });
    expect(a).toEqual([{ kind: "execute", ident: sum, wireSeq: 0, viewId: 0, purgeBelow: 0 }]);
    expect(m!.step({ kind: "executed", result: [1, 2], bytes: 16 })).toEqual([{ kind: "complete", result: [1, 2], replayed: false }]);
    expect(m!.progress).toEqual({ version: 0, seqno: 1, committed: 0 });
    expect(m!.buffered.entries).toBe(1);
    expect(m!.step({ kind: "collective", ident: sum })[0]).toMatchObject({ kind: "execute", wireSeq: 1 });
  });

  it("checkpoint: replicas to ring successors, `stored` to all, commit when all stored; the buffer empties and its results are recycled", () => {
    const ms = machines(3, 1);
    const seen: RankEffect[][] = [[], [], []];
    for (let r = 0; r < 3; r++) {
      ms[r]!.step({ kind: "collective", ident: sum });
      ms[r]!.step({ kind: "executed", result: [0, 0] });
    }
    route(ms, 0, { kind: "checkpoint", state: val("s0"), global: val("g") }, seen);
    route(ms, 1, { kind: "checkpoint", state: val("s1"), global: val("g") }, seen);
    expect(seen.flat().filter((e) => e.kind === "checkpointed")).toEqual([]); // rank 2 has not arrived
    route(ms, 2, { kind: "checkpoint", state: val("s2"), global: val("g") }, seen);
    for (let r = 0; r < 3; r++) {
      expect(seen[r]).toEqual([
        { kind: "recycle", results: [[0, 0]] },
        { kind: "checkpointed", version: 1 },
      ]);
      expect(ms[r]!.progress).toEqual({ version: 1, seqno: 0, committed: 1 });
      expect(ms[r]!.buffered).toMatchObject({ entries: 0, replicas: 1 });
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
        { kind: "checkpoint", state: { kind: "thunk", thunk: () => (calls.state++, r) }, global: { kind: "thunk", thunk: () => (calls.global++, "g") } },
        seen,
      );
    }
    expect(calls).toEqual({ state: 2, global: 0 });
    const solo = machines(1, 2);
    let n = 0;
    solo[0]!.step({ kind: "checkpoint", state: { kind: "thunk", thunk: () => ++n }, global: val(undefined) });
    expect(n).toBe(0); // one rank: no replica, no copy needed
  });

  it("restore() on a fresh start is undefined at once; twice is CPR_RESTORE", () => {
    const [m] = machines(2);
    expect(m!.step({ kind: "restore" })).toEqual([{ kind: "restored", value: undefined }]);
    expect(m!.step({ kind: "restore" })).toMatchObject([{ kind: "fail", code: "CPR_RESTORE" }]);
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
    m2!.step({ kind: "checkpoint", state: val(1), global: val(2) });
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
    expect(out.map((e) => (e.kind === "send" ? `${e.frame.t}->${e.to}` : e.kind))).toEqual(["summary->1", "summary->2"]);
    expect(m!.viewId).toBe(1);
    expect(m!.inRecovery).toBe(true);
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

  it("protocol frames of a newer view wait for the coordinator's news; of an older view are dropped", () => {
    const [m0, m1] = machines(2);
    const s: ProtoFrame = {
      t: "summary",
      view: [0, 1],
      round: 0,
      summary: { rank: 1, pos: { kind: "restore" }, restoring: true, committed: -1, bufVersion: 0, bufCount: 0, cacheKeys: [], holds: [], wireSeq: 0 },
    };
    m0!.step({ kind: "collective", ident: sum });
    m0!.step({ kind: "executed", result: 1 });
    expect(m0!.step({ kind: "frame", from: 1, attempt: 1, frame: s })).toEqual([]); // held
    const out = m0!.step({ kind: "peer-up", rank: 1, attempt: 1, nowMs: 0 });
    expect(m0!.inRecovery).toBe(true);
    expect(out).toEqual([]); // not at a sync point: it answers at its next call
    const stale: ProtoFrame = { t: "stored", view: [0, 0], version: 1 };
    expect(m1!.step({ kind: "frame", from: 0, attempt: 0, frame: stale })).toEqual([]);
  });

  it("a sent frame keeps the view it was sent in (regression: a live view array let an old transfer pass for a new one)", () => {
    const [m] = machines(3);
    m!.step({ kind: "peer-up", rank: 1, attempt: 1, nowMs: 0 });
    const sent = m!.step({ kind: "collective", ident: sum }).filter((e) => e.kind === "send");
    expect(sent.length).toBe(2);
    m!.step({ kind: "peer-up", rank: 2, attempt: 1, nowMs: 1 });
    for (const e of sent) if (e.kind === "send") expect(e.frame.view).toEqual([0, 1, 0]);
  });

  it("the result buffer bound fails a long version with CPR_CHECKPOINT", () => {
    const m = new RetryOneRank({ rank: 0, size: 1, attempt: 0, attempts: [0], resultEntriesMax: 2 });
    for (let i = 0; i < 2; i++) {
      m.step({ kind: "collective", ident: sum });
      m.step({ kind: "executed", result: i });
    }
    m.step({ kind: "collective", ident: sum });
    expect(m.step({ kind: "executed", result: 9 })).toMatchObject([{ kind: "fail", code: "CPR_CHECKPOINT" }]);
  });
});

describe("RetryOneRank: a restart, step by step", () => {
  it("the restarted rank restores from its successor, replays from a survivor's buffer, then all proceed together", () => {
    const ms = machines(3, 1);
    const seen: RankEffect[][] = [[], [], []];
    const collectiveAll = (result: unknown): void => {
      for (let r = 0; r < 3; r++) route(ms, r, { kind: "collective", ident: sum }, seen);
      for (let r = 0; r < 3; r++) route(ms, r, { kind: "executed", result }, seen);
    };
    collectiveAll("a");
    for (let r = 0; r < 3; r++) route(ms, r, { kind: "checkpoint", state: val(`s${r}`), global: val("g1") }, seen);
    collectiveAll("b"); // (1, 0)
    // Rank 1 dies while the survivors compute; it runs again as attempt 1.
    ms[1] = new RetryOneRank({ rank: 1, size: 3, attempt: 1, attempts: [0, 1, 0], replicas: 1 });
    seen[0] = [];
    seen[1] = [];
    seen[2] = [];
    for (const r of [0, 2]) {
      route(ms, r, { kind: "peer-down", rank: 1, attempt: 0, nowMs: 0 }, seen);
      route(ms, r, { kind: "peer-up", rank: 1, attempt: 1, nowMs: 1 }, seen);
    }
    // Survivors wait at their next collective, (1, 1).
    route(ms, 0, { kind: "collective", ident: sum }, seen);
    route(ms, 2, { kind: "collective", ident: sum }, seen);
    expect(seen[0]).toEqual([]);
    route(ms, 1, { kind: "restore" }, seen);
    expect(seen[1]).toEqual([{ kind: "restored", value: { state: "s1", global: "g1", version: 1 } }]);
    route(ms, 1, { kind: "collective", ident: sum }, seen);
    expect(seen[1][1]).toEqual({ kind: "complete", result: "b", replayed: true });
    // Caught up: the next round finds everyone at (1, 1) and they run it on the wire together.
    route(ms, 1, { kind: "collective", ident: sum }, seen);
    for (let r = 0; r < 3; r++) {
      expect(seen[r]!.at(-1)).toMatchObject({ kind: "execute", ident: sum });
      expect(ms[r]!.inRecovery).toBe(false);
    }
    const wire = seen.map((es) => (es.at(-1) as { wireSeq: number }).wireSeq);
    expect(new Set(wire).size).toBe(1);
    expect(ms[1].buffered.replicas).toBe(1); // it holds rank 0's replica again
  });
});
