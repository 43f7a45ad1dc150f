/**
 * One rank of retry-one mode (Rabit-style recovery, seeds 000 and 002), as a pure state
 * machine: program calls, protocol frames, failure news and time go in through
 * {@link RetryOneRank.step}; effects come out (send, execute on the wire, complete the
 * program's call, fail). No sockets, timers, clock or randomness; the driver and the test
 * harness run the same code.
 *
 * ## The protocol in brief
 * - **Versions and seqnos.** Every checkpoint() ends a version; collective number `seqno`
 *   of version `v` is (v, seqno). Its result goes into the result buffer (bounded), kept
 *   until checkpoint v+1 is committed everywhere.
 * - **Normal mode** (no failure since the last agreement): collectives run straight on the
 *   wire; a checkpoint pushes the rank's state to its `replicas` ring successors (the lazy
 *   form is materialized here, once), then sends `stored(v+1)` to all once it arrived
 *   itself and holds every predecessor's replica; with `stored` from all, v+1 is committed:
 *   the old version's results and states are dropped and checkpoint() returns. The global
 *   is never sent at a checkpoint: every rank keeps its own (it is identical everywhere) and
 *   it is materialized only when a restarted rank needs it (Rabit's LazyCheckPoint).
 * - **Recovery mode** starts when the view changes (a peer died or runs again: every
 *   collective in flight is abandoned, its frames become void) or when a peer's round
 *   summary arrives. At each sync point (collective, bootstrap collective, restore,
 *   checkpoint, finalize) that the rank cannot serve locally it sends its {@link Summary}
 *   to all; with all N summaries it evaluates {@link decide} (agreement.ts, where the
 *   equivalence with Rabit's ActionSummary is argued) and carries out its part: commit,
 *   send transfers, wait for its own, or proceed together in normal mode.
 * - **Restart.** A restarted rank (attempt > 0) starts in recovery mode and holding nothing;
 *   its bootstrap calls are served from a peer's cache (any order), restore() brings its
 *   state, the global, the results of that version and the replicas it should hold, and
 *   each collective it repeats is answered from those results (identity-checked) until it
 *   stands where the survivors wait; then everyone proceeds together.
 *
 * Errors (as `fail` effects; afterwards every program call fails the same way):
 * `MPI_BOOTSTRAP` (key reused, bootstrap after the first checkpoint, cache bound),
 * `CPR_REPLAY` (a replayed call is not the collective that ran there; ranks stuck at
 * different points), `CPR_RESTORE` (restore() misuse; a checkpoint lost beyond the replicas;
 * every rank restarted), `CPR_CHECKPOINT` (result buffer bound), `MPI_TIMEOUT` (a dead rank
 * not back within the failure timeout), `MPI_COLLECTIVE_MISMATCH`, `CPR_PROTOCOL` (a bug).
 *
 * @example
 * const m = new RetryOneRank({ rank: 0, size: 4, attempt: 0, attempts: [0, 0, 0, 0] });
 * m.step({ kind: "collective", ident });           // → [{ kind: "execute", wireSeq: 0, ... }]
 * m.step({ kind: "executed", result: 42 });        // → [{ kind: "complete", result: 42, ... }]
 */
import { decide, type Decision, type DecideOptions, predecessors, successors, type Transfer } from "./agreement.ts";
import { BootstrapCache, ProtocolError, ResultBuffer } from "./result-buffer.ts";
import {
  CACHE_ENTRIES_MAX_DEFAULT,
  type CollIdentity,
  FAILURE_TIMEOUT_MS_DEFAULT,
  HELD_FRAMES_MAX_DEFAULT,
  type Holding,
  type Lazy,
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
  /** Handed out (sent to a peer): other code may still read it. */
  private lent = false;
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
    this.lent = true;
    return this.get();
  }

  /** The value if it exists (given, or made) and was never handed out (its memory may be reused once dropped). */
  get unlent(): unknown[] {
    if (this.lent) return [];
    if (this.lazy.kind === "value") return [this.lazy.value];
    return this.done ? [this.value] : [];
  }
}

interface OwnCheckpoint {
  readonly version: number;
  readonly state: LazyCell;
  readonly global: LazyCell;
}

