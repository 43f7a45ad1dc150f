/**
 * Shared helpers for launcher tests: collecting events with bounded waits, a real zeromq
 * Dealer that speaks the rank side of src/mpi/control.ts, and process bookkeeping.
 */
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Dealer } from "zeromq";
import { controlIdentity, decodeControl, encodeControl, type CoordinatorToRank, type RankToCoordinator } from "../../src/mpi/control.ts";

/** Records events and waits (bounded) for one matching a predicate. */
export class EventLog<E> {
  readonly all: E[] = [];
  private waiters: { pred: (e: E) => boolean; resolve: (e: E) => void }[] = [];

  push = (e: E): void => {
    this.all.push(e);
    this.waiters = this.waiters.filter((w) => {
      if (!w.pred(e)) return true;
      w.resolve(e);
      return false;
    });
  };

  waitFor(pred: (e: E) => boolean, timeoutMs = 5_000, what = "event"): Promise<E> {
    const seen = this.all.find(pred);
    if (seen !== undefined) return Promise.resolve(seen);
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}; saw ${JSON.stringify(this.all, replacer)}`)), timeoutMs);
      this.waiters.push({ pred, resolve: (e) => { clearTimeout(timer); resolve(e); } });
    });
  }
}

function replacer(_k: string, v: unknown): unknown {
  return typeof v === "bigint" ? `${v}n` : v;
}

/** A fake rank's control link: a real Dealer with the rank's routing id. */
export class FakeRank {
  readonly dealer: Dealer;
  readonly inbox = new EventLog<CoordinatorToRank>();
  private reading: Promise<void>;

  constructor(endpoint: string, readonly rank: number, opts: { attempt?: number; routingId?: string } = {}) {
    const dealer = new Dealer({ routingId: opts.routingId ?? controlIdentity(rank, opts.attempt ?? 0), linger: 0 });
    this.dealer = dealer;
    dealer.connect(endpoint);
    this.reading = (async () => {
      try {
        for await (const [frame] of dealer) this.inbox.push(decodeControl(frame) as CoordinatorToRank);
      } catch {
        // closed
      }
    })();
  }

  send(msg: RankToCoordinator): Promise<void> {
    return this.dealer.send(encodeControl(msg));
  }

  sendRaw(...frames: (Buffer | string)[]): Promise<void> {
    return this.dealer.send(frames);
  }

  hello(size: number, attempt = 0): Promise<void> {
    return this.send({ t: "hello", rank: this.rank, attempt, pid: 10_000 + this.rank, endpoint: `tcp://127.0.0.1:${20_000 + this.rank}`, size });
  }

  async close(): Promise<void> {
    this.dealer.close();
    await this.reading;
  }
}

/** A private temp directory removed by the returned cleanup. */
export function tempDir(prefix: string): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/**
 * True if a live process with this pid exists. A zombie (exited, not yet reaped by its parent —
 * in a container, orphans may wait on a PID 1 that reaps slowly) has run its last instruction
 * and counts as gone.
 */
export function processExists(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // Field 3, after the parenthesized command name (which may itself contain spaces).
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return false;
  }
}

/** Waits until none of `pids` exists, up to `timeoutMs`; returns the survivors. */
export async function waitGone(pids: readonly number[], timeoutMs: number): Promise<number[]> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const alive = pids.filter(processExists);
    if (alive.length === 0 || Date.now() >= deadline) return alive;
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** SIGKILLs whatever of `pids` is left (test cleanup; never a broad pattern). */
export function killAll(pids: readonly number[]): void {
  for (const pid of pids) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // already gone
    }
  }
}
