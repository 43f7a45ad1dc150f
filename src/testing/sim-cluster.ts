/**
 * A whole job in one process: N real `World`s over the simulated network, a simulated
 * coordinator, and a scheduler that performs one seeded event at a time.
 *
 * The communicator is not re-implemented: each rank is `World.joinWith(place, simHost)`
 * running a program `(world, ctx) => Promise<result>`, then `finalize(result)`. The
 * {@link SimCoordinator} speaks the real control messages (hello → table, finalize → release
 * when all finalized, abort → abort everyone). Crashes are `kill -9`s of a rank's node: its
 * queued frames vanish and its pending promises are abandoned. In mode `none` a crash fails
 * the job (the others are aborted, as the supervisor does); restart-all for `cpr` plugs into
 * {@link SimCluster.onRankDied} once the cpr rank driver exists.
 *
 * The loop: drain microtasks (see `drain`), check invariants, take ONE event, repeat, until
 * nothing can happen or a step/time bound is hit (a bound hit = a hang, reported as such).
 *
 * @example
 * const out = await new SimCluster({ seed: 7, size: 3, mode: "none", program }).run();
 * if (out.status !== "ok") console.log(out.report);
 */
import { type CheckpointEvery, CprInitiator, INITIATOR_TICK_MS as CPR_TICK_MS, initiatorInputOf, PHASE_TIMEOUT_MS } from "../cpr/coordinated/initiator.ts";
import { InitiatorDriver } from "../cpr/coordinated/initiator-driver.ts";
import { coordinatedHook, type PartStoreLike } from "../cpr/coordinated/driver.ts";
import { retryOneHook } from "../cpr/retry-one/driver.ts";
import { LifelineError } from "../errors.ts";
import { decodeValue } from "../mpi/codec.ts";
import type { CoordinatorToRank, RankToCoordinator } from "../mpi/control.ts";
import type { Mode, RankPlace } from "../mpi/env.ts";
import { World } from "../mpi/world.ts";
import { MemoryRecoveryStore } from "../store/memory-store.ts";
import { recoverLocal } from "../store/recovery.ts";
import { KEEP_LINES_DEFAULT, type LineManifest, type LineRecord, type RankPartStore } from "../store/types.ts";
import { BACKOFF_BASE_MS, BACKOFF_MAX_MS } from "../launch/backoff.ts";
import { type ClusterInvariants, clusterInvariants } from "./invariants.ts";
import { Prng } from "./prng.ts";
import { simHost } from "./sim-host.ts";
import { COORDINATOR, drain, rankNode, type SchedulePolicy, SimNetwork } from "./sim-network.ts";

/** What a program may use besides the communicator. */
export interface RankContext {
  readonly rank: number;
  readonly size: number;
  readonly attempt: number;
  /**
   * A source of values that differ between schedules (a stand-in for `Date.now` or
   * `Math.random`): wrap it in `world.nondet(...)`, and only let it affect the result in ways
   * that cannot change the outcome.
   */
  readonly environment: () => number;
}

export type SimProgram = (world: World, ctx: RankContext) => Promise<unknown>;

export interface SimClusterOptions {
  readonly seed: number;
  readonly size: number;
  readonly mode: Mode;
  readonly program: SimProgram;
  /** `fifo` is the reference schedule (oldest event first, no delays); default `random`. */
  readonly policy?: SchedulePolicy;
  readonly delayMaxMs?: number;
  readonly advanceChance?: number;
  readonly stickyChance?: number;
  /** Chance per step that a live rank is killed (at most `crashesMax` in a run). */
  readonly crashChance?: number;
  readonly crashesMax?: number;
  /** Bounds: reaching one means the run hung. */
  readonly stepsMax?: number;
  readonly simMsMax?: number;
  /** Mode cpr: the initiator's schedule and the restart policy (restart all from the last committed line). */
  readonly cpr?: SimCprOptions;
  /** Events kept for the failure report (default 64). */
  readonly traceMax?: number;
  /** Mode retry-one: replicas, restarts of the failed rank alone (src/launch/retry-one-policy.ts). */
  readonly retryOne?: SimRetryOneOptions;
  /**
   * The job spans hosts: each rank's host (index), sent in every table as the launcher does
   * with a hostfile (retry-one places replicas on other hosts first). With `hostCrashes`, the
   * random crashes take a whole host — every rank on it at once — instead of one rank.
   */
  readonly hosts?: readonly number[];
  readonly hostCrashes?: boolean;
}

