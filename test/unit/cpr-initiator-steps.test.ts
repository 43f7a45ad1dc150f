/**
 * `--checkpoint-every Nsteps`: the initiator asks for a line once the slowest rank has made N
 * steps more than at the last line's request, and the committed line says at how many steps
 * it was asked for (`line-committed`'s `steps`, which the launcher's --json events carry).
 */
import { describe, expect, it } from "vitest";
import { CprInitiator, type InitiatorEffect, type InitiatorInput } from "../../src/cpr/coordinated/initiator.ts";

const SIZE = 2;

function harness() {
  const init = new CprInitiator({ size: SIZE, every: { steps: 5 }, committedEpoch: 0, keepLines: 2, phaseTimeoutMs: 60_000, nowMs: 0 });
  let now = 0;
  const feed = (i: InitiatorInput): InitiatorEffect[] => init.step(i);
  const t = (): number => ++now;
  /** Every rank through the round of `epoch`, to its commit; the effects of its end. */
  const round = (epoch: number): InitiatorEffect[] => {
    for (let rank = 0; rank < SIZE; rank++) feed({ kind: "ready", rank, epoch, nowMs: t() });
    let commit: InitiatorEffect[] = [];
    for (let rank = 0; rank < SIZE; rank++) commit = feed({ kind: "part", rank, epoch, ref: { rank, epoch, checksum: 1, bytes: 10 }, nowMs: t() });
    expect(commit.map((e) => e.kind)).toEqual(["commit"]);
    return feed({ kind: "commit-done", epoch, keep: [epoch], nowMs: t() });
  };
  const asks = (effs: InitiatorEffect[]): number[] => effs.flatMap((e) => (e.kind === "broadcast" && e.msg.t === "cpr-checkpoint" ? [e.msg.epoch] : []));
  const step = (rank: number, steps: number): InitiatorEffect[] => feed({ kind: "step", rank, steps, nowMs: t() });
  return { step, round, asks };
}

describe("cpr initiator: --checkpoint-every Nsteps", () => {
  it("asks when the slowest rank has made N steps, and the line says at how many", () => {
    const h = harness();
    expect(h.asks(h.step(0, 9))).toEqual([]);
    expect(h.asks(h.step(1, 4))).toEqual([]); // slowest at 4
    expect(h.asks(h.step(1, 5))).toEqual([1]);
    // Reports during the round raise the counts, not the line's.
    h.step(1, 7);
    const done = h.round(1);
    expect(done.find((e) => e.kind === "line-committed")).toMatchObject({ kind: "line-committed", epoch: 1, bytes: 20, steps: 5 });
    // The next line: N steps after the slowest rank's count at the last request (5), i.e. at 10.
    expect(h.asks(h.step(0, 12))).toEqual([]); // slowest still 7
    expect(h.asks(h.step(1, 9))).toEqual([]);
    expect(h.asks(h.step(1, 11))).toEqual([2]);
    expect(h.round(2).find((e) => e.kind === "line-committed")).toMatchObject({ epoch: 2, steps: 11 });
  });
});
