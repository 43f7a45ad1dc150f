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
 * With keys (src/mpi/keys.ts, docs/security.md) on tcp, the Router is a CURVE server with the
 * job's coordinator key pair and accepts the job's member key only (ZAP: a refused peer is
 * named by its address in the warning); each rank incarnation's routing id carries its token.
 * It makes the job's channel keys (random, one per ordered pair of ranks) for the tables.
 *
 * The logic (rendezvous, tables, release, aborts, restarts, the lease) is the pure
 * {@link Membership} machine, which the simulator runs too; this class is its I/O: the
 * Router, the decoding of frames, the chain of sends and the rendezvous timer.
 *
 * @example
 * const coord = new Coordinator({ size: 2, keys, transport: "ipc", runDir, rendezvousTimeoutMs: 30_000, onEvent });
 * const endpoint = await coord.start(); // pass to ranks as LIFELINE_COORDINATOR
 * // ... onEvent({ kind: "ready" }) once both said hello; coord.abort("LAUNCH_RANK_FAILED", "rank 1 died")
 * await coord.close();
 */
import assert from "node:assert/strict";
import { randomFillSync } from "node:crypto";
import { join } from "node:path";
import { Router } from "zeromq";
import { LifelineError, errorMessage } from "../errors.ts";
import { DEFAULT_TCP_HOST } from "../mpi/bind.ts";
import { controlIdentity, decodeControl, encodeControl, heartbeatIdentity, type CoordinatorToRank, type RankToCoordinator } from "../mpi/control.ts";
import { DEFAULT_MAX_MESSAGE_BYTES } from "../mpi/env.ts";
import { tokenOf, type CoordinatorKeys } from "../mpi/keys.ts";
import { curveServer, refusalWarnings, registerZap, watchHandshakes, type ZapDomain } from "../mpi/zmq/zap.ts";
import { FRAME_SLACK_BYTES } from "../mpi/zmq/zmq-transport.ts";
import {
  type CoordinatorEvent,
  Membership,
  type MembershipEffect,
  type MembershipInput,
  type MembershipOptions,
  printable,
  type RankLink,
  type TableMessage,
} from "./membership.ts";
import { ElasticMembership, type ElasticMembershipOptions } from "./elastic-membership.ts";

export type { CoordinatorEvent, RankLink } from "./membership.ts";

/** Construction options of a {@link Coordinator}. */
export interface CoordinatorOptions {
  size: number;
  /**
   * The job's keys: CURVE (used on tcp) and the token secret of the ranks' routing ids.
   * Absent: neither (`lifeline coordinator --insecure`).
   */
  keys?: CoordinatorKeys | undefined;
  /** The longest message a rank may send here (a finalize result, a part copy); default 1 GiB. */
  maxMessageBytes?: number | undefined;
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
  tableFor?: (rank: number) => Partial<TableMessage>;
  /** A job across hosts: each rank's host index at the job's start (`table.hosts`). */
  hosts?: readonly number[] | undefined;
  /**
   * Every rank said hello (a start of all ranks): work to finish before the tables go out
   * (cpr with per-host stores: find and fetch the parts of the recovery line). Meanwhile the
   * ranks' messages flow as usual; a rejection is reported as `tables-failed`.
   */
  beforeTables?: () => Promise<void>;
  /** An elastic job: its slots, worlds and limits (elastic-membership.ts runs it instead of Membership). */
  elastic?: Pick<ElasticMembershipOptions, "slots" | "initial" | "minNp" | "maxNp" | "waitMs" | "plan"> | undefined;
}

/** Unix socket paths are limited to 107 bytes (sun_path) on Linux. */
const IPC_PATH_MAX = 107;

/**
 * The membership machine (src/launch/membership.ts) behind a zeromq Router: frames in,
 * decoded and fed to the machine; its sends go out on the Router, its events to the owner, its
 * rendezvous deadline is a timer.
 */
