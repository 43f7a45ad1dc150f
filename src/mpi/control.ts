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
  /** First message of a rank process: where its data socket listens (`curveKey`: its CURVE key, tcp with keys). */
  | { t: "hello"; rank: number; attempt: number; pid: number; endpoint: string; size: number; curveKey?: string }
  /** Progress: `steps` = checkpoint() calls so far in this attempt (a step boundary). */
  | { t: "step"; rank: number; steps: number; epoch: number }
  /** The rank called finalize(result); `result` is encodeValue(result). */
  | { t: "finalize"; rank: number; result: Uint8Array }
  /** The rank hit a job-fatal error (e.g. a collective mismatch) and asks for the job to stop. */
  | { t: "abort"; rank: number; code: string; message: string }
  /** Liveness, sent from the rank's watchdog thread. */
  | { t: "heartbeat"; rank: number; attempt: number }
  // ---- coordinated checkpointing (cpr), see src/cpr/coordinated ----
  /** The rank took its local checkpoint of `epoch` (it now records). */
  | { t: "cpr-checkpointed"; rank: number; epoch: number }
  /** readyToStopRecording: every late message of `epoch` has arrived at this rank. */
  | { t: "cpr-ready"; rank: number; epoch: number }
  /** The rank's part of line `epoch` is durable in its part store. */
  | { t: "cpr-part"; rank: number; epoch: number; ref: { rank: number; epoch: number; checksum: number; bytes: number } }
  /** The rank could not write its part of line `epoch` (the line cannot commit). */
  | { t: "cpr-part-failed"; rank: number; epoch: number; message: string }
  /**
   * Per-host stores, before the table: every part this rank verified in its host's store
   * (`where`: the database, e.g. `rank-2` or `held-by-0/rank-2`), the answer to `cpr-inventory`.
   */
  | { t: "cpr-held"; rank: number; parts: { ref: PartRefWire; where: string }[] }
  /** Per-host stores: the answer to `cpr-fetch`, the copy's bytes (or why there are none). */
  | { t: "cpr-copy"; rank: number; of: number; epoch: number; part?: Uint8Array; error?: string }
  /**
   * retry-one's durable floor: the rank's own checkpoint `epoch` (its version) is in its part
   * store, with what the launcher needs to tell whether it fits other ranks' (per peer:
   * messages sent, consumed, and the first one its sender log holds; collectives done).
   */
  | {
      t: "cpr-durable";
      rank: number;
      epoch: number;
      ref: PartRefWire;
      index: number;
      sent: number[];
      consumed: number[];
      logFrom: number[];
    }
  // ---- retry-one, see src/cpr/retry-one ----
  /**
   * A restarted rank caught up: it restored checkpoint `restored` from its peers (0: none),
   * was answered `replayed` collectives from their buffers, and now runs collective `seqno` of
   * version `version` on the wire with the others.
   */
  | { t: "retry-caught-up"; rank: number; attempt: number; restored: number; version: number; seqno: number; replayed: number }
  // ---- elastic, see src/cpr/elastic ----
  /**
   * The rank's (a slot's) answer to the news of world `view`: whether it holds the job's state,
   * the newest and oldest checkpoint versions it holds, and whether it called restore().
   */
  | { t: "elastic-summary"; rank: number; view: number; hasState: boolean; reached: number; oldest: number; started: boolean }
  /** The rank (a slot) now runs in world `view`, which it entered at checkpoint version `at`. */
  | { t: "elastic-switched"; rank: number; view: number; at: number };

