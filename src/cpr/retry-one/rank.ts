/**
 * One rank of retry-one mode (Rabit-style recovery of the failed rank alone, with
 * sender-based message logging for point-to-point traffic), as a pure state machine: program
 * calls, protocol frames, failure news and time go in through {@link RetryOneRank.step};
 * effects come out (send, execute on the wire, complete the program's call, fail). No
 * sockets, timers, clock or randomness; the driver and the test harness run the same code.
 *
 * ## The protocol in brief
 * - **Independent checkpoints.** Every checkpoint() is this rank's own: its state (opaque
 *   here: the driver packs the program's state with the library's counters and its sender
 *   log) goes to its `replicas` ring successors, and the checkpoint is *safe* once each of
 *   them acknowledged it (`rack`); checkpoint() returns then. No rank waits for another's
 *   checkpoint, so programs whose ranks checkpoint at different rates (a master and its
 *   workers) work. Once safe, the rank tells every peer (`stored`), with how many of that
 *   peer's messages it had consumed: what only older checkpoints needed may go.
 * - **Collectives** have an index (the number of non-bootstrap collectives before them, the
 *   same on every rank). Results are kept until every rank's safe checkpoint is past them.
 * - **Determinants.** Every non-deterministic outcome the program sees (which message a
 *   wildcard receive matched, polls, `nondet()` values) is logged at the successors before
 *   anything that could depend on it leaves the rank: the machine closes the `gate` while
 *   some successor has not acknowledged every determinant (`dack`), and the driver holds
 *   back application and collective frames meanwhile (pessimistic message logging, after
 *   Johnson and Zwaenepoel; MPICH-V2 and Open MPI's pessimist component work this way).
 * - **Recovery mode** starts when the view changes (a peer died or runs again: every
 *   collective in flight is abandoned, its frames become void) or when a peer's round
 *   summary arrives. At each sync point (collective, bootstrap collective, restore,
 *   finalize) that the rank cannot serve locally it sends its {@link Summary} to all; a rank
 *   that is not at a sync point answers with a `run` position. With all N summaries every
 *   rank evaluates {@link decide} (agreement.ts, where the equivalence with Rabit's
 *   ActionSummary is argued) and carries out its part: send transfers, wait for its own,
 *   wait for a running rank, or proceed together in normal mode.
 * - **Restart.** A restarted rank (attempt > 0) starts in recovery mode holding nothing; its
 *   bootstrap calls are served from a peer's cache (any order), restore() brings its newest
 *   checkpoint a live successor holds, the determinants after it, the global and the
 *   collective results from its index on (a global nobody kept yet comes in a later round:
 *   the rest is restored at once, so that its sender log goes out again, and the program
 *   waits in restore() for the global); it then re-executes, replaying the determinants
 *   in order, while its peers resend the messages they logged for it (driver). Each
 *   collective it repeats is answered from the results (identity-checked) until it stands
 *   where the others are. Its predecessors push their checkpoints and determinants to it
 *   again, so it holds what its previous incarnation held.
 * - **Knowledge survives restarts.** A failed rank restarts from its newest checkpoint that
 *   any live rank *knows* to be safe, and what ranks drop (results, logged messages, held
 *   checkpoints, globals) they drop on account of such knowledge. So knowledge must never be
 *   lost while its consequences live on: a restarted rank learns, with every piece of data
 *   it is given, what the giver knew (results trimmed by the giver, a holder's record), and
 *   with its own checkpoint what it knew when it took it (its sender log was trimmed then).
 *   A holder learns, with every checkpoint it holds, what its owner knew when it took it:
 *   the round that restores the owner from it may restart another rank too, and must decide
 *   on that knowledge (the restored sender log lacks what a peer's safe checkpoint had
 *   consumed; restarting that peer from an older point would wait for it forever).
 *   Otherwise a chain of restarts could leave every live rank ignorant of a checkpoint the
 *   survivors' trimmed data depends on, and a later failure of its owner would restart it
 *   from an older point whose results and messages are gone, instead of reporting the loss.
 *
 * Errors (as `fail` effects; afterwards every program call fails the same way):
 * `MPI_BOOTSTRAP` (key reused, bootstrap after the first checkpoint, cache bound),
 * `CPR_REPLAY` (a replayed call is not the collective that ran there; ranks stuck at
 * different points), `CPR_RESTORE` (restore() misuse), `CPR_LOST` (a checkpoint or logged
 * outcomes lost beyond the replicas; every rank restarted), `CPR_CHECKPOINT` (result buffer or determinant bound), `MPI_TIMEOUT`
 * (a dead rank not back within the failure timeout), `MPI_COLLECTIVE_MISMATCH`, `CPR_PROTOCOL`
 * (a bug).
 *
 * @example
 * const m = new RetryOneRank({ rank: 0, size: 4, attempt: 0, attempts: [0, 0, 0, 0] });
 * m.step({ kind: "collective", ident });           // → [{ kind: "execute", wireSeq: 0, ... }]
 * m.step({ kind: "executed", result: 42 });        // → [{ kind: "complete", result: 42, ... }]
 */
import type { ReplicaCodec } from "../../mpi/retry-hook.ts";
import { StableMap } from "../../mpi/stable-map.ts";
import { decide, type Decision, type DecideOptions, predecessors, successors, type Transfer } from "./agreement.ts";
import { BootstrapCache, ProtocolError, ResultBuffer } from "./result-buffer.ts";
import {
  type AllRestart,
  type CacheEntry,
  CACHE_ENTRIES_MAX_DEFAULT,
  type CollIdentity,
  DET_ENTRIES_MAX_DEFAULT,
  FAILURE_TIMEOUT_MS_DEFAULT,
  HELD_FRAMES_MAX_DEFAULT,
  type HeldVersion,
  type Holding,
  type Knowledge,
  type Lazy,
  OWN_GLOBALS_MAX,
  type OwnGlobal,
  type Position,
  type ProtoFrame,
  type RankEffect,
  type RankInput,
  REPLICAS_DEFAULT,
  RESULT_BYTES_MAX_DEFAULT,
  RESULT_ENTRIES_MAX_DEFAULT,
  type RetryOneOptions,
  type Summary,
  type TransferPart,
} from "./types.ts";

/**
 * A checkpoint value materialized at most once (the thunk is the lazy form).
 *
 * @example
 * const cell = new LazyCell({ kind: "thunk", thunk: () => encode(state) });
 * cell.get(); cell.get(); // the thunk ran once
 */
export class LazyCell {
  private done = false;
  private value: unknown;
  /** How many times it was handed out (sent to a peer): once it was, other code may still read it. */
  private lends = 0;
  constructor(private readonly lazy: Lazy) {}

  get(): unknown {
    if (!this.done) {
      this.value = this.lazy.kind === "value" ? this.lazy.value : this.lazy.thunk();
      this.done = true;
    }
    return this.value;
  }

  /** The value, to send: it is never recycled. */
  lend(): unknown {
    this.lends++;
    return this.get();
  }

  /** How many times {@link lend} handed it out. */
  get lendCount(): number {
    return this.lends;
  }

  /** The value if it exists (given, or made) and was never handed out (its memory may be reused once dropped). */
  get unlent(): unknown[] {
    if (this.lends > 0) return [];
    if (this.lazy.kind === "value") return [this.lazy.value];
    return this.done ? [this.value] : [];
  }
}

/** One of this rank's own checkpoints. */
interface OwnCheckpoint {
  readonly version: number;
  readonly index: number;
  readonly detCount: number;
  readonly key: string | null;
  readonly state: LazyCell;
  /** What this rank knew when it took the checkpoint (see Knowledge). */
  readonly known: Knowledge;
  /** Per peer, how many of its messages this rank had consumed (sent with `stored`). */
  readonly consumed: readonly number[];
  /** Successors (by rank) that acknowledged holding it. */
  readonly acks: Set<number>;
  /** Every rank's incarnation when it was pushed to the successors (taken by checkpoint(); see `own-released`). */
  readonly pushed?: readonly number[];
}

