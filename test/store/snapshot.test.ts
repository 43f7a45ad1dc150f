/**
 * Goal: `new LevelRecoveryStore(dir, { readOnly: true, snapshot: true })` reads a store while
 * a running job holds every database in it (locked), gets a consistent view each time, and
 * never disturbs the job: it neither takes nor waits for a lock, and writes, creates and
 * deletes nothing in the store. Its temporary copies are gone after close.
 *
 * Method: a child process (test/fixtures/store/snapshot-writer.ts) holds the manifest and
 * RANKS rank databases open and commits lines as fast as it can — large-ish inline parts so
 * that LevelDB flushes memtables and compacts, pruning to KEEP lines — while this process
 * takes SNAPSHOTS snapshots. Each one reads the manifest, then every rank, then the manifest
 * again, and checks what must hold whatever the writer did in between: the lines listed both
 * times were committed before the ranks were copied and pruned (if at all) only after, so
 * each of their parts has its record in the rank's copy, with the committed checksum and size
 * (inline parts verify; a blob file, read in place, may be deleted by then: missing, never
 * corrupt); the newest line is never older than the newest one the writer reported before the
 * snapshot started, nor than the previous snapshot's. The writer must then stop cleanly with
 * every line it committed accounted for. Copies discarded because the database changed
 * during the copy are counted (`snapshotCounters.retries`) and must have happened: that is
 * the path the flushes and compactions exercise. TMPDIR points at a directory of the test's
 * own, so it can check that closing removes every copy.
 */
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { appendFile, mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LevelRecoveryStore } from "../../src/store/level-store.ts";
import { listLines, listLinesIn } from "../../src/store/lines.ts";
import { SNAPSHOT_ATTEMPTS, snapshotCounters, snapshotHooks, snapshotLevelDb } from "../../src/store/snapshot.ts";
import type { PartInfo, RankPartStore } from "../../src/store/types.ts";
import { LevelStoreFaults, populateStore } from "./level-faults.ts";
import { bytesOf, expectCode } from "./suite.ts";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const WRITER = join(ROOT, "test", "fixtures", "store", "snapshot-writer.ts");
const RANKS = 2;
const KEEP = 16;
const SNAPSHOTS = 200;
/** Every FORCE_EVERY-th snapshot waits for a flush in the middle of a copy (see the hook). */
const FORCE_EVERY = 40;

let root: string;
let snapTmp: string;
let savedTmpdir: string | undefined;
let n = 0;
beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "lifeline-snapshot-test-"));
  snapTmp = join(root, "tmp");
  await mkdir(snapTmp);
  // os.tmpdir() reads TMPDIR at every call: the copies land where this test can see them all
  // (vitest runs each test file in a process of its own).
  savedTmpdir = process.env["TMPDIR"];
  process.env["TMPDIR"] = snapTmp;
});
afterAll(async () => {
  if (savedTmpdir === undefined) delete process.env["TMPDIR"];
  else process.env["TMPDIR"] = savedTmpdir;
  await rm(root, { recursive: true, force: true });
});
function freshDir(): string {
  return join(root, `s${n++}`);
}

/** The snapshot copies in TMPDIR (child processes put other things there: tsx's cache). */
async function snapshotCopies(): Promise<string[]> {
  return (await readdir(snapTmp)).filter((name) => name.startsWith("lifeline-snapshot-"));
}

const snapshotStore = (dir: string): LevelRecoveryStore => new LevelRecoveryStore(dir, { readOnly: true, snapshot: true });

/** Every file under `dir` with its size and mtime: what "changed nothing" compares. */
async function tree(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const entry of await readdir(dir, { recursive: true, withFileTypes: true })) {
    const path = join(entry.parentPath, entry.name);
    const st = await stat(path);
    out.push(`${path} ${entry.isDirectory() ? "dir" : st.size} ${st.mtimeMs}`);
  }
  return out.sort();
}

