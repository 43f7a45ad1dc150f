/**
 * Streaming the MPI way, as the OSU bandwidth test does: `n` isends of `data` to `dest` in
 * windows of `window`, each window waited for before the next starts (stream-isend in
 * mpi-bench.ts, `--window` in stream-loop.ts).
 *
 * @example
 * await isendInWindows(world, buf, 1, 7, 400, 64);
 */
import type { World } from "lifeline";

export async function isendInWindows(world: World, data: unknown, dest: number, tag: number, n: number, window: number): Promise<void> {
  for (let i = 0; i < n; i += window) {
    const reqs = [];
    for (let j = i; j < Math.min(n, i + window); j++) reqs.push(world.isend(data, dest, tag));
    await world.waitAll(reqs);
  }
}
