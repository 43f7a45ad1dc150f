/**
 * The collective runner: gives each collective call its sequence number and signature, runs
 * its algorithm (collectives.ts) over the channel, files the collective frames that arrive,
 * and catches ranks that call different collectives — by the signature every frame carries,
 * by stray frames of finished collectives, and by asking the peers of a collective blocked
 * for a while for their signature of it (coll-registry.ts). A mismatch is fatal for the job.
 *
 * The mode decides what a collective frame's epoch is (the channel's stamper) and, for
 * retry-one, which view a signature query is about.
 *
 * @example
 * const sum = await runner.run("allreduce", ["sum", "Float64Array[4]"], (io) => coll.allreduce(io, data, "sum"));
 */
import { LifelineError } from "../errors.ts";
import type { Channel } from "./channel.ts";
import { type ActiveCollective, CollectiveRegistry } from "./coll-registry.ts";
import type * as coll from "./collectives.ts";
import { encodeBody } from "./codec.ts";
import type { Host, Timer } from "./host.ts";
import { type Header, Kind } from "./wire.ts";

/** Collective kinds, carried in the top byte of a collective frame's tag for error messages. */
export const COLL_KINDS = ["barrier", "bcast", "reduce", "allreduce", "gather", "scatter", "allgather", "alltoall"] as const;
export type CollKind = (typeof COLL_KINDS)[number];

/** Steps fit in the low 24 bits of the tag; the kind index sits above them. */
const STEP_BITS = 24;
const STEP_MASK = (1 << STEP_BITS) - 1;

/** Protocol-frame tags of the layer's own collective-signature query. */
export const PROTO_COLL_QUERY = 0x100;
export const PROTO_COLL_ANSWER = 0x101;
/** Distinct calls whose signature is kept (beyond it the cache starts afresh). */
const SIGNATURES_MAX = 1024;
/** How often blocked collectives are looked at (see coll-registry.ts). */
const QUERY_TICK_MS = 250;

