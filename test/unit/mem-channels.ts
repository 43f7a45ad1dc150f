/**
 * Channels of `size` ranks over an in-memory FIFO transport (each delivery on a later turn), for
 * the channel's unit tests: what each rank sent, what each delivered, and its warnings.
 */
import { Channel } from "../../src/mpi/channel.ts";
import type { Host, Transport } from "../../src/mpi/host.ts";
import { decodeHeader, Kind } from "../../src/mpi/wire.ts";

export interface MemChannels {
  readonly channels: Channel[];
  /** Every frame sent, in order. */
  readonly sent: { from: number; kind: number; tag: number; channelSeq: number; flags: number }[];
  /** Every app message delivered, in order, with its body's text. */
  readonly delivered: { at: number; source: number; tag: number; bytes: number; data: string }[];
  readonly warnings: string[];
  /** Holds back every delivery to `rank` (a receiver whose event loop is busy) until {@link release}. */
  pause(rank: number): void;
  /** Delivers what was held back for `rank`, in order, and delivers at once from then on. */
  release(rank: number): void;
}

/** `key(s, d)`: the key of channel s → d, as the coordinator's table gives it (default 0). */
/** `timers: false`: the channels' timers never fire (what a channel does without its pause timer). */
export function memChannels(size: number, opts: { maxMessageBytes?: number; key?: (s: number, d: number) => number; timers?: boolean } = {}): MemChannels {
  const key = opts.key ?? (() => 0);
  const held = new Map<number, Buffer[][]>();
  const out: MemChannels = {
    channels: [],
    sent: [],
    delivered: [],
    warnings: [],
    pause: (rank) => void held.set(rank, held.get(rank) ?? []),
    release: (rank) => {
      const frames = held.get(rank) ?? [];
      held.delete(rank);
      for (const f of frames) out.channels[rank]!.onFrames(f);
    },
  };
  const make = (rank: number): Channel => {
    const transport: Transport = {
      endpoint: `mem://${rank}`,
      start: () => undefined,
      connect: () => undefined,
      send: async (dest, frames) => {
        const copy = frames.map((f) => Buffer.from(f));
        const h = decodeHeader(copy[0]!.subarray(0, 40), { keysIn: "stored", size });
        out.sent.push({ from: rank, kind: h.kind, tag: h.tag, channelSeq: h.channelSeq, flags: h.flags });
        setImmediate(() => {
          const waiting = held.get(dest);
          if (waiting !== undefined) waiting.push(copy);
          else out.channels[dest]!.onFrames(copy);
        });
      },
      close: async () => undefined,
    };
    const host = memHost(transport, out.warnings, opts.timers);
    const ch = new Channel({
      rank,
      size,
      attempt: 0,
      host,
      ...(opts.maxMessageBytes === undefined ? {} : { maxMessageBytes: opts.maxMessageBytes }),
      deliver: (h, body) => {
        if (h.kind !== Kind.app) return;
        out.delivered.push({
          at: rank,
          source: h.source,
          tag: h.tag,
          bytes: body.reduce((n, b) => n + b.length, 0),
          data: body.map((b) => b.toString()).join(""),
        });
      },
    });
    ch.join({
      keysIn: Array.from({ length: size }, (_, s) => key(s, rank)),
      keysOut: Array.from({ length: size }, (_, d) => key(rank, d)),
      attempts: new Array<number>(size).fill(0),
    });
    return ch;
  };
  for (let r = 0; r < size; r++) out.channels.push(make(r));
  return out;
}

/**
 * The host a channel under test runs on: `transport`, deferred calls on later turns, real
 * timers (none fire with `timers` false), and warnings collected in `warnings`.
 */
export function memHost(transport: Transport, warnings: string[], timers = true): Host {
  return {
    transport,
    defer: (fn: () => void) => void setImmediate(fn),
    now: () => performance.now(),
    after: (ms: number, fn: () => void) => {
      if (!timers) return { stop: () => undefined };
      const t = setTimeout(fn, ms);
      return { stop: () => clearTimeout(t) };
    },
    warn: (line: string) => void warnings.push(line),
  } as unknown as Host;
}