/** What this rank holds for one predecessor. */
interface HeldData {
  /** Checkpoints by version: the newest safe one and newer ones. */
  readonly versions: StableMap<number, HeldVersion & { readonly state: unknown; readonly known: Knowledge }>;
  /** Determinants, ordinals detFrom..detFrom+dets.length-1. */
  detFrom: number;
  dets: unknown[];
  /**
   * Every determinant the owner logged (up to what it was acknowledged for) is here: the record
   * was kept since this incarnation's start, or came whole from another holder, or the owner's
   * push of its determinants arrived. A restarted holder that has only the pushed checkpoints
   * so far may lack determinants whose effects already left the owner: such a record is no
   * restart point (see summary()).
   */
  complete: boolean;
}

type ViewOrder = "same" | "newer" | "stale";

/**
 * How a frame's view (attempt vector) compares with ours: same, newer (hold it until the
 * coordinator's news arrives), or stale (drop it: its sender will learn and resend).
 *
 * @example
 * compareView([0, 1, 0], [0, 0, 0]); // → "newer"
 */
export function compareView(theirs: readonly number[], mine: readonly number[]): ViewOrder {
  let greater = false;
  for (let i = 0; i < mine.length; i++) {
    const t = theirs[i] ?? 0,
      m = mine[i]!;
    if (t < m) return "stale";
    if (t > m) greater = true;
  }
  return greater ? "newer" : "same";
}

/** A position's identity (with the rank's version), to tell whether it moved since its last summary. */
function posKey(p: Position, version: number): string {
  return `${posKind(p)}@${version}`;
}

function posKind(p: Position): string {
  switch (p.kind) {
    case "boot":
      return `boot:${p.key}`;
    case "restore":
      return "restore";
    case "coll":
      return `coll:${p.index}`;
    case "final":
      return `final:${p.index}`;
    case "run":
      return `run:${p.index}`;
  }
}

/**
 * The effects of a step that had none, shared (never pushed to: {@link RetryOneRank.emit} makes
 * a step's own array at its first effect). A collective's steps run in every call of the
 * program, and each array less is memory the rank's cache need not hold.
 */
const NO_EFFECTS: RankEffect[] = [];

export class RetryOneRank {
  readonly rank: number;
  readonly size: number;
  readonly attempt: number;
  readonly replicas: number;
  /** Each rank's host at the job's start, if the job spans hosts (replica placement). */
  private readonly groups: readonly number[] | undefined;
  private readonly failureTimeoutMs: number;
  private readonly heldFramesMax: number;
  /** A restart of every rank from the durable floor (see RetryOneOptions.allRestart). */
  private readonly allRestart: AllRestart | undefined;
  private readonly detEntriesMax: number;
  private readonly succ: readonly number[];

  /**
   * Every rank's incarnation: replaced, never changed in place, so an outgoing frame can carry
   * it as its view (a frame must keep the view it was sent in: read after our next view change,
   * an old view must not pass for a current one — the swarm found this in-process, where frames
   * are not serialized). `viewIdNow` is its sum.
   */
  private attempts: readonly number[];
  private viewIdNow: number;
  private readonly down = new Map<number, number>();
  private failure: (RankEffect & { kind: "fail" }) | null = null;
  private restoring: boolean;
  private restoreCalled = false;
  private recovery: boolean;

  /** This rank's checkpoint count (the version it is in) and collectives since its last one. */
  private version = 0;
  private seqno = 0;
  /** Non-bootstrap collectives done (the next collective's index). */
  private index = 0;
  private readonly buffer: ResultBuffer;
  private readonly cache: BootstrapCache;
  private readonly usedKeys = new Set<string>();
  private checkpointCalls = 0;
  private wireSeq = 0;
  /** Frames of wire collectives below this are void (abandoned executions). */
  private wireFloor = 0;

  /** Own checkpoints: the newest safe one, and the one whose replicas are being acknowledged. */
  private safe: OwnCheckpoint | null = null;
  /** How replicas may travel as differences (RetryOneOptions.replicaCodec). */
  private readonly codec: ReplicaCodec | undefined;
  private pending: OwnCheckpoint | null = null;
  /** Globals of own checkpoints kept for restarted peers, by version. */
  private ownGlobals = new Map<number, OwnGlobal & { readonly global: LazyCell }>();
  /** Restored from a checkpoint whose global nobody kept yet: the program waits for it in restore(). */
  private globalWait: { readonly version: number; readonly key: string } | null = null;
  /** Own determinants since the safe checkpoint: ordinals detBase..detBase+dets.length-1. */
  private detBase = 0;
  private dets: unknown[] = [];
  /** Per successor, determinants it acknowledged (ordinals below). */
  private readonly detAcked = new Map<number, number>();
  private gateOpen = true;
  /** Per rank, the newest safe checkpoint known: [version, collective index]. */
  private readonly knownSafe: [number, number][];
  /** Per rank, collectives it is known to have done (a lower bound). */
  private readonly knownIndex: number[];
  /**
   * Peers waiting to hear that this rank has done some number of collectives (see `ask`).
   * Entries come and go at every checkpoint: a StableMap (see stable-map.ts), as `versions`.
   */
  private readonly wants = new StableMap<number, number>();
  /**
   * Per rank, the most collectives this rank told that rank's current incarnation it had done.
   * An `ask` tells it as well as a `done` (a rank asks for the index it is at), so when two
   * ranks checkpoint at the same index their asks cross and neither sends a `done`.
   */
  private readonly told: number[];
  /** Ranks known to log determinants; and, once this incarnation logged one, the peers that know it. */
  private readonly logsKnown = new Set<number>();
  private logsAcked: Set<number> | null = null;
  /** Recovery data held per predecessor. */
  private readonly held = new Map<number, HeldData>();

  private pos: Position | null = null;
  /** checkpoint() was called and returns when the pending checkpoint is safe. */
  private ckptCall = false;
  private executing: { readonly wireSeq: number } | null = null;

  private round = 0;
  private sentRound = -1;
  /** The position the summary of `sentRound` reported. */
  private sentPos = "";
  /** The last round decided `wait` (or a plan `waitAfter`): the next begins when some rank's position changes. */
  private waiting = false;
  private readonly summaries = new Map<number, Map<number, Summary>>();
  /**
   * Transfers this rank waits for after a round's decision, by key (see transferKey), and what
   * the round's summaries knew: the data a rank is given (or not given: results no survivor
   * kept) reflects that knowledge.
   */
  private awaiting: { readonly round: number; readonly expected: Set<string>; readonly parts: Map<string, TransferPart>; readonly known: Knowledge } | null =
    null;
  private readonly earlyXfers = new Map<number, Map<string, TransferPart>>();
  private heldFrames: { from: number; attempt: number; frame: ProtoFrame }[] = [];

  /** This step's effects; {@link NO_EFFECTS} until the first (most steps of a collective have one or none). */
  private out: RankEffect[] = NO_EFFECTS;

