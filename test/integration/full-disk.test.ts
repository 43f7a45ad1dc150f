/**
 * Goal: a cpr job whose store's disk fills up goes on: the lines that cannot be written are
 * aborted, the job finishes with the results of an undisturbed run, and afterwards the store
 * holds the committed lines' data and nothing else (an aborted line leaves no part behind).
 *
 * Method: a real small disk — a 1.3 MB tmpfs, mounted in a private mount namespace
 * (`unshare --mount`, so nothing appears on the host and the mount ends with the test) — holds
 * the store of a 2-rank heat job with ~260 KiB parts (blob files) and `--keep-lines 2`: two
 * lines fit, a third does not. Inside the namespace, after the job, `lifeline lines` and a
 * listing of every file are printed for the test to check. This needs root (mount); without it
 * the test fails and says so.
 */
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { mkdir } from "node:fs/promises";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { CLI, ROOT, runDirFor, runLauncher } from "./cpr-run.ts";

const TIMEOUT_MS = 90_000;
const ARGS = ["--iters", "2500", "--tol", "0"];
const runs = runDirFor("lifeline-full-");

/** Runs `script` with sh inside a new mount namespace; resolves with its output and exit code. */
function inMountNamespace(script: string, env: Record<string, string>): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn("unshare", ["--mount", "--propagation", "private", "sh", "-c", script], {
      cwd: ROOT,
      env: { ...process.env, ...env },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    child.stdout.setEncoding("utf8").on("data", (c: string) => {
      stdout += c;
    });
    child.stderr.setEncoding("utf8").on("data", (c: string) => {
      stderr += c;
    });
    const timer = setTimeout(() => child.kill("SIGKILL"), TIMEOUT_MS - 5_000);
    child.on("error", (err) => reject(new Error(`cannot run unshare (util-linux) to make a private mount namespace: ${err.message}`)));
    child.on("close", (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

const SCRIPT = `
set -u
mount -t tmpfs -o size=1300k tmpfs "$STORE" || { echo "cannot mount a tmpfs at $STORE (this test needs root)"; exit 97; }
node "$CLI" run -n 2 --mode cpr --checkpoint-every 100ms --keep-lines 2 --store "$STORE" --results "$OUT/results.json" --json examples/heat.ts $ARGS 2> "$OUT/events.jsonl"
echo "EXIT=$?"
echo "--- lines"
node "$CLI" lines --store "$STORE"
echo "--- files"
find "$STORE" -type f -name '*.part' | sort
`;

describe("a store whose disk is full", () => {
  it(
    "aborts the lines that do not fit, finishes bit-identical, and keeps only the committed lines' data",
    async () => {
      const dir = runs.path;
      const ref = await runLauncher({
        np: 2,
        program: "examples/heat.ts",
        args: ARGS,
        flags: ["--mode", "none"],
        dir,
        name: "reference",
        timeoutMs: TIMEOUT_MS,
      });
      expect(ref.code, ref.stderr).toBe(0);

      const store = join(dir, "small-disk");
      await mkdir(store);
      const r = await inMountNamespace(SCRIPT, { STORE: store, OUT: dir, CLI, ARGS: ARGS.join(" ") });
      expect(r.code, `${r.stdout}\n${r.stderr}`).toBe(0);
      expect(r.stdout).toContain("EXIT=0");
      const events = readFileSync(join(dir, "events.jsonl"), "utf8")
        .split("\n")
        .filter((l) => l.startsWith("{"))
        .map((l) => JSON.parse(l) as Record<string, unknown>);
      const aborted = events.filter(
        (e) => e.event === "warning" && /recovery line \d+ aborted: rank \d could not write its part: .*ENOSPC/.test(e.message as string),
      );
      expect(aborted.length, "the disk never filled up: make the parts larger or the tmpfs smaller").toBeGreaterThan(0);
      const doc = JSON.parse(readFileSync(join(dir, "results.json"), "utf8")) as { ranks: unknown[]; recovery: { linesCommitted: number[] } };
      expect(doc.ranks).toEqual(ref.doc!.ranks);
      const committed = doc.recovery.linesCommitted;
      expect(committed.length).toBeGreaterThanOrEqual(1);
      const kept = committed.slice(-2);

      // The listing: the kept committed lines, verified, and no partial line.
      const listing = r.stdout.slice(r.stdout.indexOf("--- lines"), r.stdout.indexOf("--- files"));
      const rows = listing.split("\n").filter((l) => /^\s+\d+\s/.test(l));
      expect(rows.map((l) => Number(l.trim().split(/\s+/)[0]))).toEqual(kept);
      for (const row of rows) expect(row).toMatch(/committed$/);
      // The files: one blob per rank per kept line, nothing of an aborted line.
      const files = r.stdout
        .slice(r.stdout.indexOf("--- files"))
        .split("\n")
        .filter((l) => l.endsWith(".part"));
      const epochs = files.map((f) => parseInt(/\/([0-9a-f]{16})-[0-9a-f]{8}\.part$/.exec(f)![1]!, 16));
      expect(epochs.sort((a, b) => a - b)).toEqual(kept.flatMap((e) => [e, e]));
    },
    TIMEOUT_MS,
  );
});
