/**
 * A {@link Host} over the simulated network: what one rank process sees of the outside world
 * in the deterministic simulator. The communicator (`World`) runs unchanged on it.
 *
 * - transport: sends go on the simulated FIFO channel to the peer's current endpoint and
 *   resolve at once (the transport "holds" the frames); arrivals are delivered one at a time by
 *   the network's scheduler;
 * - control: FIFO to and from the simulated coordinator, through the real control codec;
 * - now/after/every/defer: the simulated clock and timers;
 * - exit: the rank's node dies (as a process that exits);
 * - with `watchdog`: the rank's watchdog thread as a node of its own, which heartbeats to the
 *   coordinator and ends the rank once no lease came for the failure timeout (as
 *   src/launch/watchdog-worker.ts does for a rank without the launcher's pipe);
 * - `accepted`: a frame of a peer's incarnation the rank already knows to be replaced never
 *   reaches the program (a violation of the simulation's invariants otherwise).
 *
 * @example
 * const world = await World.joinWith(place, (onControl) => simHost({ net, rank: 1, attempt: 0, onControl, onExit }));
 */
import { type CoordinatorToRank, EXIT_COORDINATOR_LOST } from "../mpi/control.ts";
import type { Host, Timer } from "../mpi/host.ts";
import type { Header } from "../mpi/wire.ts";
import { COORDINATOR, heartbeatNode, rankNode, type SimNetwork } from "./sim-network.ts";

/** The watchdog's heartbeat socket keeps this many beats queued at most (its send high-water mark). */
const HEARTBEAT_QUEUE_MAX = 4;

export interface SimHostOptions {
  readonly net: SimNetwork;
  readonly rank: number;
  readonly attempt: number;
  readonly onControl: (msg: CoordinatorToRank) => void;
  /** Called when the rank calls `host.exit(code)`, after its node died. */
  readonly onExit: (code: number) => void;
  /** Diagnostic lines (kept by the cluster for failure reports). */
  readonly onWarn: (line: string) => void;
  /**
   * A frame of a peer incarnation the rank was told is dead (`peer-down`) but not yet that it
   * was replaced went to the program. Recovery protocols may take such a frame (it was sent
   * before the death, and what it carries is what the successor will send again); the cluster
   * counts them.
   */
  readonly onDeadFrame?: () => void;
  /**
   * A data send to a peer incarnation that died does not finish until the rank connects that
   * peer's successor (or closes its transport), and then fails: a ZeroMQ socket's send once
   * its queue to the dead peer is at the high-water mark. Without it such sends are dropped
   * at once, as while the queue has room. `"until-close"`: it does not fail when the successor
   * is connected either, only when the transport closes (a transport that never gives up on a
   * queued message: then only the protocol's abandon ends a collective waiting in such a send).
   */
  readonly blockSendsToDead?: boolean | "until-close";
  /** A send began to wait so (the cluster counts them). */
  readonly onSendStuck?: () => void;
  /** The rank's watchdog: heartbeats every `heartbeatMs`, the lease lapses after `failureTimeoutMs`. */
  readonly watchdog?: { readonly heartbeatMs: number; readonly failureTimeoutMs: number; readonly onLost: (silentMs: number) => void } | undefined;
}

/** What a rank has been told about its peers' incarnations: the newest it knows of, the newest known dead. */
interface PeerKnowledge {
  readonly current: number[];
  readonly dead: number[];
}