  constructor(opts: RetryOneOptions) {
    if (!Number.isInteger(opts.size) || opts.size < 1) throw new RangeError(`size must be a positive integer, got ${opts.size}`);
    if (!Number.isInteger(opts.rank) || opts.rank < 0 || opts.rank >= opts.size) throw new RangeError(`rank ${opts.rank} outside 0..${opts.size - 1}`);
    if (opts.attempts.length !== opts.size) throw new RangeError(`attempts has ${opts.attempts.length} entries for ${opts.size} ranks`);
    const replicas = opts.replicas ?? REPLICAS_DEFAULT;
    if (!Number.isInteger(replicas) || replicas < 0) throw new RangeError(`replicas must be a non-negative integer, got ${replicas}`);
    this.rank = opts.rank;
    this.size = opts.size;
    this.attempt = opts.attempt;
    this.replicas = Math.min(replicas, opts.size - 1);
    if (opts.groups !== undefined && opts.groups.length !== opts.size) throw new RangeError(`groups has ${opts.groups.length} entries for ${opts.size} ranks`);
    this.groups = opts.groups === undefined ? undefined : [...opts.groups];
    this.failureTimeoutMs = opts.failureTimeoutMs ?? FAILURE_TIMEOUT_MS_DEFAULT;
    this.heldFramesMax = opts.heldFramesMax ?? HELD_FRAMES_MAX_DEFAULT;
    this.codec = opts.replicaCodec;
    this.detEntriesMax = opts.detEntriesMax ?? DET_ENTRIES_MAX_DEFAULT;
    const attempts = [...opts.attempts];
    attempts[this.rank] = opts.attempt;
    this.attempts = attempts;
    this.viewIdNow = attempts.reduce((s, a) => s + a, 0);
    this.buffer = new ResultBuffer({
      entriesMax: opts.resultEntriesMax ?? RESULT_ENTRIES_MAX_DEFAULT,
      bytesMax: opts.resultBytesMax ?? RESULT_BYTES_MAX_DEFAULT,
    });
    this.cache = new BootstrapCache(opts.cacheEntriesMax ?? CACHE_ENTRIES_MAX_DEFAULT);
    this.succ = successors(this.rank, this.opts());
    for (const s of this.succ) this.detAcked.set(s, 0);
    this.knownSafe = Array.from({ length: opts.size }, () => [0, 0] as [number, number]);
    this.knownIndex = new Array<number>(opts.size).fill(0);
    this.told = new Array<number>(opts.size).fill(0);
    this.allRestart = opts.allRestart;
    this.restoring = opts.attempt > 0 && opts.allRestart === undefined;
    this.recovery = this.restoring;
    // A first incarnation holds (empty) records for its predecessors from the start: a
    // predecessor that dies before its first checkpoint restarts from the program's start,
    // with the determinants these records collect. A restarted holder gets them pushed.
    if (!this.restoring)
      for (const p of predecessors(this.rank, this.opts())) this.held.set(p, { versions: new StableMap(), detFrom: 0, dets: [], complete: true });
    if (opts.allRestart !== undefined) this.startFrom(opts.allRestart);
  }

  /** Every rank restarts from a durable line: this rank's part of it is its safe checkpoint. */
  private startFrom(a: AllRestart): void {
    a.versions.forEach((v, r) => {
      this.knownSafe[r] = [v, a.index];
      this.knownIndex[r] = a.index;
    });
    this.index = a.index;
    this.buffer.resetTo(a.index);
    const p = a.part;
    if (p === undefined) return;
    this.version = p.version;
    for (const e of p.cache) this.cache.put(e);
    this.safe = {
      version: p.version,
      index: p.index,
      detCount: 0,
      key: p.key,
      state: new LazyCell({ kind: "value", value: p.state }),
      known: this.knowledge(),
      consumed: [],
      acks: new Set(this.succ),
    };
    this.safe.state.lend(); // the program gets it at restore(): never recycled
    if (p.key !== null) {
      const cell = new LazyCell({ kind: "value", value: p.global });
      cell.lend();
      this.ownGlobals.set(p.version, { version: p.version, index: p.index, key: p.key, global: cell });
    }
  }

  // ---- observers (for the driver's reports and the tests) ----------------------------------

  /** This rank's checkpoint count and the collectives since its last one (fault coordinates). */
  get progress(): { version: number; seqno: number; index: number } {
    return { version: this.version, seqno: this.seqno, index: this.index };
  }

  /** A restarted rank that has not got its checkpoint back yet (it holds nothing). */
  get isRestoring(): boolean {
    return this.restoring;
  }

  get inRecovery(): boolean {
    return this.recovery;
  }

  get failed(): boolean {
    return this.failure !== null;
  }

  /** The view id stamped in wire collective frames (sum of incarnations: grows with each restart). */
  get viewId(): number {
    return this.viewIdNow;
  }

  get view(): readonly number[] {
    return this.attempts;
  }

  /** Every determinant logged so far is held by every successor (see the gate effect). */
  get isGateOpen(): boolean {
    return this.gateOpen;
  }

  /** This rank's safe checkpoint `version` (its state and collective index), if it is still the newest safe one. */
  safeCheckpoint(version: number): { state: unknown; index: number } | undefined {
    const c = this.safe;
    return c === null || c.version !== version ? undefined : { state: c.state.get(), index: c.index };
  }

  /** The bootstrap cache (a durable checkpoint keeps it: a restart of every rank needs it). */
  get bootstrapEntries(): readonly CacheEntry[] {
    return this.cache.pick(this.cache.keys);
  }

  /** Result entries and bytes held (for bounds checks in tests and reports). */
  get buffered(): { entries: number; bytes: number; cacheEntries: number; held: number; dets: number } {
    let dets = 0;
    for (const h of this.held.values()) dets += h.dets.length;
    return { entries: this.buffer.count, bytes: this.buffer.bytes, cacheEntries: this.cache.size, held: this.held.size, dets: dets + this.dets.length };
  }

  /**
   * What to do with an arriving wire collective frame: `accept` it (World files it by its
   * collective sequence number), `hold` it until our view catches up (its sender knows of a
   * restart we have not heard of yet), or `drop` it (a dead incarnation's, an older view's,
   * or an abandoned execution's).
   */
  classifyWire(from: number, attempt: number, viewId: number, wireSeq: number): "accept" | "hold" | "drop" {
    const known = this.attempts[from]!;
    if (attempt < known) return "drop";
    if (attempt > known) return "hold";
    const mine = this.viewId;
    if (viewId < mine) return "drop";
    if (viewId > mine) return "hold";
    if (wireSeq < this.wireFloor) return "drop";
    return "accept";
  }

  // ---- the step function ---------------------------------------------------------------------

  step(input: RankInput): readonly RankEffect[] {
    this.out = NO_EFFECTS;
    if (this.failure !== null) {
      if (isProgramCall(input)) this.emit(this.failure);
      return this.take();
    }
    try {
      this.onInput(input);
    } catch (err) {
      if (!(err instanceof ProtocolError)) throw err;
      const eff: RankEffect & { kind: "fail" } = { kind: "fail", code: err.code, message: err.message };
      this.failure = eff;
      this.out = [eff];
    }
    return this.take();
  }

  private emit(e: RankEffect): void {
    if (this.out === NO_EFFECTS) this.out = [e];
    else this.out.push(e);
  }

  private take(): readonly RankEffect[] {
    const out = this.out;
    this.out = NO_EFFECTS;
    return out;
  }

  private onInput(input: RankInput): void {
    switch (input.kind) {
      case "boot":
        return this.onBoot(input.key, input.ident);
      case "restore":
        return this.onRestore();
      case "collective":
        return this.onCollective(input.ident);
      case "executed":
        return this.onExecuted(input.result, input.bytes ?? 0);
      case "checkpoint":
        return this.onCheckpoint(input);
      case "finalize":
        this.beginCall();
        this.pos = { kind: "final", index: this.index };
        return this.sync();
      case "dets":
        return this.onDets(input.from, input.entries);
      case "frame":
        return this.onFrame(input.from, input.attempt, input.frame);
      case "peer-down":
        return this.onPeerDown(input.rank, input.attempt, input.nowMs);
      case "peer-up":
        return this.onPeerUp(input.rank, input.attempt);
      case "tick":
        return this.onTick(input.nowMs);
    }
  }

  // ---- program calls ---------------------------------------------------------------------------

  private beginCall(): void {
    if (this.pos !== null || this.ckptCall) {
      throw new ProtocolError(
        "CPR_PROTOCOL",
        `a call while ${this.ckptCall ? "checkpoint" : this.pos!.kind} is still pending; await every collective and checkpoint before the next`,
      );
    }
  }

