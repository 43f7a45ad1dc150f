/**
 * The job's coordinator: the launcher's end of the control channel (src/mpi/control.ts).
 *
 * One ZeroMQ `Router` bound on a private endpoint. Every rank connects a `Dealer` whose
 * routing id is `controlIdentity(rank, attempt)` and says `hello` with its data endpoint;
 * once all ranks have, the coordinator sends each the `table` of endpoints (rendezvous).
 * Afterwards it relays what ranks report — progress (`step`), results (`finalize`),
 * job-fatal errors (`abort`), liveness (`heartbeat`) — as {@link CoordinatorEvent}s to its
 * owner (the supervisor), and sends `release` once every rank has finalized.
 *
 * The coordinator decides nothing about failures: it reports, the supervisor's policy acts.
 * Anything on the Router that is not a well-formed message from a known rank (a stray
 * process, a port scanner on tcp) is dropped with a rate-limited warning, never a crash.
 *
 * @example
 * const coord = new Coordinator({ size: 2, jobKey, transport: "ipc", runDir, rendezvousTimeoutMs: 30_000, onEvent });
 * const endpoint = await coord.start(); // pass to ranks as LIFELINE_COORDINATOR
 * // ... onEvent({ kind: "ready" }) once both said hello; coord.abort("LAUNCH_RANK_FAILED", "rank 1 died")
 * await coord.close();
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { Router } from "zeromq";
import { LifelineError, errorMessage } from "../errors.ts";
import { DEFAULT_TCP_HOST } from "../mpi/bind.ts";
import { decodeValue } from "../mpi/codec.ts";
import { controlIdentity, decodeControl, encodeControl, heartbeatIdentity, type CoordinatorToRank, type RankToCoordinator } from "../mpi/control.ts";

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
  /** {@link CoordinatorOptions.beforeTables} failed: the tables cannot be sent. */
  | { kind: "tables-failed"; code: string; message: string }
  /** Not every rank said hello within the rendezvous timeout. */
  | { kind: "rendezvous-timeout"; missing: number[]; timeoutMs: number }
  | { kind: "warning"; message: string };

/** Construction options of a {@link Coordinator}. */
export interface CoordinatorOptions {
  size: number;
  /** Random per job; ranks use it to reject data messages from other jobs. */
  jobKey: number;
  transport: "ipc" | "tcp";
  /** tcp: the address to bind and advertise (default the loopback address). */
  host?: string | undefined;
  /** tcp: the port (default 0: one the OS picks). */
  port?: number | undefined;
  /** The job's recovery mode, sent in the table: a rank started for another mode refuses to run. */
  mode?: string | undefined;
  /** Private directory for the ipc endpoint. */
  runDir: string;
  /** Time allowed from {@link Coordinator.start} until every rank said hello. */
  rendezvousTimeoutMs: number;
  onEvent: (ev: CoordinatorEvent) => void;
  /** Bound on a blocked send to one rank (a rank that stopped reading its Dealer). */
  sendTimeoutMs?: number;
  /** Stray-traffic warnings reported before further ones are only counted (default 10). */
  warningsMax?: number;
  /** Extra fields of one rank's `table` (cpr: the recovery line to restore from). */
  tableFor?: (rank: number) => Partial<Extract<CoordinatorToRank, { t: "table" }>>;
  /** A job across hosts: each rank's host index at the job's start (`table.hosts`). */
  hosts?: readonly number[] | undefined;
  /**
   * Every rank said hello (a start of all ranks): work to finish before the tables go out
   * (cpr with per-host stores: find and fetch the parts of the recovery line). Meanwhile the
   * ranks' messages flow as usual; a rejection is reported as `tables-failed`.
   */
  beforeTables?: () => Promise<void>;
}

/** Per-rank view of the control channel. */
export interface RankLink {
  attempt: number;
  identity: string;
  up: boolean;
  pid: number | undefined;
  endpoint: string | undefined;
  steps: number;
  epoch: number;
  finalized: boolean;
  result: unknown;
}

type Phase = "new" | "rendezvous" | "running" | "released" | "aborted" | "closed";

const LEASE: CoordinatorToRank = { t: "lease" };