export class Coordinator {
  private readonly router: Router;
  private readonly machine: Membership;
  private rendezvousTimer: NodeJS.Timeout | undefined;
  /** The deadline the timer is armed for. */
  private timerDueMs: number | undefined;
  private sendChain: Promise<void> = Promise.resolve();
  private readLoop: Promise<void> | undefined;
  private endpointValue: string | undefined;
  private zap: ZapDomain | undefined;
  /** Connections refused by CURVE or ZAP, reported a few times per kind (a stranger retries every 100 ms). */
  private readonly refusal = refusalWarnings((message) => this.opts.onEvent({ kind: "warning", message }));

  constructor(private readonly opts: CoordinatorOptions) {
    const channelKeys = new Uint32Array(opts.size * opts.size);
    randomFillSync(channelKeys);
    const tokens = opts.keys?.tokens;
    const tokenCache = new Map<string, string>();
    const token = (rank: number, attempt: number): string | undefined => {
      if (tokens === undefined) return undefined;
      const at = `${rank}.${attempt}`;
      let t = tokenCache.get(at);
      if (t === undefined) tokenCache.set(at, (t = tokenOf(tokens, rank, attempt)));
      return t;
    };
    const machine: MembershipOptions = {
      size: opts.size,
      channelKeys,
      mode: opts.mode,
      hosts: opts.hosts,
      identity: (rank, attempt) => controlIdentity(rank, attempt, token(rank, attempt)),
      heartbeatIdentity: (rank, attempt) => heartbeatIdentity(rank, attempt, token(rank, attempt)),
      rendezvousTimeoutMs: opts.rendezvousTimeoutMs,
      warningsMax: opts.warningsMax,
      tableFor: opts.tableFor,
      prepareTables: opts.beforeTables !== undefined,
    };
    // An elastic job's world changes while it runs: its own machine, with the same inputs and effects.
    this.machine = opts.elastic === undefined ? new Membership(machine) : new ElasticMembership({ ...machine, ...opts.elastic });
    // mandatory: a send to a rank that is gone fails (and is reported) instead of vanishing;
    // sendTimeout bounds a send to a rank whose queue is full, so one stuck rank cannot
    // block the release or abort of the others (sends are serialized).
    this.router = new Router({
      linger: 0,
      mandatory: true,
      sendTimeout: opts.sendTimeoutMs ?? 2_000,
      maxMessageSize: (opts.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES) + FRAME_SLACK_BYTES,
    });
  }

  /** The endpoint ranks connect to (`LIFELINE_COORDINATOR`); set by {@link start}. */
  get endpoint(): string {
    assert(this.endpointValue !== undefined, "coordinator not started");
    return this.endpointValue;
  }

  /** Read-only view of each rank's link. */
  rank(rank: number): Readonly<RankLink> {
    return this.machine.link(rank);
  }

  /** Ranks that have not said hello yet. */
  missingRanks(): number[] {
    return this.machine.missingRanks();
  }

  /**
   * Binds the Router and starts the rendezvous clock. Resolves to the endpoint to hand to ranks.
   * Rejects with `LAUNCH_SPAWN` if the endpoint cannot be bound.
   */
  async start(): Promise<string> {
    assert.equal(this.machine.phase, "new", "coordinator started twice");
    let address: string;
    if (this.opts.transport === "ipc") {
      const path = join(this.opts.runDir, "coordinator");
      if (Buffer.byteLength(path) > IPC_PATH_MAX) {
        throw new LifelineError(
          "LAUNCH_SPAWN",
          `ipc path ${path} is longer than ${IPC_PATH_MAX} bytes; set TMPDIR to a shorter directory or use --transport tcp`,
        );
      }
      address = `ipc://${path}`;
    } else {
      // Port 0: the OS picks a free port, so concurrent jobs (and tests) never collide.
      address = `tcp://${this.opts.host ?? DEFAULT_TCP_HOST}:${this.opts.port ?? 0}`;
      const curve = this.opts.keys?.curve;
      if (curve !== undefined) {
        // The handler is up before anything can connect; `stray` warnings are rate-limited.
        this.zap = await registerZap({
          allowed: [curve.member],
          refused: (peer, why) => this.refusal(why, `refused a connection from ${peer} on the control socket: ${why}`),
        });
        Object.assign(this.router, curveServer(curve.server, this.zap.domain));
        watchHandshakes(this.router, (why) => this.refusal(why, `refused ${why} on the control socket (a peer without this job's keys)`));
      }
    }
    try {
      await this.router.bind(address);
    } catch (err) {
      this.zap?.close();
      throw new LifelineError("LAUNCH_SPAWN", `coordinator cannot bind ${address}: ${errorMessage(err)}`, { cause: err });
    }
    this.endpointValue = this.router.lastEndpoint ?? address;
    void this.run({ kind: "start", nowMs: performance.now() });
    this.readLoop = this.receive();
    return this.endpointValue;
  }

