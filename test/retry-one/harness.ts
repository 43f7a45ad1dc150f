/**
 * An in-process harness for the retry-one machines: N {@link RetryOneRank}s, their programs
 * (synchronous generators, so a whole job is one deterministic loop), a message network with
 * FIFO channels per (sender, receiver) and seeded interleaving across channels, a coordinator
 * that reports deaths and restarts, simulated time, and crashes (seeded at random, at Rabit's
 * `mock=rank,version,seqno,ndeath` coordinates, or at protocol triggers).
 *
 * Collectives are modelled abstractly but with their real failure shapes: an allreduce
 * completes on a rank once it holds every rank's contribution (so a rank can finish while a
 * peer that died mid-way never will), a bcast completes at its root at once and elsewhere on
 * the root's message. Frames carry the sender's incarnation and view, and frames addressed
 * to a dead incarnation are lost; a dead rank's frames in flight may still arrive (stale).
 *
 * Invariants checked as the run goes: every rank (and every incarnation) sees the same
 * result for a given collective index and bootstrap key; the programs check every result
 * against its known value (as Rabit's test programs do). A run ends `ok` (every rank
 * finalized), `failed` (a machine reported an error), or `hang` (a step bound).
 *
 * The shared simulator in src/testing runs real Worlds; these machines have no driver yet,
 * so this harness drives them directly, with the simulator's seeded PRNG.
 */
import { RetryOneRank } from "../../src/cpr/retry-one/rank.ts";
import { Prng } from "../../src/testing/prng.ts";
import type { CollIdentity, Lazy, ProtoFrame, RankEffect, RestoredValue } from "../../src/cpr/retry-one/types.ts";

/** What a program yields; it is resumed with the call's result. */
export type Op =
  | { readonly op: "boot"; readonly key: string; readonly ident: CollIdentity; readonly value: number[] | null }
  | { readonly op: "restore" }
  | { readonly op: "coll"; readonly ident: CollIdentity; readonly value: number[] | null }
  /** `key` names the global's content (null: no global), as the driver's checksum does. */
  | { readonly op: "ckpt"; readonly state: Lazy; readonly global: Lazy; readonly key: string | null }
  | { readonly op: "final"; readonly result: unknown };

export interface ProgramContext {
  readonly rank: number;
  readonly size: number;
  readonly attempt: number;
  /** Counts calls of lazy checkpoint functions (state and global separately). */
  readonly stats: { stateThunks: number; globalThunks: number };
}

export type Program = (ctx: ProgramContext) => Generator<Op, void, unknown>;

/** Rabit's failure coordinate: `rank` dies at (version, seqno) on its attempt `ndeath`. */
export interface Mock {
  readonly rank: number;
  readonly version: number;
  readonly seqno: number;
  readonly ndeath: number;
}

export function parseMocks(spec: string): Mock[] {
  return spec
    .split("+")
    .map((s) => s.trim())
    .filter((s) => s !== "")
    .map((s) => {
      const [rank, version, seqno, ndeath] = s.split(",").map((x) => Number(x));
      return { rank: rank!, version: version!, seqno: seqno!, ndeath: ndeath! };
    });
}

/** Crash a rank at a protocol moment (inside a checkpoint, while serving a restore). */
export type Trigger =
  | { readonly kind: "after-replica"; readonly rank: number; readonly attempt: number; readonly version: number }
  | { readonly kind: "serving-restore"; readonly rank: number; readonly attempt: number }
  /** The rank dies as it calls the bootstrap collective `key`. */
  | { readonly kind: "at-boot"; readonly rank: number; readonly attempt: number; readonly key: string }
  /** The restarted rank dies as its checkpoint arrives (killed again during its restore). */
  | { readonly kind: "receiving-restore"; readonly rank: number; readonly attempt: number };

