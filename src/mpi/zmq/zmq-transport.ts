/**
 * The one I/O seam of the message layer, over ZeroMQ.
 *
 * Each rank binds one `Pull` socket (its endpoint goes in the coordinator's table) and keeps
 * one `Push` socket per peer, connected to that peer's endpoint. Push/Pull over one
 * connection is FIFO, which gives MPI's non-overtaking rule per (source, destination); the
 * source rank travels in the frame header. One reader loop drains the Pull socket and hands
 * every multipart message to `onFrames` (never two receivers on one socket).
 *
 * Large messages a sender must not copy go on a second Push socket per peer, the bulk
 * connection (see sendBulk), which tells the sender when ZeroMQ is done with its memory. The
 * channel puts them back in order (see Channel.onFrames).
 *
 * zeromq.js allows one send in flight per socket (EBUSY otherwise), so sends to a peer are
 * queued behind each other (SerialSender); sends to different peers proceed independently.
 *
 * Both ends have finite high-water marks: while a receiver does not read (its event loop is
 * busy), a sender's queue fills and its sends wait, so memory stays bounded and nothing is
 * dropped. A frame longer than the job's message limit makes ZeroMQ drop the connection
 * before it allocates the frame. On tcp with keys (docs/security.md), the Pull socket is a
 * CURVE server with a key pair made here, accepting the job's member key only (ZAP, zap.ts),
 * and each Push connects with the member key pair to its peer's advertised server key.
 *
 * @example
 * const t = await ZmqTransport.bind({ transport: "ipc", runDir, name: "r0.0" });
 * t.start((frames) => handle(frames)); t.connect(1, endpointOf1); await t.send(1, [header, body]);
 */
import * as zmq from "zeromq";
import { LifelineError } from "../../errors.ts";
import { DEFAULT_TCP_HOST } from "../bind.ts";
import type { CurveKeyPair } from "../keys.ts";
import { ReceiveGcPacer } from "./gc-pacing.ts";
import { SerialSender } from "./serial-sender.ts";
import { curveClient, curveServer, registerZap, watchHandshakes, type ZapDomain } from "./zap.ts";
import type { Transport } from "../host.ts";

/** Messages queued per connection, in each direction, before a sender waits (ZeroMQ's default). */
export const HIGH_WATER_MARK = 1000;
/** ZeroMQ drops a connection whose frame is longer than the message limit plus this (see onFrames' own check). */
export const FRAME_SLACK_BYTES = 64 * 1024;

/**
 * What follows each bulk message on its connection (see sendBulk): one empty frame, which the
 * reader loop drops.
 */
const FENCE = Buffer.alloc(0);

interface Peer {
  socket: zmq.Push;
  endpoint: string;
  serverKey: string | undefined;
  sender: SerialSender;
  /** The bulk connection (see sendBulk), made at its first use. */
  bulk?: { socket: zmq.Push; sender: SerialSender };
}

export interface BindOptions {
  transport: "ipc" | "tcp";
  /** Directory for ipc endpoints (required for ipc). */
  runDir?: string;
  /** Unique name of this socket within the run dir (e.g. "r3.0"). */
  name: string;
  /** Host to bind for tcp; loopback by default. */
  host?: string;
  /** tcp: CURVE with the job's member key pair (its public key is the only client key accepted). */
  curve?: { readonly member: CurveKeyPair } | undefined;
  /** The longest message body accepted (frames beyond it plus {@link FRAME_SLACK_BYTES} cost the sender its connection). */
  maxMessageBytes?: number | undefined;
  /** A connection to the data socket was refused: `why` is the kind of refusal, `what` says it with the peer's address if known (rate-limit the warnings by kind). */
  refused?: ((why: string, what: string) => void) | undefined;
  /** Scavenges paced by the bytes received (see gc-pacing.ts); off unless true. */
  gcPacing?: boolean | undefined;
}

export class ZmqTransport implements Transport {
  private readonly peers = new Map<number, Peer>();
  private closed = false;
  private reading: Promise<void> | undefined;

  private constructor(
    private readonly pull: zmq.Pull,
    readonly endpoint: string,
    /** tcp with CURVE: this socket's public key, for the peers (in the hello). */
    readonly curveKey: string | undefined,
    private readonly member: CurveKeyPair | undefined,
    private readonly zap: ZapDomain | undefined,
    private readonly gcPacing: boolean,
  ) {}

