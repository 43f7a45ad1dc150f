/**
 * Goal: the durable floor restarts every rank from a set of their own checkpoints that fits
 * together — no message consumed that its sender will send again, no message in flight that
 * nobody can send again, all ranks at the same collective — and from the newest such set.
 * Method: hand-built checkpoint records, one rule per test, and a brute force over every set
 * of small random histories that checks the rollback's answer is consistent and newest.
 */
import { describe, expect, it } from "vitest";
import { DurableCandidates, type DurableMeta, newestConsistentLine, startMeta } from "../../src/cpr/retry-one/durable.ts";
import { Prng } from "../../src/testing/prng.ts";

const m = (version: number, index: number, sent: number[], consumed: number[], logFrom: number[] = sent): DurableMeta => ({
  version,
  index,
  sent,
  consumed,
  logFrom,
});

/** The conditions of src/cpr/retry-one/durable.ts, checked directly. */
function consistent(set: readonly DurableMeta[]): boolean {
  const size = set.length;
  if (new Set(set.map((x) => x.index)).size > 1) return false;
  for (let s = 0; s < size; s++)
    for (let r = 0; r < size; r++) {
      if (s === r) continue;
      if (set[r]!.consumed[s]! > set[s]!.sent[r]!) return false;
      if (set[s]!.logFrom[r]! > set[r]!.consumed[s]!) return false;
    }
  return true;
}

describe("newestConsistentLine", () => {
  it("lockstep halo exchange: every rank's newest checkpoint fits", () => {
    // Two ranks, 5 iterations of one message each way, a checkpoint after each.
    const hist = (v: number): DurableMeta => m(v, v, [v, v], [v, v], [v, v]);
    expect(
      newestConsistentLine(
        [
          [hist(3), hist(5)],
          [hist(3), hist(5)],
        ],
        2,
      ),
    ).toEqual([5, 5]);
  });

  it("an orphan: the receiver consumed a message its sender's checkpoint had not sent → the receiver goes back", () => {
    const s0 = [m(2, 0, [0, 4], [0, 0], [0, 3])]; // its log holds messages 3 and on
    const r1 = [m(1, 0, [0, 0], [3, 0]), m(2, 0, [0, 0], [5, 0])];
    expect(newestConsistentLine([s0, r1], 2)).toEqual([2, 1]);
  });

  it("a message in flight that the sender's log no longer holds → the sender goes back", () => {
    // Rank 0 sent 6 to rank 1, whose checkpoint consumed 2; rank 0's newest checkpoint already
    // dropped messages below 4 from its log (rank 1 had a newer checkpoint then).
    const s0 = [m(1, 0, [0, 3], [0, 0], [0, 0]), m(2, 0, [0, 6], [0, 0], [0, 4])];
    const r1 = [m(1, 0, [0, 0], [2, 0])];
    expect(newestConsistentLine([s0, r1], 2)).toEqual([1, 1]);
  });

  it("ranks at different collectives go back to the lowest; a rank with no checkpoint takes everyone to the start", () => {
    const a = [m(1, 3, [0, 0], [0, 0]), m(2, 6, [0, 0], [0, 0])];
    const b = [m(1, 3, [0, 0], [0, 0])];
    expect(newestConsistentLine([a, b], 2)).toEqual([1, 1]);
    expect(newestConsistentLine([a, []], 2)).toEqual([0, 0]);
  });

  it("a master and workers checkpointing at different rates", () => {
    // Master 0 sends a task to 1 and 2 alternately and receives results; checkpoints per result.
    const master = [m(1, 0, [0, 1, 1], [0, 1, 0], [0, 1, 1]), m(2, 0, [0, 2, 1], [0, 1, 1], [0, 1, 1]), m(3, 0, [0, 2, 2], [0, 2, 1], [0, 2, 1])];
    const w1 = [m(1, 0, [1, 0, 0], [1, 0, 0], [0, 0, 0])];
    const w2 = [m(1, 0, [1, 0, 0], [1, 0, 0], [0, 0, 0])];
    const line = newestConsistentLine([master, w1, w2], 3);
    expect(line).toEqual([2, 1, 1]);
    expect(consistent(line.map((v, r) => (v === 0 ? startMeta(3) : [master, w1, w2][r]!.find((x) => x.version === v)!)))).toBe(true);
  });

  it("random histories: the answer is consistent, and no consistent set is newer anywhere (brute force, 300 seeds)", () => {
    for (let seed = 1; seed <= 300; seed++) {
      const p = new Prng(seed);
      const size = p.rangeInclusive(2, 3);
      // Per rank, checkpoints with nondecreasing counts.
      const hists: DurableMeta[][] = [];
      for (let r = 0; r < size; r++) {
        const h: DurableMeta[] = [];
        let cur = { index: 0, sent: new Array<number>(size).fill(0), consumed: new Array<number>(size).fill(0), logFrom: new Array<number>(size).fill(0) };
        for (let v = 1; v <= p.rangeInclusive(0, 3); v++) {
          const index = cur.index + p.index(2);
          const sent = cur.sent.map((x, d) => (d === r ? 0 : x + p.index(3)));
          const consumed = cur.consumed.map((x, s) => (s === r ? 0 : x + p.index(3)));
          const logFrom = sent.map((x, d) => (d === r ? 0 : Math.min(x, cur.logFrom[d]! + p.index(3))));
          cur = { index, sent, consumed, logFrom };
          h.push(m(v, index, sent, consumed, logFrom));
        }
        hists.push(h);
      }
      const line = newestConsistentLine(hists, size);
      const pick = (r: number, v: number): DurableMeta => (v === 0 ? startMeta(size) : hists[r]!.find((x) => x.version === v)!);
      expect(consistent(line.map((v, r) => pick(r, v))), `seed ${seed}`).toBe(true);
      // Every consistent set is at or below the answer, rank by rank.
      const all = (r: number): number[] => [0, ...hists[r]!.map((x) => x.version)];
      const sets = hists.reduce<number[][]>((acc, _, r) => acc.flatMap((prefix) => all(r).map((v) => [...prefix, v])), [[]]);
      for (const set of sets) {
        if (consistent(set.map((v, r) => pick(r, v))))
          expect(
            set.every((v, r) => v <= line[r]!),
            `seed ${seed}: ${set} is consistent but not below ${line}`,
          ).toBe(true);
      }
    }
  });
});

