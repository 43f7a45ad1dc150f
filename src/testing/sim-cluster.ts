/**
 * A whole job in one process: N real `World`s over the simulated network, a simulated
 * coordinator, and a scheduler that performs one seeded event at a time.
 *
 * The communicator is not re-implemented: each rank is `World.joinWith(place, simHost)`
 * running a program `(world, ctx) => Promise<result>`, then `finalize(result)`. The
 * {@link SimCoordinator} runs the launcher's own membership machine (src/launch/membership.ts:
 * hello → table, finalize → release when all finalized, abort → abort everyone, restarts).
 * Crashes are `kill -9`s of a rank's node: its queued frames vanish and its pending promises
 * are abandoned. In mode `none` a crash fails the job (the others are aborted, as the
 * supervisor does); in cpr and retry-one the launcher's own restart decisions
 * (src/launch/policy.ts: `restartAllDecision`, `retryOneDecision`, with its jittered back-off)
 * say what happens: cpr restarts every rank from the last committed line, retry-one the failed
 * rank alone, or every rank from the durable floor (see {@link SimCluster.onRankDied}).
 *
 * Partitions (`partitions`) cut ranks or hosts off for a while: the ranks' watchdogs beat to the
 * coordinator for a lease, the cluster's detector declares a silent rank dead and restarts it
 * while the old incarnation runs on in isolation, and that one ends when its lease lapses.
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
import { DurableCandidates } from "../cpr/retry-one/durable.ts";
import { isLifelineError, LifelineError } from "../errors.ts";
import { EXIT_COORDINATOR_LOST, type CoordinatorToRank, type RankToCoordinator } from "../mpi/control.ts";
import { decodeValue, encodeValue } from "../mpi/codec.ts";
import { DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_UNEXPECTED_BYTES, type Mode, type RankPlace } from "../mpi/env.ts";
import { World } from "../mpi/world.ts";
import { MemoryRecoveryStore } from "../store/memory-store.ts";
import { recoverLocal } from "../store/recovery.ts";
import { KEEP_LINES_DEFAULT, type LineManifest, type LineRecord, type PartRef, type RankPartStore } from "../store/types.ts";
import { backoffDelayMs } from "../launch/backoff.ts";
import { type JobView, type RankFailure, restartAllDecision, retryOneDecision } from "../launch/policy.ts";
import { type AllStart, allStartTable } from "../launch/retry-one-policy.ts";
import {
  type CoordinatorEvent,
  Membership,
  type MembershipEffect,
  type MembershipInput,
  type MembershipPhase,
  type RankLink,
  type TableMessage,
} from "../launch/membership.ts";
import { type ClusterInvariants, clusterInvariants, parseRankNode } from "./invariants.ts";
import { Prng } from "./prng.ts";
import { simHost } from "./sim-host.ts";
import { COORDINATOR, drain, heartbeatNode, rankNode, type SchedulePolicy, SimNetwork } from "./sim-network.ts";

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
   * The wait before restart `n` (1-based). Default: the launcher's jittered back-off
   * (src/launch/backoff.ts), seeded by `seed`. Regression seeds recorded under an earlier
   * schedule pass that schedule's delays here, so that they still replay the run they found.
   */
  readonly backoffMs?: (n: number) => number;
  /**
   * The job spans hosts: each rank's host (index), sent in every table as the launcher does
   * with a hostfile (retry-one places replicas on other hosts first). With `hostCrashes`, the
   * random crashes take a whole host — every rank on it at once — instead of one rank.
   */
  readonly hosts?: readonly number[];
  readonly hostCrashes?: boolean;
  /**
   * Every rank's watchdog beats to the coordinator, which answers with a lease (as for ranks on
   * other hosts, without the launcher's pipe), and the cluster declares a rank it has not heard
   * for `failureTimeoutMs` dead, as the launcher's detector does. On with `partitions`.
   */
  readonly lease?: SimLeaseOptions;
  /**
   * Partitions: at a step, with `chance`, a live rank's links (with `hosts` and `hostCrashes`:
   * those of every rank on its host) are cut off for a time drawn from `durationMs` and then
   * healed, at most `max` times a run. A rank cut off longer than the failure timeout is
   * declared dead and restarted (retry-one: alone; cpr: with every other rank) while it runs
   * on in isolation, until its lease lapses.
   */
  readonly partitions?: SimPartitionOptions;
  /** Data sends to a dead incarnation wait until the sender connects its successor, or (`"until-close"`) until its transport closes (see SimHostOptions). */
  readonly blockSendsToDead?: boolean | "until-close";
  /** Every rank's bound on unmatched messages (`--max-unexpected`; default the launcher's). */
  readonly maxUnexpectedBytes?: number;
}

export interface SimLeaseOptions {
  readonly heartbeatMs: number;
  readonly failureTimeoutMs: number;
}

export interface SimPartitionOptions {
  readonly chance: number;
  readonly max: number;
  readonly durationMs: readonly [number, number];
}