export interface SimConfig {
  readonly seed: number;
  readonly size: number;
  readonly replicas: number;
  /** Each rank's host, for host-aware replica placement (default: one host). */
  readonly groups?: readonly number[] | undefined;
  readonly program: Program;
  readonly mocks?: readonly Mock[];
  readonly triggers?: readonly Trigger[];
  /** Random crashes: at most this many, with this chance per event. */
  readonly randomCrashes?: number;
  readonly crashChance?: number;
  /**
   * Random crashes keep the ranks that are dead or still restoring at most this many
   * (default: replicas, so that the replicas always cover them).
   */
  readonly impairedMax?: number;
  /** Ranks that are never restarted (--max-restarts exhausted). */
  readonly noRestart?: readonly number[];
  readonly restartDelayMs?: readonly [number, number];
  readonly failureTimeoutMs?: number;
  /** Chance that a dead rank's frames in flight still arrive. */
  readonly staleChance?: number;
  readonly resultEntriesMax?: number;
  readonly stepsMax?: number;
  /**
   * The coordinator sends no `peer-down`, only `peer` once the rank runs again (today's
   * launcher): survivors learn of a death only from the restart.
   */
  readonly noPeerDown?: boolean;
}

export interface SimFailure {
  readonly rank: number;
  readonly attempt: number;
  readonly code: string;
  readonly message: string;
  readonly atMs: number;
}

export interface SimOutcome {
  readonly status: "ok" | "failed" | "hang";
  readonly seed: number;
  readonly results: unknown[];
  readonly failures: SimFailure[];
  readonly crashes: number;
  readonly restarts: number;
  readonly steps: number;
  readonly simMs: number;
  /** When the first crash that was never followed by a restart happened. */
  readonly lastCrashMs: number;
  readonly stats: { stateThunks: number; globalThunks: number };
  readonly replayed: number;
  /** Results the machines dropped at checkpoints and let World reuse (poisoned here). */
  readonly recycled: number;
  /** Protocol frames sent, by type (summary, xfer, replica, stored), and wire collective frames. */
  readonly frames: Record<string, number>;
  readonly trace: string[];
}

type Msg =
  | { readonly kind: "proto"; readonly from: number; readonly attempt: number; readonly toAttempt: number; readonly frame: ProtoFrame }
  | {
      readonly kind: "coll";
      readonly from: number;
      readonly attempt: number;
      readonly toAttempt: number;
      readonly viewId: number;
      readonly wireSeq: number;
      readonly value: number[];
    };

type Ctl = { readonly kind: "peer-down" | "peer-up"; readonly rank: number; readonly attempt: number; readonly toAttempt: number };

interface Exec {
  readonly ident: CollIdentity;
  readonly wireSeq: number;
  readonly viewId: number;
  readonly got: Map<number, number[]>;
}

class Node {
  alive = true;
  started = false;
  resume: { value: unknown } | null = null;
  waiting: Op | null = null;
  /** Restored without its global (`globalPending`): restore() returns when the `global` effect comes. */
  restoredWithout: RestoredValue["value"] | null = null;
  waitingKey: string | null = null;
  finalized = false;
  finalResult: unknown = undefined;
  exec: Exec | null = null;
  readonly inbox = new Map<number, Map<number, { viewId: number; value: number[] }>>();
  heldWire: Extract<Msg, { kind: "coll" }>[] = [];
  failed = false;
  constructor(
    readonly rank: number,
    readonly attempt: number,
    readonly machine: RetryOneRank,
    readonly gen: Generator<Op, void, unknown>,
  ) {}
}

const reduce = (op: string, a: number[], b: number[]): number[] => {
  if (a.length !== b.length) throw new Error(`harness: allreduce of lengths ${a.length} and ${b.length}`);
  if (op === "allreduce:sum") return a.map((x, i) => x + b[i]!);
  if (op === "allreduce:max") return a.map((x, i) => Math.max(x, b[i]!));
  throw new Error(`harness: unknown op ${op}`);
};

export class RetryOneSim {
  private readonly prng: Prng;
  private readonly nodes: Node[] = [];
  private readonly coordAttempts: number[];
  private readonly restartAt = new Map<number, number>();
  private readonly channels = new Map<string, Msg[]>();
  private readonly ctl = new Map<number, Ctl[]>();
  private now = 0;
  private crashes = 0;
  private randomCrashes = 0;
  private restarts = 0;
  private replayed = 0;
  private recycled = 0;
  private lastCrashMs = -1;
  private readonly failures: SimFailure[] = [];
  private readonly seen = new Map<string, string>();
  private readonly stats = { stateThunks: 0, globalThunks: 0 };
  private readonly trace: string[] = [];
  private readonly frames: Record<string, number> = { summary: 0, xfer: 0, replica: 0, rack: 0, stored: 0, ask: 0, done: 0, coll: 0 };
  private readonly mocks: readonly Mock[];
  private readonly triggers: readonly Trigger[];

