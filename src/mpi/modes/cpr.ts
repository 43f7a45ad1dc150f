/**
 * Mode cpr: coordinated checkpointing. The protocol's driver (src/cpr/coordinated, plugged in
 * through the {@link CprHook} seam) stamps every app and collective frame with its epoch,
 * classifies arriving ones (late messages are logged, early ones suppressed on re-send), and
 * writes the rank's part of each recovery line. This adapter binds the driver to the
 * communicator: it gives the driver the library's own state at a checkpoint location, logs
 * every non-deterministic outcome the program sees (wildcard matches, probes, polls of
 * requests, `waitAny`, `nondet()` values) while recording, and replays them after a restore.
 *
 * @example
 * const mode = new CprMode(core, coordinatedHook(openParts)); // World.connect, in mode cpr
 */
import { LifelineError } from "../../errors.ts";
import { encodeValue } from "../codec.ts";
import type { CoordinatorToRank } from "../control.ts";
import {
  type CprHook,
  type CprHookFactory,
  type CprWorldAccess,
  type LibState,
  type NondetEntry,
  type NondetTicket,
  PROTO_CPR_BASE,
  type RawFrame,
} from "../cpr-hook.ts";
import type { Timer } from "../host.ts";
import { encodeHeader, frameId, type Header } from "../wire.ts";
import { LoggedMode } from "./logged.ts";
import type { ModeCore, RestoredState } from "./none.ts";

/** How long a released rank waits for the driver's background writes before it leaves. */
const CPR_CLOSE_WAIT_MS = 5_000;

export class CprMode extends LoggedMode {
  private readonly hook: CprHook;
  /** Results of bootstrap collectives by key (encoded), kept in every checkpoint. */
  private readonly bootstrapResults = new Map<string, Buffer>();
  /** `--checkpoint-every Nsteps`: N, from the table (see its `checkpointSteps`). */
  private reportEvery: number | undefined;
  /** checkpoint() calls since this rank's last checkpoint, and whether they were reported as due. */
  private callsSinceCheckpoint = 0;
  private reportedDue = false;

  constructor(core: ModeCore, factory: CprHookFactory) {
    super(core);
    this.hook = factory(this.access(), core.host);
  }

  /** What the protocol's driver may do with this communicator. */
  private access(): CprWorldAccess {
    const core = this.core;
    return {
      rank: core.rank,
      size: core.size,
      attempt: core.attempt,
      captureLibState: () => this.captureLibState(),
      restoreLibState: (lib) => this.restoreLibState(lib),
      inject: (frame) => core.channel.inject(frame, true),
      sendProtocol: (dest, tag, body) => core.channel.sendProtocol(dest, tag, body),
      maxMessageBytes: core.channel.maxMessageBytes,
      sendControl: (msg) => core.sendControl(msg),
      fatal: (code, message) => core.fatal(new LifelineError(code, message)),
    };
  }

  private captureLibState(): LibState {
    const raw = (f: RawFrame): RawFrame => ({ header: Buffer.from(f.header), body: f.body.map((b) => Buffer.from(b)) });
    const { channel, runner, matcher } = this.core;
    return {
      ...channel.counters(),
      collNextSeq: runner.colls.started,
      collInbox: runner.colls.inboxInOrder().map((a) => raw({ header: encodeHeader(a.header), body: a.frames })),
      unexpected: matcher.queuedInOrder().map((env) => {
        if (env.raw === undefined) throw new LifelineError("CPR_CHECKPOINT", "an unexpected message without its frame (internal error)");
        return raw(env.raw);
      }),
      bootstrap: [...this.bootstrapResults],
      versions: this.core.versions,
    };
  }

  private restoreLibState(lib: LibState): void {
    const { channel, runner } = this.core;
    channel.restoreCounters(lib);
    runner.colls.restoreNextSeq(lib.collNextSeq);
    for (const [k, v] of lib.bootstrap) this.bootstrapResults.set(k, v);
    for (const f of lib.collInbox) channel.inject(f, true);
    for (const f of lib.unexpected) channel.inject(f, true);
  }

  override get stepEpoch(): number {
    return this.hook.epoch;
  }

  override stamp(h: Header, dest: number): void {
    const s = this.hook.stamp(dest);
    h.epoch = s.epoch;
    h.flags = s.flags;
  }

