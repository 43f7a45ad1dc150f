/**
 * One rank's side of coordinated checkpointing (the protocol of Bronevetsky, Marques, Pingali
 * and Stodghill, "Automated application-level checkpointing of MPI programs", PPoPP 2003), as
 * a pure state machine: no I/O, no timers, no clock. The driver
 * (driver.ts) feeds it what happens on the message path and carries out the effects.
 *
 * State: epoch e (0 at a fresh start), `recording`, `checkpointDue`. Rounds never overlap
 * (the initiator starts e+1 only after e ended), so a peer's epoch is e-1, e or e+1:
 * - sender epoch < mine → **late** (sent before the sender's checkpoint, received after
 *   ours): the sender will not re-send it, so it goes into our late log;
 * - sender epoch > mine → **early**: our state will contain it, so its id
 *   (source, channelSeq) goes into our checkpoint and the sender drops it on recovery; a
 *   newer epoch also means a checkpoint is due;
 * - same epoch → intra-epoch, nothing to do.
 * Classification happens at *arrival*, not at consumption: unconsumed messages
 * that arrived before our checkpoint are channel state saved with it.
 *
 * At its checkpoint a rank sends every peer a marker carrying how many frames it sent that
 * peer in the closing epoch. Channels are FIFO, so once a peer's marker has arrived every
 * late message from it has too; the count is checked against what arrived (an invariant).
 * With markers from every peer, the rank is ready to stop recording. It stops on
 * the initiator's stopRecording, or earlier on a same-epoch message whose sender has stopped
 * (what follows such a message may not be replayed the same way).
 *
 * While recording, every non-deterministic outcome is logged by ordinal since the
 * checkpoint; a restored rank replays the log by ordinal, then runs freely. Polls of a
 * request (`test()`/`done`) that saw it not done are the common case of a polling loop and
 * cost no memory: only the highest such ordinal is kept, and on replay a poll whose ordinal
 * is missing from the log but not past its end saw "not done" (a poll is logged at once, so
 * every poll ordinal up to the log's end was logged while recording).
 *
 * A recording that cannot end within its bounds — the round outlives the driver's recording
 * timeout (the initiator aborted or lost it, or a peer never reaches a checkpoint location),
 * or its logs outgrow `nondetEntriesMax` (or the driver's byte bound) — is *abandoned*, not
 * fatal: the rank stops recording, drops its logs (memory back at once), and reports its
 * part as failed, so the initiator aborts the line and the last committed line stays the
 * recovery point (a line that cannot complete is aborted). A fatal error would
 * instead cost a restart of the whole job, every time a long phase outlasts the timeout.
 * Abandoning is safe because a line is committed only with every rank's part: the rank's
 * later messages (flagged not recording) may stop its peers' recordings early and their parts
 * may be written, but the line is never used. Late frames and markers of the abandoned epoch
 * that still arrive are delivered or ignored, not errors.
 *
 * @example
 * const m = new RankMachine({ rank: 1, size: 3 });
 * m.onControl({ t: "cpr-checkpoint", epoch: 1 });   // → checkpointDue
 * const effects = m.takeCheckpoint();               // → markers to 0 and 2, cpr-checkpointed
 */
import type { CoordinatorToRank, RankToCoordinator } from "../../mpi/control.ts";
import type { NondetEntry, NondetTicket } from "../../mpi/cpr-hook.ts";

export type RankEffect =
  /** Send a marker for `epoch` to `dest`: `sent` frames went to it in the closing epoch. */
  | { readonly kind: "marker"; readonly dest: number; readonly epoch: number; readonly sent: number }
  | { readonly kind: "control"; readonly msg: RankToCoordinator }
  /** Recording of `epoch` is over: build the part from {@link RankMachine.partLogs} and write it. */
  | { readonly kind: "write-part"; readonly epoch: number }
  /** Recording of `epoch` was abandoned (see the file comment): warn, report the part failed. */
  | { readonly kind: "abandon"; readonly epoch: number; readonly reason: string }
  | { readonly kind: "fatal"; readonly code: "CPR_PROTOCOL" | "CPR_REPLAY"; readonly message: string };

export type Verdict = "late" | "early" | "normal";

export interface RankMachineOptions {
  readonly rank: number;
  readonly size: number;
  /** Bound on logged non-deterministic outcomes per round (…Max). */
  readonly nondetEntriesMax?: number;
}

/** What a restored rank starts from (its part of the recovery line). */
export interface RestoredLogs {
  readonly epoch: number;
  /** Early ids by source: channel sequence numbers of frames we hold that the source will re-send. */
  /** [source, channelSeq, frame identity] of each early frame held. */
  readonly earlyIds: readonly (readonly [number, number, number?])[];
  readonly nondet: readonly (readonly [number, NondetEntry])[];
}