export interface SimRetryOneOptions {
  readonly replicas?: number;
  readonly maxRestarts?: number;
  readonly failureTimeoutMs?: number;
  /** Ranks never restarted (the survivors must fail with MPI_TIMEOUT, never hang). */
  readonly noRestart?: readonly number[];
  /** Send `peer-down` at once on a death (the launcher does); without it only `peer` tells. */
  readonly peerDown?: boolean;
  /**
   * The durable floor (`--durable-every`): every rank writes every nth safe checkpoint to the
   * simulated store, the coordinator commits the newest consistent set of them as a line (as
   * src/launch/retry-one-policy.ts does), and failures beyond the replicas (`CPR_LOST`)
   * restart every rank from the newest line instead of failing the job. 0 or absent: off.
   */
  readonly durableEvery?: number;
  /** Durable lines kept (default {@link KEEP_LINES_DEFAULT}). */
  readonly keepLines?: number;
  /**
   * Durable writes take this many scheduler events before and after them (a disk that takes
   * time) while the program runs on, checkpointing again meanwhile. 0 or absent: none.
   */
  readonly slowDurable?: number;
  /** `--checkpoint-every Nsteps`: only every Nth `checkpoint()` call of a rank is a checkpoint. Absent: every call. */
  readonly checkpointSteps?: number;
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
  | {
      readonly kind: "rejected";
      readonly code: string;
      readonly message: string;
      /**
       * The coordinator had this rank's own abort when the program's error came (a real rank
       * whose program dies of the error exits then: the launcher must know why first).
       */
      readonly ownAbortHeard: boolean;
    }
  | { readonly kind: "crashed" }
  /** Declared dead (silent for the failure timeout) while cut off: it may still run, in isolation. */
  | { readonly kind: "lost" }
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
  /** Of those, bulk messages (the transport's second connection). */
  readonly bulkFramesDelivered: number;
  readonly restarts: number;
  /** retry-one: restarts of every rank from the durable floor (failures beyond the replicas). */
  readonly fallbacks: number;
  /** retry-one: the durable line each of them restarted from (0: the program's start). */
  readonly fallbackLines: readonly number[];
  /** Hosts crashed (`hostCrashes`), each taking every rank on it. */
  readonly hostsCrashed: number;
  /** Data sends that waited on a dead incarnation (`blockSendsToDead`). */
  readonly sendsStuck: number;
  /** Ranks the simulator killed (crashes, host crashes), each once. */
  readonly crashedRanks: readonly number[];
  /** Partitions: cuts made, ranks declared dead by the detector, and incarnations that ended when their lease lapsed. */
  readonly partitions: number;
  readonly declaredDead: number;
  readonly leaseEnds: readonly { readonly rank: number; readonly attempt: number; readonly silentMs: number }[];
  /** Data frames of replaced or dead incarnations that reached a live rank (which must refuse them). */
  readonly staleFrames: number;
  /** Frames of an incarnation a rank was told is dead, not yet replaced, that it took (see SimHostOptions.onDeadFrame). */
  readonly deadFramesAccepted: number;
  /** cpr: the code of the error that stopped a restart of all ranks (the job failed with it). */
  readonly restartFailure: string | undefined;
  /** cpr: epochs of the lines committed, in order. */
  readonly linesCommitted: readonly number[];
  /** cpr: how many of them were committed after a restart (a restored job goes on taking lines). */
  readonly linesAfterRestart: number;
  /** cpr: lines the initiator aborted; `early` when no rank had finalized yet (every rank could act on it). */
  readonly linesAborted: readonly { readonly epoch: number; readonly early: boolean }[];
  /** cpr: the epochs of each rank's parts left in the store at the end. */
  readonly partsLeft: readonly (readonly number[])[];
  /** retry-one: restarted ranks' reports that they caught up, in order. */
  readonly caughtUp: readonly {
    readonly rank: number;
    readonly attempt: number;
    readonly restored: number;
    readonly version: number;
    readonly seqno: number;
    readonly replayed: number;
  }[];
  /** Each rank's attempt at the end. */
  readonly attempts: readonly number[];
  /** The last events and the ranks' ends, for a failure message. */
  readonly report: string;
}

const JOB_KEY_SALT = 0x5eed;

/**
 * The bulk connection's threshold in the runs of even seeds: the programs' large messages
 * (64 KiB and a few bytes) take that path there, and the copy path in the others.
 */
export function simBulkBytesMin(seed: number): number | undefined {
  return seed % 2 === 0 ? 64 * 1024 : undefined;
}

/**
 * The coordinator of a simulated job: the real membership machine (src/launch/membership.ts:
 * rendezvous, tables, finalize and release, aborts, retry-one's rank-down/restart/rejoin,
 * restart rounds) over the simulated network, addressed by node names, and, in cpr, the
 * restart policy's part (src/launch/cpr-policy.ts: the initiator, commits to the line
 * manifest) over a {@link MemoryRecoveryStore}. Failures are the cluster's call.
 */
export class SimCoordinator {
  readonly membership: Membership;
  readonly aborts: { rank: number; code: string; message: string }[] = [];
  readonly caughtUp: { rank: number; attempt: number; restored: number; version: number; seqno: number; replayed: number }[] = [];
  readonly warnings: string[] = [];
  /** cpr: the manifest (held by the coordinator for the job's lifetime) and the initiator of the current attempt. */
  manifest: LineManifest | undefined;
  private readonly driver: InitiatorDriver;
  private tick: { stop(): void } | undefined;
  /** cpr: every rank is gone and the job restarts (the simulator's view; the machine waits for restartRound). */
  private restarting = false;
  /** cpr: the line the current attempt restores from. */
  restoreLine: LineRecord | undefined;
  readonly committed: number[] = [];
  readonly aborted: { epoch: number; early: boolean }[] = [];
  /** Called with each line the moment it is committed (invariants read it back). */
  onCommitted: (epoch: number) => void = () => undefined;
  /** Sees every event of the membership machine first (the cluster's failure detector). */
  observer: (ev: CoordinatorEvent) => void = () => undefined;
  /** retry-one's durable floor: the checkpoints the ranks reported that a newer line may use. */
  readonly durable: DurableCandidates<PartRef> | undefined;
  /** retry-one: manifest writes for the floor, one at a time. */
  private durableWrites: Promise<void> = Promise.resolve();
  /** retry-one: bumped by every restart of all ranks (a commit under way then is given up). */
  private durableGeneration = 0;
  /** retry-one: the start of every rank the next tables carry (a restart from the floor); cleared once they went out. */
  allStart: AllStart | undefined;
  /** retry-one: a rank reported CPR_LOST; true if the cluster restarts every rank from the floor. */
  onLost: (rank: number, message: string) => boolean = () => false;