interface HeldReplica {
  readonly version: number;
  readonly state: unknown;
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

export class RetryOneRank {
  readonly rank: number;
  readonly size: number;
  readonly attempt: number;
  readonly replicas: number;
  /** Each rank's host at the job's start, if the job spans hosts (replica placement). */
  private readonly groups: readonly number[] | undefined;
  private readonly failureTimeoutMs: number;
  private readonly heldFramesMax: number;

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

  private committed = 0;
  private version = 0;
  private seqno = 0;
  private readonly buffer: ResultBuffer;
  private readonly cache: BootstrapCache;
  private readonly usedKeys = new Set<string>();
  private checkpointCalls = 0;
  private wireSeq = 0;
  /** Frames of wire collectives below this are void (abandoned executions). */
  private wireFloor = 0;

  private own: OwnCheckpoint | null = null;
  private ownPending: OwnCheckpoint | null = null;
  private held = new Map<number, HeldReplica>();
  private heldPending = new Map<number, HeldReplica>();
  /**
   * Replicas of the checkpoint after the pending one (committed + 2): a peer that committed
   * before us may already push them when two checkpoints follow each other with no collective
   * between (found by the World simulator). Moved to heldPending at our commit.
   */
  private earlyReplicas = new Map<number, HeldReplica>();

  private pos: Position | null = null;
  private executing: { readonly wireSeq: number } | null = null;
  private ckptProto: { readonly version: number; readonly storedFrom: Set<number>; storedSent: boolean } | null = null;
  private readonly earlyStored = new Map<number, Set<number>>();

  private round = 0;
  private sentRound = -1;
  private readonly summaries = new Map<number, Map<number, Summary>>();
  /** Transfers this rank waits for after a round's decision, by key (see partKey). */
  private awaiting: { readonly round: number; readonly expected: Set<string>; readonly parts: Map<string, TransferPart> } | null = null;
  private readonly earlyXfers = new Map<number, Map<string, TransferPart>>();
  private heldFrames: { from: number; attempt: number; frame: ProtoFrame }[] = [];

  private out: RankEffect[] = [];

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
    const attempts = [...opts.attempts];
    attempts[this.rank] = opts.attempt;
    this.attempts = attempts;
    this.viewIdNow = attempts.reduce((s, a) => s + a, 0);
    this.buffer = new ResultBuffer({
      entriesMax: opts.resultEntriesMax ?? RESULT_ENTRIES_MAX_DEFAULT,
      bytesMax: opts.resultBytesMax ?? RESULT_BYTES_MAX_DEFAULT,
    });
    this.cache = new BootstrapCache(opts.cacheEntriesMax ?? CACHE_ENTRIES_MAX_DEFAULT);
    this.restoring = opts.attempt > 0;
    this.recovery = this.restoring;
    if (this.restoring) this.committed = -1;
  }

  // ---- observers (for the driver's reports and the tests) ----------------------------------