/** Creates the rank incarnation's node and a Host bound to it. */
export function simHost(opts: SimHostOptions): Host {
  const { net, rank, attempt } = opts;
  const id = rankNode(rank, attempt);
  const node = net.addNode(id);
  /** Current endpoint of each peer, as the coordinator's table and `peer` messages say. */
  const peers = new Map<number, string>();
  const closed = (): Error => new Error(`simulated transport of ${id} is closed`);
  const known: PeerKnowledge = { current: [], dead: [] };
  node.onControl = (_from, msg) => {
    learn(known, msg as CoordinatorToRank);
    // The table joins the rank to its job: init() tells its watchdog (src/index.ts).
    if (msg.t === "table") dog?.joined();
    opts.onControl(msg as CoordinatorToRank);
  };
  const dog = opts.watchdog === undefined ? undefined : startWatchdog(opts, opts.watchdog);
  /** Sends stuck on a dead peer incarnation (blockSendsToDead), by peer. */
  const stuck = new Map<number, ((err: Error) => void)[]>();
  const unstick = (peer: number, err: Error): void => {
    const waits = stuck.get(peer);
    stuck.delete(peer);
    for (const fail of waits ?? []) fail(err);
  };
  const sendOn = (peer: number, frames: readonly (Buffer | Uint8Array)[], plane: "data" | "bulk"): Promise<void> => {
    if (node.dataClosed) return Promise.reject(closed());
    const ep = peers.get(peer);
    if (ep === undefined) return Promise.reject(new Error(`${id}: send to rank ${peer}, which was never connected`));
    if (opts.blockSendsToDead !== undefined && opts.blockSendsToDead !== false && !net.isAlive(ep)) {
      opts.onSendStuck?.();
      return new Promise<void>((_, reject) => {
        const waits = stuck.get(peer) ?? [];
        waits.push(reject);
        stuck.set(peer, waits);
      });
    }
    net.sendData(id, ep, frames, plane);
    return Promise.resolve();
  };
  return {
    transport: {
      endpoint: id,
      start(onFrames, onError) {
        node.onFrames = onFrames;
        node.onError = onError;
      },
      connect(peer, endpoint) {
        if (opts.blockSendsToDead !== "until-close" && peers.get(peer) !== endpoint && stuck.has(peer))
          unstick(peer, new Error(`${id}: rank ${peer} restarted while a send to it was queued`));
        peers.set(peer, endpoint);
      },
      send: (peer, frames) => sendOn(peer, frames, "data"),
      // The second connection: a FIFO of its own, interleaved with the first at random. It
      // copies at once, so the program's memory is free when the send resolves.
      sendBulk: (peer, frames) => sendOn(peer, frames, "bulk"),
      close() {
        node.dataClosed = true;
        node.onFrames = undefined;
        for (const peer of [...stuck.keys()]) unstick(peer, closed());
        return Promise.resolve();
      },
    },
    control: {
      send(msg) {
        if (node.controlClosed) return Promise.reject(closed());
        net.sendControl(id, COORDINATOR, msg);
        return Promise.resolve();
      },
      close() {
        node.controlClosed = true;
        return Promise.resolve();
      },
    },
    now: () => net.now,
    defer: (fn) => net.defer(id, fn),
    every: (ms, fn): Timer => net.timer(id, ms, ms, fn),
    after: (ms, fn): Timer => net.timer(id, ms, undefined, fn),
    exit: (code) => {
      net.kill(id);
      opts.onExit(code);
    },
    warn: (line) => opts.onWarn(line),
    pid: 10_000 + rank * 100 + attempt,
    accepted: (h: Header) => {
      const newer = known.current[h.source] ?? 0;
      if (h.attempt < newer) net.violation(`${id} accepted a frame of rank ${h.source} attempt ${h.attempt}, knowing attempt ${newer} replaced it`);
      const dead = known.dead[h.source];
      if (dead !== undefined && h.attempt <= dead) opts.onDeadFrame?.();
    },
  };
}

function learn(known: PeerKnowledge, msg: CoordinatorToRank): void {
  const newer = (rank: number, attempt: number): void => {
    known.current[rank] = Math.max(known.current[rank] ?? 0, attempt);
  };
  switch (msg.t) {
    case "table":
      msg.attempts.forEach((a, r) => newer(r, a));
      for (const r of msg.down ?? []) known.dead[r] = Math.max(known.dead[r] ?? -1, msg.attempts[r] ?? 0);
      return;
    case "peer":
      newer(msg.rank, msg.attempt);
      return;
    case "peer-down":
      known.dead[msg.rank] = Math.max(known.dead[msg.rank] ?? -1, msg.attempt);
      return;
    default:
      return;
  }
}

/**
 * The watchdog thread of a rank started without the launcher's pipe: it beats to the
 * coordinator over a link of its own and, once a lease has come, ends the rank (exit
 * {@link EXIT_COORDINATOR_LOST}) when none came for the failure timeout.
 */
function startWatchdog(opts: SimHostOptions, dog: NonNullable<SimHostOptions["watchdog"]>): { joined(): void } {
  const { net, rank, attempt } = opts;
  const id = heartbeatNode(rank, attempt);
  const node = net.addNode(id);
  let leaseMs: number | undefined;
  node.onControl = (_from, msg) => {
    if (msg.t === "lease") leaseMs = net.now;
  };
  const beat = (): void => {
    // While the coordinator is unreachable, beats are dropped, not hoarded.
    if (net.queued(id, COORDINATOR, "control") < HEARTBEAT_QUEUE_MAX) net.sendControl(id, COORDINATOR, { t: "heartbeat", rank, attempt });
  };
  beat();
  net.timer(id, dog.heartbeatMs, dog.heartbeatMs, beat);
  const checkMs = Math.max(10, Math.min(dog.heartbeatMs, dog.failureTimeoutMs / 4));
  net.timer(id, checkMs, checkMs, () => {
    if (leaseMs === undefined || net.now - leaseMs < dog.failureTimeoutMs) return;
    const silentMs = net.now - leaseMs;
    opts.onWarn(
      `lifeline: rank ${rank}: the coordinator has not answered for ${silentMs} ms (--failure-timeout); ending this rank (exit ${EXIT_COORDINATOR_LOST})`,
    );
    // The process exits: what its sockets still hold goes out, nothing more runs.
    net.exit(id);
    net.exit(rankNode(rank, attempt));
    dog.onLost(silentMs);
    opts.onExit(EXIT_COORDINATOR_LOST);
  });
  return {
    joined: () => {
      leaseMs ??= net.now;
    },
  };
}
