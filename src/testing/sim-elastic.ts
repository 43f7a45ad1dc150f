/**
 * An elastic job in one process: real `World`s with the real elastic driver
 * (src/cpr/elastic) over the seeded simulated network, and the real coordinator machine of
 * elastic jobs (src/launch/elastic-membership.ts) with the launcher's policy in miniature:
 * a dead rank's slot is started again (as a rank that joins) within a restart budget, or not.
 *
 * Faults: random `kill -9`s of any rank process at any step — members in the middle of a
 * collective or a checkpoint, ranks waiting to join, a root sending its state, a joiner while it
 * receives it, ranks in the middle of a change — plus, with `targeted`, kills aimed at the
 * moments a change is most fragile (a joiner as its state is sent to it, a member as the world's
 * decision reaches it). A replay (`plan`) runs a recorded sequence of changes without faults.
 *
 * The loop is the simulator's: drain microtasks, check invariants, take ONE event, until
 * nothing can happen or a bound is hit (a hang).
 *
 * @example
 * const out = await new ElasticSim({ seed: 7, initial: 3, slots: 4, minNp: 1, maxNp: 4, program }).run();
 * const replay = await new ElasticSim({ seed: 7, initial: 3, slots: 3 + joins, minNp: 1, maxNp: 4, program, plan: out.changes, policy: "fifo" }).run();
 */
import { createHash } from "node:crypto";
import { elasticHook, TAG } from "../cpr/elastic/driver.ts";
import { isLifelineError } from "../errors.ts";
import { encodeValue } from "../mpi/codec.ts";
import type { CoordinatorToRank, RankToCoordinator } from "../mpi/control.ts";
import { DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_UNEXPECTED_BYTES, type RankPlace } from "../mpi/env.ts";
import { World } from "../mpi/world.ts";
import { HEADER_BYTES, Kind } from "../mpi/wire.ts";
import { ChangeRecorder, ElasticMembership, type ElasticEvent, type PlannedChange } from "../launch/elastic-membership.ts";
import type { CoordinatorEvent, MembershipEffect, MembershipInput } from "../launch/membership.ts";
import { makeData, type DataKind } from "./programs.ts";
import { mix32, Prng } from "./prng.ts";
import { simHost } from "./sim-host.ts";
import { type SimClusterOptions, simBulkBytesMin } from "./sim-cluster.ts";
import { COORDINATOR, drain, heartbeatNode, rankNode, SimNetwork } from "./sim-network.ts";

/** An elastic program: it finalizes itself (inside its loop, as elastic programs must). */
export type ElasticProgram = (world: World) => Promise<void>;

export interface ElasticSimOptions extends Pick<
  SimClusterOptions,
  "policy" | "delayMaxMs" | "advanceChance" | "stickyChance" | "crashChance" | "crashesMax" | "stepsMax" | "simMsMax" | "traceMax"
> {
  readonly seed: number;
  /** The first world's size (`-n`). */
  readonly initial: number;
  /** Rank processes at most (`--max-np`, or more in a replay); slots beyond `initial` start at once and join. */
  readonly slots: number;
  readonly minNp: number;
  readonly maxNp: number;
  /** `--elastic-timeout` (default 5 s). */
  readonly waitMs?: number;
  readonly program: ElasticProgram;
  /** Kills at the fragile moments of a change (see the file comment), at most `crashesMax` in all. */
  readonly targeted?: boolean;
  /** A dead slot is started again (a new rank that joins) this many times in all; default 0. */
  readonly restarts?: number;
  /** Delay before a dead slot's new process starts (default 30 ms). */
  readonly restartDelayMs?: number;
  /** Slots whose first process starts this long after the job (a rank that joins later). */
  readonly lateStartMs?: number;
  /** A replay of recorded changes (no faults then). */
  readonly plan?: readonly PlannedChange[];
}

export interface ElasticSimOutcome {
  /** ok: released; failed: the job stopped (too few ranks, a fatal error); hang: a bound was hit. */
  readonly status: "ok" | "failed" | "hang";
  readonly seed: number;
  /** The final world's results, by rank. */
  readonly results: readonly unknown[];
  /** The changes the run went through, as a replay takes them. */
  readonly changes: readonly PlannedChange[];
  /** Why the job stopped: the coordinator's elastic event or a rank's abort. */
  readonly failure: { readonly code: string; readonly message: string } | undefined;
  readonly crashes: number;
  readonly restarts: number;
  /** Worlds decided (rounds that completed), and how many rolled back. */
  readonly decided: number;
  readonly rollbacks: number;
  /** State transfers to joining ranks that reached them. */
  readonly transfers: number;
  /** Deaths in the middle of a change: of a participant while its round ran, of a joiner or the root before every joiner had its state. */
  readonly deathsInRound: number;
  readonly joinerDeaths: number;
  readonly rootDeaths: number;
  readonly steps: number;
  readonly simMs: number;
  readonly report: string;
}

