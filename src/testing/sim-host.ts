/**
 * A {@link Host} over the simulated network: what one rank process sees of the outside world
 * in the deterministic simulator. The communicator (`World`) runs unchanged on it.
 *
 * - transport: sends go on the simulated FIFO channel to the peer's current endpoint and
 *   resolve at once (the transport "holds" the frames); arrivals are delivered one at a time by
 *   the network's scheduler;
 * - control: FIFO to and from the simulated coordinator, through the real control codec;
 * - now/after/every/defer: the simulated clock and timers;
 * - exit: the rank's node dies (as a process that exits).
 *
 * @example
 * const world = await World.joinWith(place, (onControl) => simHost({ net, rank: 1, attempt: 0, onControl, onExit }));
 */
import type { CoordinatorToRank } from "../mpi/control.ts";
import type { Host, Timer } from "../mpi/host.ts";
import { COORDINATOR, rankNode, type SimNetwork } from "./sim-network.ts";

export interface SimHostOptions {
  readonly net: SimNetwork;
  readonly rank: number;
  readonly attempt: number;
  readonly onControl: (msg: CoordinatorToRank) => void;
  /** Called when the rank calls `host.exit(code)`, after its node died. */
  readonly onExit: (code: number) => void;
  /** Diagnostic lines (kept by the cluster for failure reports). */
  readonly onWarn: (line: string) => void;
}

/** Creates the rank incarnation's node and a Host bound to it. */
export function simHost(opts: SimHostOptions): Host {
  const { net, rank, attempt } = opts;
  const id = rankNode(rank, attempt);
  const node = net.addNode(id);
  node.onControl = (_from, msg) => opts.onControl(msg as CoordinatorToRank);
  /** Current endpoint of each peer, as the coordinator's table and `peer` messages say. */
  const peers = new Map<number, string>();
  const closed = (): Error => new Error(`simulated transport of ${id} is closed`);
  return {
    transport: {
      endpoint: id,
      start(onFrames, onError) {
        node.onFrames = onFrames;
        node.onError = onError;
      },
      connect(peer, endpoint) {
        peers.set(peer, endpoint);
      },
      send(peer, frames) {
        if (node.dataClosed) return Promise.reject(closed());
        const ep = peers.get(peer);
        if (ep === undefined) return Promise.reject(new Error(`${id}: send to rank ${peer}, which was never connected`));
        net.sendData(id, ep, frames);
        return Promise.resolve();
      },
      close() {
        node.dataClosed = true;
        node.onFrames = undefined;
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
  };
}
