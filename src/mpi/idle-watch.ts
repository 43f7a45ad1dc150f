/**
 * The idle watch: a rank's program that ends without calling `world.finalize()` does not end
 * its process (Lifeline's sockets keep Node's event loop alive), so the job would wait for it
 * without a word. Once a second the watch looks at the rank: the program made no Lifeline call
 * since the last look, none of its calls may still be waiting (World.activity), and Node has
 * nothing of the program's own to wait for (no timer, socket, file operation or child process
 * beyond what was there when `init()` returned). After {@link IDLE_WARN_MS} of that, it says so
 * on the rank's stderr, once until the program calls Lifeline again.
 *
 * Only a warning, never an exit: Node cannot see everything a program may wait for (work an
 * addon runs on its own threads, say), so the watch may speak while a correct program waits,
 * and the words say what to check rather than what happened.
 *
 * @example
 * const stop = startIdleWatch(world, world.rank);
 * world.onClose(stop);
 */
import type { World } from "./world.ts";

/** How long a rank must look idle before the watch speaks. */
export const IDLE_WARN_MS = 5_000;
/** How often it looks. */
const LOOK_EVERY_MS = 1_000;

/** One look at the rank. */
export interface IdleLook {
  readonly nowMs: number;
  /** The program's Lifeline calls so far. */
  readonly calls: number;
  /** A call of the program's may still be waiting. */
  readonly waiting: boolean;
  /** Node has something of the program's own to wait for. */
  readonly ownWork: boolean;
}

/** The watch's decision, pure: feed it looks, it says when to warn. */
export class IdleWatch {
  /** The last look that saw the rank busy (or the first look): the idle stretch starts there. */
  private busyAtMs: number | undefined;
  private lastCalls = -1;
  private warned = false;

  constructor(private readonly warnAfterMs: number = IDLE_WARN_MS) {}

  /** True when this look should warn (once per idle stretch). */
  look(l: IdleLook): boolean {
    const busy = l.waiting || l.ownWork || l.calls !== this.lastCalls;
    this.lastCalls = l.calls;
    if (busy || this.busyAtMs === undefined) {
      this.busyAtMs = l.nowMs;
      this.warned = false;
      return false;
    }
    if (this.warned || l.nowMs - this.busyAtMs < this.warnAfterMs) return false;
    this.warned = true;
    return true;
  }
}

/** Active resources by type (process.getActiveResourcesInfo: what keeps Node's loop alive). */
export function resourceCounts(types: readonly string[]): Map<string, number> {
  const m = new Map<string, number>();
  for (const t of types) m.set(t, (m.get(t) ?? 0) + 1);
  return m;
}

/** Whether `now` holds a resource of some type more often than `base`. */
export function beyond(now: ReadonlyMap<string, number>, base: ReadonlyMap<string, number>): boolean {
  for (const [t, n] of now) if (n > (base.get(t) ?? 0)) return true;
  return false;
}

/** The words of the warning. */
export function idleWarning(rank: number, idleMs: number): string {
  return (
    `lifeline: rank ${rank}: the program has made no Lifeline call for ${Math.round(idleMs / 1000)} s and waits for nothing ` +
    `(no Lifeline call pending, no timer, socket, file or child process of its own), but has not called world.finalize(). ` +
    `If its code has ended, the job will wait for it for ever: end every rank's program with \`await world.finalize()\`.`
  );
}

/**
 * Starts the watch of a real rank process (not the simulator's). Returns its stop; `world`'s
 * close (after finalize) should call it.
 */
export function startIdleWatch(world: World, rank: number): () => void {
  const base = resourceCounts(process.getActiveResourcesInfo());
  const watch = new IdleWatch();
  const timer = setInterval(() => {
    const { calls, waiting } = world.activity();
    const ownWork = beyond(resourceCounts(process.getActiveResourcesInfo()), base);
    if (watch.look({ nowMs: performance.now(), calls, waiting, ownWork })) process.stderr.write(`${idleWarning(rank, IDLE_WARN_MS)}\n`);
  }, LOOK_EVERY_MS);
  timer.unref();
  return () => clearInterval(timer);
}
