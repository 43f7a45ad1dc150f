/**
 * The initiator of coordinated checkpoints (Bronevetsky et al., PPoPP 2003; see rank.ts), as a
 * pure state machine:
 * inputs in (time, progress reports, rank messages), effects out (broadcasts, a commit to
 * write). The coordinator process drives it; the simulator drives the same code.
 *
 * One round per epoch e+1, started only when the previous round is over, so ranks are never
 * more than one epoch apart (which is what makes comparing epochs on arrival sufficient):
 *   idle ──due──▶ broadcast pleaseCheckpoint(e+1)
 *        ◀─ every rank: readyToStopRecording(e+1) ──▶ broadcast stopRecording(e+1)
 *        ◀─ every rank: part durable ──▶ commit line e+1 (driver writes the manifest)
 *        ◀─ committed ──▶ broadcast committed(e+1, keep) ── idle
 * A round that exceeds `phaseTimeoutMs`, or in which a rank could not write its part, is
 * aborted: it will not be committed, the last committed line stays the recovery point, and
 * the ranks are told (`cpr-aborted`) so that they delete their parts of it (or do not write
 * them); the round still runs to its end (ranks must stop recording) before the next may
 * start.
 *
 * @example
 * const init = new CprInitiator({ size: 4, every: { ms: 10_000 }, committedEpoch: 0, keepLines: 2, phaseTimeoutMs: 60_000, nowMs: 0 });
 * for (const eff of init.step({ kind: "tick", nowMs: 10_000 })) apply(eff); // → broadcast cpr-checkpoint 1
 */
import type { CoordinatorToRank, RankToCoordinator } from "../../mpi/control.ts";

export interface PartRefLike {
  readonly rank: number;
  readonly epoch: number;
  readonly checksum: number;
  readonly bytes: number;
}

/** When a checkpoint is due: every so many milliseconds, or every so many steps of the slowest rank. */
export type CheckpointEvery = { readonly ms: number } | { readonly steps: number };

export type InitiatorInput =
  | { readonly kind: "tick"; readonly nowMs: number }
  | { readonly kind: "step"; readonly rank: number; readonly steps: number; readonly nowMs: number }
  | { readonly kind: "checkpointed"; readonly rank: number; readonly epoch: number; readonly nowMs: number }
  | { readonly kind: "ready"; readonly rank: number; readonly epoch: number; readonly nowMs: number }
  | { readonly kind: "part"; readonly rank: number; readonly epoch: number; readonly ref: PartRefLike; readonly nowMs: number }
  | { readonly kind: "part-failed"; readonly rank: number; readonly epoch: number; readonly message: string; readonly nowMs: number }
  /** The driver finished writing the commit record asked for by a `commit` effect. */
  | { readonly kind: "commit-done"; readonly epoch: number; readonly keep: readonly number[]; readonly nowMs: number }
  | { readonly kind: "commit-failed"; readonly epoch: number; readonly message: string; readonly nowMs: number };

/** How often the initiator gets a tick (launcher and simulator alike). */
export const INITIATOR_TICK_MS = 50;
/** A round that takes longer than this is aborted (the last committed line stays). */
export const PHASE_TIMEOUT_MS = 60_000;

export type InitiatorEffect =
  | { readonly kind: "broadcast"; readonly msg: CoordinatorToRank }
  /** Write the commit record of `epoch` with these parts (sorted by rank), then input commit-done. */
  | { readonly kind: "commit"; readonly epoch: number; readonly refs: readonly PartRefLike[] }
  /** Record that `epoch` will not be committed. */
  | { readonly kind: "abort-line"; readonly epoch: number; readonly reason: string }
  /** `steps`: the fewest steps any rank had reported when the line was asked for. */
  | { readonly kind: "line-committed"; readonly epoch: number; readonly durationMs: number; readonly bytes: number; readonly steps: number };

export interface InitiatorOptions {
  readonly size: number;
  readonly every: CheckpointEvery;
  /** The line the job (re)started from; 0 when fresh (epoch 0 is the program's start). */
  readonly committedEpoch: number;
  readonly keepLines: number;
  readonly phaseTimeoutMs: number;
  readonly nowMs: number;
}

type Phase = "idle" | "checkpointing" | "stopping" | "committing";

export class CprInitiator {
  private phase: Phase = "idle";
  private epoch: number;
  private startedMs = 0;
  private lastLineMs: number;
  private aborted = false;
  private readonly checkpointed = new Set<number>();
  private readonly ready = new Set<number>();
  private readonly parts = new Map<number, PartRefLike>();
  private readonly steps: number[];
  private stepsAtStart = 0;

  constructor(private readonly opts: InitiatorOptions) {
    if (opts.size < 1) throw new RangeError("size must be at least 1");
    if (opts.keepLines < 1) throw new RangeError("keepLines must be at least 1");
    this.epoch = opts.committedEpoch;
    this.lastLineMs = opts.nowMs;
    this.steps = new Array<number>(opts.size).fill(0);
  }