/** Coordinator → rank. */
export type CoordinatorToRank =
  /**
   * Every rank's data endpoint, sent once all ranks said hello (and again to a restarted rank).
   * `restore` (cpr) names the committed recovery line to restore from and this rank's part of
   * it; absent on a fresh start (and on a restart before the first line).
   */
  | {
      t: "table";
      /**
       * The keys of this rank's channels (src/mpi/wire.ts): `keysIn[s]` of frames from rank `s`
       * to it, `keysOut[d]` of its frames to rank `d`.
       */
      keysIn: number[];
      keysOut: number[];
      endpoints: string[];
      /** tcp with keys: each rank's data-socket CURVE key ("" for a rank down). */
      curveKeys?: string[];
      attempts: number[];
      restore?: {
        epoch: number;
        ref: PartRefWire;
        /** Per-host stores: the part itself, fetched from its partner copy (this host lost it). */
        part?: Uint8Array;
      };
      /**
       * Per-host stores (cpr): the rank that keeps a copy of this rank's parts, on another host,
       * and the committed lines to keep (every other part goes, also newer ones).
       */
      partner?: number;
      keep?: number[];
      /**
       * cpr with `--checkpoint-every Nsteps`: N. A rank reports its step count as soon as it has
       * made N `checkpoint()` calls since its last checkpoint, not only every 200 ms, so that the
       * coordinator asks for the next line after N steps, as the flag says.
       */
      checkpointSteps?: number;
      /** retry-one: ranks down right now (dead, not running again yet). */
      down?: number[];
      /**
       * retry-one, to a restarted rank: the checkpoint count its previous incarnation had
       * reported; it has caught up once past it (or once it runs a collective with the others).
       */
      reached?: number;
      /**
       * A job across hosts: each rank's host (an index) at the job's start, the same in every
       * table of the job; retry-one places replicas on other hosts first.
       */
      hosts?: number[];
      /** The job's recovery mode; a rank started for another one refuses to run (MPI_INIT). */
      mode?: string;
      /**
       * retry-one: every rank restarts at once from a durable line (the floor, or a resumed
       * job): each rank's version in it (0: its start) and its collective index. This rank's
       * part is `restore`'s (absent when its version is 0).
       */
      retryStart?: { versions: number[]; index: number };
      /**
       * elastic: the world this rank starts in (`members`, absent for a rank that joins a running
       * job) and the checkpoint versions at which a replayed change of the world is due (`plan`).
       */
      elastic?: { members?: ElasticMember[]; plan: number[] };
    }
  /**
   * elastic: the coordinator's next world, `members` in rank order. `rollback`: a member of the
   * world before is gone, so the members go back to the last checkpoint they all reached;
   * otherwise the world changes at checkpoint `at` (a replayed change) or at the next one
   * every member reaches. `leaving`: members of the world before that take part in the change
   * and then end (a replayed change).
   */
  | { t: "elastic-view"; view: number; members: ElasticMember[]; leaving: ElasticMember[]; rollback: boolean; at?: number }
  /**
   * elastic: how world `view` starts (every member's summary was in): from checkpoint `target`,
   * which slot `root` sends to the slots `joiners` (they lack it).
   */
  | { t: "elastic-decision"; view: number; target: number; root: number; joiners: number[] }
  /** One peer's endpoint changed (it was restarted). */
  | { t: "peer"; rank: number; endpoint: string; attempt: number; curveKey?: string }
  /** retry-one: incarnation `attempt` of `rank` died (sent at once, before any restart). */
  | { t: "peer-down"; rank: number; attempt: number }
  /** All ranks finalized: close sockets and exit. */
  | { t: "release" }
  /** Stop now: the job failed or was interrupted. */
  | { t: "abort"; code: string; message: string }
  /**
   * The coordinator has this rank's `abort`: the rank may now fail its program (whose exit,
   * reported by the launcher, must not overtake the abort that explains it).
   */
  | { t: "abort-heard" }
  // ---- coordinated checkpointing (cpr) ----
  /** pleaseCheckpoint: take a local checkpoint of `epoch` at the next checkpoint() call. */
  | { t: "cpr-checkpoint"; epoch: number }
  /** stopRecording: every rank is ready; stop logging and write your part of line `epoch`. */
  | { t: "cpr-stop"; epoch: number }
  /** Line `epoch` is committed; parts of epochs not in `keep` may be deleted. */
  | {
      t: "cpr-committed";
      epoch: number;
      keep: number[];
      /** Per-host stores: the commit record and the job record, kept on every host. */
      line?: LineRecordWire;
      job?: Record<string, unknown>;
    }
  /** Per-host stores, before the table: report every part your host's store holds (`cpr-held`). */
  | { t: "cpr-inventory" }
  /** Per-host stores, before the table: send part `ref` from database `where` of your host's store (`cpr-copy`). */
  | { t: "cpr-fetch"; of: number; ref: PartRefWire; where: string }
  /** Line `epoch` will never be committed: delete your part of it (or do not write it). */
  | { t: "cpr-aborted"; epoch: number }
  /** retry-one's durable floor: keep your parts of these versions (and newer ones); the older others may go. */
  | { t: "cpr-durable-keep"; keep: number[] }
  /**
   * The answer to a heartbeat on the watchdog's socket: the coordinator is there and this
   * incarnation is still the rank's current one. A rank that hears none for its failure
   * timeout ends itself with {@link EXIT_COORDINATOR_LOST} (its coordinator's host died, the
   * network is partitioned, or the rank was declared dead and replaced).
   */
  | { t: "lease" };

/** elastic: one rank process of a world: its slot (`LIFELINE_RANK`), incarnation and data endpoint. */
export interface ElasticMember {
  slot: number;
  attempt: number;
  endpoint: string;
  /** Its CURVE public key, when the job's links use CURVE (as the table's `curveKeys`). */
  curveKey?: string;
}

/** A part of a recovery line as messages name it (src/store/types.ts PartRef). */
export interface PartRefWire {
  rank: number;
  epoch: number;
  checksum: number;
  bytes: number;
}

/** A commit record as messages carry it (src/store/types.ts LineRecord, without meta). */
export interface LineRecordWire {
  epoch: number;
  timeMs: number;
  parts: PartRefWire[];
  job?: { id: string; run: number };
}

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

/**
 * Exit code of a rank that lost its coordinator (no lease for its failure timeout): EX_TEMPFAIL,
 * "try again later". An engine that restarts ranks (Kubernetes, a batch requeue) may restart
 * it; `lifeline run` resumes the job.
 */
export const EXIT_COORDINATOR_LOST = 75;

/**
 * The routing id a rank's Dealer uses, so the coordinator can address it: `r<rank>.<attempt>`,
 * followed by `/<token>` in a job with keys (src/mpi/keys.ts: the token makes it unguessable,
 * binding the link to the incarnation). Without a token, also the name of its ipc socket.
 */
export function controlIdentity(rank: number, attempt: number, token?: string): string {
  return token === undefined ? `r${rank}.${attempt}` : `r${rank}.${attempt}/${token}`;
}

/** The routing id of a rank's heartbeat socket (on its watchdog thread). */
export function heartbeatIdentity(rank: number, attempt: number, token?: string): string {
  return `hb:${controlIdentity(rank, attempt, token)}`;
}
