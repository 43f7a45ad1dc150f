/**
 * Public vocabulary of the communicator (README, "Writing a program"), shared by every mode.
 */
import type { Mode } from "./env.ts";

/** Receive from any source (MPI_ANY_SOURCE). */
export const ANY_SOURCE = -1;
/** Receive any tag (MPI_ANY_TAG). */
export const ANY_TAG = -1;
/** Largest tag a program may use (MPI guarantees at least 32767; we allow 2^30 - 1). */
export const TAG_MAX = 0x3fffffff;

/** A received message. */
export interface Message<T = unknown> {
  data: T;
  source: number;
  tag: number;
}

/** Envelope of a pending message, as `probe`/`iprobe` report it. */
export interface Status {
  source: number;
  tag: number;
}

export type ReduceOpName = "sum" | "prod" | "min" | "max" | "land" | "lor" | "band" | "bor";
/**
 * A reduction: a built-in name, or a function combining two values. A function is applied to
 * numbers and bigints directly, element-wise to typed arrays and plain arrays, and to other
 * values whole. It must be associative; reductions always combine in a fixed order, so it need
 * not be commutative for results to be reproducible.
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- a user op combines whatever the program reduces
export type ReduceOp = ReduceOpName | ((a: any, b: any) => any);

export interface CollectiveOptions {
  /**
   * Marks a collective that runs once before the first checkpoint (reading sizes, seeding).
   * `true` keys it by call site; a string keys it explicitly. Its result is kept for the
   * job's lifetime and replayed to a restarted rank.
   */
  bootstrap?: true | string;
}

/** A non-blocking operation. `wait()` may be called more than once; `test()` never blocks. */
export interface Request<T> {
  wait(): Promise<T>;
  test(): T | undefined;
  /** True once complete (successfully or not). */
  readonly done: boolean;
}

/** What `restore()` returns after a recovery. */
export interface Restored<S, G = undefined> {
  state: S;
  global: G;
  version: number;
}

export interface WorldApi {
  readonly rank: number;
  readonly size: number;
  readonly mode: Mode;
  readonly attempt: number;

  send(data: unknown, dest: number, tag?: number): Promise<void>;
  recv<T = unknown>(source?: number, tag?: number): Promise<Message<T>>;
  isend(data: unknown, dest: number, tag?: number): Request<void>;
  irecv<T = unknown>(source?: number, tag?: number): Request<Message<T>>;
  probe(source?: number, tag?: number): Promise<Status>;
  iprobe(source?: number, tag?: number): Status | undefined;
  waitAll<T>(reqs: readonly Request<T>[]): Promise<T[]>;
  waitAny<T>(reqs: readonly Request<T>[]): Promise<{ index: number; value: T }>;

  barrier(): Promise<void>;
  bcast<T>(data: T, root?: number, opts?: CollectiveOptions): Promise<T>;
  reduce<T>(data: T, op?: ReduceOp, root?: number): Promise<T | undefined>;
  allreduce<T>(data: T, op?: ReduceOp, opts?: CollectiveOptions): Promise<T>;
  gather<T>(data: T, root?: number): Promise<T[] | undefined>;
  scatter<T>(items: readonly T[] | undefined, root?: number): Promise<T>;
  allgather<T>(data: T, opts?: CollectiveOptions): Promise<T[]>;
  alltoall<T>(items: readonly T[]): Promise<T[]>;

  restore<S, G = undefined>(): Promise<Restored<S, G> | undefined>;
  checkpoint<S, G = undefined>(state: S | (() => S), global?: G): Promise<void>;
  nondet<T>(fn: () => T): T;
  finalize(result?: unknown): Promise<void>;
}
