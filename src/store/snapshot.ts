/**
 * Snapshots of a LevelDB database that another process holds open and keeps writing: the
 * way `LevelRecoveryStore` in snapshot mode reads a running job's store without touching its
 * locks. LevelDB locks a database per process, and even a read-only open takes that lock for a
 * moment, so a reader that opened the live directory could make the job fail to open it.
 * Instead, the database's live files are copied into a private temporary directory
 * (`os.tmpdir()/lifeline-snapshot-*`, mode 0700; if this process is SIGKILLed before it removes
 * it, the next launcher does: src/owned-dir.ts) and the copy is opened; nothing in the live
 * directory is opened for writing, locked, created or deleted.
 *
 * Which files, and why the copy is consistent (a hot copy; the writer runs all the while):
 *
 * - `CURRENT` names the live `MANIFEST-<n>`; the MANIFEST is a log of version edits, each
 *   naming the table files (`*.ldb`, `*.sst`, immutable once written) that make up the
 *   database and the number of the oldest write-ahead log (`*.log`, appended to) whose
 *   records are not in a table yet. `LOCK`, `LOG`, `LOG.old` are not needed.
 * - LevelDB appends the edit that retires a file (a compaction replacing tables; a memtable
 *   flush moving a log's records into a table and advancing the log number) to the MANIFEST,
 *   and syncs it, *before* it deletes that file; a file that the current version references
 *   is never deleted. A new MANIFEST is only started when a process opens the database, and
 *   then `CURRENT` is switched to it.
 * - So: read `CURRENT`, stat its MANIFEST, list the directory, copy `CURRENT`, that MANIFEST
 *   and every table and log listed (logs in ascending order), then read `CURRENT` and stat
 *   the MANIFEST again. If both are unchanged, no edit was written during the copy, so every
 *   file the copied MANIFEST references existed from before the listing until after the
 *   copy — tables whole, because immutable; the logs it still needs, because a log is deleted
 *   only after the edit that retires it. Logs are copied as prefixes: the one being appended
 *   to may end in a torn record, which LevelDB treats as the end of the log when it opens the
 *   copy, so the copy holds the database as of some moment during the copy. A log created
 *   after the listing (a memtable switch) holds only writes newer than everything copied, so
 *   leaving it out keeps the copy a prefix of the history; an older log must not grow after
 *   its copy (it does not: LevelDB closes a log before it writes to the next one), which is
 *   checked too. Tables being written by a compaction are copied or not, and ignored either
 *   way: the copied MANIFEST does not name them.
 * - If `CURRENT` changed, the MANIFEST grew, an older log grew, or a file vanished while it
 *   was copied (ENOENT), a flush, a compaction or a reopen happened: the copy is discarded and
 *   taken again, up to {@link SNAPSHOT_ATTEMPTS} times with a growing pause in between.
 *
 * Files are copied, not hard-linked, although tables are immutable: the copy's LevelDB may
 * reuse the number of a table the live one is still writing (a compaction output the copied
 * MANIFEST does not know), and would then truncate that file — the live one, through a link.
 * `copyFile` asks for a reflink (copy-on-write clone) first, where the file system has them.
 *
 * @example
 * const snap = await snapshotLevelDb("/s/rank-0/parts", "rank 0's part database");
 * const db = new Level(snap.dbPath, { createIfMissing: false });
 * // ... read ...
 * await db.close();
 * await snap.remove();
 */
