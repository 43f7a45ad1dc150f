/**
 * A Map for bookkeeping that adds and deletes an entry per message: a delete leaves a
 * tombstone instead of removing the key, and the tombstones go all at once, when they make up
 * half of at least {@link STABLE_MAP_COMPACT_MIN} keys.
 *
 * Why: V8 gives a JS Map a new hash table when a delete leaves it sparse (shrink) and when an
 * add finds it full of deleted slots (rehash), so a Map that goes from empty to one entry and
 * back on every collective gets a new table every few operations. The table of a Map in the
 * old generation is allocated there too, and each such allocation checks the old generation's
 * limit, against which V8 also counts the external memory allocated since the last
 * mark-compact (received messages, result arrays). At 1 MiB per collective those checks
 * started mark-compact after mark-compact in retry-one's ranks (about 50 in 300 iterations of
 * bench/programs/allreduce-loop.ts, against 1 in mode none). With tombstones, a StableMap
 * replaces its Map by a new one, allocated young with young tables, once the tombstones make
 * up half of at least {@link STABLE_MAP_COMPACT_MIN} keys: few enough that iterating over them
 * stays cheap.
 *
 * Iterating skips tombstones; entries deleted during an iteration are not visited again.
 *
 * @example
 * const waiters = new StableMap<string, () => void>();
 * waiters.set("3.1.0", wake); waiters.get("3.1.0")?.(); waiters.delete("3.1.0");
 */

/** Keys at which tombstones may be dropped (when they are at least half of them). */
export const STABLE_MAP_COMPACT_MIN = 64;

export class StableMap<K, V> {
  /** Live entries and tombstones (undefined). */
  private map = new Map<K, V | undefined>();
  private live = 0;

  /** Live entries. */
  get size(): number {
    return this.live;
  }

  /** Keys held, tombstones included (at most max(STABLE_MAP_COMPACT_MIN, 2 × size) + 1). */
  get slots(): number {
    return this.map.size;
  }

  get(key: K): V | undefined {
    return this.map.get(key);
  }

  has(key: K): boolean {
    return this.map.get(key) !== undefined;
  }

  /** `value` must not be undefined (undefined marks a deleted entry). */
  set(key: K, value: V): this {
    if (value === undefined) throw new TypeError("StableMap.set: undefined marks a deleted entry and cannot be a value");
    const map = this.map;
    const before = map.get(key);
    if (before === undefined) {
      if (!map.has(key) && map.size >= STABLE_MAP_COMPACT_MIN && map.size >= 2 * this.live) this.compact();
      this.live++;
    }
    this.map.set(key, value);
    return this;
  }

  delete(key: K): boolean {
    if (this.map.get(key) === undefined) return false;
    this.map.set(key, undefined);
    this.live--;
    return true;
  }

  clear(): void {
    this.map = new Map();
    this.live = 0;
  }

  *entries(): IterableIterator<[K, V]> {
    for (const [k, v] of this.map) if (v !== undefined) yield [k, v];
  }

  *keys(): IterableIterator<K> {
    for (const [k, v] of this.map) if (v !== undefined) yield k;
  }

  *values(): IterableIterator<V> {
    for (const v of this.map.values()) if (v !== undefined) yield v;
  }

  [Symbol.iterator](): IterableIterator<[K, V]> {
    return this.entries();
  }

  /** A new Map with the live entries only (a new object: its table starts in the young generation). */
  private compact(): void {
    const next = new Map<K, V | undefined>();
    if (this.live > 0) for (const [k, v] of this.map) if (v !== undefined) next.set(k, v);
    this.map = next;
  }
}
