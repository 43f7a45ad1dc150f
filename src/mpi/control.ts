/**
 * The control channel between a rank and the job's coordinator (rendezvous, results,
 * aborts, later the recovery protocols' control messages).
 *
 * Each rank connects one ZeroMQ `Dealer` (routing id `r<rank>.<attempt>`) to the
 * coordinator's `Router`. Messages are msgpack maps tagged by `t`. The rank side lives here
 * (the communicator owns the link); the coordinator in `src/launch` imports these types.
 *
 * @example
 * const frame = encodeControl({ t: "hello", rank: 0, attempt: 0, pid: process.pid, endpoint });
 * const msg = decodeControl(frame); // throws MPI_DECODE on garbage
 */
import { Packr } from "msgpackr";
import { LifelineError } from "../errors.ts";

/** Rank → coordinator. */
export type RankToCoordinator =
  /** First message of a rank process: where its data socket listens. */
  | { t: "hello"; rank: number; attempt: number; pid: number; endpoint: string; size: number }
  /** Progress: `steps` = checkpoint() calls so far in this attempt (a step boundary). */
  | { t: "step"; rank: number; steps: number; epoch: number }
  /** The rank called finalize(result); `result` is encodeValue(result). */
  | { t: "finalize"; rank: number; result: Uint8Array }
  /** The rank hit a job-fatal error (e.g. a collective mismatch) and asks for the job to stop. */
  | { t: "abort"; rank: number; code: string; message: string }
  /** Liveness, sent from the rank's watchdog thread. */
  | { t: "heartbeat"; rank: number; attempt: number };

/** Coordinator → rank. */
export type CoordinatorToRank =
  /** Every rank's data endpoint, sent once all ranks said hello (and again to a restarted rank). */
  | { t: "table"; jobKey: number; endpoints: string[]; attempts: number[] }
  /** One peer's endpoint changed (it was restarted). */
  | { t: "peer"; rank: number; endpoint: string; attempt: number }
  /** All ranks finalized: close sockets and exit. */
  | { t: "release" }
  /** Stop now: the job failed or was interrupted. */
  | { t: "abort"; code: string; message: string };

export type ControlMessage = RankToCoordinator | CoordinatorToRank;

const packr = new Packr({ useRecords: false });

export function encodeControl(msg: ControlMessage): Buffer {
  return packr.pack(msg);
}

/** Decodes a control frame; throws `MPI_DECODE` for anything that is not a tagged map. */
export function decodeControl(frame: Buffer | undefined): ControlMessage {
  if (frame === undefined) throw new LifelineError("MPI_DECODE", "empty control message");
  let msg: unknown;
  try {
    msg = packr.unpack(frame);
  } catch (err) {
    throw new LifelineError("MPI_DECODE", `malformed control message: ${(err as Error).message}`, { cause: err });
  }
  if (typeof msg !== "object" || msg === null || typeof (msg as { t?: unknown }).t !== "string") {
    throw new LifelineError("MPI_DECODE", "control message is not a tagged map");
  }
  return msg as ControlMessage;
}

/** The routing id a rank's Dealer uses, so the coordinator can address it. */
export function controlIdentity(rank: number, attempt: number): string {
  return `r${rank}.${attempt}`;
}