  constructor(private readonly cfg: SimConfig) {
    this.prng = new Prng(cfg.seed);
    this.coordAttempts = new Array<number>(cfg.size).fill(0);
    this.mocks = cfg.mocks ?? [];
    this.triggers = cfg.triggers ?? [];
    for (let r = 0; r < cfg.size; r++) this.nodes.push(this.makeNode(r, 0));
  }

  private makeNode(rank: number, attempt: number): Node {
    const machine = new RetryOneRank({
      rank,
      size: this.cfg.size,
      attempt,
      attempts: [...this.coordAttempts],
      replicas: this.cfg.replicas,
      groups: this.cfg.groups,
      failureTimeoutMs: this.cfg.failureTimeoutMs ?? 5_000,
      resultEntriesMax: this.cfg.resultEntriesMax,
      nowMs: this.now,
    });
    const gen = this.cfg.program({ rank, size: this.cfg.size, attempt, stats: this.stats });
    return new Node(rank, attempt, machine, gen);
  }

  private log(line: string): void {
    this.trace.push(`${this.now}ms ${line}`);
    if (this.trace.length > 400) this.trace.shift();
  }

  run(): SimOutcome {
    const stepsMax = this.cfg.stepsMax ?? 400_000;
    let steps = 0;
    let status: SimOutcome["status"] = "hang";
    for (; steps < stepsMax; steps++) {
      if (this.failures.length > 0) {
        status = "failed";
        break;
      }
      if (this.nodes.every((n) => n.alive && n.finalized) && this.restartAt.size === 0) {
        status = "ok";
        break;
      }
      this.stepOnce();
    }
    return {
      status,
      seed: this.cfg.seed,
      results: this.nodes.map((n) => n.finalResult),
      failures: this.failures,
      crashes: this.crashes,
      restarts: this.restarts,
      steps,
      simMs: this.now,
      lastCrashMs: this.lastCrashMs,
      stats: this.stats,
      replayed: this.replayed,
      recycled: this.recycled,
      frames: this.frames,
      trace: this.trace,
    };
  }

  private stepOnce(): void {
    const p = this.prng;
    // Crashes first, with a small chance per event.
    if (this.randomCrashes < (this.cfg.randomCrashes ?? 0) && p.chance(this.cfg.crashChance ?? 0.003)) {
      const impaired = this.nodes.filter((n) => !n.alive || n.machine.isRestoring).length;
      const live = this.nodes.filter((n) => n.alive && !n.failed);
      if (impaired < (this.cfg.impairedMax ?? this.cfg.replicas) && live.length > 0) {
        this.randomCrashes++;
        this.crash(p.pick(live), "random");
        return;
      }
    }
    const runnable = this.nodes.filter((n) => n.alive && !n.failed && !n.finalized && (!n.started || n.resume !== null));
    const chans = [...this.channels.entries()].filter(([, q]) => q.length > 0);
    const ctls = [...this.ctl.entries()].filter(([, q]) => q.length > 0);
    const restartDue = [...this.restartAt.entries()].filter(([, t]) => t <= this.now);
    const choices: (() => void)[] = [];
    for (const n of runnable) choices.push(() => this.advance(n));
    for (const [key, q] of chans) {
      choices.push(() => this.deliver(key, q));
      choices.push(() => this.deliver(key, q));
    }
    for (const [rank, q] of ctls) choices.push(() => this.deliverCtl(rank, q));
    for (const [rank] of restartDue) choices.push(() => this.restart(rank));
    if (choices.length === 0 || p.chance(0.02)) {
      this.tick();
      return;
    }
    p.pick(choices)();
  }

  private tick(): void {
    const waits = [...this.restartAt.values()].filter((t) => t > this.now);
    const quiet = this.nodes.every((n) => !n.alive || n.failed || (n.resume === null && n.started));
    this.now += quiet && waits.length > 0 ? Math.max(1, Math.min(...waits) - this.now) : this.prng.rangeInclusive(1, 50);
    for (const n of this.nodes) if (n.alive && !n.failed) this.handle(n, n.machine.step({ kind: "tick", nowMs: this.now }));
  }

  // ---- ranks --------------------------------------------------------------------------------

