/**
 * A promise with its resolve and reject at hand: how the recovery drivers turn a machine's
 * effect (`checkpointed`, `restored`, …) into the answer of the program's pending call.
 *
 * @example
 * const d = deferred<void>();
 * pending = d;            // the machine's effect later calls d.resolve()
 * return d.promise;
 */
export interface Deferred<T> {
  readonly promise: Promise<T>;
  resolve(v: T): void;
  reject(e: unknown): void;
}

export function deferred<T>(): Deferred<T> {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  promise.catch(() => undefined); // observed by the caller; never an unhandled rejection
  return { promise, resolve, reject };
}
