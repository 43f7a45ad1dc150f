/**
 * Goal: every collective works when it crosses the recovery line — some ranks enter it before
 * their checkpoint, some after — both while the line is taken and when a recovery replays
 * across it (early messages suppressed at their senders, late ones re-delivered from the log,
 * the library's collective counters and inbox restored): results equal --mode none.
 *
 * Method: test/fixtures/cpr/crossing.ts gives rank 0 checkpoint locations only at even points
 * between collectives and the other ranks only at odd ones, so no two ranks can checkpoint
 * between the same two collectives: every line is crossed by at least one collective, forced
 * by construction rather than timing. 3 real rank processes, `--checkpoint-every 1steps` (a
 * round as soon as the previous one ended), one collective kind per run, a rank killed at its
 * 20th checkpoint() (of 24) after lines were committed (the victim rotates over the ranks); the
 * reference is one --mode none run of every kind.
 */
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CLI, context, runLauncher, type RunOutcome } from "./cpr-run.ts";

const PROGRAM = "test/fixtures/cpr/crossing.ts";
const NP = 3;
const POINTS = "48";
const TIMEOUT_MS = 30_000;
const KINDS = ["barrier", "bcast", "reduce", "allreduce", "allreduce-ring", "gather", "scatter", "allgather", "alltoall"];

let dir: string;
let reference: RunOutcome;

beforeAll(async () => {
  if (!existsSync(CLI)) throw new Error(`${CLI} is missing: run \`npm run build\` first`);
  dir = await mkdtemp(join(tmpdir(), "lifeline-crossing-"));
  reference = await runLauncher({ np: NP, program: PROGRAM, args: ["all", POINTS], flags: ["--mode", "none"], dir, name: "none", timeoutMs: TIMEOUT_MS });
}, TIMEOUT_MS);

afterAll(async () => {
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

describe("collectives crossing the recovery line (--mode cpr, a rank killed later)", () => {
  KINDS.forEach((kind, i) => {
    const victim = i % NP;
    it(
      `${kind}: rank ${victim} killed after a crossed line was committed; results equal --mode none`,
      async () => {
        expect(reference.code, context(reference)).toBe(0);
        const want = (reference.doc!.ranks as Record<string, string>[]).map((r) => r[kind]);
        // Whether a line commits before the kill at step 20 depends on how fast the program runs
        // against the initiator's rounds (a loaded machine runs rounds slowly). Every run must
        // recover to the reference results; a run that rolled back to the beginning did not test
        // the crossing, so the program is slowed down (a pause per point) and run again.
        let crossed = false;
        for (const pauseMs of ["0", "10", "40"]) {
          const o = await runLauncher({
            np: NP,
            program: PROGRAM,
            args: [kind, POINTS, pauseMs],
            flags: ["--mode", "cpr", "--checkpoint-every", "1steps", "--inject", `${victim}@step:20`],
            dir,
            name: `${kind}-${pauseMs}`,
            timeoutMs: TIMEOUT_MS,
          });
          expect(o.code, context(o)).toBe(0);
          expect(o.doc!.restarts).toBe(1);
          expect(
            (o.doc!.ranks as Record<string, string>[]).map((r) => r[kind]),
            context(o),
          ).toEqual(want);
          // Restored from a committed line, not from the beginning: the replay crosses it.
          if (o.doc!.recovery!.rollbacks[0]!.epoch > 0) {
            crossed = true;
            break;
          }
        }
        expect(crossed, "no run committed a line before the kill, even with a 40 ms pause per point").toBe(true);
      },
      3 * TIMEOUT_MS,
    );
  });
});