/** After this many warnings about stray traffic, further ones are counted, not printed (a spammer must not flood the terminal). */
const WARNINGS_MAX = 10;
/** Unix socket paths are limited to 107 bytes (sun_path) on Linux. */
const IPC_PATH_MAX = 107;

export class Coordinator {
  private readonly router: Router;
  private readonly links: RankLink[];
  private readonly byIdentity = new Map<string, number>();
  private phase: Phase = "new";
  private helloCount = 0;
  /** Counts rendezvous rounds: tables prepared for an older round are not sent. */
  private round = 0;
  private finalizedCount = 0;
  private rendezvousTimer: NodeJS.Timeout | undefined;
  private sendChain: Promise<void> = Promise.resolve();
  private readLoop: Promise<void> | undefined;
  private warnings = 0;
  private suppressedWarnings = 0;
  private endpointValue: string | undefined;
  /** retry-one: ranks down (dead, or restarted and not back yet), and those expected back. */
  private readonly down = new Set<number>();
  private readonly rejoining = new Set<number>();
  /** retry-one: routing ids of dead incarnations (their last messages are ignored quietly). */
  private readonly gone = new Set<string>();

  constructor(private readonly opts: CoordinatorOptions) {
    assert(Number.isInteger(opts.size) && opts.size >= 1, "coordinator size must be a positive integer");
    // mandatory: a send to a rank that is gone fails (and is reported) instead of vanishing;
    // sendTimeout bounds a send to a rank whose queue is full, so one stuck rank cannot
    // block the release or abort of the others (sends are serialized).
    this.router = new Router({ linger: 0, mandatory: true, sendTimeout: opts.sendTimeoutMs ?? 2_000 });
    this.links = Array.from({ length: opts.size }, (_, rank) => ({
      attempt: 0,
      identity: controlIdentity(rank, 0),
      up: false,
      pid: undefined,
      endpoint: undefined,
      steps: 0,
      epoch: 0,
      finalized: false,
      result: undefined,
    }));
  }

  /** The endpoint ranks connect to (`LIFELINE_COORDINATOR`); set by {@link start}. */
  get endpoint(): string {
    assert(this.endpointValue !== undefined, "coordinator not started");
    return this.endpointValue;
  }

  /** Read-only view of each rank's link. */
  rank(rank: number): Readonly<RankLink> {
    const link = this.links[rank];
    assert(link !== undefined, `rank ${rank} outside the job`);
    return link;
  }

  /** Ranks that have not said hello yet. */
  missingRanks(): number[] {
    return this.links.flatMap((l, r) => (l.up ? [] : [r]));
  }

  /**
   * Binds the Router and starts the rendezvous clock. Resolves to the endpoint to hand to ranks.
   * Rejects with `LAUNCH_SPAWN` if the endpoint cannot be bound.
   */
  async start(): Promise<string> {
    assert.equal(this.phase, "new", "coordinator started twice");
    let address: string;
    if (this.opts.transport === "ipc") {
      const path = join(this.opts.runDir, "coordinator");
      if (Buffer.byteLength(path) > IPC_PATH_MAX) {
        throw new LifelineError("LAUNCH_SPAWN", `ipc path ${path} is longer than ${IPC_PATH_MAX} bytes; set TMPDIR to a shorter directory or use --transport tcp`);
      }
      address = `ipc://${path}`;
    } else {
      // Port 0: the OS picks a free port, so concurrent jobs (and tests) never collide.
      address = `tcp://${this.opts.host ?? DEFAULT_TCP_HOST}:${this.opts.port ?? 0}`;
    }
    try {
      await this.router.bind(address);
    } catch (err) {
      throw new LifelineError("LAUNCH_SPAWN", `coordinator cannot bind ${address}: ${errorMessage(err)}`, { cause: err });
    }
    this.endpointValue = this.router.lastEndpoint ?? address;
    this.phase = "rendezvous";
    this.rendezvousTimer = setTimeout(() => this.onRendezvousTimeout(), this.opts.rendezvousTimeoutMs);
    this.readLoop = this.receive();
    return this.endpointValue;
  }

