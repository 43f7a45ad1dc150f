/**
 * Everything the communicator needs from the outside world, as one seam: the data transport,
 * the control channel to the coordinator, time, timers and process exit.
 *
 * Production uses {@link zmqHost} (ZeroMQ sockets, real timers); the deterministic simulator in
 * `src/testing` supplies its own, so the very same World code (matching, collectives, the
 * recovery drivers) runs under seeded schedules with simulated time and crashes.
 *
 * @example
 * const host = await zmqHost(place, (msg) => world.onControl(msg));
 */
import type { CoordinatorToRank, RankToCoordinator } from "./control.ts";
import { controlIdentity } from "./control.ts";
import { ControlLink } from "./control-link.ts";
import { LifelineError } from "../errors.ts";
import { resolveBind } from "./bind.ts";
import { ENV, type RankPlace } from "./env.ts";
import type { RankKeys } from "./keys.ts";
import { refusalWarnings } from "./zmq/zap.ts";
import { ZmqTransport } from "./zmq/zmq-transport.ts";
import type { Header } from "./wire.ts";

/** The data path: one receiving endpoint, one FIFO channel to each peer. */
export interface Transport {
  readonly endpoint: string;
  /** Starts delivering arriving multipart messages, one at a time, in arrival order. */
  start(onFrames: (frames: Buffer[]) => void, onError: (err: unknown) => void): void;
  /** With CURVE (tcp with keys): the public key peers connect to this endpoint with. */
  readonly curveKey?: string | undefined;
  /** Connects (or re-connects after a restart) the channel to `rank` (`serverKey`: its advertised CURVE key). */
  connect(rank: number, endpoint: string, serverKey?: string): void;
  /** Queues a message; resolves once the transport holds it (FIFO per destination). */
  send(rank: number, frames: readonly (Buffer | Uint8Array)[]): Promise<void>;
  /**
   * Sends a large message from the caller's memory on a second connection to `rank`, and
   * resolves once every byte of it has left that memory (the caller may change it then).
   * Bulk messages to a rank keep their order among themselves, not with `send`'s: the
   * receiver puts each where its mark (a frame sent with `send`) says. Optional: without it,
   * large messages are copied and go with `send`.
   */
  sendBulk?(rank: number, frames: readonly (Buffer | Uint8Array)[]): Promise<void>;
  /** Whether a send has not been taken by the transport yet (waits at a full queue, say). */
  sending?(): boolean;
  close(): Promise<void>;
}

/** The rank's end of the control channel. */
export interface ControlChannel {
  send(msg: RankToCoordinator): Promise<void>;
  close(): Promise<void>;
}

export interface Timer {
  stop(): void;
}

export interface Host {
  readonly transport: Transport;
  readonly control: ControlChannel;
  /** Monotonic milliseconds. */
  now(): number;
  /** Runs `fn` on a later turn (after pending I/O), as a socket delivery would. */
  defer(fn: () => void): void;
  /** Runs `fn` every `ms` without keeping the process alive. */
  every(ms: number, fn: () => void): Timer;
  /** Runs `fn` once after `ms` without keeping the process alive. */
  after(ms: number, fn: () => void): Timer;
  /** Ends this rank's process (after an abort). */
  exit(code: number): void;
  /** A diagnostic line for the rank's stderr. */
  warn(line: string): void;
  readonly pid: number;
  /**
   * A peer's application or collective frame from the network passed every check and goes to
   * the program. Only the simulator listens: its invariants refuse frames of incarnations the
   * rank already knows to be replaced.
   */
  accepted?(header: Header): void;
}

/**
 * The production host: ZeroMQ data and control sockets, Node timers, this process. `keys`: the
 * rank's (keys.ts); `linkFailed`: the coordinator refused the control link (wrong keys).
 */
export async function zmqHost(
  place: RankPlace,
  onControl: (msg: CoordinatorToRank) => void,
  keys: RankKeys = {},
  linkFailed: (err: LifelineError) => void = () => undefined,
): Promise<Host> {
  let host: string | undefined;
  if (place.transport === "tcp" && place.bind !== undefined) {
    const bound = resolveBind(place.bind);
    if ("problem" in bound) throw new LifelineError("MPI_INIT", `rank ${place.rank} cannot bind ${ENV.bind}=${place.bind}: ${bound.problem}`);
    host = bound.address;
  }
  const refused = refusalWarnings((line) => void process.stderr.write(`lifeline: rank ${place.rank}: refused a connection to its data socket ${line}\n`));
  const curve = place.transport === "tcp" ? keys.curve : undefined;
  const transport = await ZmqTransport.bind({
    transport: place.transport,
    runDir: place.runDir,
    name: controlIdentity(place.rank, place.attempt),
    ...(host === undefined ? {} : { host }),
    curve,
    maxMessageBytes: place.maxMessageBytes,
    refused,
    gcPacing: place.gcPacing,
  });
  let control: ControlLink;
  try {
    control = ControlLink.connect(place.coordinator, controlIdentity(place.rank, place.attempt, keys.token), onControl, {
      curve,
      maxMessageBytes: place.maxMessageBytes,
      failed: linkFailed,
    });
  } catch (err) {
    await transport.close();
    throw err;
  }
  return {
    transport,
    control,
    now: () => performance.now(),
    defer: (fn) => void setImmediate(fn),
    every: (ms, fn) => {
      const t = setInterval(fn, ms);
      t.unref();
      return { stop: () => clearInterval(t) };
    },
    after: (ms, fn) => {
      const t = setTimeout(fn, ms);
      t.unref();
      return { stop: () => clearTimeout(t) };
    },
    exit: (code) => process.exit(code),
    warn: (line) => void process.stderr.write(`${line}\n`),
    pid: process.pid,
  };
}
