/**
 * Goal: `decide` maps every combination of rank positions after a failure to the action
 * Rabit's ActionSummary priorities call for (checkpoint-ack > checkpoint > load-checkpoint >
 * load-cache > normal), and reports the combinations nobody can get out of instead of
 * waiting on them. Method: hand-built summaries, one situation per test.
 */
import { describe, expect, it } from "vitest";
import { decide, predecessors, successors } from "../../src/cpr/retry-one/agreement.ts";
import type { CollIdentity, Holding, Position, Summary } from "../../src/cpr/retry-one/types.ts";

const sum: CollIdentity = { op: "allreduce:sum", root: -1, type: "Float64Array", length: 4 };
const coll = (version: number, seqno: number, ident = sum): Position => ({ kind: "coll", version, seqno, ident });
const opts = { size: 4, replicas: 2 };

/** A survivor at `pos` that committed `committed` and holds its own state and its predecessors'. */
function survivor(rank: number, pos: Position, committed: number, more: Partial<Summary> = {}): Summary {
  const holds: Holding[] =
    committed > 0 ? [{ owner: rank, version: committed }, ...predecessors(rank, opts).map((owner) => ({ owner, version: committed }))] : [];
  const bufCount = pos.kind === "coll" ? pos.seqno : pos.kind === "ckpt" || pos.kind === "final" ? pos.count : 0;
  return { rank, pos, restoring: false, committed, bufVersion: committed, bufCount, cacheKeys: [], holds, wireSeq: 10, ...more };
}

function restarted(rank: number, pos: Position = { kind: "restore" }, more: Partial<Summary> = {}): Summary {
  return { rank, pos, restoring: true, committed: -1, bufVersion: 0, bufCount: 0, cacheKeys: [], holds: [], wireSeq: 0, ...more };
}