  private onBoot(key: string, ident: CollIdentity): void {
    this.beginCall();
    if (this.checkpointCalls > 0 || this.version > 0) {
      throw new ProtocolError(
        "MPI_BOOTSTRAP",
        `bootstrap collective ${JSON.stringify(key)} called after the first checkpoint(); bootstrap collectives must run before the main loop`,
      );
    }
    if (this.usedKeys.has(key)) {
      throw new ProtocolError("MPI_BOOTSTRAP", `bootstrap key ${JSON.stringify(key)} used twice in one run; give each bootstrap collective its own key`);
    }
    this.usedKeys.add(key);
    this.pos = { kind: "boot", key, ident };
    if (!this.serveLocally()) this.sync();
  }

  private onRestore(): void {
    this.beginCall();
    if (this.restoreCalled) throw new ProtocolError("CPR_RESTORE", "restore() called twice; call it once, before the main loop");
    if (this.checkpointCalls > 0) throw new ProtocolError("CPR_RESTORE", "restore() called after checkpoint(); call it once, before the first checkpoint()");
    this.restoreCalled = true;
    const a = this.allRestart;
    if (a !== undefined) {
      const p = a.part;
      this.emit({
        kind: "restored",
        restored: { value: p === undefined ? undefined : { state: p.state, global: p.global, version: p.version }, dets: [], detFrom: 0 },
      });
      // The successors hold it in memory again (a single failure is then recovered from them).
      if (p !== undefined) for (const s of this.succ) this.pushTo(s);
      return;
    }
    if (!this.restoring) {
      this.emit({ kind: "restored", restored: { value: undefined, dets: [], detFrom: 0 } });
      return;
    }
    this.pos = { kind: "restore" };
    this.recovery = true;
    this.sync();
  }

  private onCollective(ident: CollIdentity): void {
    this.beginCall();
    this.requireRestored("a collective");
    this.pos = { kind: "coll", index: this.index, ident };
    if (!this.serveLocally()) this.sync();
  }

  private requireRestored(what: string): void {
    if (this.restoring) {
      throw new ProtocolError(
        "CPR_RESTORE",
        `rank ${this.rank} was restarted and called ${what} before restore(); in retry-one mode a program must call restore() before its main loop (only bootstrap collectives may come before it)`,
      );
    }
  }

  /** Answers the pending collective from the buffer or the cache (a replay); true if done. */
  private serveLocally(): boolean {
    const p = this.pos;
    if (p === null) return true;
    if (p.kind === "coll") {
      const e = this.buffer.take(p.index, p.ident);
      if (e === undefined) return false;
      this.index++;
      this.seqno++;
      this.pos = null;
      this.emit({ kind: "complete", result: e.result, replayed: true });
      this.answerWants();
      return true;
    }
    if (p.kind === "boot") {
      const e = this.cache.get(p.key, p.ident);
      if (e === undefined) return false;
      this.pos = null;
      this.emit({ kind: "complete", result: e.result, replayed: true });
      return true;
    }
    return false;
  }

  /** The rank stands at a sync point it cannot serve locally. */
  private sync(): void {
    const p = this.pos;
    if (p === null) return;
    if (this.recovery) {
      this.sendSummary();
      return;
    }
    switch (p.kind) {
      case "coll":
      case "boot":
        this.execute(p.ident);
        return;
      case "final":
      case "run":
        return;
      case "restore":
        throw new ProtocolError("CPR_PROTOCOL", "restore() outside recovery mode");
    }
  }

  private execute(ident: CollIdentity): void {
    const wireSeq = this.wireSeq++;
    this.executing = { wireSeq };
    this.emit({ kind: "execute", ident, wireSeq, viewId: this.viewId, purgeBelow: this.wireFloor });
  }

  private onExecuted(result: unknown, bytes: number): void {
    const p = this.pos;
    if (this.executing === null || p === null || (p.kind !== "coll" && p.kind !== "boot")) {
      throw new ProtocolError("CPR_PROTOCOL", "a collective finished on the wire that this rank is not running");
    }
    this.executing = null;
    if (p.kind === "coll") {
      this.buffer.add({ index: p.index, ident: p.ident, result, bytes });
      this.index++;
      this.seqno++;
    } else {
      this.cache.put({ key: p.key, ident: p.ident, result });
    }
    this.pos = null;
    this.emit({ kind: "complete", result, replayed: false });
    this.answerWants();
  }

  // ---- checkpoints: replicas to the successors, acknowledged, then `stored` to all -------------

  private onCheckpoint(input: Extract<RankInput, { kind: "checkpoint" }>): void {
    this.beginCall();
    this.requireRestored("checkpoint()");
    this.checkpointCalls++;
    const ckpt: OwnCheckpoint = {
      version: this.version + 1,
      index: this.index,
      detCount: this.detBase + this.dets.length,
      key: input.key,
      state: new LazyCell(input.state),
      known: this.knowledge(),
      consumed: [...input.consumed],
      acks: new Set(),
      pushed: this.attempts,
    };
    this.pending = ckpt;
    this.ckptCall = true;
    if (input.key !== null) {
      this.ownGlobals.set(ckpt.version, { version: ckpt.version, index: ckpt.index, key: input.key, global: new LazyCell(input.global) });
    }
    this.version = ckpt.version;
    this.seqno = 0;
    this.moved();
    for (const to of this.succ) this.sendReplica(to, ckpt, false);
    // It is safe only once every rank has done the collectives before it (else a result only
    // this rank holds could be lost with it): ask those not known to have. A successor's
    // replica asks it already (see onReplica).
    for (let r = 0; r < this.size; r++) {
      if (r !== this.rank && !this.succ.includes(r) && this.knownIndex[r]! < ckpt.index) this.ask(r, ckpt.index);
    }
    this.checkSafe();
  }

  /**
   * Sends checkpoint `c` to successor `to`. One not yet safe is also this rank's `ask` for its
   * index (see onReplica): it tells the successor that this rank has done those collectives.
   * A new checkpoint (not a push) to a successor that holds our safe one goes as what it adds
   * to that (the codec's difference), unless `whole` (the successor said it cannot take the
   * difference) or the codec finds nothing to leave out. The successor holds it if it is the
   * incarnation the safe one was pushed to: that one acknowledged it (it is safe), and keeps it
   * until a newer one of ours is safe.
   */
  private sendReplica(to: number, c: OwnCheckpoint, safe: boolean, whole = false): void {
    const state = c.state.lend();
    const base = this.safe;
    const delta =
      !safe && !whole && this.codec !== undefined && base !== null && base.pushed?.[to] === this.attempts[to]
        ? this.codec.diff(base.state.get(), state)
        : undefined;
    if (!safe) this.toldIndex(to, c.index);
    this.send(to, {
      t: "replica",
      view: this.viewNow(),
      version: c.version,
      index: c.index,
      key: c.key,
      detCount: c.detCount,
      safe,
      ...(delta === undefined ? { state } : { state: delta, base: base!.version }),
      known: c.known,
    });
  }

  /** Asks `r` to say once it has done `index` collectives; which says that this rank has. */
  private ask(r: number, index: number): void {
    this.send(r, { t: "ask", view: this.viewNow(), index });
    this.toldIndex(r, index);
  }

  /**
   * This rank just sent `r` a frame that says it has done `index` collectives: an ask, a replica
   * not yet safe, or `stored`.
   */
  private toldIndex(r: number, index: number): void {
    if (index > this.told[r]!) this.told[r] = index;
  }

  /** Answers the peers waiting for this rank to have done some number of collectives. */
  private answerWants(): void {
    // Called after every collective; mostly nobody waits (no iterator then).
    if (this.restoring || this.wants.size === 0) return;
    for (const [r, want] of this.wants) {
      if (this.index >= want) {
        this.wants.delete(r);
        if (this.told[r]! >= want) continue; // our own ask told it
        this.send(r, { t: "done", view: this.viewNow(), index: this.index });
        this.told[r] = this.index;
      }
    }
  }

  private learnIndex(r: number, index: number): void {
    if (index > this.knownIndex[r]!) {
      this.knownIndex[r] = index;
      this.checkSafe();
    }
  }