  override suppress(dest: number, h: Header): boolean {
    // An early message the receiver already holds (it told us on recovery): not re-sent.
    return this.hook.suppress(dest, frameId(h));
  }

  override classify(header: Header, rawHeader: Buffer, body: Buffer[]): boolean {
    this.hook.arrive(header, { header: rawHeader, body });
    return true;
  }

  override onProtocol(header: Header, body: unknown): boolean {
    if (header.tag < PROTO_CPR_BASE) return false;
    this.hook.onProtocol(header, body);
    return true;
  }

  override onControl(msg: CoordinatorToRank): void {
    switch (msg.t) {
      case "cpr-checkpoint":
      case "cpr-stop":
      case "cpr-committed":
      case "cpr-aborted":
      case "cpr-inventory": // these two come before the table
      case "cpr-fetch":
        this.hook.onControl(msg);
        break;
      default:
        break;
    }
  }

  override beforeStart(table: Extract<CoordinatorToRank, { t: "table" }>): Promise<void> {
    this.reportEvery = typeof table.checkpointSteps === "number" && table.checkpointSteps > 0 ? table.checkpointSteps : undefined;
    // Restore the library state and re-inject logged messages before anything new can
    // arrive: this keeps every channel's order.
    return this.hook.beforeStart(table);
  }

  override afterStart(): Promise<void> {
    return this.hook.afterStart();
  }

  override ticket(kind: NondetEntry["k"]): NondetTicket {
    return this.hook.nondet(kind);
  }

  override logNondet(ordinal: number, entry: NondetEntry): void {
    this.hook.logNondet(ordinal, entry);
  }

  /**
   * A bootstrap collective's result is kept for the job's lifetime (it travels in every
   * checkpoint); a restored rank gets it from there without running the collective again.
   */
  override bootstrapped<R>(key: string | undefined, run: () => Promise<R>): Promise<R> {
    if (key === undefined) return run();
    const cached = this.hook.bootstrapResult(key);
    if (cached !== undefined) return Promise.resolve(cached.value as R);
    return run().then((r) => {
      this.bootstrapResults.set(key, encodeValue(r));
      return r;
    });
  }

  override async restore(): Promise<RestoredState | undefined> {
    const r = this.hook.restored();
    if (r === undefined) return undefined;
    this.core.versions = r.version;
    return r;
  }

  override async checkpoint(state: unknown, global: unknown): Promise<void> {
    if (this.ghosts > 0) {
      // A replayed poll completed a receive from the log and its re-sent copy is still on
      // its way: a checkpoint now would save a posted receive, which no part can hold. Not
      // a checkpoint location this time; the next one is (the copy is already re-sent or
      // about to be, by a peer replaying the same execution).
      this.core.reportStep(false);
      return;
    }
    const before = this.hook.epoch;
    this.hook.checkpoint(state, global, () => this.core.channel.deliverSelf(Infinity));
    const took = this.hook.epoch !== before;
    if (took) {
      this.core.versions = this.hook.epoch;
      this.callsSinceCheckpoint = 0;
      this.reportedDue = false;
    } else {
      this.callsSinceCheckpoint++;
    }
    // With --checkpoint-every Nsteps the coordinator hears at once that N steps went by.
    const due = !this.reportedDue && this.reportEvery !== undefined && this.callsSinceCheckpoint >= this.reportEvery;
    if (due) this.reportedDue = true;
    this.core.reportStep(took || due);
  }

  /**
   * Waits for the driver's background writes, but not for ever: a write stuck on a peer that
   * already left must not keep this released rank (and its watchdog) alive.
   */
  override async close(): Promise<void> {
    let timer: Timer | undefined;
    const late = new Promise<void>((resolve) => {
      timer = this.core.host.after(CPR_CLOSE_WAIT_MS, () => {
        this.core.host.warn(
          `lifeline: rank ${this.core.rank}: background checkpoint writes did not finish within ${CPR_CLOSE_WAIT_MS / 1000} s of the release; leaving them (no committed line depends on them)`,
        );
        resolve();
      });
    });
    await Promise.race([this.hook.close().catch(() => undefined), late]);
    timer?.stop();
  }
}
