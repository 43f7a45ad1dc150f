/**
 * The simulated network and clock of the deterministic simulator.
 *
 * Nodes are rank incarnations (`sim://r<rank>.<attempt>`) and the coordinator. Between two
 * nodes there is one FIFO channel per direction and per plane (data frames, bulk data frames
 * (the transport's second connection), control messages); a node's `defer`red callbacks form
 * one more FIFO queue. One {@link SimNetwork.step} performs exactly ONE event, chosen by the
 * seeded PRNG among everything that could happen next: deliver the head frame of any ready
 * channel (so any interleaving across channels, FIFO within one), run a node's next deferred
 * callback, or advance the simulated clock to the next timer or delayed frame. Nothing here
 * reads a wall clock or arms a real timer, so a seed replays exactly.
 *
 * Invariants checked on every delivery (a violation throws at once, inside the step that
 * broke it): frames on a channel are delivered in send order, each exactly once, and never to
 * or from a dead node (except the frames a node queued before it exited: see
 * {@link SimNetwork.exit}); a dead node never sends, defers or arms a timer.
 *
 * Partitions ({@link SimNetwork.cut}): a group of nodes cut off from the rest. Frames between
 * the two sides stay queued (TCP keeps them, ZeroMQ reconnects) and flow again once the cut
 * heals; nodes on one side talk to each other as before.
 *
 * @example
 * const net = new SimNetwork({ prng, policy: "random", delayMaxMs: 5, advanceChance: 0.01 });
 * while (net.step()) await drain(); // one event, then let the woken promises run
 */
import assert from "node:assert/strict";
import { type ControlMessage, decodeControl, encodeControl } from "../mpi/control.ts";
import type { Prng } from "./prng.ts";

/** Node id of the coordinator. */
export const COORDINATOR = "coordinator";

/** A rank incarnation's node id (also its data endpoint). */
export function rankNode(rank: number, attempt: number): string {
  return `sim://r${rank}.${attempt}`;
}

/** The node id of a rank incarnation's watchdog (its heartbeats and leases travel there). */
export function heartbeatNode(rank: number, attempt: number): string {
  return `hb:${rankNode(rank, attempt)}`;
}

/**
 * Lets every promise woken by the last event run to completion before the next event.
 *
 * Why `setImmediate` and not N × `await Promise.resolve()`: Node drains the whole microtask
 * queue (including microtasks queued by microtasks) before it runs the next macrotask, so when
 * a `setImmediate` callback runs, every promise continuation reachable from the last event has
 * run — a fixed count of awaits could stop short in a deep `await` chain. The order in which
 * those microtasks run is fixed by the code alone, and nothing in a simulated run schedules
 * real I/O or timers, so the state after `drain()` depends only on the events so far.
 */
