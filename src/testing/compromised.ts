/**
 * A test-only hook that turns a rank into a compromised peer: it hands a test program what an
 * attacker who took over a rank's process holds — the job's member key (from the rank's key
 * file), its channel keys and token, its peers' endpoints and CURVE keys — and lets it send
 * raw frames over connections authenticated as a member of the job. Used by the security tests
 * (test/integration/security.test.ts) to fuzz the data and control paths from inside a job.
 *
 * It reaches into World's private fields on purpose (nothing in the library exposes them) and
 * is not exported from the package.
 *
 * @example
 * const evil = compromised(world);
 * const conn = await evil.dataTo(1);                    // a new authenticated connection to rank 1
 * await conn.send([header, body]);                      // any bytes
 * await evil.control(Buffer.from([0xc1]));               // garbage over its own control link
 */
import * as zmq from "zeromq";
import type { World } from "../mpi/world.ts";
import { loadRankKeys, type RankKeys } from "../mpi/keys.ts";
import type { RankPlace } from "../mpi/env.ts";
import type { ZmqTransport } from "../mpi/zmq/zmq-transport.ts";
import { SerialSender } from "../mpi/zmq/serial-sender.ts";
import { curveClient } from "../mpi/zmq/zap.ts";
import { encodeHeader, Encoding, type Header, Kind } from "../mpi/wire.ts";

/** A connection of the attacker's own. */
export interface RawConnection {
  send(frames: readonly (Buffer | string)[]): Promise<void>;
  close(): void;
}

export interface CompromisedRank {
  readonly rank: number;
  readonly size: number;
  readonly attempt: number;
  /** The key of this rank's channel to `dest` (what its honest frames to `dest` carry). */
  keyTo(dest: number): number;
  /** A new data connection to rank `dest`'s socket, authenticated with the job's member key. */
  dataTo(dest: number): RawConnection;
  /** Raw frames over this rank's own control link (its routing id and token). */
  control(frame: Buffer): Promise<void>;
  /** A second control connection with the member key and routing id `identity` (no token unless it guesses one). */
  controlAs(identity: string): RawConnection;
}

interface WorldInternals {
  readonly place: RankPlace;
  readonly channel: { readonly keysOut: Uint32Array };
  readonly host: { readonly transport: ZmqTransport };
  readonly control: { readonly sender: { send(frames: readonly Buffer[]): Promise<void> } };
}

interface TransportInternals {
  readonly peers: Map<number, { endpoint: string; serverKey: string | undefined }>;
}

export function compromised(world: Pick<World, "rank" | "size" | "attempt">): CompromisedRank {
  const w = world as unknown as WorldInternals;
  const keys: RankKeys = loadRankKeys(w.place).keys;
  const member = keys.curve?.member;
  const raw = <S extends zmq.Push | zmq.Dealer>(socket: S, endpoint: string): RawConnection => {
    socket.connect(endpoint);
    const sender = new SerialSender(socket);
    return { send: (frames) => sender.send(frames.map((f) => (typeof f === "string" ? Buffer.from(f) : f))), close: () => socket.close() };
  };
  return {
    rank: world.rank,
    size: world.size,
    attempt: world.attempt,
    keyTo: (dest) => w.channel.keysOut[dest]!,
    dataTo: (dest) => {
      const peer = (w.host.transport as unknown as TransportInternals).peers.get(dest);
      if (peer === undefined) throw new Error(`no connection to rank ${dest}`);
      const curve = member === undefined || peer.serverKey === undefined ? {} : curveClient(member, peer.serverKey);
      return raw(new zmq.Push({ linger: 0, sendHighWaterMark: 100_000, ...curve }), peer.endpoint);
    },
    control: (frame) => w.control.sender.send([frame]),
    controlAs: (identity) => {
      const curve = keys.curve === undefined ? {} : curveClient(keys.curve.member, keys.curve.server);
      return raw(new zmq.Dealer({ linger: 0, routingId: identity, sendHighWaterMark: 100_000, ...curve }), w.place.coordinator);
    },
  };
}

/** How many frames `world`'s channel has dropped so far (every one it warned about, or would have past the warning limit). */
export function droppedFrames(world: Pick<World, "rank">): number {
  return (world as unknown as { channel: { garbageWarnings: number } }).channel.garbageWarnings;
}

/**
 * A frame header as a peer could forge it: any fields (`h`), the rest those of an app message
 * of a Float64Array from rank 0 with key 0.
 */
export function forgedHeader(h: Partial<Header>): Buffer {
  return encodeHeader({
    kind: Kind.app,
    flags: 0,
    encoding: Encoding.typedArray,
    key: 0,
    source: 0,
    tag: 0,
    channelSeq: 0,
    epoch: 0,
    collSeq: 0,
    signature: 0,
    arrayType: 9,
    attempt: 0,
    ...h,
  });
}
