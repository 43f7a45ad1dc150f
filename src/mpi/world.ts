/**
 * The communicator: MPI-style point-to-point and collectives, in three layers.
 *
 * - The channel (channel.ts) stamps, sends and receives every frame: headers, per-channel
 *   sequence numbers, bounce buffers and receipts, sends to self, validation of what arrives.
 * - The collective runner (coll-runner.ts) orders collective calls, runs their algorithms
 *   (collectives.ts) and catches ranks that call different ones.
 * - The mode (modes/): mode none is plain MPI; cpr and retry-one adapters bind a recovery
 *   protocol's driver at the points where it must see or steer the message path.
 *
 * This facade does what is the same in every mode: argument checks, matching application
 * messages to receives (matching.ts), requests, the rules of checkpoint locations, the
 * coordinator's control messages, finalize and failure.
 *
 * @example
 * const world = await init();
 * if (world.rank === 0) await world.send(new Float64Array([1, 2]), 1, 7);
 * else console.log((await world.recv(0, 7)).data);
 */
import { isLifelineError, LifelineError } from "../errors.ts";
import { Channel } from "./channel.ts";
import { type CollKind, CollectiveRunner, PROTO_COLL_ANSWER, PROTO_COLL_QUERY } from "./coll-runner.ts";
import type { ActiveCollective } from "./coll-registry.ts";
import * as coll from "./collectives.ts";
import { byteLengthOf, decodeBody, encodeValue, isTypedArray } from "./codec.ts";
import type { CoordinatorToRank } from "./control.ts";
import type { CprHookFactory } from "./cpr-hook.ts";
import { PROTO_CPR_BASE } from "./cpr-hook.ts";
import type { ElasticHookFactory } from "./elastic-hook.ts";
import type { Mode, RankPlace } from "./env.ts";
import { FaultPlan, parseFaults } from "./faults.ts";
import { type ControlChannel, type Host, type Timer, zmqHost } from "./host.ts";
import { loadRankKeys, type RankKeys } from "./keys.ts";
import { Matcher, type Waiter } from "./matching.ts";
import { CprMode } from "./modes/cpr.ts";
import { ElasticMode } from "./modes/elastic.ts";
import { type AppEnvelope, type CollectiveCall, type ModeCore, NoneMode, type PolledRecv } from "./modes/none.ts";
import { RetryOneMode } from "./modes/retry-one.ts";
import { checkOp, isBuiltinOp } from "./reduce-ops.ts";
import { asImpl, RequestImpl, waitAll, waitAny } from "./request.ts";
import type { RetryOneHookFactory } from "./retry-hook.ts";
import {
  ANY_SOURCE,
  ANY_TAG,
  type CollectiveOptions,
  type Message,
  type ReduceOp,
  type Request,
  type Restored,
  type Status,
  TAG_MAX,
  type WorldApi,
} from "./types.ts";
import { type Header, Kind } from "./wire.ts";

/** Options of {@link World.join} beyond the rank's place. */
export interface JoinOptions {
  /** The recovery protocol's hook (mode cpr); see cpr-hook.ts. */
  readonly cpr?: CprHookFactory;
  /** The retry-one driver (mode retry-one); see retry-hook.ts. */
  readonly retryOne?: RetryOneHookFactory;
  /** The elastic driver (mode elastic); see elastic-hook.ts. */
  readonly elastic?: ElasticHookFactory;
  /** The rank's keys (keys.ts), if read already; otherwise they are read from `place.keys`. */
  readonly keys?: RankKeys;
}

/** Time allowed for rendezvous (every rank says hello, the table arrives). */
const RENDEZVOUS_TIMEOUT_MS = 120_000;
/** At most one progress report per this interval. */
const STEP_REPORT_MS = 200;
/** How long a fatal error waits for the coordinator to confirm the rank's abort (a dead one never does). */
const ABORT_HEARD_WAIT_MS = 1000;

/** Shape of data for collective signatures: type and length must agree across ranks. */
function shapeOf(data: unknown): string {
  if (isTypedArray(data)) return `${(data as object).constructor.name}[${(data as ArrayLike<unknown>).length}]`;
  if (Array.isArray(data)) return `array[${data.length}]`;
  return data === null ? "null" : typeof data;
}

function callSite(): string {
  // Frames: callSite ← collective method ← user code. The user's frame identifies the call.
  const lines = (new Error().stack ?? "")
    .split("\n")
    .slice(1)
    .map((l) => l.trim());
  const user = lines.find((l) => !l.includes("/src/mpi/") && !l.includes("/dist/mpi/") && !l.includes("node:internal"));
  return user ?? lines.join("|");
}

export class World implements WorldApi {
  readonly mode: Mode;
  readonly attempt: number;