  /**
   * Tells every rank that said hello to stop (`abort`), e.g. because another rank failed.
   * Later messages from ranks are still read (and ignored) so none blocks on a full queue.
   */
  async abort(code: string, message: string): Promise<void> {
    await Promise.all(this.run({ kind: "abort", code, message }));
  }

  /**
   * cpr: every rank is being restarted: from now on no message of the current incarnations
   * counts (no finalize, no release), until {@link restartRound}.
   */
  endRound(): void {
    void this.run({ kind: "round-over" });
  }

  /**
   * Starts a new rendezvous for a restart of every rank (cpr): the ranks come back with
   * attempt + 1 and say hello again; once all have, each is sent the table again. Messages
   * from the old attempts' identities are ignored from now on.
   */
  restartRound(attempts: readonly number[]): void {
    void this.run({ kind: "restart-round", attempts, nowMs: performance.now() });
  }

  /**
   * retry-one: `rank` (incarnation `attempt`) died. The others are told at once (`peer-down`)
   * and it counts as down until a restarted incarnation says hello.
   */
  rankDown(rank: number, attempt: number): void {
    void this.run({ kind: "rank-down", rank, attempt, nowMs: performance.now() });
  }

  /**
   * retry-one: `rank` is started again as incarnation `attempt` while the others keep running.
   * Its hello gets it the table (with the ranks down right now); the others get `peer` with
   * its new endpoint. Nobody else re-handshakes.
   */
  restartRank(rank: number, attempt: number): void {
    void this.run({ kind: "restart-rank", rank, attempt });
  }

  /** Sends one message to rank `rank`'s current incarnation (if it said hello). */
  sendToRank(rank: number, msg: CoordinatorToRank): void {
    void this.run({ kind: "send", rank, msg });
  }

  /** Sends `msg` to every rank that said hello in the current round. */
  broadcast(msg: CoordinatorToRank): void {
    void this.run({ kind: "broadcast", msg });
  }

  /** Closes the Router. Safe to call more than once. */
  async close(): Promise<void> {
    if (this.machine.phase === "closed") return;
    void this.run({ kind: "close" });
    // Pending sends are abandoned: close() with linger 0 drops them, which is what we want
    // when the job is over (ranks that still wait are killed by the supervisor).
    this.router.close();
    this.zap?.close();
    await this.readLoop?.catch(() => undefined);
  }

  /** Count of stray-traffic warnings that were not reported. */
  get suppressedWarningCount(): number {
    return this.machine.suppressedWarningCount;
  }

  // ---- the machine's effects ------------------------------------------------------------

  /**
   * Feeds one input and carries out its effects in order; returns the sends it began (they
   * never reject: a failed send is a warning). An
   * event handler may call back in (e.g. abort on a rank's abort): that input's effects are
   * carried out at once, as a direct call would.
   */
  private run(input: MembershipInput): Promise<void>[] {
    const sends: Promise<void>[] = [];
    try {
      for (const eff of this.machine.step(input)) {
        const sent = this.perform(eff);
        if (sent !== undefined) sends.push(sent);
      }
    } finally {
      // Also when an event handler threw: the timer follows the machine's state regardless.
      this.armRendezvousTimer();
    }
    return sends;
  }

  private perform(eff: MembershipEffect): Promise<void> | undefined {
    switch (eff.kind) {
      case "send":
        return this.sendTo(eff.to, eff.msg, eff.quiet, eff.rank);
      case "event":
        this.opts.onEvent(eff.event);
        return undefined;
      case "prepare-tables":
        this.opts.beforeTables!().then(
          () => {
            void this.run({ kind: "tables-prepared", round: eff.round });
          },
          (err: unknown) => {
            const code = err instanceof LifelineError ? err.code : "LAUNCH_SPAWN";
            void this.run({ kind: "tables-failed", round: eff.round, code, message: errorMessage(err) });
          },
        );
        return undefined;
      default: {
        const never: never = eff;
        return never;
      }
    }
  }