describe("DurableCandidates (the launcher's bookkeeping)", () => {
  const lock = (v: number): DurableMeta => m(v, v, [v, v], [v, v], [v, v]);

  it("no line until every rank has a durable checkpoint; then each newer consistent set once", () => {
    const c = new DurableCandidates<string>(2);
    c.add(0, lock(2), "0@2", 10);
    expect(c.next()).toBeUndefined(); // rank 1 would restart from its start: not a line
    c.add(1, lock(2), "1@2", 11);
    const first = c.next()!;
    expect(first).toMatchObject({ versions: [2, 2], index: 2 });
    expect(first.chosen.map((x) => x.ref)).toEqual(["0@2", "1@2"]);
    c.committed(first.versions);
    expect(c.next(), "the same set again is not a new line").toBeUndefined();
    c.add(0, lock(4), "0@4", 12);
    expect(c.next(), "rank 1 is still at 2: rank 0's 4 does not fit (another collective index)").toBeUndefined();
    c.add(1, lock(4), "1@4", 13);
    expect(c.next()?.versions).toEqual([4, 4]);
  });

  it("a version at or below a known one replaces the execution given up; a restart of all forgets everything", () => {
    const c = new DurableCandidates<string>(2);
    c.add(0, lock(3), "old", 1);
    c.add(0, lock(2), "new", 2); // rank 0 restarted from an older checkpoint and wrote 2 again
    c.add(1, lock(2), "1@2", 3);
    expect(c.next()?.chosen.map((x) => x.ref)).toEqual(["new", "1@2"]);
    c.restarted([2, 2]);
    expect(c.next(), "nothing reported since the restart").toBeUndefined();
    c.add(0, lock(3), "0@3", 4);
    c.add(1, lock(3), "1@3", 5);
    expect(c.next()?.versions).toEqual([3, 3]);
    expect(() => c.add(2, lock(1), "x", 6)).toThrow(RangeError);
  });
});