  /**
   * Tells every rank that said hello to stop (`abort`), e.g. because another rank failed.
   * Later messages from ranks are still read (and ignored) so none blocks on a full queue.
   */
  async abort(code: string, message: string): Promise<void> {
    if (this.phase === "closed" || this.phase === "new") return;
    this.phase = "aborted";
    this.clearRendezvousTimer();
    const sends = this.links.flatMap((l, r) => (l.up ? [this.send(r, { t: "abort", code, message })] : []));
    await Promise.all(sends);
  }

  /**
   * Starts a new rendezvous for a restart of every rank (cpr): the ranks come back with
   * attempt + 1 and say hello again; once all have, each is sent the table again. Messages
   * from the old attempts' identities are ignored from now on.
   */
  restartRound(attempts: readonly number[]): void {
    assert(this.phase === "running" || this.phase === "rendezvous" || this.phase === "released", `restartRound in phase ${this.phase}`);
    this.clearRendezvousTimer();
    this.byIdentity.clear();
    this.helloCount = 0;
    this.finalizedCount = 0;
    this.round++;
    this.links.forEach((l, r) => {
      l.attempt = attempts[r]!;
      l.identity = controlIdentity(r, l.attempt);
      l.up = false;
      l.pid = undefined;
      l.endpoint = undefined;
      l.steps = 0;
      l.epoch = 0;
      l.finalized = false;
      l.result = undefined;
    });
    this.phase = "rendezvous";
    this.rendezvousTimer = setTimeout(() => this.onRendezvousTimeout(), this.opts.rendezvousTimeoutMs);
  }

  /**
   * retry-one: `rank` (incarnation `attempt`) died. The others are told at once (`peer-down`)
   * and it counts as down until a restarted incarnation says hello.
   */
  rankDown(rank: number, attempt: number): void {
    const link = this.links[rank]!;
    if (link.attempt !== attempt || this.phase !== "running") return;
    link.up = false;
    this.byIdentity.delete(link.identity);
    this.gone.add(link.identity);
    this.down.add(rank);
    if (link.finalized) {
      // Its result comes again from the next incarnation; the job is released only after it.
      link.finalized = false;
      link.result = undefined;
      this.finalizedCount--;
    }
    // Quiet: another rank dying at the same moment cannot take the news (it is told by its own death).
    this.links.forEach((l, r) => { if (l.up && r !== rank) void this.send(r, { t: "peer-down", rank, attempt }, true); });
  }

  /**
   * retry-one: `rank` is started again as incarnation `attempt` while the others keep running.
   * Its hello gets it the table (with the ranks down right now); the others get `peer` with
   * its new endpoint. Nobody else re-handshakes.
   */
  restartRank(rank: number, attempt: number): void {
    const link = this.links[rank]!;
    this.byIdentity.delete(link.identity);
    if (link.finalized && this.phase !== "released") this.finalizedCount--;
    const rendezvous = this.phase === "rendezvous";
    // Died before the job started: the new incarnation's hello counts in the rendezvous instead.
    if (rendezvous && link.up) this.helloCount--;
    link.attempt = attempt;
    link.identity = controlIdentity(rank, attempt);
    link.up = false;
    link.pid = undefined;
    link.endpoint = undefined;
    link.steps = 0;
    link.finalized = false;
    link.result = undefined;
    if (rendezvous) return;
    this.down.add(rank);
    this.rejoining.add(rank);
  }

  /** Sends one message to rank `rank`'s current incarnation (if it said hello). */
  sendToRank(rank: number, msg: CoordinatorToRank): void {
    if (this.links[rank]?.up === true) void this.send(rank, msg);
  }

  /** Sends `msg` to every rank that said hello in the current round. */
  broadcast(msg: CoordinatorToRank): void {
    if (this.phase !== "running") return;
    this.links.forEach((l, r) => { if (l.up) void this.send(r, msg); });
  }

  /** Closes the Router. Safe to call more than once. */
  async close(): Promise<void> {
    if (this.phase === "closed") return;
    this.phase = "closed";
    this.clearRendezvousTimer();
    // Pending sends are abandoned: close() with linger 0 drops them, which is what we want
    // when the job is over (ranks that still wait are killed by the supervisor).
    this.router.close();
    await this.readLoop?.catch(() => undefined);
  }

  // ---- receiving ------------------------------------------------------------------------

