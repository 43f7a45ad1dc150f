/**
 * Lifeline's public API: `init()` joins the job started by `lifeline run` and returns the
 * communicator (README, "Writing a program").
 *
 * @example
 * import { init } from "lifeline";
 * const world = await init();
 * const sum = await world.allreduce(world.rank, "sum");
 * await world.finalize(sum);
 */
import { type InitOptions, resolveRankPlace } from "./mpi/env.ts";
import { loadRankKeys } from "./mpi/keys.ts";
import { World } from "./mpi/world.ts";
import type { CprHookFactory } from "./mpi/cpr-hook.ts";
import type { RetryOneHookFactory } from "./mpi/retry-hook.ts";
import { startWatchdog } from "./launch/watchdog.ts";
import { BACKOFF_MAX_MS } from "./launch/backoff.ts";
import { startIdleWatch } from "./mpi/idle-watch.ts";

export { ANY_SOURCE, ANY_TAG, TAG_MAX } from "./mpi/types.ts";
export type { CollectiveOptions, Message, ReduceOp, ReduceOpName, Request, Restored, Status, WorldApi } from "./mpi/types.ts";
export type { InitOptions, Mode } from "./mpi/env.ts";
export { LifelineError, isLifelineError, type LifelineErrorCode } from "./errors.ts";
export { waitAll, waitAny } from "./mpi/request.ts";
export type { World };

export { MODES } from "./mpi/env.ts";

/**
 * Joins the job this process was started in (by `lifeline run`, or by another launcher with
 * `LIFELINE_COORDINATOR` set), connects to every peer and returns the communicator.
 * Rejects with `MPI_INIT` if the environment names no job or the coordinator cannot be reached.
 */
export async function init(options: InitOptions = {}): Promise<World> {
  const place = resolveRankPlace(options, process.env);
  // Read once (a remote rank's come on stdin), for the main thread's links and the watchdog's.
  const { keys, warning } = loadRankKeys(place);
  if (warning !== undefined) process.stderr.write(`lifeline: rank ${place.rank}: ${warning}\n`);
  const watchdog = startWatchdog({
    fd: place.watchFd,
    coordinator: place.coordinator,
    rank: place.rank,
    attempt: place.attempt,
    heartbeatMs: place.heartbeatMs,
    failureTimeoutMs: place.failureTimeoutMs,
    faults: place.faults,
    keys: place.transport === "tcp" ? keys : { token: keys.token },
  });
  try {
    await watchdog.ready;
    // cpr: each rank writes its parts of recovery lines into its own part store (LevelDB
    // admits one process per database), opened on first use.
    // The recovery protocols (and LevelDB) load only in their mode: a smaller heap for the
    // garbage collector to mark, and a faster start, in the others.
    let cpr: CprHookFactory | undefined;
    if (place.mode === "cpr") {
      const [{ rankStores }, { coordinatedHook }] = await Promise.all([import("./cpr/coordinated/host-stores.ts"), import("./cpr/coordinated/driver.ts")]);
      const stores = rankStores(place.store, place.rank);
      cpr = coordinatedHook(stores.open, { hostStores: stores.hostStores });
    }
    // retry-one: a dead peer must be running again within the launcher's longest restart
    // back-off plus a start-up (a restarted rank must beat within --failure-timeout) plus the
    // failure timeout; past that the survivors fail with MPI_TIMEOUT. This is the backstop: when
    // --max-restarts is exhausted the launcher stops the job at once (LAUNCH_RESTARTS).
    const deadPeerTimeoutMs = 2 * place.failureTimeoutMs + BACKOFF_MAX_MS;
    // Its durable floor (and a restart of every rank from it) uses the rank's part store, as cpr.
    let retryOne: RetryOneHookFactory | undefined;
    if (place.mode === "retry-one") {
      const [{ retryOneHook }, { LevelRecoveryStore }] = await Promise.all([import("./cpr/retry-one/driver.ts"), import("./store/level-store.ts")]);
      retryOne = retryOneHook({
        replicas: place.replicas,
        failureTimeoutMs: deadPeerTimeoutMs,
        durableEvery: place.durableEvery,
        openParts: () => new LevelRecoveryStore(place.store).openRank(place.rank),
      });
    }
    const elastic = place.mode === "elastic" ? (await import("./cpr/elastic/driver.ts")).elasticHook() : undefined;
    const world = await World.join(place, { cpr, retryOne, keys, elastic });
    watchdog.joined();
    world.onClose(() => watchdog.stop());
    // A program that ends without finalize() would leave its process (and the job) waiting
    // without a word: the watch says so on stderr.
    world.onClose(startIdleWatch(world, place.rank));
    return world;
  } catch (err) {
    watchdog.stop();
    throw err;
  }
}
