/**
 * Goal: `decide` maps every combination of rank positions after a failure to the action
 * Rabit's ActionSummary priorities call for (load-checkpoint > load-cache > serve the ranks
 * behind > normal), waits for running ranks instead of failing, and reports the combinations
 * nobody can get out of instead of waiting on them. Method: hand-built summaries, one
 * situation per test.
 */
import { describe, expect, it } from "vitest";
import { decide, predecessors, successors } from "../../src/cpr/retry-one/agreement.ts";
import type { CollIdentity, Holding, Position, Summary } from "../../src/cpr/retry-one/types.ts";
import { emptySummary } from "./summaries.ts";

const sum: CollIdentity = { op: "allreduce:sum", root: -1, type: "Float64Array", length: 4 };
const coll = (index: number, ident = sum): Position => ({ kind: "coll", index, ident });
const run = (index: number): Position => ({ kind: "run", index });
const opts = { size: 4, replicas: 2 };

/**
 * A survivor at `pos` whose checkpoints and its predecessors' are at `version` (collective
 * index `3 * version`), safe and known to all, with results from that index on.
 */
function survivor(rank: number, pos: Position, version: number, more: Partial<Summary> = {}): Summary {
  const index = 3 * version;
  const holds: Holding[] = predecessors(rank, opts).map((owner) => ({
    owner,
    versions: version > 0 ? [{ version, index, key: `g${version}`, detCount: 0 }] : [],
    detFrom: 0,
    detTo: 0,
  }));
  const bufTo = pos.kind === "coll" || pos.kind === "final" || pos.kind === "run" ? pos.index : index;
  return {
    rank,
    pos,
    restoring: false,
    version,
    knownSafe: [version, version, version, version],
    safeIndex: [index, index, index, index],
    bufFrom: index,
    bufTo,
    cacheKeys: [],
    holds,
    globals: version > 0 ? [{ version, index, key: `g${version}` }] : [],
    logsKnown: [],
    wireSeq: 10,
    ...more,
  };
}