  /** The version the program is in and the seqno of its next collective. */
  get progress(): { version: number; seqno: number; committed: number } {
    return { version: this.version, seqno: this.seqno, committed: this.committed };
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

  /** Result entries and bytes held (for bounds checks in tests and reports). */
  get buffered(): { entries: number; bytes: number; cacheEntries: number; replicas: number } {
    return { entries: this.buffer.count, bytes: this.buffer.bytes, cacheEntries: this.cache.size, replicas: this.held.size };
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

  step(input: RankInput): RankEffect[] {
    this.out = [];
    if (this.failure !== null) {
      if (isProgramCall(input)) this.out.push(this.failure);
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

  private take(): RankEffect[] {
    const out = this.out;
    this.out = [];
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
        return this.onCheckpoint(input.state, input.global);
      case "finalize":
        this.beginCall();
        this.pos = { kind: "final", version: this.version, count: this.seqno };
        return this.sync();
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
    if (this.pos !== null) {
      throw new ProtocolError("CPR_PROTOCOL", `a call while ${this.pos.kind} is still pending; await every collective and checkpoint before the next`);
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
    if (!this.restoring) {
      this.out.push({ kind: "restored", value: undefined });
      return;
    }
    this.pos = { kind: "restore" };
    this.recovery = true;
    this.sync();
  }

  private onCollective(ident: CollIdentity): void {
    this.beginCall();
    this.requireRestored("a collective");
    this.pos = { kind: "coll", version: this.version, seqno: this.seqno, ident };
    if (!this.serveLocally()) this.sync();
  }

  private onCheckpoint(state: Lazy, global: Lazy): void {
    this.beginCall();
    this.requireRestored("checkpoint()");
    this.checkpointCalls++;
    this.ownPending = { version: this.version + 1, state: new LazyCell(state), global: new LazyCell(global) };
    this.pos = { kind: "ckpt", version: this.version, count: this.seqno };
    this.sync();
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
      const e = this.buffer.take(p.version, p.seqno, p.ident);
      if (e === undefined) return false;
      this.seqno++;
      this.pos = null;
      this.out.push({ kind: "complete", result: e.result, replayed: true });
      return true;
    }
    if (p.kind === "boot") {
      const e = this.cache.get(p.key, p.ident);
      if (e === undefined) return false;
      this.pos = null;
      this.out.push({ kind: "complete", result: e.result, replayed: true });
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
      case "ckpt":
        this.startCheckpoint();
        return;
      case "final":
        return;
      case "restore":
        throw new ProtocolError("CPR_PROTOCOL", "restore() outside recovery mode");
    }
  }

  private execute(ident: CollIdentity): void {
    const wireSeq = this.wireSeq++;
    this.executing = { wireSeq };
    this.out.push({ kind: "execute", ident, wireSeq, viewId: this.viewId, purgeBelow: this.wireFloor });
  }

  private onExecuted(result: unknown, bytes: number): void {
    const p = this.pos;
    if (this.executing === null || p === null || (p.kind !== "coll" && p.kind !== "boot")) {
      throw new ProtocolError("CPR_PROTOCOL", "a collective finished on the wire that this rank is not running");
    }
    this.executing = null;
    if (p.kind === "coll") {
      this.buffer.add({ version: p.version, seqno: p.seqno, ident: p.ident, result, bytes });
      this.seqno++;
    } else {
      this.cache.put({ key: p.key, ident: p.ident, result });
    }
    this.pos = null;
    this.out.push({ kind: "complete", result, replayed: false });
  }

  // ---- checkpoints: replicas to ring successors, `stored` to all, commit ---------------------

  private startCheckpoint(): void {
    const own = this.ownPending!;
    const version = own.version;
    this.ckptProto = { version, storedFrom: this.earlyStored.get(version) ?? new Set(), storedSent: false };
    this.earlyStored.delete(version);
    if (this.replicas > 0) {
      const state = own.state.lend();
      for (const to of successors(this.rank, this.opts())) {
        this.send(to, { t: "replica", view: this.viewNow(), version, state });
      }
    }
    this.checkStored();
  }

  private checkStored(): void {
    const proto = this.ckptProto;
    if (proto === null) return;
    if (!proto.storedSent) {
      for (const p of predecessors(this.rank, this.opts())) {
        if (this.heldPending.get(p)?.version !== proto.version) return;
      }
      proto.storedSent = true;
      proto.storedFrom.add(this.rank);
      for (let r = 0; r < this.size; r++) if (r !== this.rank) this.send(r, { t: "stored", view: this.viewNow(), version: proto.version });
    }
    if (proto.storedFrom.size === this.size) this.commit(proto.version);
  }

  private commit(version: number): void {
    const p = this.pos;
    if (p === null || p.kind !== "ckpt" || p.version + 1 !== version || this.ownPending?.version !== version) {
      throw new ProtocolError("CPR_PROTOCOL", `commit of version ${version} while not at that checkpoint`);
    }
    this.committed = version;
    this.version = version;
    this.seqno = 0;
    // The results and the previous checkpoint's own copies are dropped: what was never handed
    // out may be reused.
    const dropped = [...this.buffer.reset(version), ...(this.own === null ? [] : [...this.own.state.unlent, ...this.own.global.unlent])];
    if (dropped.length > 0) this.out.push({ kind: "recycle", results: dropped });
    this.own = this.ownPending;
    this.ownPending = null;
    const held = new Map<number, HeldReplica>();
    for (const [owner, h] of this.heldPending) if (h.version === version) held.set(owner, h);
    this.held = held;
    this.heldPending = new Map();
    for (const [owner, h] of this.earlyReplicas) if (h.version === version + 1) this.heldPending.set(owner, h);
    this.earlyReplicas = new Map();
    this.ckptProto = null;
    this.pos = null;
    this.out.push({ kind: "checkpointed", version });
  }

  // ---- failures and views ----------------------------------------------------------------------

  private onPeerDown(rank: number, attempt: number, nowMs: number): void {
    if (rank === this.rank || attempt < this.attempts[rank]!) return;
    if (!this.down.has(rank)) this.down.set(rank, nowMs);
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
   * Lockstep may be broken: abandon what runs on the wire (its frames become void), restart
   * the checkpoint barrier, and agree again at the sync point. A view change restarts the
   * round count (everyone in the new view starts at round 0).
   */
  private enterRecovery(viewChanged: boolean): void {
    this.recovery = true;
    if (viewChanged) {
      this.round = 0;
      this.sentRound = -1;
      this.summaries.clear();
      this.earlyXfers.clear();
      this.awaiting = null;
      this.earlyStored.clear();
    }
    if (this.executing !== null) {
      this.out.push({ kind: "abandon", wireSeq: this.executing.wireSeq });
      this.executing = null;
    }
    this.wireFloor = this.wireSeq;
    this.ckptProto = null;
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
    if (order === "stale") return;
    switch (frame.t) {
      case "summary":
        return this.onSummary(from, frame.round, frame.summary);
      case "xfer":
        return this.onXfer(from, frame.round, frame.part);
      case "replica":
        if (!this.restoring && frame.version === this.committed + 2) this.earlyReplicas.set(from, { version: frame.version, state: frame.state });
        if (this.restoring || frame.version !== this.committed + 1) return;
        this.heldPending.set(from, { version: frame.version, state: frame.state });
        return this.checkStored();
      case "stored": {
        const proto = this.ckptProto;
        if (proto !== null && proto.version === frame.version) {
          proto.storedFrom.add(from);
          return this.checkStored();
        }
        // committed + 2: a peer already at the checkpoint after the one we still commit.
        if (frame.version === this.committed + 1 || frame.version === this.committed + 2) {
          const set = this.earlyStored.get(frame.version) ?? new Set<number>();
          set.add(from);
          this.earlyStored.set(frame.version, set);
        }
        return;
      }
    }
  }

  // ---- agreement rounds ------------------------------------------------------------------------

  private summary(): Summary {
    const holds: Holding[] = [];
    if (!this.restoring) {
      if (this.own !== null) holds.push({ owner: this.rank, version: this.own.version });
      if (this.ownPending !== null && this.pos?.kind === "ckpt") holds.push({ owner: this.rank, version: this.ownPending.version });
      for (const [owner, h] of this.held) holds.push({ owner, version: h.version });
      for (const [owner, h] of this.heldPending) holds.push({ owner, version: h.version });
    }
    return {
      rank: this.rank,
      pos: this.pos!,
      restoring: this.restoring,
      committed: this.restoring ? -1 : this.committed,
      bufVersion: this.buffer.version,
      bufCount: this.buffer.count,
      cacheKeys: this.cache.keys,
      holds,
      wireSeq: this.wireSeq,
    };
  }

  private sendSummary(): void {
    if (this.down.size > 0 || this.sentRound === this.round || this.pos === null || this.awaiting !== null) return;
    this.sentRound = this.round;
    const s = this.summary();
    this.record(this.round, s);
    for (let r = 0; r < this.size; r++) if (r !== this.rank) this.send(r, { t: "summary", view: this.viewNow(), round: this.round, summary: s });
    this.tryDecide();
  }

  private onSummary(from: number, round: number, s: Summary): void {
    if (round < this.round || s.rank !== from) return;
    this.record(round, s);
    if (!this.recovery) {
      // A peer needs agreement (it restarted, or it saw a failure we have not heard of):
      // lockstep may be broken, so join the round at our sync point.
      this.enterRecovery(false);
    }
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
    this.apply(decide(all, this.opts()), round);
  }

  private apply(d: Decision, round: number): void {
    switch (d.kind) {
      case "fail":
        throw new ProtocolError(d.code, d.message);
      case "proceed": {
        this.recovery = false;
        this.wireSeq = Math.max(this.wireSeq, d.wireSeq);
        this.wireFloor = this.wireSeq;
        this.sync();
        return;
      }
      case "plan": {
        const p = this.pos;
        if (d.commit !== null && !this.restoring && p !== null && p.kind === "ckpt" && p.version + 1 === d.commit) this.commit(d.commit);
        const expected = new Set<string>();
        for (const t of d.transfers) {
          if (t.from === this.rank) this.send(t.to, { t: "xfer", view: this.viewNow(), round, part: this.part(t) });
          if (t.to === this.rank) expected.add(transferKey(t.from, t));
        }
        if (expected.size > 0) {
          const early = this.earlyXfers.get(round) ?? new Map<string, TransferPart>();
          this.earlyXfers.delete(round);
          this.awaiting = { round, expected, parts: new Map() };
          for (const [key, part] of early) this.acceptPart(key, part);
          return;
        }
        if (!this.serveLocally()) this.sync();
        return;
      }
    }
  }

  private part(t: Transfer): TransferPart {
    switch (t.kind) {
      case "results":
        if (this.buffer.version !== t.version)
          throw new ProtocolError("CPR_PROTOCOL", `asked for results of version ${t.version}, holding ${this.buffer.version}`);
        return { kind: "results", version: t.version, entries: this.buffer.from(t.fromSeqno) };
      case "cache":
        return { kind: "cache", entries: this.cache.pick(t.keys) };
      case "restore": {
        if (t.version === 0) return { kind: "restore", version: 0, state: undefined, global: undefined };
        const state = this.stateOf(t.to, t.version);
        const own = this.ownAt(t.version);
        return { kind: "restore", version: t.version, state, global: own.global.lend() };
      }
      case "replica":
        return { kind: "replica", owner: t.owner, version: t.version, state: this.stateOf(t.owner, t.version) };
    }
  }

  private ownAt(version: number): OwnCheckpoint {
    if (this.own?.version === version) return this.own;
    if (this.ownPending?.version === version) return this.ownPending;
    throw new ProtocolError("CPR_PROTOCOL", `rank ${this.rank} was asked for checkpoint ${version}, which it does not hold`);
  }

  private stateOf(owner: number, version: number): unknown {
    if (owner === this.rank) return this.ownAt(version).state.lend();
    const h = this.held.get(owner)?.version === version ? this.held.get(owner) : this.heldPending.get(owner);
    if (h === undefined || h.version !== version) {
      throw new ProtocolError("CPR_PROTOCOL", `rank ${this.rank} was asked for rank ${owner}'s state of version ${version}, which it does not hold`);
    }
    return h.state;
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
    this.awaiting = null;
    // The checkpoint first: it sets the version that the results and replicas belong to.
    parts.sort((a, b) => (a.kind === "restore" ? 0 : 1) - (b.kind === "restore" ? 0 : 1));
    for (const part of parts) {
      switch (part.kind) {
        case "restore": {
          this.restoring = false;
          this.committed = part.version;
          this.version = part.version;
          this.seqno = 0;
          this.buffer.reset(part.version);
          if (part.version > 0) {
            this.own = {
              version: part.version,
              state: new LazyCell({ kind: "value", value: part.state }),
              global: new LazyCell({ kind: "value", value: part.global }),
            };
            // Handed to the program by `restored` (it may view them): never recycled.
            this.own.state.lend();
            this.own.global.lend();
          }
          this.pos = null;
          const value = part.version > 0 ? { state: part.state, global: part.global, version: part.version } : undefined;
          this.out.push({ kind: "restored", value });
          break;
        }
        case "replica":
          if (part.version === this.committed) this.held.set(part.owner, { version: part.version, state: part.state });
          break;
        case "results":
          for (const e of part.entries) if (e.version === this.buffer.version) this.buffer.add(e);
          break;
        case "cache":
          for (const e of part.entries) this.cache.put(e);
          break;
      }
    }
    if (!this.serveLocally()) this.sync();
  }

  // ---- helpers ---------------------------------------------------------------------------------

  private send(to: number, frame: ProtoFrame): void {
    this.out.push({ kind: "send", to, frame });
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
  return `${from}:${t.kind}:${t.kind === "replica" ? t.owner : ""}`;
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