export interface SimRetryOneOptions {
  readonly replicas?: number;
  readonly maxRestarts?: number;
  readonly failureTimeoutMs?: number;
  /** Ranks never restarted (the survivors must fail with MPI_TIMEOUT, never hang). */
  readonly noRestart?: readonly number[];
  /** Send `peer-down` at once on a death (the launcher does); without it only `peer` tells. */
  readonly peerDown?: boolean;
}

export interface SimCprOptions {
  readonly every: CheckpointEvery;
  readonly keepLines?: number;
  readonly phaseTimeoutMs?: number;
  readonly maxRestarts?: number;
  /**
   * Every part-store operation of a rank waits for one scheduler event before and after it
   * (a disk that takes time), so crashes can land in the middle of a part write or read.
   */
  readonly slowDisk?: boolean;
  /** A rank's part of a line cannot be written (a full disk): `putPart` fails with STORE_IO. */
  readonly failPartWrite?: (rank: number, epoch: number) => boolean;
}

/** Line-level facts for the invariants: each committed line as read back from the store. */
export interface CommittedLine {
  readonly record: LineRecord;
  readonly parts: readonly Buffer[];
}

export type RankEnd =
  | { readonly kind: "running" }
  | { readonly kind: "finalized"; readonly returned: unknown }
  | { readonly kind: "rejected"; readonly code: string; readonly message: string }
  | { readonly kind: "crashed" }
  | { readonly kind: "exited"; readonly code: number };

export interface SimOutcome {
  /** ok: every rank finalized and was released. failed: the job failed (abort, crash). hang: a bound was hit. */
  readonly status: "ok" | "failed" | "hang";
  readonly seed: number;
  /** Per rank, the result the coordinator received from finalize (decoded). */
  readonly results: readonly unknown[];
  readonly ends: readonly RankEnd[];
  /** Aborts the coordinator received from ranks, in order. */
  readonly aborts: readonly { readonly rank: number; readonly code: string; readonly message: string }[];
  readonly warnings: readonly string[];
  readonly steps: number;
  readonly simMs: number;
  readonly framesDelivered: number;
  readonly restarts: number;
  /** Hosts crashed (`hostCrashes`), each taking every rank on it. */
  readonly hostsCrashed: number;
  /** cpr: epochs of the lines committed, in order. */
  readonly linesCommitted: readonly number[];
  /** cpr: how many of them were committed after a restart (a restored job goes on taking lines). */
  readonly linesAfterRestart: number;
  /** cpr: lines the initiator aborted; `early` when no rank had finalized yet (every rank could act on it). */
  readonly linesAborted: readonly { readonly epoch: number; readonly early: boolean }[];
  /** cpr: the epochs of each rank's parts left in the store at the end. */
  readonly partsLeft: readonly (readonly number[])[];
  /** retry-one: restarted ranks' reports that they caught up, in order. */
  readonly caughtUp: readonly { readonly rank: number; readonly attempt: number; readonly restored: number; readonly version: number; readonly seqno: number; readonly replayed: number }[];
  /** Each rank's attempt at the end. */
  readonly attempts: readonly number[];
  /** The last events and the ranks' ends, for a failure message. */
  readonly report: string;
}

const JOB_KEY_SALT = 0x5eed;

interface Link {
  attempt: number;
  up: boolean;
  endpoint: string | undefined;
  finalized: boolean;
  result: unknown;
}

/**
 * The coordinator's part of the control protocol (src/launch/coordinator.ts) and, in cpr, of
 * the restart policy (src/launch/cpr-policy.ts: the initiator, commits to the line manifest),
 * over the simulated network and a {@link MemoryRecoveryStore}. Failures are the cluster's call.
 */
