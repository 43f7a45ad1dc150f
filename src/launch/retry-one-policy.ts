/**
 * The restart policy of `--mode retry-one` (Rabit-style): a failed rank is restarted alone,
 * with attempt + 1 after the supervisor's back-off; the others keep their processes and
 * memory and restore it from theirs (src/cpr/retry-one). The supervisor tells the survivors
 * at once (`peer-down`), and `peer` with the new endpoint once the new process says hello.
 *
 * - A job-fatal error reported by a rank (e.g. a replay mismatch, more failures than the
 *   replicas cover) fails the job: every rank computed the same decision, re-running cannot help.
 * - `--max-restarts` exhausted: the job fails with `LAUNCH_RESTARTS` (the survivors are
 *   aborted; they would fail on their own with `MPI_TIMEOUT` after `--failure-timeout`).
 *
 * @example
 * const sup = new Supervisor(config, { ...deps, policy: new RetryOnePolicy() });
 */
import { FATAL_KINDS, type JobView, type PolicyDecision, type RankFailure, type RestartPolicy } from "./policy.ts";

export class RetryOnePolicy implements RestartPolicy {
  readonly mode = "retry-one" as const;
  private readonly restarted: { rank: number; delayMs: number }[] = [];

  decide(failure: RankFailure, job: JobView): PolicyDecision {
    if (FATAL_KINDS.includes(failure.kind) || failure.rank === undefined) return { kind: "fail-job" };
    if (job.restarts >= job.maxRestarts) {
      return {
        kind: "fail-job",
        code: "LAUNCH_RESTARTS",
        message:
          `${failure.message}; giving up: ${job.restarts} restart(s) already (--max-restarts ${job.maxRestarts}), ` +
          `and in --mode retry-one the other ranks cannot go on without rank ${failure.rank}`,
      };
    }
    this.restarted.push({ rank: failure.rank, delayMs: job.backoffMs });
    return { kind: "restart", ranks: [failure.rank], delayMs: job.backoffMs };
  }

  summary(): Record<string, unknown> {
    return { ranksRestarted: this.restarted.map((r) => r.rank) };
  }
}