  private advance(n: Node): void {
    let r: IteratorResult<Op, void>;
    if (!n.started) {
      n.started = true;
      r = n.gen.next();
    } else {
      const v = n.resume!.value;
      n.resume = null;
      r = n.gen.next(v);
    }
    if (r.done === true) throw new Error(`rank ${n.rank}: program ended without a final op`);
    const op = r.value;
    if (op.op === "coll" || op.op === "ckpt") {
      const { version, seqno } = n.machine.progress;
      if (this.mocks.some((m) => m.rank === n.rank && m.version === version && m.seqno === seqno && m.ndeath === n.attempt)) {
        this.crash(n, `mock=${n.rank},${version},${seqno},${n.attempt} at ${op.op}`);
        return;
      }
    }
    if (op.op === "boot" && this.triggers.some((t) => t.kind === "at-boot" && t.rank === n.rank && t.attempt === n.attempt && t.key === op.key)) {
      this.crash(n, `trigger: in bootstrap collective ${op.key}`);
      return;
    }
    n.waiting = op;
    switch (op.op) {
      case "boot":
        n.waitingKey = `boot:${op.key}`;
        this.handle(n, n.machine.step({ kind: "boot", key: op.key, ident: op.ident }));
        return;
      case "restore":
        n.waitingKey = null;
        this.handle(n, n.machine.step({ kind: "restore" }));
        return;
      case "coll": {
        n.waitingKey = `coll:${n.machine.progress.index}`;
        this.handle(n, n.machine.step({ kind: "collective", ident: op.ident }));
        return;
      }
      case "ckpt":
        n.waitingKey = null;
        this.handle(
          n,
          n.machine.step({ kind: "checkpoint", state: op.state, global: op.global, key: op.key, consumed: new Array<number>(this.cfg.size).fill(0) }),
        );
        return;
      case "final":
        n.finalized = true;
        n.finalResult = op.result;
        this.handle(n, n.machine.step({ kind: "finalize" }));
        return;
    }
  }

  private handle(n: Node, effects: readonly RankEffect[]): void {
    for (const e of effects) {
      if (!n.alive) return;
      switch (e.kind) {
        case "send": {
          if (e.frame.t === "xfer" && e.frame.part.kind === "restore" && this.fires({ kind: "serving-restore", rank: n.rank, attempt: n.attempt })) {
            this.crash(n, "trigger: serving a restore");
            return;
          }
          this.push(n.rank, e.to, { kind: "proto", from: n.rank, attempt: n.attempt, toAttempt: n.machine.view[e.to]!, frame: e.frame });
          if (e.frame.t === "replica" && this.fires({ kind: "after-replica", rank: n.rank, attempt: n.attempt, version: e.frame.version })) {
            this.crash(n, `trigger: inside checkpoint ${e.frame.version} after one replica`);
            return;
          }
          break;
        }
        case "execute":
          this.log(`rank ${n.rank}.${n.attempt} execute ${n.waitingKey} wire ${e.wireSeq} view ${e.viewId} floor ${e.purgeBelow}`);
          this.startExec(n, e.ident, e.wireSeq, e.viewId, e.purgeBelow);
          break;
        case "abandon":
          this.log(`rank ${n.rank}.${n.attempt} abandon wire ${e.wireSeq}`);
          n.exec = null;
          break;
        case "complete": {
          const key = n.waitingKey!;
          const got = JSON.stringify(e.result);
          const before = this.seen.get(key);
          if (before === undefined) this.seen.set(key, got);
          else if (before !== got) {
            throw new Error(`invariant: ${key} gave ${got} on rank ${n.rank} (attempt ${n.attempt}) but ${before} before\n${this.trace.slice(-60).join("\n")}`);
          }
          if (e.replayed) this.replayed++;
          this.log(`rank ${n.rank}.${n.attempt} complete ${key} ${got}${e.replayed ? " (replayed)" : ""}`);
          n.waiting = null;
          n.resume = { value: [...(e.result as number[])] }; // the program gets a copy, as from World
          break;
        }
        case "recycle":
          // World reuses this memory for later results: poison it, so a result that is still
          // served or in flight after this shows up as a different result (the invariant above).
          for (const r of e.results) if (Array.isArray(r)) r.fill(Number.NaN);
          this.recycled += e.results.length;
          break;
        case "restored":
          this.log(
            `rank ${n.rank}.${n.attempt} restored version ${e.restored.value?.version ?? 0}${e.restored.value?.globalPending === true ? " (its global later)" : ""}`,
          );
          if (e.restored.value?.globalPending === true) {
            n.restoredWithout = e.restored.value;
            break;
          }
          n.waiting = null;
          n.resume = { value: e.restored.value };
          break;
        case "global": {
          const v = n.restoredWithout!;
          n.restoredWithout = null;
          n.waiting = null;
          n.resume = { value: { state: v.state, global: e.global, version: v.version } };
          this.log(`rank ${n.rank}.${n.attempt} got the global of version ${v.version}`);
          break;
        }
        case "gate":
        case "peer-safe":
          // No point-to-point messages here: nothing to hold back or to drop.
          break;
        case "checkpointed":
          n.waiting = null;
          n.resume = { value: undefined };
          break;
        case "fail":
          n.failed = true;
          this.failures.push({ rank: n.rank, attempt: n.attempt, code: e.code, message: e.message, atMs: this.now });
          this.log(`rank ${n.rank}.${n.attempt} FAILED ${e.code}: ${e.message}`);
          return;
      }
    }
  }

