/**
 * Goal: the LevelDB/file store keeps the store contract, and what only a directory on disk
 * can get wrong is handled: directories that are not stores, damaged LevelDB files, stray and
 * half-written files, read-only inspection, the listing command.
 *
 * Method: the shared contract suite (`suite.ts`) against `LevelRecoveryStore` in fresh temp
 * directories (damage done by `LevelStoreFaults`), then tests that edit the store's files
 * directly and check the codes (STORE_NOT_FOUND, STORE_IO, STORE_CORRUPT) and that nothing
 * crashes. Cross-process locking and kill -9 are in crash.test.ts.
 */
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readdir, readFile, rm, truncate, writeFile, open, cp, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isLifelineError } from "../../src/errors.ts";
import { crc32, crc32Portable, crc32Yielding, sliced } from "../../src/store/checksum.ts";
import { ERROR_FILE_NAME, LevelRecoveryStore, STORE_MARKER } from "../../src/store/level-store.ts";
import { BLOCK_BYTES, BLOCKED_BYTES_MIN, type KnownSha256 } from "../../src/store/types.ts";
import { formatLines, listLines } from "../../src/store/lines.ts";
import { latestLine, localVerifier, pruneLines } from "../../src/store/recovery.ts";
import { LevelStoreFaults, populateStore } from "./level-faults.ts";
import { bytesOf, expectCode, recoveryStoreSuite } from "./suite.ts";

let root: string;
let n = 0;
beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "lifeline-store-"));
});
afterAll(async () => {
  await rm(root, { recursive: true, force: true });
});
function freshDir(): string {
  return join(root, `s${n++}`);
}

recoveryStoreSuite("level", async ({ nowMs }) => {
  const dir = freshDir();
  return {
    store: new LevelRecoveryStore(dir, { nowMs }),
    faults: new LevelStoreFaults(dir),
    cleanup: () => rm(dir, { recursive: true, force: true }),
  };
});

/** A store with lines 1..3 of two ranks (rank 1's parts are blobs), all handles closed. */
function populated(): Promise<string> {
  return populateStore(freshDir());
}

async function overwriteMiddle(path: string, bytes: number): Promise<void> {
  const size = (await stat(path)).size;
  const fh = await open(path, "r+");
  try {
    await fh.write(bytesOf(Math.min(bytes, size), 99), 0, Math.min(bytes, size), Math.max(0, Math.floor(size / 2) - bytes / 2));
  } finally {
    await fh.close();
  }
}