  private checkSafe(): void {
    const p = this.pending;
    if (p === null) return;
    for (const s of this.succ) if (!p.acks.has(s)) return;
    for (let r = 0; r < this.size; r++) if (r !== this.rank && this.knownIndex[r]! < p.index) return;
    const old = this.safe;
    this.safe = p;
    this.pending = null;
    if (old !== null) {
      this.recycle(old.state.unlent);
      // Clean: checkpoint() took it, and it went out only in its pushes to the successors, each
      // of which (the same incarnation still) has acknowledged the newer checkpoint pushed after
      // it on the same channel: no copy of it is on its way anywhere any more.
      const pushed = old.pushed;
      const clean = pushed !== undefined && old.state.lendCount === this.succ.length && this.succ.every((s) => pushed[s] === this.attempts[s]);
      this.emit({ kind: "own-released", version: old.version, clean });
    }
    // Determinants before the checkpoint are in its state's past: nobody replays them again.
    const drop = p.detCount - this.detBase;
    if (drop > 0) {
      this.dets.splice(0, drop);
      this.detBase = p.detCount;
    }
    this.learnSafe(this.rank, p.version, p.index);
    for (let r = 0; r < this.size; r++) {
      if (r === this.rank) continue;
      this.send(r, { t: "stored", view: this.viewNow(), version: p.version, index: p.index, detCount: p.detCount, consumed: p.consumed[r] ?? 0 });
      this.toldIndex(r, p.index); // it learns our index from it (onStored)
    }
    if (this.ckptCall) {
      this.ckptCall = false;
      this.emit({ kind: "checkpointed", version: p.version });
    }
  }

  /** What this rank knows that its memory may reflect (see Knowledge). */
  private knowledge(): Knowledge {
    return { safe: this.knownSafe.map(([v, i]) => [v, i] as const), logs: [...this.logsKnown] };
  }

  /** Knowledge that came with data from other ranks. */
  private learn(known: Knowledge): void {
    known.safe.forEach(([v, i], r) => {
      if (r !== this.rank) this.learnSafe(r, v, i);
    });
    for (const r of known.logs) if (r !== this.rank) this.logsKnown.add(r);
  }

  /** Rank `r`'s checkpoint `version` (at collective `index`) is safe: drop what nobody needs. */
  private learnSafe(r: number, version: number, index: number): void {
    const k = this.knownSafe[r]!;
    if (version <= k[0]) return;
    this.knownSafe[r] = [version, index];
    let minIndex = Infinity;
    let minVersion = Infinity;
    for (const [v, i] of this.knownSafe) {
      minIndex = Math.min(minIndex, i);
      minVersion = Math.min(minVersion, v);
    }
    this.recycle(this.buffer.dropBelow(minIndex));
    // Own globals: a restarted rank restores a checkpoint at least as new as its safe one, so
    // versions below every rank's safe one are never asked for. Kept: each rank's safe
    // checkpoint as this rank knows it (the one it restores if it fails now, unless a peer knows
    // a newer one, whose global that peer keeps), however far the others have got since — a
    // rank that lags behind the rest by more than the few newest must still find its own —
    // and the newest few beyond.
    const keep = [...this.ownGlobals.keys()].filter((v) => v >= minVersion).sort((a, b) => b - a);
    const kept = new Set(keep.slice(0, OWN_GLOBALS_MAX));
    for (const [v] of this.knownSafe) kept.add(v);
    if (this.pending !== null) kept.add(this.pending.version);
    if (this.safe !== null) kept.add(this.safe.version);
    for (const [v, g] of this.ownGlobals) {
      if (!kept.has(v)) {
        this.ownGlobals.delete(v);
        this.recycle(g.global.unlent);
      }
    }
  }

  private recycle(results: unknown[]): void {
    if (results.length > 0) this.emit({ kind: "recycle", results });
  }

  // ---- determinants ------------------------------------------------------------------------------

  private onDets(from: number, entries: readonly unknown[]): void {
    const count = this.detBase + this.dets.length;
    if (from !== count) throw new ProtocolError("CPR_PROTOCOL", `determinant #${from} logged while #${count} was expected`);
    if (this.dets.length + entries.length > this.detEntriesMax) {
      throw new ProtocolError(
        "CPR_CHECKPOINT",
        `rank ${this.rank} logged ${this.dets.length + entries.length} non-deterministic outcomes since its last safe checkpoint (detEntriesMax ${this.detEntriesMax}); call checkpoint() more often`,
      );
    }
    this.dets.push(...entries);
    if (entries.length > 0) this.announceLogs();
    for (const s of this.succ) this.send(s, { t: "dets", view: this.viewNow(), from, entries });
    this.updateGate();
  }

  /**
   * Every peer learns (once per incarnation) that this rank's history has outcomes only its
   * successors hold: without them it can never restart from its start. The gate stays closed
   * until each has acknowledged (updateGate).
   */
  private announceLogs(): void {
    if (this.logsAcked !== null) return;
    this.logsAcked = new Set();
    for (let r = 0; r < this.size; r++) if (r !== this.rank) this.send(r, { t: "logs", view: this.viewNow() });
  }

  private updateGate(): void {
    const count = this.detBase + this.dets.length;
    let open = true;
    for (const s of this.succ) if ((this.detAcked.get(s) ?? 0) < count) open = false;
    if (this.logsAcked !== null && this.logsAcked.size < this.size - 1) open = false;
    if (open !== this.gateOpen) {
      this.gateOpen = open;
      this.emit({ kind: "gate", open });
    }
  }

  /** Everything a successor holds of this rank, again (it restarted, or this rank did). */
  private pushTo(s: number): void {
    this.detAcked.set(s, this.detBase);
    if (this.safe !== null) this.sendReplica(s, this.safe, true);
    if (this.pending !== null) {
      this.pending.acks.delete(s);
      this.sendReplica(s, this.pending, false);
    }
    this.send(s, { t: "dets", view: this.viewNow(), from: this.detBase, entries: [...this.dets] });
    this.updateGate();
  }

  // ---- failures and views ----------------------------------------------------------------------

  private onPeerDown(rank: number, attempt: number, nowMs: number): void {
    if (rank === this.rank || attempt < this.attempts[rank]!) return;
    if (!this.down.has(rank)) this.down.set(rank, nowMs);
    if (this.succ.includes(rank)) {
      // What it held died with it: its acknowledgements no longer count.
      this.pending?.acks.delete(rank);
      this.detAcked.set(rank, this.detBase);
      this.updateGate();
    }
    // The view changes only when the rank runs again (peer-up); until then no round can
    // complete, but what runs on the wire with the dead rank must be given up now.
    this.enterRecovery(false);
  }

  private onPeerUp(rank: number, attempt: number): void {
    if (rank === this.rank || attempt <= this.attempts[rank]!) return;
    const attempts = [...this.attempts];
    attempts[rank] = attempt;
    this.attempts = attempts;
    this.viewIdNow = attempts.reduce((s, a) => s + a, 0);
    this.down.delete(rank);
    this.told[rank] = 0; // what we told its previous incarnation
    // Its previous incarnation's copies of our data died with it: push them again.
    if (this.succ.includes(rank) && !this.restoring) this.pushTo(rank);
    if (this.logsAcked !== null) {
      this.logsAcked.delete(rank);
      this.send(rank, { t: "logs", view: this.viewNow() });
      this.updateGate();
    }
    // Its previous incarnation would have told us when it had done the collectives before
    // our pending checkpoint: ask the new one (the push above asked a successor already).
    if (this.pending !== null && this.knownIndex[rank]! < this.pending.index && this.told[rank] < this.pending.index) this.ask(rank, this.pending.index);
    // The data it held for us is gone; the data we held for it stays (it restores from us).
    this.enterRecovery(true);
    const held = this.heldFrames;
    this.heldFrames = [];
    for (const h of held) this.onFrame(h.from, h.attempt, h.frame);
  }

