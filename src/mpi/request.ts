/**
 * Non-blocking requests (`isend`/`irecv`), completed by the message layer.
 *
 * A request completes synchronously inside the reader loop when its message matches, so
 * `test()` sees it at once without a microtask hop; `wait()` creates its promise lazily.
 *
 * @example
 * const r = world.irecv(1, 7);
 * while (r.test() === undefined) await doOtherWork();
 */
import { LifelineError } from "../errors.ts";
import type { Request } from "./types.ts";

/**
 * What the program learns by polling a request (`test()`, `done`) depends on timing, so in
 * mode cpr World logs it while recording and replays it on recovery. A poller answers one
 * poll: `{ done, value }` to return, or undefined to answer from the request's own state.
 */
export type Poller<T> = (req: RequestImpl<T>) => { readonly done: boolean; readonly value: T | undefined } | undefined;

export class RequestImpl<T> implements Request<T> {
  private state: "pending" | "done" | "failed" = "pending";
  private value: T | undefined;
  private error: unknown;
  private waiters: { resolve: (v: T) => void; reject: (e: unknown) => void }[] = [];

  /**
   * `poller`: set by World in mode cpr for the requests it creates (see {@link Poller}).
   * `urge`: called when the program waits for or polls the request while it is pending (an
   * isend asks its destination for the receipt it completes on).
   */
  constructor(
    private readonly poller?: Poller<T>,
    private readonly urge?: () => void,
  ) {}

  /** Called once by the layer when the operation completes. */
  complete(value: T): void {
    if (this.state !== "pending") return;
    this.state = "done";
    this.value = value;
    for (const w of this.waiters) w.resolve(value);
    this.waiters = [];
  }

  /** Called once by the layer when the operation fails (abort, finalize, encode error). */
  fail(error: unknown): void {
    if (this.state !== "pending") return;
    this.state = "failed";
    this.error = error;
    for (const w of this.waiters) w.reject(error);
    this.waiters = [];
  }

  /** The program's view (logged/replayed in mode cpr); the layer itself uses {@link settled}. */
  get done(): boolean {
    if (this.state === "pending") this.urge?.();
    const polled = this.poll();
    return polled === undefined ? this.state !== "pending" : polled.done;
  }

  /** Completed or failed, as the layer sees it (never logged). */
  get settled(): boolean {
    return this.state !== "pending";
  }

  /** Failed (abort, finalize): polls of a failed request are not logged, they throw. */
  get failed(): boolean {
    return this.state === "failed";
  }

  /** The value if completed, without going through the poller. */
  peek(): T | undefined {
    if (this.state === "failed") throw this.error;
    return this.state === "done" ? this.value : undefined;
  }

  private poll(): { readonly done: boolean; readonly value: T | undefined } | undefined {
    if (this.poller === undefined || this.state === "failed") return undefined;
    return this.poller(this);
  }

  wait(): Promise<T> {
    if (this.state === "done") return Promise.resolve(this.value as T);
    if (this.state === "failed") return Promise.reject(this.error);
    this.urge?.();
    return new Promise<T>((resolve, reject) => this.waiters.push({ resolve, reject }));
  }

  test(): T | undefined {
    if (this.state === "pending") this.urge?.();
    const polled = this.poll();
    if (polled !== undefined) return polled.done ? polled.value : undefined;
    return this.peek();
  }

  /** Registers a completion callback without creating a promise (used by waitAny). */
  onSettle(cb: () => void): void {
    if (this.state !== "pending") return cb();
    this.urge?.();
    this.waiters.push({ resolve: () => cb(), reject: () => cb() });
  }
}

/** Narrows a user-supplied request to ours; anything else is a TypeError. */
export function asImpl<T>(r: Request<T>): RequestImpl<T> {
  if (!(r instanceof RequestImpl)) throw new TypeError("not a Lifeline request (pass what isend/irecv returned)");
  return r;
}

/**
 * Completes when every request has; resolves to their values in order.
 *
 * Not a source of non-determinism, so mode cpr logs nothing for it: its result is every
 * value in argument order, whatever order the requests completed in, and each value is fixed
 * by matching, not by timing (FIFO per channel; a wildcard receive's match is logged on its
 * own). Only calls that *observe* completion order or time — waitAny, test/done, iprobe — can
 * make a replay diverge.
 */
export async function waitAll<T>(reqs: readonly Request<T>[]): Promise<T[]> {
  const impls = reqs.map(asImpl);
  const out: T[] = new Array(impls.length);
  for (let i = 0; i < impls.length; i++) out[i] = await impls[i]!.wait();
  return out;
}

/** Completes when the first (lowest-index, if several are done) request completes. */
export function waitAny<T>(reqs: readonly Request<T>[]): Promise<{ index: number; value: T }> {
  const impls = reqs.map(asImpl);
  if (impls.length === 0) return Promise.reject(new LifelineError("MPI_REQUEST", "waitAny() needs at least one request"));
  const pick = (): { index: number; value: T } | undefined => {
    for (let i = 0; i < impls.length; i++) {
      if (impls[i]!.settled) return { index: i, value: impls[i]!.peek() as T };
    }
    return undefined;
  };
  return new Promise((resolve, reject) => {
    const settle = (): void => {
      try {
        const r = pick();
        if (r !== undefined) resolve(r);
      } catch (err) {
        reject(err);
      }
    };
    settle();
    for (const r of impls) r.onSettle(settle);
  });
}
