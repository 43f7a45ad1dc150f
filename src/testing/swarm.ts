/**
 * The swarm runs shared by the simulation tests: one seed → one job size, one random program,
 * one set of network, disk and fault knobs (swarm testing: each seed switches features on and
 * off), run under the reference schedule and under the seeded one.
 *
 * @example
 * const { ref, out } = await runNoneSeed(42); // SEED=42 in test/sim reruns exactly this
 */
import { generateProgram, type ProgramSpec, programOf } from "./programs.ts";
import { Prng } from "./prng.ts";
import { SimCluster, type SimOutcome } from "./sim-cluster.ts";

/**
 * Half the programs send a quarter of their point-to-point messages large (64 KiB and more):
 * copied into bounce buffers, or on the bulk connection in the runs of even seeds
 * (simBulkBytesMin).
 */
function withBigMessages(spec: ProgramSpec, prng: Prng): ProgramSpec {
  return prng.chance(0.5) ? { ...spec, p2pBigChance: 0.25 } : spec;
}

/** Mode none: a random program under the reference (fifo) schedule and under the seeded one. */
export async function runNoneSeed(seed: number): Promise<{ spec: ProgramSpec; ref: SimOutcome; out: SimOutcome }> {
  const prng = new Prng(seed);
  const size = prng.rangeInclusive(2, 4);
  const spec = withBigMessages(generateProgram(prng.fork(1), { size, opsMax: 10 }), prng.fork(3));
  const program = programOf(spec);
  const knobs = prng.fork(2);
  const ref = await new SimCluster({ seed, size, mode: "none", program, policy: "fifo", stepsMax: 20_000 }).run();
  const out = await new SimCluster({
    seed,
    size,
    mode: "none",
    program,
    policy: "random",
    stepsMax: 20_000,
    delayMaxMs: knobs.pick([0, 0, 2, 20, 400]),
    advanceChance: knobs.pick([0, 0.01, 0.1, 0.3]),
    stickyChance: knobs.pick([0, 0.5, 0.9]),
  }).run();
  return { spec, ref, out };
}

/**
 * Mode cpr: the program's failure-free reference (mode none, fifo) and a cpr run with a random
 * initiator period, keep-lines, disk speed, network knobs and crash rate (restart-all).
 */
export async function runCprSeed(seed: number): Promise<{ spec: ProgramSpec; ref: SimOutcome; out: SimOutcome }> {
  const prng = new Prng(seed);
  const size = prng.rangeInclusive(2, 4);
  const spec = withBigMessages(generateProgram(prng.fork(1), { size, opsMax: 14, checkpointChance: 0.3 }), prng.fork(3));
  const program = programOf(spec);
  const knobs = prng.fork(2);
  const ref = await new SimCluster({ seed, size, mode: "none", program, policy: "fifo", stepsMax: 20_000 }).run();
  const out = await new SimCluster({
    seed,
    size,
    mode: "cpr",
    program,
    stepsMax: 60_000,
    cpr: {
      every: { ms: knobs.pick([20, 50, 150]) },
      keepLines: knobs.pick([1, 2, 3]),
      slowDisk: knobs.chance(0.5),
      maxRestarts: 10,
    },
    ...recoveryKnobs(knobs),
  }).run();
  return { spec, ref, out };
}

/** Elements of the floor swarm's global: 66 KiB as a Float64Array, past the result pool's 64 KiB minimum. */
const GLOBAL_POOLED_ELEMS = 8448;

/**
 * Mode retry-one: a program's failure-free reference (mode none, fifo) and a retry-one run with
 * random replicas, network knobs and crashes of any rank at any step — also while a rank is
 * being restored, replays, or serves a restore — each restarting that rank alone. A quarter of
 * the seeds run without `peer-down` (only `peer` tells survivors of a restart). With `p2p`,
 * the programs mix point-to-point rounds (every receive style, wildcards, probes, polls,
 * `nondet`), collectives (also in flight at once) and checkpoint locations that only some
 * ranks call; a third of those seeds crash two ranks at once (a host of two). With `floor`,
 * one replica, more crashes, and the durable floor on: failures beyond the replica restart
 * every rank from the newest consistent set of durable checkpoints. With `bigMessages`, a third
 * of the messages carry 64 KiB arrays, which the sender log keeps in pooled memory.
 */
