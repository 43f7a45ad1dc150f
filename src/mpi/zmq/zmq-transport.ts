/**
 * The one I/O seam of the message layer, over ZeroMQ.
 *
 * Each rank binds one `Pull` socket (its endpoint goes in the coordinator's table) and keeps
 * one `Push` socket per peer, connected to that peer's endpoint. Push/Pull over one
 * connection is FIFO, which gives MPI's non-overtaking rule per (source, destination); the
 * source rank travels in the frame header. One reader loop drains the Pull socket and hands
 * every multipart message to `onFrames` (never two receivers on one socket).
 *
 * zeromq.js allows one send in flight per socket (EBUSY otherwise), so sends to a peer are
 * queued behind each other (SerialSender); sends to different peers proceed independently.
 *
 * @example
 * const t = await ZmqTransport.bind({ transport: "ipc", runDir, name: "r0.0" });
 * t.start((frames) => handle(frames)); t.connect(1, endpointOf1); await t.send(1, [header, body]);
 */
import * as zmq from "zeromq";
import { LifelineError } from "../../errors.ts";
import { DEFAULT_TCP_HOST } from "../bind.ts";
import { SerialSender } from "./serial-sender.ts";
import type { Transport } from "../host.ts";

interface Peer {
  socket: zmq.Push;
  endpoint: string;
  sender: SerialSender;
}

export interface BindOptions {
  transport: "ipc" | "tcp";
  /** Directory for ipc endpoints (required for ipc). */
  runDir?: string;
  /** Unique name of this socket within the run dir (e.g. "r3.0"). */
  name: string;
  /** Host to bind for tcp; loopback by default. */
  host?: string;
}

export class ZmqTransport implements Transport {
  private readonly peers = new Map<number, Peer>();
  private closed = false;
  private reading: Promise<void> | undefined;

  private constructor(
    private readonly pull: zmq.Pull,
    readonly endpoint: string,
  ) {}

  /** Binds the receiving socket: `ipc://<runDir>/<name>.sock` or `tcp://host:0` (a free port). */
  static async bind(opts: BindOptions): Promise<ZmqTransport> {
    const pull = new zmq.Pull({ linger: 0, receiveHighWaterMark: 0 });
    let address: string;
    if (opts.transport === "ipc") {
      if (opts.runDir === undefined) throw new LifelineError("MPI_INIT", "ipc transport needs a run directory (LIFELINE_RUN_DIR)");
      address = `ipc://${opts.runDir}/${opts.name}.sock`;
    } else {
      address = `tcp://${opts.host ?? DEFAULT_TCP_HOST}:0`;
    }
    try {
      await pull.bind(address);
    } catch (err) {
      pull.close();
      throw new LifelineError("MPI_INIT", `cannot bind the rank's socket at ${address}: ${(err as Error).message}`, { cause: err });
    }
    return new ZmqTransport(pull, pull.lastEndpoint ?? address);
  }

  /** Starts the single reader loop. `onFrames` runs synchronously for each arriving message. */
  start(onFrames: (frames: Buffer[]) => void, onError: (err: unknown) => void): void {
    this.reading = (async () => {
      try {
        for await (const frames of this.pull) onFrames(frames);
      } catch (err) {
        if (!this.closed) onError(err);
      }
    })();
  }

  /** Connects (or re-connects, after a peer restarted) the sending socket for `rank`. */
  connect(rank: number, endpoint: string): void {
    const old = this.peers.get(rank);
    if (old !== undefined) {
      if (old.endpoint === endpoint) return;
      // The peer restarted at a new endpoint: messages queued for the dead incarnation are
      // worthless; fail them and start afresh.
      old.sender.rejectQueued(new LifelineError("MPI_ABORTED", `rank ${rank} restarted while a send to it was queued`));
      old.socket.close();
    }
    const socket = new zmq.Push({ linger: 0, sendHighWaterMark: 0 });
    socket.connect(endpoint);
    this.peers.set(rank, { socket, endpoint, sender: new SerialSender(socket) });
  }

  /** Hands a multipart message to the transport; resolves once libzmq has queued it. */
  send(rank: number, frames: readonly (Buffer | Uint8Array)[]): Promise<void> {
    const peer = this.peers.get(rank);
    if (peer === undefined) return Promise.reject(new LifelineError("MPI_RANK", `no connection to rank ${rank}`));
    return peer.sender.send(frames);
  }

  /** Closes every socket. Queued sends are dropped (the job is over or aborted). */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const [rank, peer] of this.peers) {
      peer.sender.rejectQueued(new LifelineError("MPI_FINALIZED", `transport closed with a send to rank ${rank} queued`));
      peer.socket.close();
    }
    this.peers.clear();
    this.pull.close();
    await this.reading?.catch(() => undefined);
  }
}
