/**
 * Young-generation collections paced by the bytes a rank receives.
 *
 * zeromq.js hands each received frame over 128 bytes to JavaScript as a buffer over ZeroMQ's
 * own memory, counts that memory as external to V8's heap, and gives it back when the buffer
 * is collected. V8 starts a full mark-compact of the heap whenever the external memory has
 * grown by 64 MiB since the last one. A scavenge (a young-generation collection) frees the
 * buffers of the messages already handled just as well, since they die young; but V8 runs
 * scavenges as the program allocates, and a rank that mostly receives allocates little. The
 * receiver of a stream of 1 MiB messages ran a mark-compact about every 20 ms, 229 and 246 in two
 * runs, with about 600 scavenges in between (`lifeline run -n 2 --no-gc-pacing
 * bench/programs/stream-loop.ts --bytes 1048576 --iters 5000 --v8-flags=--trace-gc`, rank 1's
 * lines); and the memory of each message was fresh to the allocator, where a freed buffer's
 * would have been reused warm.
 *
 * So the reader loop counts what arrives, and once 16 MiB came in with no collection in
 * between (the used heap did not shrink), it runs a scavenge itself: a pause of 0.1-0.3 ms
 * when little in the young generation is alive. The same runs paced: 0 and 1 mark-compacts. A
 * rank whose own allocations keep V8 collecting (a collective makes its result arrays) is
 * seldom paced. docs/cli.md has what it changes in time.
 *
 * @example
 * const pacer = ReceiveGcPacer.create(); // undefined where V8's gc() cannot be had
 * pacer?.received(frame.length);
 */
import { getHeapStatistics, setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";

/** Received bytes, with no collection seen in between, after which the pacer runs a scavenge. */
export const GC_PACING_BYTES = 16 * 1024 * 1024;
/** Received bytes between two looks at the heap (a look costs about a microsecond). */
export const GC_PACING_CHECK_BYTES = 4 * 1024 * 1024;

/**
 * V8's `gc`, as a function that runs one synchronous scavenge, or undefined where it cannot
 * be had. A process started with `--expose-gc` has it on its global object already. Otherwise
 * the flag that exposes it is set only while a fresh context is made to take it from, then
 * cleared: the program's global object never gets a `gc`, and contexts it makes later do not
 * either.
 */
export function minorGc(): (() => void) | undefined {
  let gc: unknown = (globalThis as { gc?: unknown }).gc;
  if (typeof gc !== "function") {
    try {
      setFlagsFromString("--expose-gc");
      gc = runInNewContext("gc");
    } catch {
      gc = undefined;
    } finally {
      setFlagsFromString("--no-expose-gc");
    }
  }
  if (typeof gc !== "function") return undefined;
  const run = gc as (opts: { type: "minor"; execution: "sync" }) => void;
  return () => run({ type: "minor", execution: "sync" });
}

export class ReceiveGcPacer {
  /** Bytes received since the last look at the heap. */
  private unchecked = 0;
  /** Bytes received since a collection was last seen (or run). */
  private sinceCollection = 0;
  private lastUsed = 0;

  /**
   * @param collect runs one scavenge.
   * @param heapUsed the heap's used bytes: a drop since the last look means V8 collected.
   */
  constructor(
    private readonly collect: () => void,
    private readonly heapUsed: () => number = () => getHeapStatistics().used_heap_size,
    private readonly afterBytes = GC_PACING_BYTES,
    private readonly checkBytes = GC_PACING_CHECK_BYTES,
  ) {
    if (!(afterBytes >= checkBytes && checkBytes > 0))
      throw new RangeError(`pacing after ${afterBytes} bytes, looking every ${checkBytes}: expected 0 < look <= after`);
  }

  /** A pacer with V8's own scavenge, or undefined where that cannot be had. */
  static create(): ReceiveGcPacer | undefined {
    const gc = minorGc();
    return gc === undefined ? undefined : new ReceiveGcPacer(gc);
  }

  /** Counts one arrived message of `bytes`; may run a scavenge (see the file's comment). */
  received(bytes: number): void {
    this.unchecked += bytes;
    if (this.unchecked < this.checkBytes) return;
    this.sinceCollection += this.unchecked;
    this.unchecked = 0;
    const used = this.heapUsed();
    if (used < this.lastUsed) this.sinceCollection = 0;
    this.lastUsed = used;
    if (this.sinceCollection < this.afterBytes) return;
    this.collect();
    this.sinceCollection = 0;
    this.lastUsed = this.heapUsed();
  }
}
