/**
 * Goal: the idle watch (src/mpi/idle-watch.ts) warns once a rank has been idle for its bound —
 * no Lifeline call since the look before, none waiting, nothing of the program's own for Node
 * to wait for — once per idle stretch, and never while any of the three says busy.
 *
 * Method: feed the pure decision looks a second apart; the resource comparison on counts.
 * The real processes are in test/integration/launcher.test.ts (fixture launch/idle.ts).
 */
import { describe, expect, it } from "vitest";
import { beyond, IDLE_WARN_MS, idleWarning, IdleWatch, resourceCounts } from "../../src/mpi/idle-watch.ts";

const idle = { waiting: false, ownWork: false };

/** The looks (one a second from t = 0) at which the watch warns. */
function warnsAt(looks: { calls: number; waiting?: boolean; ownWork?: boolean }[]): number[] {
  const w = new IdleWatch();
  const out: number[] = [];
  looks.forEach((l, i) => {
    if (w.look({ ...idle, ...l, nowMs: i * 1000 })) out.push(i);
  });
  return out;
}

describe("the idle watch", () => {
  it("warns the bound after the last look that saw a call, once per idle stretch", () => {
    expect(IDLE_WARN_MS).toBe(5_000);
    // Calls at looks 0..2, then none: the stretch starts at look 2, the warning comes at 7.
    const calls = [1, 2, 3, ...Array<number>(10).fill(3)];
    expect(warnsAt(calls.map((c) => ({ calls: c })))).toEqual([7]);
    // A call re-arms it: a second stretch, a second warning.
    const twice = [...Array<number>(8).fill(1), ...Array<number>(8).fill(2)];
    expect(warnsAt(twice.map((c) => ({ calls: c })))).toEqual([5, 13]);
  });

  it("never while a call waits or the program has work of its own, however long", () => {
    expect(warnsAt(Array.from({ length: 30 }, () => ({ calls: 1, waiting: true })))).toEqual([]);
    expect(warnsAt(Array.from({ length: 30 }, () => ({ calls: 1, ownWork: true })))).toEqual([]);
    // Busy at look 10 restarts the stretch: 10 + 5.
    expect(warnsAt(Array.from({ length: 20 }, (_, i) => ({ calls: 1, waiting: i === 10 })))).toEqual([5, 15]);
  });

  it("counts the program's own resources beyond those there when init() returned", () => {
    const base = resourceCounts(["PipeWrap", "PipeWrap", "MessagePort"]);
    expect(beyond(resourceCounts(["PipeWrap", "MessagePort", "PipeWrap"]), base)).toBe(false);
    expect(beyond(resourceCounts(["PipeWrap"]), base)).toBe(false);
    expect(beyond(resourceCounts(["PipeWrap", "PipeWrap", "MessagePort", "Timeout"]), base)).toBe(true);
    expect(beyond(resourceCounts(["PipeWrap", "PipeWrap", "PipeWrap", "MessagePort"]), base)).toBe(true);
  });

  it("says what to do", () => {
    expect(idleWarning(3, 5_000)).toMatch(/^lifeline: rank 3: the program has made no Lifeline call for 5 s .*`await world\.finalize\(\)`\.$/);
  });
});
