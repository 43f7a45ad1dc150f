/**
 * Private temporary directories (mode 0700, `<tmp>/lifeline-…`) that go when their process
 * goes: a job's run directory (the ipc endpoints of the coordinator and the ranks, and the
 * ranks' key files) and a store reader's snapshot of a LevelDB database. The process removes
 * its directory when it is done, also when the launcher exits on an uncaught exception; a
 * process that is SIGKILLed (a batch time limit, the OOM killer) can run no code, so the next
 * launcher removes what it left.
 *
 * Liveness: the process listens on a unix socket `launcher` inside its directory for as long
 * as the directory is in use. A directory whose `launcher` socket refuses connections belongs
 * to a process that is gone (the kernel drops a dead process's listening sockets), so any later
 * launcher with the same tmp directory deletes it. A directory without that socket (one whose
 * process has not bound it yet, one of an older version, or a snapshot's where binding failed)
 * is left alone; so is one owned by another user, one made on another host (the file `host`
 * names it: a tmp directory on a shared file system sees other hosts' directories, whose
 * sockets refuse connections from here), and one whose socket accepts the connection or does
 * not answer within a bound.
 *
 * @example
 * const dir = await openOwnedDir(RUN_DIR_PREFIX);
 * const swept = sweepStaleOwnedDirs(ownedDirBase(), { except: dir.path });
 * ...
 * dir.remove();
 */
import { lstatSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { connect, createServer, type Server } from "node:net";
import { hostname, tmpdir } from "node:os";
import { join } from "node:path";

/** Name prefix of every directory made here (under the tmp directory): what a sweep looks at. */
export const OWNED_DIR_PREFIX = "lifeline-";
/** A job's run directory. */
export const RUN_DIR_PREFIX = OWNED_DIR_PREFIX;
/** A store reader's snapshot of a LevelDB database (src/store/snapshot.ts). */
export const SNAPSHOT_DIR_PREFIX = `${OWNED_DIR_PREFIX}snapshot-`;
/** The liveness socket's file name inside such a directory. */
export const LIVENESS_SOCKET = "launcher";
/** The file inside such a directory that names the host of the process that made it. */
export const HOST_FILE = "host";
/** How long a liveness probe waits for an answer before taking the process for alive. */
const PROBE_TIMEOUT_MS = 1_000;

export interface OwnedDir {
  readonly path: string;
  /** Stops answering liveness probes and deletes the directory (synchronous: also usable in an `exit` hook). */
  remove(): void;
}

/**
 * Makes a fresh directory `<base>/<prefix>XXXXXX` and starts answering liveness probes in it.
 * Unix socket paths are short (107 bytes), so a long TMPDIR falls back to /tmp. If the socket
 * cannot be bound, `required` (a run directory, whose ipc endpoints need the same) fails and
 * removes the directory; otherwise the directory is kept, without liveness (never swept).
 */
export async function openOwnedDir(prefix: string, opts: { base?: string; required?: boolean } = {}): Promise<OwnedDir> {
  if (!prefix.startsWith(OWNED_DIR_PREFIX)) throw new RangeError(`openOwnedDir: prefix ${prefix} does not start with ${OWNED_DIR_PREFIX}`);
  const path = mkdtempSync(join(opts.base ?? ownedDirBase(), prefix));
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
    if (opts.required ?? true) {
      rmSync(path, { recursive: true, force: true });
      throw err;
    }
    server.close();
    return { path, remove: () => rmSync(path, { recursive: true, force: true }) };
  }
  // The process's lifetime is its own, not this socket's.
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

/** Where these directories go: the tmp directory, or /tmp if its path is too long for socket paths. */
export function ownedDirBase(): string {
  const base = tmpdir();
  return base.length <= 60 ? base : "/tmp";
}

/**
 * Deletes the directories under `base` whose process is gone (see the module comment). Never
 * throws; resolves to the paths it deleted.
 */
export async function sweepStaleOwnedDirs(base: string, opts: { except?: string } = {}): Promise<string[]> {
  let names: string[];
  try {
    names = readdirSync(base).filter((n) => n.startsWith(OWNED_DIR_PREFIX));
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
