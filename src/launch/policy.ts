/**
 * The contract between the supervisor and a recovery mode's restart policy: what a failure is
 * ({@link RankFailure}), what a policy may look at ({@link JobView}) and answer
 * ({@link PolicyDecision}), and the hooks through which it follows the job
 * ({@link RestartPolicy}). Detection and teardown stay in the supervisor; a policy only
 * decides. Kept apart from supervisor.ts so that the policies (cpr-policy.ts,
 * retry-one-policy.ts) and the supervisor that runs them do not import each other.
 *
 * @example
 * const policy: RestartPolicy = { mode: "none", decide: () => ({ kind: "fail-job" }) };
 */
import type { LifelineErrorCode } from "../errors.ts";
import type { CoordinatorToRank, RankToCoordinator } from "../mpi/control.ts";
import type { Mode } from "../mpi/env.ts";
import type { ElasticEvent } from "./elastic-membership.ts";
import type { JobEvent } from "./progress.ts";

/** Why a rank (or the job as a whole) failed. */
export interface RankFailure {
  kind: "exit" | "abort" | "heartbeat" | "stuck" | "start" | "bad-result" | "rendezvous" | "spawn" | "release-hang" | "interrupted" | "restore";
  /** The rank at fault, if one is. */
  rank: number | undefined;
  code: LifelineErrorCode;
  /** One line, for the summary: "rank 1 (pid 123) was killed by SIGKILL before finalizing". */
  message: string;
  /** The rank's own exit status, when it ended by itself; becomes the launcher's exit code. */
  exitStatus: number | undefined;
}

/** Failures that a restart cannot fix, in any mode: the program or the launch itself is wrong. */
export const FATAL_KINDS: readonly RankFailure["kind"][] = ["abort", "bad-result", "release-hang", "rendezvous", "spawn", "interrupted", "restore"];

/** What a policy may look at. */
export interface JobView {
  readonly size: number;
  readonly mode: Mode;
  /** Restarts that count against `maxRestarts`: since the start, or since the last `--restart-reset`. */
  readonly restarts: number;
  readonly maxRestarts: number;
  readonly finalized: readonly boolean[];
  /** The back-off (with jitter) to wait if this failure is restarted (src/launch/backoff.ts). */
  readonly backoffMs: number;
  /**
   * The failed rank could be started again: its host, unless the failure suggests the host is
   * gone, or a free slot on another host (false only in a job across hosts).
   */
  readonly placeable?: boolean;
}

/** A policy's answer to a failure. */
export type PolicyDecision =
  /** Stop the job: abort and kill every rank, report `failure` (or this code and message instead). */
  | { kind: "fail-job"; code?: LifelineErrorCode; message?: string }
  /** Restart these ranks (attempt + 1) after `delayMs`; the others keep running or are rolled back by the protocol. */
  | { kind: "restart"; ranks: number[]; delayMs: number }
  /** elastic: the job goes on without the failed rank (its process is not started again). */
  | { kind: "continue" };

/**
 * The hook through which recovery modes decide what a failure means. Detection and teardown
 * stay in the supervisor; a policy only decides.
 */
export interface RestartPolicy {
  readonly mode: Mode;
  decide(failure: RankFailure, job: JobView): PolicyDecision;
  /** A coordinated-checkpoint protocol message from a rank (cpr only). */
  onCprMessage?(rank: number, msg: Extract<RankToCoordinator, { t: `cpr-${string}` }>): void;
  /** Called once before the first spawn, with what the policy may do to the running job. */
  attach?(ctx: PolicyContext): Promise<void>;
  /** Every rank said hello and got the table (at the start and after each restart). */
  onReady?(): void;
  /** A rank's progress report: checkpoint() calls this attempt, and the epoch (cpr) or checkpoint count (retry-one) it is in. */
  onStep?(rank: number, steps: number, epoch: number): void;
  /** Every rank is down for a restart of all: choose what they restore from. */
  prepareRestart?(attempt: number): Promise<void>;
  /**
   * Every rank of a start of all said hello; the tables go out when this resolves (cpr with
   * per-host stores: the ranks report the parts they hold, and copies of lost parts are
   * fetched). `hosts` is each rank's host index now, in a job across hosts. A rejection fails
   * the job (`restore`).
   */
  beforeTables?(hosts: readonly number[] | undefined): Promise<void>;
  /** Extra fields of one rank's table (cpr: its part of the recovery line). */
  tableFor?(rank: number): Partial<Extract<CoordinatorToRank, { t: "table" }>>;
  /** What the results file should say about recovery (e.g. the epochs rolled back to). */
  summary?(): Record<string, unknown>;
  /** elastic: news of the job's world; a failure it returns stops the job. */
  onElastic?(ev: ElasticEvent): RankFailure | undefined;
  /** A rank's process ended with `code` without finalizing, and that is no failure (elastic: it left the world). */
  exitIsFine?(rank: number, code: number | null): boolean;
  /** elastic: the job's results by rank of its final world, from the results by slot; undefined until released. */
  finalWorld?(bySlot: readonly unknown[]): unknown[] | undefined;
  /** The job is over and every rank process has exited: release resources (timers, the manifest). */
  close?(end: JobEnd): Promise<void>;
}