describe("decide", () => {
  it("ring helpers across hosts: replicas go to other hosts first, and predecessors follow", () => {
    const two = { size: 4, replicas: 1, groups: [0, 0, 1, 1] };
    expect([0, 1, 2, 3].map((r) => successors(r, two))).toEqual([[2], [2], [0], [0]]);
    expect([0, 1, 2, 3].map((r) => predecessors(r, two))).toEqual([[3, 2], [], [1, 0], []]);
    // Every rank's replica is on another host: one host lost loses no checkpoint.
    for (let r = 0; r < 4; r++) expect(successors(r, two).every((h) => two.groups[h] !== two.groups[r])).toBe(true);
    const three = { size: 6, replicas: 2, groups: [0, 0, 1, 1, 2, 2] };
    expect(successors(1, three)).toEqual([2, 3]);
    expect(successors(5, three)).toEqual([0, 1]);
    // One host: the plain ring.
    expect(successors(1, { size: 4, replicas: 2, groups: [0, 0, 0, 0] })).toEqual([2, 3]);
  });

  it("ring helpers: successors hold a rank's state, predecessors are whose it holds", () => {
    expect(successors(3, opts)).toEqual([0, 1]);
    expect(predecessors(0, opts)).toEqual([3, 2]);
  });

  it("normal: everyone at the same collective, nothing held beyond it → proceed with the highest wire sequence", () => {
    const d = decide(
      [0, 1, 2, 3].map((r) => survivor(r, coll(2, 5), 2, { wireSeq: 10 + r })),
      opts,
    );
    expect(d).toEqual({ kind: "proceed", pos: coll(2, 5), wireSeq: 13 });
  });

  it("a rank behind at (v, s) gets every result from s on from the survivor holding the most", () => {
    const all = [survivor(0, coll(2, 5), 2), survivor(1, coll(2, 3), 2), survivor(2, coll(2, 5), 2), survivor(3, { kind: "ckpt", version: 2, count: 6 }, 2)];
    const d = decide(all, opts);
    expect(d.kind).toBe("plan");
    if (d.kind !== "plan") return;
    expect(d.transfers).toEqual([
      { kind: "results", from: 3, to: 0, version: 2, fromSeqno: 5 },
      { kind: "results", from: 3, to: 1, version: 2, fromSeqno: 3 },
      { kind: "results", from: 3, to: 2, version: 2, fromSeqno: 5 },
    ]);
  });

  it("load-checkpoint: a restarted rank gets its state from the first live successor, results, cache and the replicas it should hold", () => {
    const all = [
      survivor(0, coll(3, 2), 3, { cacheKeys: ["seed"] }),
      restarted(1),
      survivor(2, coll(3, 2), 3, { cacheKeys: ["seed"] }),
      survivor(3, coll(3, 2), 3, { cacheKeys: ["seed"] }),
    ];
    const d = decide(all, opts);
    expect(d.kind).toBe("plan");
    if (d.kind !== "plan") return;
    expect(d.commit).toBeNull();
    expect(d.transfers).toEqual([
      { kind: "restore", from: 2, to: 1, version: 3 },
      { kind: "results", from: 0, to: 1, version: 3, fromSeqno: 0 },
      { kind: "cache", from: 0, to: 1, keys: ["seed"] },
      { kind: "replica", from: 0, to: 1, owner: 0, version: 3 },
      { kind: "replica", from: 3, to: 1, owner: 3, version: 3 },
    ]);
  });

  it("the restore skips dead holders: the next live holder serves (a server killed mid-restore)", () => {
    const all = [survivor(0, coll(3, 0), 3), restarted(1), restarted(2), survivor(3, coll(3, 0), 3)];
    const d = decide(all, opts);
    if (d.kind !== "plan") throw new Error(d.kind);
    expect(d.transfers.filter((t) => t.kind === "restore")).toEqual([
      { kind: "restore", from: 3, to: 1, version: 3 },
      { kind: "restore", from: 3, to: 2, version: 3 },
    ]);
  });

  it("more failures than replicas: a rank's checkpoint with every holder dead is a clear CPR_RESTORE error", () => {
    const all = [restarted(0), restarted(1), restarted(2), survivor(3, coll(1, 0), 1)];
    const d = decide(all, opts);
    expect(d.kind).toBe("fail");
    if (d.kind !== "fail") return;
    expect(d.code).toBe("CPR_RESTORE");
    expect(d.message).toMatch(/rank 0's checkpoint of version 1 is lost.*--replicas 2/);
  });

  it("every rank restarted: a clear error, never a silent restart from version 0", () => {
    const d = decide([restarted(0), restarted(1), restarted(2), restarted(3)], opts);
    expect(d).toMatchObject({ kind: "fail", code: "CPR_RESTORE" });
    if (d.kind === "fail") expect(d.message).toMatch(/never restarts silently from the beginning/);
  });

  it("before the first checkpoint a restarted rank restores version 0 (nothing) and replays version 0", () => {
    const all = [survivor(0, coll(0, 4), 0), restarted(1), survivor(2, coll(0, 4), 0), survivor(3, coll(0, 4), 0)];
    const d = decide(all, opts);
    if (d.kind !== "plan") throw new Error(d.kind);
    expect(d.transfers).toEqual([
      { kind: "restore", from: 0, to: 1, version: 0 },
      { kind: "results", from: 0, to: 1, version: 0, fromSeqno: 0 },
    ]);
  });

  it("checkpoint-ack: one survivor committed v → ranks waiting at that checkpoint commit, the restarted rank restores v", () => {
    // Rank 1 died inside checkpoint 2 after everyone heard its `stored`; rank 0 committed.
    const pending = (r: number): Summary =>
      survivor(r, { kind: "ckpt", version: 1, count: 3 }, 1, {
        holds: [{ owner: r, version: 2 }, ...predecessors(r, opts).map((owner) => ({ owner, version: 2 }))],
      });
    const all = [survivor(0, coll(2, 0), 2), restarted(1), pending(2), pending(3)];
    const d = decide(all, opts);
    if (d.kind !== "plan") throw new Error(d.kind);
    expect(d.commit).toBe(2);
    expect(d.transfers[0]).toEqual({ kind: "restore", from: 2, to: 1, version: 2 });
  });

  it("dying inside a checkpoint before anyone committed: the restarted rank restores the previous version", () => {
    const atCkpt = (r: number): Summary => survivor(r, { kind: "ckpt", version: 1, count: 3 }, 1);
    const d = decide([atCkpt(0), restarted(1), atCkpt(2), atCkpt(3)], opts);
    if (d.kind !== "plan") throw new Error(d.kind);
    expect(d.commit).toBeNull();
    expect(d.transfers).toContainEqual({ kind: "restore", from: 2, to: 1, version: 1 });
    expect(d.transfers).toContainEqual({ kind: "results", from: 0, to: 1, version: 1, fromSeqno: 0 });
  });

  it("load-cache: a restarted rank at a bootstrap collective gets every key it lacks, whoever holds it", () => {
    const all = [
      survivor(0, coll(1, 0), 1, { cacheKeys: ["a", "b"] }),
      restarted(1, { kind: "boot", key: "b", ident: sum }),
      survivor(2, coll(1, 0), 1, { cacheKeys: ["a", "b"] }),
      survivor(3, coll(1, 0), 1, { cacheKeys: ["a", "b"] }),
    ];
    const d = decide(all, opts);
    if (d.kind !== "plan") throw new Error(d.kind);
    expect(d.transfers).toEqual([{ kind: "cache", from: 0, to: 1, keys: ["a", "b"] }]);
  });

  it("all at the same bootstrap key and nobody has it → proceed (a fresh bootstrap, restarted ranks included)", () => {
    const boot: Position = { kind: "boot", key: "seed", ident: sum };
    const d = decide([survivor(0, boot, 0), restarted(1, boot), survivor(2, boot, 0), survivor(3, boot, 0)], opts);
    expect(d.kind).toBe("proceed");
  });

  it("a bootstrap key nobody ever ran, with the others past it: no rank can move → clear error, not a hang", () => {
    const all = [survivor(0, coll(1, 0), 1), restarted(1, { kind: "boot", key: "new", ident: sum }), survivor(2, coll(1, 0), 1), survivor(3, coll(1, 0), 1)];
    const d = decide(all, opts);
    expect(d).toMatchObject({ kind: "fail", code: "CPR_REPLAY" });
  });

  it("the same point with another collective identity → MPI_COLLECTIVE_MISMATCH", () => {
    const max: CollIdentity = { ...sum, op: "allreduce:max" };
    const all = [survivor(0, coll(1, 2), 1), survivor(1, coll(1, 2, max), 1), survivor(2, coll(1, 2), 1), survivor(3, coll(1, 2), 1)];
    expect(decide(all, opts)).toMatchObject({ kind: "fail", code: "MPI_COLLECTIVE_MISMATCH" });
  });

  it("checkpoints after different numbers of collectives → CPR_REPLAY", () => {
    const all = [0, 1, 2, 3].map((r) => survivor(r, { kind: "ckpt", version: 1, count: r === 2 ? 4 : 3 }, 1, { bufCount: 3 }));
    expect(decide(all, opts)).toMatchObject({ kind: "fail", code: "CPR_REPLAY" });
  });

  it("a restarted rank calling a collective before restore() → CPR_RESTORE", () => {
    const all = [survivor(0, coll(1, 0), 1), restarted(1, coll(0, 0)), survivor(2, coll(1, 0), 1), survivor(3, coll(1, 0), 1)];
    expect(decide(all, opts)).toMatchObject({ kind: "fail", code: "CPR_RESTORE" });
  });

  it("all finalized at the same point → proceed (nothing left to do)", () => {
    const fin: Position = { kind: "final", version: 3, count: 0 };
    expect(
      decide(
        [0, 1, 2, 3].map((r) => survivor(r, fin, 3)),
        opts,
      ).kind,
    ).toBe("proceed");
  });

  it("ranks more than one checkpoint apart is a protocol error", () => {
    const all = [survivor(0, coll(3, 0), 3), survivor(1, coll(1, 0), 1), survivor(2, coll(3, 0), 3), survivor(3, coll(3, 0), 3)];
    expect(decide(all, opts)).toMatchObject({ kind: "fail", code: "CPR_PROTOCOL" });
  });
});
