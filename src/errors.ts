/**
 * Typed errors. `code` is part of the API and stable; the message is for people and may change.
 *
 * Three kinds of failure, handled differently:
 * - broken internal invariants go through `node:assert` and crash the rank (the supervisor recovers);
 * - bad arguments at the public API throw `TypeError` / `RangeError` (no code);
 * - operating errors throw {@link LifelineError} with a code prefixed `MPI_`, `CPR_`, `STORE_`, `LAUNCH_`.
 *
 * @example
 * try { await world.recv(0, 7); } catch (err) {
 *   if (isLifelineError(err, "MPI_FINALIZED")) console.error("recv after finalize()");
 * }
 */
export type LifelineErrorCode =
  // message passing
  | "MPI_RANK" // a rank outside 0..size-1 (or the caller's own rank where not allowed)
  | "MPI_TAG" // a tag that is negative, too large, or otherwise unusable
  | "MPI_ENCODE" // data that cannot be encoded (functions, symbols, cyclic objects...)
  | "MPI_DECODE" // a frame that cannot be decoded (malformed wire data)
  | "MPI_COLLECTIVE_MISMATCH" // ranks called a collective with different kinds, roots, ops, types or lengths
  | "MPI_OP" // a reduction op that does not apply to the data
  | "MPI_FINALIZED" // a call after finalize()
  | "MPI_ABORTED" // the job was aborted (another rank failed or the launcher stopped it)
  | "MPI_INIT" // init() could not join a job (missing environment, coordinator unreachable)
  | "MPI_MODE" // the call is not supported in this mode
  | "MPI_REQUEST" // misuse of a request (waited on twice after completion is fine; invalid state is not)
  | "MPI_BOOTSTRAP" // a bootstrap key reused, or a bootstrap collective after the first checkpoint
  | "MPI_TIMEOUT" // a bounded wait ran out
  | "MPI_WORLD_CHANGED" // elastic: the world changed (a rank left or joined); call restore() and go on with the new rank and size
  | "MPI_LIMIT" // a message longer than --max-message, or more unmatched messages than --max-unexpected
  // checkpoint-restart
  | "CPR_RESTORE" // restore() misuse or a restore that cannot be served
  | "CPR_LOST" // retry-one: more failures at once than the replicas cover; the in-memory recovery data is gone
  | "CPR_CHECKPOINT" // checkpoint() misuse (e.g. outstanding requests at a checkpoint location)
  | "CPR_PROTOCOL" // a protocol message that makes no sense in the current state
  | "CPR_REPLAY" // replay diverged from the log (the program is not piecewise deterministic)
  // store
  | "STORE_NOT_OPEN"
  | "STORE_CORRUPT"
  | "STORE_LOCKED"
  | "STORE_IO"
  | "STORE_NOT_FOUND" // no Lifeline store at the path: missing, not a directory, or a directory that is not a store
  // launcher
  | "LAUNCH_USAGE" // bad flags or arguments
  | "LAUNCH_SPAWN" // a rank process could not be started
  | "LAUNCH_RENDEZVOUS" // a rank did not join (say hello) within the rendezvous timeout
  | "LAUNCH_RANK_FAILED" // a rank died (exit code or signal)
  | "LAUNCH_STUCK" // a rank made no progress within --stuck-timeout
  | "LAUNCH_HEARTBEAT" // a rank missed heartbeats for --failure-timeout
  | "LAUNCH_RESTARTS" // --max-restarts exhausted
  | "LAUNCH_CRASH_LOOP" // a rank failed the same way twice in a row before its first checkpoint(): a bug, not a fault
  | "LAUNCH_RESUME" // the store holds another job's lines, or --resume found nothing to resume
  | "LAUNCH_START" // a rank did not join (call init()) within --start-timeout of its start
  | "LAUNCH_TOO_FEW" // elastic: fewer ranks than --min-np, and none came within --elastic-timeout
  | "LAUNCH_INTERRUPTED" // the launcher was told to stop (SIGINT/SIGTERM)
  | "LAUNCH_FAULT_SPEC"; // a malformed --kill / LIFELINE_FAULTS spec

export class LifelineError extends Error {
  override readonly name = "LifelineError";
  readonly code: LifelineErrorCode;
  constructor(code: LifelineErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
  }
}

/** True when `err` is a {@link LifelineError}, optionally with the given code. */
export function isLifelineError(err: unknown, code?: LifelineErrorCode): err is LifelineError {
  return err instanceof LifelineError && (code === undefined || err.code === code);
}

/** Message of any thrown value, for logs. */
export function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
