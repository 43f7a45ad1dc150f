// Goal: every collective algorithm gives the right answer, in rank order, for 1..9 ranks —
// including the non-power-of-two folds and tree shapes that the multi-process tests (at most
// 4 ranks) cannot reach — and every rank gets bit-identical reductions. Method: run p virtual
// ranks of the pure algorithms in one process over an in-memory mailbox (each message is
// copied, as a socket would), delivering in a seeded random order.
import { describe, expect, it } from "vitest";
import * as coll from "../../src/mpi/collectives.ts";
import type { EncodedBody } from "../../src/mpi/codec.ts";
import { encodeHeader, Kind, type Header } from "../../src/mpi/wire.ts";
import { Prng } from "../../src/testing/prng.ts";

/**
 * p virtual ranks; messages are delivered after a random number of event-loop turns, as copies
 * taken at send time. A socket reads a sent buffer at some moment before delivery, so a sender
 * that writes a buffer it handed over between those two moments is caught: `written` lists
 * every such buffer.
 */
function cluster(p: number, seed: number, watch?: { written: string[] }): coll.CollectiveIo[] {
  const prng = new Prng(seed);
  const rnd = (): number => prng.float();
  const boxes = new Map<string, coll.Arrival>();
  const waiting = new Map<string, (a: coll.Arrival) => void>();
  return Array.from({ length: p }, (_, rank) => ({
    rank,
    size: p,
    send: async (dest: number, step: number, body: EncodedBody) => {
      const header: Header = {
        kind: Kind.collective,
        flags: 0,
        encoding: body.encoding,
        key: 1,
        source: rank,
        tag: step,
        channelSeq: 0,
        epoch: 0,
        collSeq: 0,
        signature: 0,
        arrayType: body.arrayType,
        attempt: 0,
      };
      void encodeHeader(header);
      const arrival = { header, frames: body.frames.map((f) => Buffer.from(f)) };
      const key = `${rank}>${dest}@${step}`;
      const delay = Math.floor(rnd() * 3);
      setTimeout(() => {
        body.frames.forEach((f, i) => {
          if (!Buffer.from(f.buffer, f.byteOffset, f.byteLength).equals(arrival.frames[i]!)) watch?.written.push(key);
        });
        const w = waiting.get(key);
        if (w !== undefined) {
          waiting.delete(key);
          w(arrival);
        } else boxes.set(key, arrival);
      }, delay);
    },
    recv: (source: number, step: number) => {
      const key = `${source}>${rank}@${step}`;
      const ready = boxes.get(key);
      if (ready !== undefined) {
        boxes.delete(key);
        return Promise.resolve(ready);
      }
      return new Promise((resolve) => waiting.set(key, resolve));
    },
  }));
}

const f64 = (r: number, n: number): Float64Array => Float64Array.from({ length: n }, (_, i) => (r + 1) * 0.1 + i * 1e-3);
const bytes = (a: ArrayBufferView): string => Buffer.from(a.buffer, a.byteOffset, a.byteLength).toString("hex");
const sizes = [1, 2, 3, 4, 5, 6, 7, 8, 9];