function fnv1a(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

/** What the runner asks of the mode (mode none: view 0, never paused). */
export interface QueryScope {
  /** The view a query or answer is about; queries of another view are answered "not reached". */
  readonly viewId: number;
  /** Queries are off (retry-one while its recovery rounds run: ranks are at different points). */
  readonly queriesPaused: boolean;
}

export interface RunnerOptions {
  readonly rank: number;
  readonly size: number;
  readonly host: Host;
  readonly channel: Channel;
  /** The rank's failure, if it failed: every collective step rejects with it. */
  readonly failure: () => LifelineError | undefined;
  /** A mismatch: fail collective `c` here and ask the coordinator to stop the job. */
  readonly fatal: (err: LifelineError, c?: ActiveCollective) => void;
  readonly scope: QueryScope;
}

/** Marks a promise's rejection handled (one function for every collective send: no closure each). */
const ignoreRejection = (): undefined => undefined;

export class CollectiveRunner {
  readonly colls: CollectiveRegistry;
  private timer: Timer | undefined;
  private readonly rank: number;
  private readonly size: number;
  private readonly host: Host;
  private readonly channel: Channel;
  private readonly failure: () => LifelineError | undefined;
  private readonly fatal: RunnerOptions["fatal"];
  private readonly scope: QueryScope;
  private readonly signatures = new Map<string, { readonly signature: number; readonly call: string }>();

  constructor(opts: RunnerOptions) {
    this.rank = opts.rank;
    this.size = opts.size;
    this.host = opts.host;
    this.channel = opts.channel;
    this.failure = opts.failure;
    this.fatal = opts.fatal;
    this.scope = opts.scope;
    this.colls = new CollectiveRegistry(opts.rank);
  }

  /** Starts looking at blocked collectives (once the transport runs). */
  start(): void {
    this.timer = this.host.every(QUERY_TICK_MS, () => this.queryOverdue());
  }

  /** Fails every pending collective and stops the queries. */
  failAll(err: LifelineError): void {
    this.colls.failAll(err);
    this.timer?.stop();
  }

  /**
   * Runs one collective: assigns its sequence number and signature synchronously (so calls
   * keep program order even when not awaited one by one), then the algorithm.
   * `retainResult`: see CollectiveIo.
   */
  run<R>(
    kind: CollKind,
    identity: readonly (string | number)[],
    algorithm: (io: coll.CollectiveIo) => Promise<R>,
    retainResult?: (arrayType: number, parts: readonly Buffer[]) => void,
  ): Promise<R> {
    const kindIndex = COLL_KINDS.indexOf(kind);
    const { signature, call } = this.signatureOf(kind, identity);
    const c = this.colls.begin(signature, call, this.host.now());
    const channel = this.channel;
    const io: coll.CollectiveIo = {
      rank: this.rank,
      size: this.size,
      send: (dest, step, body) => {
        const failure = this.failure();
        const tag = (kindIndex << STEP_BITS) | step;
        const sent =
          failure !== undefined ? Promise.reject(failure) : channel.transmit(dest, channel.header(Kind.collective, dest, tag, body, c.seq, c.signature), body);
        // An algorithm that stops at a failed receive never awaits the sends it started; one of
        // them may fail later (its peer died, and the transport gave it up once the peer's
        // successor was known). Handled here, so that is not an unhandled rejection, which
        // would end the rank's process; an algorithm that awaits it still sees the failure.
        sent.catch(ignoreRejection);
        return sent;
      },
      recv: (source, step) => {
        const failure = this.failure();
        return failure !== undefined ? Promise.reject(failure) : this.colls.recv(c, source, step);
      },
      ...(retainResult === undefined ? {} : { retainResult }),
    };
    // retry-one: a run the protocol abandoned (no longer active) may still end later; ignore it.
    const gone = (): boolean => this.colls.supersede && this.colls.activeCollective(c.seq) !== c;
    return algorithm(io).then(
      (result) => {
        if (gone()) return result;
        try {
          this.colls.end(c);
        } catch (err) {
          this.fatal(err as LifelineError);
          throw err;
        }
        return result;
      },
      (err: unknown) => {
        if (gone()) throw err;
        if (err instanceof LifelineError && (err.code === "MPI_COLLECTIVE_MISMATCH" || err.code === "MPI_OP")) this.fatal(err, c);
        throw err;
      },
    );
  }

  /**
   * A call's signature and description, computed once per distinct call: a program makes
   * the same few calls over and over.
   */
  private signatureOf(kind: CollKind, identity: readonly (string | number)[]): { signature: number; call: string } {
    const key = identity.length === 0 ? kind : `${kind}\u0001${identity.join("\u0001")}`;
    let sig = this.signatures.get(key);
    if (sig === undefined) {
      if (this.signatures.size >= SIGNATURES_MAX) this.signatures.clear();
      sig = { signature: fnv1a(key), call: `${kind}(${identity.join(", ")})` };
      this.signatures.set(key, sig);
    }
    return sig;
  }

  /** A collective frame from a peer (or re-injected). */
  arrive(header: Header, body: Buffer[]): void {
    const stray = this.colls.arrive({ header, frames: body }, header.tag & STEP_MASK);
    if (stray !== undefined) this.fatal(stray);
  }

  /** Asks every peer for its signature of each collective blocked here for a while. */
  private queryOverdue(): void {
    if (this.failure() !== undefined || this.scope.queriesPaused) return;
    for (const c of this.colls.overdue(this.host.now())) {
      const body = encodeBody({ seq: c.seq, view: this.scope.viewId }, { copy: false });
      for (let r = 0; r < this.size; r++) {
        if (r !== this.rank) void this.channel.transmit(r, this.channel.header(Kind.protocol, r, PROTO_COLL_QUERY, body), body).catch(() => undefined);
      }
    }
  }

  /** A peer's query about collective `seq` (of view `view`). */
  onQuery(source: number, seq: number, view: unknown): void {
    // A query of another view is about another execution (answer "not reached").
    const mine = view !== this.scope.viewId ? undefined : this.colls.signatureOf(seq);
    this.channel.sendProtocol(source, PROTO_COLL_ANSWER, { seq, signature: mine?.signature ?? null, call: mine?.call ?? null, view: this.scope.viewId });
  }

  /** A peer's answer: a different signature for a collective still running here is a mismatch. */
  onAnswer(source: number, seq: number, signature: unknown, call: unknown, view: unknown): void {
    const c = this.colls.activeCollective(seq);
    if (c === undefined || typeof signature !== "number" || signature === c.signature) return;
    if (this.scope.queriesPaused || view !== this.scope.viewId) return;
    this.fatal(
      new LifelineError(
        "MPI_COLLECTIVE_MISMATCH",
        `collective #${seq}: rank ${this.rank} called ${c.call}, but rank ${source} called ${String(call)}; every rank must make the same collective calls in the same order`,
      ),
      c,
    );
  }
}