export class SimCoordinator {
  readonly links: Link[];
  phase: "rendezvous" | "running" | "released" | "aborted" | "restarting" = "rendezvous";
  readonly aborts: { rank: number; code: string; message: string }[] = [];
  readonly caughtUp: { rank: number; attempt: number; restored: number; version: number; seqno: number; replayed: number }[] = [];
  readonly warnings: string[] = [];
  /** cpr: the manifest (held by the coordinator for the job's lifetime) and the initiator of the current attempt. */
  manifest: LineManifest | undefined;
  private readonly driver: InitiatorDriver;
  private tick: { stop(): void } | undefined;
  /** cpr: the line the current attempt restores from. */
  restoreLine: LineRecord | undefined;
  readonly committed: number[] = [];
  readonly aborted: { epoch: number; early: boolean }[] = [];
  /** Called with each line the moment it is committed (invariants read it back). */
  onCommitted: (epoch: number) => void = () => undefined;
  /** retry-one: ranks down (dead or restarted and not back), and those expected back. */
  private readonly down = new Set<number>();
  private readonly rejoining = new Set<number>();

  constructor(private readonly net: SimNetwork, private readonly size: number, readonly jobKey: number, private readonly cpr: SimCprOptions | undefined, private readonly hosts?: readonly number[]) {
    this.links = Array.from({ length: size }, () => ({ attempt: 0, up: false, endpoint: undefined, finalized: false, result: undefined }));
    const node = net.addNode(COORDINATOR);
    node.onControl = (from, msg) => this.onMessage(from, msg as RankToCoordinator);
    this.driver = new InitiatorDriver(() => this.manifest!, {
      keepLines: cpr?.keepLines ?? KEEP_LINES_DEFAULT,
      now: () => this.net.now,
      broadcast: (msg) => {
        for (let r = 0; r < this.size; r++) this.send(r, msg);
      },
      onDurable: ({ epoch }) => {
        this.committed.push(epoch);
        this.onCommitted(epoch);
      },
      onAborted: (epoch, reason) => {
        this.warnings.push(`line ${epoch} aborted: ${reason}`);
        this.aborted.push({ epoch, early: this.links.every((l) => !l.finalized) });
      },
      onAbortNotRecorded: (epoch, err) => this.warnings.push(`abortLine ${epoch}: ${err.message}`),
    });
  }

  private send(rank: number, msg: CoordinatorToRank): void {
    const link = this.links[rank]!;
    this.net.sendControl(COORDINATOR, rankNode(rank, link.attempt), msg);
  }

  private onMessage(from: string, msg: RankToCoordinator): void {
    const rank = msg.rank;
    const link = this.links[rank];
    if (link === undefined || from !== rankNode(rank, link.attempt)) {
      // Messages of a dead attempt are ignored (the real coordinator keys them by routing id).
      return;
    }
    const nowMs = this.net.now;
    switch (msg.t) {
      case "hello":
        if (link.up || msg.attempt !== link.attempt || msg.size !== this.size) {
          this.warnings.push(`coordinator: ignored hello from ${from}`);
          return;
        }
        link.up = true;
        link.endpoint = msg.endpoint;
        if (this.phase === "running" && this.rejoining.has(rank)) {
          this.onRejoin(rank);
          return;
        }
        if (this.phase === "rendezvous" && this.links.every((l) => l.up)) this.onAllUp();
        return;
      case "finalize":
        if (link.finalized) this.net.violation(`rank ${rank} finalized twice in attempt ${link.attempt}`);
        link.finalized = true;
        link.result = decodeValue(Buffer.from(msg.result.buffer, msg.result.byteOffset, msg.result.byteLength));
        if (this.phase === "running" && this.links.every((l) => l.finalized)) {
          this.phase = "released";
          this.stopInitiator();
          for (let r = 0; r < this.size; r++) this.send(r, { t: "release" });
        }
        return;
      case "abort":
        this.aborts.push({ rank, code: msg.code, message: msg.message });
        this.abortAll(msg.code, `rank ${rank}: ${msg.message}`);
        return;
      case "step":
        this.driver.input({ kind: "step", rank, steps: msg.steps, nowMs });
        return;
      case "heartbeat":
        return;
      case "retry-caught-up":
        if (msg.attempt === 0) this.net.violation(`rank ${rank} reported catching up in its first attempt`);
        this.caughtUp.push({ rank, attempt: msg.attempt, restored: msg.restored, version: msg.version, seqno: msg.seqno, replayed: msg.replayed });
        return;
      case "cpr-checkpointed":
      case "cpr-ready":
      case "cpr-part":
      case "cpr-part-failed":
        this.driver.input(initiatorInputOf(rank, msg, nowMs));
        return;
    }
  }

