/**
 * The coordinator's membership logic as a pure state machine: who is in the job, which
 * incarnation of each rank is the current one, when the tables go out, when the job is
 * released, who hears an abort, and what a restarted rank and its peers are told.
 *
 * One input in, the effects out ({@link MembershipEffect}: messages to a rank or a routing
 * identity, {@link CoordinatorEvent}s for the owner, "prepare the tables" requests). Time is an
 * input too (`nowMs` of `start`, `restart-round` and `tick`). No I/O, no timers, no sockets:
 * the real coordinator (src/launch/coordinator.ts) runs it behind a zeromq Router and a
 * timer, the simulator (src/testing/sim-cluster.ts) over its seeded network and clock, so
 * both speak exactly the same protocol.
 *
 * Every incoming message is checked here (fields, sender's routing identity, attempt), since
 * ranks, stray processes and port scanners all reach the same socket: anything that is not a
 * well-formed message from the current incarnation of a rank is dropped with a warning (capped
 * at `warningsMax`), never a crash. Identity is the routing id: a message counts as rank r's
 * only from incarnation r's own routing id (which, in a job with keys, carries a token only
 * that incarnation holds; src/mpi/keys.ts), naming rank r itself. A hello, step, abort or
 * finalize from any other routing id — another rank's, an old incarnation's, a stranger's —
 * changes nothing, and a heartbeat counts only from the watchdog routing id of the attempt
 * the machine expects. Warnings never print a token.
 *
 * The tables also hand each rank the keys of its channels (`channelKeys`, a size × size
 * matrix by source and destination; src/mpi/wire.ts) and its peers' CURVE keys.
 *
 * @example
 * const m = new Membership({ size: 2, channelKeys: new Uint32Array(4), identity: controlIdentity, heartbeatIdentity });
 * for (const eff of m.step({ kind: "start", nowMs: 0 })) perform(eff); // then feed { kind: "message", identity, msg }
 */
import assert from "node:assert/strict";
import { errorMessage } from "../errors.ts";
import { decodeValue } from "../mpi/codec.ts";
import type { CoordinatorToRank, RankToCoordinator } from "../mpi/control.ts";
import type { ElasticEvent } from "./elastic-membership.ts";

/** What the coordinator reports to its owner. */
export type CoordinatorEvent =
  /** A rank said hello (its data socket is up). */
  | { kind: "rank-up"; rank: number; attempt: number; pid: number; endpoint: string }
  /** Every rank said hello and was sent the table. */
  | { kind: "ready"; endpoints: string[] }
  /** A rank reached a step boundary (a checkpoint() call). */
  | { kind: "step"; rank: number; steps: number; epoch: number }
  | { kind: "heartbeat"; rank: number }
  /** A rank called finalize(result); `result` is decoded. */
  | { kind: "finalized"; rank: number; result: unknown }
  /** A rank's finalize result could not be decoded. */
  | { kind: "bad-result"; rank: number; message: string }
  /** Every rank finalized; `release` was sent to all. */
  | { kind: "released" }
  /** A coordinated-checkpoint protocol message from a rank (see src/cpr/coordinated/initiator.ts). */
  | { kind: "cpr"; rank: number; msg: Extract<RankToCoordinator, { t: `cpr-${string}` }> }
  /** A rank asked for the job to stop (a job-fatal error on its side). */
  | { kind: "rank-abort"; rank: number; code: string; message: string }
  /** retry-one: a restarted rank caught up with the others (see control.ts `retry-caught-up`). */
  | { kind: "caught-up"; rank: number; attempt: number; restored: number; version: number; seqno: number; replayed: number }
  /** The tables' preparation (the coordinator's `beforeTables`) failed: the tables cannot be sent. */
  | { kind: "tables-failed"; code: string; message: string }
  /** Not every rank said hello within the rendezvous timeout. */
  | { kind: "rendezvous-timeout"; missing: number[]; timeoutMs: number }
  /** elastic: news of the job's world (elastic-membership.ts, which runs elastic jobs). */
  | { kind: "elastic"; detail: ElasticEvent }
  | { kind: "warning"; message: string };

/** The `table` message, which carries the endpoints of every rank. */
export type TableMessage = Extract<CoordinatorToRank, { t: "table" }>;

