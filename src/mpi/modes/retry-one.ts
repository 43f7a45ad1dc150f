/**
 * Mode retry-one: only a failed rank restarts; it restores its checkpoint from its peers'
 * memory and gets the results of the collectives it missed from their buffers. The protocol's
 * driver (src/cpr/retry-one, plugged in through the {@link RetryOneHook} seam) decides, for
 * each collective call, whether it runs on the wire (with the sequence number and view id the
 * driver chose) or is answered from a buffer. This adapter binds the driver to the
 * communicator: it runs collectives that way (a run abandoned because a peer failed asks the
 * driver again), keeps every result for the driver (pooled memory for large ones), and
 * rewrites the collectives whose result is not the same on every rank — reduce, gather,
 * scatter, alltoall — into ones whose result is (so a buffered result serves any rank).
 * Point-to-point calls and `nondet()` cannot be replayed from a buffer: they are refused.
 *
 * @example
 * const mode = new RetryOneMode(core, retryOneHook({ replicas: 2, failureTimeoutMs: 5000 }));
 */
import { LifelineError } from "../../errors.ts";
import { BouncePool } from "../bounce-pool.ts";
import { byteLengthOf, decodeValue, encodedValueHead, encodeValue, isTypedArray } from "../codec.ts";
import type { CollKind } from "../coll-runner.ts";
import * as coll from "../collectives.ts";
import type { CoordinatorToRank } from "../control.ts";
import {
  PROTO_RETRY_BASE,
  type RetryCollIdentity,
  type RetryDecision,
  type RetryOneHook,
  type RetryOneHookFactory,
  type RetryWorldAccess,
} from "../retry-hook.ts";
import type { ReduceOp } from "../types.ts";
import { Encoding, type Header, Kind } from "../wire.ts";
import { type CollectiveCall, type ModeCore, NoneMode, type RestoredState } from "./none.ts";

/** Steps of a second algorithm run in the same collective (reduce, then bcast). */
const RETRY_STEP_SHIFT = 1 << 20;
/**
 * Results of at least this size are copied for the result buffer into pooled memory, reused
 * once the protocol drops them at the next checkpoint (fresh memory faults in every page:
 * several times the copy itself).
 */
const RESULT_POOL_BYTES_MIN = 64 * 1024;
/** Idle memory of results and checkpoint copies kept for reuse. */
const RESULT_POOL_BYTES_MAX = 512 * 1024 * 1024;

/** The internal signal that ends a collective the protocol abandoned (never user-visible). */
class Abandoned extends Error {}

/** A collective call as the protocol checks it on replay: op, root, type, length. */
function identOf(op: string, root: number, data: unknown): RetryCollIdentity {
  if (isTypedArray(data)) return { op, root, type: (data as object).constructor.name, length: (data as ArrayLike<unknown>).length };
  if (Array.isArray(data)) return { op, root, type: "msgpack", length: data.length };
  return { op, root, type: data === undefined ? "none" : "msgpack", length: 0 };
}

export class RetryOneMode extends NoneMode {
  private readonly hook: RetryOneHook;
  /** The epoch field of collective frames (the protocol's view id). */
  private collEpoch = 0;
  /** The collective running on the wire, and whether the protocol abandoned it. */
  private retryRun: { seq: number; abandoned: boolean; abandon: () => void } | undefined;
  /** Memory of kept collective results, and the buffers it lent out (see recycle). */
  private readonly resultPool = new BouncePool(RESULT_POOL_BYTES_MAX, 8);
  private readonly pooledResults = new WeakSet<Buffer>();

  constructor(core: ModeCore, factory: RetryOneHookFactory) {
    super(core);
    this.hook = factory(this.access(), core.host);
    core.runner.colls.supersede = true;
  }

  /** What the retry-one driver may do with this communicator. */
  private access(): RetryWorldAccess {
    const core = this.core;
    return {
      rank: core.rank,
      size: core.size,
      attempt: core.attempt,
      sendProtocol: (dest, tag, body) => core.channel.sendProtocol(dest, tag, body),
      caughtUp: (info) => core.sendControl({ t: "retry-caught-up", rank: core.rank, attempt: core.attempt, ...info }),
      recycle: (buf) => {
        if (!this.pooledResults.delete(buf)) return; // not ours (e.g. a transfer's), or given back twice
        this.resultPool.release(buf);
      },
      abandonCollective: (seq) => {
        if (this.retryRun !== undefined && this.retryRun.seq === seq) {
          this.retryRun.abandoned = true;
          this.retryRun.abandon();
        }
        core.runner.colls.abandon(seq, new Abandoned(`collective #${seq} abandoned`));
      },
      inject: (frame) => core.channel.inject(frame),
      fatal: (code, message) => {
        const err = new LifelineError(code, message);
        core.fatal(err);
        core.failPending(err);
      },
    };
  }