describe("collective algorithms over 1..9 virtual ranks", () => {
  it.each(sizes)("large allreduce: the same bits on every rank and under every delivery order, retained parts = result (p=%i)", async (p) => {
    // Order-sensitive sums: 1e16 + 1 - 1e16 is 0 or 1 (or 2) depending on the combining order.
    const n = coll.largeAllreduceBytesMin(p) / 8 + p;
    const input = (r: number): Float64Array =>
      Float64Array.from({ length: n }, (_, i) => ((r + i) % 3 === 0 ? 1e16 : (r + i) % 3 === 1 ? 1 : -1e16) + i * 1e-7);
    const seen = new Set<string>();
    for (const seed of [1, 2, 3]) {
      const retained: (Buffer[] | undefined)[] = [];
      const ios = cluster(p, seed * 7919 + p).map((io) => ({
        ...io,
        retainResult: (_t: number, parts: readonly Buffer[]) => {
          retained[io.rank] = [...parts];
        },
      }));
      const sums = await Promise.all(ios.map((io) => coll.allreduce(io, input(io.rank), "sum")));
      for (const x of sums) seen.add(bytes(x));
      for (let r = 0; r < p; r++) if (retained[r] !== undefined) expect(Buffer.concat(retained[r]!).toString("hex")).toBe(bytes(sums[r]!));
    }
    expect(seen.size).toBe(1);
  });

  it("on 2 ranks an allreduce is one exchange below TWO_RANK_HALVING_BYTES_MIN and two from it, with the same bits on both", async () => {
    // Values far apart in magnitude: both ranks must end with the same bits, the exact sums.
    const input = (r: number, n: number): Float64Array => Float64Array.from({ length: n }, (_, i) => (r === 0 ? 1e16 : 1) + i * 1e-7 - (i % 2) * 1e16);
    for (const [size, exchanges] of [
      [coll.RING_BYTES_MIN, 1],
      [coll.TWO_RANK_HALVING_BYTES_MIN - 8, 1],
      [coll.TWO_RANK_HALVING_BYTES_MIN, 2],
    ] as const) {
      const n = size / 8;
      const sends = [0, 0];
      const ios = cluster(2, n).map((io) => ({
        ...io,
        send: (dest: number, step: number, body: EncodedBody) => {
          sends[io.rank]!++;
          return io.send(dest, step, body);
        },
      }));
      const sums = await Promise.all(ios.map((io) => coll.allreduce(io, input(io.rank, n), "sum")));
      expect(sends, `${size} bytes`).toEqual([exchanges, exchanges]);
      expect(bytes(sums[0]!)).toBe(bytes(sums[1]!));
      for (const i of [0, 1, n - 1]) expect(sums[0]![i]).toBe(input(0, n)[i]! + input(1, n)[i]!);
    }
  });

  it("the retry-one fixture's allreduces (16 MiB of Float64, sum and max, 4 ranks) offer their chunks on every rank", async () => {
    // test/integration/retry-one.test.ts serves a restarted rank these results from the chunks
    // (test/fixtures/retry-one/large.ts); retry-one keeps them so only when the algorithm
    // offers them, at this size (keepsResultChunks, test/unit/retry-one-result-chunks.test.ts).
    const p = 4;
    const n = 2 * 1024 * 1024;
    for (const op of ["sum", "max"] as const) {
      const retained: (Buffer[] | undefined)[] = [];
      const ios = cluster(p, 17).map((io) => ({
        ...io,
        retainResult: (_t: number, parts: readonly Buffer[]) => {
          retained[io.rank] = [...parts];
        },
      }));
      const outs = await Promise.all(
        ios.map((io) =>
          coll.allreduce(
            io,
            Float64Array.from({ length: n }, (_, i) => (i * (io.rank + 3)) % 111),
            op,
          ),
        ),
      );
      for (let r = 0; r < p; r++) {
        expect(retained[r], `rank ${r}, ${op}`).toBeDefined();
        expect(retained[r]!.reduce((b, x) => b + x.byteLength, 0)).toBe(16 * 1024 * 1024);
        expect(Buffer.concat(retained[r]!).equals(Buffer.from(outs[r]!.buffer, outs[r]!.byteOffset, outs[r]!.byteLength)), `rank ${r}, ${op}`).toBe(true);
      }
    }
  });

  it.each([1, 2, 3, 4, 5, 8])("no buffer is written once sent, not even by the program after the call returns (p=%i)", async (p) => {
    // Above RING_BYTES_MIN (the large algorithms), below it (recursive doubling), tiny.
    const n = coll.RING_BYTES_MIN / 8 + 1000 + p;
    const kinds: ((r: number) => Float64Array | Int32Array | Buffer)[] = [
      (r) => f64(r, n),
      (r) => Int32Array.from({ length: 2 * n }, (_, i) => r * 7 + i),
      (r) => Buffer.from(Uint8Array.from({ length: coll.RING_BYTES_MIN + 6000 }, (_, i) => (r + i) & 0xff)),
      (r) => f64(r, 20_000),
      (r) => Buffer.from([r, 1, 2]),
    ];
    for (const [k, make] of kinds.entries()) {
      const watch = { written: [] as string[] };
      const ios = cluster(p, 31 * p + k, watch);
      let want = 0;
      for (let r = 0; r < p; r++) want += make(r)[1]!;
      // Each rank checks its input and result the moment the call returns, then scribbles
      // over both, as a program may; a message still undelivered from either shows.
      const run = async (io: coll.CollectiveIo, call: (x: ReturnType<typeof make>) => Promise<ArrayBufferView | undefined>): Promise<string> => {
        const input = make(io.rank);
        const before = bytes(input);
        const out = await call(input);
        expect(bytes(input)).toBe(before);
        const got = out === undefined ? "" : bytes(out);
        for (const v of [input, out]) if (v !== undefined) new Uint8Array(v.buffer, v.byteOffset, v.byteLength).fill(0xa5);
        return got;
      };
      const sums = await Promise.all(ios.map((io) => run(io, (x) => coll.allreduce(io, x, "sum"))));
      const maxes = await Promise.all(ios.map((io) => run(io, (x) => coll.reduce(io, x, "max", p - 1))));
      await new Promise((resolve) => setTimeout(resolve, 10)); // every delivery is done
      expect(watch.written).toEqual([]);
      expect(new Set(sums).size).toBe(1);
      const all = Array.from({ length: p }, (_, r) => make(r));
      expect(maxes[p - 1]).toBe(bytes(all[0]!.map((_, i) => Math.max(...all.map((x) => x[i]!)))));
      const sum1 = Buffer.from(sums[0]!, "hex");
      const second = k === 0 || k === 3 ? sum1.readDoubleLE(8) : k === 1 ? sum1.readInt32LE(4) : sum1[1]!;
      expect(second).toBeCloseTo(k === 2 || k === 4 ? want & 0xff : want, 9);
    }
  });

  it.each(sizes)("allreduce keeps rank order and gives identical bits (p=%i)", async (p) => {
    for (const n of [1, 100, 5000, 20_000, coll.RING_BYTES_MIN / 8 + 5]) {
      const ios = cluster(p, p * 1000 + n);
      const sums = await Promise.all(ios.map((io) => coll.allreduce(io, f64(io.rank, n), "sum")));
      expect(new Set(sums.map(bytes)).size).toBe(1);
      let expectLast = 0;
      for (let r = 0; r < p; r++) expectLast += f64(r, n)[n - 1]!;
      expect(sums[0]![n - 1]).toBeCloseTo(expectLast, 9);
      // "first" and "last" are associative, not commutative: any reordering shows.
      const firsts = await Promise.all(
        cluster(p, n).map((io) =>
          coll.allreduce(
            io,
            Float64Array.from({ length: n }, () => io.rank),
            (a: number) => a,
          ),
        ),
      );
      const lasts = await Promise.all(cluster(p, n + 1).map((io) => coll.allreduce(io, String(io.rank), (a: string, b: string) => a + b)));
      for (const x of firsts) expect(x[n - 1]).toBe(0);
      for (const x of lasts) expect(x).toBe([...Array(p).keys()].join(""));
    }
  });

  it.each(sizes)("reduce to every root, small and ring-sized (p=%i)", async (p) => {
    for (let root = 0; root < p; root++) {
      for (const n of [3, 20_000, coll.RING_BYTES_MIN / 8 + 5]) {
        const got = await Promise.all(cluster(p, root * 7 + n).map((io) => coll.reduce(io, f64(io.rank, n), "sum", root)));
        got.forEach((g, r) => (r === root ? expect(g).toBeInstanceOf(Float64Array) : expect(g).toBeUndefined()));
        let want = 0;
        for (let r = 0; r < p; r++) want += f64(r, n)[0]!;
        expect((got[root] as Float64Array)[0]).toBeCloseTo(want, 9);
      }
      const order = await Promise.all(cluster(p, root).map((io) => coll.reduce(io, String(io.rank), (a: string, b: string) => a + b, root)));
      expect(order[root]).toBe([...Array(p).keys()].join(""));
    }
  });

  it.each(sizes)("bcast, gather, scatter, allgather, alltoall, barrier (p=%i)", async (p) => {
    for (let root = 0; root < p; root++) {
      const b = await Promise.all(cluster(p, root).map((io) => coll.bcast(io, io.rank === root ? { from: root, a: new Int32Array([root]) } : undefined, root)));
      for (const x of b) expect(x).toEqual({ from: root, a: new Int32Array([root]) });
      const g = await Promise.all(cluster(p, root + 1).map((io) => coll.gather(io, io.rank * 10, root)));
      expect(g[root]).toEqual([...Array(p).keys()].map((r) => r * 10));
      const items = [...Array(p).keys()].map((r) => `to${r}`);
      const s = await Promise.all(cluster(p, root + 2).map((io) => coll.scatter(io, io.rank === root ? items : undefined, root)));
      expect(s).toEqual(items);
    }
    const ag = await Promise.all(cluster(p, 3).map((io) => coll.allgather(io, { r: io.rank })));
    for (const x of ag) expect(x).toEqual([...Array(p).keys()].map((r) => ({ r })));
    const a2a = await Promise.all(
      cluster(p, 4).map((io) =>
        coll.alltoall(
          io,
          [...Array(p).keys()].map((d) => `${io.rank}>${d}`),
        ),
      ),
    );
    a2a.forEach((x, r) => expect(x).toEqual([...Array(p).keys()].map((s) => `${s}>${r}`)));
    await Promise.all(cluster(p, 5).map((io) => coll.barrier(io)));
  });
});