  /** Binds the receiving socket: `ipc://<runDir>/<name>.sock` or `tcp://host:0` (a free port). */
  static async bind(opts: BindOptions): Promise<ZmqTransport> {
    const curve = opts.transport === "tcp" ? opts.curve : undefined;
    const own = curve === undefined ? undefined : zmq.curveKeyPair();
    const refused = opts.refused ?? (() => undefined);
    const zap =
      curve === undefined
        ? undefined
        : await registerZap({ allowed: [curve.member.publicKey], refused: (address, why) => refused(why, `from ${address}: ${why}`) });
    const pull = new zmq.Pull({
      linger: 0,
      receiveHighWaterMark: HIGH_WATER_MARK,
      ...(opts.maxMessageBytes === undefined ? {} : { maxMessageSize: opts.maxMessageBytes + FRAME_SLACK_BYTES }),
      ...(own === undefined || zap === undefined ? {} : curveServer(own, zap.domain)),
    });
    if (zap !== undefined) watchHandshakes(pull, (why) => refused(why, `of ${why}`));
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
      zap?.close();
      throw new LifelineError("MPI_INIT", `cannot bind the rank's socket at ${address}: ${(err as Error).message}`, { cause: err });
    }
    return new ZmqTransport(pull, pull.lastEndpoint ?? address, own?.publicKey, curve?.member, zap, opts.gcPacing === true);
  }

  /** Starts the single reader loop. `onFrames` runs synchronously for each arriving message. */
  start(onFrames: (frames: Buffer[]) => void, onError: (err: unknown) => void): void {
    // receive() directly rather than `for await` over the socket: zeromq.js's async iterator
    // wraps every receive in an async function of its own (one promise and hop more).
    const pacer = this.gcPacing ? ReceiveGcPacer.create() : undefined;
    this.reading = (async () => {
      const pull = this.pull;
      try {
        while (!this.closed) {
          const frames = await pull.receive();
          // A bulk connection's fence (see sendBulk): nothing to deliver.
          if (frames.length === 1 && frames[0]!.length === 0) continue;
          onFrames(frames);
          if (pacer !== undefined) {
            let bytes = 0;
            for (const f of frames) bytes += f.length;
            pacer.received(bytes);
          }
        }
      } catch (err) {
        if (!this.closed) onError(err);
      }
    })();
  }

  /**
   * Connects (or re-connects, after a peer restarted) the sending socket for `rank`; with CURVE,
   * `serverKey` is the peer's advertised public key.
   */
  connect(rank: number, endpoint: string, serverKey?: string): void {
    const old = this.peers.get(rank);
    if (old !== undefined) {
      if (old.endpoint === endpoint && old.serverKey === serverKey) return;
      // The peer restarted at a new endpoint: messages queued for the dead incarnation are
      // worthless; fail them and start afresh.
      const err = new LifelineError("MPI_ABORTED", `rank ${rank} restarted while a send to it was queued`);
      old.sender.rejectQueued(err);
      old.socket.close();
      old.bulk?.sender.rejectQueued(err);
      old.bulk?.socket.close();
    }
    const socket = this.pushTo(endpoint, serverKey, HIGH_WATER_MARK);
    this.peers.set(rank, { socket, endpoint, serverKey, sender: new SerialSender(socket) });
  }

  private pushTo(endpoint: string, serverKey: string | undefined, highWaterMark: number): zmq.Push {
    const socket = new zmq.Push({
      linger: 0,
      sendHighWaterMark: highWaterMark,
      ...(this.member === undefined || serverKey === undefined ? {} : curveClient(this.member, serverKey)),
    });
    socket.connect(endpoint);
    return socket;
  }

  /** Hands a multipart message to the transport; resolves once libzmq has queued it. */
  send(rank: number, frames: readonly (Buffer | Uint8Array)[]): Promise<void> {
    const peer = this.peers.get(rank);
    if (peer === undefined) return Promise.reject(new LifelineError("MPI_RANK", `no connection to rank ${rank}`));
    return peer.sender.send(frames);
  }

  /**
   * Sends `frames` on the peer's bulk connection, a second Push socket whose queue holds one
   * message, and two empty fences after them; resolves once the second fence is queued. The
   * I/O thread takes a message from the queue only when it has written the one before it
   * whole (ZeroMQ sends large frames from the caller's memory, without a copy), so by then
   * the first fence has left the queue and every byte of `frames` is in the kernel: the
   * caller may change them. The receiver's reader loop drops the fences.
   */
  sendBulk(rank: number, frames: readonly (Buffer | Uint8Array)[]): Promise<void> {
    const peer = this.peers.get(rank);
    if (peer === undefined) return Promise.reject(new LifelineError("MPI_RANK", `no connection to rank ${rank}`));
    if (peer.bulk === undefined) {
      const socket = this.pushTo(peer.endpoint, peer.serverKey, 1);
      peer.bulk = { socket, sender: new SerialSender(socket) };
    }
    const out = peer.bulk.sender;
    const sent = out.send(frames);
    void out.send([FENCE]).catch(() => undefined);
    return Promise.all([sent, out.send([FENCE])]).then(() => undefined);
  }

  sending(): boolean {
    for (const peer of this.peers.values()) if (peer.sender.sending || peer.bulk?.sender.sending === true) return true;
    return false;
  }

  /** Closes every socket. Queued sends are dropped (the job is over or aborted). */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const [rank, peer] of this.peers) {
      const err = new LifelineError("MPI_FINALIZED", `transport closed with a send to rank ${rank} queued`);
      peer.sender.rejectQueued(err);
      peer.socket.close();
      peer.bulk?.sender.rejectQueued(err);
      peer.bulk?.socket.close();
    }
    this.peers.clear();
    this.pull.close();
    this.zap?.close();
    await this.reading?.catch(() => undefined);
  }
}