  override get viewId(): number {
    return this.hook.viewId;
  }

  override get queriesPaused(): boolean {
    return this.hook.inRecovery;
  }

  override get stepEpoch(): number {
    return this.core.versions;
  }

  override stamp(h: Header, _dest: number): void {
    if (h.kind === Kind.collective) h.epoch = this.collEpoch;
  }

  override classify(header: Header, rawHeader: Buffer, body: Buffer[]): boolean {
    return header.kind !== Kind.collective || this.hook.arrive(header, { header: rawHeader, body });
  }

  override onProtocol(header: Header, body: unknown): boolean {
    if (header.tag < PROTO_RETRY_BASE) return false;
    this.hook.onProtocol(header, body);
    return true;
  }

  override onControl(msg: CoordinatorToRank): void {
    if (msg.t === "peer" || msg.t === "peer-down") this.hook.onControl(msg);
  }

  override async beforeStart(table: Extract<CoordinatorToRank, { t: "table" }>): Promise<void> {
    this.hook.beforeStart(table);
  }

  /** Collectives only are replayed from peers: point-to-point calls are refused (README, docs/api.md). */
  override pointToPoint(what: string): void {
    throw new LifelineError(
      "MPI_MODE",
      `${what}(): point-to-point messages are not recoverable in --mode retry-one (only collectives are replayed from peers); use --mode cpr`,
    );
  }

  override nondet<T>(_fn: () => T): T {
    throw new LifelineError(
      "MPI_MODE",
      "nondet() is not recoverable in --mode retry-one (a restarted rank would compute a different value); broadcast such a value from one rank with a collective, or use --mode cpr",
    );
  }

  /** The collective calls not finished yet, in program order: each starts when the one before ended. */
  private queue: Promise<unknown> = Promise.resolve();
  private inFlight = 0;

  /**
   * Collectives in flight at once (`Promise.all` of two allreduces) run one after another in
   * the order the program called them — the same order on every rank — since the protocol
   * decides, replays and counts one call at a time. Each gets the result it would alone.
   */
  override collective<R>(
    kind: CollKind,
    identity: readonly (string | number)[],
    algorithm: (io: coll.CollectiveIo) => Promise<R>,
    op?: string,
    root = -1,
    data?: unknown,
    bootstrapKey?: string,
  ): Promise<R> {
    // Nothing in flight (the common case): at once, without a hop through the queue.
    this.inFlight++;
    const run =
      this.inFlight === 1
        ? this.runOne(kind, identity, algorithm, op, root, data, bootstrapKey)
        : this.queue.then(() => this.runOne(kind, identity, algorithm, op, root, data, bootstrapKey));
    const left = (): void => {
      this.inFlight--;
    };
    this.queue = run.then(left, left);
    return run;
  }

  /**
   * The protocol answers the call from a buffer (a replay) or has it run on the wire as the
   * given sequence number in the given view; an abandoned run (a peer failed) asks the
   * protocol again.
   */
  private async runOne<R>(
    kind: CollKind,
    identity: readonly (string | number)[],
    algorithm: (io: coll.CollectiveIo) => Promise<R>,
    op?: string,
    root = -1,
    data?: unknown,
    bootstrapKey?: string,
  ): Promise<R> {
    const hook = this.hook;
    const { runner } = this.core;
    const ident = identOf(op ?? kind, root, data);
    let d: RetryDecision = await hook.beforeCollective(bootstrapKey === undefined ? { ident } : { ident, bootstrapKey });
    for (;;) {
      const failure = this.core.failure();
      if (failure !== undefined) throw failure;
      // A copy: the buffer's result may be served again (to another restarted peer), so the
      // program must not get a view of it that it could change.
      if ("result" in d) return decodeValue(Buffer.from(d.result)) as R;
      const { wireSeq, viewId, purgeBelow } = d.run;
      runner.colls.restoreNextSeq(wireSeq);
      runner.colls.purge((a) => a.header.epoch === viewId && a.header.collSeq >= purgeBelow);
      this.collEpoch = viewId;
      // A run blocked in a send to a dead peer never ends by itself: the abandon ends the wait.
      let abandon!: () => void;
      const abandoned = new Promise<never>((_, reject) => {
        abandon = () => reject(new Abandoned(`collective #${wireSeq} abandoned`));
      });
      abandoned.catch(() => undefined);
      const mine = { seq: wireSeq, abandoned: hook.isAbandoned(wireSeq), abandon };
      this.retryRun = mine;
      let result: { value: R } | undefined;
      const retained: { arrayType: number; parts: readonly Buffer[] } = { arrayType: 0, parts: [] };
      // Abandoned before it started (the abandon overtook the decision): not run at all.
      if (!mine.abandoned) {
        try {
          const running = runner.run(kind, identity, algorithm, (arrayType, parts) => Object.assign(retained, { arrayType, parts }));
          running.catch(() => undefined); // an abandoned run may end later; nobody waits for it
          result = { value: await Promise.race([running, abandoned]) };
        } catch (err) {
          if (!(err instanceof Abandoned) && !mine.abandoned) throw err;
        }
      }
      if (this.retryRun === mine) this.retryRun = undefined;
      if (result !== undefined && !mine.abandoned) {
        // The algorithm's own immutable chunks when it offered them (no copy), else a copy.
        const bytes = byteLengthOf(retained.parts);
        hook.afterCollective(
          retained.parts.length > 0
            ? [encodedValueHead(Encoding.typedArray, retained.arrayType, [bytes]), ...retained.parts]
            : encodeValue(result.value, (n) => this.resultBuffer(n)),
        );
        return result.value;
      }
      d = await hook.resumeCollective();
    }
  }

