/**
 * Goal: a launcher's run directory, and a store reader's snapshot, go when their process goes,
 * also when it was SIGKILLed (the next launcher deletes them), and no sweep ever deletes the
 * directory of a process that still runs, one that has not bound its liveness socket yet, or
 * anything that is not such a directory.
 *
 * Method: real directories under a private base, real unix sockets, a real LevelDB; the
 * SIGKILLed process is a child that opens a run directory (or takes a snapshot) and is killed.
 */
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { hostname, tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { Level } from "level";
import { HOST_FILE, LIVENESS_SOCKET, openOwnedDir, RUN_DIR_PREFIX, SNAPSHOT_DIR_PREFIX, sweepStaleOwnedDirs } from "../../src/owned-dir.ts";
import { ROOT, TSX_LOADER } from "../launch/helpers.ts";

let base: string;
beforeEach(() => {
  base = mkdtempSync(join(tmpdir(), "rundir-test-"));
});
afterEach(() => rmSync(base, { recursive: true, force: true }));

/** A child process that runs `code` (which prints a directory's path), killed once it printed it. */
async function killedChildDir(code: string, env: NodeJS.ProcessEnv = process.env): Promise<string> {
  const child = spawn(process.execPath, ["--import", TSX_LOADER, "--input-type=module", "-e", `${code}\nsetInterval(() => {}, 1000);`], {
    stdio: ["ignore", "pipe", "inherit"],
    env,
  });
  const path = await new Promise<string>((resolve, reject) => {
    let out = "";
    child.stdout.setEncoding("utf8").on("data", (s: string) => {
      out += s;
      if (out.includes("\n")) resolve(out.trim());
    });
    child.on("exit", (c) => reject(new Error(`child exited ${c} before opening its run directory`)));
  });
  const exited = new Promise((resolve) => child.on("exit", resolve));
  child.kill("SIGKILL");
  await exited;
  return path;
}

/** A child process that opens a run directory under `base` and is SIGKILLed. */
function killedLauncherDir(): Promise<string> {
  return killedChildDir(`import { openOwnedDir, RUN_DIR_PREFIX } from ${JSON.stringify(join(ROOT, "src/owned-dir.ts"))};
const dir = await openOwnedDir(RUN_DIR_PREFIX, { base: ${JSON.stringify(base)} });
process.stdout.write(dir.path + "\\n");`);
}

describe("owned directories", () => {
  it("open answers liveness probes; remove deletes the directory", async () => {
    const dir = await openOwnedDir(RUN_DIR_PREFIX, { base });
    expect(dir.path.startsWith(join(base, RUN_DIR_PREFIX))).toBe(true);
    expect(existsSync(join(dir.path, LIVENESS_SOCKET))).toBe(true);
    expect(await sweepStaleOwnedDirs(base)).toEqual([]);
    expect(existsSync(dir.path)).toBe(true);
    dir.remove();
    dir.remove();
    expect(existsSync(dir.path)).toBe(false);
  });

  it("the directory of a SIGKILLed launcher is swept; live and unknown ones are kept", async () => {
    const stale = await killedLauncherDir();
    expect(existsSync(join(stale, LIVENESS_SOCKET))).toBe(true);
    const live = await openOwnedDir(RUN_DIR_PREFIX, { base });
    // Not yet bound (or an older launcher): no liveness socket.
    const unbound = join(base, `${RUN_DIR_PREFIX}unbound`);
    mkdirSync(unbound);
    writeFileSync(join(unbound, "coordinator"), "");
    // A file named like a run directory, and a directory with a regular file as its socket.
    writeFileSync(join(base, `${RUN_DIR_PREFIX}file`), "");
    const fake = join(base, `${RUN_DIR_PREFIX}fake`);
    mkdirSync(fake);
    writeFileSync(join(fake, LIVENESS_SOCKET), "");
    const other = join(base, "other");
    mkdirSync(other);

    expect(await sweepStaleOwnedDirs(base)).toEqual([stale]);
    expect(readdirSync(base).sort()).toEqual(
      [`${RUN_DIR_PREFIX}fake`, `${RUN_DIR_PREFIX}file`, `${RUN_DIR_PREFIX}unbound`, live.path.slice(base.length + 1), "other"].sort(),
    );
    live.remove();
  });

  it("a dead launcher's directory made on another host (a shared tmp directory) is kept", async () => {
    const stale = await killedLauncherDir();
    writeFileSync(join(stale, HOST_FILE), "another-host");
    expect(await sweepStaleOwnedDirs(base)).toEqual([]);
    expect(existsSync(stale)).toBe(true);
    rmSync(join(stale, HOST_FILE));
    expect(await sweepStaleOwnedDirs(base)).toEqual([]);
    writeFileSync(join(stale, HOST_FILE), hostname());
    expect(await sweepStaleOwnedDirs(base)).toEqual([stale]);
  });

  it("the snapshot of a store reader that was SIGKILLed is swept", async () => {
    const dbPath = join(base, "db");
    const db = new Level(dbPath);
    await db.put("k", "v");
    await db.close();
    const snap = await killedChildDir(
      `import { snapshotLevelDb } from ${JSON.stringify(join(ROOT, "src/store/snapshot.ts"))};
const snap = await snapshotLevelDb(${JSON.stringify(dbPath)}, "a test database");
process.stdout.write(snap.dir + "\\n");`,
      // Where the snapshot goes (tsx keeps its cache there too).
      { ...process.env, TMPDIR: base },
    );
    expect(snap.startsWith(join(base, SNAPSHOT_DIR_PREFIX))).toBe(true);
    expect(existsSync(join(snap, "db", "CURRENT"))).toBe(true);
    expect(await sweepStaleOwnedDirs(base)).toEqual([snap]);
    expect(existsSync(snap)).toBe(false);
    // The snapshot's dead process was the only one: nothing else under the base is touched.
    expect(existsSync(join(dbPath, "CURRENT"))).toBe(true);
  });

  it("a sweep never deletes the directory it is told to keep, and survives a missing base", async () => {
    const stale = await killedLauncherDir();
    expect(await sweepStaleOwnedDirs(base, { except: stale })).toEqual([]);
    expect(existsSync(stale)).toBe(true);
    expect(await sweepStaleOwnedDirs(join(base, "missing"))).toEqual([]);
  });
});