const JOB_KEY_SALT = 0x5eed;

export class ElasticSim {
  readonly net: SimNetwork;
  private readonly machine: ElasticMembership;
  private readonly faults: Prng;
  private readonly attempts: number[];
  private readonly recorder: ChangeRecorder;
  private readonly channelKeys: Uint32Array;
  private crashes = 0;
  private restarts = 0;
  private decided = 0;
  private rollbacks = 0;
  private transfers = 0;
  private deathsInRound = 0;
  private joinerDeaths = 0;
  private rootDeaths = 0;
  /** The last decision's root and the joiners that have not entered its world yet. */
  private pendingJoin: { view: number; root: number; joiners: Set<number> } | undefined;
  /** Participants of the round in progress (news sent, no decision yet). */
  private roundOf: Set<number> | undefined;
  private released: number[] | undefined;
  private failure: { code: string; message: string } | undefined;
  private readonly rankErrors: string[] = [];
  private readonly warnings: string[] = [];
  /** Each slot's process: running, or how it ended. */
  private readonly ends: string[];
  private armedFor: number | undefined;
  /** A targeted kill to carry out at the next step: the node to kill. */
  private aimed: { slot: number; attempt: number } | undefined;

  constructor(private readonly opts: ElasticSimOptions) {
    const prng = new Prng(opts.seed);
    this.faults = prng.fork(0xfa17);
    this.net = new SimNetwork({
      prng: prng.fork(0x7e7),
      policy: opts.policy ?? "random",
      delayMaxMs: opts.delayMaxMs ?? 0,
      advanceChance: opts.advanceChance ?? 0,
      stickyChance: opts.stickyChance ?? 0,
      traceMax: opts.traceMax ?? 64,
    });
    const keyPrng = prng.fork(JOB_KEY_SALT);
    this.channelKeys = Uint32Array.from({ length: opts.slots * opts.slots }, () => keyPrng.next());
    this.attempts = new Array<number>(opts.slots).fill(0);
    this.ends = new Array<string>(opts.slots).fill("not started");
    this.recorder = new ChangeRecorder(Array.from({ length: opts.initial }, (_, slot) => ({ slot, attempt: 0 })));
    this.machine = new ElasticMembership({
      slots: opts.slots,
      initial: opts.initial,
      minNp: opts.minNp,
      maxNp: opts.maxNp,
      waitMs: opts.waitMs ?? 5_000,
      plan: opts.plan,
      channelKeys: this.channelKeys,
      mode: "elastic",
      identity: rankNode,
      heartbeatIdentity: heartbeatNode,
    });
    const node = this.net.addNode(COORDINATOR);
    node.onControl = (from, msg) => this.input({ kind: "message", identity: from, msg: msg as RankToCoordinator });
    this.input({ kind: "start", nowMs: 0 });
    this.net.dataObservers.push((d) => this.onData(d.src, d.dst, d.frames));
    this.net.controlObservers.push((_src, dst, msg) => {
      if (dst === COORDINATOR && msg.t === "elastic-switched" && this.pendingJoin?.view === msg.view) this.pendingJoin.joiners.delete(msg.rank);
    });
  }

  private input(input: MembershipInput): void {
    for (const eff of this.machine.step(input)) this.perform(eff);
    // The machine's deadline (its wait for ranks below --min-np) as a timer, as the Coordinator arms one.
    const due = this.machine.rendezvousDeadlineMs;
    if (due !== undefined && due !== this.armedFor) {
      this.armedFor = due;
      this.net.timer(COORDINATOR, Math.max(0, due - this.net.now), undefined, () => {
        if (this.armedFor === due) this.armedFor = undefined;
        this.input({ kind: "tick", nowMs: this.net.now });
      });
    }
  }

  private perform(eff: MembershipEffect): void {
    switch (eff.kind) {
      case "send":
        this.net.sendControl(COORDINATOR, eff.to, eff.msg);
        if (eff.msg.t === "elastic-view") this.roundOf = new Set([...eff.msg.members, ...eff.msg.leaving].map((m) => m.slot));
        if (this.opts.targeted === true && eff.msg.t === "elastic-decision") this.aimAtDecision(eff.msg);
        return;
      case "event":
        this.onEvent(eff.event);
        return;
      case "prepare-tables":
        return;
    }
  }