  /** Memory for a kept result or checkpoint copy (pooled when large; see recycle in access()). */
  private resultBuffer(bytes: number): Buffer {
    if (bytes < RESULT_POOL_BYTES_MIN) return Buffer.allocUnsafe(bytes);
    const buf = this.resultPool.acquire(bytes);
    this.pooledResults.add(buf);
    return buf;
  }

  override reduce<T>(call: CollectiveCall, data: T, op: ReduceOp, root: number, opName: string, shape: string): Promise<T | undefined> {
    // A buffered result must serve any rank: the reduce runs as in the other modes (so the
    // root's result is bit for bit theirs: float sums depend on the combining order), then
    // the root broadcasts it, in the same collective with its steps shifted.
    return call(
      "reduce",
      [`root=${root}`, opName, shape, "retry-one"],
      async (io) => {
        const r = await coll.reduce(io, data, op, root);
        const shifted: coll.CollectiveIo = {
          ...io,
          send: (d, step, b) => io.send(d, step + RETRY_STEP_SHIFT, b),
          recv: (src, step) => io.recv(src, step + RETRY_STEP_SHIFT),
        };
        return coll.bcast(shifted, r, root);
      },
      `reduce:${opName}`,
      root,
      data,
    ).then((r) => (this.core.rank === root ? r : undefined));
  }

  override gather<T>(call: CollectiveCall, data: T, root: number): Promise<T[] | undefined> {
    return call("allgather", [`gather root=${root}`], (io) => coll.allgather(io, data), "gather", root).then((r) => (this.core.rank === root ? r : undefined));
  }

  override scatter<T>(call: CollectiveCall, items: readonly T[] | undefined, root: number): Promise<T> {
    // Every rank gets the root's items (a bcast) and picks its own: replayable for any rank.
    return call("bcast", [`scatter root=${root}`], (io) => coll.bcast(io, items, root), "scatter", root).then(
      (all) => (all as readonly T[])[this.core.rank] as T,
    );
  }

  override alltoall<T>(call: CollectiveCall, items: readonly T[]): Promise<T[]> {
    // Every rank gets every row (an allgather: p times the data) and picks its column.
    return call("allgather", ["alltoall"], (io) => coll.allgather(io, items), "alltoall", -1, items).then((rows) =>
      (rows as T[][]).map((row) => row[this.core.rank]!),
    );
  }

  override async restore(): Promise<RestoredState | undefined> {
    const got = await this.hook.restore();
    if (got === undefined) return undefined;
    this.core.versions = got.version;
    // Counted as in the run that took the checkpoint (fault coordinates: version, seqno).
    this.core.resetCollectiveCount();
    return { state: decodeValue(got.state), global: decodeValue(got.global), version: got.version };
  }

  override async checkpoint(state: unknown, global: unknown): Promise<void> {
    // Encoded now (a copy: later changes must not reach the checkpoint), or, for the
    // function form, when the protocol really needs a copy (Rabit's lazy checkpoint).
    const lazy = typeof state === "function";
    const alloc = (n: number): Buffer => this.resultBuffer(n);
    const s = lazy ? () => encodeValue((state as () => unknown)(), alloc) : encodeValue(state, alloc);
    const g = lazy ? () => encodeValue(global, alloc) : encodeValue(global, alloc);
    await this.hook.checkpoint(s, g);
    this.core.versions = this.hook.progress.version;
    this.core.reportStep(true);
  }

  /** The rank stays to serve restarted peers until the release. */
  override finalize(): void {
    this.hook.finalize();
  }

  override async close(): Promise<void> {
    this.hook.close();
  }
}
