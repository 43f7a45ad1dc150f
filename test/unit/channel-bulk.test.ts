/**
 * Bulk messages: large app payloads go from the program's memory on the transport's second
 * connection, with a mark in their place on the channel; the receiver puts each back where its
 * mark arrived, whichever of the two comes first. Here the two connections are in-memory
 * FIFOs whose interleaving the test chooses (seeded), so every order the network may produce
 * is tried.
 */
import { describe, expect, it } from "vitest";
import { BULK_BYTES_MIN, Channel } from "../../src/mpi/channel.ts";
import type { Transport } from "../../src/mpi/host.ts";
import { decodeHeader, Flag, Kind } from "../../src/mpi/wire.ts";
import { Prng } from "../../src/testing/prng.ts";
import { memHost } from "./mem-channels.ts";

interface Wire {
  readonly channels: Channel[];
  /** Frames on the way to each rank: [normal connection, bulk connection], each FIFO. */
  readonly queues: Buffer[][][][];
  /** App messages each rank delivered, in order: source, tag and body text. */
  readonly delivered: { at: number; source: number; tag: number; data: string }[];
  readonly warnings: string[];
  /** What each sendBulk was given, by sender: the frames as passed (not copied). */
  readonly bulkFrames: (Buffer | Uint8Array)[][];
  /** Delivers one frame to `rank`: from the bulk connection when `bulkFirst` and it has one, else the other. */
  step(rank: number, bulkFirst: boolean): boolean;
  /** Delivers everything on the way to `rank`, choosing the connection at random each time. */
  drain(rank: number, rand: () => number): void;
  /** The next sendBulk of each rank waits until this is called with the rank (the transport still writes). */
  holdWrites(): void;
  writeNow(): void;
}

function wire(size: number, opts: { bulk?: boolean; attempts?: number[]; bulkBytesMin?: number; maxMessageBytes?: number } = {}): Wire {
  let held: (() => void)[] | undefined;
  const w: Wire = {
    channels: [],
    queues: Array.from({ length: size }, () => [[], []]),
    delivered: [],
    warnings: [],
    bulkFrames: [],
    step(rank, bulkFirst) {
      const [normal, bulk] = w.queues[rank]!;
      const q = bulkFirst && bulk!.length > 0 ? bulk! : normal!.length > 0 ? normal! : bulk!;
      const f = q.shift();
      if (f === undefined) return false;
      w.channels[rank]!.onFrames(f);
      return true;
    },
    drain(rank, rand) {
      while (w.step(rank, rand() < 0.5));
    },
    holdWrites: () => void (held = []),
    writeNow: () => {
      const h = held ?? [];
      held = undefined;
      for (const f of h) f();
    },
  };
  const make = (rank: number): Channel => {
    const copy = (frames: readonly (Buffer | Uint8Array)[]): Buffer[] => frames.map((f) => Buffer.from(f));
    const transport: Transport = {
      endpoint: `mem://${rank}`,
      start: () => undefined,
      connect: () => undefined,
      send: async (dest, frames) => void w.queues[dest]![0]!.push(copy(frames)),
      close: async () => undefined,
      ...(opts.bulk === false
        ? {}
        : {
            sendBulk: (dest: number, frames: readonly (Buffer | Uint8Array)[]) => {
              w.bulkFrames.push([...frames]);
              // The bytes leave the sender's memory when the transport writes them.
              const write = (): void => void w.queues[dest]![1]!.push(copy(frames));
              if (held === undefined) {
                write();
                return Promise.resolve();
              }
              return new Promise<void>((resolve) => held!.push(() => (write(), resolve())));
            },
          }),
    };
    const ch = new Channel({
      rank,
      size,
      attempt: opts.attempts?.[rank] ?? 0,
      host: memHost(transport, w.warnings),
      ...(opts.bulkBytesMin === undefined ? {} : { bulkBytesMin: opts.bulkBytesMin }),
      ...(opts.maxMessageBytes === undefined ? {} : { maxMessageBytes: opts.maxMessageBytes }),
      deliver: (h, body) => {
        if (h.kind !== Kind.app) return;
        w.delivered.push({ at: rank, source: h.source, tag: h.tag, data: Buffer.concat(body).toString("latin1") });
      },
    });
    ch.join({ keysIn: new Array<number>(size).fill(0), keysOut: new Array<number>(size).fill(0), attempts: opts.attempts ?? new Array<number>(size).fill(0) });
    return ch;
  };
  for (let r = 0; r < size; r++) w.channels.push(make(r));
  return w;
}

