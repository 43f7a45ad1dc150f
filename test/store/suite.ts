/**
 * Goal: one contract for every recovery store. The simulator runs on `MemoryRecoveryStore`
 * and real jobs on `LevelRecoveryStore`; whatever the simulator proves about recovery holds
 * for real jobs only if both stores behave alike, errors included.
 *
 * Method: `recoveryStoreSuite(name, factory)` (abstract-level's pattern) registers the same
 * tests for a store factory. Each test gets a fresh store and its `StoreFaults`, writes parts
 * and lines through the public interfaces, closes and reopens handles as a restarted process
 * would, damages the store through `StoreFaults`, and checks results and error codes
 * (`STORE_NOT_OPEN`, `STORE_LOCKED`, `STORE_CORRUPT`, `STORE_IO`; bad arguments are
 * `RangeError`/`TypeError`). Parts are small (the largest 200 KiB, above the inline limit so
 * blob files are exercised) to keep the suite fast.
 */
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { isLifelineError, type LifelineError, type LifelineErrorCode } from "../../src/errors.ts";
import { crc32 } from "../../src/store/checksum.ts";
import { listLinesIn } from "../../src/store/lines.ts";
import { latestLine, localVerifier, pruneLines, recoverLocal } from "../../src/store/recovery.ts";
import {
  BLOCK_BYTES,
  BLOCKED_BYTES_MIN,
  INLINE_BYTES_MAX,
  type LineManifest,
  type PartRef,
  type RankPartStore,
  type RecoveryStore,
  type StoreFaults,
} from "../../src/store/types.ts";

/** What a factory hands each test. */
export interface StoreFixture {
  readonly store: RecoveryStore;
  readonly faults: StoreFaults;
  /** Frees what the store holds (temporary directories); handles are closed by then. */
  cleanup(): Promise<void>;
}

export type StoreFactory = (opts: { nowMs: () => number }) => Promise<StoreFixture>;

/** Rejects with a LifelineError of `code`; returns it for message checks. */
export async function expectCode(promise: Promise<unknown>, code: LifelineErrorCode): Promise<LifelineError> {
  let caught: unknown;
  try {
    await promise;
  } catch (err) {
    caught = err;
  }
  if (caught === undefined) throw new Error(`expected a rejection with ${code}, but it resolved`);
  if (!isLifelineError(caught, code))
    throw new Error(`expected ${code}, got ${String((caught as { code?: unknown }).code)}: ${String(caught)}`, { cause: caught });
  return caught;
}

/** Deterministic bytes: `n` bytes derived from `seed`. */
export function bytesOf(n: number, seed: number): Buffer {
  const b = Buffer.allocUnsafe(n);
  let x = (seed * 2654435761) >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    b[i] = x & 0xff;
  }
  return b;
}

const SMALL = 100;
const LARGE = 200 * 1024;

