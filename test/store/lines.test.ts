/**
 * Goal: `lifeline lines` lists a running job's store truthfully although the job commits and
 * prunes lines while it reads: a line pruned meanwhile is left out (not reported damaged), and
 * a line committed meanwhile is listed as committed (not as partial).
 *
 * Method: a MemoryRecoveryStore whose manifest, when the listing closes it, sees the "job"
 * commit line 3 and prune to the newest two lines (deleting line 1's parts) before the
 * listing reads the ranks' parts: exactly the interleaving a busy job gives a lockless reader.
 * And a listing that read a rank's parts before that rank wrote its part of a line committed
 * meanwhile is taken again (listLinesRetrying), as `lifeline lines` does with new snapshots.
 */
import { describe, expect, it } from "vitest";
import { LIST_ATTEMPTS, listLinesIn, listLinesRetrying } from "../../src/store/lines.ts";
import { MemoryRecoveryStore } from "../../src/store/memory-store.ts";
import type { LineManifest, PartRef, RankPartStore, RecoveryStore } from "../../src/store/types.ts";
import { bytesOf } from "./suite.ts";

const RANKS = 2;

async function writeLine(store: MemoryRecoveryStore, epoch: number, commit: boolean): Promise<void> {
  const refs: PartRef[] = [];
  for (let r = 0; r < RANKS; r++) {
    const p = await store.openRank(r);
    refs.push(await p.putPart(epoch, bytesOf(1000, epoch * 10 + r)));
    await p.close();
  }
  if (!commit) return;
  const m = await store.openManifest();
  await m.commitLine(epoch, refs);
  await m.close();
}

describe("lifeline lines while the job commits and prunes", () => {
  it("leaves out a line pruned during the listing and lists one committed during it as committed", async () => {
    const store = new MemoryRecoveryStore({ name: "busy" });
    await writeLine(store, 1, true);
    await writeLine(store, 2, true);
    await writeLine(store, 3, false); // written, not committed yet
    let first = true;
    const busy: RecoveryStore = Object.create(store) as RecoveryStore;
    busy.openManifest = async (): Promise<LineManifest> => {
      const m = await store.openManifest();
      if (!first) return m;
      first = false;
      const close = m.close.bind(m);
      m.close = async () => {
        await close();
        // The job, between the listing's read of the manifest and its read of the parts.
        const job = await store.openManifest();
        const line3 = [];
        for (let r = 0; r < RANKS; r++) {
          const p = await store.openRank(r);
          line3.push(await p.listParts());
          await p.close();
        }
        await job.commitLine(
          3,
          line3.map((parts, r) => {
            const p = parts.find((i) => i.epoch === 3)!;
            return { rank: r, epoch: 3, checksum: p.checksum, bytes: p.bytes };
          }),
        );
        await job.prune(2);
        await job.close();
        for (let r = 0; r < RANKS; r++) {
          const p = await store.openRank(r);
          await p.retain([2, 3]);
          await p.close();
        }
      };
      return m;
    };
    const report = await listLinesIn(busy);
    expect(report.rows.map((r) => [r.epoch, r.state])).toEqual([
      [2, "committed"],
      [3, "committed"],
    ]);
    expect(report.warnings).toEqual([]);
  });
});

/**
 * A view of `store` as a lockless reader takes it while the job commits line `epoch` (its parts
 * are written already): the manifest is read before the commit, and rank 0's parts were read
 * before rank 0 wrote its part of that line. `commit` carries the commit out when the listing
 * closes the manifest, as the job does meanwhile.
 */
