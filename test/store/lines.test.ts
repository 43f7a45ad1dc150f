/**
 * Goal: `lifeline lines` lists a running job's store truthfully although the job commits and
 * prunes lines while it reads: a line pruned meanwhile is left out (not reported damaged), and
 * a line committed meanwhile is listed as committed (not as partial).
 *
 * Method: a MemoryRecoveryStore whose manifest, when the listing closes it, sees the "job"
 * commit line 3 and prune to the newest two lines (deleting line 1's parts) before the
 * listing reads the ranks' parts: exactly the interleaving a busy job gives a lockless reader.
 */
import { describe, expect, it } from "vitest";
import { listLinesIn } from "../../src/store/lines.ts";
import { MemoryRecoveryStore } from "../../src/store/memory-store.ts";
import type { LineManifest, PartRef, RecoveryStore } from "../../src/store/types.ts";
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
