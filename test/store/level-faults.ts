/**
 * `StoreFaults` for a `LevelRecoveryStore` directory: the same damage the memory store can
 * simulate, done to the real files (blob files edited in place, LevelDB records rewritten
 * through a raw LevelDB handle). Act on ranks and manifests that are closed, except
 * `breakBlobs`, which acts under an open rank store.
 *
 * @example
 * const faults = new LevelStoreFaults(dir);
 * await faults.corruptPart(1, 7);
 */
import { open, rm, unlink, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { Level } from "level";
import { BLOB_HEADER_BYTES, decodeRecord, lineKey, partKey } from "../../src/store/records.ts";
import type { StoreFaults } from "../../src/store/types.ts";
import { LevelRecoveryStore } from "../../src/store/level-store.ts";
import { middleBlock } from "../../src/store/memory-store.ts";
import { bytesOf } from "./suite.ts";

export class LevelStoreFaults implements StoreFaults {
  constructor(private readonly dir: string) {}

  async corruptPart(rank: number, epoch: number): Promise<void> {
    await this.withDb(join(this.dir, `rank-${rank}`, "parts"), async (db) => {
      const value = await db.get(partKey(epoch));
      if (value === undefined) throw new Error(`rank ${rank} has no part of line ${epoch}`);
      const rec = decodeRecord(value, "fault injection");
      const blob = rec["blob"] ?? middleBlock(rec);
      if (typeof blob === "string") {
        const path = join(this.dir, `rank-${rank}`, "blobs", blob);
        const fh = await open(path, "r+");
        try {
          const size = (await fh.stat()).size;
          await flipByteInFile(fh, BLOB_HEADER_BYTES + Math.floor((size - BLOB_HEADER_BYTES) / 2));
        } finally {
          await fh.close();
        }
      } else {
        value[Math.floor(value.length / 2)]! ^= 0xff;
        await db.put(partKey(epoch), value, { sync: true });
      }
    });
  }

  async removePart(rank: number, epoch: number): Promise<void> {
    await this.withDb(join(this.dir, `rank-${rank}`, "parts"), async (db) => {
      const value = await db.get(partKey(epoch));
      if (value === undefined) throw new Error(`rank ${rank} has no part of line ${epoch}`);
      const rec = decodeRecord(value, "fault injection");
      const blob = rec["blob"] ?? middleBlock(rec);
      if (typeof blob === "string") await unlink(join(this.dir, `rank-${rank}`, "blobs", blob));
      else await db.del(partKey(epoch), { sync: true });
    });
  }

  async corruptLineRecord(epoch: number): Promise<void> {
    await this.withDb(join(this.dir, "manifest"), async (db) => {
      const value = await db.get(lineKey(epoch));
      if (value === undefined) throw new Error(`line ${epoch} has no commit record`);
      value[Math.floor(value.length / 2)]! ^= 0xff;
      await db.put(lineKey(epoch), value, { sync: true });
    });
  }

  async breakBlobs(rank: number): Promise<void> {
    // A regular file where the blob directory was: creating a blob fails with ENOTDIR.
    const blobs = join(this.dir, `rank-${rank}`, "blobs");
    await rm(blobs, { recursive: true, force: true });
    await writeFile(blobs, "not a directory\n");
  }

  private async withDb(path: string, fn: (db: Level<string, Buffer>) => Promise<void>): Promise<void> {
    const db = new Level<string, Buffer>(path, { keyEncoding: "utf8", valueEncoding: "buffer", createIfMissing: false });
    await db.open();
    try {
      await fn(db);
    } finally {
      await db.close();
    }
  }
}

async function flipByteInFile(fh: Awaited<ReturnType<typeof open>>, at: number): Promise<void> {
  const b = Buffer.alloc(1);
  await fh.read(b, 0, 1, at);
  b[0] = b[0]! ^ 0xff;
  await fh.write(b, 0, 1, at);
  await fh.sync();
}

/**
 * Makes `dir` a store with lines 1..3 of two ranks (rank 1's parts are blobs), all handles
 * closed; resolves to `dir`.
 */
export async function populateStore(dir: string): Promise<string> {
  const store = new LevelRecoveryStore(dir);
  const m = await store.openManifest();
  const ranks = [await store.openRank(0), await store.openRank(1)];
  for (const e of [1, 2, 3]) {
    const refs = await Promise.all(ranks.map((r) => r.putPart(e, bytesOf(r.rank === 0 ? 100 : 100_000, e))));
    await m.commitLine(e, refs);
  }
  await m.close();
  for (const r of ranks) await r.close();
  return dir;
}

/** The block files rank `rank`'s part records name (see BLOCKED_BYTES_MIN), read with the store closed. */
export async function blockFilesNamed(dir: string, rank: number): Promise<string[]> {
  const db = new Level<string, Buffer>(join(dir, `rank-${rank}`, "parts"), { keyEncoding: "utf8", valueEncoding: "buffer", createIfMissing: false });
  await db.open();
  const named = new Set<string>();
  try {
    for await (const [, value] of db.iterator()) {
      const blocks = decodeRecord(value, "block listing")["blocks"];
      if (Array.isArray(blocks)) for (const g of blocks as { f?: unknown }[]) if (typeof g.f === "string") named.add(g.f);
    }
  } finally {
    await db.close();
  }
  return [...named];
}