  private onEvent(ev: CoordinatorEvent): void {
    switch (ev.kind) {
      case "elastic":
        this.onElastic(ev.detail);
        return;
      case "rank-abort":
        this.failure ??= { code: ev.code, message: `rank slot ${ev.rank}: ${ev.message}` };
        this.input({ kind: "abort", code: ev.code, message: ev.message });
        return;
      case "warning":
        this.warnings.push(ev.message);
        return;
      case "bad-result":
      case "rendezvous-timeout":
      case "tables-failed":
        this.net.violation(`the elastic coordinator reported ${ev.kind}`);
        return;
      default:
        return;
    }
  }

  private onElastic(ev: ElasticEvent): void {
    this.recorder.add(ev);
    switch (ev.kind) {
      case "decided":
        this.decided++;
        this.roundOf = undefined;
        this.pendingJoin = ev.joiners.length === 0 ? undefined : { view: ev.view, root: ev.members[0]!.slot, joiners: new Set(ev.joiners) };
        if (ev.rollback) this.rollbacks++;
        this.net.note(
          `world ${ev.view} decided: ${ev.members.map((m) => `${m.slot}.${m.attempt}`).join(",")} from checkpoint ${ev.target}${ev.rollback ? " (rollback)" : ""}`,
        );
        return;
      case "switched":
        return;
      case "waiting":
        this.net.note(`waiting: ${ev.left} rank(s) left, fewer than ${ev.minNp}`);
        return;
      case "too-few":
        this.failure ??= { code: "LAUNCH_TOO_FEW", message: `${ev.left} rank(s) left, fewer than --min-np ${ev.minNp}, after ${ev.waitedMs} ms` };
        this.input({ kind: "abort", code: "LAUNCH_TOO_FEW", message: this.failure.message });
        return;
      case "failed":
        this.failure ??= { code: ev.code, message: ev.message };
        this.input({ kind: "abort", code: ev.code, message: ev.message });
        return;
      case "released":
        this.released = ev.members;
        return;
    }
  }

  // ---- processes ------------------------------------------------------------------------------

  private place(slot: number, attempt: number): RankPlace {
    return {
      rank: slot,
      size: this.opts.slots,
      coordinator: COORDINATOR,
      job: `sim-${this.opts.seed}`,
      mode: "elastic",
      store: "memory",
      attempt,
      transport: "tcp",
      maxMessageBytes: DEFAULT_MAX_MESSAGE_BYTES,
      maxUnexpectedBytes: DEFAULT_MAX_UNEXPECTED_BYTES,
      bulkBytesMin: simBulkBytesMin(this.opts.seed),
      runDir: undefined,
      faults: "",
      watchFd: undefined,
      heartbeatMs: 500,
      failureTimeoutMs: 5000,
    };
  }

  private launch(slot: number, attempt: number): void {
    this.ends[slot] = "running";
    const mine = (): boolean => this.attempts[slot] === attempt;
    const run = async (): Promise<void> => {
      const world = await World.joinWith(
        this.place(slot, attempt),
        (onControl) =>
          simHost({
            net: this.net,
            rank: slot,
            attempt,
            onControl: (msg: CoordinatorToRank) => onControl(msg),
            onExit: (code) => {
              if (mine()) this.ends[slot] = `exited ${code}`;
              this.died(slot, attempt, code === 0);
            },
            onWarn: (line) => this.rankErrors.push(line),
          }),
        { elastic: elasticHook() },
      );
      await this.opts.program(world);
    };
    run().then(
      () => {
        if (mine()) this.ends[slot] = "finalized";
      },
      (err: unknown) => {
        if (!mine() || !this.net.node(rankNode(slot, attempt)).alive) return;
        const e = err as { code?: unknown; message?: unknown };
        this.ends[slot] = `rejected ${String(e?.code)}: ${String(e?.message)}`;
        this.rankErrors.push(`slot ${slot}.${attempt}: ${String(e?.message ?? err)}`);
        if (!isLifelineError(err, "MPI_ABORTED")) this.kill(slot, attempt);
      },
    );
  }

  private kill(slot: number, attempt: number): void {
    const id = rankNode(slot, attempt);
    if (!this.net.node(id).alive) return;
    this.net.kill(id);
    if (this.attempts[slot] === attempt) this.ends[slot] = "killed";
    this.died(slot, attempt, false);
  }