/** Per-rank view of the control channel. */
export interface RankLink {
  attempt: number;
  identity: string;
  up: boolean;
  pid: number | undefined;
  endpoint: string | undefined;
  /** tcp with keys: its data socket's CURVE key. */
  curveKey: string | undefined;
  steps: number;
  epoch: number;
  finalized: boolean;
  result: unknown;
}

export type MembershipPhase = "new" | "rendezvous" | "running" | "restarting" | "released" | "aborted" | "closed";

/** Construction options of a {@link Membership}. */
export interface MembershipOptions {
  readonly size: number;
  /**
   * Random per job: the key of the channel from rank s to rank d at `s * size + d`; each table
   * carries its rank's row and column (ranks refuse frames without their channel's key).
   */
  readonly channelKeys: ArrayLike<number>;
  /** The job's recovery mode, sent in the table: a rank started for another mode refuses to run. */
  readonly mode?: string | undefined;
  /** A job across hosts: each rank's host index at the job's start (`table.hosts`). */
  readonly hosts?: readonly number[] | undefined;
  /** The routing identity of incarnation `attempt` of `rank`'s control link. */
  readonly identity: (rank: number, attempt: number) => string;
  /** The routing identity of its watchdog's heartbeat link (heartbeats get a lease there). */
  readonly heartbeatIdentity: (rank: number, attempt: number) => string;
  /** Time allowed from `start` (and each `restart-round`) until every rank said hello; absent: no limit. */
  readonly rendezvousTimeoutMs?: number | undefined;
  /** Stray-traffic warnings reported before further ones are only counted (default 10). */
  readonly warningsMax?: number | undefined;
  /** Extra fields of one rank's `table` (cpr: the recovery line to restore from). */
  readonly tableFor?: ((rank: number) => Partial<TableMessage>) | undefined;
  /**
   * Every rank said hello in a start of all ranks: ask the owner to prepare the tables
   * (`prepare-tables`) and send them only on `tables-prepared` of the same round.
   */
  readonly prepareTables?: boolean | undefined;
}

/** What the owner feeds the machine. */
export type MembershipInput =
  /** The control socket is up: the rendezvous (and its clock) begins. */
  | { readonly kind: "start"; readonly nowMs: number }
  /** A decoded control message from routing identity `identity` (its fields not checked yet). */
  | { readonly kind: "message"; readonly identity: string; readonly msg: RankToCoordinator }
  /** Traffic that is not even a control message (garbage, wrong frame count): `message` says what. */
  | { readonly kind: "stray"; readonly message: string }
  /** The clock moved: a rendezvous past its deadline times out. */
  | { readonly kind: "tick"; readonly nowMs: number }
  /** The owner prepared the tables asked for by `prepare-tables` of `round`. */
  | { readonly kind: "tables-prepared"; readonly round: number }
  | { readonly kind: "tables-failed"; readonly round: number; readonly code: string; readonly message: string }
  /** Stop the job: every rank up is told. */
  | { readonly kind: "abort"; readonly code: string; readonly message: string }
  /**
   * cpr: the owner restarts every rank (it decided so; the ranks are being stopped). From now
   * on nothing of the current incarnations counts — no finalize, no release, no lease — until
   * `restart-round`: a rank cut off and declared dead may still deliver its last messages.
   */
  | { readonly kind: "round-over" }
  /** cpr: every rank starts again as `attempts[rank]`; a new rendezvous. */
  | { readonly kind: "restart-round"; readonly attempts: readonly number[]; readonly nowMs: number }
  /** retry-one, elastic: incarnation `attempt` of `rank` died (at `nowMs`: elastic times its wait for ranks from it). */
  | { readonly kind: "rank-down"; readonly rank: number; readonly attempt: number; readonly nowMs?: number }
  /** retry-one: `rank` starts again as incarnation `attempt` while the others run on. */
  | { readonly kind: "restart-rank"; readonly rank: number; readonly attempt: number }
  /** The owner's message to one rank (sent if the rank is up). */
  | { readonly kind: "send"; readonly rank: number; readonly msg: CoordinatorToRank }
  /** The owner's message to every rank up, while the job runs. */
  | { readonly kind: "broadcast"; readonly msg: CoordinatorToRank }
  | { readonly kind: "close" };

