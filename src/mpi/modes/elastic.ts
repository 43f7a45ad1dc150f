/**
 * Mode elastic: the job goes on with the ranks it has. When a rank is gone the others go back,
 * in memory, to the newest checkpoint they all reached and go on as a smaller world with ranks
 * renumbered 0..size-1; a rank that can be started (again) joins at the next checkpoint and
 * gets the state from the new world's rank 0. The protocol's driver (src/cpr/elastic, plugged in
 * through the {@link ElasticHook} seam) decides; this adapter binds it to the communicator.
 *
 * - **Worlds over slots.** Every process has a fixed slot (`LIFELINE_RANK`, below `--max-np`):
 *   the channel, the transport and the collective runner address slots. A world is a list of
 *   slots; a collective runs over it with each rank's messages going to its slot, and its frames
 *   carry the world's id (the header's epoch), so frames of another world never mix in (the
 *   driver holds those of a world this rank has not entered yet). `world.rank` and `world.size`
 *   change only when this rank enters a new world, at a checkpoint location.
 * - **The program learns of a change** by MPI_WORLD_CHANGED from the call it is in: the
 *   collective a lost rank can no longer complete, the checkpoint() at which ranks join, or a
 *   finalize() not yet released. Every call but restore() is then refused until it calls
 *   restore(), which returns the checkpoint the new world starts from (its own; a rank that
 *   joins gets rank 0's) — the program re-partitions its data by the new rank and size.
 * - **Point-to-point calls are refused** (MPI_MODE): ranks are renumbered and data
 *   re-partitioned at a change, so a message between two ranks of the world before has no
 *   meaning in the next one.
 * - Bootstrap collectives run once in the first world; their results go to every rank that
 *   joins with its state.
 *
 * @example
 * const mode = new ElasticMode(core, elasticHook());
 */
import { LifelineError } from "../../errors.ts";
import { BouncePool } from "../bounce-pool.ts";
import { decodeValueOwned, encodeValue } from "../codec.ts";
import type { CollKind } from "../coll-runner.ts";
import type * as coll from "../collectives.ts";
import type { CoordinatorToRank } from "../control.ts";
import { type ElasticHook, type ElasticHookFactory, type ElasticWorldAccess, PROTO_ELASTIC_BASE, worldChanged } from "../elastic-hook.ts";
import { type Header, Kind } from "../wire.ts";
import { type ModeCore, NoneMode, type RestoredState } from "./none.ts";

/** The world a collective runs in: each rank's slot, and this process's rank. */
interface InWorld {
  readonly slots: readonly number[];
  readonly rank: number;
}

/** The collective's messages in world `w`: rank r's go to slot `w.slots[r]`. */
function inWorld(io: coll.CollectiveIo, w: InWorld): coll.CollectiveIo {
  const slots = w.slots;
  return {
    rank: w.rank,
    size: slots.length,
    send: (dest, step, body) => io.send(slots[dest]!, step, body),
    recv: (source, step) => io.recv(slots[source]!, step),
    ...(io.retainResult === undefined ? {} : { retainResult: io.retainResult }),
  };
}

/**
 * Checkpoints of at least this size are encoded into pooled memory, reused once the protocol
 * drops them (fresh memory faults in every page: several times the copy itself).
 */
const CKPT_POOL_BYTES_MIN = 64 * 1024;
/** Idle checkpoint memory kept for reuse (a rank keeps up to three checkpoints). */
const CKPT_POOL_BYTES_MAX = 512 * 1024 * 1024;

export class ElasticMode extends NoneMode {
  private readonly hook: ElasticHook;
  private world: InWorld = { slots: [], rank: 0 };
  /** The id of the world this rank runs in: the epoch of its collective frames. */
  private view = 0;
  /** Rejects when a member is gone: every running collective (but bootstrap ones) races it. */
  private stop!: Promise<never>;
  private stopNow!: (err: LifelineError) => void;
  /** finalize() passed its barrier and waits for the release. */
  private finalizing = false;
  private readonly pool = new BouncePool(CKPT_POOL_BYTES_MAX, 8);
  private readonly pooled = new WeakSet<Buffer>();

  constructor(core: ModeCore, factory: ElasticHookFactory) {
    super(core);
    this.arm();
    this.hook = factory(this.access(), core.host);
  }

  private arm(): void {
    this.stop = new Promise<never>((_, reject) => {
      this.stopNow = reject;
    });
    this.stop.catch(() => undefined);
  }

