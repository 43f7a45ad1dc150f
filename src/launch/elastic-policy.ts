/**
 * The restart policy of `--mode elastic`: a failed rank's slot is started again when it can be
 * — within `--max-restarts`, on its host unless that host looks gone, else on a free slot of
 * another host — and the new process joins the running job at its next checkpoint; when it
 * cannot, the job goes on without it (`continue`). Either way the coordinator's machine
 * (elastic-membership.ts) has the others roll back at once and go on as a smaller world; below
 * `--min-np` it waits `--elastic-timeout` for ranks to join, then this policy stops the job
 * (`LAUNCH_TOO_FEW`).
 *
 * The policy also keeps the record of the job's worlds: every change as a replay takes it
 * (the results file's `recovery.changes`, which `--replay` and `lifeline drill` run again
 * without faults), reports each change (`world-changed`), and gives the job's results by rank
 * of its final world.
 *
 * - A job-fatal error reported by a rank fails the job (re-running cannot help).
 * - A replay (`--replay`) runs without faults: any failure fails it.
 * - After the release every result is in: a rank that dies on its way out fails nothing.
 *
 * @example
 * const sup = new Supervisor(config, { ...deps, policy: new ElasticPolicy(config) });
 */
import { ChangeRecorder, type ElasticEvent } from "./elastic-membership.ts";
import type { ElasticConfig } from "./options.ts";
import { FATAL_KINDS, type JobView, type PolicyContext, type PolicyDecision, type RankFailure, type RestartPolicy } from "./policy.ts";

export class ElasticPolicy implements RestartPolicy {
  readonly mode = "elastic" as const;
  private ctx: PolicyContext | undefined;
  private readonly recorder: ChangeRecorder;
  /** Decided worlds that roll back, by id. */
  private readonly rollbacks = new Set<number>();
  private readonly entered = new Set<number>();
  /** Slots whose process leaves the world in a replayed change: its clean end is no failure. */
  private readonly leaving = new Set<number>();
  /** The final world's slots in rank order, once released. */
  private released: number[] | undefined;
  private readonly lost: number[] = [];
  private readonly sizes: number[];

  constructor(private readonly elastic: ElasticConfig) {
    this.recorder = new ChangeRecorder(Array.from({ length: elastic.initial }, (_, slot) => ({ slot, attempt: 0 })));
    this.sizes = [elastic.initial];
  }

  async attach(ctx: PolicyContext): Promise<void> {
    this.ctx = ctx;
  }

  decide(failure: RankFailure, job: JobView): PolicyDecision {
    if (FATAL_KINDS.includes(failure.kind) || failure.rank === undefined) return { kind: "fail-job" };
    if (this.released !== undefined) return { kind: "continue" };
    if (this.elastic.plan !== undefined) {
      return { kind: "fail-job", message: `${failure.message}; a replay (--replay) runs the recorded changes without faults, so it stops here` };
    }
    this.lost.push(failure.rank);
    // No slot to start it in, or no restarts left: the others go on without it.
    if (job.restarts >= job.maxRestarts || job.placeable === false) return { kind: "continue" };
    return { kind: "restart", ranks: [failure.rank], delayMs: job.backoffMs };
  }

  exitIsFine(rank: number, code: number | null): boolean {
    // After the release, a process outside the final world (one starting to join) has nothing to finish.
    if (this.released !== undefined) return code === 0 || !this.released.includes(rank);
    return code === 0 && this.leaving.has(rank);
  }

  onElastic(ev: ElasticEvent): RankFailure | undefined {
    this.recorder.add(ev);
    switch (ev.kind) {
      case "decided":
        if (ev.rollback) this.rollbacks.add(ev.view);
        for (const m of ev.leaving) this.leaving.add(m.slot);
        return undefined;
      case "switched": {
        if (this.entered.has(ev.view)) return undefined;
        this.entered.add(ev.view);
        // The worlds the program ran in: this one last, the one it follows before it.
        const t = this.recorder.timeline();
        const to = t[t.length - 1]?.members ?? [];
        const from = t[t.length - 2]?.members ?? [];
        const stay = to.filter((m) => from.some((f) => f.slot === m.slot && f.attempt === m.attempt)).length;
        this.sizes.push(to.length);
        this.ctx?.report({
          kind: "world-changed",
          view: ev.view,
          at: ev.at,
          from: from.length,
          to: to.length,
          left: from.length - stay,
          joined: to.length - stay,
          rollback: this.rollbacks.has(ev.view),
        });
        return undefined;
      }
      case "waiting":
        this.ctx?.report({
          kind: "warning",
          message: `${ev.left} rank${ev.left === 1 ? "" : "s"} left, fewer than --min-np ${ev.minNp}: waiting up to ${ev.waitMs} ms (--elastic-timeout) for ranks to join`,
        });
        return undefined;
      case "too-few":
        return {
          kind: "rendezvous",
          rank: undefined,
          code: "LAUNCH_TOO_FEW",
          message:
            `only ${ev.left} rank${ev.left === 1 ? "" : "s"} left, fewer than --min-np ${ev.minNp}, and none came to join within ${ev.waitedMs} ms (--elastic-timeout); ` +
            `ranks lost: ${this.lost.length === 0 ? "none" : this.lost.join(", ")}. Allow a smaller world (--min-np), more restarts (--max-restarts) or more hosts`,
          exitStatus: undefined,
        };
      case "failed":
        return { kind: "restore", rank: undefined, code: ev.code, message: ev.message, exitStatus: undefined };
      case "released":
        this.released = ev.members;
        return undefined;
    }
  }

  finalWorld(bySlot: readonly unknown[]): unknown[] | undefined {
    return this.released?.map((s) => bySlot[s]);
  }

  summary(): Record<string, unknown> {
    return {
      changes: this.recorder.changes(),
      sizes: this.sizes,
      ranksLost: this.lost,
      ...(this.released === undefined ? {} : { finalSize: this.released.length }),
    };
  }
}