  /** A rank process is gone: the launcher's policy. */
  private died(slot: number, attempt: number, clean: boolean): void {
    if (this.attempts[slot] !== attempt || this.machine.phase !== "running") return;
    // A rank that retired (a replayed change without it) or never got state ends cleanly.
    if (clean) return;
    if (this.roundOf?.has(slot) === true) this.deathsInRound++;
    const pj = this.pendingJoin;
    if (pj !== undefined && pj.joiners.size > 0) {
      if (pj.joiners.has(slot)) this.joinerDeaths++;
      if (pj.root === slot) this.rootDeaths++;
    }
    this.input({ kind: "rank-down", rank: slot, attempt, nowMs: this.net.now });
    if (this.opts.plan !== undefined) {
      this.failure ??= { code: "LAUNCH_RANK_FAILED", message: `slot ${slot} died in a replay` };
      this.input({ kind: "abort", code: "LAUNCH_RANK_FAILED", message: this.failure.message });
      return;
    }
    if (this.restarts >= (this.opts.restarts ?? 0)) return;
    this.restarts++;
    const next = attempt + 1;
    this.net.timer(COORDINATOR, this.opts.restartDelayMs ?? 30, undefined, () => {
      if (this.machine.phase !== "running") return;
      this.attempts[slot] = next;
      this.input({ kind: "restart-rank", rank: slot, attempt: next });
      this.launch(slot, next);
    });
  }

  // ---- faults ------------------------------------------------------------------------------------

  private maybeCrash(): void {
    if (this.opts.plan !== undefined || this.machine.phase !== "running" || this.crashes >= (this.opts.crashesMax ?? 0)) return;
    const aimed = this.aimed;
    this.aimed = undefined;
    if (aimed !== undefined && this.attempts[aimed.slot] === aimed.attempt && this.net.node(rankNode(aimed.slot, aimed.attempt)).alive) {
      this.crashes++;
      this.net.note(`targeted crash of slot ${aimed.slot}`);
      this.kill(aimed.slot, aimed.attempt);
      return;
    }
    if (!this.faults.chance(this.opts.crashChance ?? 0)) return;
    const live = this.attempts.flatMap((a, s) => (this.ends[s] === "running" && this.net.node(rankNode(s, a)).alive ? [s] : []));
    if (live.length === 0) return;
    const victim = this.faults.pick(live);
    this.crashes++;
    this.net.note(`crash slot ${victim}`);
    this.kill(victim, this.attempts[victim]!);
  }

  /** A state transfer is delivered: counted, and now and then (`targeted`) its joiner or its root is killed right after. */
  private onData(src: string, dst: string, frames: readonly Buffer[]): void {
    const first = frames[0];
    if (first === undefined || first.length < HEADER_BYTES || first[5] !== Kind.protocol || first.readInt32LE(16) !== TAG.state) return;
    this.transfers++;
    if (this.opts.targeted !== true || !this.faults.chance(0.3)) return;
    const m = /r(\d+)\.(\d+)$/.exec(this.faults.chance(0.5) ? dst : src);
    if (m !== null) this.aimed = { slot: Number(m[1]), attempt: Number(m[2]) };
  }

  /** A decision goes out: now and then, kill one of its members before it applies it. */
  private aimAtDecision(msg: Extract<CoordinatorToRank, { t: "elastic-decision" }>): void {
    if (!this.faults.chance(0.15)) return;
    const all = [msg.root, ...msg.joiners];
    const slot = this.faults.pick(all);
    this.aimed = { slot, attempt: this.attempts[slot]! };
  }

  // ---- the run -----------------------------------------------------------------------------------

