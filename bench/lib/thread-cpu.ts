/**
 * The CPU time of the calling thread — in a rank, its main thread, where JavaScript and the
 * garbage collector run — as Linux counts it in /proc/thread-self/schedstat (nanoseconds on a
 * CPU), so that a benchmark can tell work on the main thread from work elsewhere (ZeroMQ's I/O
 * thread, the kernel on its behalf): process.cpuUsage() counts every thread together, and Node
 * 20 has no per-thread counter. One read costs a system call (about 2 µs here): the file stays
 * open for the life of the process (a benchmark reads it thousands of times; opening it each
 * time would double that), and the clock is bound to the thread that made it.
 *
 * @example
 * const cpu = threadCpuClock();
 * const t0 = cpu?.(); work(); const ms = cpu === undefined ? undefined : (cpu() - t0!) / 1e6;
 */
import { closeSync, openSync, readSync } from "node:fs";

/** A reader of this thread's CPU time in ns, or undefined where the system does not say. */
export function threadCpuClock(): (() => number) | undefined {
  let fd: number;
  try {
    fd = openSync("/proc/thread-self/schedstat", "r");
  } catch {
    return undefined;
  }
  const buf = Buffer.alloc(128);
  const read = (): number => {
    const n = readSync(fd, buf, 0, buf.length, 0);
    return Number(buf.toString("latin1", 0, n).split(" ", 1)[0]);
  };
  if (!Number.isFinite(read())) {
    closeSync(fd);
    return undefined;
  }
  return read;
}