/** What the owner must do, in this order. */
export type MembershipEffect =
  /**
   * Send `msg` to routing identity `to` (`rank`: whose it is, for messages about a failed
   * send). `quiet`: a failed send is expected (the receiver may be dying) and not worth a warning.
   */
  | { readonly kind: "send"; readonly to: string; readonly rank: number | undefined; readonly msg: CoordinatorToRank; readonly quiet: boolean }
  | { readonly kind: "event"; readonly event: CoordinatorEvent }
  /** Prepare the tables of `round`, then feed `tables-prepared` (or `tables-failed`) with it. */
  | { readonly kind: "prepare-tables"; readonly round: number };

const LEASE: CoordinatorToRank = { t: "lease" };
const ABORT_HEARD: CoordinatorToRank = { t: "abort-heard" };

/** After this many warnings about stray traffic, further ones are counted, not printed (a spammer must not flood the terminal). */
const WARNINGS_MAX = 10;

/**
 * The membership state machine; see the file's comment.
 *
 * @example
 * const effects = membership.step({ kind: "rank-down", rank: 1, attempt: 0 }); // peer-down to the others
 * membership.link(1).up; // false
 */
export class Membership {
  protected readonly linksValue: RankLink[];
  protected readonly byIdentity = new Map<string, number>();
  protected phaseValue: MembershipPhase = "new";
  private helloCount = 0;
  /** Counts rendezvous rounds: tables prepared for an older round are not sent. */
  private roundValue = 0;
  private finalizedCount = 0;
  protected deadlineMs: number | undefined;
  private warnings = 0;
  private suppressedWarnings = 0;
  /** retry-one: ranks down (dead, or restarted and not back yet), and those expected back. */
  private readonly down = new Set<number>();
  private readonly rejoining = new Set<number>();
  /** retry-one: per restarted rank, the checkpoint count its dead incarnations had reported. */
  private readonly reached = new Map<number, number>();
  /** retry-one: routing ids of dead incarnations (their last messages are ignored quietly). */
  protected readonly gone = new Set<string>();
  /** Effects of the input being handled. */
  protected out: MembershipEffect[] = [];

  constructor(protected readonly opts: MembershipOptions) {
    assert(Number.isInteger(opts.size) && opts.size >= 1, "coordinator size must be a positive integer");
    this.linksValue = Array.from({ length: opts.size }, (_, rank) => this.incarnation(rank, 0));
  }

  get phase(): MembershipPhase {
    return this.phaseValue;
  }

  /** The current rendezvous round (0 for the job's start, +1 per `restart-round`). */
  get round(): number {
    return this.roundValue;
  }

  /** When the current rendezvous times out (the owner arms a timer and feeds `tick`); undefined: no rendezvous under way. */
  get rendezvousDeadlineMs(): number | undefined {
    return this.deadlineMs;
  }

  /** Count of stray-traffic warnings that were not reported. */
  get suppressedWarningCount(): number {
    return this.suppressedWarnings;
  }

  /** Every rank's link, by rank. */
  get links(): readonly Readonly<RankLink>[] {
    return this.linksValue;
  }

  link(rank: number): Readonly<RankLink> {
    const link = this.linksValue[rank];
    assert(link !== undefined, `rank ${rank} outside the job`);
    return link;
  }

  /** Ranks that have not said hello yet (in this round). */
  missingRanks(): number[] {
    return this.linksValue.flatMap((l, r) => (l.up ? [] : [r]));
  }

