/**
 * Runs of the built launcher in retry-one for the integration tests: each run's `--results`,
 * every rank's pids (from the --json `rank-spawned` events) and the `rank-caught-up` events;
 * a comparison with a `--mode none` run; the check that only the killed ranks were restarted.
 *
 * @example
 * const runs = retryOneRuns(() => dir, 4);
 * const r1 = await runs.expectSameAsNone("examples/heat.ts", ["--iters", "100"], ["1@step:30"]);
 * runs.expectOnlyRestarted(r1, { 1: 1 });
 */
import { expect } from "vitest";
import { context, type RunOutcome, runLauncher } from "./cpr-run.ts";

export const RUN_TIMEOUT_MS = 60_000;

/**
 * An event handler that SIGKILLs `ranks` in one instant (their current processes) once rank
 * `ranks[0]` reported `step` checkpoints: several failures at once, whatever the timing. With
 * `afterLine`, not before the launcher committed a (durable) line, however slow the machine.
 */
export function killTogetherAt(
  step: number,
  ranks: readonly number[],
  opts: { afterLine?: boolean } = {},
): (ev: Record<string, unknown>, pids: readonly (readonly number[])[]) => void {
  let done = false;
  let line = opts.afterLine !== true;
  return (ev, pids) => {
    if (ev.event === "line-committed") line = true;
    if (done || !line || ev.event !== "rank-step" || ev.rank !== ranks[0] || (ev.steps as number) < step) return;
    done = true;
    for (const r of ranks) {
      try {
        process.kill(pids[r]!.at(-1)!, "SIGKILL");
      } catch {
        // Already gone (it finished): the test's own checks say what did not happen.
      }
    }
  };
}

export interface Run extends RunOutcome {
  /** Pids each rank was started with, in order. */
  pids: number[][];
  /** The launcher's `rank-caught-up` events: restarted ranks back with the others. */
  caughtUp: { rank: number; attempt: number; restored: number; replayed: number }[];
}

export function retryOneRuns(dirOf: () => string, np: number) {
  let runs = 0;
  /** A fresh name for a run's results and store in the directory. */
  const nextName = (): string => `run${runs++}`;
  /** `onEvent` also sees every event, with the pids so far (e.g. to kill ranks from outside). */
  const run = async (
    program: string,
    flags: readonly string[],
    args: readonly string[] = [],
    onEvent?: (ev: Record<string, unknown>, pids: readonly (readonly number[])[]) => void,
  ): Promise<Run> => {
    const pids: number[][] = Array.from({ length: np }, () => []);
    const caughtUp: Run["caughtUp"] = [];
    const o = await runLauncher({
      np,
      program,
      flags,
      args,
      dir: dirOf(),
      name: nextName(),
      timeoutMs: RUN_TIMEOUT_MS,
      onEvent: (ev) => {
        if (ev.event === "rank-spawned") pids[ev.rank as number]!.push(ev.pid as number);
        if (ev.event === "rank-caught-up")
          caughtUp.push({ rank: ev.rank as number, attempt: ev.attempt as number, restored: ev.restored as number, replayed: ev.replayed as number });
        onEvent?.(ev, pids);
      },
    });
    return { ...o, pids, caughtUp };
  };

  /** Runs `program` in mode none (or takes `reference`) and in retry-one with `faults`; the results must be equal. */
  const expectSameAsNone = async (
    program: string,
    args: readonly string[],
    faults: readonly string[],
    extra: readonly string[] = [],
    reference?: Run,
  ): Promise<Run> => {
    const ref = reference ?? (await run(program, ["--mode", "none"], args));
    expect(ref.code, context(ref)).toBe(0);
    expect(ref.doc?.ranks.length, context(ref)).toBe(np);
    const r1 = await run(program, ["--mode", "retry-one", ...faults.flatMap((f) => ["--inject", f]), ...extra], args);
    expect(r1.code, context(r1)).toBe(0);
    expect(r1.doc?.ranks, context(r1)).toEqual(ref.doc?.ranks);
    return r1;
  };

  /** Only the ranks in `deaths` were started again, once per death; the others kept their process. */
  const expectOnlyRestarted = (r: Run, deaths: Record<number, number>): void => {
    for (let rank = 0; rank < np; rank++) expect(r.pids[rank]!.length, `rank ${rank}'s pids ${JSON.stringify(r.pids)}`).toBe(1 + (deaths[rank] ?? 0));
    expect(r.doc?.restarts).toBe(Object.values(deaths).reduce((a, b) => a + b, 0));
  };

  return { run, expectSameAsNone, expectOnlyRestarted, nextName };
}
