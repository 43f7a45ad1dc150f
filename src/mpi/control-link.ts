/**
 * The rank's end of the control channel: a zeromq `Dealer` to the coordinator's `Router`.
 *
 * With keys on tcp it is a CURVE client (the job's member key pair, the coordinator's public
 * key); a coordinator that refuses the handshake (keys of another job, or none where it wants
 * them) is reported through `failed` at once, so that init() fails with a clear message
 * instead of waiting out the rendezvous.
 *
 * @example
 * const link = await ControlLink.connect(place.coordinator, controlIdentity(rank, attempt), onMessage);
 * await link.send({ t: "hello", ... });
 */
import * as zmq from "zeromq";
import { LifelineError } from "../errors.ts";
import { type CoordinatorToRank, decodeControl, encodeControl, type RankToCoordinator } from "./control.ts";
import type { CurveKeyPair } from "./keys.ts";
import { SerialSender } from "./zmq/serial-sender.ts";
import { curveClient } from "./zmq/zap.ts";
import { FRAME_SLACK_BYTES } from "./zmq/zmq-transport.ts";

/** How a rank's control link is secured and bounded. */
export interface ControlLinkOptions {
  /** CURVE: the coordinator's public key and the job's member key pair. */
  readonly curve?: { readonly server: string; readonly member: CurveKeyPair } | undefined;
  /** The longest message the coordinator sends (a table may carry a recovery-line part). */
  readonly maxMessageBytes?: number | undefined;
  /** The coordinator refused the link's handshake. */
  readonly failed?: ((err: LifelineError) => void) | undefined;
}

export class ControlLink {
  private closed = false;
  private readonly sender: SerialSender;
  private reading: Promise<void> | undefined;

  private constructor(
    private readonly socket: zmq.Dealer,
    private readonly maxMessageBytes: number | undefined,
  ) {
    this.sender = new SerialSender(socket);
  }

  /** Connects to the coordinator; `onMessage` gets every well-formed message from it. */
  static connect(endpoint: string, identity: string, onMessage: (msg: CoordinatorToRank) => void, opts: ControlLinkOptions = {}): ControlLink {
    // linger: a bounded wait so that a final message (finalize, abort) still leaves when the
    // process closes right after sending it, without ever blocking exit on a dead coordinator.
    const socket = new zmq.Dealer({
      routingId: identity,
      linger: 2000,
      sendHighWaterMark: 0,
      ...(opts.maxMessageBytes === undefined ? {} : { maxMessageSize: opts.maxMessageBytes + FRAME_SLACK_BYTES }),
      ...(opts.curve === undefined ? {} : curveClient(opts.curve.member, opts.curve.server)),
    });
    const failed = opts.failed;
    if (failed !== undefined) {
      const refused = (why: string): void =>
        failed(
          new LifelineError(
            "MPI_INIT",
            `the coordinator at ${endpoint} refused this rank's connection (${why}): ${
              opts.curve === undefined
                ? "it wants the job's keys; set LIFELINE_KEYS to the ranks' key file"
                : "LIFELINE_KEYS names keys of another job, or the coordinator runs without keys (--insecure)"
            }`,
          ),
        );
      socket.events.on("handshake:error:auth", () => refused("its key is not one of the job's"));
      // A CURVE server that cannot decrypt a client's hello (it has another server key) just
      // closes the connection: several closes before any handshake succeeded say the same.
      let handshakes = 0;
      let earlyCloses = 0;
      socket.events.on("handshake", () => handshakes++);
      socket.events.on("disconnect", () => {
        if (handshakes === 0 && ++earlyCloses === 3) refused("it closed the connection during the handshake, three times");
      });
      socket.events.on("handshake:error:protocol", (e) => {
        const code = (e.error as Error & { code?: string }).code ?? e.error.message;
        refused(
          code === "ERR_ZMTP_MECHANISM_MISMATCH"
            ? "one side uses CURVE, the other does not"
            : code === "ERR_ZMTP_CRYPTOGRAPHIC"
              ? "its CURVE key is not the one this rank has"
              : code,
        );
      });
    }
    try {
      socket.connect(endpoint);
    } catch (err) {
      socket.close();
      throw new LifelineError("MPI_INIT", `cannot connect to the coordinator at ${endpoint}: ${(err as Error).message}`, { cause: err });
    }
    const link = new ControlLink(socket, opts.maxMessageBytes);
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

  /** Sends `msg`; one longer than the job's message limit is refused with `MPI_LIMIT` (the coordinator would drop the link). */
  send(msg: RankToCoordinator): Promise<void> {
    if (this.closed) return Promise.resolve();
    const frame = encodeControl(msg);
    if (this.maxMessageBytes !== undefined && frame.length > this.maxMessageBytes) {
      return Promise.reject(
        new LifelineError(
          "MPI_LIMIT",
          `a ${msg.t} message of ${frame.length} bytes to the coordinator is longer than the job's limit of ${this.maxMessageBytes} bytes (--max-message)`,
        ),
      );
    }
    return this.sender.send([frame]);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.socket.close();
    await this.reading?.catch(() => undefined);
  }
}