  private readonly matcher: Matcher<AppEnvelope>;
  private finalized = false;
  private failure: LifelineError | undefined;
  /**
   * After fatal(): the failures of the program's pending calls that wait for the coordinator
   * to confirm the abort (`abort-heard`), or for {@link ABORT_HEARD_WAIT_MS}. A program that
   * dies of the error exits at once, and the launcher must not see that exit (a plain crash,
   * which a restart policy may answer with a restart) before the abort that explains it.
   */
  private abortWaiters: (() => void)[] | undefined;
  private abortWait: Timer | undefined;
  /** The bound on unmatched messages was passed: the job is stopping (see checkBacklog). */
  private overBacklog = false;
  private readonly faults: FaultPlan;
  private steps = 0;
  private lastStepReport = 0;
  private versions = 0;
  private collSinceCheckpoint = 0;
  private restoreCalled = false;
  private readonly bootstrapKeys = new Set<string>();
  private outstandingRecvs = 0;
  /** Calls of the program's so far (every entry point counts one), for the idle watch. */
  private calls = 0;
  /** Collectives, restores, checkpoints and finalizes of the program's not returned yet. */
  private inFlight = 0;
  private readonly settled = (): void => {
    this.inFlight--;
  };
  private released: { resolve: () => void; reject: (e: unknown) => void } | undefined;
  private host!: Host;
  private control!: ControlChannel;
  private channel!: Channel;
  private runner!: CollectiveRunner;
  /** The mode's adapter (mode none until connect picks the mode's). */
  private modeImpl!: NoneMode;
  /** Requests that the layer must fail on abort (posted receives and probes). */
  private readonly pending = new Set<RequestImpl<unknown>>();
  private readonly closeHooks: (() => void)[] = [];

  /**
   * This rank and the job's size. The layers below address processes by `place.rank` and
   * `place.size`; in mode elastic those are the process's slot and the slots (`--max-np`), and
   * the rank and size of the world it runs in change at a change of the world (ModeCore.reshape).
   */
  private shape: { rank: number; size: number };

  private constructor(private readonly place: RankPlace) {
    this.shape = { rank: place.rank, size: place.size };
    this.mode = place.mode;
    this.attempt = place.attempt;
    this.matcher = new Matcher(place.size);
    this.faults = new FaultPlan(parseFaults(place.faults), place.attempt);
  }

  get rank(): number {
    return this.shape.rank;
  }

  get size(): number {
    return this.shape.size;
  }

  /**
   * Joins the job: binds the data socket, says hello to the coordinator, waits for the table of
   * endpoints and connects to every peer. Rejects with `MPI_INIT` if that cannot happen.
   */
  static async join(place: RankPlace, opts: JoinOptions = {}): Promise<World> {
    const world = new World(place);
    let keys = opts.keys;
    if (keys === undefined) {
      const loaded = loadRankKeys(place);
      if (loaded.warning !== undefined) process.stderr.write(`lifeline: rank ${place.rank}: ${loaded.warning}\n`);
      keys = loaded.keys;
    }
    await world.connect(
      await zmqHost(
        place,
        (msg) => world.onControl(msg),
        keys,
        (err) => world.failJoin(err),
      ),
      opts,
    );
    return world;
  }

  /**
   * Joins with a given host (the simulator's). `makeHost` receives the control-message handler
   * the host must call for every message from the coordinator.
   */
  static async joinWith(
    place: RankPlace,
    makeHost: (onControl: (msg: CoordinatorToRank) => void) => Host | Promise<Host>,
    opts: JoinOptions = {},
  ): Promise<World> {
    const world = new World(place);
    await world.connect(await makeHost((msg) => world.onControl(msg)), opts);
    return world;
  }

  private gotTable: (t: Extract<CoordinatorToRank, { t: "table" }>) => void = () => undefined;
  private failJoin: (e: unknown) => void = () => undefined;

  /** A message from the coordinator. */
  private onControl(msg: CoordinatorToRank): void {
    switch (msg.t) {
      case "table":
        this.gotTable(msg);
        break;
      case "peer":
        if (msg.rank !== this.place.rank) this.host.transport.connect(msg.rank, msg.endpoint, msg.curveKey);
        this.channel.peerRestarted(msg.rank, msg.attempt);
        this.modeImpl.onControl(msg);
        break;
      case "release":
        this.released?.resolve();
        this.modeImpl.onControl(msg);
        break;
      case "abort-heard":
        this.abortHeard();
        break;
      case "abort": {
        const err = new LifelineError("MPI_ABORTED", `the job was aborted: ${msg.message}`);
        this.failJoin(err);
        this.abortLocal(err);
        break;
      }
      case "cpr-committed":
        this.faults.onCommitted(msg.epoch);
        this.modeImpl.onControl(msg);
        break;
      default:
        this.modeImpl.onControl(msg);
        break;
    }
  }