export const NONDET_ENTRIES_MAX_DEFAULT = 1_000_000;

export class RankMachine {
  epoch = 0;
  recording = false;
  checkpointDue = false;
  /** Epoch of the newest pleaseCheckpoint (or newer message) seen. */
  private dueEpoch = 0;
  private readonly size: number;
  private readonly rank: number;
  private readonly nondetMax: number;
  /** Frames sent to each peer in the current epoch. */
  private sentNow: number[];
  /** Frames arrived from each peer, by the sender's epoch stamp. */
  private readonly arrived = new Map<number, number[]>();
  /** Markers of the current epoch: the count each peer announced. */
  private markers = new Map<number, number>();
  /** Markers that arrived before our own checkpoint (for epoch + 1). */
  private markersAhead = new Map<number, number>();
  private readySent = false;
  /** The epoch whose recording was abandoned (its late frames and markers are no errors). */
  private abandoned = -1;
  /** Early ids of the checkpoint being taken: frames of epoch+1 that arrived before it. */
  private earlyNext: [number, number, number][] = [];
  /** Early ids saved with our current checkpoint. */
  earlyIds: [number, number, number][] = [];
  /** Late frames (opaque to the machine) logged in arrival order. */
  lateLog: unknown[] = [];
  private nondetLog = new Map<number, NondetEntry>();
  /** Highest ordinal of a poll logged as "not done" (kept implicitly, see the file comment). */
  private notDoneHigh = -1;
  private ordinal = 0;
  private replayLog: Map<number, NondetEntry> | undefined;
  private replayUntil = -1;
  /** Suppressed re-sends, by destination: channelSeqs to drop. */
  private readonly suppressSet: Set<number>[];
  suppressedCount = 0;

  constructor(opts: RankMachineOptions) {
    this.rank = opts.rank;
    this.size = opts.size;
    this.nondetMax = opts.nondetEntriesMax ?? NONDET_ENTRIES_MAX_DEFAULT;
    this.sentNow = new Array<number>(opts.size).fill(0);
    this.suppressSet = Array.from({ length: opts.size }, () => new Set<number>());
  }

  /** Starts from a recovery line: epoch `logs.epoch`, not recording, replaying `logs.nondet`. */
  restore(logs: RestoredLogs): void {
    this.epoch = logs.epoch;
    this.dueEpoch = logs.epoch;
    this.earlyIds = logs.earlyIds.map(([s, q, id]) => [s, q, id ?? q]);
    // The early frames are part of our state: count them as arrived in our epoch, as their
    // senders count them as sent (suppressed re-sends still count), so that the next
    // marker's count matches.
    const counts = this.counts(logs.epoch);
    for (const [s] of logs.earlyIds) counts[s]!++;
    // Nothing to replay: not replaying (a replay log, even an empty one, forbids checkpoints,
    // and an empty one would never end since no ordinal reaches its end).
    this.replayLog = logs.nondet.length === 0 ? undefined : new Map(logs.nondet.map(([o, e]) => [o, e]));
    this.replayUntil = logs.nondet.reduce((m, [o]) => Math.max(m, o), -1);
  }

  /**
   * Whether a due checkpoint may be taken at this location. Not while a restored rank still
   * replays its line's log or still has early frames to re-send (and suppress): its line counts
   * those frames, and those outcomes, in the restored epoch, so a checkpoint taken before they
   * happen again would move them into the next epoch — a count mismatch at the next marker, or
   * a replay cut short (found by the simulator: SEED=1005, SEED=584390233557).
   */
  get mayCheckpoint(): boolean {
    return this.checkpointDue && this.replayLog === undefined && this.suppressSet.every((s) => s.size === 0);
  }

  /** A peer told us (on recovery) which of our frames it already holds. */
  addSuppress(dest: number, channelSeqs: readonly number[]): void {
    for (const q of channelSeqs) this.suppressSet[dest]!.add(q);
  }

  /** The early ids we hold from `source` (sent to it on recovery). */
  earlyFrom(source: number): number[] {
    return this.earlyIds.filter(([s]) => s === source).map(([, , id]) => id);
  }

  /** The stamp of an outgoing frame to `dest`; counts it as sent in the current epoch. */
  stamp(dest: number): { epoch: number; recording: boolean } {
    if (dest !== this.rank) this.sentNow[dest]!++;
    return { epoch: this.epoch, recording: this.recording };
  }

  suppress(dest: number, channelSeq: number): boolean {
    const set = this.suppressSet[dest]!;
    if (!set.delete(channelSeq)) return false;
    this.suppressedCount++;
    return true;
  }

  private counts(epoch: number): number[] {
    let c = this.arrived.get(epoch);
    if (c === undefined) {
      c = new Array<number>(this.size).fill(0);
      this.arrived.set(epoch, c);
    }
    return c;
  }