  private onTick(nowMs: number): void {
    for (const [rank, since] of this.down) {
      if (nowMs - since >= this.failureTimeoutMs) {
        throw new ProtocolError(
          "MPI_TIMEOUT",
          `rank ${rank} failed and was not running again within the failure timeout (${this.failureTimeoutMs} ms; --max-restarts exhausted or the restart failed); retry-one cannot go on without it`,
        );
      }
    }
  }

  /**
   * Lockstep may be broken: abandon what runs on the wire (its frames become void) and agree
   * again at the sync point. A view change restarts the round count (everyone in the new
   * view starts at round 0).
   */
  private enterRecovery(viewChanged: boolean): void {
    this.recovery = true;
    if (viewChanged) {
      this.round = 0;
      this.sentRound = -1;
      this.summaries.clear();
      this.earlyXfers.clear();
      this.awaiting = null;
    }
    if (this.executing !== null) {
      this.emit({ kind: "abandon", wireSeq: this.executing.wireSeq });
      this.executing = null;
    }
    this.wireFloor = this.wireSeq;
    if (this.pos !== null && this.awaiting === null) this.sync();
  }

  // ---- protocol frames ---------------------------------------------------------------------------

  private onFrame(from: number, attempt: number, frame: ProtoFrame): void {
    if (from === this.rank || from < 0 || from >= this.size) throw new ProtocolError("CPR_PROTOCOL", `protocol frame from rank ${from}`);
    const known = this.attempts[from]!;
    if (attempt < known) return;
    const order = compareView(frame.view, this.attempts);
    if (attempt > known || order === "newer") {
      if (this.heldFrames.length >= this.heldFramesMax) {
        throw new ProtocolError(
          "CPR_PROTOCOL",
          `more than ${this.heldFramesMax} protocol frames from a newer view held (heldFramesMax); the coordinator's peer messages do not arrive`,
        );
      }
      this.heldFrames.push({ from, attempt, frame });
      return;
    }
    if (order === "stale") {
      // Recovery data addressed to our incarnation is never stale (its sender knows us and
      // pushes again after any view change it learns of); only agreement traffic is.
      if (frame.t === "summary" || frame.t === "xfer") return;
    }
    switch (frame.t) {
      case "summary":
        return this.onSummary(from, frame.round, frame.summary);
      case "xfer":
        return this.onXfer(from, frame.round, frame.part);
      case "replica":
        return this.onReplica(from, frame);
      case "rack":
        if (this.pending !== null && this.pending.version === frame.version) {
          this.pending.acks.add(from);
          this.checkSafe();
        }
        return;
      case "rnak":
        if (this.pending !== null && this.pending.version === frame.version && this.succ.includes(from)) this.sendReplica(from, this.pending, false, true);
        return;
      case "dets":
        return this.onHeldDets(from, frame.from, frame.entries);
      case "dack":
        if (this.succ.includes(from) && frame.upTo > (this.detAcked.get(from) ?? 0)) {
          this.detAcked.set(from, frame.upTo);
          this.updateGate();
        }
        return;
      case "stored":
        return this.onStored(from, frame);
      case "ask":
        return this.onAsk(from, frame.index);
      case "done":
        return this.learnIndex(from, frame.index);
      case "logs":
        this.logsKnown.add(from);
        this.send(from, { t: "lack", view: this.viewNow() });
        return;
      case "lack":
        if (this.logsAcked !== null) {
          this.logsAcked.add(from);
          this.updateGate();
        }
        return;
    }
  }

  /** `from` asks to hear once this rank has done `index` collectives; it is at that index: it has done that many. */
  private onAsk(from: number, index: number): void {
    this.learnIndex(from, index);
    this.wants.set(from, Math.max(this.wants.get(from) ?? 0, index));
    this.answerWants();
  }

  private heldFor(owner: number): HeldData {
    let h = this.held.get(owner);
    if (h === undefined) {
      // Created by a pushed checkpoint: complete once the push's determinants arrive.
      h = { versions: new StableMap(), detFrom: 0, dets: [], complete: false };
      this.held.set(owner, h);
    }
    return h;
  }

  /**
   * A predecessor's checkpoint to hold. One not yet safe is also the owner's `ask` for its
   * index: a checkpoint waits for every rank to have done the collectives before it, and its
   * owner has done them (so successors are not sent an `ask` of their own).
   */
  private onReplica(from: number, f: Extract<ProtoFrame, { t: "replica" }>): void {
    this.holdReplica(from, f);
    if (!f.safe) this.onAsk(from, f.index);
  }

  private holdReplica(from: number, f: Extract<ProtoFrame, { t: "replica" }>): void {
    const h = this.heldFor(from);
    let state = f.state;
    if (f.base !== undefined) {
      // A difference from a checkpoint we hold of it (sendReplica): the whole one again. If we
      // cannot (we do not hold that one), its sender sends it whole.
      const b = h.versions.get(f.base);
      try {
        if (b === undefined || this.codec === undefined) throw new Error("no base");
        state = this.codec.patch(b.state, f.state);
      } catch {
        this.send(from, { t: "rnak", view: this.viewNow(), version: f.version });
        return;
      }
    }
    if (f.version >= (this.knownSafe[from]?.[0] ?? 0)) {
      h.versions.set(f.version, { version: f.version, index: f.index, key: f.key, detCount: f.detCount, state, known: f.known });
    }
    if (f.safe) this.learnSafe(from, f.version, f.index);
    // What the owner knew at this checkpoint is in its state (its sender log was trimmed on
    // it) and comes back with a restore from it: we know it too, so that a round restoring
    // the owner decides every other restart on it as well (see "Knowledge survives restarts").
    this.learn(f.known);
    this.send(from, { t: "rack", view: this.viewNow(), version: f.version });
  }

  private onHeldDets(from: number, first: number, entries: readonly unknown[]): void {
    const h = this.heldFor(from);
    const end = h.detFrom + h.dets.length;
    if (h.dets.length === 0 && first !== end) {
      // A fresh record (a push after a restart): it starts where the owner's log starts.
      h.detFrom = first;
    } else if (first > end) {
      throw new ProtocolError("CPR_PROTOCOL", `rank ${from}'s determinants from #${first} arrived while #${end} was expected`);
    }
    // Entries from `first` on replace what was held there (a newer incarnation of the owner
    // logs its own outcomes in place of an older one's that never took effect).
    h.dets.length = Math.max(0, first - h.detFrom);
    for (const e of entries) h.dets.push(e);
    // The owner pushes its checkpoints and then every determinant since its safe one (pushTo),
    // before any other determinant frame reaches this incarnation: the record is whole now.
    h.complete = true;
    this.send(from, { t: "dack", view: this.viewNow(), upTo: h.detFrom + h.dets.length });
  }

  private onStored(from: number, f: Extract<ProtoFrame, { t: "stored" }>): void {
    this.learnSafe(from, f.version, f.index);
    this.learnIndex(from, f.index);
    const h = this.held.get(from);
    if (h !== undefined) {
      for (const v of [...h.versions.keys()]) if (v < f.version) h.versions.delete(v);
      const drop = Math.min(h.dets.length, f.detCount - h.detFrom);
      if (drop > 0) {
        h.dets.splice(0, drop);
        h.detFrom += drop;
      }
    }
    this.emit({ kind: "peer-safe", rank: from, consumed: f.consumed });
  }

  // ---- agreement rounds ------------------------------------------------------------------------

  private currentPos(): Position {
    return this.pos ?? { kind: "run", index: this.index };
  }