/** A payload of `bytes` whose every byte is `fill` (a Uint8Array, sent as a typed array). */
const payload = (bytes: number, fill: number): Uint8Array => new Uint8Array(bytes).fill(fill);
const text = (bytes: number, fill: number): string => Buffer.from(payload(bytes, fill)).toString("latin1");

describe("bulk messages", () => {
  it("a large send goes from the program's memory on the bulk connection, with a mark on the channel", async () => {
    const w = wire(2);
    const big = payload(BULK_BYTES_MIN, 7);
    await w.channels[0]!.sendApp(big, 1, 5);
    expect(w.bulkFrames).toHaveLength(1);
    // No copy: the body frame views the program's array.
    expect(w.bulkFrames[0]![1]!.buffer).toBe(big.buffer);
    const [mark] = w.queues[1]![0]!;
    expect(mark).toHaveLength(1);
    const mh = decodeHeader(mark![0], { keysIn: "stored", size: 2 });
    expect(mh.flags).toBe(Flag.bulkMark);
    const bh = decodeHeader(w.queues[1]![1]![0]![0], { keysIn: "stored", size: 2 });
    expect(bh.flags & (Flag.bulk | Flag.receipt)).toBe(Flag.bulk | Flag.receipt);
    expect(bh.channelSeq).toBe(mh.channelSeq);
  });

  it("the send resolves only once the transport has written the message", async () => {
    const w = wire(2);
    w.holdWrites();
    let done = false;
    const sent = w.channels[0]!.sendApp(payload(BULK_BYTES_MIN, 1), 1, 1).then(() => (done = true));
    await new Promise((r) => setImmediate(r));
    expect(done).toBe(false);
    w.writeNow();
    await sent;
    expect(done).toBe(true);
  });

  it("smaller payloads, replies, isends and a transport without a bulk connection do not use it", async () => {
    // A smaller payload: copied.
    const small = wire(2);
    await small.channels[0]!.sendApp(payload(BULK_BYTES_MIN - 1, 1), 1, 1);
    expect(small.bulkFrames).toHaveLength(0);
    // An isend: from the program's memory on the channel, resolved by the receipt.
    const isend = wire(2);
    void isend.channels[0]!.sendApp(payload(BULK_BYTES_MIN, 2), 1, 2, true);
    await new Promise((r) => setImmediate(r));
    expect(isend.bulkFrames).toHaveLength(0);
    expect(isend.queues[1]![0]!).toHaveLength(1);
    // A reply on a quiet channel: the same.
    const reply = wire(2);
    await reply.channels[1]!.sendApp(payload(8, 3), 0, 3);
    reply.drain(0, () => 0);
    void reply.channels[0]!.sendApp(payload(BULK_BYTES_MIN, 4), 1, 4);
    await new Promise((r) => setImmediate(r));
    expect(reply.bulkFrames).toHaveLength(0);
    expect(reply.queues[1]![0]!).toHaveLength(1);
    const plain = wire(2, { bulk: false });
    await plain.channels[0]!.sendApp(payload(BULK_BYTES_MIN, 1), 1, 1);
    expect(plain.queues[1]![1]!).toHaveLength(0);
    expect(plain.queues[1]![0]!).toHaveLength(1);
  });

  it("every interleaving of the two connections delivers each source's messages in send order, whole", async () => {
    // Per schedule: two senders, each a random mix of bulk messages and small ones with
    // distinct tags, to rank 2; deliveries pick a connection at random.
    const bulkBytesMin = 64 * 1024;
    for (let seed = 1; seed <= 500; seed++) {
      const prng = new Prng(seed);
      const rand = (): number => prng.float();
      const w = wire(3, { bulkBytesMin });
      const expected: { source: number; tag: number; data: string }[][] = [[], []];
      const sends: Promise<void>[] = [];
      for (let i = 0; i < 12; i++) {
        const src = rand() < 0.5 ? 0 : 1;
        const bytes = rand() < 0.4 ? bulkBytesMin + Math.floor(rand() * 4096) : 1 + Math.floor(rand() * 300);
        const fill = 1 + Math.floor(rand() * 250);
        expected[src]!.push({ source: src, tag: i, data: text(bytes, fill) });
        sends.push(w.channels[src]!.sendApp(payload(bytes, fill), 2, i));
        // Part of what is on the way arrives between the sends.
        const arrive = Math.floor(rand() * 3);
        for (let k = 0; k < arrive; k++) w.step(2, rand() < 0.5);
      }
      w.drain(2, rand);
      await Promise.all(sends);
      for (const src of [0, 1]) {
        const got = w.delivered.filter((d) => d.source === src).map(({ source, tag, data }) => ({ source, tag, data }));
        expect(got, `seed ${seed}, source ${src}`).toEqual(expected[src]);
      }
      expect(w.warnings).toEqual([]);
    }
  });

  it("a small message behind a mark waits for the bulk message, whose receipt comes back", async () => {
    const w = wire(2);
    const [a, b] = w.channels;
    await a!.sendApp(payload(BULK_BYTES_MIN, 9), 1, 1);
    await a!.sendApp(payload(8, 1), 1, 2);
    // The mark and the small message arrive; the bulk message has not.
    w.step(1, false);
    w.step(1, false);
    expect(w.delivered).toHaveLength(0);
    w.step(1, true);
    expect(w.delivered.map((d) => d.tag)).toEqual([1, 2]);
    // The bulk messages were lent to rank 1 until its receipt (flow control, as copies are):
    // it comes once rank 1's traffic pauses (a 2 ms timer, late on a loaded machine).
    expect(a!.lentCount).toBe(1);
    for (const end = Date.now() + 5_000; a!.lentCount > 0 && Date.now() < end;) {
      await new Promise((r) => setTimeout(r, 5));
      w.drain(0, () => 0);
    }
    expect(a!.lentCount).toBe(0);
    expect(b!.lentCount).toBe(0);
  });

  it("a restarted sender's new frames are not held behind its old incarnation's mark", () => {
    const w = wire(2, { attempts: [0, 0] });
    const old = w.channels[0]!;
    void old.sendApp(payload(BULK_BYTES_MIN, 3), 1, 1);
    w.step(1, false); // the mark; its message is lost with the sender
    w.queues[1]![1]!.length = 0;
    const again = wire(2, { attempts: [1, 0] });
    // The restarted sender (incarnation 1) sends to the same receiver.
    void again.channels[0]!.sendApp(payload(16, 4), 1, 2);
    const frames = again.queues[1]![0]!.shift()!;
    w.channels[1]!.onFrames(frames);
    expect(w.delivered.map((d) => d.tag)).toEqual([2]);
    // ... and the coordinator's word that it restarted drops what the old one left.
    w.channels[1]!.peerRestarted(0, 1);
    expect(w.delivered.map((d) => d.tag)).toEqual([2]);
  });

  it("the coordinator's word that a sender restarted drops what its old incarnation left held", () => {
    const w = wire(2, { attempts: [0, 0] });
    void w.channels[0]!.sendApp(payload(BULK_BYTES_MIN, 3), 1, 1);
    void w.channels[0]!.sendApp(payload(16, 4), 1, 2);
    w.step(1, false); // the mark
    w.step(1, false); // the small message, held behind it; the bulk message is lost
    w.queues[1]![1]!.length = 0;
    expect(w.channels[1]!.heldCount).toBe(2);
    w.channels[1]!.peerRestarted(0, 1);
    expect(w.channels[1]!.heldCount).toBe(0);
    expect(w.delivered).toEqual([]);
  });
});

describe("bulk messages: the job's message limit", () => {
  it("a bulk message over --max-message is refused at the sender, as a copied one is, and sends nothing", async () => {
    const w = wire(2, { maxMessageBytes: BULK_BYTES_MIN });
    const err = await w.channels[0]!.sendApp(payload(BULK_BYTES_MIN + 8, 3), 1, 5).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: "MPI_LIMIT" });
    expect(w.bulkFrames).toEqual([]);
    expect(w.queues[1]![0]!).toEqual([]);
    expect(w.channels[0]!.lentCount).toBe(0);
    // Within the limit the same path is taken and delivered.
    await w.channels[0]!.sendApp(payload(BULK_BYTES_MIN, 4), 1, 6);
    w.drain(1, () => 0.5);
    expect(w.bulkFrames).toHaveLength(1);
    expect(w.delivered.map((d) => [d.tag, d.data.length])).toEqual([[6, BULK_BYTES_MIN]]);
  });
});