  /** retry-one: incarnation `attempt` of `rank` died; the others are told at once if `tell`. */
  rankDown(rank: number, attempt: number, tell: boolean): void {
    const link = this.links[rank]!;
    if (link.attempt !== attempt || this.phase !== "running") return;
    link.up = false;
    this.down.add(rank);
    link.finalized = false;
    link.result = undefined;
    if (!tell) return;
    for (let r = 0; r < this.size; r++) {
      const l = this.links[r]!;
      if (r !== rank && l.up && this.net.node(rankNode(r, l.attempt)).alive) this.send(r, { t: "peer-down", rank, attempt });
    }
  }

  /** retry-one: `rank` runs again as `attempt` (as coordinator.ts restartRank). */
  restartRank(rank: number, attempt: number): void {
    const link = this.links[rank]!;
    link.attempt = attempt;
    link.up = false;
    link.endpoint = undefined;
    link.finalized = false;
    link.result = undefined;
    this.down.add(rank);
    this.rejoining.add(rank);
  }

  private onRejoin(rank: number): void {
    this.rejoining.delete(rank);
    this.down.delete(rank);
    const link = this.links[rank]!;
    this.send(rank, {
      t: "table", jobKey: this.jobKey, endpoints: this.links.map((l) => l.endpoint ?? ""),
      attempts: this.links.map((l, r) => (this.rejoining.has(r) ? l.attempt - 1 : l.attempt)),
      down: [...this.down].sort((a, b) => a - b),
      ...(this.hosts === undefined ? {} : { hosts: [...this.hosts] }),
    });
    for (let r = 0; r < this.size; r++) {
      const l = this.links[r]!;
      if (r !== rank && l.up) this.send(r, { t: "peer", rank, endpoint: link.endpoint!, attempt: link.attempt });
    }
  }

  private onAllUp(): void {
    this.phase = "running";
    const table = {
      t: "table" as const, jobKey: this.jobKey, endpoints: this.links.map((l) => l.endpoint!), attempts: this.links.map((l) => l.attempt),
      ...(this.hosts === undefined ? {} : { hosts: [...this.hosts] }),
    };
    for (let r = 0; r < this.size; r++) {
      const line = this.restoreLine;
      const ref = line?.parts[r];
      const restore = line !== undefined && ref !== undefined
        ? { restore: { epoch: line.epoch, ref: { rank: ref.rank, epoch: ref.epoch, checksum: ref.checksum, bytes: ref.bytes } } } : {};
      this.send(r, { ...table, ...restore });
    }
    if (this.cpr !== undefined) {
      this.driver.start(new CprInitiator({
        size: this.size, every: this.cpr.every, committedEpoch: this.restoreLine?.epoch ?? 0,
        keepLines: this.cpr.keepLines ?? KEEP_LINES_DEFAULT, phaseTimeoutMs: this.cpr.phaseTimeoutMs ?? PHASE_TIMEOUT_MS, nowMs: this.net.now,
      }));
      this.tick ??= this.net.timer(COORDINATOR, CPR_TICK_MS, CPR_TICK_MS, () => this.driver.input({ kind: "tick", nowMs: this.net.now }));
    }
  }

  private stopInitiator(): void {
    this.driver.stop();
    this.tick?.stop();
    this.tick = undefined;
  }

  /** Stops the job: every rank that said hello and is alive is told to abort. */
  abortAll(code: string, message: string): void {
    if (this.phase === "aborted" || this.phase === "released") return;
    this.phase = "aborted";
    this.stopInitiator();
    for (let r = 0; r < this.size; r++) {
      const link = this.links[r]!;
      if (link.up && this.net.node(rankNode(r, link.attempt)).alive) this.send(r, { t: "abort", code, message });
    }
  }

  /** cpr: every rank is gone; stop the initiator and wait for the commit chain (prepareRestart). */
  async beginRestart(): Promise<void> {
    this.phase = "restarting";
    this.stopInitiator();
    await this.driver.settled();
  }

  /** cpr: a new rendezvous for `attempts`, restoring from `line` (undefined: from the beginning). */
  restartRound(attempts: readonly number[], line: LineRecord | undefined): void {
    this.restoreLine = line;
    this.phase = "rendezvous";
    this.links.forEach((l, r) => {
      l.attempt = attempts[r]!;
      l.up = false;
      l.endpoint = undefined;
      l.finalized = false;
      l.result = undefined;
    });
  }
}