/** A store with lines 1..3 of two ranks (rank 1's parts are blobs), all handles closed. */
function populated(): Promise<string> {
  return populateStore(freshDir());
}

/** Resolves when the MANIFEST of the database at `path` has grown or been replaced. */
async function untilManifestGrows(path: string): Promise<void> {
  const manifest = async (): Promise<string> => {
    const name = (await readFile(join(path, "CURRENT"), "latin1")).trim();
    return `${name} ${(await stat(join(path, name))).size}`;
  };
  const start = await manifest();
  const deadline = Date.now() + 20_000;
  while ((await manifest()) === start) {
    if (Date.now() > deadline) throw new Error(`the writer did not flush or compact ${path} within 20 s`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

interface Writer {
  readonly ready: Promise<void>;
  readonly committed: number[];
  /** Asks it to stop; resolves with its exit code, its last stdout line and its stderr. */
  stop(): Promise<{ code: number | null; last: string; stderr: string }>;
  kill(): void;
}

function startWriter(dir: string): Writer {
  const proc = spawn(process.execPath, ["--import", "tsx", WRITER, dir, String(RANKS), String(KEEP)], { cwd: ROOT, stdio: ["pipe", "pipe", "pipe"] });
  const committed: number[] = [];
  let stderr = "";
  let pending = "";
  let last = "";
  let onReady!: () => void;
  let onFail!: (err: Error) => void;
  const ready = new Promise<void>((resolve, reject) => {
    onReady = resolve;
    onFail = reject;
  });
  ready.catch(() => undefined);
  proc.stdout.setEncoding("utf8").on("data", (chunk: string) => {
    pending += chunk;
    const lines = pending.split("\n");
    pending = lines.pop()!;
    for (const line of lines) {
      last = line;
      if (line === "ready") onReady();
      else if (line.startsWith("committed ")) committed.push(Number(line.slice("committed ".length)));
    }
  });
  proc.stderr.setEncoding("utf8").on("data", (chunk: string) => {
    stderr += chunk;
  });
  const exited = new Promise<number | null>((resolve) => {
    proc.on("exit", (code) => {
      onFail(new Error(`the writer exited before it was ready (code ${code}):\n${stderr}`));
      resolve(code);
    });
  });
  return {
    ready,
    committed,
    stop: async () => {
      proc.stdin.end("stop\n");
      const timer = setTimeout(() => proc.kill("SIGKILL"), 30_000);
      const code = await exited;
      clearTimeout(timer);
      return { code, last, stderr };
    },
    kill: () => proc.kill("SIGKILL"),
  };
}

describe("LevelRecoveryStore snapshots", () => {
  it(`reads a store that a running job holds and writes, ${SNAPSHOTS} times, consistently and without disturbing it`, async () => {
    const dir = freshDir();
    const writer = startWriter(dir);
    try {
      await writer.ready;
      while (writer.committed.length < 5) await new Promise((r) => setTimeout(r, 10));
      // The writer holds every database: a plain read-only open is locked out.
      await expectCode(new LevelRecoveryStore(dir, { readOnly: true }).openManifest(), "STORE_LOCKED");
      await expectCode(new LevelRecoveryStore(dir, { readOnly: true }).openRank(1), "STORE_LOCKED");

      const retriesBefore = snapshotCounters.retries;
      const copiesBefore = snapshotCounters.copies;
      let previousNewest = -1;
      let partsChecked = 0;
      let blobsVerified = 0;
      let blobsGone = 0;
      let linesChecked = 0;
      let forcedSnapshots = 0;
      let forcedRetries = 0;
      const started = performance.now();
      for (let i = 0; i < SNAPSHOTS; i++) {
        const context = `snapshot ${i}`;
        const reportedBefore = writer.committed.at(-1)!;
        const forced = i % FORCE_EVERY === FORCE_EVERY / 2;
        if (forced) {
          // Hold the first copy of rank 0's database until the writer's next flush or
          // compaction has changed it: that copy must be discarded and taken again.
          snapshotHooks.afterCopy = async (path) => {
            if (path !== join(dir, "rank-0", "parts")) return;
            snapshotHooks.afterCopy = undefined;
            await untilManifestGrows(path);
          };
        }
        const retriesAtStart = snapshotCounters.retries;
        const store = snapshotStore(dir);
        const m1 = await store.openManifest();
        if (i === 0) {
          const open = await snapshotCopies();
          expect(open.length, "a snapshot's copy is in TMPDIR while open").toBe(1);
          expect((await stat(join(snapTmp, open[0]!))).mode & 0o777, "the copy is private").toBe(0o700);
        }
        const lines1 = await m1.list();
        await m1.close();
        const ranks: RankPartStore[] = [];
        const parts = new Map<number, Map<number, PartInfo>>();
        try {
          for (let r = 0; r < RANKS; r++) {
            const p = await store.openRank(r);
            ranks.push(p);
            parts.set(r, new Map((await p.listParts()).map((info) => [info.epoch, info])));
          }
          const m2 = await store.openManifest();
          const lines2 = await m2.list();
          await m2.close();

          const epochs1 = lines1.map((l) => l.epoch);
          expect(epochs1, context).toEqual([...epochs1].sort((a, b) => a - b));
          expect(new Set(epochs1).size, context).toBe(epochs1.length);
          const newest = epochs1.at(-1) ?? -1;
          expect(newest, `${context}: a line committed before the snapshot started is missing`).toBeGreaterThanOrEqual(reportedBefore);
          expect(newest, `${context}: the newest line went back`).toBeGreaterThanOrEqual(previousNewest);
          expect(lines2.at(-1)!.epoch, context).toBeGreaterThanOrEqual(newest);
          expect(lines1.length, context).toBeLessThanOrEqual(KEEP + 1); // one extra between commit and prune
          previousNewest = newest;

          const inBoth = new Set(lines2.map((l) => l.epoch));
          for (const line of lines1.filter((l) => inBoth.has(l.epoch))) {
            linesChecked++;
            for (const ref of line.parts) {
              const info = parts.get(ref.rank)!.get(ref.epoch);
              expect(info, `${context}: rank ${ref.rank}'s part of line ${ref.epoch} has no record`).toBeDefined();
              expect({ checksum: info!.checksum, bytes: info!.bytes }, context).toEqual({ checksum: ref.checksum, bytes: ref.bytes });
              const check = await ranks[ref.rank]!.checkPart(ref);
              partsChecked++;
              if (info!.location === "inline") {
                expect(check, context).toEqual({ kind: "ok", ref });
              } else {
                expect(["ok", "missing"], `${context}: ${"message" in check ? check.message : ""}`).toContain(check.kind);
                if (check.kind === "ok") blobsVerified++;
                else blobsGone++;
              }
            }
          }
        } finally {
          for (const p of ranks) await p.close();
          snapshotHooks.afterCopy = undefined;
        }
        if (forced) {
          forcedSnapshots++;
          forcedRetries += snapshotCounters.retries - retriesAtStart;
          expect(snapshotCounters.retries - retriesAtStart, `${context}: the copy made before a flush was not taken again`).toBeGreaterThan(0);
        }
      }
      const elapsedMs = performance.now() - started;
      expect(await snapshotCopies(), "closing a snapshot store removes its copies").toEqual([]);

      const { code, last, stderr } = await writer.stop();
      expect(stderr).toBe("");
      expect(code).toBe(0);
      const newestCommitted = writer.committed.at(-1)!;
      expect(last).toBe(`done ${newestCommitted} ${writer.committed.length}`);

      // It wrote everything: its newest line is there and whole, read without snapshot.
      const store = new LevelRecoveryStore(dir, { readOnly: true });
      const m = await store.openManifest();
      const lines = await m.list();
      await m.close();
      expect(lines.at(-1)!.epoch).toBe(newestCommitted);
      expect(lines.map((l) => l.epoch)).toEqual(writer.committed.slice(-KEEP));
      const report = await listLines(dir);
      expect(report.rows.filter((r) => r.state === "committed").map((r) => r.epoch)).toEqual(writer.committed.slice(-KEEP));

      // An idle store: the snapshot listing is the plain one.
      expect(await listLinesIn(snapshotStore(dir))).toEqual(report);
      expect(await snapshotCopies()).toEqual([]);

      const retries = snapshotCounters.retries - retriesBefore;
      const copies = snapshotCounters.copies - copiesBefore;
      console.log(
        `snapshot test: ${SNAPSHOTS} snapshots (${copies} database copies) in ${(elapsedMs / 1000).toFixed(1)} s while the writer committed ${writer.committed.length} lines; ` +
          `${retries} copies retried (${forcedRetries} in the ${forcedSnapshots} snapshots held until a flush, ${retries - forcedRetries} by chance); ${linesChecked} lines / ${partsChecked} parts checked (${blobsVerified} blob files verified, ${blobsGone} deleted by the writer meanwhile)`,
      );
      expect(linesChecked).toBeGreaterThanOrEqual(SNAPSHOTS);
      expect(blobsVerified).toBeGreaterThan(0);
      expect(forcedSnapshots).toBe(SNAPSHOTS / FORCE_EVERY);
      expect(retries).toBeGreaterThanOrEqual(forcedSnapshots);
    } finally {
      writer.kill();
    }
  }, 180_000);

  it("changes nothing in the store: no blob collection, no temp-sibling removal, writes rejected", async () => {
    const dir = await populated();
    const stray = join(dir, "rank-1", "blobs", "0000000000000009-deadbeef.part");
    await writeFile(stray, "a blob no record names");
    await mkdir(join(dir, "manifest.tmp-0badc0de"));
    await mkdir(join(dir, "rank-1", "parts.tmp-0badc0de"));
    const before = await tree(dir);
    const store = snapshotStore(dir);
    const m = await store.openManifest();
    const p = await store.openRank(1);
    expect((await m.list()).map((l) => l.epoch)).toEqual([1, 2, 3]);
    expect((await p.listParts()).map((i) => [i.epoch, i.location])).toEqual([
      [1, "blob"],
      [2, "blob"],
      [3, "blob"],
    ]);
    expect(await p.getPart(2)).toEqual(bytesOf(100_000, 2));
    await expect(p.putPart(4, Buffer.alloc(1))).rejects.toThrow(TypeError);
    await expect(p.retain([])).rejects.toThrow(TypeError);
    await expect(m.commitLine(4, [{ rank: 0, epoch: 4, checksum: 0, bytes: 0 }])).rejects.toThrow(TypeError);
    await expect(m.prune(1)).rejects.toThrow(TypeError);
    await expectCode(store.openRank(5), "STORE_NOT_FOUND");
    await m.close();
    await p.close();
    expect(await tree(dir)).toEqual(before);
    expect(existsSync(stray)).toBe(true);
    expect(await snapshotCopies()).toEqual([]);

    await expectCode(snapshotStore(join(root, "does-not-exist")).openManifest(), "STORE_NOT_FOUND");
    expect(() => new LevelRecoveryStore(dir, { readOnly: false, snapshot: true })).toThrow(TypeError);
  });

  it("never locks out a job that opens its databases while snapshots are taken", async () => {
    const dir = await populated();
    const retriesBefore = snapshotCounters.retries;
    let opening = true;
    let listings = 0;
    const reader = (async () => {
      while (opening) {
        const report = await listLinesIn(snapshotStore(dir));
        expect(report.rows.filter((r) => r.state === "committed").map((r) => r.epoch)).toEqual([1, 2, 3]);
        listings++;
      }
    })();
    try {
      // Every open of a database starts a new MANIFEST and switches CURRENT to it: snapshots
      // taken meanwhile see CURRENT change or the old MANIFEST vanish, and take the copy again.
      const store = new LevelRecoveryStore(dir);
      for (let i = 0; i < 30; i++) {
        const m = await store.openManifest();
        const p = await store.openRank(0);
        await p.putPart(100 + i, bytesOf(1000, i));
        await p.close();
        await m.close();
        await new Promise((r) => setTimeout(r, 1));
      }
    } finally {
      opening = false;
      await reader;
    }
    expect(listings).toBeGreaterThan(0);
    expect(await snapshotCopies()).toEqual([]);
    console.log(`snapshots during 30 opens: ${listings} listings, ${snapshotCounters.retries - retriesBefore} copies retried`);
  });

  it("lists the same rows as a plain read-only listing of an idle store", async () => {
    const dir = await populated();
    const store = new LevelRecoveryStore(dir);
    const p1 = await store.openRank(1);
    await p1.putPart(4, bytesOf(3 << 20, 4)); // a partial line
    await p1.close();
    await new LevelStoreFaults(dir).removePart(1, 2); // a corrupt line
    const plain = await listLines(dir);
    expect(plain.rows.map((r) => [r.epoch, r.state])).toEqual([
      [1, "committed"],
      [2, "corrupt"],
      [3, "committed"],
      [4, "partial"],
    ]);
    expect(await listLinesIn(snapshotStore(dir))).toEqual(plain);
    expect(await listLinesIn(snapshotStore(dir), { verify: false })).toEqual(await listLines(dir, { verify: false }));
    expect(await snapshotCopies()).toEqual([]);
  });

  it("reports a damaged database as STORE_CORRUPT and leaves no copy behind", async () => {
    const dir = await populated();
    await rm(join(dir, "manifest", "CURRENT"));
    const err = await expectCode(snapshotStore(dir).openManifest(), "STORE_CORRUPT");
    expect(err.message).toContain(join(dir, "manifest"));
    expect(err.message).toMatch(/no CURRENT file.*Move the store directory aside/);
    await writeFile(join(dir, "manifest", "CURRENT"), "MANIFEST-000999\n");
    const err2 = await expectCode(snapshotStore(dir).openManifest(), "STORE_CORRUPT");
    expect(err2.message).toMatch(/MANIFEST-000999, named by CURRENT, does not exist/);
    const mdir = join(dir, "rank-0", "parts");
    const manifestFile = (await readdir(mdir)).find((f) => f.startsWith("MANIFEST-"))!;
    await writeFile(join(mdir, manifestFile), "garbage, not a MANIFEST");
    const err3 = await expectCode(snapshotStore(dir).openRank(0), "STORE_CORRUPT");
    expect(err3.message).toContain(mdir);
    expect(await snapshotCopies()).toEqual([]);
  });

  it(`gives up with STORE_IO after ${SNAPSHOT_ATTEMPTS} attempts when the database never holds still`, async () => {
    // Not LevelDB, just its file names; the MANIFEST grows during every copy, as it would
    // under a writer that flushes all the time.
    const dir = join(root, `busy-${n++}`);
    await mkdir(dir);
    await writeFile(join(dir, "CURRENT"), "MANIFEST-000002\n");
    await writeFile(join(dir, "MANIFEST-000002"), "");
    await writeFile(join(dir, "000003.log"), "");
    snapshotHooks.afterCopy = (path) => appendFile(join(path, "MANIFEST-000002"), "x");
    try {
      const retriesBefore = snapshotCounters.retries;
      const err = await expectCode(snapshotLevelDb(dir, "the busy database"), "STORE_IO");
      expect(err.message).toMatch(new RegExp(`kept changing while it was copied \\(${SNAPSHOT_ATTEMPTS} attempts; last: the MANIFEST grew\\)`));
      expect(err.message).toContain(dir);
      expect(snapshotCounters.retries - retriesBefore).toBe(SNAPSHOT_ATTEMPTS);
      expect(await snapshotCopies()).toEqual([]);
    } finally {
      snapshotHooks.afterCopy = undefined;
    }
  });
});