export async function runRetryOneSeed(
  seed: number,
  opts: {
    bigChance?: number;
    hostCrash?: boolean;
    p2p?: boolean;
    floor?: boolean;
    bigMessages?: boolean;
    backoffMs?: (n: number) => number;
    /** Sends to a dead rank wait until its successor is known, or until the transport closes (SimClusterOptions.blockSendsToDead). */
    blockSendsToDead?: boolean | "until-close";
    /** `--checkpoint-every Nsteps`, N drawn from 2..3 (SimRetryOneOptions.checkpointSteps). */
    checkpointSteps?: boolean;
  } = {},
): Promise<{ spec: ProgramSpec; ref: SimOutcome; out: SimOutcome }> {
  const prng = new Prng(seed);
  const size = prng.rangeInclusive(opts.p2p === true ? 3 : 2, 4);
  const spec = generateProgram(prng.fork(1), {
    size,
    opsMax: 12,
    checkpointChance: 0.3,
    collectivesOnly: opts.p2p !== true,
    unevenCheckpoints: opts.p2p === true,
    ...(opts.bigChance === undefined ? {} : { bigChance: opts.bigChance }),
  });
  // The floor's runs also checkpoint a global big enough to live in pooled memory (which the
  // protocol reuses), and their durable writes take time: a restore must still get its own.
  // Only where every rank checkpoints at the same ops: a restarted rank takes its global from a
  // peer's own checkpoint of the same count, which ranks that checkpoint unevenly lack.
  const even = spec.ops.every((op) => op.kind !== "checkpoint" || op.mask === undefined);
  const withGlobal = opts.floor === true && even ? { ...spec, globalElems: GLOBAL_POOLED_ELEMS } : spec;
  // A third of the messages large: the sender log keeps those in pooled memory, reused once
  // the receiver's checkpoint and the sender's own checkpoints no longer need them.
  const program = programOf(opts.bigMessages === true ? { ...withGlobal, p2pBigChance: 0.3 } : withGlobal);
  const knobs = prng.fork(2);
  const ref = await new SimCluster({ seed, size, mode: "none", program, policy: "fifo", stepsMax: 20_000 }).run();
  const pairs = opts.p2p === true && prng.fork(4).chance(1 / 3);
  // The durable floor: one replica, crashes that overlap often, a durable checkpoint every 1–2
  // versions; failures beyond the replica restart every rank from the newest durable line.
  const floor = opts.floor === true ? prng.fork(5) : undefined;
  const out = await new SimCluster({
    seed,
    size,
    mode: "retry-one",
    program,
    stepsMax: 80_000,
    ...(opts.backoffMs === undefined ? {} : { backoffMs: opts.backoffMs }),
    ...(opts.blockSendsToDead === undefined || opts.blockSendsToDead === false ? {} : { blockSendsToDead: opts.blockSendsToDead }),
    retryOne: {
      replicas: knobs.pick([1, 2, 3]),
      maxRestarts: 10,
      failureTimeoutMs: 60_000,
      peerDown: !knobs.chance(0.25),
      ...(floor === undefined ? {} : { replicas: 1, durableEvery: floor.pick([1, 1, 2]), keepLines: floor.rangeInclusive(1, 2), slowDurable: even ? 40 : 1 }),
      // Its own fork: the other knobs of a seed stay as they were.
      ...(opts.checkpointSteps === true ? { checkpointSteps: prng.fork(6).rangeInclusive(2, 3) } : {}),
    },
    // One crash at a time is always covered (replicas ≥ 1); crashes may still overlap a recovery.
    ...recoveryKnobs(knobs),
    ...(floor === undefined ? {} : { crashChance: floor.pick([0.02, 0.05]), crashesMax: floor.rangeInclusive(2, 4) }),
    // One whole host (2..size hosts, ranks in blocks as a hostfile places them) lost at once:
    // covered too, since replicas go to other hosts first.
    ...(opts.hostCrash === true ? { hosts: hostBlocks(size, prng.fork(3).rangeInclusive(2, size)), hostCrashes: true, crashesMax: 1, crashChance: 0.02 } : {}),
    // Two ranks at once: hosts of two ranks each, one of them lost.
    ...(pairs ? { hosts: hostBlocks(size, Math.ceil(size / 2)), hostCrashes: true, crashesMax: 1, crashChance: 0.02 } : {}),
  }).run();
  return { spec, ref, out };
}