  private fires(t: Trigger): boolean {
    return this.triggers.some(
      (x) =>
        x.kind === t.kind &&
        x.rank === t.rank &&
        x.attempt === t.attempt &&
        (x.kind !== "after-replica" || t.kind !== "after-replica" || x.version === t.version),
    );
  }

  // ---- collectives on the wire -----------------------------------------------------------------

  private startExec(n: Node, ident: CollIdentity, wireSeq: number, viewId: number, purgeBelow: number): void {
    // As World must: frames of abandoned executions (older views, or below the floor) go.
    for (const [seq, box] of [...n.inbox]) {
      if (seq < purgeBelow) n.inbox.delete(seq);
      else for (const [from, v] of [...box]) if (v.viewId !== viewId) box.delete(from);
    }
    const exec: Exec = { ident, wireSeq, viewId, got: new Map() };
    n.exec = exec;
    const value = (n.waiting as { value: number[] | null }).value;
    const send = (v: number[]): void => {
      for (let to = 0; to < this.cfg.size; to++) {
        if (to === n.rank) continue;
        this.push(n.rank, to, { kind: "coll", from: n.rank, attempt: n.attempt, toAttempt: n.machine.view[to]!, viewId, wireSeq, value: v });
      }
    };
    if (ident.op === "bcast") {
      if (ident.root === n.rank) {
        exec.got.set(n.rank, value!);
        send(value!);
      }
    } else {
      exec.got.set(n.rank, value!);
      send(value!);
    }
    const early = n.inbox.get(wireSeq);
    if (early !== undefined) {
      for (const [from, v] of early) exec.got.set(from, v.value);
      n.inbox.delete(wireSeq);
    }
    this.checkExec(n);
  }

  private checkExec(n: Node): void {
    const exec = n.exec;
    if (exec === null) return;
    let result: number[] | undefined;
    if (exec.ident.op === "bcast") {
      result = exec.got.get(exec.ident.root);
    } else if (exec.got.size === this.cfg.size) {
      let acc = exec.got.get(0)!;
      for (let r = 1; r < this.cfg.size; r++) acc = reduce(exec.ident.op, acc, exec.got.get(r)!);
      result = acc;
    }
    if (result === undefined) return;
    n.exec = null;
    // The machine keeps its own copy, as World's encoded one (a bcast's result is the root's value).
    this.handle(n, n.machine.step({ kind: "executed", result: [...result], bytes: result.length * 8 }));
  }

  private acceptWire(n: Node, m: Extract<Msg, { kind: "coll" }>): void {
    const verdict = n.machine.classifyWire(m.from, m.attempt, m.viewId, m.wireSeq);
    if (verdict === "drop") return;
    if (verdict === "hold") {
      n.heldWire.push(m);
      return;
    }
    if (n.exec !== null && n.exec.wireSeq === m.wireSeq && n.exec.viewId === m.viewId) {
      n.exec.got.set(m.from, m.value);
      this.checkExec(n);
      return;
    }
    const box = n.inbox.get(m.wireSeq) ?? new Map<number, { viewId: number; value: number[] }>();
    box.set(m.from, { viewId: m.viewId, value: m.value });
    n.inbox.set(m.wireSeq, box);
  }