  /** Handles one input; returns what the owner must do, in order. */
  step(input: MembershipInput): MembershipEffect[] {
    this.out = [];
    switch (input.kind) {
      case "start":
        assert.equal(this.phaseValue, "new", "coordinator started twice");
        this.phaseValue = "rendezvous";
        this.armDeadline(input.nowMs);
        break;
      case "message":
        if (this.phaseValue !== "new" && this.phaseValue !== "closed") this.onMessage(input.identity, input.msg);
        break;
      case "stray":
        if (this.phaseValue !== "closed") this.warn(input.message);
        break;
      case "tick":
        this.onTick(input.nowMs);
        break;
      case "tables-prepared":
        if (input.round === this.roundValue && this.phaseValue === "running") this.sendTables();
        break;
      case "tables-failed":
        if (input.round === this.roundValue && this.phaseValue === "running") this.emit({ kind: "tables-failed", code: input.code, message: input.message });
        break;
      case "abort":
        this.abort(input.code, input.message);
        break;
      case "round-over":
        this.roundOver();
        break;
      case "restart-round":
        this.restartRound(input.attempts, input.nowMs);
        break;
      case "rank-down":
        this.rankDown(input.rank, input.attempt, input.nowMs);
        break;
      case "restart-rank":
        this.restartRank(input.rank, input.attempt);
        break;
      case "send": {
        // A rank that finalized gets nothing but its release (it may have left already).
        const link = this.linksValue[input.rank];
        if (link?.up === true && !link.finalized) this.send(input.rank, input.msg);
        break;
      }
      case "broadcast":
        if (this.phaseValue === "running")
          this.linksValue.forEach((l, r) => {
            if (l.up) this.send(r, input.msg);
          });
        break;
      case "close":
        this.phaseValue = "closed";
        this.deadlineMs = undefined;
        break;
      default: {
        const never: never = input;
        void never;
      }
    }
    const out = this.out;
    this.out = [];
    return out;
  }

  // ---- the owner's commands ----------------------------------------------------------------

  /** Tells every rank that said hello to stop; their later messages are still read (and ignored). */
  private abort(code: string, message: string): void {
    if (this.phaseValue === "closed" || this.phaseValue === "new") return;
    this.phaseValue = "aborted";
    this.deadlineMs = undefined;
    this.linksValue.forEach((l, r) => {
      if (l.up) this.send(r, { t: "abort", code, message });
    });
  }

  /** See the `round-over` input. */
  private roundOver(): void {
    if (this.phaseValue !== "running" && this.phaseValue !== "rendezvous") return;
    this.linksValue.forEach((l, r) => {
      this.gone.add(l.identity);
      this.gone.add(this.opts.heartbeatIdentity(r, l.attempt));
      l.up = false;
    });
    this.byIdentity.clear();
    this.deadlineMs = undefined;
    this.phaseValue = "restarting";
  }

  /**
   * A new rendezvous for a restart of every rank (cpr): the ranks come back with the new
   * attempts and say hello again; once all have, each is sent the table again. Messages from
   * the old attempts' identities are not accepted from now on.
   */
  private restartRound(attempts: readonly number[], nowMs: number): void {
    assert(
      this.phaseValue === "running" || this.phaseValue === "rendezvous" || this.phaseValue === "restarting" || this.phaseValue === "released",
      `restartRound in phase ${this.phaseValue}`,
    );
    assert.equal(attempts.length, this.opts.size, "restartRound needs an attempt per rank");
    this.byIdentity.clear();
    this.helloCount = 0;
    this.finalizedCount = 0;
    // retry-one's bookkeeping of single restarts belongs to the execution given up: every rank
    // starts again (from the durable floor), none is down or behind.
    this.down.clear();
    this.rejoining.clear();
    this.reached.clear();
    this.roundValue++;
    this.linksValue.forEach((l, r) => Object.assign(l, this.incarnation(r, attempts[r]!)));
    this.phaseValue = "rendezvous";
    this.armDeadline(nowMs);
  }

  /**
   * retry-one: `rank` (incarnation `attempt`) died. The others are told at once (`peer-down`)
   * and it counts as down until a restarted incarnation says hello.
   */
  protected rankDown(rank: number, attempt: number, _nowMs?: number): void {
    const link = this.linksValue[rank]!;
    if (link.attempt !== attempt || this.phaseValue !== "running") return;
    link.up = false;
    this.byIdentity.delete(link.identity);
    this.gone.add(link.identity);
    this.gone.add(this.opts.heartbeatIdentity(rank, attempt));
    this.down.add(rank);
    if (link.finalized) {
      // Its result comes again from the next incarnation; the job is released only after it.
      link.finalized = false;
      link.result = undefined;
      this.finalizedCount--;
    }
    // Quiet: another rank dying at the same moment cannot take the news (it is told by its own death).
    this.linksValue.forEach((l, r) => {
      if (l.up && r !== rank) this.send(r, { t: "peer-down", rank, attempt }, true);
    });
  }