/**
 * The rank's part store as the simulator hands it to the driver: it records every part
 * written (for the line invariants) and, with `slow`, makes every operation take one
 * scheduler event before and after it (a disk that takes time).
 */
function simParts(inner: RankPartStore, net: SimNetwork, node: string, slow: boolean, written: Map<string, Buffer>, fail: ((epoch: number) => boolean) | undefined): PartStoreLike {
  const hop = (): Promise<void> => (!slow ? Promise.resolve() : new Promise((resolve) => {
    // A dead process's I/O never completes.
    if (net.node(node).alive) net.defer(node, resolve);
  }));
  return {
    async putPart(epoch, bytes) {
      await hop();
      if (fail?.(epoch) === true) throw new LifelineError("STORE_IO", `rank ${inner.rank}: writing its part of line ${epoch}: ENOSPC: no space left on device (simulated)`);
      const r = await inner.putPart(epoch, bytes);
      written.set(`${r.rank}/${r.epoch}/${r.checksum}`, Buffer.from(bytes));
      await hop();
      return r;
    },
    async readPart(ref) { await hop(); const r = await inner.readPart(ref); await hop(); return r; },
    async retain(keep, opts) { await hop(); return inner.retain(keep, opts); },
    async dropParts(epochs) { await hop(); return inner.dropParts(epochs); },
    close: () => inner.close(),
  };
}

/** A rank ended well: it finalized, or it died after the coordinator had its result (and released the job). */
export function finishedOk(end: RankEnd, resultRecorded: boolean): boolean {
  return end.kind === "finalized" || (end.kind === "crashed" && resultRecorded);
}

export class SimCluster {
  readonly net: SimNetwork;
  readonly coordinator: SimCoordinator;
  readonly prng: Prng;
  private readonly faultPrng: Prng;
  readonly ends: RankEnd[];
  readonly worlds: (World | undefined)[];
  private readonly rankWarnings: string[] = [];
  private crashes = 0;
  restarts = 0;
  private linesAfterRestart = 0;
  private hostsCrashed = 0;
  /** cpr: the store every rank and the coordinator use (kill -9 modelled by its crash()). */
  readonly store: MemoryRecoveryStore | undefined;
  /** cpr: each committed line as read back right after its commit. */
  readonly lines: CommittedLine[] = [];
  private restartPending = false;
  /** cpr: every part written, by rank/epoch/checksum. */
  private readonly written = new Map<string, Buffer>();
  private failure: string | undefined;
  private readonly invariants: ClusterInvariants;

  constructor(private readonly opts: SimClusterOptions) {
    if (opts.cpr !== undefined && opts.mode !== "cpr") throw new Error("cpr options need mode cpr");
    this.prng = new Prng(opts.seed);
    this.faultPrng = this.prng.fork(0xfa17);
    this.net = new SimNetwork({
      prng: this.prng.fork(0x7e7),
      policy: opts.policy ?? "random",
      delayMaxMs: opts.delayMaxMs ?? 0,
      advanceChance: opts.advanceChance ?? 0,
      stickyChance: opts.stickyChance ?? 0,
      traceMax: opts.traceMax ?? 64,
    });
    const jobKey = (this.prng.fork(JOB_KEY_SALT).next() | 1) >>> 0;
    const cpr = opts.mode === "cpr" ? opts.cpr ?? { every: { ms: 100 } } : undefined;
    this.coordinator = new SimCoordinator(this.net, opts.size, jobKey, cpr, opts.hosts);
    if (cpr !== undefined) this.store = new MemoryRecoveryStore({ name: `sim-${opts.seed}`, nowMs: () => this.net.now });
    this.ends = Array.from({ length: opts.size }, () => ({ kind: "running" }) as RankEnd);
    this.worlds = new Array(opts.size).fill(undefined);
    this.invariants = clusterInvariants(this);
  }

  get size(): number {
    return this.opts.size;
  }

  get mode(): Mode {
    return this.opts.mode;
  }

  private get retryOne(): SimRetryOneOptions | undefined {
    return this.opts.mode === "retry-one" ? this.opts.retryOne ?? {} : undefined;
  }

  private get cpr(): SimCprOptions | undefined {
    return this.opts.mode === "cpr" ? this.opts.cpr ?? { every: { ms: 100 } } : undefined;
  }