  /** Keeps one timer armed for the machine's rendezvous deadline (if any). */
  private armRendezvousTimer(): void {
    const due = this.machine.rendezvousDeadlineMs;
    if (due === this.timerDueMs) return;
    if (this.rendezvousTimer !== undefined) clearTimeout(this.rendezvousTimer);
    this.rendezvousTimer = undefined;
    this.timerDueMs = due;
    if (due === undefined) return;
    this.rendezvousTimer = setTimeout(
      () => {
        // A timer that fired a little early is armed again by run() for the rest.
        this.rendezvousTimer = undefined;
        this.timerDueMs = undefined;
        void this.run({ kind: "tick", nowMs: performance.now() });
      },
      Math.max(0, due - performance.now()),
    );
  }

  // ---- receiving ------------------------------------------------------------------------

  private async receive(): Promise<void> {
    try {
      for await (const frames of this.router) {
        if (this.machine.phase === "closed") break;
        try {
          this.onFrames(frames);
        } catch (err) {
          // An event handler threw: that is a launcher bug, not rank input. Surface it
          // without killing the read loop, so the job can still be stopped cleanly.
          this.opts.onEvent({ kind: "warning", message: `internal error while handling a control message: ${errorMessage(err)}` });
        }
      }
    } catch (err) {
      if (this.machine.phase !== "closed") this.opts.onEvent({ kind: "warning", message: `coordinator stopped reading: ${errorMessage(err)}` });
    }
  }

  private onFrames(frames: Buffer[]): void {
    const [idFrame, ...body] = frames;
    const identity = idFrame?.toString("latin1") ?? "";
    // A Dealer sends one frame; tolerate a leading empty delimiter (REQ-style peers).
    const payload = body.length === 2 && body[0]!.length === 0 ? body[1] : body.length === 1 ? body[0] : undefined;
    if (payload === undefined) {
      void this.run({
        kind: "stray",
        message: `ignored a ${body.length}-frame message from ${printable(identity)} on the control channel (not a lifeline rank?)`,
      });
      return;
    }
    let msg: RankToCoordinator;
    try {
      msg = decodeControl(payload) as RankToCoordinator;
    } catch (err) {
      void this.run({ kind: "stray", message: `ignored garbage from ${printable(identity)} on the control channel: ${errorMessage(err)}` });
      return;
    }
    void this.run({ kind: "message", identity, msg });
  }

  // ---- sending --------------------------------------------------------------------------

  /**
   * Sends one message to a routing id (a rank's control socket, or its watchdog's). zeromq.js
   * allows one send in flight per socket, so sends are chained; a failed send (rank gone, queue
   * full past the timeout) is reported as a warning and does not break the chain.
   */
  private sendTo(identity: string, msg: CoordinatorToRank, quiet: boolean, rank: number | undefined): Promise<void> {
    const frame = encodeControl(msg);
    const max = this.opts.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
    if (frame.length > max) {
      // The rank's socket would drop the link rather than take it.
      this.opts.onEvent({
        kind: "warning",
        message: `could not send ${msg.t} to ${rank === undefined ? printable(identity) : `rank ${rank}`}: ${frame.length} bytes, longer than the job's limit of ${max} bytes (--max-message; a recovery-line part travels in one message)`,
      });
      return Promise.resolve();
    }
    const next = this.sendChain.then(async () => {
      if (this.machine.phase === "closed") return;
      try {
        await this.router.send([identity, frame]);
      } catch (err) {
        // A rank that already exited cannot receive its abort/release; that is expected
        // during a teardown, so only other cases are worth a warning.
        if (!quiet && !this.tearingDown()) {
          this.opts.onEvent({
            kind: "warning",
            message: `could not send ${msg.t} to ${rank === undefined ? printable(identity) : `rank ${rank}`}: ${errorMessage(err)}`,
          });
        }
      }
    });
    this.sendChain = next;
    return next;
  }

  private tearingDown(): boolean {
    return this.machine.phase === "aborted" || this.machine.phase === "closed";
  }
}