  /** The layers below the facade, and the mode's adapter. */
  private build(host: Host, opts: JoinOptions): void {
    this.host = host;
    this.control = host.control;
    this.channel = new Channel({
      rank: this.place.rank,
      size: this.place.size,
      attempt: this.attempt,
      host,
      maxMessageBytes: this.place.maxMessageBytes,
      ...(this.place.bulkBytesMin === undefined ? {} : { bulkBytesMin: this.place.bulkBytesMin }),
      deliver: (header, body, rawHeader, classify) => this.arrive(header, body, rawHeader, classify),
    });
    // The runner asks the mode for its query scope and liveness on every use; the adapter is
    // set right below, before anything runs.
    const modeOf = (): NoneMode => this.modeImpl;
    this.runner = new CollectiveRunner({
      rank: this.place.rank,
      size: this.place.size,
      host,
      channel: this.channel,
      failure: () => this.failure,
      fatal: (err, c) => this.fatal(err, c),
      scope: {
        get viewId() {
          return modeOf().viewId;
        },
        get queriesPaused() {
          return modeOf().queriesPaused;
        },
      },
    });
    const core = this.modeCore();
    if (this.mode === "cpr" && opts.cpr !== undefined) this.modeImpl = new CprMode(core, opts.cpr);
    else if (this.mode === "retry-one") {
      if (opts.retryOne === undefined)
        throw new LifelineError("MPI_INIT", "mode retry-one needs its protocol driver (World.join's retryOne option); use init()");
      this.modeImpl = new RetryOneMode(core, opts.retryOne, { logBytesMax: this.place.retryLogBytes });
    } else if (this.mode === "elastic") {
      if (opts.elastic === undefined) throw new LifelineError("MPI_INIT", "mode elastic needs its protocol driver (World.join's elastic option); use init()");
      this.modeImpl = new ElasticMode(core, opts.elastic);
    } else this.modeImpl = new NoneMode(core);
    this.channel.stamper = this.modeImpl;
  }

  /** What the mode's adapter may use of this communicator. */
  private modeCore(): ModeCore {
    // eslint-disable-next-line @typescript-eslint/no-this-alias -- the literal's accessors need the World
    const self = this;
    return {
      rank: this.place.rank,
      size: this.place.size,
      attempt: this.attempt,
      mode: this.mode,
      host: this.host,
      channel: this.channel,
      runner: this.runner,
      matcher: this.matcher,
      get versions() {
        return self.versions;
      },
      set versions(v: number) {
        self.versions = v;
      },
      failure: () => this.failure,
      sendControl: (msg) =>
        void this.control.send(msg).catch((err: unknown) => {
          if (err instanceof LifelineError && err.code === "MPI_LIMIT") this.host.warn(`lifeline: rank ${this.rank}: ${err.message}`);
        }),
      fatal: (err) => this.fatal(err),
      failPending: (err) => this.afterAbort(() => this.failPending(err)),
      afterAbort: (fn) => this.afterAbort(fn),
      recvCompletedFromLog: () => {
        this.outstandingRecvs--;
      },
      resetCollectiveCount: () => {
        this.collSinceCheckpoint = 0;
      },
      reportStep: (force) => this.reportStep(force),
      reshape: (rank, size) => {
        this.shape = { rank, size };
      },
      interruptFinalize: (err) => this.released?.reject(err),
    };
  }

  private async connect(host: Host, opts: JoinOptions): Promise<void> {
    const { rank, attempt } = this.place;
    this.build(host, opts);
    const transport = host.transport;
    const table = new Promise<Extract<CoordinatorToRank, { t: "table" }>>((resolve, reject) => {
      this.gotTable = resolve;
      this.failJoin = reject;
    });
    const timer = host.after(RENDEZVOUS_TIMEOUT_MS, () =>
      this.failJoin(
        new LifelineError("MPI_INIT", `no endpoint table from the coordinator at ${this.place.coordinator} within ${RENDEZVOUS_TIMEOUT_MS / 1000} s`),
      ),
    );
    let t: Extract<CoordinatorToRank, { t: "table" }>;
    try {
      await this.control.send({
        t: "hello",
        rank,
        attempt,
        pid: host.pid,
        endpoint: transport.endpoint,
        size: this.place.size,
        ...(transport.curveKey === undefined ? {} : { curveKey: transport.curveKey }),
      });
      t = await table;
    } catch (err) {
      await this.closeSockets();
      throw err;
    } finally {
      timer.stop();
    }
    if (t.endpoints.length !== this.place.size) {
      await this.closeSockets();
      throw new LifelineError("MPI_INIT", `the coordinator's table has ${t.endpoints.length} ranks, but this rank was started for ${this.place.size}`);
    }
    if (t.mode !== undefined && t.mode !== this.mode) {
      await this.closeSockets();
      throw new LifelineError(
        "MPI_INIT",
        `the coordinator runs the job in mode ${t.mode}, but this rank was started for mode ${this.mode}: set LIFELINE_MODE=${t.mode}`,
      );
    }
    if (!Array.isArray(t.keysIn) || t.keysIn.length !== this.place.size || !Array.isArray(t.keysOut) || t.keysOut.length !== this.place.size) {
      await this.closeSockets();
      throw new LifelineError("MPI_INIT", "the coordinator's table carries no channel keys for this job's size (a coordinator of another Lifeline version?)");
    }
    this.channel.join(t);
    // retry-one: a rank that is down has no endpoint yet; a `peer` message brings it.
    t.endpoints.forEach((ep, r) => {
      if (r !== rank && ep !== "") transport.connect(r, ep, t.curveKeys?.[r] || undefined);
    });
    try {
      await this.modeImpl.beforeStart(t);
    } catch (err) {
      await this.closeSockets();
      throw err;
    }
    transport.start(
      (frames) => this.channel.onFrames(frames),
      (err) => this.abortLocal(new LifelineError("MPI_ABORTED", `receive loop failed: ${(err as Error).message}`, { cause: err })),
    );
    this.runner.start();
    try {
      await this.modeImpl.afterStart();
    } catch (err) {
      this.failPending(err as LifelineError);
      await this.closeSockets();
      throw err;
    }
  }