  private place(rank: number, attempt: number): RankPlace {
    return {
      rank, size: this.opts.size, coordinator: COORDINATOR, job: `sim-${this.opts.seed}`, mode: this.opts.mode, store: "memory",
      attempt, transport: "tcp", runDir: undefined, faults: "", watchFd: undefined, heartbeatMs: 500, failureTimeoutMs: this.retryOne?.failureTimeoutMs ?? 5000,
    };
  }

  /** Starts one rank incarnation: join, run the program, finalize. */
  private launch(rank: number, attempt: number): void {
    const envPrng = this.prng.fork(0xe1, rank, attempt);
    const ctx: RankContext = { rank, size: this.opts.size, attempt, environment: () => envPrng.next() };
    const mine = (): boolean => this.coordinator.links[rank]!.attempt === attempt && this.ends[rank]!.kind === "running";
    const node = rankNode(rank, attempt);
    const store = this.store;
    const cpr = this.cpr;
    const hook = store === undefined || cpr === undefined ? undefined : coordinatedHook(async () => {
      const parts = await store.openRank(rank);
      const fail = cpr.failPartWrite;
      return simParts(parts, this.net, node, cpr.slowDisk === true, this.written, fail === undefined ? undefined : (epoch) => fail(rank, epoch));
    });
    const run = async (): Promise<unknown> => {
      const world = await World.joinWith(this.place(rank, attempt), (onControl) => simHost({
        net: this.net, rank, attempt, onControl,
        onExit: (code) => this.onRankDied(rank, attempt, { kind: "exited", code }),
        onWarn: (line) => this.rankWarnings.push(line),
      }), { cpr: hook, retryOne: this.retryOne === undefined ? undefined : retryOneHook({ replicas: this.retryOne.replicas ?? 2, failureTimeoutMs: this.retryOne.failureTimeoutMs ?? 5000 }) });
      this.worlds[rank] = world;
      const returned = await this.opts.program(world, ctx);
      await world.finalize(returned);
      return returned;
    };
    run().then(
      (returned) => { if (mine()) this.ends[rank] = { kind: "finalized", returned }; },
      (err: unknown) => {
        if (!mine()) return;
        const e = err as { code?: unknown; message?: unknown };
        this.ends[rank] = { kind: "rejected", code: typeof e?.code === "string" ? e.code : "NONE", message: String(e?.message ?? err) };
      },
    );
  }

  /** Kills rank `rank`'s current incarnation like `kill -9`. */
  crash(rank: number): void {
    const link = this.coordinator.links[rank]!;
    this.net.kill(rankNode(rank, link.attempt));
    this.onRankDied(rank, link.attempt, { kind: "crashed" });
  }

  /** A rank's process is gone (crash or exit): the supervisor's policy. */
  private onRankDied(rank: number, attempt: number, end: RankEnd): void {
    if (this.coordinator.links[rank]!.attempt !== attempt) return;
    const before = this.ends[rank]!;
    if (before.kind === "running" || end.kind === "crashed") this.ends[rank] = end;
    const unexpected = end.kind === "crashed" || (end.kind === "exited" && before.kind === "running");
    // After the release every result is in: a rank that dies on its way out fails nothing.
    if (!unexpected || this.coordinator.phase === "released") return;
    const r1 = this.retryOne;
    if (r1 !== undefined && this.coordinator.phase === "running" && this.coordinator.aborts.length === 0) {
      this.coordinator.rankDown(rank, attempt, r1.peerDown !== false);
      if (r1.noRestart?.includes(rank)) {
        this.net.note(`rank ${rank} is not restarted`);
        return;
      }
      if (this.restarts < (r1.maxRestarts ?? 10)) {
        this.restartOne(rank, attempt);
        return;
      }
      this.failure = `rank ${rank} died and ${this.restarts} restart(s) were used`;
    }
    if (this.cpr !== undefined && this.coordinator.phase !== "aborted" && this.coordinator.aborts.length === 0) {
      const max = this.cpr.maxRestarts ?? 10;
      if (this.restarts < max) {
        this.restartAll();
        return;
      }
      this.failure = `rank ${rank} died and the job was already restarted ${this.restarts} time(s)`;
    }
    // Fail fast: a rank that dies before the job is released fails the job.
    this.coordinator.abortAll("LAUNCH_RANK_FAILED", `rank ${rank} died before finalizing`);
  }

