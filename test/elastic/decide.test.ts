/**
 * Goal: the coordinator's decision on a change of the world picks the checkpoint every member
 * can start from, keeps the leading members that hold it, gives the others the root's, and
 * refuses clearly what cannot go on. Method: decide() on hand-made news and summaries.
 */
import { describe, expect, it } from "vitest";
import { decide } from "../../src/cpr/elastic/decide.ts";
import type { Member, Summary, ViewNews } from "../../src/cpr/elastic/types.ts";

const m = (slot: number, attempt = 0): Member => ({ slot, attempt });
const held = (reached: number, oldest = reached - 1, started = true): Summary => ({ hasState: true, reached, oldest: Math.max(0, oldest), started });
const none: Summary = { hasState: false, reached: 0, oldest: 0, started: true };

function news(members: Member[], rollback: boolean, extra: Partial<ViewNews> = {}): ViewNews {
  return { id: 7, members, leaving: [], rollback, ...extra };
}

describe("decide", () => {
  it("rollback: the smallest checkpoint the members that hold state reached; joiners get it from the first member", () => {
    const d = decide(
      news([m(0), m(2), m(3), m(4, 1)], true),
      new Map([
        [0, held(12)],
        [2, held(11)],
        [3, held(12)],
        [4, none],
      ]),
    );
    expect(d).toEqual({ view: 7, target: 11, root: 0, joiners: [4] });
  });

  it("rollback: a member that joined after the target lacks it (oldest above it) and takes the root's, as those after it", () => {
    // Slot 5 joined at 12 and holds 12..13; slot 2 never reached 12: back to 11.
    const d = decide(
      news([m(0), m(2), m(5)], true),
      new Map([
        [0, held(12, 11)],
        [2, held(11, 10)],
        [5, held(13, 12)],
      ]),
    );
    expect(d).toEqual({ view: 7, target: 11, root: 0, joiners: [5] });
  });

  it("a later joiner that got its state before an earlier one did takes the root's too (only the leading holders keep theirs)", () => {
    const d = decide(
      news([m(0), m(4), m(5)], true),
      new Map([
        [0, held(9, 8)],
        [4, none],
        [5, held(9, 9)],
      ]),
    );
    expect(d).toEqual({ view: 7, target: 9, root: 0, joiners: [4, 5] });
  });

  it("with no leading holder, the first member that holds the checkpoint is the root", () => {
    const d = decide(
      news([m(3), m(0, 1), m(1, 1)], true),
      new Map([
        [3, none],
        [0, held(4, 4)],
        [1, none],
      ]),
    );
    expect(d).toEqual({ view: 7, target: 4, root: 0, joiners: [3, 1] });
  });

  it("grow: one past the furthest checkpoint reached, or the replayed change's own", () => {
    const summaries = new Map([
      [0, held(5)],
      [1, held(6)],
      [2, none],
    ]);
    expect(decide(news([m(0), m(1), m(2)], false), summaries)).toEqual({ view: 7, target: 7, root: 0, joiners: [2] });
    expect(decide(news([m(0), m(1), m(2)], false, { at: 9 }), summaries)).toEqual({ view: 7, target: 9, root: 0, joiners: [2] });
  });

  it("a replayed change that keeps none of the world before: the first rank that leaves sends the state", () => {
    const d = decide(
      news([m(2), m(3)], false, { at: 4, leaving: [m(0), m(1)] }),
      new Map([
        [0, held(3)],
        [1, held(4)],
        [2, none],
        [3, none],
      ]),
    );
    expect(d).toEqual({ view: 7, target: 4, root: 0, joiners: [2, 3] });
  });

  it("refuses: no rank holding state left, a loss during the bootstrap collectives, a rank past a replayed change", () => {
    expect(
      decide(
        news([m(4), m(5)], true),
        new Map([
          [4, none],
          [5, none],
        ]),
      ),
    ).toEqual({
      fail: { code: "CPR_RESTORE", message: expect.stringMatching(/no rank that holds the job's state is left/) },
    });
    expect(
      decide(
        news([m(0), m(1)], true),
        new Map([
          [0, held(0, 0, true)],
          [1, held(0, 0, false)],
        ]),
      ),
    ).toEqual({
      fail: { code: "CPR_RESTORE", message: expect.stringMatching(/slot\(s\) 1 were still in their bootstrap collectives/) },
    });
    expect(
      decide(
        news([m(0), m(1)], false, { at: 3 }),
        new Map([
          [0, held(3)],
          [1, held(4)],
        ]),
      ),
    ).toEqual({
      fail: { code: "CPR_PROTOCOL", message: expect.stringMatching(/at checkpoint 4, past checkpoint 3/) },
    });
  });
});
