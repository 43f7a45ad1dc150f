// Goal: bounce buffers are reused by size class, exact in length, and the pool never keeps
// more idle memory than its bound. Method: drive the pool directly.
import { describe, expect, it } from "vitest";
import { BouncePool } from "../../src/mpi/bounce-pool.ts";

describe("BouncePool", () => {
  it("hands out exact lengths over power-of-two blocks and reuses released blocks", () => {
    const pool = new BouncePool(1 << 20);
    const a = pool.acquire(100_000);
    expect(a.length).toBe(100_000);
    expect(a.buffer.byteLength).toBe(131_072);
    pool.release(a);
    expect(pool.idleBytes).toBe(131_072);
    const b = pool.acquire(70_000);
    expect(b.buffer).toBe(a.buffer);
    expect(b.length).toBe(70_000);
    expect(pool.idleBytes).toBe(0);
    expect(pool.acquire(70_000).buffer).not.toBe(a.buffer);
  });

  it("drops released blocks beyond its idle bound", () => {
    const pool = new BouncePool(200_000);
    const bufs = [pool.acquire(100_000), pool.acquire(100_000)];
    for (const b of bufs) pool.release(b);
    expect(pool.idleBytes).toBe(131_072);
  });
});