  /**
   * cpr: kill every rank (they roll back anyway), then — after a back-off — choose the newest
   * committed line whose parts verify and start every rank with attempt + 1 restoring from it.
   */
  private restartAll(): void {
    if (this.restartPending) return;
    this.restartPending = true;
    this.restarts++;
    for (let r = 0; r < this.opts.size; r++) {
      const link = this.coordinator.links[r]!;
      const id = rankNode(r, link.attempt);
      if (this.net.node(id).alive) this.net.kill(id);
      this.ends[r] = { kind: "running" };
    }
    // Every rank process died: their store handles die with them (the coordinator reopens its manifest).
    this.store!.crash();
    this.net.note(`restart all (restart ${this.restarts})`);
    const delay = Math.min(BACKOFF_MAX_MS, BACKOFF_BASE_MS * 2 ** (this.restarts - 1));
    const stopped = this.coordinator.beginRestart();
    // Armed now (not after the commit chain settles), so the scheduler sees the pending restart.
    this.net.timer(COORDINATOR, delay, undefined, () => void stopped.then(() => this.prepareRestart()).catch((err: unknown) => {
      this.net.violations.push(`restart failed: ${(err as Error).stack ?? String(err)}`);
    }));
  }

  /** retry-one: only `rank` starts again (attempt + 1) after a back-off; the others keep running. */
  private restartOne(rank: number, attempt: number): void {
    this.restarts++;
    this.ends[rank] = { kind: "running" };
    const delay = Math.min(BACKOFF_MAX_MS, BACKOFF_BASE_MS * 2 ** Math.min(this.restarts - 1, 3));
    this.net.note(`restart rank ${rank} alone in ${delay} ms`);
    this.net.timer(COORDINATOR, delay, undefined, () => {
      if (this.coordinator.phase !== "running") return;
      this.coordinator.restartRank(rank, attempt + 1);
      this.launch(rank, attempt + 1);
    });
  }

  private async prepareRestart(): Promise<void> {
    const store = this.store!;
    // The crash() above killed the manifest handle too; reopen it, as a restarted launcher would.
    this.coordinator.manifest = await store.openManifest();
    const stores: RankPartStore[] = [];
    let line: LineRecord | undefined;
    try {
      for (let r = 0; r < this.opts.size; r++) stores.push(await store.openRank(r));
      const choice = await recoverLocal(this.coordinator.manifest, stores, { keep: this.cpr!.keepLines ?? KEEP_LINES_DEFAULT });
      for (const w of choice.warnings) this.coordinator.warnings.push(w);
      line = choice.line;
    } finally {
      await Promise.all(stores.map((s) => s.close()));
    }
    const attempts = this.coordinator.links.map((l) => l.attempt + 1);
    this.coordinator.restartRound(attempts, line);
    this.net.note(`restart from line ${line?.epoch ?? 0}`);
    this.restartPending = false;
    for (let r = 0; r < this.opts.size; r++) this.launch(r, attempts[r]!);
  }

  private maybeCrash(): void {
    const max = this.opts.crashesMax ?? 0;
    if (this.crashes >= max || !this.faultPrng.chance(this.opts.crashChance ?? 0)) return;
    const live = this.ends.flatMap((e, r) => (e.kind === "running" && this.net.node(rankNode(r, this.coordinator.links[r]!.attempt)).alive ? [r] : []));
    if (live.length === 0 || this.restartPending) return;
    // retry-one restarts one rank into a running job; crashes before the rendezvous are mode none's case.
    if (this.opts.mode === "retry-one" && this.coordinator.phase !== "running") return;
    const victim = this.faultPrng.pick(live);
    this.crashes++;
    const hosts = this.opts.hosts;
    if (this.opts.hostCrashes === true && hosts !== undefined) {
      // The victim's whole host goes down: every live rank on it, at once.
      const ranks = live.filter((r) => hosts[r] === hosts[victim]);
      this.hostsCrashed++;
      this.net.note(`crash host ${hosts[victim]} (ranks ${ranks.join(", ")})`);
      for (const r of ranks) this.net.kill(rankNode(r, this.coordinator.links[r]!.attempt));
      for (const r of ranks) this.onRankDied(r, this.coordinator.links[r]!.attempt, { kind: "crashed" });
      return;
    }
    this.net.note(`crash rank ${victim}`);
    this.crash(victim);
  }