  /** What the elastic driver may do with this communicator. */
  private access(): ElasticWorldAccess {
    const core = this.core;
    return {
      slot: core.rank,
      attempt: core.attempt,
      maxMessageBytes: core.channel.maxMessageBytes,
      sendProtocol: (dest, tag, body) => core.channel.sendProtocol(dest, tag, body),
      sendControl: (msg) => core.sendControl(msg),
      interrupt: () => {
        this.stopNow(worldChanged("this collective"));
        this.arm();
        if (this.finalizing) {
          this.finalizing = false;
          core.interruptFinalize(worldChanged("finalize()"));
        }
      },
      reshape: (view, rank, slots) => {
        this.view = view;
        this.world = { slots, rank };
        // Collectives of the world before are over (abandoned ones too): numbering starts afresh.
        core.runner.colls.reset(worldChanged("a collective of the world before"));
        core.reshape(rank, slots.length);
      },
      recycle: (buf) => {
        if (this.pooled.delete(buf)) this.pool.release(buf);
      },
      inject: (frame) => core.channel.inject(frame),
      retire: () => core.host.exit(0),
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
    return this.hook.inChange;
  }

  override get stepEpoch(): number {
    return this.core.versions;
  }

  override get restoresAgain(): boolean {
    return this.hook.changed;
  }

  override stamp(h: Header, _dest: number): void {
    if (h.kind === Kind.collective) h.epoch = this.view;
  }

  override classify(header: Header, rawHeader: Buffer, body: Buffer[]): boolean {
    return header.kind !== Kind.collective || this.hook.arrive(header, { header: rawHeader, body });
  }

  override onProtocol(header: Header, body: unknown): boolean {
    if (header.tag < PROTO_ELASTIC_BASE) return false;
    this.hook.onProtocol(header, body);
    return true;
  }

  override onControl(msg: CoordinatorToRank): void {
    if (msg.t === "elastic-view") {
      for (const m of msg.members) {
        if (m.slot === this.core.rank) continue;
        // A slot started again is a new incarnation: frames of the one before are refused from now on.
        this.core.channel.peerRestarted(m.slot, m.attempt);
        this.core.host.transport.connect(m.slot, m.endpoint, m.curveKey);
      }
    }
    if (msg.t === "elastic-view" || msg.t === "elastic-decision" || msg.t === "release") this.hook.onControl(msg);
  }

  override async beforeStart(table: Extract<CoordinatorToRank, { t: "table" }>): Promise<void> {
    this.hook.beforeStart(table);
  }

  /**
   * Ranks are renumbered at a change: point-to-point messages are refused (README,
   * docs/api.md), and the job is stopped with that error — a program that sends them cannot run
   * in this mode at all, and every rank would fail (and be started again) the same way.
   */
  override pointToPoint(what: string): void {
    const err = new LifelineError(
      "MPI_MODE",
      `${what}(): point-to-point messages are not supported in --mode elastic (ranks are renumbered and data re-partitioned when the world changes, so a message between two ranks of the world before has no meaning after it); use collectives, or --mode cpr`,
    );
    this.core.fatal(err);
    throw err;
  }

  override collective<R>(
    kind: CollKind,
    identity: readonly (string | number)[],
    algorithm: (io: coll.CollectiveIo) => Promise<R>,
    _op?: string,
    _root?: number,
    _data?: unknown,
    bootstrapKey?: string,
  ): Promise<R> {
    if (this.hook.changed) return Promise.reject(worldChanged(`${kind}()`));
    if (this.hook.stateless) {
      return Promise.reject(
        new LifelineError(
          "CPR_RESTORE",
          `${kind}() before restore() in a rank that joins a running job (--mode elastic): it gets its state and its world from restore(); only bootstrap collectives may come before it`,
        ),
      );
    }
    const w = this.world;
    const run = this.core.runner.run(kind, identity, (io) => algorithm(inWorld(io, w)));
    // A rank lost during the bootstrap collectives fails the job (they cannot move to another
    // world); the coordinator's decision says so, and the collective waits for that.
    if (bootstrapKey !== undefined) return run;
    run.catch(() => undefined); // an interrupted run may end later; nobody waits for it
    return Promise.race([run, this.stop]);
  }

  override async bootstrapped<R>(key: string | undefined, run: () => Promise<R>): Promise<R> {
    if (key === undefined) return run();
    if (this.hook.changed) throw worldChanged("a bootstrap collective");
    const cached = await this.hook.bootstrap(key);
    // A copy: the cache serves every rank that joins later.
    if (cached !== undefined) return decodeValueOwned(cached) as R;
    const result = await run();
    this.hook.booted(key, encodeValue(result));
    return result;
  }

  override async restore(): Promise<RestoredState | undefined> {
    const got = await this.hook.restore();
    this.core.versions = got.version;
    this.core.resetCollectiveCount();
    if (got.version === 0 || got.state === undefined) return undefined;
    // Copies: the checkpoint stays kept (and may be sent to a rank that joins) while the program
    // changes its objects. Into pooled memory, already faulted in (a rollback just gave back the
    // checkpoints it undid): the copy is the program's from now on, never recycled.
    const alloc = (bytes: number): Buffer => (bytes < CKPT_POOL_BYTES_MIN ? Buffer.allocUnsafeSlow(bytes) : this.pool.acquire(bytes));
    return {
      state: decodeValueOwned(got.state, alloc),
      global: got.global === undefined ? undefined : decodeValueOwned(got.global, alloc),
      version: got.version,
    };
  }

  override async checkpoint(state: unknown, global: unknown): Promise<void> {
    if (this.hook.changed) throw worldChanged("checkpoint()");
    const s = typeof state === "function" ? (state as () => unknown)() : state;
    const alloc = (n: number): Buffer => this.buffer(n);
    await this.hook.checkpoint(encodeValue(s, alloc), encodeValue(global, alloc));
    this.core.versions = this.hook.version;
    this.core.reportStep(false);
  }

  /** Memory for a checkpoint copy (pooled when large; see recycle in access()). */
  private buffer(bytes: number): Buffer {
    if (bytes < CKPT_POOL_BYTES_MIN) return Buffer.allocUnsafe(bytes);
    const buf = this.pool.acquire(bytes);
    this.pooled.add(buf);
    return buf;
  }

  override finalize(): void {
    // Interrupted after the barrier passed: the world changed, the program goes round again.
    if (this.hook.changed) throw worldChanged("finalize()");
    this.finalizing = true;
  }

  override async close(): Promise<void> {
    this.hook.close();
  }
}