  private async receive(): Promise<void> {
    try {
      for await (const frames of this.router) {
        if (this.phase === "closed") break;
        try {
          this.onFrames(frames);
        } catch (err) {
          // An event handler threw: that is a launcher bug, not rank input. Surface it
          // without killing the read loop, so the job can still be stopped cleanly.
          this.opts.onEvent({ kind: "warning", message: `internal error while handling a control message: ${errorMessage(err)}` });
        }
      }
    } catch (err) {
      if (this.phase !== "closed") this.opts.onEvent({ kind: "warning", message: `coordinator stopped reading: ${errorMessage(err)}` });
    }
  }

  private onFrames(frames: Buffer[]): void {
    const [idFrame, ...body] = frames;
    const identity = idFrame?.toString("latin1") ?? "";
    // A Dealer sends one frame; tolerate a leading empty delimiter (REQ-style peers).
    const payload = body.length === 2 && body[0]!.length === 0 ? body[1] : body.length === 1 ? body[0] : undefined;
    if (payload === undefined) {
      this.warn(`ignored a ${body.length}-frame message from ${printable(identity)} on the control channel (not a lifeline rank?)`);
      return;
    }
    let msg: RankToCoordinator;
    try {
      msg = decodeControl(payload) as RankToCoordinator;
    } catch (err) {
      this.warn(`ignored garbage from ${printable(identity)} on the control channel: ${errorMessage(err)}`);
      return;
    }
    const problem = malformed(msg, this.opts.size);
    if (problem !== undefined) {
      this.warn(`ignored a malformed control message from ${printable(identity)}: ${problem}`);
      return;
    }
    if (msg.t === "hello") {
      this.onHello(identity, msg);
      return;
    }
    // Heartbeats come from the rank's watchdog thread, which has a Dealer of its own and starts
    // beating before the rank says hello: accept them from the attempt we expect, so a rank
    // that freezes during its start-up is caught by --failure-timeout, not the rendezvous timeout.
    const rank = msg.t === "heartbeat" && identity === heartbeatIdentity(msg.rank, msg.attempt)
      ? (this.links[msg.rank]?.attempt === msg.attempt ? msg.rank : undefined)
      : this.byIdentity.get(identity);
    if (rank === undefined) {
      if (this.gone.has(identity) || this.gone.has(identity.replace(/^hb:/, ""))) return;
      this.warn(`ignored a ${msg.t} message from ${printable(identity)}, which has not said hello`);
      return;
    }
    if (msg.rank !== rank) {
      this.warn(`ignored a ${msg.t} message claiming rank ${msg.rank} from ${printable(identity)} (rank ${rank})`);
      return;
    }
    const link = this.links[rank]!;
    switch (msg.t) {
      case "step":
        link.steps = msg.steps;
        link.epoch = msg.epoch;
        this.opts.onEvent({ kind: "step", rank, steps: msg.steps, epoch: msg.epoch });
        return;
      case "heartbeat":
        this.opts.onEvent({ kind: "heartbeat", rank });
        // The lease: a watchdog that beats over its own socket (a rank without the launcher's
        // pipe: on another host, or started by another engine) ends its rank when these stop.
        if (identity !== link.identity) this.sendTo(identity, LEASE, true);
        return;
      case "finalize":
        this.onFinalize(rank, link, msg.result);
        return;
      case "abort":
        this.opts.onEvent({ kind: "rank-abort", rank, code: msg.code, message: msg.message });
        return;
      case "cpr-checkpointed":
      case "cpr-ready":
      case "cpr-part":
      case "cpr-part-failed":
      case "cpr-held":
      case "cpr-copy":
        // The coordinated-checkpoint protocol's messages go to the initiator (the owner).
        this.opts.onEvent({ kind: "cpr", rank, msg });
        return;
      case "retry-caught-up":
        if (msg.attempt !== link.attempt) return; // an older incarnation's late word
        this.opts.onEvent({ kind: "caught-up", rank, attempt: msg.attempt, restored: msg.restored, version: msg.version, seqno: msg.seqno, replayed: msg.replayed });
        return;
      default: {
        const never: never = msg;
        void never;
      }
    }
  }

