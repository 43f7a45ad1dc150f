/**
 * The job's private run directory (mode 0700, `<tmp>/lifeline-XXXXXX`): the ipc endpoints of
 * the coordinator and the ranks, and the ranks' key files. The launcher removes it when the
 * job ends, also when it exits on an uncaught exception; a launcher that is SIGKILLed (a batch
 * time limit, the OOM killer) can run no code, so the next launcher removes what it left.
 *
 * Liveness: each launcher listens on a unix socket `launcher` inside its directory for as long
 * as it runs. A directory whose `launcher` socket refuses connections belongs to a launcher
 * that is gone (the kernel drops a dead process's listening sockets), so any later launcher
 * with the same tmp directory deletes it. A directory without that socket (a launcher that
 * has not yet bound it, or one of an older version) is left alone; so is one owned by another
 * user, one made on another host (the file `host` names it: a tmp directory on a shared file
 * system sees other hosts' directories, whose sockets refuse connections from here), and one
 * whose socket answers or does not answer within a bound.
 *
 * @example
 * const dir = await openRunDir();
 * const swept = sweepStaleRunDirs(runDirBase(), { except: dir.path });
 * ...
 * dir.remove();
 */
import { lstatSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { connect, createServer, type Server } from "node:net";
import { hostname, tmpdir } from "node:os";
import { join } from "node:path";

/** Name prefix of run directories (under the tmp directory). */
export const RUN_DIR_PREFIX = "lifeline-";
/** The liveness socket's file name inside a run directory. */
export const LIVENESS_SOCKET = "launcher";
/** The file inside a run directory that names the host of its launcher. */
export const HOST_FILE = "host";
/** How long a liveness probe waits for an answer before taking the launcher for alive. */
const PROBE_TIMEOUT_MS = 1_000;

export interface RunDir {
  readonly path: string;
  /** Stops answering liveness probes and deletes the directory (synchronous: also usable in an `exit` hook). */
  remove(): void;
}

/**
 * Makes a fresh run directory and starts answering liveness probes in it. Unix socket paths
 * are short (107 bytes), so a long TMPDIR falls back to /tmp.
 */
export async function openRunDir(base: string = runDirBase()): Promise<RunDir> {
  const path = mkdtempSync(join(base, RUN_DIR_PREFIX));
  const server: Server = createServer((socket) => socket.destroy());
  try {
    writeFileSync(join(path, HOST_FILE), hostname(), { mode: 0o600 });
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(join(path, LIVENESS_SOCKET), () => {
        server.off("error", reject);
        resolve();
      });
    });
  } catch (err) {
    rmSync(path, { recursive: true, force: true });
    throw err;
  }
  // The launcher's lifetime is its job's, not this socket's.
  server.unref();
  let removed = false;
  return {
    path,
    remove() {
      if (removed) return;
      removed = true;
      server.close();
      rmSync(path, { recursive: true, force: true });
    },
  };
}

/** Where run directories go: the tmp directory, or /tmp if its path is too long for socket paths. */
export function runDirBase(): string {
  const base = tmpdir();
  return base.length <= 60 ? base : "/tmp";
}

/**
 * Deletes the run directories under `base` whose launcher is gone (see the module comment).
 * Never throws; resolves to the paths it deleted.
 */
export async function sweepStaleRunDirs(base: string, opts: { except?: string } = {}): Promise<string[]> {
  let names: string[];
  try {
    names = readdirSync(base).filter((n) => n.startsWith(RUN_DIR_PREFIX));
  } catch {
    return [];
  }
  const uid = process.getuid?.();
  const host = hostname();
  const candidates: string[] = [];
  for (const name of names) {
    const dir = join(base, name);
    if (dir === opts.except) continue;
    try {
      const st = lstatSync(dir);
      if (!st.isDirectory() || (uid !== undefined && st.uid !== uid)) continue;
      if (!lstatSync(join(dir, LIVENESS_SOCKET)).isSocket()) continue;
      if (readFileSync(join(dir, HOST_FILE), "utf8") !== host) continue;
    } catch {
      continue;
    }
    candidates.push(dir);
  }
  const removed: string[] = [];
  await Promise.all(
    candidates.map(async (dir) => {
      if ((await probe(join(dir, LIVENESS_SOCKET))) !== "gone") return;
      try {
        rmSync(dir, { recursive: true, force: true });
        removed.push(dir);
      } catch {
        // Someone else's to keep, or already gone.
      }
    }),
  );
  return removed;
}

/** "gone" only when the socket refuses or no longer exists; anything else counts as alive. */
function probe(path: string): Promise<"gone" | "alive"> {
  return new Promise((resolve) => {
    const socket = connect({ path });
    const done = (v: "gone" | "alive"): void => {
      clearTimeout(timer);
      socket.destroy();
      resolve(v);
    };
    const timer = setTimeout(() => done("alive"), PROBE_TIMEOUT_MS);
    socket.once("connect", () => done("alive"));
    socket.once("error", (err: NodeJS.ErrnoException) => done(err.code === "ECONNREFUSED" || err.code === "ENOENT" ? "gone" : "alive"));
  });
}
