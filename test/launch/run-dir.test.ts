/**
 * Goal: a launcher's run directory goes when the launcher goes, also when it was SIGKILLed
 * (the next launcher deletes it), and no sweep ever deletes the directory of a launcher that
 * still runs, one that has not bound its liveness socket yet, or anything that is not a run
 * directory.
 *
 * Method: real directories under a private base, real unix sockets; the SIGKILLed launcher is
 * a child process that opens a run directory and is killed.
 */
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { hostname, tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { HOST_FILE, LIVENESS_SOCKET, openRunDir, RUN_DIR_PREFIX, sweepStaleRunDirs } from "../../src/launch/run-dir.ts";
import { ROOT, TSX_LOADER } from "./helpers.ts";

let base: string;
beforeEach(() => {
  base = mkdtempSync(join(tmpdir(), "rundir-test-"));
});
afterEach(() => rmSync(base, { recursive: true, force: true }));

/** A child process that opens a run directory under `base`, prints its path and waits to be killed. */
async function killedLauncherDir(): Promise<string> {
  const code = `import { openRunDir } from ${JSON.stringify(join(ROOT, "src/launch/run-dir.ts"))};
const dir = await openRunDir(${JSON.stringify(base)});
process.stdout.write(dir.path + "\\n");
setInterval(() => {}, 1000);`;
  const child = spawn(process.execPath, ["--import", TSX_LOADER, "--input-type=module", "-e", code], { stdio: ["ignore", "pipe", "inherit"] });
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

describe("run directories", () => {
  it("open answers liveness probes; remove deletes the directory", async () => {
    const dir = await openRunDir(base);
    expect(dir.path.startsWith(join(base, RUN_DIR_PREFIX))).toBe(true);
    expect(existsSync(join(dir.path, LIVENESS_SOCKET))).toBe(true);
    expect(await sweepStaleRunDirs(base)).toEqual([]);
    expect(existsSync(dir.path)).toBe(true);
    dir.remove();
    dir.remove();
    expect(existsSync(dir.path)).toBe(false);
  });

  it("the directory of a SIGKILLed launcher is swept; live and unknown ones are kept", async () => {
    const stale = await killedLauncherDir();
    expect(existsSync(join(stale, LIVENESS_SOCKET))).toBe(true);
    const live = await openRunDir(base);
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

    expect(await sweepStaleRunDirs(base)).toEqual([stale]);
    expect(readdirSync(base).sort()).toEqual(
      [`${RUN_DIR_PREFIX}fake`, `${RUN_DIR_PREFIX}file`, `${RUN_DIR_PREFIX}unbound`, live.path.slice(base.length + 1), "other"].sort(),
    );
    live.remove();
  });

  it("a dead launcher's directory made on another host (a shared tmp directory) is kept", async () => {
    const stale = await killedLauncherDir();
    writeFileSync(join(stale, HOST_FILE), "another-host");
    expect(await sweepStaleRunDirs(base)).toEqual([]);
    expect(existsSync(stale)).toBe(true);
    rmSync(join(stale, HOST_FILE));
    expect(await sweepStaleRunDirs(base)).toEqual([]);
    writeFileSync(join(stale, HOST_FILE), hostname());
    expect(await sweepStaleRunDirs(base)).toEqual([stale]);
  });

  it("a sweep never deletes the directory it is told to keep, and survives a missing base", async () => {
    const stale = await killedLauncherDir();
    expect(await sweepStaleRunDirs(base, { except: stale })).toEqual([]);
    expect(existsSync(stale)).toBe(true);
    expect(await sweepStaleRunDirs(join(base, "missing"))).toEqual([]);
  });
});