  // ---- receive path ------------------------------------------------------------------------

  /**
   * A validated frame (from the network, a send to self, or re-injected on recovery).
   * `classify`: show it to the mode first (frames from peers, first arrival).
   */
  private arrive(header: Header, body: Buffer[], rawHeader: Buffer, classify: boolean): void {
    // Past the bound on unmatched messages the job is stopping: nothing more is kept meanwhile.
    if (this.overBacklog && header.kind !== Kind.protocol) return;
    // An application message that does not decode is dropped before the mode sees it (cpr
    // would log it, and deliver it again after a restore).
    let data: unknown;
    if (header.kind === Kind.app) {
      try {
        data = decodeBody(header.encoding, header.arrayType, body);
      } catch (err) {
        this.channel.warnGarbage(err, header.source);
        return;
      }
    }
    if (classify && header.kind !== Kind.protocol && header.source !== this.place.rank) {
      if (!this.modeImpl.classify(header, rawHeader, body)) return;
      this.host.accepted?.(header);
    }
    switch (header.kind) {
      case Kind.app: {
        const env = { source: header.source, tag: header.tag, data, raw: this.modeImpl.keepsFrames ? { header: rawHeader, body } : undefined };
        if (!this.matcher.arrive(env, unmatchedCost(body))) this.checkBacklog();
        return;
      }
      case Kind.collective:
        this.runner.arrive(header, body);
        this.checkBacklog();
        return;
      case Kind.protocol:
        this.onProtocol(header, body);
        return;
    }
  }

  /**
   * The bound on unmatched messages (`--max-unexpected`): application messages no receive has
   * taken yet, and collective messages of collectives not reached yet. Past it the job stops
   * (MPI_LIMIT) naming the rank that sent the most, rather than this rank's memory growing
   * without end.
   */
  private checkBacklog(): void {
    const bytes = this.matcher.unexpectedBytes + this.runner.colls.filedBytes;
    if (bytes <= this.place.maxUnexpectedBytes || this.failure !== undefined || this.overBacklog) return;
    this.overBacklog = true;
    const from = this.matcher.largestSource();
    this.fatal(
      new LifelineError(
        "MPI_LIMIT",
        `rank ${this.rank} holds ${bytes} bytes of messages no receive has taken (${this.matcher.unexpectedCount} application messages${from < 0 ? "" : `, most from rank ${from}`}), more than the job's bound of ${this.place.maxUnexpectedBytes} bytes (--max-unexpected): post receives for them, or raise the bound`,
      ),
    );
    // As for every fatal error: the program's calls fail once the coordinator has the abort, or
    // a program that dies of the error could exit first, and the launcher would report a crash.
    this.afterAbort(() => this.abortLocal(new LifelineError("MPI_LIMIT", "too many unmatched messages (see the error above)")));
  }

  private onProtocol(header: Header, body: Buffer[]): void {
    let decoded: unknown;
    try {
      decoded = decodeBody(header.encoding, header.arrayType, body);
    } catch (err) {
      this.channel.warnGarbage(err, header.source);
      return;
    }
    // Tags from PROTO_CPR_BASE up belong to the recovery protocol in use.
    if (header.tag >= PROTO_CPR_BASE && this.modeImpl.onProtocol(header, decoded)) return;
    const msg = decoded as { seq?: unknown; signature?: unknown; call?: unknown; view?: unknown } | null;
    if (typeof msg !== "object" || msg === null || typeof msg.seq !== "number") {
      this.channel.warnGarbage(new Error("protocol body has no sequence number"), header.source);
      return;
    }
    switch (header.tag) {
      case PROTO_COLL_QUERY:
        this.runner.onQuery(header.source, msg.seq, msg.view);
        return;
      case PROTO_COLL_ANSWER:
        this.runner.onAnswer(header.source, msg.seq, msg.signature, msg.call, msg.view);
        return;
      default:
        // Reserved for the recovery protocols' peer traffic.
        this.channel.warnGarbage(new Error(`unexpected protocol frame (tag ${header.tag}) in mode ${this.mode}`), header.source);
    }
  }

  // ---- checks ------------------------------------------------------------------------------

  private live(what: string): void {
    this.calls++;
    if (this.failure !== undefined) throw this.failure;
    if (this.finalized) throw new LifelineError("MPI_FINALIZED", `${what}() called after finalize()`);
  }

  private checkRank(r: unknown, what: string, allowAny: boolean): number {
    if (allowAny && r === ANY_SOURCE) return ANY_SOURCE;
    if (typeof r !== "number" || !Number.isInteger(r) || r < 0 || r >= this.size) {
      throw new LifelineError("MPI_RANK", `${what}: rank ${String(r)} is outside 0..${this.size - 1}${allowAny ? " (or ANY_SOURCE)" : ""}`);
    }
    return r;
  }