  private summary(): Summary {
    const holds: Holding[] = [];
    for (const [owner, h] of this.held) {
      // A record that may lack determinants is no restart point and nothing to hand on: with
      // it, a restarted owner would re-execute past outcomes whose effects others already saw
      // (a message sent elsewhere, a collective result), and wait forever for what it never
      // sends again. Without it, a failure of the owner before its push arrived is one beyond
      // the replicas (CPR_LOST), as it is.
      if (!h.complete) continue;
      const versions: HeldVersion[] = [];
      for (const v of h.versions.values()) versions.push({ version: v.version, index: v.index, key: v.key, detCount: v.detCount });
      holds.push({ owner, versions, detFrom: h.detFrom, detTo: h.detFrom + h.dets.length });
    }
    const globals: OwnGlobal[] = [];
    if (!this.restoring) for (const g of this.ownGlobals.values()) globals.push({ version: g.version, index: g.index, key: g.key });
    return {
      rank: this.rank,
      pos: this.currentPos(),
      restoring: this.restoring,
      version: this.restoring ? 0 : this.version,
      knownSafe: this.knownSafe.map(([v]) => v),
      safeIndex: this.knownSafe.map(([, i]) => i),
      bufFrom: this.buffer.from,
      bufTo: this.buffer.to,
      cacheKeys: this.cache.keys,
      holds,
      globals,
      logsKnown: [...this.logsKnown],
      wireSeq: this.wireSeq,
      ...(this.globalWait === null ? {} : { awaitsGlobal: this.globalWait }),
    };
  }

  private sendSummary(): void {
    if (this.down.size > 0 || this.sentRound === this.round || this.awaiting !== null) return;
    this.sentRound = this.round;
    const s = this.summary();
    this.sentPos = posKey(s.pos, s.version);
    this.record(this.round, s);
    for (let r = 0; r < this.size; r++) if (r !== this.rank) this.send(r, { t: "summary", view: this.viewNow(), round: this.round, summary: s });
    this.tryDecide();
  }

  private onSummary(from: number, round: number, s: Summary): void {
    if (round < this.round || s.rank !== from) return;
    this.record(round, s);
    if (!s.restoring && (s.pos.kind === "coll" || s.pos.kind === "final" || s.pos.kind === "run")) this.learnIndex(from, s.pos.index);
    // A peer needs agreement (it restarted, or it saw a failure we have not heard of): lockstep
    // may be broken, so take part in the round, wherever we are (a running rank answers too).
    if (!this.recovery) this.enterRecovery(false);
    if (round === this.round) this.sendSummary();
    this.tryDecide();
  }

  private record(round: number, s: Summary): void {
    let m = this.summaries.get(round);
    if (m === undefined) {
      if (this.summaries.size >= 4) throw new ProtocolError("CPR_PROTOCOL", `summaries of more than 4 rounds pending at round ${this.round}`);
      m = new Map();
      this.summaries.set(round, m);
    }
    m.set(s.rank, s);
  }

  private tryDecide(): void {
    const round = this.round;
    const m = this.summaries.get(round);
    if (this.sentRound !== round || m === undefined || m.size < this.size) return;
    const all = [...m.values()].sort((a, b) => a.rank - b.rank);
    this.summaries.delete(round);
    this.round++;
    this.apply(decide(all, this.opts()), round, roundKnowledge(all));
  }

  private apply(d: Decision, round: number, known: Knowledge): void {
    switch (d.kind) {
      case "fail":
        throw new ProtocolError(d.code, d.message);
      case "proceed": {
        this.waiting = false;
        this.recovery = false;
        this.wireSeq = Math.max(this.wireSeq, d.wireSeq);
        this.wireFloor = this.wireSeq;
        this.sync();
        return;
      }
      case "wait":
        this.waiting = true;
        this.moved();
        if (this.summaries.has(this.round)) this.sendSummary();
        this.tryDecide();
        return;
      case "plan": {
        this.waiting = d.waitAfter === true;
        const expected = new Set<string>();
        for (const t of d.transfers) {
          if (t.from === this.rank) this.send(t.to, { t: "xfer", view: this.viewNow(), round, part: this.part(t) });
          if (t.to === this.rank) expected.add(transferKey(t.from, t));
        }
        if (expected.size > 0) {
          const early = this.earlyXfers.get(round) ?? new Map<string, TransferPart>();
          this.earlyXfers.delete(round);
          this.awaiting = { round, expected, parts: new Map(), known };
          for (const [key, part] of early) this.acceptPart(key, part);
          return;
        }
        this.afterRound();
        return;
      }
    }
  }

  /**
   * After a `wait`: a rank whose position or version changed since it reported starts the
   * next round (the others only answer it, or rounds would spin).
   */
  private moved(): void {
    if (!this.waiting || !this.recovery || this.awaiting !== null || this.sentRound === this.round) return;
    if (posKey(this.currentPos(), this.restoring ? 0 : this.version) === this.sentPos) return;
    this.sendSummary();
  }

  /** After a plan: on to the next round at a sync point (or answer one a peer already began). */
  private afterRound(): void {
    if (!this.serveLocally()) this.sync();
    if (this.pos === null && this.summaries.has(this.round)) this.sendSummary();
    this.tryDecide();
  }

  private part(t: Transfer): TransferPart {
    switch (t.kind) {
      case "results":
        return { kind: "results", entries: this.buffer.slice(t.fromIndex), known: this.knowledge() };
      case "cache":
        return { kind: "cache", entries: this.cache.pick(t.keys), known: this.knowledge() };
      case "restore": {
        const h = this.held.get(t.to) ?? (t.version === 0 ? { versions: new StableMap(), detFrom: 0, dets: [], complete: true } : undefined);
        if (h === undefined) throw new ProtocolError("CPR_PROTOCOL", `rank ${this.rank} was asked to restore rank ${t.to}, whose data it does not hold`);
        if (t.version === 0) {
          if (h.detFrom !== 0)
            throw new ProtocolError(
              "CPR_PROTOCOL",
              `rank ${this.rank} was asked for rank ${t.to}'s determinants from the start, but holds them from #${h.detFrom}`,
            );
          return { kind: "restore", version: 0, index: 0, key: null, detCount: 0, state: undefined, dets: [...h.dets], known: this.knowledge() };
        }
        const v = h.versions.get(t.version);
        if (v === undefined)
          throw new ProtocolError("CPR_PROTOCOL", `rank ${this.rank} was asked for rank ${t.to}'s checkpoint ${t.version}, which it does not hold`);
        return {
          kind: "restore",
          version: v.version,
          index: v.index,
          key: v.key,
          detCount: v.detCount,
          state: v.state,
          dets: h.dets.slice(v.detCount - h.detFrom),
          known: mergeKnowledge(this.knowledge(), v.known),
        };
      }
      case "held": {
        const h = this.held.get(t.owner);
        if (h === undefined) throw new ProtocolError("CPR_PROTOCOL", `rank ${this.rank} was asked for what it holds of rank ${t.owner}, which is nothing`);
        return { kind: "held", owner: t.owner, versions: [...h.versions.values()], detFrom: h.detFrom, dets: [...h.dets], known: this.knowledge() };
      }
      case "global": {
        if (!this.ownGlobals.has(t.version))
          throw new ProtocolError("CPR_PROTOCOL", `rank ${this.rank} was asked for its global of checkpoint ${t.version}, which it does not keep`);
        const globals = [...this.ownGlobals.values()].map((g) => ({ version: g.version, index: g.index, key: g.key, global: g.global.lend() }));
        return { kind: "global", globals, known: this.knowledge() };
      }
    }
  }

  private onXfer(from: number, round: number, part: TransferPart): void {
    const key = transferKey(from, part);
    if (this.awaiting !== null && this.awaiting.round === round) {
      this.acceptPart(key, part);
      return;
    }
    // Its sender decided the round before we did: keep it for our decision.
    if (round >= this.round - 1) {
      const early = this.earlyXfers.get(round) ?? new Map<string, TransferPart>();
      early.set(key, part);
      this.earlyXfers.set(round, early);
    }
  }

  /** A transfer part for the awaited round; the transfers complete when every expected key is in. */
  private acceptPart(key: string, part: TransferPart): void {
    const a = this.awaiting!;
    if (!a.expected.has(key)) {
      throw new ProtocolError("CPR_PROTOCOL", `rank ${this.rank} got transfer ${key} in round ${a.round}, which the round's decision did not assign to it`);
    }
    a.parts.set(key, part);
    if (a.parts.size === a.expected.size) this.finishTransfers();
  }