export function drain(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/** What a channel between two nodes carries. */
export type Plane = "data" | "bulk" | "control";

export type SchedulePolicy =
  /** Any ready event, chosen by the PRNG. */
  | "random"
  /** The oldest ready event first (global send order), time advances only when idle: the reference run. */
  | "fifo";

export interface SimNetworkOptions {
  readonly prng: Prng;
  readonly policy: SchedulePolicy;
  /** Each data frame is held back 0..delayMaxMs of simulated time (0: deliverable at once). */
  readonly delayMaxMs?: number;
  /** Chance per step of advancing the clock although other events are ready (timers fire "early"). */
  readonly advanceChance?: number;
  /**
   * Advancing the clock early never leaves a ready frame or callback waiting longer than this
   * (default 1000 ms): real networks and event loops deliver within bounded time, and without a
   * bound one early jump could fire a 2-minute timeout while its answer sits in a queue.
   */
  readonly latencyMaxMs?: number;
  /** Chance of staying on the channel chosen last (bursts from one peer); else uniform. */
  readonly stickyChance?: number;
  /** Events kept for a failure report. */
  readonly traceMax?: number;
}

interface Frame {
  /** Global order of enqueueing (the reference schedule delivers by it). */
  readonly gid: number;
  /** Position on its channel, 0-based. */
  readonly seq: number;
  readonly deliverAtMs: number;
  readonly data: Buffer[] | undefined;
  readonly control: Buffer | undefined;
}

interface Channel {
  readonly key: string;
  readonly src: string;
  readonly dst: string;
  readonly plane: Plane;
  readonly queue: Frame[];
  nextSeq: number;
  /** Sequence number the next delivery must carry. */
  expectSeq: number;
  /** The sender exited with these frames queued: they are still delivered (see exit). */
  orphaned: boolean;
}

interface Deferred {
  readonly gid: number;
  readonly atMs: number;
  readonly fn: () => void;
}

export interface SimNode {
  readonly id: string;
  alive: boolean;
  /** Set by transport.start(): data frames are delivered only from then on. */
  onFrames: ((frames: Buffer[]) => void) | undefined;
  onError: ((err: unknown) => void) | undefined;
  /** Coordinator → rank messages (ranks), or rank → coordinator (the coordinator node). */
  onControl: ((from: string, msg: ControlMessage) => void) | undefined;
  dataClosed: boolean;
  controlClosed: boolean;
  readonly defers: Deferred[];
}

interface SimTimerEntry {
  readonly id: number;
  readonly node: string;
  dueMs: number;
  readonly periodMs: number | undefined;
  readonly fn: () => void;
  stopped: boolean;
}

/** One performed event, for traces. */
export type SimEvent =
  | { readonly kind: "deliver"; readonly channel: string; readonly seq: number; readonly atMs: number }
  | { readonly kind: "defer"; readonly node: string; readonly atMs: number }
  | { readonly kind: "timer"; readonly node: string; readonly id: number; readonly atMs: number }
  | { readonly kind: "advance"; readonly atMs: number }
  | { readonly kind: "external"; readonly what: string; readonly atMs: number };

/** A data delivery, as observers (invariants) see it. */
export interface DataDelivery {
  readonly src: string;
  readonly dst: string;
  readonly frames: readonly Buffer[];
  /** The bulk plane's (the transport's second connection), or the data plane's. */
  readonly bulk: boolean;
}

type Ready = { kind: "channel"; ch: Channel; gid: number; sinceMs: number } | { kind: "defer"; node: SimNode; gid: number; sinceMs: number };

export class SimNetwork {
  private nowMs = 0;
  private gid = 0;
  private timerIds = 0;
  private readonly nodes = new Map<string, SimNode>();
  private readonly channels = new Map<string, Channel>();
  /** Partitioned nodes by the group they are cut off in (nodes not listed: the main side). */
  private readonly cutGroup = new Map<string, number>();
  private cuts = 0;
  private timers: SimTimerEntry[] = [];
  private lastChannel: string | undefined;
  private readonly trace: SimEvent[] = [];
  private readonly traceMax: number;
  /** Errors thrown by a node's receive callback: in production these end the read loop, here they are findings. */
  readonly callbackErrors: { node: string; error: unknown }[] = [];
  /** Observers of every control message as it is sent. */
  readonly controlObservers: ((src: string, dst: string, msg: ControlMessage) => void)[] = [];
  /** Observers of every data delivery (run before the frames reach the node). */
  readonly dataObservers: ((d: DataDelivery) => void)[] = [];
  steps = 0;
  framesDelivered = 0;
  /** Of those, on the bulk plane. */
  bulkFramesDelivered = 0;
  framesDropped = 0;

  constructor(private readonly opts: SimNetworkOptions) {
    this.traceMax = opts.traceMax ?? 64;
  }

  get now(): number {
    return this.nowMs;
  }

  get prng(): Prng {
    return this.opts.prng;
  }

  addNode(id: string): SimNode {
    assert(!this.nodes.has(id), `node ${id} added twice`);
    const node: SimNode = {
      id,
      alive: true,
      onFrames: undefined,
      onError: undefined,
      onControl: undefined,
      dataClosed: false,
      controlClosed: false,
      defers: [],
    };
    this.nodes.set(id, node);
    return node;
  }

  /** True while node `id` exists and was not killed (a send to it is dropped otherwise). */
  isAlive(id: string): boolean {
    return this.nodes.get(id)?.alive === true;
  }

  node(id: string): SimNode {
    const n = this.nodes.get(id);
    assert(n !== undefined, `unknown node ${id}`);
    return n;
  }

  private channel(src: string, dst: string, plane: Plane): Channel {
    const key = `${plane}:${src}>${dst}`;
    let ch = this.channels.get(key);
    if (ch === undefined) {
      ch = { key, src, dst, plane, queue: [], nextSeq: 0, expectSeq: 0, orphaned: false };
      this.channels.set(key, ch);
    }
    return ch;
  }

  /** Invariant violations seen so far; each also threw where it happened. */
  readonly violations: string[] = [];

  /** Records a broken invariant and throws it (the record survives a caller that swallows it). */
  violation(message: string): never {
    this.violations.push(message);
    throw new assert.AssertionError({ message });
  }

  private assertLive(node: SimNode, what: string): void {
    if (!node.alive) this.violation(`dead node ${node.id} tried to ${what} (a killed process runs no code)`);
  }

  /**
   * Queues a data frame (copied, as a socket would) on src→dst, on the data plane or on the
   * bulk one (the transport's second connection). Frames to a dead node are dropped.
   */
  sendData(src: string, dst: string, frames: readonly (Buffer | Uint8Array)[], plane: "data" | "bulk" = "data"): void {
    const from = this.node(src);
    this.assertLive(from, "send data");
    if (from.dataClosed) this.violation(`${src} sent data after closing its transport`);
    const to = this.nodes.get(dst);
    if (to === undefined || !to.alive || to.dataClosed) {
      this.framesDropped++;
      return;
    }
    const ch = this.channel(src, dst, plane);
    const delay = this.opts.policy === "random" && (this.opts.delayMaxMs ?? 0) > 0 ? this.opts.prng.index(this.opts.delayMaxMs! + 1) : 0;
    // A frame may not become deliverable before the one ahead of it (FIFO): clamp to the tail's time.
    const tail = ch.queue[ch.queue.length - 1];
    const at = Math.max(this.nowMs + delay, tail?.deliverAtMs ?? 0);
    ch.queue.push({ gid: this.gid++, seq: ch.nextSeq++, deliverAtMs: at, data: frames.map((f) => Buffer.from(f)), control: undefined });
  }

  /** Queues a control message (encoded, so it must survive the real codec). */
  sendControl(src: string, dst: string, msg: ControlMessage): void {
    const from = this.node(src);
    this.assertLive(from, "send a control message");
    const to = this.nodes.get(dst);
    if (from.controlClosed || to === undefined || !to.alive || to.controlClosed) {
      this.framesDropped++;
      return;
    }
    for (const obs of this.controlObservers) obs(src, dst, msg);
    const ch = this.channel(src, dst, "control");
    ch.queue.push({ gid: this.gid++, seq: ch.nextSeq++, deliverAtMs: this.nowMs, data: undefined, control: encodeControl(msg) });
  }

  defer(nodeId: string, fn: () => void): void {
    const node = this.node(nodeId);
    this.assertLive(node, "defer a callback");
    node.defers.push({ gid: this.gid++, atMs: this.nowMs, fn });
  }

  /** Arms a simulated timer; `periodMs` makes it repeat. */
  timer(nodeId: string, delayMs: number, periodMs: number | undefined, fn: () => void): { stop(): void } {
    const node = this.node(nodeId);
    this.assertLive(node, "arm a timer");
    assert(delayMs >= 0 && (periodMs === undefined || periodMs > 0), `bad timer ${delayMs}/${periodMs}`);
    const t: SimTimerEntry = { id: this.timerIds++, node: nodeId, dueMs: this.nowMs + delayMs, periodMs, fn, stopped: false };
    this.timers.push(t);
    return {
      stop: () => {
        t.stopped = true;
      },
    };
  }

  /**
   * Kills a node like `kill -9`: it runs no more code; its queued outgoing frames, the frames
   * queued to it, its deferred callbacks and its timers are gone.
   */
  kill(nodeId: string): void {
    this.end(nodeId, "kill");
  }

  /**
   * Ends a node like a process that exits with frames still in its sockets' kernel buffers:
   * it runs no more code and frames to it vanish, but the frames it queued are still delivered
   * (after a partition heals, for instance), as a closed TCP connection still sends its data.
   */
  exit(nodeId: string): void {
    this.end(nodeId, "exit");
  }

  private end(nodeId: string, how: "kill" | "exit"): void {
    const node = this.node(nodeId);
    if (!node.alive) return;
    node.alive = false;
    node.defers.length = 0;
    for (const ch of this.channels.values()) {
      if (how === "exit" && ch.src === nodeId) {
        ch.orphaned = ch.queue.length > 0;
      } else if (ch.src === nodeId || ch.dst === nodeId) {
        this.framesDropped += ch.queue.length;
        ch.expectSeq = ch.nextSeq;
        ch.queue.length = 0;
      }
    }
    for (const t of this.timers) if (t.node === nodeId) t.stopped = true;
    this.record({ kind: "external", what: `${how} ${nodeId}`, atMs: this.nowMs });
  }

  /**
   * Cuts `nodes` off from every node outside them (a host's or a rank's links fail) until
   * {@link heal}; returns the cut's id. Nodes created later are on the main side.
   */
  cut(nodes: Iterable<string>): number {
    const id = ++this.cuts;
    const cut: string[] = [];
    for (const n of nodes) {
      assert(!this.cutGroup.has(n), `node ${n} is cut off already`);
      this.cutGroup.set(n, id);
      cut.push(n);
    }
    this.record({ kind: "external", what: `cut ${cut.join(" ")} off (cut ${id})`, atMs: this.nowMs });
    return id;
  }

  /** Ends cut `id`: its frames flow again. */
  heal(id: number): void {
    for (const [n, g] of this.cutGroup) if (g === id) this.cutGroup.delete(n);
    this.record({ kind: "external", what: `heal cut ${id}`, atMs: this.nowMs });
  }

  /** True while `nodeId` is cut off from the main side. */
  isCut(nodeId: string): boolean {
    return this.cutGroup.has(nodeId);
  }

  /** Frames queued from `src` to `dst` (a socket's send queue, for a high-water mark). */
  queued(src: string, dst: string, plane: Plane): number {
    return this.channels.get(`${plane}:${src}>${dst}`)?.queue.length ?? 0;
  }

  /** Records an event caused from outside the network (crash, restart) in the trace. */
  note(what: string): void {
    this.record({ kind: "external", what, atMs: this.nowMs });
  }

  private record(ev: SimEvent): void {
    this.trace.push(ev);
    if (this.trace.length > this.traceMax) this.trace.shift();
  }

  /** The last events, oldest first, one per line. */
  traceText(): string {
    return this.trace
      .map((e) => {
        switch (e.kind) {
          case "deliver":
            return `${e.atMs}ms deliver ${e.channel} #${e.seq}`;
          case "defer":
            return `${e.atMs}ms defer ${e.node}`;
          case "timer":
            return `${e.atMs}ms timer ${e.node} #${e.id}`;
          case "advance":
            return `${e.atMs}ms advance`;
          case "external":
            return `${e.atMs}ms ${e.what}`;
        }
      })
      .join("\n");
  }

  private deliverable(ch: Channel): boolean {
    const head = ch.queue[0];
    if (head === undefined || head.deliverAtMs > this.nowMs) return false;
    if (this.cutGroup.get(ch.src) !== this.cutGroup.get(ch.dst)) return false;
    const dst = this.nodes.get(ch.dst)!;
    // Data waits until the receiver's transport started reading (frames queue up, as in zmq).
    // A closed receiver still "takes" its frames, to drop them (see deliver).
    return ch.plane === "control" ? dst.controlClosed || dst.onControl !== undefined : dst.dataClosed || dst.onFrames !== undefined;
  }

  private readyEvents(): Ready[] {
    const out: Ready[] = [];
    for (const ch of this.channels.values())
      if (this.deliverable(ch)) out.push({ kind: "channel", ch, gid: ch.queue[0]!.gid, sinceMs: ch.queue[0]!.deliverAtMs });
    for (const node of this.nodes.values())
      if (node.alive && node.defers.length > 0) out.push({ kind: "defer", node, gid: node.defers[0]!.gid, sinceMs: node.defers[0]!.atMs });
    return out;
  }

  /** Earliest future moment something becomes possible: a timer, or a delayed frame. */
  private nextTimeMs(): number | undefined {
    let t: number | undefined;
    for (const timer of this.timers) if (!timer.stopped && (t === undefined || timer.dueMs < t)) t = timer.dueMs;
    for (const ch of this.channels.values()) {
      const head = ch.queue[0];
      if (head !== undefined && head.deliverAtMs > this.nowMs && (t === undefined || head.deliverAtMs < t)) t = head.deliverAtMs;
    }
    return t;
  }

  /** True when nothing at all can happen any more (no ready event, no timer, no delayed frame). */
  idle(): boolean {
    return this.readyEvents().length === 0 && this.nextTimeMs() === undefined;
  }

  /**
   * Performs one event. Returns false when nothing can happen any more. Callbacks run
   * synchronously here; the caller then drains the microtasks they woke.
   */
  step(): boolean {
    this.timers = this.timers.filter((t) => !t.stopped);
    const ready = this.readyEvents();
    const next = this.nextTimeMs();
    const advance =
      next !== undefined &&
      (ready.length === 0 ||
        (this.opts.policy === "random" &&
          this.opts.prng.chance(this.opts.advanceChance ?? 0) &&
          next - Math.min(...ready.map((r) => r.sinceMs)) <= (this.opts.latencyMaxMs ?? 1000)));
    if (advance) {
      this.steps++;
      return this.advanceTo(next);
    }
    if (ready.length === 0) return false;
    this.steps++;
    let ev: Ready;
    if (this.opts.policy === "fifo") {
      ev = ready.reduce((a, b) => (b.gid < a.gid ? b : a));
    } else {
      const sticky =
        this.lastChannel !== undefined && this.opts.prng.chance(this.opts.stickyChance ?? 0)
          ? ready.find((r) => r.kind === "channel" && r.ch.key === this.lastChannel)
          : undefined;
      ev = sticky ?? this.opts.prng.pick(ready);
    }
    if (ev.kind === "defer") {
      const d = ev.node.defers.shift()!;
      this.record({ kind: "defer", node: ev.node.id, atMs: this.nowMs });
      this.guard(ev.node.id, d.fn);
    } else {
      this.lastChannel = ev.ch.key;
      this.deliver(ev.ch);
    }
    return true;
  }

  /** Moves the clock to `t` and fires the earliest timer due by then (if any). */
  private advanceTo(t: number): boolean {
    if (t > this.nowMs) this.nowMs = t;
    let due: SimTimerEntry | undefined;
    for (const timer of this.timers) {
      if (!timer.stopped && timer.dueMs <= this.nowMs && (due === undefined || timer.dueMs < due.dueMs || (timer.dueMs === due.dueMs && timer.id < due.id)))
        due = timer;
    }
    if (due === undefined) {
      this.record({ kind: "advance", atMs: this.nowMs });
      return true;
    }
    if (due.periodMs !== undefined) due.dueMs += due.periodMs;
    else due.stopped = true;
    this.record({ kind: "timer", node: due.node, id: due.id, atMs: this.nowMs });
    const node = this.node(due.node);
    if (!node.alive) this.violation(`timer ${due.id} of dead node ${due.node} fired`);
    this.guard(node.id, due.fn);
    return true;
  }

  private deliver(ch: Channel): void {
    const frame = ch.queue.shift()!;
    // FIFO and exactly-once on the channel: the n-th delivery is the n-th frame sent.
    if (frame.seq !== ch.expectSeq) this.violation(`channel ${ch.key}: delivered frame #${frame.seq}, expected #${ch.expectSeq}`);
    ch.expectSeq++;
    const src = this.node(ch.src);
    const dst = this.node(ch.dst);
    if ((!src.alive && !ch.orphaned) || !dst.alive) this.violation(`frame on ${ch.key} delivered with a dead end`);
    if (ch.queue.length === 0) ch.orphaned = false;
    if (ch.plane === "control" ? dst.controlClosed : dst.dataClosed) {
      // The receiver closed its socket: a closed socket receives nothing.
      this.framesDropped++;
      this.record({ kind: "deliver", channel: `${ch.key} (closed, dropped)`, seq: frame.seq, atMs: this.nowMs });
      return;
    }
    this.framesDelivered++;
    if (ch.plane === "bulk") this.bulkFramesDelivered++;
    this.record({ kind: "deliver", channel: ch.key, seq: frame.seq, atMs: this.nowMs });
    if (ch.plane === "control") {
      const msg = decodeControl(frame.control);
      this.guard(dst.id, () => dst.onControl!(ch.src, msg));
    } else {
      const frames = frame.data!;
      for (const obs of this.dataObservers) obs({ src: ch.src, dst: ch.dst, frames, bulk: ch.plane === "bulk" });
      this.guard(dst.id, () => dst.onFrames!(frames));
    }
  }

  /** Runs a node's callback; a throw is a finding (production would end the node's read loop). */
  private guard(nodeId: string, fn: () => void): void {
    try {
      fn();
    } catch (error) {
      this.callbackErrors.push({ node: nodeId, error });
      const node = this.nodes.get(nodeId);
      if (node?.alive && node.onError !== undefined) node.onError(error);
    }
  }
}