  // ---- network and coordinator -------------------------------------------------------------------

  private push(from: number, to: number, m: Msg): void {
    const kind = m.kind === "coll" ? "coll" : m.frame.t;
    this.frames[kind] = (this.frames[kind] ?? 0) + 1;
    const target = this.nodes[to]!;
    if (!target.alive && target.attempt === m.toAttempt) return; // sent to a dead process: lost
    const key = `${from}>${to}`;
    const q = this.channels.get(key) ?? [];
    q.push(m);
    this.channels.set(key, q);
  }

  private deliver(key: string, q: Msg[]): void {
    const m = q.shift()!;
    const to = Number(key.split(">")[1]);
    const n = this.nodes[to]!;
    if (!n.alive || n.failed || n.attempt !== m.toAttempt) return; // addressed to a dead incarnation
    if (m.kind === "coll") {
      this.acceptWire(n, m);
      return;
    }
    if (m.frame.t === "xfer" && m.frame.part.kind === "restore" && this.fires({ kind: "receiving-restore", rank: n.rank, attempt: n.attempt })) {
      this.crash(n, "trigger: killed again while its checkpoint arrives");
      return;
    }
    this.handle(n, n.machine.step({ kind: "frame", from: m.from, attempt: m.attempt, frame: m.frame }));
  }

  private deliverCtl(rank: number, q: Ctl[]): void {
    const c = q.shift()!;
    const n = this.nodes[rank]!;
    if (!n.alive || n.failed || n.attempt !== c.toAttempt) return;
    this.handle(n, n.machine.step({ kind: c.kind, rank: c.rank, attempt: c.attempt, nowMs: this.now }));
    if (c.kind === "peer-up" && n.alive) {
      const held = n.heldWire;
      n.heldWire = [];
      for (const m of held) this.acceptWire(n, m);
    }
  }

  private sendCtl(to: number, c: Omit<Ctl, "toAttempt">): void {
    const n = this.nodes[to]!;
    if (!n.alive) return;
    const q = this.ctl.get(to) ?? [];
    q.push({ ...c, toAttempt: n.attempt });
    this.ctl.set(to, q);
  }

  private crash(n: Node, why: string): void {
    this.log(`CRASH rank ${n.rank}.${n.attempt} (${why})`);
    n.alive = false;
    n.exec = null;
    this.crashes++;
    this.lastCrashMs = this.now;
    for (const [key, q] of this.channels) {
      const [from, to] = key.split(">").map(Number);
      if (to === n.rank) q.length = 0;
      else if (from === n.rank && !this.prng.chance(this.cfg.staleChance ?? 0.5)) q.length = 0;
    }
    this.ctl.delete(n.rank);
    if (this.cfg.noPeerDown !== true) {
      for (let r = 0; r < this.cfg.size; r++) if (r !== n.rank) this.sendCtl(r, { kind: "peer-down", rank: n.rank, attempt: n.attempt });
    }
    if (!(this.cfg.noRestart ?? []).includes(n.rank)) {
      const [lo, hi] = this.cfg.restartDelayMs ?? [1, 200];
      this.restartAt.set(n.rank, this.now + this.prng.rangeInclusive(lo, hi));
    }
  }

  private restart(rank: number): void {
    this.restartAt.delete(rank);
    this.restarts++;
    const attempt = this.coordAttempts[rank]! + 1;
    this.coordAttempts[rank] = attempt;
    const n = this.makeNode(rank, attempt);
    this.nodes[rank] = n;
    this.log(`RESTART rank ${rank}.${attempt}`);
    for (let r = 0; r < this.cfg.size; r++) {
      if (r === rank) continue;
      this.sendCtl(r, { kind: "peer-up", rank, attempt });
      // The coordinator's table for the new process says who is down right now.
      const other = this.nodes[r]!;
      if (!other.alive && this.cfg.noPeerDown !== true) this.sendCtl(rank, { kind: "peer-down", rank: r, attempt: other.attempt });
    }
  }
}

/** Type guard for RestoredValue in programs. */
export function restoredOf<S, G>(v: unknown): { state: S; global: G; version: number } | undefined {
  return v as RestoredValue["value"] as { state: S; global: G; version: number } | undefined;
}