  /**
   * retry-one: `rank` is started again as incarnation `attempt` while the others keep running.
   * Its hello gets it the table (with the ranks down right now); the others get `peer` with
   * its new endpoint. Nobody else re-handshakes.
   */
  protected restartRank(rank: number, attempt: number): void {
    const link = this.linksValue[rank]!;
    this.byIdentity.delete(link.identity);
    if (link.finalized && this.phaseValue !== "released") this.finalizedCount--;
    const rendezvous = this.phaseValue === "rendezvous";
    // Died before the job started: the new incarnation's hello counts in the rendezvous instead.
    if (rendezvous && link.up) this.helloCount--;
    this.reached.set(rank, Math.max(this.reached.get(rank) ?? 0, link.epoch));
    Object.assign(link, this.incarnation(rank, attempt));
    if (rendezvous) return;
    this.down.add(rank);
    this.rejoining.add(rank);
  }

  /** An elastic job's message (elastic-membership.ts takes them; no other job sends them). */
  protected onElastic(rank: number, msg: Extract<RankToCoordinator, { t: `elastic-${string}` }>): void {
    this.warn(`ignored ${msg.t} from rank ${rank}: this job does not run in --mode elastic`);
  }

  /** The link of incarnation `attempt` of `rank` before its hello. */
  protected incarnation(rank: number, attempt: number): RankLink {
    return {
      attempt,
      identity: this.opts.identity(rank, attempt),
      up: false,
      pid: undefined,
      endpoint: undefined,
      curveKey: undefined,
      steps: 0,
      epoch: 0,
      finalized: false,
      result: undefined,
    };
  }

  protected onTick(nowMs: number): void {
    if (this.deadlineMs === undefined || nowMs < this.deadlineMs || this.phaseValue !== "rendezvous") return;
    this.deadlineMs = undefined;
    this.emit({ kind: "rendezvous-timeout", missing: this.missingRanks(), timeoutMs: this.opts.rendezvousTimeoutMs! });
  }

  private armDeadline(nowMs: number): void {
    const timeout = this.opts.rendezvousTimeoutMs;
    this.deadlineMs = timeout === undefined ? undefined : nowMs + timeout;
  }

  // ---- the ranks' messages -----------------------------------------------------------------

  private onMessage(identity: string, msg: RankToCoordinator): void {
    const problem = malformed(msg, this.opts.size);
    if (problem !== undefined) {
      this.warn(`ignored a malformed control message from ${printable(identity)}: ${problem}`);
      return;
    }
    if (msg.t === "hello") {
      this.onHello(identity, msg);
      return;
    }
    // Heartbeats come from the rank's watchdog thread, which has a link of its own and starts
    // beating before the rank says hello: accept them from the attempt we expect, so a rank
    // that freezes during its start-up is caught by --failure-timeout, not the rendezvous timeout.
    // An incarnation declared dead (rank-down) gets no lease even before its successor starts:
    // cut off by a partition that heals, it must still end itself.
    const rank =
      msg.t === "heartbeat" && identity === this.opts.heartbeatIdentity(msg.rank, msg.attempt)
        ? this.linksValue[msg.rank]?.attempt === msg.attempt && !this.gone.has(identity)
          ? msg.rank
          : undefined
        : this.byIdentity.get(identity);
    if (rank === undefined) {
      if (this.gone.has(identity)) return;
      this.warn(`ignored a ${msg.t} message from ${printable(identity)}, which has not said hello`);
      return;
    }
    if (msg.rank !== rank) {
      this.warn(`ignored a ${msg.t} message claiming rank ${msg.rank} from ${printable(identity)} (rank ${rank})`);
      return;
    }
    const link = this.linksValue[rank]!;
    switch (msg.t) {
      case "step":
        link.steps = msg.steps;
        link.epoch = msg.epoch;
        this.emit({ kind: "step", rank, steps: msg.steps, epoch: msg.epoch });
        return;
      case "heartbeat":
        this.emit({ kind: "heartbeat", rank });
        // The lease: a watchdog that beats over its own socket (a rank without the launcher's
        // pipe: on another host, or started by another engine) ends its rank when these stop.
        if (identity !== link.identity) this.out.push({ kind: "send", to: identity, rank: undefined, msg: LEASE, quiet: true });
        return;
      case "finalize":
        this.onFinalize(rank, link, msg.result);
        return;
      case "abort":
        this.emit({ kind: "rank-abort", rank, code: msg.code, message: msg.message });
        this.send(rank, ABORT_HEARD, true);
        return;
      case "cpr-checkpointed":
      case "cpr-ready":
      case "cpr-part":
      case "cpr-part-failed":
      case "cpr-held":
      case "cpr-copy":
      case "cpr-durable":
        // The checkpoint protocols' messages go to the restart policy (the owner).
        this.emit({ kind: "cpr", rank, msg });
        return;
      case "retry-caught-up":
        if (msg.attempt !== link.attempt) return; // an older incarnation's late word
        this.emit({ kind: "caught-up", rank, attempt: msg.attempt, restored: msg.restored, version: msg.version, seqno: msg.seqno, replayed: msg.replayed });
        return;
      case "elastic-summary":
      case "elastic-switched":
        this.onElastic(rank, msg);
        return;
      default: {
        const never: never = msg;
        void never;
      }
    }
  }