  private checkTag(t: unknown, what: string, allowAny: boolean): number {
    if (allowAny && t === ANY_TAG) return ANY_TAG;
    if (typeof t !== "number" || !Number.isInteger(t) || t < 0 || t > TAG_MAX) {
      throw new LifelineError("MPI_TAG", `${what}: tag ${String(t)} must be an integer in 0..${TAG_MAX}${allowAny ? " (or ANY_TAG)" : ""}`);
    }
    return t;
  }

  // ---- point to point ----------------------------------------------------------------------

  send(data: unknown, dest: number, tag = 0): Promise<void> {
    // Not async: the returned promise is the transport's own, one hop fewer per message.
    try {
      this.live("send");
      this.modeImpl.pointToPoint("send");
      this.checkRank(dest, "send", false);
      this.checkTag(tag, "send", false);
      this.faults.onSend();
      return this.channel.sendApp(data, dest, tag);
    } catch (err) {
      return Promise.reject(err);
    }
  }

  isend(data: unknown, dest: number, tag = 0): Request<void> {
    const req = new RequestImpl<void>(this.modeImpl.sendPoller(), () => this.channel.urgeReceipt(dest));
    // Validation errors throw synchronously, like send's would reject: the call is wrong.
    this.live("isend");
    this.modeImpl.pointToPoint("isend");
    this.checkRank(dest, "isend", false);
    this.checkTag(tag, "isend", false);
    let sent: Promise<void>;
    try {
      this.faults.onSend();
      // As MPI_Isend: `data` stays unchanged until the request completes, so large payloads
      // go without a copy and the request completes on the destination's receipt (asked for
      // when the program waits: the request's urge).
      sent = this.channel.sendApp(data, dest, tag, true);
    } catch (err) {
      sent = Promise.reject(err);
    }
    sent.then(
      () => req.complete(),
      (e) => req.fail(e),
    );
    return req;
  }

  irecv<T = unknown>(source: number = ANY_SOURCE, tag: number = ANY_TAG): Request<Message<T>> {
    this.live("irecv");
    this.modeImpl.pointToPoint("irecv");
    let src = this.checkRank(source, "irecv", true);
    let tg = this.checkTag(tag, "irecv", true);
    // A wildcard receive's match depends on timing: a mode that records it logs it, and
    // replays it after a restore by receiving exactly the logged (source, tag).
    const ticket = src === ANY_SOURCE ? this.modeImpl.ticket("match") : undefined;
    if (ticket?.replay?.k === "match") {
      src = ticket.replay.source;
      tg = ticket.replay.tag;
    }
    const logMatch = (env: AppEnvelope): void => {
      if (ticket !== undefined && ticket.replay === undefined) this.modeImpl.logNondet(ticket.ordinal, { k: "match", source: env.source, tag: env.tag });
    };
    // The frame of the matched message, for a poll that logs it (cpr).
    let matched: AppEnvelope["raw"];
    const recv: PolledRecv = { waiter: undefined, raw: () => matched };
    const req = new RequestImpl<Message<T>>(this.modeImpl.recvPoller<T>(recv));
    const now = this.matcher.take(src, tg);
    if (now !== undefined) {
      logMatch(now);
      matched = now.raw;
      req.complete(publicMessage(now) as Message<T>);
      return req;
    }
    this.outstandingRecvs++;
    const waiter: Waiter<AppEnvelope> = {
      source: src,
      tag: tg,
      consume: true,
      onMatch: (env) => {
        this.pending.delete(req as RequestImpl<unknown>);
        if (req.settled) {
          // A ghost: a replayed poll already completed this receive from the log; this is
          // the re-sent copy of that message, swallowed.
          this.modeImpl.ghostSwallowed();
          return;
        }
        this.outstandingRecvs--;
        logMatch(env);
        matched = env.raw;
        req.complete(publicMessage(env) as Message<T>);
      },
    };
    recv.waiter = waiter;
    this.matcher.post(waiter);
    this.pending.add(req as RequestImpl<unknown>);
    return req;
  }

  recv<T = unknown>(source: number = ANY_SOURCE, tag: number = ANY_TAG): Promise<Message<T>> {
    try {
      return this.irecv<T>(source, tag).wait();
    } catch (err) {
      return Promise.reject(err);
    }
  }

  iprobe(source: number = ANY_SOURCE, tag: number = ANY_TAG): Status | undefined {
    this.live("iprobe");
    this.modeImpl.pointToPoint("iprobe");
    const src = this.checkRank(source, "iprobe", true);
    const tg = this.checkTag(tag, "iprobe", true);
    // Whether a message is there yet is timing: always an outcome to log and replay. On
    // replay the logged status is returned even if the message has not arrived yet; the
    // receive that follows waits for it.
    const ticket = this.modeImpl.ticket("iprobe");
    if (ticket?.replay?.k === "iprobe") return ticket.replay.found ? { source: ticket.replay.source, tag: ticket.replay.tag } : undefined;
    const env = this.matcher.peek(src, tg);
    if (ticket !== undefined) {
      this.modeImpl.logNondet(
        ticket.ordinal,
        env === undefined ? { k: "iprobe", source: -1, tag: -1, found: false } : { k: "iprobe", source: env.source, tag: env.tag, found: true },
      );
    }
    return env === undefined ? undefined : { source: env.source, tag: env.tag };
  }

