/**
 * Goal: a rank's stores on its host (src/cpr/coordinated/host-stores.ts), on a real LevelDB:
 * the scan a restart asks one rank per host for lists every verified part in the host's store
 * — its own, other ranks' own databases, the partner copies — with where each is; a damaged
 * part is left out; other ranks' databases are opened only for the moment (their owners open
 * them afterwards); reads are verified; a database name that is not one is refused.
 */
import { mkdtemp, rm, writeFile, readdir } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { rankStores } from "../../src/cpr/coordinated/host-stores.ts";
import { formatLines, listLines } from "../../src/store/lines.ts";
import { LevelRecoveryStore } from "../../src/store/level-store.ts";

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "lifeline-hoststores-"));
});
afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

describe("rankStores", () => {
  it("scans the host's whole store: own parts, other ranks' parts and partner copies, each with its database", async () => {
    const r0 = rankStores(root, 0);
    const r1 = rankStores(root, 1);
    const p0 = await (await r0.open()).putPart(3, Buffer.from("zero"));
    const p1 = await (await r1.open()).putPart(3, Buffer.from("one"));
    const c2 = await (await r0.hostStores.held(2)).putPart(3, Buffer.from("copy of two"));
    // Rank 1's process is gone (its databases closed); rank 0 reads the host for the launcher.
    await (await r1.open()).close();
    const { parts, problems } = await r0.hostStores.scan();
    expect(problems).toEqual([]);
    expect(parts).toEqual([
      { ref: { rank: 0, epoch: 3, checksum: p0.checksum, bytes: 4 }, where: "rank-0" },
      { ref: { rank: 1, epoch: 3, checksum: p1.checksum, bytes: 3 }, where: "rank-1" },
      { ref: { rank: 2, epoch: 3, checksum: c2.checksum, bytes: 11 }, where: "held-by-0/rank-2" },
    ]);
    expect((await r0.hostStores.read("held-by-0/rank-2", parts[2]!.ref)).toString()).toBe("copy of two");
    expect((await r0.hostStores.read("rank-1", parts[1]!.ref)).toString()).toBe("one");
    // Rank 1's database was opened for the moment only: its owner opens it again.
    const again = rankStores(root, 1);
    expect((await (await again.open()).getPart(3))?.toString()).toBe("one");
    await (await again.open()).close();
    await (await r0.open()).close();
    await r0.hostStores.close();
  });

  it("leaves out a damaged part, and refuses a database name that is not one", async () => {
    const r0 = rankStores(root, 0);
    const big = Buffer.alloc(200_000, 7); // large parts live in blob files
    await (await r0.open()).putPart(4, big);
    await (await r0.open()).close();
    const blobs = join(root, "rank-0", "blobs");
    for (const f of await readdir(blobs)) await writeFile(join(blobs, f), Buffer.alloc(10));
    const r0b = rankStores(root, 0);
    expect((await r0b.hostStores.scan()).parts).toEqual([]);
    await expect(r0b.hostStores.read("../../etc/rank-1", { rank: 1, epoch: 1, checksum: 0, bytes: 0 })).rejects.toThrow(/not a database of the store/);
    await r0b.hostStores.close();
  });

  it("lifeline lines on one host of a per-host store: a line whose other parts are on other hosts is spread, not corrupt; copies count", async () => {
    const r0 = rankStores(root, 0);
    const r1 = rankStores(root, 1);
    const refs = [
      await (await r0.open()).putPart(1, Buffer.from("p0")),
      await (await r1.open()).putPart(1, Buffer.from("p1")),
      await (await r0.hostStores.held(2)).putPart(1, Buffer.from("p2")),
    ];
    const ref3 = { rank: 3, epoch: 1, checksum: 12345, bytes: 2 };
    for (const s of [await r0.open(), await r1.open()]) await s.close();
    await r0.hostStores.close();
    const manifest = await new LevelRecoveryStore(root).openManifest();
    await manifest.commitLine(1, [...refs.map((r, i) => ({ ...r, rank: i })), ref3]);
    await manifest.close();
    const report = await listLines(root);
    expect(report.rows).toEqual([expect.objectContaining({ epoch: 1, state: "spread", ranks: 3, ranksTotal: 4 })]);
    expect(formatLines(report)).toContain("line 1: the part of rank 3 is not on this host (a per-host store: run `lifeline lines` on that rank's host)");
  });
});
