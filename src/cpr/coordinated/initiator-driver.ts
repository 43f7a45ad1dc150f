/**
 * Carries out the pure {@link CprInitiator}'s effects against a line manifest: broadcasts go
 * to the ranks, commits are written (then the manifest is pruned to `keepLines` and the
 * initiator told which lines are kept), aborted lines are recorded — all in one chain, so a
 * restart or a close can wait for what is being written. Shared by the launcher's restart
 * policy (src/launch/cpr-policy.ts, wall clock) and the simulator's coordinator
 * (src/testing/sim-cluster.ts, simulated clock).
 *
 * An initiator that was stopped (a restart began) gets no more inputs: a commit that finishes
 * afterwards is durable, but its `commit-done` is not fed back.
 *
 * @example
 * const driver = new InitiatorDriver(() => manifest, { keepLines: 2, now, broadcast, onAborted, onAbortNotRecorded });
 * driver.start(new CprInitiator({ ... }));
 * driver.input({ kind: "tick", nowMs: now() });
 */
import type { CoordinatorToRank } from "../../mpi/control.ts";
import type { LineJob, LineManifest, LineRecord } from "../../store/types.ts";
import type { CprInitiator, InitiatorEffect, InitiatorInput } from "./initiator.ts";

export interface InitiatorDriverHooks {
  readonly keepLines: number;
  /** Recorded in every line's commit record: the job and run that committed it. */
  readonly lineJob?: LineJob | undefined;
  now(): number;
  broadcast(msg: CoordinatorToRank): void;
  /** The commit record of a line is durable (before pruning). */
  onDurable?(record: LineRecord): void;
  /** The initiator reports a committed line (its duration and size). */
  onLineCommitted?(eff: Extract<InitiatorEffect, { kind: "line-committed" }>): void;
  /** The initiator gave up line `epoch` (it is being recorded as aborted). */
  onAborted(epoch: number, reason: string): void;
  /** Recording that abort failed. */
  onAbortNotRecorded(epoch: number, err: Error): void;
}

export class InitiatorDriver {
  private current: CprInitiator | undefined;
  private chain: Promise<void> = Promise.resolve();

  constructor(
    private readonly manifest: () => LineManifest,
    private readonly hooks: InitiatorDriverHooks,
  ) {}

  /** Drives `initiator` from now on (the previous one, if any, gets no more inputs). */
  start(initiator: CprInitiator): void {
    this.current = initiator;
  }

  /** No more inputs to the current initiator (a restart, or the end of the job). */
  stop(): void {
    this.current = undefined;
  }

  /** Resolves when every commit and abort record begun so far is written (or failed). */
  settled(): Promise<void> {
    return this.chain;
  }

  input(input: InitiatorInput): void {
    const init = this.current;
    if (init === undefined) return;
    for (const eff of init.step(input)) this.effect(init, eff);
  }

  private effect(init: CprInitiator, eff: InitiatorEffect): void {
    switch (eff.kind) {
      case "broadcast":
        this.hooks.broadcast(eff.msg);
        return;
      case "commit": {
        const manifest = this.manifest();
        const feed = (input: InitiatorInput): void => {
          if (this.current === init) for (const e of init.step(input)) this.effect(init, e);
        };
        this.chain = this.chain.then(async () => {
          try {
            const record = await manifest.commitLine(eff.epoch, eff.refs, this.hooks.lineJob === undefined ? undefined : { job: this.hooks.lineJob });
            this.hooks.onDurable?.(record);
            await manifest.prune(this.hooks.keepLines);
            const keep = (await manifest.list()).map((l) => l.epoch);
            feed({ kind: "commit-done", epoch: eff.epoch, keep, nowMs: this.hooks.now() });
          } catch (err) {
            feed({ kind: "commit-failed", epoch: eff.epoch, message: (err as Error).message, nowMs: this.hooks.now() });
          }
        });
        return;
      }
      case "abort-line": {
        this.hooks.onAborted(eff.epoch, eff.reason);
        const manifest = this.manifest();
        this.chain = this.chain.then(() => manifest.abortLine(eff.epoch)).catch((err: unknown) => this.hooks.onAbortNotRecorded(eff.epoch, err as Error));
        return;
      }
      case "line-committed":
        this.hooks.onLineCommitted?.(eff);
        return;
    }
  }
}