  /**
   * A frame from a peer arrives (not a protocol frame, not a re-injected one). Returns its
   * class and the effects (a stop that must happen before the frame is delivered, fatal
   * errors). `payload` is kept in the late log if the frame is late.
   */
  arrive(
    a: { source: number; epoch: number; recording: boolean; channelSeq: number; id?: number },
    payload: unknown,
  ): { verdict: Verdict; effects: RankEffect[] } {
    const effects: RankEffect[] = [];
    if (a.source === this.rank) return { verdict: "normal", effects };
    this.counts(a.epoch)[a.source]!++;
    if (a.epoch === this.epoch) {
      // A message from a rank that already stopped recording ends our recording
      // too, before we act on it.
      if (this.recording && !a.recording) this.stop(this.epoch, effects);
      return { verdict: "normal", effects };
    }
    if (a.epoch === this.epoch + 1) {
      this.earlyNext.push([a.source, a.channelSeq, a.id ?? a.channelSeq]);
      this.due(a.epoch);
      return { verdict: "early", effects };
    }
    if (a.epoch + 1 === this.epoch) {
      if (!this.recording && this.abandoned === this.epoch) return { verdict: "normal", effects };
      if (!this.recording) {
        effects.push({
          kind: "fatal",
          code: "CPR_PROTOCOL",
          message: `rank ${this.rank}: a late message of epoch ${a.epoch} from rank ${a.source} arrived after recording of epoch ${this.epoch} stopped; it cannot be logged`,
        });
        return { verdict: "late", effects };
      }
      this.lateLog.push(payload);
      return { verdict: "late", effects };
    }
    effects.push({
      kind: "fatal",
      code: "CPR_PROTOCOL",
      message: `rank ${this.rank} (epoch ${this.epoch}) got a message of epoch ${a.epoch} from rank ${a.source}; epochs may differ by at most one`,
    });
    return { verdict: "normal", effects };
  }

  private due(epoch: number): void {
    if (epoch > this.epoch) {
      this.checkpointDue = true;
      this.dueEpoch = Math.max(this.dueEpoch, epoch);
    }
  }

  onControl(msg: CoordinatorToRank): RankEffect[] {
    const effects: RankEffect[] = [];
    switch (msg.t) {
      case "cpr-checkpoint":
        this.due(msg.epoch);
        break;
      case "cpr-stop":
        if (msg.epoch === this.epoch && this.recording) this.stop(msg.epoch, effects);
        break;
      default:
        break;
    }
    return effects;
  }

  /**
   * Takes the local checkpoint (the driver has serialized the program and library state):
   * epoch + 1, recording, markers to every peer.
   */
  takeCheckpoint(): RankEffect[] {
    const effects: RankEffect[] = [];
    const closing = this.epoch;
    this.epoch = closing + 1;
    this.checkpointDue = this.dueEpoch > this.epoch;
    this.recording = true;
    this.readySent = false;
    this.earlyIds = this.earlyNext;
    this.earlyNext = [];
    this.lateLog = [];
    this.nondetLog = new Map();
    this.notDoneHigh = -1;
    this.ordinal = 0;
    this.replayLog = undefined;
    this.replayUntil = -1;
    const sent = this.sentNow;
    this.sentNow = new Array<number>(this.size).fill(0);
    this.markers = this.markersAhead;
    this.markersAhead = new Map();
    for (const e of [...this.arrived.keys()]) if (e < closing) this.arrived.delete(e);
    effects.push({ kind: "control", msg: { t: "cpr-checkpointed", rank: this.rank, epoch: this.epoch } });
    for (let d = 0; d < this.size; d++) {
      if (d !== this.rank) effects.push({ kind: "marker", dest: d, epoch: this.epoch, sent: sent[d]! });
    }
    for (const [source, count] of this.markers) this.checkMarkerCount(source, count, effects);
    this.maybeReady(effects);
    return effects;
  }

  /** A peer's marker: it took its checkpoint of `epoch` after sending us `sent` frames. */
  onMarker(source: number, epoch: number, sent: number): RankEffect[] {
    const effects: RankEffect[] = [];
    if (epoch === this.epoch + 1) {
      this.markersAhead.set(source, sent);
      this.due(epoch);
      return effects;
    }
    if (epoch === this.epoch && !this.recording && this.abandoned === epoch) return effects;
    if (epoch !== this.epoch || !this.recording) {
      effects.push({
        kind: "fatal",
        code: "CPR_PROTOCOL",
        message: `rank ${this.rank} (epoch ${this.epoch}${this.recording ? ", recording" : ""}) got rank ${source}'s marker of epoch ${epoch}`,
      });
      return effects;
    }
    this.markers.set(source, sent);
    this.checkMarkerCount(source, sent, effects);
    this.maybeReady(effects);
    return effects;
  }