import { constants as fsConstants } from "node:fs";
import { copyFile, mkdir, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { LifelineError } from "../errors.ts";
import { type OwnedDir, openOwnedDir, ownedDirBase, SNAPSHOT_DIR_PREFIX } from "../owned-dir.ts";
import { corrupt, storeError } from "./records.ts";

/** How many times a snapshot is taken again after the database changed during the copy. */
export const SNAPSHOT_ATTEMPTS = 50;

/**
 * Counters of all snapshots taken in this process (for tests and diagnostics): databases
 * copied, and copies discarded and taken again because the database changed meanwhile.
 *
 * @example
 * const before = snapshotCounters.retries;
 * await listLinesIn(new LevelRecoveryStore(dir, { readOnly: true, snapshot: true }));
 * console.log(`${snapshotCounters.retries - before} retries`);
 */
export const snapshotCounters: { copies: number; retries: number } = { copies: 0, retries: 0 };

/**
 * Test hook: `afterCopy` runs in every attempt after the files are copied and before the
 * check that the database held still, with the live database's path. A test makes it wait
 * for the writer's next flush, so that the retry path runs when the test wants it to.
 *
 * @example
 * snapshotHooks.afterCopy = async (path) => { await untilManifestGrows(path); };
 * // ... take a snapshot: it is taken twice ...
 * snapshotHooks.afterCopy = undefined;
 */
export const snapshotHooks: { afterCopy?: ((path: string) => Promise<void>) | undefined } = {};

/**
 * A private copy of a database, from {@link snapshotLevelDb}.
 *
 * @example
 * const snap: LevelSnapshot = await snapshotLevelDb(path, "the line manifest");
 * await snap.remove(); // after the LevelDB handle on snap.dbPath is closed
 */
export interface LevelSnapshot {
  /** The temporary directory (`<tmp>/lifeline-snapshot-*`, see ownedDirBase), removed by {@link remove}. */
  readonly dir: string;
  /** The copied database inside {@link dir}: open it with LevelDB, `createIfMissing: false`. */
  readonly dbPath: string;
  /** Deletes the temporary directory. Idempotent; never rejects. */
  remove(): Promise<void>;
}

const TABLE_RE = /^(\d+)\.(ldb|sst)$/;
const LOG_RE = /^(\d+)\.log$/;
const MANIFEST_RE = /^MANIFEST-\d+$/;

/**
 * Copies the LevelDB database at `path` (held and written by another process, or idle) into
 * a new temporary directory, consistently (see the file comment). `what` names the database
 * in errors. Rejects with `STORE_IO` (the database kept changing through every attempt, or a
 * file could not be read or the copy not written), `STORE_CORRUPT` (no or a garbled `CURRENT`,
 * or the MANIFEST it names does not exist); the temporary directory is removed then.
 *
 * @example
 * const snap = await snapshotLevelDb("/s/manifest", "the line manifest");
 * snap.dbPath; // "/tmp/lifeline-snapshot-Ab12Cd/db"
 */
export async function snapshotLevelDb(path: string, what: string): Promise<LevelSnapshot> {
  const doing = `taking a snapshot of ${what}`;
  let owned: OwnedDir;
  try {
    // Mode 0700. Its liveness socket lets a later launcher remove it if this process is killed.
    owned = await openOwnedDir(SNAPSHOT_DIR_PREFIX, { required: false });
  } catch (err) {
    throw storeError(err, `${doing}: creating a temporary directory`, ownedDirBase());
  }
  const dir = owned.path;
  let removed: Promise<void> | undefined;
  const snap: LevelSnapshot = {
    dir,
    dbPath: join(dir, "db"),
    remove: () =>
      (removed ??= Promise.resolve()
        .then(() => owned.remove())
        .catch(() => undefined)),
  };
  try {
    const reasons: string[] = [];
    for (let attempt = 1; attempt <= SNAPSHOT_ATTEMPTS; attempt++) {
      await rm(snap.dbPath, { recursive: true, force: true });
      await mkdir(snap.dbPath);
      const changed = await copyOnce(path, snap.dbPath, what);
      if (changed === undefined) {
        snapshotCounters.copies++;
        return snap;
      }
      reasons.push(changed);
      snapshotCounters.retries++;
      if (attempt < SNAPSHOT_ATTEMPTS) await new Promise((r) => setTimeout(r, Math.min(attempt, 20)));
    }
    throw new LifelineError(
      "STORE_IO",
      `${doing}: the LevelDB database at ${path} kept changing while it was copied (${SNAPSHOT_ATTEMPTS} attempts; last: ${reasons.at(-1)}). ` +
        "The process holding it is flushing or compacting without pause; try again, or read the store when the job has ended.",
    );
  } catch (err) {
    await snap.remove();
    throw storeError(err, doing, path);
  }
}

/** A file's size, or `undefined` if it does not exist (any other error is thrown). */
async function sizeOrGone(path: string): Promise<number | undefined> {
  try {
    return (await stat(path)).size;
  } catch (err) {
    if (errno(err) === "ENOENT") return undefined;
    throw err;
  }
}

/**
 * One attempt: copies the database at `src` into the empty directory `dst`. Resolves to
 * `undefined` if the copy is consistent, else to why it must be taken again.
 */
async function copyOnce(src: string, dst: string, what: string): Promise<string | undefined> {
  // Why "CURRENT and the MANIFEST did not change" makes the copied files one consistent
  // database: see the file comment.
  const current = await readCurrent(src, what);
  const manifest = current.trim();
  const manifestBytes = await sizeOrGone(join(src, manifest));
  if (manifestBytes === undefined) {
    // A process that opens the database starts a new MANIFEST, switches CURRENT to it and
    // deletes the old one; if CURRENT still names the missing file, the database is damaged.
    if ((await readCurrent(src, what)) !== current) return "CURRENT changed";
    throw damaged(src, what, `${manifest}, named by CURRENT, does not exist`);
  }
  const names = await readdir(src);
  const tables = names.filter((n) => TABLE_RE.test(n));
  const logs = names.filter((n) => LOG_RE.test(n)).sort((a, b) => Number(LOG_RE.exec(a)![1]) - Number(LOG_RE.exec(b)![1]));
  const logBytes = new Map<string, number>();
  try {
    for (const t of tables) await copyFile(join(src, t), join(dst, t), fsConstants.COPYFILE_FICLONE);
    // Older logs first: a log is finished before the next one is written to.
    for (const l of logs) {
      await copyFile(join(src, l), join(dst, l), fsConstants.COPYFILE_FICLONE);
      logBytes.set(l, (await stat(join(dst, l))).size);
    }
    await copyFile(join(src, manifest), join(dst, manifest), fsConstants.COPYFILE_FICLONE);
  } catch (err) {
    if (errno(err) === "ENOENT") return "a file was deleted while it was copied";
    throw err;
  }
  await writeFile(join(dst, "CURRENT"), current);
  await snapshotHooks.afterCopy?.(src);
  if ((await readCurrent(src, what)) !== current) return "CURRENT changed";
  const manifestNow = await sizeOrGone(join(src, manifest));
  if (manifestNow === undefined) return "the MANIFEST was replaced";
  if (manifestNow !== manifestBytes || (await stat(join(dst, manifest))).size !== manifestBytes) return "the MANIFEST grew";
  for (const l of logs.slice(0, -1)) {
    const now = await sizeOrGone(join(src, l));
    // Deleted after its copy: retired by an edit that the MANIFEST check would have seen,
    // had it been written before the check; retry rather than reason about the order.
    if (now === undefined) return "a log was deleted";
    if (now !== logBytes.get(l)) return `log ${l} grew after a newer log existed`;
  }
  return undefined;
}

/** The content of `CURRENT` ("MANIFEST-000005\n"); `STORE_CORRUPT` if missing or garbled. */
async function readCurrent(src: string, what: string): Promise<string> {
  let current: string;
  try {
    current = await readFile(join(src, "CURRENT"), "latin1");
  } catch (err) {
    if (errno(err) === "ENOENT") throw damaged(src, what, "it has no CURRENT file");
    throw err;
  }
  if (!current.endsWith("\n") || !MANIFEST_RE.test(current.slice(0, -1))) throw damaged(src, what, "its CURRENT file does not name a MANIFEST");
  return current;
}

function damaged(path: string, what: string, why: string): LifelineError {
  return corrupt(
    `taking a snapshot of ${what}: the LevelDB database at ${path} is damaged or incomplete (${why}). ` +
      "Move the store directory aside and start the job fresh.",
  );
}

function errno(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === "string" ? code : undefined;
}
