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
import { decodeValue } from "../mpi/codec.ts";
import type { CoordinatorToRank, RankToCoordinator } from "../mpi/control.ts";
import type { Mode, RankPlace } from "../mpi/env.ts";
import { World } from "../mpi/world.ts";
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
  /** Restart-all from the last committed line on a crash (cpr). Needs the cpr rank driver. */
  readonly restartAll?: boolean;
  /** Events kept for the failure report (default 64). */
  readonly traceMax?: number;
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
  released: boolean;
}

/**
 * The coordinator's part of the control protocol (src/launch/coordinator.ts), over the
 * simulated network. It decides nothing about failures itself; the cluster tells it.
 */
export class SimCoordinator {
  readonly links: Link[];
  phase: "rendezvous" | "running" | "released" | "aborted" = "rendezvous";
  readonly aborts: { rank: number; code: string; message: string }[] = [];
  readonly warnings: string[] = [];

  constructor(private readonly net: SimNetwork, private readonly size: number, readonly jobKey: number) {
    this.links = Array.from({ length: size }, () => ({ attempt: 0, up: false, endpoint: undefined, finalized: false, result: undefined, released: false }));
    const node = net.addNode(COORDINATOR);
    node.onControl = (from, msg) => this.onMessage(from, msg as RankToCoordinator);
  }

  private send(rank: number, msg: CoordinatorToRank): void {
    const link = this.links[rank]!;
    this.net.sendControl(COORDINATOR, rankNode(rank, link.attempt), msg);
  }

  private onMessage(from: string, msg: RankToCoordinator): void {
    const rank = msg.rank;
    const link = this.links[rank];
    if (link === undefined || from !== rankNode(rank, link.attempt)) {
      this.warnings.push(`coordinator: ignored ${msg.t} claiming rank ${rank} from ${from}`);
      return;
    }
    switch (msg.t) {
      case "hello":
        if (link.up || msg.attempt !== link.attempt || msg.size !== this.size) {
          this.warnings.push(`coordinator: ignored hello from ${from}`);
          return;
        }
        link.up = true;
        link.endpoint = msg.endpoint;
        if (this.phase === "rendezvous" && this.links.every((l) => l.up)) {
          this.phase = "running";
          const table: CoordinatorToRank = {
            t: "table", jobKey: this.jobKey, endpoints: this.links.map((l) => l.endpoint!), attempts: this.links.map((l) => l.attempt),
          };
          for (let r = 0; r < this.size; r++) this.send(r, table);
        }
        return;
      case "finalize":
        if (link.finalized) {
          this.net.violation(`rank ${rank} finalized twice`);
        }
        link.finalized = true;
        link.result = decodeValue(Buffer.from(msg.result.buffer, msg.result.byteOffset, msg.result.byteLength));
        if (this.phase === "running" && this.links.every((l) => l.finalized)) {
          this.phase = "released";
          for (let r = 0; r < this.size; r++) this.send(r, { t: "release" });
        }
        return;
      case "abort":
        this.aborts.push({ rank, code: msg.code, message: msg.message });
        this.abortAll(msg.code, `rank ${rank}: ${msg.message}`);
        return;
      case "step":
      case "heartbeat":
        return;
      case "cpr-checkpointed":
      case "cpr-ready":
      case "cpr-part":
      case "cpr-part-failed":
        // The cpr initiator is wired in once the rank driver lands (see SimClusterOptions.restartAll).
        this.warnings.push(`coordinator: ${msg.t} from rank ${rank} with no cpr initiator`);
        return;
    }
  }

  /** Stops the job: every rank that said hello and is alive is told to abort. */
  abortAll(code: string, message: string): void {
    if (this.phase === "aborted" || this.phase === "released") return;
    this.phase = "aborted";
    for (let r = 0; r < this.size; r++) {
      const link = this.links[r]!;
      if (link.up && this.net.node(rankNode(r, link.attempt)).alive) this.send(r, { t: "abort", code, message });
    }
  }
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
  private readonly invariants: ClusterInvariants;

  constructor(private readonly opts: SimClusterOptions) {
    if (opts.restartAll === true) throw new Error("restart-all (cpr) needs the cpr rank driver, which World does not have yet");
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
    this.coordinator = new SimCoordinator(this.net, opts.size, jobKey);
    this.ends = Array.from({ length: opts.size }, () => ({ kind: "running" }) as RankEnd);
    this.worlds = new Array(opts.size).fill(undefined);
    this.invariants = clusterInvariants(this);
  }