  private onHello(identity: string, msg: Extract<RankToCoordinator, { t: "hello" }>): void {
    const link = this.linksValue[msg.rank]!;
    const expected = this.opts.identity(msg.rank, msg.attempt);
    if (identity !== expected) {
      this.warn(`ignored hello for rank ${msg.rank} attempt ${msg.attempt} from routing id ${printable(identity)} (expected ${printable(expected)})`);
      return;
    }
    if (msg.size !== this.opts.size) {
      this.warn(`ignored hello from rank ${msg.rank} of a job of size ${msg.size} (this job has ${this.opts.size} ranks)`);
      return;
    }
    if (msg.attempt !== link.attempt) {
      this.warn(`ignored hello from rank ${msg.rank} attempt ${msg.attempt}; expected attempt ${link.attempt}`);
      return;
    }
    if (link.up) {
      this.warn(`ignored a second hello from rank ${msg.rank} (pid ${msg.pid}; rank ${msg.rank} is pid ${link.pid})`);
      return;
    }
    this.admit(identity, msg);
  }

  /** A hello that passed the checks: the rank joins the rendezvous (or, restarted, the running job). */
  protected admit(identity: string, msg: Extract<RankToCoordinator, { t: "hello" }>): void {
    if (this.phaseValue === "running" && this.rejoining.has(msg.rank)) {
      this.onRejoin(identity, msg);
      return;
    }
    if (this.phaseValue !== "rendezvous") {
      this.warn(`ignored hello from rank ${msg.rank} after the rendezvous (${this.phaseValue})`);
      return;
    }
    this.linkUp(identity, msg);
    this.helloCount++;
    if (this.helloCount === this.opts.size) this.onAllUp();
  }

  protected linkUp(identity: string, msg: Extract<RankToCoordinator, { t: "hello" }>): void {
    const link = this.linksValue[msg.rank]!;
    link.up = true;
    link.pid = msg.pid;
    link.endpoint = msg.endpoint;
    link.curveKey = msg.curveKey;
    this.byIdentity.set(identity, msg.rank);
    this.emit({ kind: "rank-up", rank: msg.rank, attempt: msg.attempt, pid: msg.pid, endpoint: msg.endpoint });
  }

  /** retry-one: a restarted rank is back; it gets the table, the others its endpoint. */
  private onRejoin(identity: string, msg: Extract<RankToCoordinator, { t: "hello" }>): void {
    this.rejoining.delete(msg.rank);
    this.down.delete(msg.rank);
    this.linkUp(identity, msg);
    this.send(
      msg.rank,
      this.tableOf(msg.rank, {
        endpoints: this.linksValue.map((l) => l.endpoint ?? ""),
        ...this.curveKeys(),
        // A rank restarted but not back yet is still its dead incarnation here: its `peer` (the
        // new attempt) follows once it says hello.
        attempts: this.linksValue.map((l, r) => (this.rejoining.has(r) ? l.attempt - 1 : l.attempt)),
        down: [...this.down].sort((a, b) => a - b),
        reached: this.reached.get(msg.rank) ?? 0,
      }),
    );
    const peer: CoordinatorToRank = {
      t: "peer",
      rank: msg.rank,
      endpoint: msg.endpoint,
      attempt: msg.attempt,
      ...(msg.curveKey === undefined ? {} : { curveKey: msg.curveKey }),
    };
    this.linksValue.forEach((l, r) => {
      if (l.up && r !== msg.rank) this.send(r, peer, true);
    });
  }