  private checkMarkerCount(source: number, sent: number, effects: RankEffect[]): void {
    // FIFO channels: the marker follows every frame the peer sent before its checkpoint.
    const got = this.arrived.get(this.epoch - 1)?.[source] ?? 0;
    if (got !== sent) {
      effects.push({
        kind: "fatal",
        code: "CPR_PROTOCOL",
        message: `rank ${this.rank}: rank ${source} sent ${sent} frame(s) in epoch ${this.epoch - 1}, but ${got} arrived before its marker`,
      });
    }
  }

  private maybeReady(effects: RankEffect[]): void {
    if (!this.recording || this.readySent || this.markers.size < this.size - 1) return;
    this.readySent = true;
    effects.push({ kind: "control", msg: { t: "cpr-ready", rank: this.rank, epoch: this.epoch } });
  }

  /**
   * The driver's recording timer for `epoch` fired (armed at the checkpoint, for longer than
   * the initiator's phase timeout). Abandons the recording if it is still going on.
   */
  onRecordingTimeout(epoch: number, timeoutMs: number): RankEffect[] {
    const effects: RankEffect[] = [];
    if (epoch !== this.epoch || !this.recording) return effects;
    this.abandon(
      `recording of epoch ${epoch} did not stop within ${timeoutMs} ms (the round was aborted or lost, or a rank never reached a checkpoint location)`,
      effects,
    );
    return effects;
  }

  /** Abandons the current recording (bounds exceeded): see the file comment. */
  abandonRecording(reason: string): RankEffect[] {
    const effects: RankEffect[] = [];
    if (this.recording) this.abandon(reason, effects);
    return effects;
  }

  private abandon(reason: string, effects: RankEffect[]): void {
    this.recording = false;
    this.abandoned = this.epoch;
    this.lateLog = [];
    this.nondetLog = new Map();
    this.notDoneHigh = -1;
    effects.push({ kind: "abandon", epoch: this.epoch, reason });
  }

  private stop(epoch: number, effects: RankEffect[]): void {
    this.recording = false;
    effects.push({ kind: "write-part", epoch });
  }

  /** The logs of the round that just stopped (for the part). */
  partLogs(): { earlyIds: [number, number, number][]; lateLog: unknown[]; nondet: [number, NondetEntry][] } {
    const nondet = [...this.nondetLog].sort((a, b) => a[0] - b[0]);
    // The log must reach the last "not done" poll, or a replay would run that poll freely.
    const last = nondet.length === 0 ? -1 : nondet[nondet.length - 1]![0];
    if (this.notDoneHigh > last) nondet.push([this.notDoneHigh, { k: "test", done: false }]);
    const out = { earlyIds: this.earlyIds, lateLog: this.lateLog, nondet };
    this.lateLog = [];
    this.nondetLog = new Map();
    this.notDoneHigh = -1;
    return out;
  }

  /** A non-deterministic call starts: its ordinal, and the outcome to replay if recovering. */
  nondet(kind: NondetEntry["k"]): NondetTicket & { effects: RankEffect[] } {
    const ordinal = this.ordinal++;
    const effects: RankEffect[] = [];
    let replay: NondetEntry | undefined;
    if (this.replayLog !== undefined) {
      replay = this.replayLog.get(ordinal);
      this.replayLog.delete(ordinal);
      if (replay === undefined && kind === "test" && ordinal <= this.replayUntil) replay = { k: "test", done: false };
      if (replay !== undefined && replay.k !== kind) {
        effects.push({
          kind: "fatal",
          code: "CPR_REPLAY",
          message: `rank ${this.rank}: replay diverged at non-deterministic event #${ordinal} of epoch ${this.epoch}: the log has a ${replay.k} outcome, the program made a ${kind} call; the program must make the same calls after a restore (keep all loop state in the checkpointed state)`,
        });
        replay = undefined;
      }
      if (ordinal >= this.replayUntil) this.replayLog = undefined;
    }
    return { ordinal, replay, effects };
  }

  /** Whether replay of the log is still going on. */
  get replaying(): boolean {
    return this.replayLog !== undefined;
  }

  /** The outcome of call `ordinal`; kept if recording is still on. */
  logNondet(ordinal: number, entry: NondetEntry): RankEffect[] {
    if (!this.recording) return [];
    if (entry.k === "test" && !entry.done && entry.msg === undefined) {
      this.notDoneHigh = Math.max(this.notDoneHigh, ordinal);
      return [];
    }
    if (this.nondetLog.size >= this.nondetMax) {
      return this.abandonRecording(`more than ${this.nondetMax} non-deterministic outcomes to log while recording epoch ${this.epoch}`);
    }
    this.nondetLog.set(ordinal, entry);
    return [];
  }
}