function earlyView(store: MemoryRecoveryStore, epoch: number, commit: () => Promise<void>): RecoveryStore {
  const view: RecoveryStore = Object.create(store) as RecoveryStore;
  let first = true;
  view.openManifest = async (): Promise<LineManifest> => {
    const m = await store.openManifest();
    if (!first) return m;
    first = false;
    // Read before the commit: without the line even when an earlier listing saw it committed.
    const list = m.list.bind(m);
    m.list = async () => (await list()).filter((l) => l.epoch !== epoch);
    const close = m.close.bind(m);
    m.close = async () => {
      await close();
      await commit();
    };
    return m;
  };
  view.openRank = async (rank: number): Promise<RankPartStore> => {
    const p = await store.openRank(rank);
    if (rank !== 0) return p;
    const early: RankPartStore = Object.create(p) as RankPartStore;
    early.listParts = async () => (await p.listParts()).filter((i) => i.epoch !== epoch);
    early.checkPart = async (ref) =>
      ref.epoch === epoch ? { kind: "missing" as const, ref, message: `rank 0's part of line ${epoch} is missing` } : p.checkPart(ref);
    return early;
  };
  return view;
}

describe("lifeline lines retries a listing that a running job outpaced", () => {
  async function lineThreeReady(): Promise<{ store: MemoryRecoveryStore; commit: () => Promise<void> }> {
    const store = new MemoryRecoveryStore({ name: "outpaced" });
    await writeLine(store, 1, true);
    await writeLine(store, 2, true);
    await writeLine(store, 3, false);
    let done = false;
    const commit = async (): Promise<void> => {
      if (done) return;
      done = true;
      const refs: PartRef[] = [];
      for (let r = 0; r < RANKS; r++) {
        const p = await store.openRank(r);
        const info = (await p.listParts()).find((i) => i.epoch === 3)!;
        refs.push({ rank: r, epoch: 3, checksum: info.checksum, bytes: info.bytes });
        await p.close();
      }
      const m = await store.openManifest();
      await m.commitLine(3, refs);
      await m.close();
    };
    return { store, commit };
  }

  it("takes the listing again when a line committed meanwhile cannot be verified from the parts as read", async () => {
    const { store, commit } = await lineThreeReady();
    let opened = 0;
    const report = await listLinesRetrying(() => {
      opened++;
      return { store: opened === 1 ? earlyView(store, 3, commit) : store };
    });
    expect(opened).toBe(2);
    expect(report.rows.map((r) => [r.epoch, r.state])).toEqual([
      [1, "committed"],
      [2, "committed"],
      [3, "committed"],
    ]);
  });

  it("after its last attempt lists such a line as partial, committed while it was listed", async () => {
    const { store, commit } = await lineThreeReady();
    let opened = 0;
    const report = await listLinesRetrying(() => {
      opened++;
      return { store: earlyView(store, 3, commit) };
    });
    expect(opened).toBe(LIST_ATTEMPTS);
    expect(report.rows.map((r) => [r.epoch, r.state, r.notes])).toEqual([
      [1, "committed", []],
      [2, "committed", []],
      [3, "partial", ["committed while it was listed"]],
    ]);
  });

  it("a store whose committed lines are damaged is listed once, as corrupt", async () => {
    const { store } = await lineThreeReady();
    const damaged: RecoveryStore = Object.create(store) as RecoveryStore;
    damaged.openRank = async (rank: number): Promise<RankPartStore> => {
      const p = await store.openRank(rank);
      const bad: RankPartStore = Object.create(p) as RankPartStore;
      bad.checkPart = async (ref) => ({ kind: "corrupt" as const, ref, message: `rank ${rank}'s part of line ${ref.epoch}: checksum mismatch` });
      return bad;
    };
    let opened = 0;
    const report = await listLinesRetrying(() => {
      opened++;
      return { store: damaged };
    });
    expect(opened).toBe(1);
    expect(report.rows.map((r) => r.state)).toEqual(["corrupt", "corrupt", "partial"]);
  });

  it("a listing that is not stale is taken once", async () => {
    const { store } = await lineThreeReady();
    let opened = 0;
    const report = await listLinesRetrying(() => {
      opened++;
      return { store };
    });
    expect(opened).toBe(1);
    expect(report.rows.map((r) => r.state)).toEqual(["committed", "committed", "partial"]);
  });
});