/** `size` ranks on `hosts` hosts, in contiguous blocks (as a hostfile fills slots). */
function hostBlocks(size: number, hosts: number): number[] {
  return Array.from({ length: size }, (_, r) => Math.floor((r * hosts) / size));
}

/**
 * The network and crash knobs of the recovery swarms (cpr, retry-one), drawn after the mode's
 * own knobs, in this order, so that a seed keeps its schedule.
 */
function recoveryKnobs(knobs: Prng): { delayMaxMs: number; advanceChance: number; stickyChance: number; crashChance: number; crashesMax: number } {
  return {
    delayMaxMs: knobs.pick([0, 5, 20, 100]),
    advanceChance: knobs.pick([0.05, 0.2, 0.4]),
    stickyChance: knobs.pick([0, 0.5]),
    crashChance: knobs.pick([0, 0.005, 0.02, 0.05]),
    crashesMax: knobs.rangeInclusive(1, 3),
  };
}

/**
 * Partitions, in mode retry-one or cpr: the program's failure-free reference (mode none, fifo)
 * and a run in which ranks' links (or, for some seeds, whole hosts') are cut for 0.5–6 s and
 * healed, with watchdogs beating to the coordinator for a lease. A rank cut off past the
 * failure timeout (2 s) is declared dead and restarted while it runs on in isolation until its
 * lease lapses; its frames that arrive after the heal must be refused.
 */
export async function runPartitionSeed(seed: number, mode: "retry-one" | "cpr"): Promise<{ spec: ProgramSpec; ref: SimOutcome; out: SimOutcome }> {
  const prng = new Prng(seed);
  const size = prng.rangeInclusive(2, 4);
  const spec = generateProgram(prng.fork(1), { size, opsMax: 12, checkpointChance: 0.3, collectivesOnly: mode === "retry-one" });
  const program = programOf(spec);
  const knobs = prng.fork(2);
  const ref = await new SimCluster({ seed, size, mode: "none", program, policy: "fifo", stepsMax: 20_000 }).run();
  const modeOptions =
    mode === "cpr"
      ? { cpr: { every: { ms: knobs.pick([20, 50, 150]) }, keepLines: knobs.pick([1, 2, 3]), maxRestarts: 10 } }
      : { retryOne: { replicas: knobs.pick([1, 2, 3]), maxRestarts: 10, failureTimeoutMs: 60_000 } };
  const out = await new SimCluster({
    seed,
    size,
    mode,
    program,
    stepsMax: 100_000,
    ...modeOptions,
    delayMaxMs: knobs.pick([0, 5, 20, 100]),
    advanceChance: knobs.pick([0.05, 0.2, 0.4]),
    stickyChance: knobs.pick([0, 0.5]),
    lease: { heartbeatMs: 250, failureTimeoutMs: 2000 },
    partitions: { chance: knobs.pick([0.01, 0.03, 0.1]), max: knobs.rangeInclusive(1, 2), durationMs: [500, 6000] },
    // A third of the seeds cut whole hosts (ranks in blocks, as a hostfile places them).
    ...(knobs.chance(1 / 3) ? { hosts: hostBlocks(size, knobs.rangeInclusive(2, size)), hostCrashes: true } : {}),
  }).run();
  return { spec, ref, out };
}