export function recoveryStoreSuite(name: string, factory: StoreFactory): void {
  describe(`RecoveryStore contract (${name})`, () => {
    let fx: StoreFixture;
    let store: RecoveryStore;
    let faults: StoreFaults;
    let clock: number;
    const open: { close(): Promise<void> }[] = [];

    beforeEach(async () => {
      clock = 1_700_000_000_000;
      fx = await factory({ nowMs: () => (clock += 1000) });
      store = fx.store;
      faults = fx.faults;
    });
    afterEach(async () => {
      // This test's fixture, taken now: if closing hangs past the hook's timeout, the next
      // test's beforeEach replaces `fx`, and a late cleanup must not remove the next store.
      const mine = fx;
      await Promise.all(open.splice(0).map((h) => h.close()));
      await mine.cleanup();
    });

    async function rank(r: number): Promise<RankPartStore> {
      const h = await store.openRank(r);
      open.push(h);
      return h;
    }
    async function manifest(): Promise<LineManifest> {
      const h = await store.openManifest();
      open.push(h);
      return h;
    }
    async function closeAll(): Promise<void> {
      await Promise.all(open.splice(0).map((h) => h.close()));
    }
    /** Writes and commits line `epoch` for `ranks`, part sizes alternating small/large. */
    async function commit(m: LineManifest, ranks: RankPartStore[], epoch: number): Promise<PartRef[]> {
      const refs = await Promise.all(ranks.map((r) => r.putPart(epoch, bytesOf(r.rank % 2 === 0 ? SMALL : LARGE, epoch * 10 + r.rank))));
      await m.commitLine(epoch, refs);
      return refs;
    }

    describe("blocked parts (BLOCKED_BYTES_MIN and more)", () => {
      /** A large part as a codec makes it: small heads around two large arrays. */
      const chunked = (seed: number): Buffer[] => [
        bytesOf(10, seed),
        bytesOf(BLOCKED_BYTES_MIN + BLOCK_BYTES / 2, seed + 1),
        bytesOf(3, seed + 2),
        bytesOf(INLINE_BYTES_MAX, seed + 3),
        bytesOf(7, seed + 4),
      ];

      it("round-trip byte for byte, chunked or whole, and are listed as blocks (without BlockOptions: a blob)", async () => {
        const p = await rank(0);
        const chunks = chunked(1);
        const whole = Buffer.concat(chunks);
        const a = await p.putPart(1, chunks, undefined, {});
        const b = await p.putPart(2, whole, undefined, {});
        const c = await p.putPart(3, chunks);
        for (const ref of [a, b, c]) {
          expect(ref).toMatchObject({ checksum: crc32(whole), bytes: whole.length });
          expect((await p.readPart(ref)).equals(whole)).toBe(true);
        }
        chunks[1]!.fill(0); // the store kept its own copy
        await closeAll();
        const again = await rank(0);
        expect((await again.readPart(a)).equals(whole)).toBe(true);
        expect((await again.listParts()).map((i) => [i.epoch, i.location])).toEqual([
          [1, "blocks"],
          [2, "blocks"],
          [3, "blob"],
        ]);
      });

      it("share equal blocks: a part that changed in one place reads back whole, before and after the older one goes", async () => {
        const p = await rank(1);
        const first = chunked(5);
        const second = first.map((c) => Buffer.from(c));
        second[1]![BLOCK_BYTES + 17] = second[1]![BLOCK_BYTES + 17]! ^ 0xff;
        const r1 = await p.putPart(1, first, undefined, {});
        const r2 = await p.putPart(2, second, undefined, {});
        expect((await p.readPart(r1)).equals(Buffer.concat(first))).toBe(true);
        expect((await p.readPart(r2)).equals(Buffer.concat(second))).toBe(true);
        expect(await p.retain([2])).toEqual([1]);
        expect((await p.readPart(r2)).equals(Buffer.concat(second))).toBe(true);
        await closeAll(); // the next open deletes what no record names, and nothing else
        const again = await rank(1);
        expect((await again.readPart(r2)).equals(Buffer.concat(second))).toBe(true);
        // Written again for the same epoch (an aborted attempt's leftover): the blocks of the new bytes.
        const r2b = await again.putPart(2, first, undefined, {});
        expect((await again.readPart(r2b)).equals(Buffer.concat(first))).toBe(true);
      });

      it("a flipped byte or a lost block file makes a part unusable (STORE_CORRUPT), never wrong", async () => {
        const p = await rank(0);
        const r1 = await p.putPart(1, chunked(9), undefined, {});
        const r2 = await p.putPart(2, chunked(20), undefined, {});
        await closeAll();
        await faults.corruptPart(0, 1);
        await faults.removePart(0, 2);
        const again = await rank(0);
        expect(await again.checkPart(r1)).toMatchObject({ kind: "corrupt", message: expect.stringMatching(/checksum mismatch/) });
        expect(await again.checkPart(r2)).toMatchObject({ kind: "missing", message: expect.stringMatching(/block file .* does not exist/) });
        await expectCode(again.readPart(r1), "STORE_CORRUPT");
      });
    });

    describe("rank parts", () => {
      it("round-trips empty, inline and blob parts with their checksums", async () => {
        const p = await rank(0);
        const cases = [Buffer.alloc(0), bytesOf(SMALL, 1), bytesOf(INLINE_BYTES_MAX, 2), bytesOf(INLINE_BYTES_MAX + 1, 3), bytesOf(LARGE, 4)];
        const refs = [];
        for (const [epoch, bytes] of cases.entries()) {
          const ref = await p.putPart(epoch, bytes);
          expect(ref).toEqual({ rank: 0, epoch, checksum: crc32(bytes), bytes: bytes.length });
          refs.push(ref);
        }
        for (const [epoch, bytes] of cases.entries()) {
          expect((await p.getPart(epoch))!.equals(bytes)).toBe(true);
          expect((await p.readPart(refs[epoch]!)).equals(bytes)).toBe(true);
          expect(await p.checkPart(refs[epoch]!)).toEqual({ kind: "ok", ref: refs[epoch] });
        }
        const listed = await p.listParts();
        expect(listed.map((i) => [i.epoch, i.bytes, i.location])).toEqual([
          [0, 0, "inline"],
          [1, SMALL, "inline"],
          [2, INLINE_BYTES_MAX, "inline"],
          [3, INLINE_BYTES_MAX + 1, "blob"],
          [4, LARGE, "blob"],
        ]);
        expect(listed.every((i) => i.timeMs > 1_700_000_000_000)).toBe(true);
      });

      it("stores a part given as chunks exactly as the same bytes given whole, inline and in a blob", async () => {
        const p = await rank(1);
        for (const [epoch, size] of [
          [1, SMALL],
          [2, LARGE],
        ] as const) {
          const whole = bytesOf(size, epoch);
          const cuts = [0, 1, Math.floor(size / 3), size - 7, size];
          const chunks = cuts.slice(1).map((end, i) => whole.subarray(cuts[i], end));
          const ref = await p.putPart(epoch, chunks);
          expect(ref).toEqual({ rank: 1, epoch, checksum: crc32(whole), bytes: size });
          expect((await p.readPart(ref)).equals(whole)).toBe(true);
        }
        await expect(p.putPart(3, [Buffer.alloc(1), "text" as unknown as Uint8Array])).rejects.toThrow(TypeError);
      });

      it("keeps parts across close and reopen, as a restarted rank finds them", async () => {
        const p = await rank(3);
        const small = await p.putPart(7, bytesOf(SMALL, 7));
        const large = await p.putPart(8, bytesOf(LARGE, 8));
        await closeAll();
        const again = await rank(3);
        expect((await again.readPart(small)).equals(bytesOf(SMALL, 7))).toBe(true);
        expect((await again.readPart(large)).equals(bytesOf(LARGE, 8))).toBe(true);
        expect(await store.ranks()).toEqual([3]);
      });

      it("replaces a part written again for the same epoch (an aborted attempt's leftover)", async () => {
        const p = await rank(0);
        await p.putPart(5, bytesOf(LARGE, 1));
        const second = await p.putPart(5, bytesOf(LARGE, 2));
        await p.putPart(6, bytesOf(LARGE, 3));
        const third = await p.putPart(6, bytesOf(SMALL, 4)); // blob replaced by an inline part
        expect((await p.readPart(second)).equals(bytesOf(LARGE, 2))).toBe(true);
        expect((await p.readPart(third)).equals(bytesOf(SMALL, 4))).toBe(true);
        expect((await p.listParts()).map((i) => [i.epoch, i.location])).toEqual([
          [5, "blob"],
          [6, "inline"],
        ]);
      });

      it("reports absent parts: getPart undefined, checkPart missing, readPart STORE_CORRUPT", async () => {
        const p = await rank(1);
        const ref: PartRef = { rank: 1, epoch: 9, checksum: 1, bytes: 1 };
        expect(await p.getPart(9)).toBeUndefined();
        expect((await p.checkPart(ref)).kind).toBe("missing");
        const err = await expectCode(p.readPart(ref), "STORE_CORRUPT");
        expect(err.message).toMatch(/rank 1's part of line 9 is missing/);
        expect(err.message).toMatch(/older committed line/);
      });

      it("rejects a part that does not match its commit record", async () => {
        const p = await rank(0);
        const ref = await p.putPart(2, bytesOf(SMALL, 1));
        const err = await expectCode(p.readPart({ ...ref, checksum: (ref.checksum + 1) >>> 0 }), "STORE_CORRUPT");
        expect(err.message).toMatch(/does not match the commit record/);
        expect((await p.checkPart({ ...ref, bytes: 3 })).kind).toBe("corrupt");
      });

      it("never shares stored bytes with the caller", async () => {
        const p = await rank(0);
        for (const [epoch, n] of [
          [1, SMALL],
          [2, LARGE],
        ] as const) {
          const input = bytesOf(n, epoch);
          const ref = await p.putPart(epoch, input);
          input.fill(0);
          const out = await p.readPart(ref);
          out.fill(1);
          expect((await p.readPart(ref)).equals(bytesOf(n, epoch))).toBe(true);
        }
      });

      it("retain() deletes old and aborted parts, keeps newer ones unless dropNewer", async () => {
        const p = await rank(1);
        for (const e of [1, 2, 3, 4, 5, 6]) await p.putPart(e, bytesOf(e % 2 === 0 ? LARGE : SMALL, e));
        expect(await p.retain([])).toEqual([]); // no committed line yet: every part may be in progress
        expect(await p.retain([2, 4])).toEqual([1, 3]);
        expect((await p.listParts()).map((i) => i.epoch)).toEqual([2, 4, 5, 6]);
        expect(await p.retain([4], { dropNewer: true })).toEqual([2, 5, 6]);
        expect((await p.listParts()).map((i) => i.epoch)).toEqual([4]);
        expect(await p.retain([], { dropNewer: true })).toEqual([4]);
        expect(await p.listParts()).toEqual([]);
      });

      it("dropParts() deletes the named epochs' parts, blob files included, and nothing else", async () => {
        const p = await rank(1);
        for (const e of [1, 2, 3]) await p.putPart(e, bytesOf(e === 2 ? LARGE : SMALL, e));
        expect(await p.dropParts([2, 9])).toEqual([2]); // 9 has no part: nothing to drop
        expect((await p.listParts()).map((i) => i.epoch)).toEqual([1, 3]);
        expect(await p.getPart(2)).toBeUndefined();
        expect(await p.dropParts([])).toEqual([]);
        await closeAll();
        const again = await rank(1);
        expect((await again.listParts()).map((i) => i.epoch)).toEqual([1, 3]);
        await expect(again.dropParts([-1])).rejects.toThrow(RangeError);
      });

      it("close() lets writes issued before it finish", async () => {
        const p = await store.openRank(0);
        const writes = [p.putPart(1, bytesOf(LARGE, 1)), p.putPart(2, bytesOf(SMALL, 2)), p.retain([2])];
        await p.close();
        const [, ref2, deleted] = await Promise.all(writes);
        expect(deleted).toEqual([1]);
        const again = await rank(0);
        expect((await again.readPart(ref2 as PartRef)).equals(bytesOf(SMALL, 2))).toBe(true);
        expect((await again.listParts()).map((i) => i.epoch)).toEqual([2]);
      });

      it("an abandoned putPart (its signal aborted) leaves no part, and the store goes on", async () => {
        const p = await rank(0);
        await p.putPart(1, bytesOf(LARGE, 1));
        for (const bytes of [LARGE, SMALL]) {
          const abort = new AbortController();
          const put = p.putPart(2, bytesOf(bytes, 2), abort.signal);
          abort.abort(new Error("the job was released"));
          await expect(put).rejects.toThrow(/the job was released/);
          expect((await p.listParts()).map((i) => i.epoch)).toEqual([1]);
        }
        const ref = await p.putPart(2, bytesOf(LARGE, 3));
        await closeAll();
        const again = await rank(0);
        expect((await again.readPart(ref)).equals(bytesOf(LARGE, 3))).toBe(true);
        expect((await again.listParts()).map((i) => i.epoch)).toEqual([1, 2]);
      });

      it("rejects bad arguments with RangeError/TypeError", async () => {
        const p = await rank(0);
        await expect(p.putPart(-1, Buffer.alloc(1))).rejects.toThrow(RangeError);
        await expect(p.putPart(1.5, Buffer.alloc(1))).rejects.toThrow(RangeError);
        await expect(p.putPart(1, "text" as unknown as Uint8Array)).rejects.toThrow(TypeError);
        await expect(p.getPart(Number.NaN)).rejects.toThrow(RangeError);
        await expect(p.readPart({ rank: 1, epoch: 0, checksum: 0, bytes: 0 })).rejects.toThrow(RangeError);
        await expect(p.retain([-3])).rejects.toThrow(RangeError);
        await expect(store.openRank(-1)).rejects.toThrow(RangeError);
      });
    });

    describe("line manifest", () => {
      it("starts empty", async () => {
        const m = await manifest();
        expect(await m.latestCommitted()).toBeUndefined();
        expect(await m.list()).toEqual([]);
        expect(await m.aborted()).toEqual([]);
        expect((await latestLine(m, localVerifier([]))).line).toBeUndefined();
      });

      it("commits lines in one record each, lists them in epoch order, keeps meta", async () => {
        const m = await manifest();
        const ranks = [await rank(0), await rank(1)];
        const refs1 = await commit(m, ranks, 1);
        const refs = await Promise.all(ranks.map((r) => r.putPart(17, bytesOf(SMALL, r.rank))));
        const line = await m.commitLine(17, [refs[1]!, refs[0]!], { meta: Buffer.from("job=heat") });
        expect(line.epoch).toBe(17);
        expect(line.parts).toEqual(refs);
        expect(line.meta!.toString()).toBe("job=heat");
        expect(line.timeMs).toBeGreaterThan(1_700_000_000_000);
        expect((await m.list()).map((l) => l.epoch)).toEqual([1, 17]);
        expect((await m.list())[0]!.parts).toEqual(refs1);
        expect(await m.latestCommitted()).toEqual(line);
        await closeAll();
        const again = await manifest();
        expect(await again.latestCommitted()).toEqual(line);
      });

      it("records which job and run committed each line", async () => {
        const m = await manifest();
        const ranks = [await rank(0), await rank(1)];
        await commit(m, ranks, 1);
        const refs = await Promise.all(ranks.map((r) => r.putPart(2, bytesOf(SMALL, r.rank))));
        const line = await m.commitLine(2, refs, { job: { id: "heat-3f9a1c2e", run: 2 } });
        expect(line.job).toEqual({ id: "heat-3f9a1c2e", run: 2 });
        await closeAll();
        const again = await manifest();
        expect((await again.list()).map((l) => l.job)).toEqual([undefined, { id: "heat-3f9a1c2e", run: 2 }]);
        await expect(
          again.commitLine(
            3,
            refs.map((r) => ({ ...r, epoch: 3 })),
            { job: { id: "", run: 1 } },
          ),
        ).rejects.toThrow(TypeError);
      });

      it("commits a line of parts of different epochs when asked (independent checkpoints), and reads it back", async () => {
        const m = await manifest();
        const ranks = [await rank(0), await rank(1), await rank(2)];
        const refs = [
          await ranks[0]!.putPart(7, bytesOf(SMALL, 0)),
          await ranks[1]!.putPart(3, bytesOf(SMALL, 1)),
          await ranks[2]!.putPart(1, bytesOf(SMALL, 2)),
        ];
        await expect(m.commitLine(1, refs)).rejects.toThrow(/of line 7, not 1/);
        const line = await m.commitLine(1, refs, { mixed: true, job: { id: "farm-1", run: 1 } });
        expect(line.parts.map((p) => p.epoch)).toEqual([7, 3, 1]);
        await closeAll();
        const again = await manifest();
        expect(await again.latestCommitted()).toEqual(line);
        const parts = [await rank(0), await rank(1), await rank(2)];
        expect((await latestLine(again, localVerifier(parts))).line?.epoch).toBe(1);
      });

      it("keeps the job record: absent at first, replaced by putJob, durable across reopen", async () => {
        const m = await manifest();
        expect(await m.job()).toBeUndefined();
        const job = {
          id: "heat-3f9a1c2e",
          app: "/work/heat.ts",
          args: ["--iters", "400"],
          size: 4,
          mode: "cpr",
          programSha256: "ab".repeat(32),
          createdMs: 1_700_000_000_000,
          run: 1,
          runStartedMs: 1_700_000_000_000,
          launcher: { pid: 1234, host: "node7" },
          state: "running" as const,
        };
        await m.putJob(job);
        expect(await m.job()).toEqual({ ...job, endedMs: undefined, exitCode: undefined });
        await m.putJob({ ...job, state: "finished", endedMs: 1_700_000_100_000, exitCode: 0 });
        await closeAll();
        const again = await manifest();
        expect(await again.job()).toEqual({ ...job, state: "finished", endedMs: 1_700_000_100_000, exitCode: 0 });
        expect(await again.list()).toEqual([]); // the job record is not a line
        await expect(again.putJob({ ...job, state: "gone" as "running" })).rejects.toThrow(TypeError);
        await expect(again.putJob({ ...job, args: [1] as unknown as string[] })).rejects.toThrow(TypeError);
      });

      it("refuses malformed lines with RangeError", async () => {
        const m = await manifest();
        const ref = (rank: number, epoch = 4): PartRef => ({ rank, epoch, checksum: 7, bytes: 10 });
        await expect(m.commitLine(4, [])).rejects.toThrow(RangeError);
        await expect(m.commitLine(4, [ref(0), ref(2)])).rejects.toThrow(/rank 1 is missing/);
        await expect(m.commitLine(4, [ref(0), ref(0)])).rejects.toThrow(/rank 0 appears twice/);
        await expect(m.commitLine(4, [ref(0), ref(1, 3)])).rejects.toThrow(/of line 3, not 4/);
        await expect(m.commitLine(4, [{ ...ref(0), checksum: 2 ** 32 }])).rejects.toThrow(RangeError);
        await expect(m.commitLine(4, [ref(0)], { meta: Buffer.alloc((1 << 20) + 1) })).rejects.toThrow(RangeError);
        await m.commitLine(4, [ref(0)]);
        await expect(m.commitLine(4, [ref(0)])).rejects.toThrow(/not newer than the committed line 4/);
        await expect(m.commitLine(3, [ref(0, 3)])).rejects.toThrow(RangeError);
        await expect(m.prune(0)).rejects.toThrow(RangeError);
      });

      it("abortLine marks a line aborted, and retracts a committed one", async () => {
        const m = await manifest();
        const ranks = [await rank(0)];
        await commit(m, ranks, 1);
        await commit(m, ranks, 2);
        await m.abortLine(3);
        expect(await m.aborted()).toEqual([3]);
        await commit(m, ranks, 3); // a retry of the same epoch commits and clears the marker
        expect(await m.aborted()).toEqual([]);
        await m.abortLine(3);
        expect((await m.list()).map((l) => l.epoch)).toEqual([1, 2]);
        expect(await m.aborted()).toEqual([3]);
        await commit(m, ranks, 3);
        expect((await m.latestCommitted())!.epoch).toBe(3);
      });

      it("prune(keep) deletes all but the newest keep lines and older abort markers", async () => {
        const m = await manifest();
        const ranks = [await rank(0)];
        await commit(m, ranks, 1);
        await m.abortLine(2);
        await commit(m, ranks, 3);
        await m.abortLine(4);
        await commit(m, ranks, 5);
        expect(await m.prune(5)).toEqual([]);
        expect(await m.prune(2)).toEqual([1]);
        expect((await m.list()).map((l) => l.epoch)).toEqual([3, 5]);
        expect(await m.aborted()).toEqual([4]);
        expect(await m.prune(1)).toEqual([3]);
        expect(await m.aborted()).toEqual([]);
        expect(await m.prune(1)).toEqual([]);
        expect((await m.latestCommitted())!.epoch).toBe(5);
      });
    });

    describe("errors", () => {
      it("rejects every call after close() with STORE_NOT_OPEN; close twice is fine", async () => {
        const p = await rank(0);
        const m = await manifest();
        const ref = await p.putPart(1, bytesOf(SMALL, 1));
        await m.commitLine(1, [ref]);
        await p.close();
        await p.close();
        await m.close();
        await m.close();
        await expectCode(p.putPart(2, Buffer.alloc(1)), "STORE_NOT_OPEN");
        await expectCode(p.getPart(1), "STORE_NOT_OPEN");
        await expectCode(p.readPart(ref), "STORE_NOT_OPEN");
        await expectCode(p.checkPart(ref), "STORE_NOT_OPEN");
        await expectCode(p.listParts(), "STORE_NOT_OPEN");
        await expectCode(p.retain([1]), "STORE_NOT_OPEN");
        await expectCode(m.commitLine(2, [{ ...ref, epoch: 2 }]), "STORE_NOT_OPEN");
        await expectCode(m.abortLine(2), "STORE_NOT_OPEN");
        await expectCode(m.latestCommitted(), "STORE_NOT_OPEN");
        await expectCode(m.list(), "STORE_NOT_OPEN");
        await expectCode(m.aborted(), "STORE_NOT_OPEN");
        await expectCode(m.prune(1), "STORE_NOT_OPEN");
        const err = await expectCode(latestLine(m, localVerifier([p])), "STORE_NOT_OPEN");
        expect(err.message).toMatch(/closed/);
      });

      it("lets one holder at a time open a rank or the manifest (STORE_LOCKED names the path)", async () => {
        const p = await rank(2);
        await manifest();
        const e1 = await expectCode(store.openRank(2), "STORE_LOCKED");
        expect(e1.message).toContain(p.location);
        const e2 = await expectCode(store.openManifest(), "STORE_LOCKED");
        expect(e2.message).toMatch(/manifest/);
        await rank(3); // other ranks are independent
        await closeAll();
        await rank(2);
        await manifest();
      });

      it("reports a failing disk as STORE_IO with the OS error as cause", async () => {
        const p = await rank(1);
        await faults.breakBlobs(1);
        const err = await expectCode(p.putPart(1, bytesOf(LARGE, 1)), "STORE_IO");
        expect((err.cause as { code?: string }).code).toBe("ENOTDIR");
        expect(err.message).toMatch(/rank 1: writing its part of line 1/);
        const ref = await p.putPart(2, bytesOf(SMALL, 2)); // inline parts do not touch blob files
        expect((await p.readPart(ref)).equals(bytesOf(SMALL, 2))).toBe(true);
        expect((await p.listParts()).map((i) => i.epoch)).toEqual([2]);
      });

      it("reports a damaged commit record as STORE_CORRUPT naming the line, never a crash", async () => {
        const m = await manifest();
        const ranks = [await rank(0), await rank(1)];
        await commit(m, ranks, 1);
        await commit(m, ranks, 2);
        await closeAll();
        await faults.corruptLineRecord(2);
        const again = await manifest();
        for (const call of [() => again.list(), () => again.latestCommitted(), () => latestLine(again, localVerifier([]))]) {
          const err = await expectCode(call(), "STORE_CORRUPT");
          expect(err.message).toMatch(/commit record of line 2/);
          expect(err.message).toMatch(/move the store directory aside/);
        }
        // Writing still works, and pruning past the damaged record clears it.
        const fresh = [await rank(0), await rank(1)];
        await commit(again, fresh, 3);
        expect(await again.prune(1)).toEqual([1, 2]);
        expect((await again.list()).map((l) => l.epoch)).toEqual([3]);
      });
    });

    describe("recovery", () => {
      async function threeLines(): Promise<void> {
        const m = await manifest();
        const ranks = [await rank(0), await rank(1), await rank(2)];
        for (const e of [1, 2, 3]) await commit(m, ranks, e);
        await closeAll();
      }
      async function choose(): Promise<Awaited<ReturnType<typeof latestLine>>> {
        const m = await manifest();
        const ranks = [await rank(0), await rank(1), await rank(2)];
        return latestLine(m, localVerifier(ranks));
      }

      it("recovers from the newest committed line when all its parts verify", async () => {
        await threeLines();
        const choice = await choose();
        expect(choice.line!.epoch).toBe(3);
        expect(choice.warnings).toEqual([]);
      });

      it.each([
        ["a damaged blob part", (f: StoreFaults) => f.corruptPart(1, 3), /rank 1's part of line 3 is damaged: checksum mismatch/],
        ["a damaged inline part", (f: StoreFaults) => f.corruptPart(2, 3), /rank 2's part of line 3 .*record checksum mismatch/],
        ["a missing blob file", (f: StoreFaults) => f.removePart(1, 3), /rank 1's part of line 3 is missing: blob file .* does not exist/],
        ["a missing inline part", (f: StoreFaults) => f.removePart(0, 3), /rank 0's part of line 3 is missing: no part record/],
      ])("falls back to the previous line, with a warning, on %s", async (_what, damage, pattern) => {
        await threeLines();
        await damage(faults);
        const choice = await choose();
        expect(choice.line!.epoch).toBe(2);
        expect(choice.skipped.map((s) => s.epoch)).toEqual([3]);
        expect(choice.warnings).toHaveLength(1);
        expect(choice.warnings[0]).toMatch(/^recovery line 3 is unusable, falling back to line 2: /);
        expect(choice.warnings[0]).toMatch(pattern);
      });

      it("starts from the beginning when no committed line verifies", async () => {
        await threeLines();
        for (const e of [1, 2, 3]) await faults.corruptPart(1, e);
        const choice = await choose();
        expect(choice.line).toBeUndefined();
        expect(choice.warnings).toHaveLength(3);
        expect(choice.warnings[0]).toMatch(/recovery line 3 is unusable, no older committed line verifies/);
      });

      it("recoverLocal retracts unusable lines and deletes parts of lines that will never be used", async () => {
        await threeLines();
        {
          // Leftovers: a line in progress at the crash (4), and rank 2's part of line 3 gone.
          const r0 = await rank(0);
          await r0.putPart(4, bytesOf(LARGE, 4));
          await closeAll();
          await faults.removePart(2, 3);
        }
        const m = await manifest();
        const ranks = [await rank(0), await rank(1), await rank(2)];
        const choice = await recoverLocal(m, ranks);
        expect(choice.line!.epoch).toBe(2);
        expect(choice.warnings).toHaveLength(1);
        expect((await m.list()).map((l) => l.epoch)).toEqual([1, 2]);
        expect(await m.aborted()).toEqual([3]);
        for (const r of ranks) expect((await r.listParts()).map((i) => i.epoch)).toEqual([1, 2]);
        await recoverLocal(m, ranks, { keep: 1 }); // a second start with pruning
        expect((await m.list()).map((l) => l.epoch)).toEqual([2]);
        for (const r of ranks) expect((await r.listParts()).map((i) => i.epoch)).toEqual([2]);
        await expect(recoverLocal(m, ranks, { keep: 0 })).rejects.toThrow(RangeError);
        // The job resumes from line 2 and commits line 3 again.
        await commit(m, ranks, 3);
        expect((await latestLine(m, localVerifier(ranks))).line!.epoch).toBe(3);
      });

      it("recoverLocal refuses a store written by a job of another size, changing nothing", async () => {
        await threeLines();
        const m = await manifest();
        const ranks = [await rank(0), await rank(1)];
        await expect(recoverLocal(m, ranks)).rejects.toThrow(/lines of a 3-rank job, this job has 2 ranks/);
        expect((await m.list()).map((l) => l.epoch)).toEqual([1, 2, 3]);
        expect((await ranks[0]!.listParts()).map((i) => i.epoch)).toEqual([1, 2, 3]);
      });

      it("pruneLines keeps the newest lines in the manifest and in every rank", async () => {
        const m = await manifest();
        const ranks = [await rank(0), await rank(1)];
        for (const e of [1, 2, 3, 4]) {
          await commit(m, ranks, e);
          await pruneLines(m, ranks, 2);
        }
        await ranks[0]!.putPart(5, bytesOf(SMALL, 5)); // in progress: untouched by pruning
        expect(await pruneLines(m, ranks, 2)).toEqual([]);
        expect((await m.list()).map((l) => l.epoch)).toEqual([3, 4]);
        expect((await ranks[0]!.listParts()).map((i) => i.epoch)).toEqual([3, 4, 5]);
        expect((await ranks[1]!.listParts()).map((i) => i.epoch)).toEqual([3, 4]);
      });
    });

    describe("listing", () => {
      it("lists committed, corrupt and partial lines, and releases every lock", async () => {
        const m = await manifest();
        const ranks = [await rank(0), await rank(1)];
        for (const e of [1, 2]) await commit(m, ranks, e);
        await ranks[1]!.putPart(3, bytesOf(LARGE, 3));
        await m.abortLine(3);
        await ranks[0]!.putPart(4, bytesOf(SMALL, 4));
        await closeAll();
        await faults.corruptPart(1, 2);
        const report = await listLinesIn(store);
        expect(report.rows.map((r) => [r.epoch, r.state, r.ranks, r.ranksTotal])).toEqual([
          [1, "committed", 2, 2],
          [2, "corrupt", 2, 2],
          [3, "partial", 1, 2],
          [4, "partial", 1, 2],
        ]);
        expect(report.rows[0]!.bytes).toBe(SMALL + LARGE);
        expect(report.rows[1]!.notes.join()).toMatch(/rank 1's part of line 2 is damaged/);
        expect(report.rows[2]!.notes).toEqual(["aborted"]);
        expect(report.warnings).toEqual([]);
        const unverified = await listLinesIn(store, { verify: false });
        expect(unverified.rows[1]!.state).toBe("committed");
        await manifest(); // nothing left locked
        await rank(0);
      });

      it("is STORE_LOCKED while a job holds the store", async () => {
        await manifest();
        await expectCode(listLinesIn(store), "STORE_LOCKED");
      });
    });
  });
}