  private finishTransfers(): void {
    const parts = [...this.awaiting!.parts.values()];
    const roundKnown = this.awaiting!.known;
    this.awaiting = null;
    // The checkpoint first: it sets where the results begin.
    const order = { restore: 0, global: 1, results: 2, cache: 3, held: 4 } as const;
    parts.sort((a, b) => order[a.kind] - order[b.kind]);
    const globals = parts.find((p) => p.kind === "global")?.globals ?? [];
    const results = parts.find((p) => p.kind === "results")?.entries ?? [];
    // What the givers knew comes with their data (results trimmed, logs dropped on its account),
    // and what the round's summaries knew with the data nobody gave: a restarted rank whose
    // checkpoint is newer than the results any survivor kept starts its buffer at that
    // checkpoint, an absence that only the survivors' knowledge justifies (they may all be gone
    // by the next failure).
    const known = parts.reduce((k, p) => mergeKnowledge(k, p.known), roundKnown);
    // The global this rank was restored without (an earlier round), now that a peer keeps it.
    const wait = this.globalWait;
    if (wait !== null && parts.some((p) => p.kind === "global")) {
      const g = globals.find((x) => x.version === wait.version && x.key === wait.key);
      if (g === undefined) throw new ProtocolError("CPR_PROTOCOL", `rank ${this.rank} was given globals without that of its checkpoint ${wait.version}`);
      const cell = new LazyCell({ kind: "value", value: g.global });
      cell.lend(); // handed to the program: never recycled
      this.ownGlobals.set(g.version, { version: g.version, index: g.index, key: g.key, global: cell });
      this.globalWait = null;
      this.emit({ kind: "global", global: g.global });
    }
    for (const part of parts) {
      switch (part.kind) {
        case "restore":
          this.restoreFrom(part, globals, results[0]?.index ?? part.index);
          break;
        case "global":
          break;
        case "results":
          for (const e of part.entries) if (e.index >= this.buffer.from) this.buffer.add(e, true);
          break;
        case "cache":
          for (const e of part.entries) this.cache.put(e);
          break;
        case "held":
          this.adoptHeld(part);
          break;
      }
    }
    this.learn(known);
    this.afterRound();
  }

  /**
   * A predecessor's data from another holder. Unless the predecessor itself pushed newer data
   * meanwhile, this is what we hold of it now.
   */
  private adoptHeld(part: Extract<TransferPart, { kind: "held" }>): void {
    const [v, i] = part.known.safe[part.owner] ?? [0, 0];
    this.learnSafe(part.owner, v, i);
    // As for a replica (onReplica): what the owner knew at each checkpoint we may restore it from.
    for (const held of part.versions) this.learn(held.known);
    const mine = this.held.get(part.owner);
    const newest = (vs: Iterable<{ version: number }>): number => Math.max(0, ...[...vs].map((v) => v.version));
    if (mine !== undefined) {
      const a = newest(mine.versions.values()),
        b = newest(part.versions);
      if (a === b && mine.detFrom + mine.dets.length >= part.detFrom + part.dets.length) {
        // As much as a complete record has: whole too.
        mine.complete = true;
        return;
      }
      if (a > b) return;
    }
    const versions = new StableMap<number, HeldVersion & { readonly state: unknown; readonly known: Knowledge }>();
    for (const v of part.versions) versions.set(v.version, v);
    // Its giver reported it in a summary, which only names complete records.
    this.held.set(part.owner, { versions, detFrom: part.detFrom, dets: [...part.dets], complete: true });
  }

  private restoreFrom(
    part: Extract<TransferPart, { kind: "restore" }>,
    globals: readonly (OwnGlobal & { readonly global: unknown })[],
    resultsFrom: number,
  ): void {
    this.restoring = false;
    this.version = part.version;
    this.index = part.index;
    this.seqno = 0;
    // The buffer starts where the results it is given start (results before its own checkpoint
    // are kept for peers that may restart from older ones).
    this.buffer.resetTo(Math.min(part.index, resultsFrom));
    part.known.safe.forEach(([v, i], r) => {
      const k = this.knownSafe[r]!;
      if (v > k[0]) this.knownSafe[r] = [v, i];
      if (i > this.knownIndex[r]!) this.knownIndex[r] = i;
    });
    this.knownSafe[this.rank] = [part.version, part.index];
    // The determinants replayed after the checkpoint are this rank's log again.
    this.detBase = part.detCount;
    this.dets = [...part.dets];
    // Only its successors hold them: as when it logs an outcome, every peer must know that this
    // rank logs before anything that depends on them leaves it (the gate), or a failure of this
    // rank and its holders could restart it from its start anew, with others having seen the
    // effects of the outcomes it would replay differently.
    if (this.dets.length > 0) {
      this.announceLogs();
      this.updateGate();
    }
    if (part.version > 0) {
      this.safe = {
        version: part.version,
        index: part.index,
        detCount: part.detCount,
        key: part.key,
        state: new LazyCell({ kind: "value", value: part.state }),
        known: part.known,
        consumed: [],
        acks: new Set(this.succ),
      };
      // Handed to the program by `restored` (it may view it): never recycled.
      this.safe.state.lend();
    }
    // The giver's globals are ours now: a peer restarting from one of those checkpoints may ask.
    for (const g of globals) {
      const cell = new LazyCell({ kind: "value", value: g.global });
      cell.lend();
      this.ownGlobals.set(g.version, { version: g.version, index: g.index, key: g.key, global: cell });
    }
    const own = part.key === null ? undefined : this.ownGlobals.get(part.version);
    // Nobody kept its global yet (decide): restored all the same, the global comes later.
    if (part.key !== null && part.version > 0 && own === undefined) this.globalWait = { version: part.version, key: part.key };
    const global = own?.global.get();
    this.pos = null;
    const value =
      part.version > 0 ? { state: part.state, global, version: part.version, ...(this.globalWait === null ? {} : { globalPending: true }) } : undefined;
    this.emit({ kind: "restored", restored: { value, dets: part.dets, detFrom: part.detCount } });
    // Our successors may have restarted while we were gone: they hold what we push now.
    for (const s of this.succ) this.pushTo(s);
    this.answerWants();
  }

  // ---- helpers ---------------------------------------------------------------------------------

  private send(to: number, frame: ProtoFrame): void {
    this.emit({ kind: "send", to, frame });
  }

  /** The view for an outgoing frame (a snapshot: `attempts` is replaced, not changed). */
  private viewNow(): readonly number[] {
    return this.attempts;
  }

  private opts(): DecideOptions {
    return { size: this.size, replicas: this.replicas, groups: this.groups };
  }
}

/** Names one transfer (sender, kind, owner) so a duplicate can never stand in for another. */
function transferKey(from: number, t: Transfer | TransferPart): string {
  return `${from}:${t.kind}:${t.kind === "held" ? t.owner : ""}`;
}

function isProgramCall(input: RankInput): boolean {
  switch (input.kind) {
    case "boot":
    case "restore":
    case "collective":
    case "checkpoint":
    case "finalize":
      return true;
    default:
      return false;
  }
}

/** What the summaries of a round know together (see Knowledge). */
function roundKnowledge(all: readonly Summary[]): Knowledge {
  return all.reduce<Knowledge>((k, s) => mergeKnowledge(k, { safe: s.knownSafe.map((v, r) => [v, s.safeIndex[r] ?? 0] as const), logs: s.logsKnown }), {
    safe: [],
    logs: [],
  });
}

/** Both pieces of knowledge: per rank the newer safe checkpoint, and every rank known to have logged. */
export function mergeKnowledge(a: Knowledge, b: Knowledge): Knowledge {
  const safe = a.safe.map(([v, i], r) => {
    const o = b.safe[r];
    return o !== undefined && o[0] > v ? ([o[0], o[1]] as const) : ([v, i] as const);
  });
  for (let r = a.safe.length; r < b.safe.length; r++) safe.push([b.safe[r]![0], b.safe[r]![1]] as const);
  return { safe, logs: [...new Set([...a.logs, ...b.logs])].sort((x, y) => x - y) };
}