function restarted(rank: number, pos: Position = { kind: "restore" }, more: Partial<Summary> = {}): Summary {
  return emptySummary(rank, 4, pos, { restoring: true, ...more });
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
      [0, 1, 2, 3].map((r) => survivor(r, coll(8), 2, { wireSeq: 10 + r })),
      opts,
    );
    expect(d).toEqual({ kind: "proceed", pos: coll(8), wireSeq: 13 });
  });

  it("ranks behind get every result from their index on from the survivor holding the most", () => {
    const all = [survivor(0, coll(8), 2), survivor(1, coll(7), 2), survivor(2, coll(8), 2), survivor(3, run(9), 2)];
    const d = decide(all, opts);
    expect(d).toEqual({
      kind: "plan",
      transfers: [
        { kind: "results", from: 3, to: 0, fromIndex: 8 },
        { kind: "results", from: 3, to: 1, fromIndex: 7 },
        { kind: "results", from: 3, to: 2, fromIndex: 8 },
      ],
    });
  });

  it("load-checkpoint: a restarted rank gets its newest safe checkpoint from the first holder, the global, every result, the cache and what it held", () => {
    const all = [
      survivor(0, coll(10), 3, { cacheKeys: ["seed"] }),
      restarted(1),
      survivor(2, coll(10), 3, { cacheKeys: ["seed"] }),
      survivor(3, coll(10), 3, { cacheKeys: ["seed"] }),
    ];
    const d = decide(all, opts);
    expect(d).toEqual({
      kind: "plan",
      transfers: [
        { kind: "restore", from: 2, to: 1, version: 3 },
        { kind: "global", from: 0, to: 1, version: 3 },
        { kind: "results", from: 0, to: 1, fromIndex: 0 },
        { kind: "cache", from: 0, to: 1, keys: ["seed"] },
        // Rank 1 holds ranks 0's and 3's data again: from another holder of each.
        { kind: "held", from: 2, to: 1, owner: 0 },
        { kind: "held", from: 0, to: 1, owner: 3 },
      ],
    });
  });

  it("the restore prefers the holder with the most determinants, then the nearest in ring order", () => {
    const withDets = (r: number, detTo: number): Summary => {
      const s = survivor(r, run(9), 3);
      return { ...s, holds: s.holds.map((h) => (h.owner === 1 ? { ...h, detTo } : h)) };
    };
    const d = decide([withDets(0, 0), restarted(1), withDets(2, 4), withDets(3, 7)], opts);
    if (d.kind !== "plan") throw new Error(d.kind);
    expect(d.transfers[0]).toEqual({ kind: "restore", from: 3, to: 1, version: 3 });
  });

  it("only a safe checkpoint is restored: a newer one still being acknowledged is ignored", () => {
    const pending = (r: number): Summary => {
      const s = survivor(r, run(12), 3);
      return { ...s, holds: s.holds.map((h) => ({ ...h, versions: [...h.versions, { version: 4, index: 12, key: "g4", detCount: 0 }] })) };
    };
    const d = decide([pending(0), restarted(1), pending(2), pending(3)], opts);
    if (d.kind !== "plan") throw new Error(d.kind);
    expect(d.transfers[0]).toEqual({ kind: "restore", from: 2, to: 1, version: 3 });
  });

  it("more failures than replicas: a rank's checkpoint with every holder dead is a clear CPR_LOST error", () => {
    const all = [restarted(0), restarted(1), restarted(2), survivor(3, coll(3), 1)];
    const d = decide(all, opts);
    expect(d).toMatchObject({ kind: "fail", code: "CPR_LOST" });
    if (d.kind === "fail") expect(d.message).toMatch(/rank 0's checkpoint 1 is lost.*--replicas 2/);
  });

  it("every rank restarted: a clear error, never a silent restart from the beginning", () => {
    const d = decide([restarted(0), restarted(1), restarted(2), restarted(3)], opts);
    expect(d).toMatchObject({ kind: "fail", code: "CPR_LOST" });
    if (d.kind === "fail") expect(d.message).toMatch(/no rank kept its memory/);
  });

  it("before the first checkpoint a restarted rank restores the start (version 0) and gets every result", () => {
    const all = [survivor(0, coll(4), 0), restarted(1), survivor(2, coll(4), 0), survivor(3, coll(4), 0)];
    const d = decide(all, opts);
    if (d.kind !== "plan") throw new Error(d.kind);
    expect(d.transfers.slice(0, 2)).toEqual([
      { kind: "restore", from: 2, to: 1, version: 0 },
      { kind: "results", from: 0, to: 1, fromIndex: 0 },
    ]);
  });

  it("its holders dead too: the start only if nobody knows it logged determinants", () => {
    const noHolders = (r: number, logsKnown: number[] = []): Summary => ({ ...survivor(r, coll(4), 0), holds: [], logsKnown });
    const ok = decide([noHolders(0), restarted(1), noHolders(2), noHolders(3)], opts);
    if (ok.kind !== "plan") throw new Error(ok.kind);
    expect(ok.transfers[0]).toEqual({ kind: "restore", from: 0, to: 1, version: 0 });
    const lost = decide([noHolders(0, [1]), restarted(1), noHolders(2), noHolders(3)], opts);
    expect(lost).toMatchObject({ kind: "fail", code: "CPR_LOST", message: expect.stringMatching(/rank 1's logged outcomes are lost/) });
  });

  it("the global of the restored checkpoint not kept yet by anyone: restore without it now, give it once a survivor reaches that checkpoint", () => {
    const behind = (r: number): Summary => ({ ...survivor(r, run(9), 3), version: 2, globals: [{ version: 2, index: 6, key: "g2" }] });
    // Restored at once (its sender log may be what the others need to reach checkpoint 3), no global.
    const d = decide([behind(0), restarted(1), behind(2), behind(3)], opts);
    if (d.kind !== "plan") throw new Error(d.kind);
    expect(d.transfers[0]).toEqual({ kind: "restore", from: 2, to: 1, version: 3 });
    expect(d.transfers.some((t) => t.kind === "global")).toBe(false);
    // After the transfers, the ranks wait for positions to change (as after a `wait`): the first
    // to reach checkpoint 3 starts a round, even where nobody calls a collective.
    expect(d.waitAfter).toBe(true);
    // Then it runs (in restore()) awaiting the global: wait while nobody keeps it ...
    const awaiting: Summary = { ...survivor(1, run(9), 3), awaitsGlobal: { version: 3, key: "g3" } };
    expect(decide([behind(0), awaiting, behind(2), behind(3)], opts)).toEqual({ kind: "wait" });
    // ... and take it from the first survivor that keeps its own of checkpoint 3.
    const reached: Summary = { ...behind(2), version: 3, globals: [{ version: 3, index: 9, key: "g3" }] };
    expect(decide([behind(0), awaiting, reached, behind(3)], opts)).toEqual({ kind: "plan", transfers: [{ kind: "global", from: 2, to: 1, version: 3 }] });
    // Every survivor past it without one: a clear error.
    const over = (r: number): Summary => ({ ...survivor(r, run(9), 4), globals: [{ version: 4, index: 12, key: "g4" }] });
    expect(decide([over(0), awaiting, over(2), over(3)], opts)).toMatchObject({ kind: "fail", code: "CPR_RESTORE" });
    const past = (r: number): Summary => ({ ...survivor(r, run(9), 3), globals: [{ version: 3, index: 9, key: "other" }] });
    expect(decide([past(0), restarted(1), past(2), past(3)], opts)).toMatchObject({
      kind: "fail",
      code: "CPR_RESTORE",
      message: expect.stringMatching(/global must be identical on every rank/),
    });
  });

  it("the global lost with every rank that had it, but a restarted rank goes through that checkpoint again: wait for it, no error", () => {
    // Rank 1 restored checkpoint 3 without its global and awaits it. Rank 0, which had its
    // own, was restarted; rank 2 is past checkpoint 3 and did not keep that global. Rank 3,
    // restarted too, restores checkpoint 2 (the newest of its known to be safe): it calls
    // checkpoint 3 again and keeps that global then.
    const held = (owner: number, version: number): Holding => ({
      owner,
      versions: [{ version, index: 3 * version, key: `g${version}`, detCount: 0 }],
      detFrom: 0,
      detTo: 0,
    });
    const all = (safe3: number): Summary[] => {
      const knownSafe = [3, 3, 4, safe3];
      // Results are kept from the oldest safe checkpoint's collective on.
      const bufFrom = 3 * safe3;
      return [
        restarted(0),
        { ...survivor(1, run(12), 3), knownSafe, bufFrom, awaitsGlobal: { version: 3, key: "g3" }, globals: [], holds: [held(0, 3), held(3, safe3)] },
        // Its global of checkpoint 2 is kept while rank 3's newest safe checkpoint is 2.
        {
          ...survivor(2, run(12), 4),
          knownSafe,
          bufFrom,
          globals: [2, 4].map((v) => ({ version: v, index: 3 * v, key: `g${v}` })),
          holds: [held(1, 3), held(0, 3)],
        },
        restarted(3),
      ];
    };
    const d = decide(all(2), opts);
    if (d.kind !== "plan") throw new Error(`${d.kind}: ${JSON.stringify(d)}`);
    expect(d.transfers).toContainEqual({ kind: "restore", from: 1, to: 0, version: 3 });
    expect(d.transfers).toContainEqual({ kind: "restore", from: 1, to: 3, version: 2 });
    expect(d.transfers.filter((t) => t.kind === "global")).toEqual([{ kind: "global", from: 2, to: 3, version: 2 }]);
    expect(d.waitAfter).toBe(true);
    // Had rank 3's checkpoint 3 been safe, nobody would go through checkpoint 3 again: a clear error.
    expect(decide(all(3), opts)).toMatchObject({ kind: "fail", code: "CPR_RESTORE" });
  });

  it("a running rank cannot be waited for in a round: nothing to move and someone runs → wait", () => {
    expect(decide([survivor(0, coll(5), 1), survivor(1, run(5), 1), survivor(2, coll(5), 1), survivor(3, coll(5), 1)], opts)).toEqual({ kind: "wait" });
  });

  it("load-cache: a restarted rank at a bootstrap collective gets every key it lacks, whoever holds it", () => {
    const all = [
      survivor(0, coll(3), 1, { cacheKeys: ["a", "b"] }),
      restarted(1, { kind: "boot", key: "b", ident: sum }),
      survivor(2, coll(3), 1, { cacheKeys: ["a", "b"] }),
      survivor(3, coll(3), 1, { cacheKeys: ["a", "b"] }),
    ];
    expect(decide(all, opts)).toEqual({ kind: "plan", transfers: [{ kind: "cache", from: 0, to: 1, keys: ["a", "b"] }] });
  });

  it("all at the same bootstrap key and nobody has it → proceed (a fresh bootstrap, restarted ranks included)", () => {
    const boot: Position = { kind: "boot", key: "seed", ident: sum };
    const d = decide([survivor(0, boot, 0), restarted(1, boot), survivor(2, boot, 0), survivor(3, boot, 0)], opts);
    expect(d.kind).toBe("proceed");
  });

  it("a bootstrap key nobody ever ran, with the others past it: no rank can move → clear error, not a hang", () => {
    const all = [survivor(0, coll(3), 1), restarted(1, { kind: "boot", key: "new", ident: sum }), survivor(2, coll(3), 1), survivor(3, coll(3), 1)];
    expect(decide(all, opts)).toMatchObject({ kind: "fail", code: "CPR_REPLAY" });
  });

  it("the same point with another collective identity → MPI_COLLECTIVE_MISMATCH", () => {
    const max: CollIdentity = { ...sum, op: "allreduce:max" };
    const all = [survivor(0, coll(5), 1), survivor(1, coll(5, max), 1), survivor(2, coll(5), 1), survivor(3, coll(5), 1)];
    expect(decide(all, opts)).toMatchObject({ kind: "fail", code: "MPI_COLLECTIVE_MISMATCH" });
  });

  it("a restarted rank calling a collective before restore() → CPR_RESTORE", () => {
    const all = [survivor(0, coll(3), 1), restarted(1, coll(0)), survivor(2, coll(3), 1), survivor(3, coll(3), 1)];
    expect(decide(all, opts)).toMatchObject({ kind: "fail", code: "CPR_RESTORE" });
  });

  it("all finalized at the same point → proceed (nothing left to do)", () => {
    const fin: Position = { kind: "final", index: 9 };
    expect(
      decide(
        [0, 1, 2, 3].map((r) => survivor(r, fin, 3)),
        opts,
      ).kind,
    ).toBe("proceed");
  });

  it("results a rank needs that every holder dropped is a protocol error, never a wrong result", () => {
    const all = [survivor(0, coll(9), 3), survivor(1, coll(2), 3), survivor(2, coll(9), 3), survivor(3, coll(9), 3)];
    expect(decide(all, opts)).toMatchObject({ kind: "fail", code: "CPR_PROTOCOL" });
  });
});
