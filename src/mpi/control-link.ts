/**
 * The rank's end of the control channel: a zeromq `Dealer` to the coordinator's `Router`.
 *
 * @example
 * const link = await ControlLink.connect(place.coordinator, controlIdentity(rank, attempt), onMessage);
 * await link.send({ t: "hello", ... });
 */
import * as zmq from "zeromq";
import { LifelineError } from "../errors.ts";
import { type CoordinatorToRank, decodeControl, encodeControl, type RankToCoordinator } from "./control.ts";
import { SerialSender } from "./zmq/serial-sender.ts";

export class ControlLink {
  private closed = false;
  private readonly sender: SerialSender;
  private reading: Promise<void> | undefined;

  private constructor(private readonly socket: zmq.Dealer) {
    this.sender = new SerialSender(socket);
  }

  /** Connects to the coordinator; `onMessage` gets every well-formed message from it. */
  static connect(endpoint: string, identity: string, onMessage: (msg: CoordinatorToRank) => void): ControlLink {
    // linger: a bounded wait so that a final message (finalize, abort) still leaves when the
    // process closes right after sending it, without ever blocking exit on a dead coordinator.
    const socket = new zmq.Dealer({ routingId: identity, linger: 2000, sendHighWaterMark: 0 });
    try {
      socket.connect(endpoint);
    } catch (err) {
      socket.close();
      throw new LifelineError("MPI_INIT", `cannot connect to the coordinator at ${endpoint}: ${(err as Error).message}`, { cause: err });
    }
    const link = new ControlLink(socket);
    link.reading = (async () => {
      try {
        for await (const [frame] of socket) {
          let msg;
          try {
            msg = decodeControl(frame) as CoordinatorToRank;
          } catch (err) {
            process.stderr.write(`lifeline: ignoring a malformed control message: ${(err as Error).message}\n`);
            continue;
          }
          onMessage(msg);
        }
      } catch (err) {
        if (!link.closed) process.stderr.write(`lifeline: control channel failed: ${(err as Error).message}\n`);
      }
    })();
    return link;
  }

  send(msg: RankToCoordinator): Promise<void> {
    if (this.closed) return Promise.resolve();
    return this.sender.send([encodeControl(msg)]);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.socket.close();
    await this.reading?.catch(() => undefined);
  }
}