  private onHello(identity: string, msg: Extract<RankToCoordinator, { t: "hello" }>): void {
    const link = this.links[msg.rank]!;
    if (identity !== controlIdentity(msg.rank, msg.attempt)) {
      this.warn(`ignored hello for rank ${msg.rank} attempt ${msg.attempt} from routing id ${printable(identity)} (expected ${controlIdentity(msg.rank, msg.attempt)})`);
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
    if (this.phase === "running" && this.rejoining.has(msg.rank)) {
      this.onRejoin(identity, msg);
      return;
    }
    if (this.phase !== "rendezvous") {
      this.warn(`ignored hello from rank ${msg.rank} after the rendezvous (${this.phase})`);
      return;
    }
    link.up = true;
    link.pid = msg.pid;
    link.endpoint = msg.endpoint;
    this.byIdentity.set(identity, msg.rank);
    this.helloCount++;
    this.opts.onEvent({ kind: "rank-up", rank: msg.rank, attempt: msg.attempt, pid: msg.pid, endpoint: msg.endpoint });
    if (this.helloCount === this.opts.size) this.onAllUp();
  }

  /** retry-one: a restarted rank is back; it gets the table, the others its endpoint. */
  private onRejoin(identity: string, msg: Extract<RankToCoordinator, { t: "hello" }>): void {
    const link = this.links[msg.rank]!;
    this.rejoining.delete(msg.rank);
    this.down.delete(msg.rank);
    link.up = true;
    link.pid = msg.pid;
    link.endpoint = msg.endpoint;
    this.byIdentity.set(identity, msg.rank);
    this.opts.onEvent({ kind: "rank-up", rank: msg.rank, attempt: msg.attempt, pid: msg.pid, endpoint: msg.endpoint });
    const table: CoordinatorToRank = {
      t: "table", jobKey: this.opts.jobKey, endpoints: this.links.map((l) => l.endpoint ?? ""),
      // A rank restarted but not back yet is still its dead incarnation here: its `peer` (the
      // new attempt) follows once it says hello.
      attempts: this.links.map((l, r) => (this.rejoining.has(r) ? l.attempt - 1 : l.attempt)),
      down: [...this.down].sort((a, b) => a - b),
      ...this.tableExtras(),
    };
    void this.send(msg.rank, { ...table, ...this.opts.tableFor?.(msg.rank) } as CoordinatorToRank);
    const peer: CoordinatorToRank = { t: "peer", rank: msg.rank, endpoint: msg.endpoint, attempt: msg.attempt };
    this.links.forEach((l, r) => { if (l.up && r !== msg.rank) void this.send(r, peer, true); });
  }

  private onAllUp(): void {
    this.clearRendezvousTimer();
    this.phase = "running";
    const before = this.opts.beforeTables;
    if (before === undefined) {
      this.sendTables();
      return;
    }
    const round = this.round;
    before().then(
      () => { if (round === this.round && this.phase === "running") this.sendTables(); },
      (err: unknown) => {
        if (round !== this.round || this.phase !== "running") return;
        const code = err instanceof LifelineError ? err.code : "LAUNCH_SPAWN";
        this.opts.onEvent({ kind: "tables-failed", code, message: errorMessage(err) });
      },
    );
  }

  private sendTables(): void {
    const endpoints = this.links.map((l) => l.endpoint!);
    const table: CoordinatorToRank = {
      t: "table", jobKey: this.opts.jobKey, endpoints, attempts: this.links.map((l) => l.attempt),
      ...this.tableExtras(),
    };
    for (let r = 0; r < this.opts.size; r++) void this.send(r, { ...table, ...this.opts.tableFor?.(r) } as CoordinatorToRank);
    this.opts.onEvent({ kind: "ready", endpoints });
  }

  /** What every table of the job carries besides endpoints and attempts. */
  private tableExtras(): { hosts?: number[]; mode?: string } {
    return { ...(this.opts.hosts === undefined ? {} : { hosts: [...this.opts.hosts] }), ...(this.opts.mode === undefined ? {} : { mode: this.opts.mode }) };
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
      this.opts.onEvent({ kind: "bad-result", rank, message: `the finalize() result of rank ${rank} cannot be decoded: ${errorMessage(err)}` });
      return;
    }
    link.finalized = true;
    link.result = result;
    this.finalizedCount++;
    this.opts.onEvent({ kind: "finalized", rank, result });
    if (this.finalizedCount === this.opts.size && this.phase === "running") this.releaseAll();
  }