/** How the job ended, for {@link RestartPolicy.close}. */
export interface JobEnd {
  readonly ok: boolean;
  readonly exitCode: number;
  /** Stopped by a signal to the launcher. */
  readonly interrupted: boolean;
}

/** What a policy may do to the running job. */
export interface PolicyContext {
  /** Sends a message to every rank of the current attempt. */
  broadcast(msg: CoordinatorToRank): void;
  /** Sends a message to one rank of the current attempt (if it said hello). */
  send(rank: number, msg: CoordinatorToRank): void;
  report(ev: JobEvent): void;
}

/**
 * cpr's answer to a failure: every rank restarts (and rolls back to the newest committed line)
 * after the back-off, unless the failure is one a restart cannot fix or `--max-restarts` is
 * used up. Pure: the launcher's policy (cpr-policy.ts) and the simulator both ask it.
 *
 * @example
 * restartAllDecision(failure, job); // { kind: "restart", ranks: [0, 1, 2, 3], delayMs: 137 }
 */
export function restartAllDecision(failure: RankFailure, job: JobView): PolicyDecision {
  if (FATAL_KINDS.includes(failure.kind)) return { kind: "fail-job" };
  if (job.restarts >= job.maxRestarts) {
    return {
      kind: "fail-job",
      code: "LAUNCH_RESTARTS",
      message: `${failure.message}; giving up: the job was already restarted ${job.restarts} time(s) (--max-restarts ${job.maxRestarts})`,
    };
  }
  return { kind: "restart", ranks: Array.from({ length: job.size }, (_, r) => r), delayMs: job.backoffMs };
}

/**
 * retry-one's answer to a failure: the failed rank alone restarts after the back-off; failures
 * beyond the in-memory replicas (a rank's `CPR_LOST` abort) restart every rank from the durable
 * floor when there is one (`durable`), and otherwise end the job. Pure: the launcher's policy
 * (retry-one-policy.ts) and the simulator both ask it.
 *
 * @example
 * retryOneDecision(exitOfRank2, job, false); // { kind: "restart", ranks: [2], delayMs: 137 }
 */
export function retryOneDecision(failure: RankFailure, job: JobView, durable: boolean): PolicyDecision {
  if (failure.kind === "abort" && failure.code === "CPR_LOST") {
    if (!durable) {
      return {
        kind: "fail-job",
        code: "CPR_LOST",
        message: `${failure.message}; with --durable-every the job would restart every rank from its newest durable checkpoints instead`,
      };
    }
    if (job.restarts >= job.maxRestarts) {
      return {
        kind: "fail-job",
        code: "LAUNCH_RESTARTS",
        message: `${failure.message}; giving up: ${job.restarts} restart(s) already (--max-restarts ${job.maxRestarts})`,
      };
    }
    // Beyond the replicas: every rank restarts from the durable floor.
    return { kind: "restart", ranks: Array.from({ length: job.size }, (_, r) => r), delayMs: job.backoffMs };
  }
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
  return { kind: "restart", ranks: [failure.rank], delayMs: job.backoffMs };
}

/** `--mode none`: any failure fails the job (the baseline). */
export const failFastPolicy: RestartPolicy = {
  mode: "none",
  decide: () => ({ kind: "fail-job" }),
};