  async run(): Promise<ElasticSimOutcome> {
    const stepsMax = this.opts.stepsMax ?? 100_000;
    const simMsMax = this.opts.simMsMax ?? 600_000;
    for (let s = 0; s < this.opts.slots; s++) {
      const late = s >= this.opts.initial ? (this.opts.lateStartMs ?? 0) : 0;
      if (late > 0) this.net.timer(COORDINATOR, late, undefined, () => this.launch(s, 0));
      else this.launch(s, 0);
    }
    let hang = false;
    for (;;) {
      await drain();
      if (this.net.violations.length > 0) break;
      if (this.net.callbackErrors.length > 0) break;
      if (this.net.steps >= stepsMax || this.net.now > simMsMax) {
        hang = true;
        break;
      }
      this.maybeCrash();
      if (!this.net.step()) break;
    }
    await drain();
    const problems = [
      ...this.net.violations,
      ...this.net.callbackErrors.map((e) => `the receive path of ${e.node} threw: ${(e.error as Error)?.stack ?? String(e.error)}`),
    ];
    const released = this.released;
    const links = this.machine.links;
    const ok = released !== undefined && this.machine.phase === "released" && this.failure === undefined && problems.length === 0;
    const status = hang ? "hang" : ok ? "ok" : "failed";
    return {
      status,
      seed: this.opts.seed,
      results: released === undefined ? [] : released.map((s) => links[s]!.result),
      changes: this.recorder.changes(),
      failure: problems.length > 0 ? { code: "SIM_INVARIANT", message: problems.join("\n") } : this.failure,
      crashes: this.crashes,
      restarts: this.restarts,
      decided: this.decided,
      rollbacks: this.rollbacks,
      transfers: this.transfers,
      deathsInRound: this.deathsInRound,
      joinerDeaths: this.joinerDeaths,
      rootDeaths: this.rootDeaths,
      steps: this.net.steps,
      simMs: this.net.now,
      report: this.report(status, problems),
    };
  }

  private report(status: string, problems: readonly string[]): string {
    return [
      `seed ${this.opts.seed}: ${status} after ${this.net.steps} steps, ${this.net.now} simulated ms; ${this.crashes} crash(es), ${this.restarts} restart(s), ${this.decided} world(s) decided`,
      `coordinator: ${this.machine.phase}; failure: ${JSON.stringify(this.failure)}`,
      `changes: ${JSON.stringify(this.recorder.changes())}`,
      ...this.ends.map((e, s) => `  slot ${s} (attempt ${this.attempts[s]}): ${e.slice(0, 300)}`),
      ...problems.map((p) => `problem: ${p}`),
      `rank errors:\n  ${this.rankErrors.slice(0, 12).join("\n  ")}`,
      `warnings:\n  ${this.warnings.slice(0, 8).join("\n  ")}`,
      `last events:\n${this.net.traceText()}`,
    ].join("\n");
  }
}

// ---- random elastic programs ----------------------------------------------------------------------

/** One collective of a step: its kind, the data contributed, and a salt for roots and data. */
export interface ElasticOp {
  readonly kind: "barrier" | "bcast" | "reduce" | "allreduce" | "gather" | "scatter" | "allgather" | "alltoall";
  readonly data: DataKind;
  readonly salt: number;
}

/** A data-parallel program that runs in any world: the same collectives every step, over whatever ranks there are. */
export interface ElasticProgramSpec {
  readonly seed: number;
  readonly steps: number;
  readonly ops: readonly ElasticOp[];
  /** Bootstrap collectives before the loop (a rank that joins gets their results with its state). */
  readonly boot: boolean;
}

export function generateElasticProgram(prng: Prng): ElasticProgramSpec {
  const kinds: ElasticOp["kind"][] = ["barrier", "bcast", "reduce", "allreduce", "allreduce", "gather", "scatter", "allgather", "alltoall"];
  const datas: DataKind[] = ["int", "float", "string", "object", "f64", "i32"];
  const n = prng.rangeInclusive(1, 3);
  return {
    seed: prng.next(),
    steps: prng.rangeInclusive(1, 8),
    ops: Array.from({ length: n }, () => {
      const kind = prng.pick(kinds);
      // Reductions of objects have no op; of strings, a non-commutative user op.
      const data = kind === "reduce" || kind === "allreduce" ? prng.pick<DataKind>(["int", "float", "string", "f64", "i32", "bigF64"]) : prng.pick(datas);
      return { kind, data, salt: prng.next() };
    }),
    boot: prng.chance(0.5),
  };
}

function digest(values: readonly unknown[]): string {
  const h = createHash("sha256");
  for (const v of values) h.update(encodeValue(v === undefined ? "<undefined>" : v));
  return h.digest("hex").slice(0, 16);
}

interface ElasticState {
  step: number;
  acc: string;
}

/**
 * The interpreter: the elastic loop as a program writes it — restore() at the top, the steps, a
 * collective after them and finalize(), all inside a try that goes round again on
 * MPI_WORLD_CHANGED. The state (step, digest of every result so far) is the same on every rank;
 * results that differ between ranks are made common by an allgather of their digests. Every
 * contribution depends on the state, the step, the rank and the size, so a change of the world
 * at another checkpoint, or another renumbering, gives other results.
 */
