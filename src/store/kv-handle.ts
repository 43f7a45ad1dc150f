/**
 * What the line manifest and a rank's part store share as handles on one key-value database:
 * writes one at a time in call order, a read-only mode for inspection tools, a close that
 * waits for the writes and then releases the database (and its lock), and clear errors for a
 * handle used after close.
 *
 * @example
 * class Thing extends KvHandle {
 *   constructor(kv: KvDb) { super(kv, { what: "the thing" }); }
 *   put(v: Uint8Array) { this.ensureOpen(); this.checkWritable("put"); return this.serial(() => this.kv.write(...)); }
 * }
 */
import type { KvDb } from "./backend.ts";
import { notOpen } from "./records.ts";

export abstract class KvHandle {
  readonly location: string;
  private closed = false;
  private queue: Promise<unknown> = Promise.resolve();
  private readonly readOnly: boolean;
  private readonly onClose: (() => void) | undefined;
  /** How errors name this handle, e.g. "the line manifest". */
  private readonly handleName: string;

  protected constructor(
    protected readonly kv: KvDb,
    opts: { what: string; readOnly?: boolean | undefined; onClose?: (() => void) | undefined },
  ) {
    this.location = kv.location;
    this.handleName = opts.what;
    this.readOnly = opts.readOnly ?? false;
    this.onClose = opts.onClose;
  }

  /** Marks the handle dead without touching the backends (the memory store's crash()). */
  invalidate(): void {
    this.closed = true;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.queue.catch(() => undefined); // its errors went to their callers already
    try {
      await this.kv.close();
    } finally {
      this.onClose?.();
    }
  }

  /** Runs `fn` after every earlier write has settled. */
  protected serial<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.queue.then(fn, fn);
    this.queue = run.catch(() => undefined);
    return run;
  }

  protected ensureOpen(): void {
    if (this.closed) throw notOpen(`${this.handleName} (${this.location})`);
  }

  protected checkWritable(op: string): void {
    if (this.readOnly) throw new TypeError(`${op}: ${this.handleName} was opened read-only`);
  }
}
