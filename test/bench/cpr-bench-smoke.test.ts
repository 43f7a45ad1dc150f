/**
 * Goal: bench/cpr-bench.ts keeps working — in particular its recovery breakdown, which reads
 * the launcher's --json events and the ranks' marks and so breaks silently when either
 * changes shape.
 *
 * Method: run it with `--quick --only store,recovery` (a 4 MiB store case, one recovery of 4
 * ranks × 8 MiB) into a temporary JSON file and check the report's shape and that every part
 * is a finite, non-negative number that adds up. No timing targets: the machine is shared.
 * Needs the built package (`npm test` builds first); skipped without it.
 */
import { execFile } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const tmp = mkdtempSync(path.join(os.tmpdir(), "lfcprbench-smoke-"));
afterAll(() => rmSync(tmp, { recursive: true, force: true }));
const built = existsSync(path.join(ROOT, "dist", "cli.js"));

interface Parts {
  mode: string;
  detectMs: number;
  restartMs: number;
  loadMs: number;
  catchUpMs: number;
  totalMs: number;
  restarted: number;
  restoredStep: number;
  failStep: number;
}

describe("bench/cpr-bench.ts --quick", () => {
  it.skipIf(!built)(
    "measures the store write and a recovery in parts, prints the tables, writes the JSON",
    async () => {
      const out = path.join(tmp, "cpr.json");
      const r = await new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
        execFile(
          process.execPath,
          ["--import", "tsx", "bench/cpr-bench.ts", "--quick", "--only", "store,recovery", "--out", out],
          { cwd: ROOT, timeout: 120_000, killSignal: "SIGTERM", maxBuffer: 16 << 20 },
          (err, stdout, stderr) => {
            resolve({ code: err ? ((err as { code?: number }).code ?? null) : 0, stdout, stderr });
          },
        );
      });
      expect(r.code, r.stderr).toBe(0);
      expect(r.stdout).toContain("### Recovery, 4 ranks x 8 MiB state");
      expect(r.stdout).toMatch(/\| 4 MiB part write: store vs fs\.writeFile \+ fsync \|/);
      const doc = JSON.parse(readFileSync(out, "utf8")) as { schema: string; rows: { ratio: number }[]; recovery: { ranks: number; runs: Parts[] } };
      expect(doc.schema).toBe("lifeline-cpr-bench/1");
      expect(doc.rows[0]!.ratio).toBeGreaterThan(0);
      expect(doc.recovery.ranks).toBe(4);
      const [p] = doc.recovery.runs;
      expect(p!.mode).toBe("cpr");
      expect(p!.restarted).toBe(4);
      for (const k of ["detectMs", "restartMs", "loadMs", "catchUpMs", "totalMs"] as const) {
        expect(Number.isFinite(p![k]) && p![k] >= 0, `${k} = ${p![k]}`).toBe(true);
      }
      expect(p!.detectMs + p!.restartMs + p!.loadMs + p!.catchUpMs).toBeCloseTo(p!.totalMs, 0);
      expect(p!.restoredStep).toBeLessThan(p!.failStep);
    },
    150_000,
  );
});