  step(input: InitiatorInput): InitiatorEffect[] {
    const out: InitiatorEffect[] = [];
    switch (input.kind) {
      case "tick":
        this.checkTimeout(input.nowMs, out);
        this.maybeStart(input.nowMs, out);
        break;
      case "step":
        this.steps[input.rank] = Math.max(this.steps[input.rank] ?? 0, input.steps);
        this.maybeStart(input.nowMs, out);
        break;
      case "checkpointed":
        if (input.epoch === this.epoch && this.phase !== "idle") this.checkpointed.add(input.rank);
        break;
      case "ready":
        if (input.epoch !== this.epoch || this.phase !== "checkpointing") break;
        this.ready.add(input.rank);
        if (this.ready.size === this.opts.size) {
          this.phase = "stopping";
          out.push({ kind: "broadcast", msg: { t: "cpr-stop", epoch: this.epoch } });
        }
        break;
      case "part":
        if (input.epoch !== this.epoch || (this.phase !== "stopping" && this.phase !== "checkpointing")) break;
        this.parts.set(input.rank, input.ref);
        if (this.parts.size === this.opts.size) this.allParts(input.nowMs, out);
        break;
      case "part-failed":
        if (input.epoch !== this.epoch || this.phase === "idle") break;
        this.abort(`rank ${input.rank} could not write its part: ${input.message}`, out);
        this.parts.set(input.rank, { rank: input.rank, epoch: input.epoch, checksum: 0, bytes: 0 });
        if (this.parts.size === this.opts.size) this.allParts(input.nowMs, out);
        break;
      case "commit-done":
        if (input.epoch !== this.epoch || this.phase !== "committing") break;
        this.phase = "idle";
        this.lastLineMs = input.nowMs;
        out.push({
          kind: "line-committed",
          epoch: input.epoch,
          durationMs: input.nowMs - this.startedMs,
          bytes: [...this.parts.values()].reduce((n, p) => n + p.bytes, 0),
          steps: this.stepsAtStart,
        });
        out.push({ kind: "broadcast", msg: { t: "cpr-committed", epoch: input.epoch, keep: [...input.keep] } });
        break;
      case "commit-failed":
        if (input.epoch !== this.epoch || this.phase !== "committing") break;
        this.abort(`writing the commit record failed: ${input.message}`, out);
        this.phase = "idle";
        this.lastLineMs = input.nowMs;
        break;
    }
    return out;
  }

  private maybeStart(nowMs: number, out: InitiatorEffect[]): void {
    if (this.phase !== "idle") return;
    const every = this.opts.every;
    const due = "ms" in every ? nowMs - this.lastLineMs >= every.ms : Math.min(...this.steps) - this.stepsAtStart >= every.steps;
    if (!due) return;
    this.epoch++;
    this.phase = "checkpointing";
    this.aborted = false;
    this.startedMs = nowMs;
    this.stepsAtStart = Math.min(...this.steps);
    this.checkpointed.clear();
    this.ready.clear();
    this.parts.clear();
    out.push({ kind: "broadcast", msg: { t: "cpr-checkpoint", epoch: this.epoch } });
  }

  private allParts(nowMs: number, out: InitiatorEffect[]): void {
    if (this.aborted) {
      // The round is over on every rank; it is simply not committed.
      this.phase = "idle";
      this.lastLineMs = nowMs;
      return;
    }
    this.phase = "committing";
    out.push({ kind: "commit", epoch: this.epoch, refs: [...this.parts.values()].sort((a, b) => a.rank - b.rank) });
  }

  private checkTimeout(nowMs: number, out: InitiatorEffect[]): void {
    if (this.phase === "idle" || this.aborted || nowMs - this.startedMs < this.opts.phaseTimeoutMs) return;
    const waiting =
      this.phase === "checkpointing"
        ? `${this.opts.size - this.ready.size} rank(s) not ready (${this.opts.size - this.checkpointed.size} not yet at a checkpoint location)`
        : `${this.opts.size - this.parts.size} part(s) not yet durable`;
    this.abort(`line ${this.epoch} did not complete within ${this.opts.phaseTimeoutMs} ms: ${waiting}`, out);
  }

  private abort(reason: string, out: InitiatorEffect[]): void {
    if (this.aborted) return;
    this.aborted = true;
    out.push({ kind: "abort-line", epoch: this.epoch, reason });
    out.push({ kind: "broadcast", msg: { t: "cpr-aborted", epoch: this.epoch } });
  }
}

/** The initiator's input for a rank's coordinated-checkpoint control message. */
export function initiatorInputOf(
  rank: number,
  msg: Extract<RankToCoordinator, { t: "cpr-checkpointed" | "cpr-ready" | "cpr-part" | "cpr-part-failed" }>,
  nowMs: number,
): InitiatorInput {
  switch (msg.t) {
    case "cpr-checkpointed":
      return { kind: "checkpointed", rank, epoch: msg.epoch, nowMs };
    case "cpr-ready":
      return { kind: "ready", rank, epoch: msg.epoch, nowMs };
    case "cpr-part":
      return { kind: "part", rank, epoch: msg.epoch, ref: msg.ref, nowMs };
    case "cpr-part-failed":
      return { kind: "part-failed", rank, epoch: msg.epoch, message: msg.message, nowMs };
  }
}
