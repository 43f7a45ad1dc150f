/**
 * Goal: a full disk makes store writes fail with STORE_IO, and only that: once space is free
 * again, the same process goes on writing and committing through the same handles, and no
 * write that was acknowledged — before or after the disk was full — is lost. (LevelDB leaves a
 * partial record in its log when a write fails and appends later records after it; without
 * the reopen after a failed write, those later, acknowledged records are gone on the next
 * open — this test then fails with "part ... was durable and not deleted, but it is gone".)
 *
 * Method: a real 4 MiB tmpfs, mounted in a private mount namespace (`unshare --mount`, as
 * root) so that nothing leaks into the host and the mount vanishes with the child; the child
 * runs test/fixtures/store/disk-full.ts on it (fill until writes fail, free space, write
 * again, reopen and verify — see the fixture) and prints a JSON summary, asserted here.
 * Without the privileges to mount, the test fails and says so.
 */
import { spawn } from "node:child_process";
import { mkdtemp, readdir, rmdir } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const FIXTURE = join(ROOT, "test", "fixtures", "store", "disk-full.ts");
const TIMEOUT_MS = 60_000;

interface Summary {
  linesBeforeFull: number;
  failuresWhileFull: Record<"leveldb-write" | "leveldb-reopen" | "blob-write" | "other", number>;
  freeWhenFull: number;
  examples: Record<string, string>;
  pruneWhileFull: boolean;
  pruneAfterCleanup: boolean;
  linesAfterFull: number;
  failuresAfterFree: number;
  linesAtEnd: number[];
  partsChecked: number;
  durableChecked: number;
  problems: string[];
}

/** Runs the fixture on a fresh tmpfs of `size`; resolves with its exit code and output. */
async function runOnTmpfs(size: string): Promise<{ code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string; timedOut: boolean }> {
  const mountPoint = await mkdtemp(join(tmpdir(), "lifeline-disk-full-"));
  try {
    const script = `mount -t tmpfs -o size=${size},mode=0700 tmpfs "$MOUNT_POINT" && exec "$NODE" --import tsx "$FIXTURE" "$MOUNT_POINT"`;
    const proc = spawn("unshare", ["--mount", "--propagation", "private", "sh", "-c", script], {
      cwd: ROOT,
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, MOUNT_POINT: mountPoint, NODE: process.execPath, FIXTURE },
    });
    let stdout = "";
    let stderr = "";
    proc.stdout.setEncoding("utf8").on("data", (c: string) => {
      stdout += c;
    });
    proc.stderr.setEncoding("utf8").on("data", (c: string) => {
      stderr += c;
    });
    let timedOut = false;
    // `sh` execs node in place, so this is the fixture's pid; the namespace and the mount go
    // with it.
    const timer = setTimeout(() => {
      timedOut = true;
      proc.kill("SIGKILL");
    }, TIMEOUT_MS);
    const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve) => {
      proc.on("error", (err) => {
        stderr += `spawning unshare: ${err.message}\n`;
        resolve([null, null]);
      });
      proc.on("close", (c, s) => resolve([c, s]));
    });
    clearTimeout(timer);
    return { code, signal, stdout, stderr, timedOut };
  } finally {
    // The tmpfs was mounted in the child's namespace only: here the directory is still empty.
    expect(await readdir(mountPoint)).toEqual([]);
    await rmdir(mountPoint);
  }
}

describe("store on a full disk", () => {
  it(
    "fails writes with STORE_IO while the disk is full, then writes again and loses nothing acknowledged",
    async () => {
      const started = performance.now();
      const run = await runOnTmpfs("4m");
      const output = `exit code ${run.code}, signal ${run.signal}\n--- stdout\n${run.stdout}--- stderr\n${run.stderr}`;
      if (!run.stdout.startsWith("start\n")) {
        throw new Error(
          "could not run the fixture on a private tmpfs: `unshare --mount` and `mount -t tmpfs` need root (CAP_SYS_ADMIN) " +
            `and util-linux's unshare; run the tests as root, or in a container allowed to mount.\n${output}`,
        );
      }
      expect(run.timedOut, `the fixture did not finish within ${TIMEOUT_MS / 1000} s and was killed\n${output}`).toBe(false);
      expect(run.code, output).toBe(0);
      const summary = JSON.parse(run.stdout.trim().split("\n").at(-1)!) as Summary;
      console.log(`disk-full test (${((performance.now() - started) / 1000).toFixed(1)} s): ${JSON.stringify(summary)}`);

      expect(summary.problems, output).toEqual([]);
      // The disk did fill up, and LevelDB itself failed to write (not only a blob file).
      expect(summary.linesBeforeFull).toBeGreaterThan(0);
      expect(summary.failuresWhileFull["leveldb-write"]).toBeGreaterThan(0);
      expect(summary.failuresWhileFull.other).toBe(0);
      expect(summary.examples["leveldb-write"]).toMatch(/No space left on device/);
      expect(summary.freeWhenFull).toBeLessThan(64 * 1024);
      // Space freed: the same handles work again, every time.
      expect(summary.pruneAfterCleanup).toBe(true);
      expect(summary.linesAfterFull).toBe(30);
      expect(summary.failuresAfterFree).toBe(0);
      expect(summary.linesAtEnd).toHaveLength(2);
      expect(summary.partsChecked).toBe(4);
      expect(summary.durableChecked).toBeGreaterThanOrEqual(4);
    },
    TIMEOUT_MS + 10_000,
  );
});