  probe(source: number = ANY_SOURCE, tag: number = ANY_TAG): Promise<Status> {
    let src: number;
    let tg: number;
    try {
      this.live("probe");
      this.modeImpl.pointToPoint("probe");
      src = this.checkRank(source, "probe", true);
      tg = this.checkTag(tag, "probe", true);
    } catch (err) {
      return Promise.reject(err);
    }
    const ticket = src === ANY_SOURCE ? this.modeImpl.ticket("match") : undefined;
    if (ticket?.replay?.k === "match") {
      src = ticket.replay.source;
      tg = ticket.replay.tag;
    }
    const found = (env: AppEnvelope): Status => {
      if (ticket !== undefined && ticket.replay === undefined) this.modeImpl.logNondet(ticket.ordinal, { k: "match", source: env.source, tag: env.tag });
      return { source: env.source, tag: env.tag };
    };
    const now = this.matcher.peek(src, tg);
    if (now !== undefined) return Promise.resolve(found(now));
    const req = new RequestImpl<Status>();
    this.pending.add(req as RequestImpl<unknown>);
    this.matcher.post({
      source: src,
      tag: tg,
      consume: false,
      onMatch: (env) => req.complete(found(env)),
    });
    return req.wait().finally(() => this.pending.delete(req as RequestImpl<unknown>));
  }

  waitAll<T>(reqs: readonly Request<T>[]): Promise<T[]> {
    return waitAll(reqs);
  }

  waitAny<T>(reqs: readonly Request<T>[]): Promise<{ index: number; value: T }> {
    reqs.forEach(asImpl);
    const ticket = this.modeImpl.ticket("any");
    if (ticket?.replay?.k === "any") {
      const index = ticket.replay.index;
      const r = reqs[index];
      if (r === undefined)
        return Promise.reject(new LifelineError("CPR_REPLAY", `replay: waitAny was logged returning index ${index}, but it got ${reqs.length} requests`));
      return r.wait().then((value) => ({ index, value }));
    }
    const p = waitAny(reqs);
    if (ticket === undefined) return p;
    return p.then((r) => {
      this.modeImpl.logNondet(ticket.ordinal, { k: "any", index: r.index });
      return r;
    });
  }

  // ---- collectives -------------------------------------------------------------------------

  /**
   * Every collective call enters here, in program order: it counts for fault injection, then
   * the mode runs it. `op`, `root` and `data` identify it for a replay (retry-one).
   */
  private collective<R>(
    kind: CollKind,
    identity: readonly (string | number)[],
    algorithm: (io: coll.CollectiveIo) => Promise<R>,
    op?: string,
    root?: number,
    data?: unknown,
    bootstrapKey?: string,
  ): Promise<R> {
    try {
      this.live(kind);
    } catch (err) {
      return Promise.reject(err);
    }
    this.faults.onCollective(this.versions, this.collSinceCheckpoint++);
    const running = this.modeImpl.collective(kind, identity, algorithm, op, root, data, bootstrapKey);
    this.inFlight++;
    // Not `then(settled, settled)`: the program's promise must still reject unhandled if the
    // program drops it (a few microtasks per collective).
    return running.finally(this.settled);
  }

  /** The entry the mode's rewrites of reduce, gather, scatter and alltoall call. */
  private readonly call: CollectiveCall = (kind, identity, algorithm, op, root, data) => this.collective(kind, identity, algorithm, op, root, data);

  /**
   * A collective-level error that leaves peers inconsistent: fail the collective here and ask
   * the coordinator to stop the job (errors are fatal, as MPI's are by default), since peers
   * may be blocked in a collective that can no longer complete. The collective fails once the
   * coordinator has the abort (see {@link World.abortWaiters}).
   */
  private fatal(err: LifelineError, c?: ActiveCollective): void {
    this.host.warn(`lifeline: rank ${this.rank}: ${err.code}: ${err.message}`);
    if (this.abortWaiters === undefined) {
      this.abortWaiters = [];
      this.abortWait = this.host.after(ABORT_HEARD_WAIT_MS, () => this.abortHeard());
    }
    if (c !== undefined) this.abortWaiters.push(() => c.fail(err));
    void this.control.send({ t: "abort", rank: this.place.rank, code: err.code, message: err.message }).catch(() => this.abortHeard());
  }

  /** Runs `fn` once the coordinator has this rank's abort (see ModeCore.afterAbort). */
  private afterAbort(fn: () => void): void {
    if (this.abortWaiters === undefined) fn();
    else this.abortWaiters.push(fn);
  }

  private abortHeard(): void {
    const waiters = this.abortWaiters;
    if (waiters === undefined) return;
    this.abortWaiters = undefined;
    this.abortWait?.stop();
    this.abortWait = undefined;
    for (const fn of waiters) fn();
  }