  /** Runs the job to its end (or to a bound). Throws on a broken invariant. */
  async run(): Promise<SimOutcome> {
    const stepsMax = this.opts.stepsMax ?? 200_000;
    const simMsMax = this.opts.simMsMax ?? 600_000;
    if (this.store !== undefined) {
      this.coordinator.manifest = await this.store.openManifest();
      this.coordinator.onCommitted = (epoch) => {
        if (this.restarts > 0) this.linesAfterRestart++;
        this.readBackLine(epoch);
      };
    }
    for (let r = 0; r < this.opts.size; r++) this.launch(r, 0);
    let hang = false;
    for (;;) {
      await drain();
      this.invariants.afterStep();
      if (this.net.steps >= stepsMax || this.net.now > simMsMax) {
        hang = true;
        break;
      }
      this.maybeCrash();
      if (!this.net.step()) break;
    }
    await drain();
    this.invariants.atEnd();
    const partsLeft = await this.partsLeft();
    // An abort that reaches the coordinator after the release still fails the job: a rank found
    // an error (e.g. a stray collective message) in a job that was about to be called a success.
    const allReleased = this.coordinator.phase === "released" && this.ends.every((e, r) => finishedOk(e, this.coordinator.links[r]!.finalized)) && this.coordinator.aborts.length === 0;
    const status: SimOutcome["status"] = hang ? "hang" : allReleased ? "ok" : "failed";
    return {
      status,
      seed: this.opts.seed,
      results: this.coordinator.links.map((l) => l.result),
      ends: [...this.ends],
      aborts: this.coordinator.aborts,
      caughtUp: this.coordinator.caughtUp,
      attempts: this.coordinator.links.map((l) => l.attempt),
      warnings: [...this.coordinator.warnings, ...this.rankWarnings],
      steps: this.net.steps,
      simMs: this.net.now,
      framesDelivered: this.net.framesDelivered,
      restarts: this.restarts,
      hostsCrashed: this.hostsCrashed,
      linesCommitted: [...this.coordinator.committed],
      linesAfterRestart: this.linesAfterRestart,
      linesAborted: [...this.coordinator.aborted],
      partsLeft,
      report: this.report(status),
    };
  }

  /** cpr: each rank's part epochs in the store at the end (every process is gone by then). */
  private async partsLeft(): Promise<number[][]> {
    const store = this.store;
    if (store === undefined) return [];
    store.crash();
    const out: number[][] = [];
    for (let r = 0; r < this.opts.size; r++) {
      const parts = await store.openRank(r);
      out.push((await parts.listParts()).map((p) => p.epoch));
      await parts.close();
    }
    return out;
  }

  /** Collects a just-committed line's parts (as written) for the line invariants. */
  private readBackLine(epoch: number): void {
    const manifest = this.coordinator.manifest!;
    void (async () => {
      const record = (await manifest.list()).find((l) => l.epoch === epoch);
      if (record === undefined) return;
      const parts = record.parts.map((ref) => {
        const b = this.written.get(`${ref.rank}/${ref.epoch}/${ref.checksum}`);
        if (b === undefined) this.net.violation(`line ${epoch} names part ${ref.rank}/${ref.epoch}/${ref.checksum}, which no rank wrote`);
        return b;
      });
      const line = { record, parts };
      this.lines.push(line);
      this.invariants.onLine(line);
    })().catch((err: unknown) => { this.net.violations.push(`committed line ${epoch}: ${(err as Error).message}`); });
  }

  private report(status: string): string {
    const ends = this.ends.map((e, r) => `  rank ${r}: ${JSON.stringify(e, (_k, v) => (typeof v === "bigint" ? `${v}n` : v))?.slice(0, 300)}`).join("\n");
    return [
      `seed ${this.opts.seed}: ${status} after ${this.net.steps} steps, ${this.net.now} simulated ms, ${this.net.framesDelivered} frames, ${this.restarts} restart(s), lines ${JSON.stringify(this.coordinator.committed)}${this.failure !== undefined ? `; ${this.failure}` : ""}`,
      `coordinator: ${this.coordinator.phase}; aborts: ${JSON.stringify(this.coordinator.aborts)}`,
      ends,
      `warnings:\n  ${[...this.coordinator.warnings, ...this.rankWarnings].slice(0, 10).join("\n  ")}`,
      `last events:\n${this.net.traceText()}`,
    ].join("\n");
  }
}