export function elasticProgramOf(spec: ElasticProgramSpec): ElasticProgram {
  return async (world) => {
    let base = "start";
    if (spec.boot) {
      const seed = await world.bcast(world.rank === 0 ? spec.seed : -1, 0, { bootstrap: "seed" });
      const width = await world.allreduce(world.rank + 1, "max", { bootstrap: "width" });
      base = digest([seed, width]);
    }
    for (;;) {
      const saved = await world.restore<ElasticState>();
      const s: ElasticState = saved?.state ?? { step: 0, acc: base };
      try {
        while (s.step < spec.steps) {
          const { rank, size } = world;
          const key = (salt: number, who: number): number => mix32(salt, s.step, who, size, Number.parseInt(s.acc.slice(0, 8), 16));
          const common: unknown[] = [];
          const local: unknown[] = [];
          for (const op of spec.ops) {
            const root = (s.step + op.salt) % size;
            const mine = makeData(op.data, 3, key(op.salt, rank));
            switch (op.kind) {
              case "barrier":
                await world.barrier();
                break;
              case "bcast":
                common.push(await world.bcast(mine, root));
                break;
              case "allreduce":
                common.push(await world.allreduce(mine, op.data === "string" ? (a: string, b: string) => `${a}|${b}` : "sum"));
                break;
              case "reduce":
                local.push(await world.reduce(mine, op.data === "string" ? (a: string, b: string) => `${a}|${b}` : "sum", root));
                break;
              case "gather":
                local.push(await world.gather(mine, root));
                break;
              case "scatter":
                local.push(
                  await world.scatter(rank === root ? Array.from({ length: size }, (_, i) => makeData(op.data, 2, key(op.salt, i))) : undefined, root),
                );
                break;
              case "allgather":
                common.push(await world.allgather(mine));
                break;
              case "alltoall":
                local.push(await world.alltoall(Array.from({ length: size }, (_, d) => makeData(op.data, 2, key(op.salt, rank * 64 + d)))));
                break;
            }
          }
          const all = await world.allgather(digest(local));
          s.acc = digest([s.acc, size, common, all]);
          s.step++;
          await world.checkpoint(s);
        }
        const total = await world.allreduce(world.rank + 1, "sum");
        await world.finalize({ rank: world.rank, size: world.size, acc: s.acc, total });
        return;
      } catch (err) {
        if (!isLifelineError(err, "MPI_WORLD_CHANGED")) throw err;
      }
    }
  };
}

/** The slots a replay of `changes` needs: the first world, and one new process per rank that joined. */
export function replaySlots(initial: number, changes: readonly PlannedChange[]): number {
  return initial + changes.reduce((n, c) => n + c.joined, 0);
}

/**
 * One swarm seed: a random program on a random job (2-4 ranks at first, maybe a spare slot,
 * a random --min-np), random kills (some aimed at changes), random restarts; then the replay of
 * the changes it went through, without faults, under the reference schedule.
 */
export async function runElasticSeed(seed: number): Promise<{ spec: ElasticProgramSpec; out: ElasticSimOutcome; replay: ElasticSimOutcome | undefined }> {
  const prng = new Prng(seed);
  const initial = prng.rangeInclusive(2, 4);
  const slots = initial + (prng.chance(0.4) ? 1 : 0);
  const spec = generateElasticProgram(prng.fork(1));
  const program = elasticProgramOf(spec);
  const knobs = prng.fork(2);
  const out = await new ElasticSim({
    seed,
    initial,
    slots,
    minNp: knobs.rangeInclusive(1, initial),
    maxNp: slots,
    waitMs: 2_000,
    program,
    delayMaxMs: knobs.pick([0, 5, 20, 100]),
    advanceChance: knobs.pick([0.05, 0.2, 0.4]),
    stickyChance: knobs.pick([0, 0.5]),
    crashChance: knobs.pick([0, 0.005, 0.02, 0.05]),
    crashesMax: knobs.rangeInclusive(1, 3),
    targeted: knobs.chance(0.5),
    restarts: knobs.pick([0, 1, 2, 3]),
    restartDelayMs: knobs.pick([5, 30, 200]),
    lateStartMs: knobs.pick([0, 20, 150]),
  }).run();
  if (out.status !== "ok") return { spec, out, replay: undefined };
  const replay = await new ElasticSim({
    seed,
    initial,
    slots: replaySlots(initial, out.changes),
    minNp: 1,
    maxNp: replaySlots(initial, out.changes),
    program,
    policy: "fifo",
    plan: out.changes,
  }).run();
  return { spec, out, replay };
}