  private bootstrapKey(opts: CollectiveOptions | undefined, kind: CollKind): string | undefined {
    if (opts === undefined || opts.bootstrap === undefined) return undefined;
    const b = opts.bootstrap;
    if (b !== true && typeof b !== "string") throw new TypeError(`opts.bootstrap must be true or a string, not ${JSON.stringify(b)}`);
    const key = b === true ? `${kind}@${callSite()}` : b;
    if (this.versions > 0 || this.steps > 0) {
      throw new LifelineError(
        "MPI_BOOTSTRAP",
        `bootstrap ${kind} ${JSON.stringify(key)} called after the first checkpoint(); bootstrap collectives must run before the main loop`,
      );
    }
    if (this.bootstrapKeys.has(key)) {
      throw new LifelineError("MPI_BOOTSTRAP", `bootstrap key ${JSON.stringify(key)} used twice in one run; give each bootstrap collective its own key`);
    }
    this.bootstrapKeys.add(key);
    return key;
  }

  barrier(): Promise<void> {
    return this.collective("barrier", [], (io) => coll.barrier(io));
  }

  bcast<T>(data: T, root = 0, opts?: CollectiveOptions): Promise<T> {
    let key: string | undefined;
    try {
      this.checkRank(root, "bcast root", false);
      key = this.bootstrapKey(opts, "bcast");
    } catch (err) {
      return Promise.reject(err);
    }
    return this.modeImpl.bootstrapped(key, () => this.collective("bcast", [`root=${root}`], (io) => coll.bcast(io, data, root), "bcast", root, undefined, key));
  }

  reduce<T>(data: T, op: ReduceOp = "sum", root = 0): Promise<T | undefined> {
    let checked: ReduceOp;
    try {
      checked = checkOp(op);
      this.checkRank(root, "reduce root", false);
    } catch (err) {
      return Promise.reject(err);
    }
    return this.modeImpl.reduce(this.call, data, checked, root, opLabel(checked), shapeOf(data));
  }

  allreduce<T>(data: T, op: ReduceOp = "sum", opts?: CollectiveOptions): Promise<T> {
    let checked: ReduceOp;
    let key: string | undefined;
    try {
      checked = checkOp(op);
      key = this.bootstrapKey(opts, "allreduce");
    } catch (err) {
      return Promise.reject(err);
    }
    const label = opLabel(checked);
    return this.modeImpl.bootstrapped(key, () =>
      this.collective("allreduce", [label, shapeOf(data)], (io) => coll.allreduce(io, data, checked), `allreduce:${label}`, -1, data, key),
    );
  }

  gather<T>(data: T, root = 0): Promise<T[] | undefined> {
    try {
      this.checkRank(root, "gather root", false);
    } catch (err) {
      return Promise.reject(err);
    }
    return this.modeImpl.gather(this.call, data, root);
  }

  scatter<T>(items: readonly T[] | undefined, root = 0): Promise<T> {
    try {
      this.checkRank(root, "scatter root", false);
      if (this.rank === root && (!Array.isArray(items) || items.length !== this.size)) {
        throw new LifelineError(
          "MPI_COLLECTIVE_MISMATCH",
          `scatter: the root must pass an array of exactly ${this.size} items (one per rank), got ${Array.isArray(items) ? `${items.length} items` : String(items)}`,
        );
      }
    } catch (err) {
      if (err instanceof LifelineError) this.fatal(err);
      return Promise.reject(err);
    }
    return this.modeImpl.scatter(this.call, items, root);
  }

  allgather<T>(data: T, opts?: CollectiveOptions): Promise<T[]> {
    let key: string | undefined;
    try {
      key = this.bootstrapKey(opts, "allgather");
    } catch (err) {
      return Promise.reject(err);
    }
    return this.modeImpl.bootstrapped(key, () => this.collective("allgather", [], (io) => coll.allgather(io, data), "allgather", -1, undefined, key));
  }

  alltoall<T>(items: readonly T[]): Promise<T[]> {
    if (!Array.isArray(items) || items.length !== this.size) {
      const err = new LifelineError(
        "MPI_COLLECTIVE_MISMATCH",
        `alltoall: every rank must pass an array of exactly ${this.size} items (one per destination), got ${Array.isArray(items) ? `${items.length} items` : String(items)}`,
      );
      this.fatal(err);
      return Promise.reject(err);
    }
    return this.modeImpl.alltoall(this.call, items);
  }

  // ---- checkpoint-restart surface (mode none: no-ops with the same rules) --------------------

  async restore<S, G = undefined>(): Promise<Restored<S, G> | undefined> {
    this.live("restore");
    // elastic: after MPI_WORLD_CHANGED the program calls it again, for the new world's checkpoint.
    const again = this.modeImpl.restoresAgain;
    if (this.restoreCalled && !again) throw new LifelineError("CPR_RESTORE", "restore() called twice; call it once, before the main loop");
    if (this.steps > 0 && !again) throw new LifelineError("CPR_RESTORE", "restore() called after checkpoint(); call it once, before the first checkpoint()");
    this.restoreCalled = true;
    this.inFlight++;
    let r;
    try {
      r = await this.modeImpl.restore();
    } finally {
      this.inFlight--;
    }
    return r === undefined ? undefined : { state: r.state as S, global: r.global as G, version: r.version };
  }

