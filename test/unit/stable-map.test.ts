// Goal: StableMap behaves as a Map for every sequence of operations (get, has, set, delete,
// size, iteration), keeps its tombstones bounded, and visits keys never deleted in insertion
// order. Method: random operation sequences from a seeded PRNG against a real Map as the model.
import { describe, expect, it } from "vitest";
import { seededRandom } from "../../src/launch/backoff.ts";
import { STABLE_MAP_COMPACT_MIN, StableMap } from "../../src/mpi/stable-map.ts";

const sorted = (entries: Iterable<[number, string]>): [number, string][] => [...entries].sort((a, b) => a[0] - b[0]);

describe("StableMap", () => {
  it("agrees with a Map over random operations, 200 seeds", () => {
    for (let seed = 1; seed <= 200; seed++) {
      const rnd = seededRandom(seed);
      const model = new Map<number, string>();
      const m = new StableMap<number, string>();
      // Small key ranges make keys come back after a delete; large ones make many tombstones.
      const keys = seed % 2 === 0 ? 8 : 4000;
      for (let op = 0; op < 3000; op++) {
        const k = Math.floor(rnd() * keys);
        const r = rnd();
        // Plain comparisons in the loop (expect() per operation would dominate the run).
        let agree: boolean;
        if (r < 0.45) {
          const v = `v${op}`;
          model.set(k, v);
          agree = m.set(k, v) === m;
        } else if (r < 0.85) {
          agree = m.delete(k) === model.delete(k);
        } else if (r < 0.9995) {
          agree = m.get(k) === model.get(k) && m.has(k) === model.has(k);
        } else {
          model.clear();
          m.clear();
          agree = true;
        }
        const bounded = m.slots <= Math.max(STABLE_MAP_COMPACT_MIN, 2 * m.size) + 1;
        if (!agree || m.size !== model.size || !bounded) {
          expect({ seed, op, key: k, size: m.size, slots: m.slots, bounded }).toEqual({ seed, op, key: k, size: model.size, slots: m.slots, bounded: true });
          expect.unreachable(`seed ${seed}, operation ${op} on key ${k}: StableMap and Map disagree`);
        }
      }
      expect(sorted(m.entries())).toEqual(sorted(model.entries()));
      expect([...m.keys()].sort((a, b) => a - b)).toEqual([...model.keys()].sort((a, b) => a - b));
      expect([...m.values()].sort()).toEqual([...model.values()].sort());
    }
  });

  it("keeps insertion order for keys never deleted, across compactions", () => {
    const m = new StableMap<string, number>();
    const kept: string[] = [];
    for (let i = 0; i < 5 * STABLE_MAP_COMPACT_MIN; i++) {
      m.set(`t${i}`, i);
      m.delete(`t${i}`);
      if (i % 97 === 0) {
        m.set(`k${i}`, i);
        kept.push(`k${i}`);
      }
    }
    expect([...m.keys()]).toEqual(kept);
    expect([...m].map(([k]) => k)).toEqual(kept);
  });

  it("keeps a lone live entry through compactions of many tombstones", () => {
    const m = new StableMap<string, number>();
    m.set("keep", 1);
    for (let i = 0; i < 3 * STABLE_MAP_COMPACT_MIN; i++) {
      m.set(`t${i}`, i);
      m.delete(`t${i}`);
    }
    expect(m.slots).toBeLessThan(STABLE_MAP_COMPACT_MIN + 2);
    expect([...m]).toEqual([["keep", 1]]);
  });

  it("does not visit again an entry deleted during an iteration, and visits the rest", () => {
    const m = new StableMap<number, number>();
    for (let i = 0; i < 10; i++) m.set(i, i);
    const seen: number[] = [];
    for (const [k] of m) {
      seen.push(k);
      m.delete(k + 1);
    }
    expect(seen).toEqual([0, 2, 4, 6, 8]);
    expect(m.size).toBe(5);
  });

  it("a deleted key set again counts once", () => {
    const m = new StableMap<string, number>();
    m.set("a", 1);
    m.delete("a");
    expect(m.delete("a")).toBe(false);
    m.set("a", 2);
    m.set("a", 3);
    expect(m.size).toBe(1);
    expect(m.get("a")).toBe(3);
    expect(() => m.set("b", undefined as unknown as number)).toThrow(TypeError);
    expect(m.size).toBe(1);
  });
});
