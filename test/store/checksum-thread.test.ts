/**
 * Goal: checksums of large shared memory are computed on the checksum thread, while the main
 * thread is busy, and equal the ones computed here; anything else is computed here, as before.
 *
 * Method: SHA-256 and CRC-32 of SharedArrayBuffer views and of plain buffers, whole and in
 * chunks, against node:crypto and zlib; then a 64 MiB SHA-256 started before the main thread
 * spins for a while: it must be done by the first turn after the spin, which slices on the
 * main thread (8 ms of work a turn) could not be.
 */
import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import { crc32 } from "../../src/store/checksum.ts";
import {
  blockSha256s,
  checksumThreadState,
  crc32OffThread,
  listSha256,
  OFF_THREAD_BYTES_MIN,
  sha256Each,
  sha256OffThread,
} from "../../src/store/checksum-thread.ts";
import { bytesOf } from "./suite.ts";

function shared(bytes: Buffer): Buffer {
  const out = Buffer.from(new SharedArrayBuffer(bytes.length + 16), 8, bytes.length);
  bytes.copy(out);
  return out;
}

const sha256 = (...parts: Uint8Array[]): Buffer => {
  const h = createHash("sha256");
  for (const p of parts) h.update(p);
  return h.digest();
};

describe("checksums off the main thread", () => {
  it("equal node:crypto's and zlib's, for shared and plain memory, whole and in chunks", async () => {
    for (const n of [0, 1000, OFF_THREAD_BYTES_MIN, 3 * OFF_THREAD_BYTES_MIN + 5]) {
      const plain = bytesOf(n, n + 1);
      const inShared = shared(plain);
      const cut = Math.floor(n / 3);
      const chunks = [inShared.subarray(0, cut), bytesOf(10, 2), inShared.subarray(cut)];
      expect((await sha256OffThread(inShared)).equals(sha256(plain))).toBe(true);
      expect((await sha256OffThread(plain)).equals(sha256(plain))).toBe(true);
      expect((await sha256OffThread(chunks)).equals(sha256(...chunks))).toBe(true);
      expect(await crc32OffThread(inShared)).toBe(crc32(plain));
      expect(await crc32OffThread(chunks)).toBe(crc32(Buffer.concat(chunks)));
    }
    expect(checksumThreadState()).toEqual({ pending: 0, broken: false });
  });

  it("hash each of many views, empty ones too, the same on the thread and here", async () => {
    const plain = [bytesOf(3 << 20, 1), bytesOf(0, 2), bytesOf(5, 3), bytesOf(9 << 20, 4), bytesOf(0, 5)];
    const expected = plain.map((v) => sha256(v).toString("hex"));
    for (const views of [plain, plain.map(shared), []]) {
      expect((await sha256Each(views)).map((d) => d.toString("hex"))).toEqual(views.length === 0 ? [] : expected);
    }
  });

  it("hash blocks across chunk boundaries, the same on the thread and here", async () => {
    const block = 1 << 20;
    for (const n of [0, 5, block, 3 * block, 3 * block + 1234]) {
      const plain = bytesOf(n, n + 3);
      const expected = n === 0 ? [sha256()] : Array.from({ length: Math.ceil(n / block) }, (_, i) => sha256(plain.subarray(i * block, (i + 1) * block)));
      const inShared = shared(plain);
      const cut = Math.floor(n / 2) + 3;
      for (const data of [inShared, plain, [inShared.subarray(0, cut), inShared.subarray(cut)], [plain.subarray(0, 7), plain.subarray(7)]]) {
        const got = await blockSha256s(data, block);
        expect(got.map((d) => d.toString("hex"))).toEqual(expected.map((d) => d.toString("hex")));
        expect(listSha256(got).equals(sha256(...expected))).toBe(true);
      }
    }
    expect(() => blockSha256s(Buffer.alloc(1), 0)).toThrow(RangeError);
  });

  it("hash shared memory while the main thread computes", async () => {
    const big = shared(bytesOf(64 << 20, 7));
    const expected = sha256(big);
    let done: Buffer | undefined;
    const hashing = sha256OffThread(big).then((d) => (done = d));
    // The thread has the whole 64 MiB hashed long before this spin ends (about 35 ms of work).
    const until = performance.now() + 1_500;
    while (performance.now() < until);
    await new Promise<void>((resolve) => setImmediate(resolve));
    expect(done?.equals(expected)).toBe(true);
    await hashing;
  });
});