  private releaseAll(): void {
    this.phase = "released";
    for (let r = 0; r < this.opts.size; r++) void this.send(r, { t: "release" });
    this.opts.onEvent({ kind: "released" });
  }

  private onRendezvousTimeout(): void {
    this.rendezvousTimer = undefined;
    if (this.phase !== "rendezvous") return;
    this.opts.onEvent({ kind: "rendezvous-timeout", missing: this.missingRanks(), timeoutMs: this.opts.rendezvousTimeoutMs });
  }

  // ---- sending --------------------------------------------------------------------------

  /**
   * Sends one message to one rank. zeromq.js allows one send in flight per socket, so sends
   * are chained; a failed send (rank gone, queue full past the timeout) is reported as a
   * warning and does not break the chain.
   */
  private send(rank: number, msg: CoordinatorToRank, quiet = false): Promise<void> {
    return this.sendTo(this.links[rank]!.identity, msg, quiet, rank);
  }

  /** {@link send} to a routing id (a rank's control socket, or its watchdog's). */
  private sendTo(identity: string, msg: CoordinatorToRank, quiet: boolean, rank?: number): Promise<void> {
    const frame = encodeControl(msg);
    const next = this.sendChain.then(async () => {
      if (this.phase === "closed") return;
      try {
        await this.router.send([identity, frame]);
      } catch (err) {
        // A rank that already exited cannot receive its abort/release; that is expected
        // during a teardown, so only other cases are worth a warning.
        if (!quiet && !this.tearingDown()) {
          this.opts.onEvent({ kind: "warning", message: `could not send ${msg.t} to ${rank === undefined ? printable(identity) : `rank ${rank}`}: ${errorMessage(err)}` });
        }
      }
    });
    this.sendChain = next;
    return next;
  }

  private tearingDown(): boolean {
    return this.phase === "aborted" || this.phase === "closed";
  }

  private clearRendezvousTimer(): void {
    if (this.rendezvousTimer !== undefined) clearTimeout(this.rendezvousTimer);
    this.rendezvousTimer = undefined;
  }

  private warn(message: string): void {
    const max = this.opts.warningsMax ?? WARNINGS_MAX;
    if (this.warnings < max) {
      this.warnings++;
      const tail = this.warnings === max ? " (further warnings about stray control traffic are suppressed)" : "";
      this.opts.onEvent({ kind: "warning", message: message + tail });
    } else {
      this.suppressedWarnings++;
    }
  }

  /** Count of stray-traffic warnings that were not reported. */
  get suppressedWarningCount(): number {
    return this.suppressedWarnings;
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
      const ok = Array.isArray(m.parts) && m.parts.every((x: unknown) => x !== null && typeof x === "object" && isPartRef((x as { ref?: unknown }).ref) && typeof (x as { where?: unknown }).where === "string");
      return ok ? undefined : "cpr-held needs a list of parts, each a part reference and where it is";
    }
    case "cpr-copy":
      if (!isRank(m.of) || !isCount(m.epoch)) return "cpr-copy needs of (a rank) and an epoch count";
      return m.part instanceof Uint8Array || typeof m.error === "string" ? undefined : "cpr-copy needs the part's bytes or an error";
    case "retry-caught-up":
      return isCount(m.attempt) && isCount(m.restored) && isCount(m.version) && isCount(m.seqno) && isCount(m.replayed) ? undefined : "retry-caught-up needs attempt, restored, version, seqno and replayed counts";
    default:
      return `unknown message type ${JSON.stringify((msg as { t: unknown }).t)}`;
  }
}

function isPartRef(v: unknown): boolean {
  if (v === null || typeof v !== "object") return false;
  const r = v as Record<string, unknown>;
  return [r.rank, r.epoch, r.checksum, r.bytes].every((n) => Number.isSafeInteger(n) && (n as number) >= 0);
}

/** A routing id for a log line: zeromq generates binary ids for peers that set none. */
function printable(identity: string): string {
  return /^[\x20-\x7e]{1,64}$/.test(identity) ? JSON.stringify(identity) : `a peer with binary id ${Buffer.from(identity, "latin1").toString("hex").slice(0, 32)}`;
}