  private onAllUp(): void {
    this.deadlineMs = undefined;
    this.phaseValue = "running";
    if (this.opts.prepareTables === true) {
      this.out.push({ kind: "prepare-tables", round: this.roundValue });
      return;
    }
    this.sendTables();
  }

  private sendTables(): void {
    const endpoints = this.linksValue.map((l) => l.endpoint!);
    const attempts = this.linksValue.map((l) => l.attempt);
    const curveKeys = this.curveKeys();
    for (let r = 0; r < this.opts.size; r++) this.send(r, this.tableOf(r, { endpoints, attempts, ...curveKeys }));
    this.emit({ kind: "ready", endpoints });
  }

  /** The ranks' CURVE keys for a table, if they have any ("" for a rank down). */
  protected curveKeys(): Pick<TableMessage, "curveKeys"> {
    return this.linksValue.some((l) => l.curveKey !== undefined) ? { curveKeys: this.linksValue.map((l) => l.curveKey ?? "") } : {};
  }

  /** Rank `rank`'s table: what every table of the job carries, `fields`, and the owner's extras. */
  protected tableOf(rank: number, fields: Pick<TableMessage, "endpoints" | "attempts" | "down" | "reached" | "curveKeys">): TableMessage {
    const size = this.opts.size;
    const keys = this.opts.channelKeys;
    return {
      t: "table",
      keysIn: Array.from({ length: size }, (_, s) => keys[s * size + rank]!),
      keysOut: Array.from({ length: size }, (_, d) => keys[rank * size + d]!),
      ...fields,
      ...(this.opts.hosts === undefined ? {} : { hosts: [...this.opts.hosts] }),
      ...(this.opts.mode === undefined ? {} : { mode: this.opts.mode }),
      ...this.opts.tableFor?.(rank),
    };
  }

  private onFinalize(rank: number, link: RankLink, bytes: Uint8Array): void {
    if (link.finalized) {
      this.warn(`ignored a second finalize from rank ${rank}`);
      return;
    }
    let result: unknown;
    try {
      result = decodeValue(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength));
    } catch (err) {
      this.emit({ kind: "bad-result", rank, message: `the finalize() result of rank ${rank} cannot be decoded: ${errorMessage(err)}` });
      return;
    }
    this.onResult(rank, link, result);
  }

  /** A rank's finalize() result: the job is released once every rank finalized. */
  protected onResult(rank: number, link: RankLink, result: unknown): void {
    link.finalized = true;
    link.result = result;
    this.finalizedCount++;
    this.emit({ kind: "finalized", rank, result });
    if (this.finalizedCount === this.opts.size && this.phaseValue === "running") {
      this.phaseValue = "released";
      for (let r = 0; r < this.opts.size; r++) this.send(r, { t: "release" });
      this.emit({ kind: "released" });
    }
  }

  // ---- effects -----------------------------------------------------------------------------

  protected send(rank: number, msg: CoordinatorToRank, quiet = false): void {
    this.out.push({ kind: "send", to: this.linksValue[rank]!.identity, rank, msg, quiet });
  }

  protected emit(event: CoordinatorEvent): void {
    this.out.push({ kind: "event", event });
  }

  protected warn(message: string): void {
    const max = this.opts.warningsMax ?? WARNINGS_MAX;
    if (this.warnings < max) {
      this.warnings++;
      const tail = this.warnings === max ? " (further warnings about stray control traffic are suppressed)" : "";
      this.emit({ kind: "warning", message: message + tail });
    } else {
      this.suppressedWarnings++;
    }
  }
}