  constructor(
    private readonly net: SimNetwork,
    private readonly size: number,
    /** The channel keys, by source × size + destination (the real coordinator's are random too). */
    readonly channelKeys: Uint32Array,
    private readonly cpr: SimCprOptions | undefined,
    hosts?: readonly number[],
    /** retry-one's durable floor on: the lines it keeps. */
    private readonly durableKeep?: number,
    /** Fields every table carries (retry-one's `checkpointSteps`). */
    private readonly tableExtra: Partial<TableMessage> = {},
  ) {
    this.durable = durableKeep === undefined ? undefined : new DurableCandidates(size);
    this.membership = new Membership({
      size,
      channelKeys,
      hosts,
      identity: rankNode,
      heartbeatIdentity: heartbeatNode,
      tableFor: (rank) => ({ ...this.restoreOf(rank), ...this.tableExtra }),
    });
    const node = net.addNode(COORDINATOR);
    node.onControl = (from, msg) => this.onMessage(from, msg as RankToCoordinator);
    this.driver = new InitiatorDriver(() => this.manifest!, {
      keepLines: cpr?.keepLines ?? KEEP_LINES_DEFAULT,
      now: () => this.net.now,
      broadcast: (msg) => this.input({ kind: "broadcast", msg }),
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
    this.input({ kind: "start", nowMs: net.now });
  }

  /** Each rank's link as the membership machine holds it. */
  get links(): readonly Readonly<RankLink>[] {
    return this.membership.links;
  }

  get phase(): MembershipPhase | "restarting" {
    return this.restarting ? "restarting" : this.membership.phase;
  }

  /** Feeds the machine and carries out its effects (a nested input's effects run at once). */
  private input(input: MembershipInput): void {
    this.perform(this.membership.step(input));
  }

  private perform(effects: readonly MembershipEffect[]): void {
    for (const eff of effects) {
      switch (eff.kind) {
        case "send":
          this.net.sendControl(COORDINATOR, eff.to, eff.msg);
          break;
        case "event":
          this.onEvent(eff.event);
          break;
        case "prepare-tables":
          // The simulator chooses the line before the round begins (prepareRestart).
          this.input({ kind: "tables-prepared", round: eff.round });
          break;
        default: {
          const never: never = eff;
          void never;
        }
      }
    }
  }

  private onMessage(from: string, msg: RankToCoordinator): void {
    const link = this.links[msg.rank];
    if (msg.t === "finalize" && link?.identity === from && link.up && link.finalized)
      this.net.violation(`rank ${msg.rank} finalized twice in attempt ${link.attempt}`);
    this.input({ kind: "message", identity: from, msg });
  }

  private onEvent(ev: CoordinatorEvent): void {
    this.observer(ev);
    const nowMs = this.net.now;
    switch (ev.kind) {
      case "ready":
        // Every rank got its table: later tables (single restarts) restore from peers again.
        this.allStart = undefined;
        this.startInitiator();
        return;
      case "step":
        this.driver.input({ kind: "step", rank: ev.rank, steps: ev.steps, nowMs });
        return;
      case "cpr":
        if (ev.msg.t === "cpr-held" || ev.msg.t === "cpr-copy") this.net.violation(`rank ${ev.rank} sent ${ev.msg.t}, which only per-host stores ask for`);
        else if (ev.msg.t === "cpr-durable" && this.durable !== undefined) this.onDurable(ev.rank, ev.msg);
        else if (ev.msg.t === "cpr-durable") this.net.violation(`rank ${ev.rank} sent ${ev.msg.t} without a durable floor`);
        else this.driver.input(initiatorInputOf(ev.rank, ev.msg, nowMs));
        return;
      case "released":
        this.stopInitiator();
        return;
      case "rank-abort":
        // Beyond the replicas, with the durable floor on: every rank restarts from it.
        if (ev.code === "CPR_LOST" && this.onLost(ev.rank, ev.message)) return;
        this.aborts.push({ rank: ev.rank, code: ev.code, message: ev.message });
        this.abortAll(ev.code, `rank ${ev.rank}: ${ev.message}`);
        return;
      case "caught-up":
        if (ev.attempt === 0) this.net.violation(`rank ${ev.rank} reported catching up in its first attempt`);
        this.caughtUp.push({ rank: ev.rank, attempt: ev.attempt, restored: ev.restored, version: ev.version, seqno: ev.seqno, replayed: ev.replayed });
        return;
      case "bad-result":
        this.net.violation(ev.message);
        return;
      case "warning":
        this.warnings.push(`coordinator: ${ev.message}`);
        return;
      case "rank-up":
      case "finalized":
      case "heartbeat":
        return;
      case "tables-failed":
      case "rendezvous-timeout":
      case "elastic":
        this.net.violation(`the simulated coordinator reported ${ev.kind}, which it has no cause for`);
        return;
      default: {
        const never: never = ev;
        void never;
      }
    }
  }

  /** retry-one: a durable checkpoint of `rank` is in the store; a newer line may be committed. */
  private onDurable(rank: number, msg: Extract<RankToCoordinator, { t: "cpr-durable" }>): void {
    this.durable!.add(
      rank,
      { version: msg.epoch, index: msg.index, sent: msg.sent, consumed: msg.consumed, logFrom: msg.logFrom },
      { rank: msg.ref.rank, epoch: msg.ref.epoch, checksum: msg.ref.checksum, bytes: msg.ref.bytes },
      this.net.now,
    );
    const generation = this.durableGeneration;
    this.durableWrites = this.durableWrites
      .then(() => this.commitDurable(generation))
      .catch((err: unknown) => {
        // A restart of every rank crashed the store under the commit: it is given up.
        if (generation === this.durableGeneration) this.net.violations.push(`durable line: ${(err as Error).stack ?? String(err)}`);
      });
  }

  /** Commits the newest consistent set of durable checkpoints, as src/launch/retry-one-policy.ts does. */
  private async commitDurable(generation: number): Promise<void> {
    const durable = this.durable!;
    const next = durable.next();
    if (next === undefined || generation !== this.durableGeneration) return;
    const manifest = this.manifest!;
    const epoch = Math.max(0, ...(await manifest.list()).map((l) => l.epoch)) + 1;
    if (generation !== this.durableGeneration) return;
    await manifest.commitLine(
      epoch,
      next.chosen.map((c) => c.ref),
      { mixed: true, meta: encodeValue({ index: next.index }) },
    );
    if (generation !== this.durableGeneration) return;
    durable.committed(next.versions);
    this.committed.push(epoch);
    await manifest.prune(this.durableKeep!);
    const kept = await manifest.list();
    if (generation !== this.durableGeneration) return;
    for (let r = 0; r < this.size; r++) {
      const msg: CoordinatorToRank = { t: "cpr-durable-keep", keep: kept.map((l) => l.parts[r]!.epoch) };
      this.input({ kind: "send", rank: r, msg });
    }
  }

  /** retry-one: every rank is gone for a restart from the floor; what was being committed is given up or done. */
  async durableStopped(): Promise<void> {
    this.durableGeneration++;
    await this.durableWrites;
  }

  /** cpr: rank `rank`'s part of the line the ranks restore from, for its table; retry-one: the start from the floor. */
  private restoreOf(rank: number): Partial<TableMessage> {
    if (this.allStart !== undefined) return allStartTable(this.allStart, rank);
    const line = this.restoreLine;
    const ref = line?.parts[rank];
    return line !== undefined && ref !== undefined
      ? { restore: { epoch: line.epoch, ref: { rank: ref.rank, epoch: ref.epoch, checksum: ref.checksum, bytes: ref.bytes } } }
      : {};
  }

  /** retry-one: incarnation `attempt` of `rank` died; the others are told at once if `tell`. */
  rankDown(rank: number, attempt: number, tell: boolean): void {
    const effects = this.membership.step({ kind: "rank-down", rank, attempt });
    this.perform(tell ? effects : effects.filter((e) => !(e.kind === "send" && e.msg.t === "peer-down")));
  }

  /** retry-one: `rank` runs again as `attempt`. */
  restartRank(rank: number, attempt: number): void {
    this.input({ kind: "restart-rank", rank, attempt });
  }

  private startInitiator(): void {
    if (this.cpr === undefined) return;
    this.driver.start(
      new CprInitiator({
        size: this.size,
        every: this.cpr.every,
        committedEpoch: this.restoreLine?.epoch ?? 0,
        keepLines: this.cpr.keepLines ?? KEEP_LINES_DEFAULT,
        phaseTimeoutMs: this.cpr.phaseTimeoutMs ?? PHASE_TIMEOUT_MS,
        nowMs: this.net.now,
      }),
    );
    this.tick ??= this.net.timer(COORDINATOR, CPR_TICK_MS, CPR_TICK_MS, () => this.driver.input({ kind: "tick", nowMs: this.net.now }));
  }

  private stopInitiator(): void {
    this.driver.stop();
    this.tick?.stop();
    this.tick = undefined;
  }

  /** Stops the job: every rank that said hello is told to abort. */
  abortAll(code: string, message: string): void {
    if (this.phase === "aborted" || this.phase === "released") return;
    this.restarting = false;
    this.stopInitiator();
    this.input({ kind: "abort", code, message });
  }

  /** cpr: every rank is gone; stop the initiator and wait for the commit chain (prepareRestart). */
  async beginRestart(): Promise<void> {
    this.restarting = true;
    this.input({ kind: "round-over" });
    this.stopInitiator();
    await this.driver.settled();
  }

  /** cpr: a new rendezvous for `attempts`, restoring from `line` (undefined: from the beginning). */
  restartRound(attempts: readonly number[], line: LineRecord | undefined): void {
    this.restoreLine = line;
    this.restarting = false;
    this.input({ kind: "restart-round", attempts, nowMs: this.net.now });
  }
}

/**
 * The rank's part store as the simulator hands it to the driver: it records every part
 * written (for the line invariants) and, with `slow`, makes every operation take one
 * scheduler event before and after it (a disk that takes time).
 */
function simParts(
  inner: RankPartStore,
  net: SimNetwork,
  node: string,
  disk: { slow: boolean; reach: (() => Promise<void>) | undefined; events?: number },
  written: Map<string, Buffer>,
  fail: ((epoch: number) => boolean) | undefined,
): PartStoreLike {
  const defer = (): Promise<void> =>
    new Promise((resolve) => {
      // A dead process's I/O never completes.
      if (net.node(node).alive) net.defer(node, resolve);
    });
  const step = (): Promise<void> => {
    if (!disk.slow) return Promise.resolve();
    const events = disk.events ?? 1;
    if (events <= 1) return defer();
    return (async () => {
      for (let i = 0; i < events; i++) await defer();
    })();
  };
  const reach = disk.reach;
  const hop =
    reach === undefined
      ? step
      : async (): Promise<void> => {
          await reach();
          await step();
        };
  return {
    async putPart(epoch, bytes, signal, blocks) {
      await hop();
      if (fail?.(epoch) === true)
        throw new LifelineError("STORE_IO", `rank ${inner.rank}: writing its part of line ${epoch}: ENOSPC: no space left on device (simulated)`);
      const r = await inner.putPart(epoch, bytes, signal, blocks);
      written.set(`${r.rank}/${r.epoch}/${r.checksum}`, Buffer.concat(bytes instanceof Uint8Array ? [bytes] : bytes));
      await hop();
      return r;
    },
    async readPart(ref) {
      await hop();
      const r = await inner.readPart(ref);
      await hop();
      return r;
    },
    async retain(keep, opts) {
      await hop();
      return inner.retain(keep, opts);
    },
    async dropParts(epochs) {
      await hop();
      return inner.dropParts(epochs);
    },
    close: () => inner.close(),
  };
}

/**
 * Resolves once `node` is not cut off (at once if it is not); never, if it dies first (a dead
 * process's I/O never completes).
 */
function reachable(net: SimNetwork, node: string): Promise<void> {
  if (!net.isCut(node)) return Promise.resolve();
  return new Promise((resolve) => {
    const poll = (): void => {
      if (net.isCut(node)) net.timer(node, REACH_POLL_MS, undefined, poll);
      else resolve();
    };
    poll();
  });
}

/** How often a process behind a partition retries the shared store. */
const REACH_POLL_MS = 50;

/**
 * A rank ended well: it finalized, or it died after the coordinator had its result (and
 * released the job) — killed, or ended by its watchdog because the release did not reach it
 * before its lease lapsed (a partition).
 */
export function finishedOk(end: RankEnd, resultRecorded: boolean): boolean {
  const lostLease = end.kind === "exited" && end.code === EXIT_COORDINATOR_LOST;
  return end.kind === "finalized" || ((end.kind === "crashed" || lostLease) && resultRecorded);
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
  private sendsStuck = 0;
  private readonly crashedRanks = new Set<number>();
  /** cpr: the store every rank and the coordinator use (kill -9 modelled by its crash()). */
  readonly store: MemoryRecoveryStore | undefined;
  /** cpr: each committed line as read back right after its commit. */
  readonly lines: CommittedLine[] = [];
  private restartPending = false;
  /** cpr: every part written, by rank/epoch/checksum. */
  private readonly written = new Map<string, Buffer>();
  private failure: string | undefined;
  /** The launcher's back-off jitter (src/launch/backoff.ts), seeded by the run's seed. */
  private readonly backoffRandom: () => number;
  private readonly invariants: ClusterInvariants;
  /** Partitions: the detector's view (when each rank's current incarnation was last heard). */
  private readonly lastHeardMs: (number | undefined)[];
  private partitionsMade = 0;
  private declaredDead = 0;
  private staleFrames = 0;
  private deadFrames = 0;
  private restartFailure: string | undefined;
  private readonly leaseEnds: { rank: number; attempt: number; silentMs: number }[] = [];
  /** Incarnations declared dead while cut off (they must end by themselves). */
  private readonly isolated: { rank: number; attempt: number }[] = [];
  /** retry-one: ranks whose restart is scheduled. */
  private readonly replacing = new Set<number>();
  /** retry-one: restarts of every rank from the durable floor, and a counter that outdates scheduled single restarts. */
  private fallbacks = 0;
  private readonly fallbackLines: number[] = [];
  private generation = 0;
  /** Exits behind a partition, which the launcher learns of when it heals. */
  private unreported: { rank: number; attempt: number; code: number }[] = [];

  constructor(private readonly opts: SimClusterOptions) {
    if (opts.cpr !== undefined && opts.mode !== "cpr") throw new Error("cpr options need mode cpr");
    this.prng = new Prng(opts.seed);
    this.faultPrng = this.prng.fork(0xfa17);
    const jitter = this.prng.fork(0xbac0);
    this.backoffRandom = () => jitter.float();
    this.net = new SimNetwork({
      prng: this.prng.fork(0x7e7),
      policy: opts.policy ?? "random",
      delayMaxMs: opts.delayMaxMs ?? 0,
      advanceChance: opts.advanceChance ?? 0,
      stickyChance: opts.stickyChance ?? 0,
      traceMax: opts.traceMax ?? 64,
    });
    const keyPrng = this.prng.fork(JOB_KEY_SALT);
    const channelKeys = Uint32Array.from({ length: opts.size * opts.size }, () => keyPrng.next());
    const cpr = opts.mode === "cpr" ? (opts.cpr ?? { every: { ms: 100 } }) : undefined;
    const floor = this.durableEvery > 0;
    this.coordinator = new SimCoordinator(
      this.net,
      opts.size,
      channelKeys,
      cpr,
      opts.hosts,
      floor ? (opts.retryOne?.keepLines ?? KEEP_LINES_DEFAULT) : undefined,
      opts.mode === "retry-one" && opts.retryOne?.checkpointSteps !== undefined ? { checkpointSteps: opts.retryOne.checkpointSteps } : {},
    );
    if (cpr !== undefined || floor) this.store = new MemoryRecoveryStore({ name: `sim-${opts.seed}`, nowMs: () => this.net.now });
    this.coordinator.onLost = (rank, message) => this.onLost(rank, message);
    this.ends = Array.from({ length: opts.size }, () => ({ kind: "running" }));
    this.worlds = new Array(opts.size).fill(undefined);
    this.invariants = clusterInvariants(this);
    this.lastHeardMs = new Array<number | undefined>(opts.size).fill(undefined);
    if (this.lease !== undefined) {
      this.coordinator.observer = (ev) => {
        // The launcher's detector hears a rank from its hello on, then by its heartbeats.
        if (ev.kind === "rank-up" || ev.kind === "heartbeat") this.lastHeardMs[ev.rank] = this.net.now;
      };
      this.net.dataObservers.push((d) => {
        const src = parseRankNode(d.src);
        if (src.attempt < this.coordinator.links[src.rank]!.attempt || this.isolated.some((i) => i.rank === src.rank && i.attempt === src.attempt))
          this.staleFrames++;
      });
    }
  }

  get size(): number {
    return this.opts.size;
  }

  get mode(): Mode {
    return this.opts.mode;
  }

  private get retryOne(): SimRetryOneOptions | undefined {
    return this.opts.mode === "retry-one" ? (this.opts.retryOne ?? {}) : undefined;
  }

  /** retry-one's durable floor (0: off). */
  private get durableEvery(): number {
    return this.retryOne?.durableEvery ?? 0;
  }

  /** The ranks' watchdogs and the detector (always with partitions). */
  private get lease(): SimLeaseOptions | undefined {
    return this.opts.lease ?? (this.opts.partitions === undefined ? undefined : { heartbeatMs: 250, failureTimeoutMs: 2000 });
  }

  private get cpr(): SimCprOptions | undefined {
    return this.opts.mode === "cpr" ? (this.opts.cpr ?? { every: { ms: 100 } }) : undefined;
  }

  private place(rank: number, attempt: number): RankPlace {
    return {
      rank,
      size: this.opts.size,
      coordinator: COORDINATOR,
      job: `sim-${this.opts.seed}`,
      mode: this.opts.mode,
      store: "memory",
      attempt,
      transport: "tcp",
      runDir: undefined,
      faults: "",
      watchFd: undefined,
      heartbeatMs: 500,
      failureTimeoutMs: this.retryOne?.failureTimeoutMs ?? 5000,
      maxMessageBytes: DEFAULT_MAX_MESSAGE_BYTES,
      maxUnexpectedBytes: this.opts.maxUnexpectedBytes ?? DEFAULT_MAX_UNEXPECTED_BYTES,
      bulkBytesMin: simBulkBytesMin(this.opts.seed),
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
    // The store is shared over the network: behind a partition, a process's I/O waits for the heal.
    const reach = this.opts.partitions === undefined ? undefined : () => reachable(this.net, node);
    const hook =
      store === undefined || cpr === undefined
        ? undefined
        : coordinatedHook(async () => {
            if (reach !== undefined) await reach();
            const parts = await store.openRank(rank);
            const fail = cpr.failPartWrite;
            return simParts(
              parts,
              this.net,
              node,
              { slow: cpr.slowDisk === true, reach },
              this.written,
              fail === undefined ? undefined : (epoch) => fail(rank, epoch),
            );
          });
    const lease = this.lease;
    const run = async (): Promise<unknown> => {
      const world = await World.joinWith(
        this.place(rank, attempt),
        (onControl) =>
          simHost({
            net: this.net,
            rank,
            attempt,
            onControl,
            onExit: (code) => {
              this.stopWatchdog(rank, attempt);
              // Behind a partition the launcher hears of the exit only once the cut heals (its link
              // to the host is cut); meanwhile its detector may find the rank silent.
              if (this.net.isCut(node)) {
                this.unreported.push({ rank, attempt, code });
                return;
              }
              this.onRankDied(rank, attempt, { kind: "exited", code });
            },
            onWarn: (line) => this.rankWarnings.push(line),
            watchdog: lease === undefined ? undefined : { ...lease, onLost: (silentMs) => this.leaseEnds.push({ rank, attempt, silentMs }) },
            onDeadFrame: () => {
              this.deadFrames++;
            },
            blockSendsToDead: this.opts.blockSendsToDead ?? false,
            onSendStuck: () => {
              this.sendsStuck++;
            },
          }),
        {
          cpr: hook,
          retryOne:
            this.retryOne === undefined
              ? undefined
              : retryOneHook({
                  replicas: this.retryOne.replicas ?? 2,
                  failureTimeoutMs: this.retryOne.failureTimeoutMs ?? 5000,
                  ...(store === undefined || this.durableEvery === 0
                    ? {}
                    : {
                        durableEvery: this.durableEvery,
                        openParts: async () => {
                          if (reach !== undefined) await reach();
                          return simParts(
                            await store.openRank(rank),
                            this.net,
                            node,
                            { slow: (this.retryOne?.slowDurable ?? 0) > 0, events: this.retryOne?.slowDurable ?? 0, reach },
                            this.written,
                            undefined,
                          );
                        },
                      }),
                }),
        },
      );
      this.worlds[rank] = world;
      const returned = await this.opts.program(world, ctx);
      await world.finalize(returned);
      return returned;
    };
    run().then(
      (returned) => {
        this.processEnds(rank, attempt);
        if (mine()) this.ends[rank] = { kind: "finalized", returned };
      },
      (err: unknown) => {
        this.processEnds(rank, attempt);
        if (!mine()) return;
        const e = err as { code?: unknown; message?: unknown };
        this.ends[rank] = {
          kind: "rejected",
          code: typeof e?.code === "string" ? e.code : "NONE",
          message: String(e?.message ?? err),
          ownAbortHeard: this.coordinator.aborts.some((a) => a.rank === rank),
        };
      },
    );
  }

  /** Kills rank `rank`'s current incarnation like `kill -9`. */
  crash(rank: number): void {
    this.crashedRanks.add(rank);
    const link = this.coordinator.links[rank]!;
    this.killRank(rank, link.attempt);
    this.onRankDied(rank, link.attempt, { kind: "crashed" });
  }

  /** Kills an incarnation's process (its watchdog thread dies with it). */
  private killRank(rank: number, attempt: number): void {
    this.net.kill(rankNode(rank, attempt));
    this.stopWatchdog(rank, attempt);
    // retry-one's durable floor: the part store's lock dies with the process.
    if (this.cpr === undefined) this.store?.crashRank(rank);
  }

  /**
   * The program returned or threw: with watchdogs (the model of ranks on other hosts), its
   * process exits there and then, watchdog and all; what its sockets hold still goes out.
   */
  private processEnds(rank: number, attempt: number): void {
    if (this.lease === undefined) return;
    this.stopWatchdog(rank, attempt);
    this.net.exit(rankNode(rank, attempt));
  }

  private stopWatchdog(rank: number, attempt: number): void {
    if (this.lease !== undefined) this.net.kill(heartbeatNode(rank, attempt));
  }

  /**
   * The launcher's failure detector: a rank up and not finalized that was not heard for the
   * failure timeout is declared dead. One that can be reached is killed (a crash); one behind
   * a partition cannot be and runs on in isolation (`lost`).
   */
  private detect(timer: { stop(): void }): void {
    const lease = this.lease!;
    const phase = this.coordinator.phase;
    if (phase === "released" || phase === "aborted") {
      timer.stop();
      return;
    }
    if (phase !== "running" || this.restartPending) return;
    for (let r = 0; r < this.opts.size; r++) {
      const link = this.coordinator.links[r]!;
      const heard = this.lastHeardMs[r];
      if (!link.up || link.finalized || heard === undefined || this.net.now - heard < lease.failureTimeoutMs) continue;
      if (this.coordinator.phase !== "running" || this.restartPending) return;
      this.declaredDead++;
      this.lastHeardMs[r] = undefined;
      this.net.note(`rank ${r} not heard for ${this.net.now - heard} ms: declared dead`);
      if (this.net.isCut(rankNode(r, link.attempt))) {
        this.isolated.push({ rank: r, attempt: link.attempt });
        this.onRankDied(r, link.attempt, { kind: "lost" });
      } else {
        this.killRank(r, link.attempt);
        this.onRankDied(r, link.attempt, { kind: "crashed" });
      }
    }
  }

  /** Cuts a live rank (or, with host crashes, its whole host) off for a while. */
  private maybePartition(): void {
    const p = this.opts.partitions;
    if (p === undefined || this.partitionsMade >= p.max || !this.faultPrng.chance(p.chance)) return;
    if (this.coordinator.phase !== "running" || this.restartPending) return;
    const links = this.coordinator.links;
    // One failure at a time (what replicas ≥ 1 cover in retry-one): every rank up, and every
    // restarted one caught up with the others.
    const caughtUp = (r: number): boolean => links[r]!.attempt === 0 || this.coordinator.caughtUp.some((c) => c.rank === r && c.attempt === links[r]!.attempt);
    if (this.opts.mode === "retry-one" && !links.every((l, r) => l.up && caughtUp(r))) return;
    if (links.some((l, r) => this.net.isCut(rankNode(r, l.attempt)))) return;
    const live = this.ends.flatMap((e, r) =>
      e.kind === "running" && links[r]!.up && this.net.node(rankNode(r, links[r]!.attempt)).alive && !this.net.isCut(rankNode(r, links[r]!.attempt)) ? [r] : [],
    );
    if (live.length === 0) return;
    const victim = this.faultPrng.pick(live);
    const hosts = this.opts.hosts;
    const ranks = this.opts.hostCrashes === true && hosts !== undefined ? live.filter((r) => hosts[r] === hosts[victim]) : [victim];
    const [min, max] = p.durationMs;
    this.partition(ranks, this.faultPrng.rangeInclusive(min, max));
  }

  /** Cuts the current incarnations of `ranks` (and their watchdogs) off for `durationMs`, then heals the cut. */
  partition(ranks: readonly number[], durationMs: number): void {
    const links = this.coordinator.links;
    this.partitionsMade++;
    const cut = this.net.cut(ranks.flatMap((r) => [rankNode(r, links[r]!.attempt), heartbeatNode(r, links[r]!.attempt)]));
    this.net.note(`partition: ranks ${ranks.join(", ")} cut off for ${durationMs} ms`);
    this.net.timer(COORDINATOR, durationMs, undefined, () => {
      this.net.heal(cut);
      const heard = this.unreported.filter((u) => !this.net.isCut(rankNode(u.rank, u.attempt)));
      this.unreported = this.unreported.filter((u) => !heard.includes(u));
      for (const u of heard) this.onRankDied(u.rank, u.attempt, { kind: "exited", code: u.code });
    });
  }

  /** A rank's process is gone (crash or exit): the supervisor's policy. */
  private onRankDied(rank: number, attempt: number, end: RankEnd): void {
    if (this.coordinator.links[rank]!.attempt !== attempt) return;
    // Already being replaced (declared dead, and then its exit reported after a partition healed).
    if (this.replacing.has(rank) || this.restartPending) return;
    const before = this.ends[rank]!;
    if (before.kind === "running" || end.kind === "crashed" || end.kind === "lost") this.ends[rank] = end;
    const unexpected = end.kind === "crashed" || end.kind === "lost" || (end.kind === "exited" && before.kind === "running");
    // After the release every result is in: a rank that dies on its way out fails nothing.
    if (!unexpected || this.coordinator.phase === "released") return;
    // What the launcher's restart policy decides (src/launch/policy.ts), the simulator does.
    const failure: RankFailure = { kind: "exit", rank, code: "LAUNCH_RANK_FAILED", message: `rank ${rank} died before finalizing`, exitStatus: undefined };
    const r1 = this.retryOne;
    if (r1 !== undefined && this.coordinator.phase === "running" && this.coordinator.aborts.length === 0) {
      this.coordinator.rankDown(rank, attempt, r1.peerDown !== false);
      if (r1.noRestart?.includes(rank)) {
        this.net.note(`rank ${rank} is not restarted`);
        return;
      }
      const decision = retryOneDecision(failure, this.jobView(r1.maxRestarts), this.durableEvery > 0);
      if (decision.kind === "restart") {
        this.restartOne(rank, attempt, decision.delayMs);
        return;
      }
      this.failure = decision.kind === "fail-job" ? decision.message : undefined;
    }
    if (this.cpr !== undefined && this.coordinator.phase !== "aborted" && this.coordinator.aborts.length === 0) {
      const decision = restartAllDecision(failure, this.jobView(this.cpr.maxRestarts));
      if (decision.kind === "restart") {
        this.restartAll(decision.delayMs);
        return;
      }
      this.failure = decision.kind === "fail-job" ? decision.message : undefined;
    }
    // Fail fast: a rank that dies before the job is released fails the job.
    this.coordinator.abortAll("LAUNCH_RANK_FAILED", `rank ${rank} died before finalizing`);
  }

  /**
   * cpr: kill every rank (they roll back anyway), then — after a back-off — choose the newest
   * committed line whose parts verify and start every rank with attempt + 1 restoring from it.
   */
  private restartAll(delay: number): void {
    if (this.restartPending) return;
    this.restartPending = true;
    this.restarts++;
    for (let r = 0; r < this.opts.size; r++) {
      const link = this.coordinator.links[r]!;
      // A rank behind a partition cannot be reached to be killed: it runs on in isolation.
      if (!this.net.isCut(rankNode(r, link.attempt))) this.killRank(r, link.attempt);
      this.ends[r] = { kind: "running" };
    }
    // Every rank process died: their store handles die with them (the coordinator reopens its manifest).
    this.store!.crash();
    this.net.note(`restart all (restart ${this.restarts})`);
    const stopped = this.coordinator.beginRestart();
    // Armed now (not after the commit chain settles), so the scheduler sees the pending restart.
    this.net.timer(
      COORDINATOR,
      delay,
      undefined,
      () =>
        void stopped
          .then(() => this.prepareRestart())
          .catch((err: unknown) => {
            if (isLifelineError(err, "STORE_LOCKED") && this.opts.partitions !== undefined) {
              // An old incarnation back from a partition holds its part store (a shared store): the
              // launcher cannot read the line and fails the job, as cpr-policy.ts does.
              this.restartPending = false;
              this.restartFailure = err.code;
              this.failure = `cannot restart the job: ${err.message}`;
              this.coordinator.abortAll(err.code, this.failure);
              return;
            }
            this.net.violations.push(`restart failed: ${(err as Error).stack ?? String(err)}`);
          }),
    );
  }

  /** retry-one: only `rank` starts again (attempt + 1) after a back-off; the others keep running. */
  private restartOne(rank: number, attempt: number, delay: number): void {
    this.restarts++;
    this.ends[rank] = { kind: "running" };
    this.net.note(`restart rank ${rank} alone in ${delay} ms`);
    this.replacing.add(rank);
    const generation = this.generation;
    this.net.timer(COORDINATOR, delay, undefined, () => {
      // Every rank restarted from the durable floor meanwhile: this restart is moot.
      if (generation !== this.generation) return;
      this.replacing.delete(rank);
      if (this.coordinator.phase !== "running") return;
      this.coordinator.restartRank(rank, attempt + 1);
      this.launch(rank, attempt + 1);
    });
  }

  /** retry-one: a rank reported CPR_LOST; with the durable floor every rank restarts from it. */
  private onLost(rank: number, message: string): boolean {
    if (this.restartPending) return true;
    const failure: RankFailure = { kind: "abort", rank, code: "CPR_LOST", message, exitStatus: undefined };
    const decision = retryOneDecision(failure, this.jobView(this.retryOne!.maxRestarts), this.durableEvery > 0);
    if (decision.kind !== "restart") return false;
    this.restartFromFloor(decision.delayMs);
    return true;
  }

  /** What the launcher's policies see of the job (the back-off with the launcher's jitter, seeded). */
  private jobView(maxRestarts: number | undefined): JobView {
    return {
      size: this.opts.size,
      mode: this.opts.mode,
      restarts: this.restarts,
      maxRestarts: maxRestarts ?? 10,
      finalized: this.coordinator.links.map((l) => l.finalized),
      backoffMs: this.opts.backoffMs?.(this.restarts + 1) ?? backoffDelayMs(this.restarts + 1, { random: this.backoffRandom }),
    };
  }

  /**
   * retry-one, beyond the replicas: kill every rank, then — after a back-off — start each
   * from its checkpoint in the newest durable line that verifies (from the start if none), as
   * src/launch/retry-one-policy.ts does.
   */
  private restartFromFloor(delay: number): void {
    this.restartPending = true;
    this.restarts++;
    this.fallbacks++;
    this.generation++;
    this.replacing.clear();
    for (let r = 0; r < this.opts.size; r++) {
      const link = this.coordinator.links[r]!;
      if (!this.net.isCut(rankNode(r, link.attempt))) this.killRank(r, link.attempt);
      this.ends[r] = { kind: "running" };
    }
    const settled = this.coordinator.durableStopped();
    this.store!.crash();
    this.net.note(`beyond the replicas: restart all from the durable floor (restart ${this.restarts})`);
    const stopped = this.coordinator.beginRestart();
    this.net.timer(
      COORDINATOR,
      delay,
      undefined,
      () =>
        void Promise.all([stopped, settled])
          .then(() => this.prepareFloorRestart())
          .catch((err: unknown) => this.net.violations.push(`restart from the durable floor failed: ${(err as Error).stack ?? String(err)}`)),
    );
  }

  /**
   * Every rank is down: the newest committed line whose parts verify (undefined: none). The
   * crash() of the restart killed the manifest handle too; it is reopened, as a restarted
   * launcher would.
   */
  private async newestLine(keep: number): Promise<LineRecord | undefined> {
    const store = this.store!;
    this.coordinator.manifest = await store.openManifest();
    const stores: RankPartStore[] = [];
    try {
      for (let r = 0; r < this.opts.size; r++) stores.push(await store.openRank(r));
      const choice = await recoverLocal(this.coordinator.manifest, stores, { keep });
      for (const w of choice.warnings) this.coordinator.warnings.push(w);
      return choice.line;
    } finally {
      await Promise.all(stores.map((s) => s.close()));
    }
  }

  private async prepareFloorRestart(): Promise<void> {
    const coordinator = this.coordinator;
    const line = await this.newestLine(this.retryOne!.keepLines ?? KEEP_LINES_DEFAULT);
    const versions = line === undefined ? new Array<number>(this.opts.size).fill(0) : line.parts.map((p) => p.epoch);
    const meta = line?.meta === undefined ? undefined : (decodeValue(line.meta) as { index?: unknown });
    coordinator.allStart = { line, versions, index: typeof meta?.index === "number" ? meta.index : 0 };
    coordinator.durable!.restarted(line === undefined ? undefined : versions);
    this.fallbackLines.push(line?.epoch ?? 0);
    // A re-execution from the line may send other messages than the dead one under the same numbers.
    this.invariants.onRestartAll();
    const attempts = coordinator.links.map((l) => l.attempt + 1);
    coordinator.restartRound(attempts, undefined);
    this.lastHeardMs.fill(undefined);
    this.net.note(`restart all from durable line ${line?.epoch ?? 0} (checkpoints ${versions.join(", ")})`);
    this.restartPending = false;
    for (let r = 0; r < this.opts.size; r++) this.launch(r, attempts[r]!);
  }

  private async prepareRestart(): Promise<void> {
    const line = await this.newestLine(this.cpr!.keepLines ?? KEEP_LINES_DEFAULT);
    const attempts = this.coordinator.links.map((l) => l.attempt + 1);
    this.coordinator.restartRound(attempts, line);
    this.lastHeardMs.fill(undefined);
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
      for (const r of ranks) {
        this.crashedRanks.add(r);
        this.killRank(r, this.coordinator.links[r]!.attempt);
      }
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
      if (this.cpr !== undefined)
        this.coordinator.onCommitted = (epoch) => {
          if (this.restarts > 0) this.linesAfterRestart++;
          this.readBackLine(epoch);
        };
    }
    for (let r = 0; r < this.opts.size; r++) this.launch(r, 0);
    const lease = this.lease;
    if (lease !== undefined) {
      const periodMs = Math.max(10, Math.min(lease.heartbeatMs, lease.failureTimeoutMs / 4));
      const timer: { stop(): void } = this.net.timer(COORDINATOR, periodMs, periodMs, () => this.detect(timer));
    }
    let hang = false;
    for (;;) {
      await drain();
      this.invariants.afterStep();
      if (this.net.steps >= stepsMax || this.net.now > simMsMax) {
        hang = true;
        break;
      }
      this.maybeCrash();
      this.maybePartition();
      if (!this.net.step()) break;
    }
    await drain();
    this.invariants.atEnd();
    for (const { rank, attempt } of this.isolated) {
      // The incarnation declared dead while cut off ended by itself (its lease lapsed).
      if (this.net.node(rankNode(rank, attempt)).alive)
        this.net.violation(`rank ${rank} attempt ${attempt}, declared dead while cut off, still runs at the end`);
    }
    const partsLeft = await this.partsLeft();
    // An abort that reaches the coordinator after the release still fails the job: a rank found
    // an error (e.g. a stray collective message) in a job that was about to be called a success.
    const allReleased =
      this.coordinator.phase === "released" &&
      this.ends.every((e, r) => finishedOk(e, this.coordinator.links[r]!.finalized)) &&
      this.coordinator.aborts.length === 0;
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
      bulkFramesDelivered: this.net.bulkFramesDelivered,
      restarts: this.restarts,
      fallbacks: this.fallbacks,
      fallbackLines: [...this.fallbackLines],
      hostsCrashed: this.hostsCrashed,
      sendsStuck: this.sendsStuck,
      crashedRanks: [...this.crashedRanks].sort((a, b) => a - b),
      partitions: this.partitionsMade,
      declaredDead: this.declaredDead,
      leaseEnds: [...this.leaseEnds],
      staleFrames: this.staleFrames,
      deadFramesAccepted: this.deadFrames,
      restartFailure: this.restartFailure,
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
    })().catch((err: unknown) => {
      this.net.violations.push(`committed line ${epoch}: ${(err as Error).message}`);
    });
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
