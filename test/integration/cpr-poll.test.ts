/**
 * Goal: polling a request (`test()` on an irecv, `done` on an isend) is logged while recording
 * and replayed after a rollback, so a program that polls while it works recovers from a
 * killed rank to its failure-free result; a receive completed from the log swallows the
 * re-sent copy (the fixture throws if a later receive gets a stale one).
 *
 * Method: test/fixtures/cpr/poll.ts (a ring of 3 ranks polling between work chunks, rank 0
 * slow at each step's start and slower after a restart) under
 * the built launcher, once in --mode none, then in --mode cpr with a checkpoint every 2
 * steps and rank 1 killed at its first checkpoint() after line 2 committed; the
 * --results digests must be equal. Twice: with small payloads (copied), and with 128 KiB ones
 * (an isend from the program's memory, whose re-send the rollback suppresses: it must
 * complete all the same).
 */
import { mkdtemp, rm } from "node:fs/promises";
import { existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CLI, context, runLauncher } from "./cpr-run.ts";

const TIMEOUT_MS = 60_000;
let dir: string;

beforeAll(async () => {
  if (!existsSync(CLI)) throw new Error(`${CLI} is missing: run \`npm run build\` first`);
  dir = await mkdtemp(join(tmpdir(), "lifeline-poll-"));
});

afterAll(async () => {
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

describe("polled requests under --mode cpr", () => {
  // 256 values: each isend is copied and done once the transport has it; 16384 (128 KiB): it
  // goes from the program's memory and is done on the receiver's receipt, which its polls ask for.
  it.each(["256", "16384"])(
    "a ring polling test()/done while it works (payload %s values), rank 1 killed after lines were committed: results equal --mode none",
    async (len) => {
      const program = "test/fixtures/cpr/poll.ts";
      // Rank 0 computes 30 ms without yielding at each step's start (60 ms after the restart):
      // the others record long runs of polls, and replay a "done" before the re-sent copy.
      const args = ["100", len, "30"]; // 3 s or more: lines commit well before the end
      const base = await runLauncher({ np: 3, program, args, flags: ["--mode", "none"], dir, name: `none-${len}`, timeoutMs: TIMEOUT_MS });
      expect(base.code, context(base)).toBe(0);
      const cpr = await runLauncher({
        np: 3,
        program,
        args,
        flags: ["--mode", "cpr", "--checkpoint-every", "2steps", "--inject", "1@line:2"],
        dir,
        name: `cpr-${len}`,
        timeoutMs: TIMEOUT_MS,
      });
      expect(cpr.code, context(cpr)).toBe(0);
      expect(cpr.doc!.restarts).toBe(1);
      expect(cpr.doc!.recovery!.rollbacks[0]!.epoch).toBeGreaterThan(0);
      expect(cpr.doc!.ranks).toEqual(base.doc!.ranks);
    },
    2 * TIMEOUT_MS,
  );
});
