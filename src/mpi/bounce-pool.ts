/**
 * Reusable send buffers for large payloads ("bounce buffers").
 *
 * A send must copy the program's arrays (the program may reuse them as soon as `send`
 * resolves, but ZeroMQ reads the bytes later, on its I/O thread). Copying 16 MiB into fresh
 * memory costs several times the memcpy itself on this kind of machine, because every page of
 * the new buffer faults in. So large payloads are copied into buffers from this pool, already
 * faulted in, and a buffer comes back to the pool when the receiving process acknowledges the
 * message (a receipt): only then has ZeroMQ certainly finished reading it.
 *
 * @example
 * const buf = pool.acquire(1 << 20); buf.set(bytes); send(buf); // on receipt: pool.release(buf)
 */
export class BouncePool {
  private readonly free = new Map<number, (ArrayBuffer | SharedArrayBuffer)[]>();
  private pooledBytes = 0;

  /**
   * @param maxPooledBytes idle memory the pool may keep; beyond it, released buffers are dropped.
   * @param classesPerOctave block sizes per power of two: 1 = powers of two (up to 2x the
   *   bytes asked for); 8 = at most 1/8 more than asked for (for large, repeating sizes).
   * @param opts.shared blocks are SharedArrayBuffers, which another thread can read without a
   *   copy (see sha256OffThread).
   */
  constructor(
    private readonly maxPooledBytes: number,
    private readonly classesPerOctave = 1,
    private readonly opts: { shared?: boolean } = {},
  ) {}

  /** The block size that serves `bytes`. */
  private blockSize(bytes: number): number {
    let pow = 1;
    while (pow < bytes) pow *= 2;
    if (this.classesPerOctave <= 1 || pow <= 4096) return pow;
    const step = Math.max(4096, pow / 2 / this.classesPerOctave);
    return Math.ceil(bytes / step) * step;
  }

  /** A buffer of exactly `bytes` bytes, backed by a block of a fixed size class that may be reused. */
  acquire(bytes: number): Buffer {
    const size = this.blockSize(bytes);
    const block = this.free.get(size)?.pop();
    if (block !== undefined) {
      this.pooledBytes -= size;
      return Buffer.from(block, 0, bytes);
    }
    return Buffer.from(this.opts.shared === true ? new SharedArrayBuffer(size) : new ArrayBuffer(size), 0, bytes);
  }

  /** Gives back a buffer from {@link acquire} once nothing reads it any more. */
  release(buf: Buffer): void {
    const block = buf.buffer;
    const size = block.byteLength;
    if (this.pooledBytes + size > this.maxPooledBytes) return;
    let list = this.free.get(size);
    if (list === undefined) this.free.set(size, (list = []));
    list.push(block);
    this.pooledBytes += size;
  }

  /** Idle bytes held. */
  get idleBytes(): number {
    return this.pooledBytes;
  }
}
