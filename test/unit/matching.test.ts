// Goal: MPI matching rules (MPI-3.1 §3.5): posted receives first in posting order, otherwise
// the earliest-arrived matching message; wildcards; non-overtaking per (source, tag); probes
// observe without consuming. Method: drive the pure Matcher directly.
import { describe, expect, it } from "vitest";
import { Matcher } from "../../src/mpi/matching.ts";
import { ANY_SOURCE, ANY_TAG } from "../../src/mpi/types.ts";

interface E {
  source: number;
  tag: number;
  id: string;
}
const e = (source: number, tag: number, id: string): E => ({ source, tag, id });

describe("Matcher", () => {
  it("queues unmatched arrivals and hands them out by (source, tag) in arrival order", () => {
    const m = new Matcher<E>(3);
    m.arrive(e(1, 5, "a"));
    m.arrive(e(2, 5, "b"));
    m.arrive(e(1, 5, "c"));
    m.arrive(e(1, 6, "d"));
    expect(m.take(1, 6)?.id).toBe("d");
    expect(m.take(1, 5)?.id).toBe("a"); // non-overtaking: a before c
    expect(m.take(ANY_SOURCE, 5)?.id).toBe("b"); // earliest arrival across sources
    expect(m.take(ANY_SOURCE, ANY_TAG)?.id).toBe("c");
    expect(m.take(ANY_SOURCE, ANY_TAG)).toBeUndefined();
    expect(m.unexpectedCount).toBe(0);
  });

  it("gives an arrival to the first matching posted receive, in posting order", () => {
    const m = new Matcher<E>(2);
    const got: string[] = [];
    m.post({ source: 1, tag: 9, consume: true, onMatch: (x) => got.push(`specific:${x.id}`) });
    m.post({ source: ANY_SOURCE, tag: ANY_TAG, consume: true, onMatch: (x) => got.push(`wild:${x.id}`) });
    expect(m.arrive(e(1, 3, "x"))).toBe(true); // only the wildcard matches tag 3
    expect(m.arrive(e(1, 9, "y"))).toBe(true);
    expect(m.arrive(e(0, 9, "z"))).toBe(false); // nothing posted matches any more: queued
    expect(got).toEqual(["wild:x", "specific:y"]);
    expect(m.peek(0, 9)?.id).toBe("z");
  });

  it("lets probes observe without consuming", () => {
    const m = new Matcher<E>(2);
    const seen: string[] = [];
    m.post({ source: ANY_SOURCE, tag: 4, consume: false, onMatch: (x) => seen.push(x.id) });
    expect(m.arrive(e(1, 4, "p"))).toBe(false);
    expect(seen).toEqual(["p"]);
    expect(m.take(1, 4)?.id).toBe("p");
  });

  it("cancels and drains waiters", () => {
    const m = new Matcher<E>(1);
    const w = { source: 0, tag: 1, consume: true, onMatch: () => undefined };
    m.post(w);
    expect(m.postedCount).toBe(1);
    expect(m.cancel(w)).toBe(true);
    expect(m.cancel(w)).toBe(false);
    m.post(w);
    expect(m.drainWaiters()).toHaveLength(1);
    m.arrive(e(0, 1, "a"));
    m.arrive(e(0, 2, "b"));
    expect(m.drainQueued().map((x) => x.id)).toEqual(["a", "b"]);
  });
});

describe("the unexpected queue's byte count (the bound on unmatched messages)", () => {
  it("counts what is queued until it is taken or drained, and names the source holding the most", () => {
    const m = new Matcher<{ source: number; tag: number }>(3);
    expect(m.arrive({ source: 1, tag: 1 }, 100)).toBe(false);
    expect(m.arrive({ source: 2, tag: 1 }, 300)).toBe(false);
    expect(m.arrive({ source: 1, tag: 2 }, 250)).toBe(false);
    expect(m.unexpectedBytes).toBe(650);
    expect(m.largestSource()).toBe(1);
    m.take(1, 2);
    expect(m.unexpectedBytes).toBe(400);
    expect(m.largestSource()).toBe(2);
    // A message a posted receive takes at once is never counted.
    m.post({ source: 0, tag: 9, consume: true, onMatch: () => undefined });
    expect(m.arrive({ source: 0, tag: 9 }, 1000)).toBe(true);
    expect(m.unexpectedBytes).toBe(400);
    m.drainQueued();
    expect(m.unexpectedBytes).toBe(0);
    expect(m.largestSource()).toBe(-1);
  });
});