describe("LevelRecoveryStore on disk", () => {
  it("uses CRC-32, with a portable fallback that agrees with zlib", () => {
    const b = bytesOf(100_003, 5);
    expect(crc32(Buffer.from("123456789"))).toBe(0xcbf43926);
    expect(crc32Portable(b)).toBe(crc32(b));
    expect(crc32Portable(b.subarray(500), crc32Portable(b.subarray(0, 500)))).toBe(crc32(b));
  });

  it("computes a checksum over chunks in slices, yielding to the event loop only once a turn's time went by", async () => {
    const b = bytesOf(100_003, 7);
    const chunks = [b.subarray(0, 10), b.subarray(10, 40_000), b.subarray(40_000)];
    for (const turnMs of [0, 8, Infinity]) expect(await crc32Yielding(chunks, { sliceBytes: 4096, turnMs })).toBe(crc32(b));
    // Slices in order, none longer than asked; how many turns the loop got in between.
    const turns = async (turnMs: number): Promise<{ seen: number; turns: number }> => {
      let seen = 0;
      let turns = 0;
      let ticking = true;
      const tick = (): void => {
        if (!ticking) return;
        turns++;
        setImmediate(tick);
      };
      setImmediate(tick);
      await sliced(
        chunks,
        (slice) => {
          expect(slice.byteLength).toBeLessThanOrEqual(4096);
          expect(Buffer.from(slice).equals(b.subarray(seen, seen + slice.byteLength))).toBe(true);
          seen += slice.byteLength;
        },
        { sliceBytes: 4096, turnMs },
      );
      ticking = false;
      return { seen, turns };
    };
    const every = await turns(0);
    const never = await turns(Infinity);
    expect(every.seen).toBe(b.length);
    expect(never.seen).toBe(b.length);
    expect(every.turns).toBeGreaterThanOrEqual(20); // a turn between slices: 27 slices
    expect(never.turns).toBe(0); // one synchronous pass
  });

  it("marks a new directory as a store and lays out manifest and rank directories", async () => {
    const dir = freshDir();
    const store = new LevelRecoveryStore(dir);
    const m = await store.openManifest();
    const p = await store.openRank(2);
    await p.putPart(1, bytesOf(100_000, 1));
    await m.close();
    await p.close();
    expect(JSON.parse(await readFile(join(dir, STORE_MARKER), "utf8"))).toEqual({ format: "lifeline-store", version: 1 });
    expect((await readdir(dir)).sort()).toEqual([STORE_MARKER, "manifest", "rank-2"]);
    expect((await readdir(join(dir, "rank-2"))).sort()).toEqual(["blobs", "parts"]);
    const [blob] = await readdir(join(dir, "rank-2", "blobs"));
    expect(blob).toMatch(/^0000000000000001-[0-9a-f]{8}\.part$/);
    const file = await readFile(join(dir, "rank-2", "blobs", blob!));
    expect(file.subarray(0, 6).toString()).toBe("LLPART");
    expect(file.length).toBe(64 + 100_000);
    expect(await store.ranks()).toEqual([2]);
  });

  it("refuses directories that are not stores with STORE_NOT_FOUND", async () => {
    const foreign = freshDir();
    await mkdir(foreign, { recursive: true });
    await writeFile(join(foreign, "thesis.tex"), "precious\n");
    const e1 = await expectCode(new LevelRecoveryStore(foreign).openManifest(), "STORE_NOT_FOUND");
    expect(e1.message).toMatch(/not empty \(thesis\.tex\).*refusing/);
    expect(existsSync(join(foreign, "manifest"))).toBe(false);
    const e2 = await expectCode(listLines(foreign), "STORE_NOT_FOUND");
    expect(e2.message).toContain(`no Lifeline store at ${foreign}`);
    const e3 = await expectCode(listLines(join(root, "does-not-exist")), "STORE_NOT_FOUND");
    expect(e3.message).toMatch(/does not exist/);
    const e4 = await expectCode(new LevelRecoveryStore(join(foreign, "thesis.tex")).openRank(0), "STORE_NOT_FOUND");
    expect(e4.message).toMatch(/not a directory/);
    // The launcher's failure record is the store's own: a job in mode none (or one that failed
    // before its first checkpoint) leaves it in a directory that never became a store, and the
    // next job with a store there must not refuse the directory.
    const failedBefore = freshDir();
    await mkdir(failedBefore);
    await writeFile(join(failedBefore, ERROR_FILE_NAME), "{}\n");
    await writeFile(join(failedBefore, `${ERROR_FILE_NAME}.4242.tmp`), "{");
    await (await new LevelRecoveryStore(failedBefore).openManifest()).close();
    expect(existsSync(join(failedBefore, STORE_MARKER))).toBe(true);
    // Only that name: a look-alike is someone else's file.
    const lookAlike = freshDir();
    await mkdir(lookAlike);
    await writeFile(join(lookAlike, `${ERROR_FILE_NAME}.old`), "x");
    await expectCode(new LevelRecoveryStore(lookAlike).openManifest(), "STORE_NOT_FOUND");
    // An empty directory is fine: it becomes a store.
    const empty = freshDir();
    await mkdir(empty);
    await (await new LevelRecoveryStore(empty).openManifest()).close();
    expect(existsSync(join(empty, STORE_MARKER))).toBe(true);
  });

  it("reports an unusable path as STORE_IO with the OS error as cause", async () => {
    const file = join(root, `plain-file-${n++}`);
    await writeFile(file, "x");
    const err = await expectCode(new LevelRecoveryStore(join(file, "store")).openManifest(), "STORE_IO");
    expect((err.cause as { code?: string }).code).toBe("ENOTDIR");
  });

  it("reports damaged manifest files as STORE_CORRUPT, never creating an empty manifest over them", async () => {
    for (const damage of ["CURRENT garbage", "CURRENT missing", "MANIFEST truncated"] as const) {
      const dir = await populated();
      const mdir = join(dir, "manifest");
      const manifestFile = (await readdir(mdir)).find((f) => f.startsWith("MANIFEST-"))!;
      if (damage === "CURRENT garbage") await writeFile(join(mdir, "CURRENT"), "\u0000\u0001garbage");
      if (damage === "CURRENT missing") await rm(join(mdir, "CURRENT"));
      if (damage === "MANIFEST truncated") await truncate(join(mdir, manifestFile), 5);
      const err = await expectCode(new LevelRecoveryStore(dir).openManifest(), "STORE_CORRUPT");
      expect(err.message, damage).toContain(mdir);
      expect(err.message, damage).toMatch(/Move the store directory aside/);
      expect(existsSync(join(mdir, "CURRENT")), damage).toBe(damage !== "CURRENT missing");
    }
  });

  it("survives garbage in any manifest file: opens and lists, or STORE_CORRUPT", async () => {
    const base = await populated();
    // Reopen once so the log is compacted into a table: damage then hits both kinds of file.
    await (await new LevelRecoveryStore(base).openManifest()).close();
    const files = (await readdir(join(base, "manifest"))).filter((f) => !["LOCK", "LOG", "LOG.old"].includes(f));
    expect(files.some((f) => f.endsWith(".ldb"))).toBe(true);
    const outcomes: string[] = [];
    for (const f of files) {
      const dir = freshDir();
      await cp(base, dir, { recursive: true });
      await overwriteMiddle(join(dir, "manifest", f), 16);
      try {
        const m = await new LevelRecoveryStore(dir).openManifest();
        try {
          const lines = await m.list();
          outcomes.push(`${f}: ${lines.length} lines`);
        } finally {
          await m.close();
        }
      } catch (err) {
        if (!isLifelineError(err, "STORE_CORRUPT")) throw new Error(`garbage in ${f} gave ${String(err)}`, { cause: err });
        outcomes.push(`${f}: STORE_CORRUPT`);
      }
    }
    expect(outcomes.length).toBe(files.length);
  });

  it("deletes unreferenced blob files and half-created databases on open, and nothing else", async () => {
    const dir = await populated();
    const blobs = join(dir, "rank-1", "blobs");
    await writeFile(join(blobs, "0000000000000009-deadbeef.part"), "a blob whose record was never written");
    await writeFile(join(blobs, "notes.txt"), "not ours");
    await mkdir(join(dir, "manifest.tmp-0badc0de"));
    await mkdir(join(dir, "rank-1", "parts.tmp-0badc0de"));
    const store = new LevelRecoveryStore(dir);
    const m = await store.openManifest();
    const p = await store.openRank(1);
    expect((await readdir(blobs)).filter((f) => f.endsWith(".part"))).toHaveLength(3);
    expect(existsSync(join(blobs, "notes.txt"))).toBe(true);
    expect(existsSync(join(dir, "manifest.tmp-0badc0de"))).toBe(false);
    expect(existsSync(join(dir, "rank-1", "parts.tmp-0badc0de"))).toBe(false);
    expect((await latestLine(m, localVerifier([await store.openRank(0), p]))).line!.epoch).toBe(3);
    await m.close();
    await p.close();
  });

  it("writes only the blocks of a large part that changed, and deletes block files once no part names them", async () => {
    const dir = freshDir();
    const store = new LevelRecoveryStore(dir);
    const p = await store.openRank(0);
    const blobs = join(dir, "rank-0", "blobs");
    const blocks = async (): Promise<string[]> => (await readdir(blobs)).filter((f) => f.endsWith(".blk")).sort();
    const global = bytesOf(8 * BLOCK_BYTES, 1);
    const head = bytesOf(40, 2);
    await p.putPart(1, [head, global], undefined, {});
    const first = await blocks();
    expect(first).toHaveLength(8);
    global[3 * BLOCK_BYTES + 5] = global[3 * BLOCK_BYTES + 5]! ^ 1;
    const r2 = await p.putPart(2, [head, global], undefined, {});
    const second = await blocks();
    expect(second).toHaveLength(9);
    expect(second.filter((f) => !first.includes(f))).toHaveLength(1);
    await p.retain([2]);
    expect(await blocks()).toHaveLength(8);
    expect((await p.readPart(r2)).equals(Buffer.concat([head, global]))).toBe(true);
    await p.retain([], { dropNewer: true });
    expect(await blocks()).toEqual([]);
    await p.close();
  });

  it("takes the caller's SHA-256 of a block when given: a right one saves the hashing, a wrong one makes the part unusable, not wrong", async () => {
    const dir = freshDir();
    const p = await new LevelRecoveryStore(dir).openRank(0);
    const a = bytesOf(4 * BLOCK_BYTES, 5);
    const b = Buffer.from(a);
    b[BLOCK_BYTES + 1] = b[BLOCK_BYTES + 1]! ^ 1;
    const sums = (bytes: Buffer): Buffer[] =>
      Array.from({ length: 4 }, (_, i) =>
        createHash("sha256")
          .update(bytes.subarray(i * BLOCK_BYTES, (i + 1) * BLOCK_BYTES))
          .digest(),
      );
    const asked: number[] = [];
    const known =
      (bytes: Buffer, digests: Buffer[]): KnownSha256 =>
      (piece) => {
        if (piece.buffer !== bytes.buffer) return undefined;
        const i = (piece.byteOffset - bytes.byteOffset) / BLOCK_BYTES;
        asked.push(i);
        return Promise.resolve(digests[i]!);
      };
    const ra = await p.putPart(1, [bytesOf(9, 1), a], undefined, { knownSha256: known(a, sums(a)) });
    expect(asked).toEqual([0, 1, 2, 3]);
    expect((await p.readPart(ra)).equals(Buffer.concat([bytesOf(9, 1), a]))).toBe(true);
    // A wrong digest for b's changed block (a's): the part names a's block, and fails its CRC-32.
    const rb = await p.putPart(2, [bytesOf(9, 1), b], undefined, { knownSha256: known(b, sums(a)) });
    expect(await p.checkPart(rb)).toMatchObject({ kind: "corrupt", message: expect.stringMatching(/checksum mismatch/) });
    await p.close();
  });

  it("deletes block files no record names when it opens, and nothing else", async () => {
    const dir = freshDir();
    const store = new LevelRecoveryStore(dir);
    let p = await store.openRank(0);
    const ref = await p.putPart(1, bytesOf(BLOCKED_BYTES_MIN, 3), undefined, {});
    await p.close();
    const blobs = join(dir, "rank-0", "blobs");
    const kept = (await readdir(blobs)).sort();
    await writeFile(join(blobs, "0000000000000002-deadbeef.blk"), "a block whose record was never written");
    await writeFile(join(blobs, "0000000000000002-deadbeef.blk.bak"), "not ours");
    p = await store.openRank(0);
    expect((await readdir(blobs)).sort()).toEqual([...kept, "0000000000000002-deadbeef.blk.bak"].sort());
    expect((await p.readPart(ref)).equals(bytesOf(BLOCKED_BYTES_MIN, 3))).toBe(true);
    await p.close();
  });

  it("catches a truncated or swapped blob file as damage", async () => {
    const dir = await populated();
    const blobs = join(dir, "rank-1", "blobs");
    const files = (await readdir(blobs)).sort();
    await truncate(join(blobs, files[2]!), 1000); // line 3: truncated
    await cp(join(blobs, files[0]!), join(blobs, files[1]!)); // line 2: holds line 1's file
    const store = new LevelRecoveryStore(dir);
    const m = await store.openManifest();
    const ranks = [await store.openRank(0), await store.openRank(1)];
    const choice = await latestLine(m, localVerifier(ranks));
    expect(choice.line!.epoch).toBe(1);
    expect(choice.warnings[0]).toMatch(/line 3 .*holds 936 bytes after its header, expected 100000 \(truncated/);
    expect(choice.warnings[1]).toMatch(/line 2 .*describes rank 1, line 1/);
    await m.close();
    for (const r of ranks) await r.close();
  });

  it("opens read-only without creating or deleting anything", async () => {
    const dir = await populated();
    const stray = join(dir, "rank-1", "blobs", "0000000000000009-deadbeef.part");
    await writeFile(stray, "x");
    const ro = new LevelRecoveryStore(dir, { readOnly: true });
    const p = await ro.openRank(1);
    expect(existsSync(stray)).toBe(true);
    await expect(p.putPart(4, Buffer.alloc(1))).rejects.toThrow(TypeError);
    await p.close();
    await expectCode(ro.openRank(5), "STORE_NOT_FOUND");
    expect(existsSync(join(dir, "rank-5"))).toBe(false);
  });

  it("lists lines for `lifeline lines` and formats them as a table", async () => {
    const dir = await populated();
    const store = new LevelRecoveryStore(dir);
    const m = await store.openManifest();
    const ranks = [await store.openRank(0), await store.openRank(1)];
    await pruneLines(m, ranks, 2);
    await ranks[1]!.putPart(4, bytesOf(3 << 20, 4));
    await m.close();
    for (const r of ranks) await r.close();
    await new LevelStoreFaults(dir).removePart(1, 3);
    const report = await listLines(dir);
    expect(report.rows.map((r) => [r.epoch, r.state])).toEqual([
      [2, "committed"],
      [3, "corrupt"],
      [4, "partial"],
    ]);
    const text = formatLines(report);
    expect(text).toContain(`recovery lines in ${dir}:`);
    expect(text).toMatch(/EPOCH\s+TIME\s+RANKS\s+BYTES\s+RUN\s+STATE/);
    expect(text).toMatch(/\n\s+4\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+1\/2\s+3\.0 MiB\s+-\s+partial\n/);
    expect(text).toMatch(/line 3: rank 1's part of line 3 is missing: blob file .* does not exist/);
    // The listing held no lock afterwards and created nothing.
    await (await store.openManifest()).close();
    const empty = freshDir();
    await (await new LevelRecoveryStore(empty).openManifest()).close();
    expect(formatLines(await listLines(empty))).toContain("(none)");
  });
});