  async checkpoint<S, G = undefined>(state: S | (() => S), global?: G): Promise<void> {
    this.live("checkpoint");
    this.faults.onCheckpoint();
    if (this.outstandingRecvs > 0) {
      // The same program must run in every mode, and the recovery protocols cannot save a
      // half-done receive: enforce the rule everywhere so a port fails early, not at recovery.
      throw new LifelineError(
        "CPR_CHECKPOINT",
        `checkpoint() with ${this.outstandingRecvs} receive request(s) still outstanding; complete every irecv (wait/waitAll) before a checkpoint location`,
      );
    }
    const active = this.runner.colls.activeCount;
    if (active > 0) {
      throw new LifelineError("CPR_CHECKPOINT", `checkpoint() with ${active} collective(s) still running; await every collective before a checkpoint location`);
    }
    this.steps++;
    this.collSinceCheckpoint = 0;
    this.inFlight++;
    try {
      await this.modeImpl.checkpoint(state, global);
    } finally {
      this.inFlight--;
    }
  }

  nondet<T>(fn: () => T): T {
    this.live("nondet");
    return this.modeImpl.nondet(fn);
  }

  private reportStep(force: boolean): void {
    const now = this.host.now();
    if (!force && now - this.lastStepReport < STEP_REPORT_MS) return;
    this.lastStepReport = now;
    void this.control.send({ t: "step", rank: this.place.rank, steps: this.steps, epoch: this.modeImpl.stepEpoch }).catch(() => undefined);
  }

  async finalize(result?: unknown): Promise<void> {
    this.live("finalize");
    this.inFlight++;
    try {
      await this.finalizeNow(result);
    } finally {
      this.inFlight--;
    }
  }

  private async finalizeNow(result: unknown): Promise<void> {
    const encoded = encodeValue(result);
    // Finalize is collective, as in MPI. The barrier also flushes every channel (they are FIFO):
    // a stray message of a mismatched collective that some peer sent earlier arrives before
    // that peer's barrier message and is reported, instead of after the job was released.
    // Its own signature: a program collective on one rank against finalize() on another is a
    // mismatch, reported at once.
    await this.collective("barrier", ["finalize"], (io) => coll.barrier(io), "finalize");
    this.modeImpl.finalize();
    this.finalized = true;
    this.reportStep(true);
    const released = new Promise<void>((resolve, reject) => {
      this.released = { resolve, reject };
    });
    await this.control.send({ t: "finalize", rank: this.place.rank, result: encoded });
    let again = false;
    try {
      await released;
    } catch (err) {
      // elastic: the world changed before the job was released; the program goes round its loop again.
      again = isLifelineError(err, "MPI_WORLD_CHANGED");
      if (again) this.finalized = false;
      throw err;
    } finally {
      if (!again) {
        this.faults.dispose();
        this.failPending(new LifelineError("MPI_FINALIZED", "finalize() was called while this operation was pending"));
        await this.closeSockets();
        await this.modeImpl.close().catch(() => undefined);
        for (const fn of this.closeHooks.splice(0)) fn();
      }
    }
  }

  // ---- failure -----------------------------------------------------------------------------

  private failPending(err: LifelineError): void {
    this.matcher.drainWaiters();
    this.outstandingRecvs = 0;
    for (const r of this.pending) r.fail(err);
    this.pending.clear();
    // Bounce buffers still lent are left to the garbage collector: ZeroMQ may still read them.
    this.channel.forgetLent(err);
    this.runner.failAll(err);
  }

  /** The job is over for this rank: every pending and future call fails with `err`. */
  private abortLocal(err: LifelineError): void {
    if (this.failure !== undefined) return;
    this.failure = err;
    this.failPending(err);
    this.released?.reject(err);
    this.host.warn(`lifeline: rank ${this.rank}: ${err.message}`);
    // Peers are being stopped too; leave promptly even if the program swallows the error.
    this.host.after(200, () => this.host.exit(1));
    void this.closeSockets();
  }

  /**
   * What the idle watch (src/mpi/idle-watch.ts) looks at: the program's calls so far, and
   * whether one of them may still be waiting (a receive or probe posted, a collective, restore,
   * checkpoint or finalize not returned, a send not let go). Not for programs.
   */
  activity(): { calls: number; waiting: boolean } {
    const waiting = this.inFlight > 0 || this.pending.size > 0 || this.outstandingRecvs > 0 || this.channel.sendsWaiting();
    return { calls: this.calls, waiting };
  }

  /** Runs `fn` once this rank has finished (after finalize's release). */
  onClose(fn: () => void): void {
    this.closeHooks.push(fn);
  }

  private async closeSockets(): Promise<void> {
    await Promise.all([this.host?.transport.close(), this.control?.close()]);
  }
}

/** Bytes an unmatched message counts against the bound: its body, and at least 256 for its bookkeeping. */
function unmatchedCost(body: readonly Buffer[]): number {
  return Math.max(256, body.length === 1 ? body[0]!.byteLength : byteLengthOf(body));
}

/** What the program sees of a message (not the frame kept for checkpoints). */
function publicMessage(env: AppEnvelope): { source: number; tag: number; data: unknown } {
  return { source: env.source, tag: env.tag, data: env.data };
}

function opLabel(op: ReduceOp): string {
  return isBuiltinOp(op) ? op : "user-op";
}