/** Checks the fields of a decoded rank message; returns what is wrong, or undefined. */
function malformed(msg: RankToCoordinator, size: number): string | undefined {
  const m = msg as unknown as Record<string, unknown>;
  const isRank = (v: unknown): boolean => Number.isInteger(v) && (v as number) >= 0 && (v as number) < size;
  const isCount = (v: unknown): boolean => Number.isInteger(v) && (v as number) >= 0;
  if (!isRank(m.rank)) return `${String(m.t)}: rank ${JSON.stringify(m.rank)} is not in 0..${size - 1}`;
  switch (msg.t) {
    case "hello":
      if (!isCount(m.attempt) || !isCount(m.pid) || !isCount(m.size) || typeof m.endpoint !== "string" || m.endpoint === "") {
        return "hello needs attempt, pid, size and endpoint";
      }
      if (m.curveKey !== undefined && (typeof m.curveKey !== "string" || m.curveKey.length !== 40)) return "hello's curveKey is not a CURVE key";
      return undefined;
    case "step":
      return isCount(m.steps) && isCount(m.epoch) ? undefined : "step needs steps and epoch counts";
    case "finalize":
      return m.result instanceof Uint8Array ? undefined : "finalize needs a binary result";
    case "abort":
      return typeof m.code === "string" && typeof m.message === "string" ? undefined : "abort needs code and message strings";
    case "heartbeat":
      return undefined;
    case "cpr-checkpointed":
    case "cpr-ready":
    case "cpr-part":
    case "cpr-part-failed":
      // The initiator checks the rest of the message; an epoch is what every one of them needs.
      return isCount(m.epoch) ? undefined : `${msg.t} needs an epoch count`;
    case "cpr-held": {
      const ok =
        Array.isArray(m.parts) &&
        m.parts.every(
          (x: unknown) =>
            x !== null && typeof x === "object" && isPartRef((x as { ref?: unknown }).ref) && typeof (x as { where?: unknown }).where === "string",
        );
      return ok ? undefined : "cpr-held needs a list of parts, each a part reference and where it is";
    }
    case "cpr-copy":
      if (!isRank(m.of) || !isCount(m.epoch)) return "cpr-copy needs of (a rank) and an epoch count";
      return m.part instanceof Uint8Array || typeof m.error === "string" ? undefined : "cpr-copy needs the part's bytes or an error";
    case "cpr-durable": {
      const counts = (v: unknown): boolean => Array.isArray(v) && v.length === size && v.every(isCount);
      return isCount(m.epoch) && isPartRef(m.ref) && isCount(m.index) && counts(m.sent) && counts(m.consumed) && counts(m.logFrom)
        ? undefined
        : "cpr-durable needs an epoch, a part reference, a collective index, and sent, consumed and logFrom counts per rank";
    }
    case "retry-caught-up":
      return isCount(m.attempt) && isCount(m.restored) && isCount(m.version) && isCount(m.seqno) && isCount(m.replayed)
        ? undefined
        : "retry-caught-up needs attempt, restored, version, seqno and replayed counts";
    case "elastic-summary":
      return isCount(m.view) && typeof m.hasState === "boolean" && isCount(m.reached) && isCount(m.oldest) && typeof m.started === "boolean"
        ? undefined
        : "elastic-summary needs view, reached and oldest counts and hasState and started flags";
    case "elastic-switched":
      return isCount(m.view) && isCount(m.at) ? undefined : "elastic-switched needs view and at counts";
    default:
      return `unknown message type ${JSON.stringify((msg as { t: unknown }).t)}`;
  }
}

function isPartRef(v: unknown): boolean {
  if (v === null || typeof v !== "object") return false;
  const r = v as Record<string, unknown>;
  return [r.rank, r.epoch, r.checksum, r.bytes].every((n) => Number.isSafeInteger(n) && (n as number) >= 0);
}

/**
 * A routing id for a log line: zeromq generates binary ids for peers that set none. A token
 * (everything after a `/`, src/mpi/control.ts `controlIdentity`) is never printed.
 *
 * @example
 * printable("r1.0");         // '"r1.0"'
 * printable("r1.0/5f3a9c…"); // '"r1.0/…"'
 */
export function printable(identity: string): string {
  const slash = identity.indexOf("/");
  const shown = slash < 0 ? identity : `${identity.slice(0, slash)}/…`;
  return /^[\x20-\x7e]{1,64}$/.test(identity) ? JSON.stringify(shown) : `a peer with binary id ${Buffer.from(identity, "latin1").toString("hex").slice(0, 32)}`;
}
