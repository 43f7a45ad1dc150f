/**
 * Goal: under `--mode cpr` a line stores the program's `global` once (in its global writer's
 * part; the other parts name it), and a job whose rank is killed restores every rank's global
 * from there: results bit-identical to `--mode none`.
 *
 * Method: the built launcher runs test/fixtures/cpr/table-steps.ts (a 256 KiB read-only table as
 * the global, the same on every rank at every step; a small state per rank that every step
 * folds a table entry into) on 4 ranks, once with `--mode none` and once with `--mode cpr
 * --checkpoint-every 5steps` and rank 1 killed at its first checkpoint() call after line 2 is
 * committed (so there is always a line to roll back to, however slow the machine); each committed
 * line's size (its `line-committed` event) must hold the table once, not four times.
 */
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { context, runDirFor, runLauncher } from "./cpr-run.ts";

const runs = runDirFor("lifeline-cpr-global-");
const PROGRAM = join("test", "fixtures", "cpr", "table-steps.ts");
const N = 32_768; // 256 KiB of Float64
const ARGS = ["--steps", "80", "--n", String(N), "--spin-ms", "2"];
const TIMEOUT_MS = 60_000;

describe("cpr: a line's global stored once", () => {
  it(
    "4 ranks, rank 1 killed: every rank's global restored from its line's writer, results bit-identical to --mode none; lines hold the table once",
    async () => {
      const base = await runLauncher({ np: 4, program: PROGRAM, flags: ["--mode", "none"], args: ARGS, dir: runs.path, name: "none", timeoutMs: TIMEOUT_MS });
      expect(base.code, context(base)).toBe(0);
      const lineBytes: number[] = [];
      const cpr = await runLauncher({
        np: 4,
        program: PROGRAM,
        flags: ["--mode", "cpr", "--checkpoint-every", "5steps", "--inject", "1@line:2"],
        args: ARGS,
        dir: runs.path,
        name: "cpr",
        timeoutMs: TIMEOUT_MS,
        onEvent: (ev) => {
          if (ev.event === "line-committed") lineBytes.push(ev.bytes as number);
        },
      });
      expect(cpr.code, context(cpr)).toBe(0);
      expect(cpr.doc!.restarts).toBe(1);
      // Rolled back to a line, not to the beginning: the restore used a stored global.
      expect(cpr.doc!.recovery!.rollbacks).toHaveLength(1);
      expect(cpr.doc!.recovery!.rollbacks[0]!.epoch).toBeGreaterThan(0);
      expect(cpr.doc!.ranks).toEqual(base.doc!.ranks);
      expect(lineBytes.length).toBeGreaterThan(0);
      // One table (256 KiB) and four small states per line; four tables would be over 1 MiB.
      for (const bytes of lineBytes) {
        expect(bytes).toBeGreaterThan(N * 8);
        expect(bytes).toBeLessThan(N * 8 + 64 * 1024);
      }
    },
    3 * TIMEOUT_MS,
  );
});
