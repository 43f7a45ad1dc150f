/**
 * Goal: the restart back-off grows exponentially with bounded, seeded jitter, and the restart
 * budget forgets restarts after a healthy stretch (`--restart-reset`), never before.
 * Method: the pure functions of src/launch/backoff.ts with fixed seeds and explicit times.
 */
import { describe, expect, it } from "vitest";
import { BACKOFF_BASE_MS, BACKOFF_MAX_MS, backoffDelayMs, RestartBudget, seededRandom } from "../../src/launch/backoff.ts";

describe("backoffDelayMs", () => {
  it("lies in [d/2, d] with d = base * 2^(n-1), capped at the maximum", () => {
    const random = seededRandom(1);
    for (let n = 1; n <= 12; n++) {
      const d = Math.min(BACKOFF_MAX_MS, BACKOFF_BASE_MS * 2 ** (n - 1));
      for (let k = 0; k < 50; k++) {
        const ms = backoffDelayMs(n, { random });
        expect(ms).toBeGreaterThanOrEqual(Math.floor(d / 2));
        expect(ms).toBeLessThanOrEqual(d);
      }
    }
    expect(backoffDelayMs(1_000, { random: () => 0.999 })).toBeLessThanOrEqual(BACKOFF_MAX_MS);
  });

  it("is jittered: the same restart number gets different delays, the same seed the same ones", () => {
    const a = seededRandom(42);
    const b = seededRandom(42);
    const first = Array.from({ length: 8 }, () => backoffDelayMs(4, { random: a }));
    const again = Array.from({ length: 8 }, () => backoffDelayMs(4, { random: b }));
    expect(first).toEqual(again);
    expect(new Set(first).size).toBeGreaterThan(4);
    const other = Array.from({ length: 8 }, () => backoffDelayMs(4, { random: seededRandom(43) }));
    expect(other).not.toEqual(first);
  });

  it("takes the extremes of the jitter exactly, and custom bounds", () => {
    expect(backoffDelayMs(3, { random: () => 0 })).toBe(200);
    expect(backoffDelayMs(3, { random: () => 0.5 })).toBe(300);
    expect(backoffDelayMs(2, { baseMs: 1_000, maxMs: 1_500, random: () => 0 })).toBe(750);
  });

  it("rejects restart numbers below 1 and random values outside [0, 1)", () => {
    expect(() => backoffDelayMs(0, { random: () => 0 })).toThrow(RangeError);
    expect(() => backoffDelayMs(1, { random: () => 1 })).toThrow(RangeError);
  });
});

describe("RestartBudget", () => {
  it("without --restart-reset, counts every restart against --max-restarts", () => {
    const b = new RestartBudget({ maxRestarts: 2, resetAfterMs: undefined });
    b.healthy(0);
    expect(b.exhausted(10)).toBe(false);
    b.restarted(10);
    b.healthy(100);
    b.restarted(1_000_000);
    expect(b.used(2_000_000)).toBe(2);
    expect(b.exhausted(2_000_000)).toBe(true);
  });

  it("with --restart-reset, forgets the restarts once the job has run healthy for that long", () => {
    const b = new RestartBudget({ maxRestarts: 1, resetAfterMs: 1_000 });
    b.healthy(0);
    b.restarted(500);
    expect(b.exhausted(600)).toBe(true); // not healthy since the restart: nothing forgiven
    b.healthy(800); // every rank up again
    expect(b.exhausted(1_799)).toBe(true);
    expect(b.used(1_800)).toBe(0);
    expect(b.exhausted(1_800)).toBe(false);
    b.restarted(1_800);
    expect(b.used(1_900)).toBe(1);
  });

  it("a second healthy() does not move the start of the healthy stretch", () => {
    const b = new RestartBudget({ maxRestarts: 1, resetAfterMs: 1_000 });
    b.restarted(0);
    b.healthy(100);
    b.healthy(900);
    expect(b.used(1_100)).toBe(0);
  });
});