  get size(): number {
    return this.opts.size;
  }

  private place(rank: number, attempt: number): RankPlace {
    return {
      rank, size: this.opts.size, coordinator: COORDINATOR, job: `sim-${this.opts.seed}`, mode: this.opts.mode, store: "memory",
      attempt, transport: "tcp", runDir: undefined, faults: "", watchFd: undefined, heartbeatMs: 500, failureTimeoutMs: 5000,
    };
  }

  /** Starts one rank incarnation: join, run the program, finalize. */
  private launch(rank: number, attempt: number): void {
    const envPrng = this.prng.fork(0xe1, rank, attempt);
    const ctx: RankContext = { rank, size: this.opts.size, attempt, environment: () => envPrng.next() };
    const mine = (): boolean => this.coordinator.links[rank]!.attempt === attempt && this.ends[rank]!.kind === "running";
    const run = async (): Promise<unknown> => {
      const world = await World.joinWith(this.place(rank, attempt), (onControl) => simHost({
        net: this.net, rank, attempt, onControl,
        onExit: (code) => this.onRankDied(rank, attempt, { kind: "exited", code }),
        onWarn: (line) => this.rankWarnings.push(line),
      }));
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
    // A rank that finished (finalized, or failed and exited) keeps that end; exit is its last act.
    if (before.kind === "running" || end.kind === "crashed") this.ends[rank] = end;
    if (end.kind === "crashed" || (end.kind === "exited" && before.kind === "running")) {
      // Mode none (fail fast): a rank that dies before the job is released fails the job.
      this.coordinator.abortAll("LAUNCH_RANK_FAILED", `rank ${rank} died before finalizing`);
    }
  }

  private maybeCrash(): void {
    const max = this.opts.crashesMax ?? 0;
    if (this.crashes >= max || !this.faultPrng.chance(this.opts.crashChance ?? 0)) return;
    const live = this.ends.flatMap((e, r) => (e.kind === "running" && this.net.node(rankNode(r, this.coordinator.links[r]!.attempt)).alive ? [r] : []));
    if (live.length === 0) return;
    const victim = this.faultPrng.pick(live);
    this.crashes++;
    this.net.note(`crash rank ${victim}`);
    this.crash(victim);
  }

  /** Runs the job to its end (or to a bound). Throws on a broken invariant. */
  async run(): Promise<SimOutcome> {
    const stepsMax = this.opts.stepsMax ?? 200_000;
    const simMsMax = this.opts.simMsMax ?? 600_000;
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
    // An abort that reaches the coordinator after the release still fails the job: a rank found
    // an error (e.g. a stray collective message) in a job that was about to be called a success.
    const allReleased = this.coordinator.phase === "released" && this.ends.every((e) => e.kind === "finalized") && this.coordinator.aborts.length === 0;
    const status: SimOutcome["status"] = hang ? "hang" : allReleased ? "ok" : "failed";
    return {
      status,
      seed: this.opts.seed,
      results: this.coordinator.links.map((l) => l.result),
      ends: [...this.ends],
      aborts: this.coordinator.aborts,
      warnings: [...this.coordinator.warnings, ...this.rankWarnings],
      steps: this.net.steps,
      simMs: this.net.now,
      framesDelivered: this.net.framesDelivered,
      report: this.report(status),
    };
  }

  private report(status: string): string {
    const ends = this.ends.map((e, r) => `  rank ${r}: ${JSON.stringify(e, (_k, v) => (typeof v === "bigint" ? `${v}n` : v))?.slice(0, 300)}`).join("\n");
    return [
      `seed ${this.opts.seed}: ${status} after ${this.net.steps} steps, ${this.net.now} simulated ms, ${this.net.framesDelivered} frames`,
      `coordinator: ${this.coordinator.phase}; aborts: ${JSON.stringify(this.coordinator.aborts)}`,
      ends,
      `warnings:\n  ${[...this.coordinator.warnings, ...this.rankWarnings].slice(0, 10).join("\n  ")}`,
      `last events:\n${this.net.traceText()}`,
    ].join("\n");
  }
}
