/**
 * The benchmark's control channel: the harness (`bench/run.ts`) drives every measuring
 * process — Lifeline ranks and raw zeromq.js processes alike — one command at a time, so that
 * the two variants of a case can be timed in alternation (L R, R L, ...) while both stay
 * running. Nothing here is timed: a command is sent before the timed block starts and its
 * reply after the block ends.
 *
 * Transport: the harness binds a ZeroMQ `Router` on an ipc endpoint in the run's temp dir;
 * each process connects a `Dealer` whose routing id is `<job>:<rank>`. Messages are JSON, one
 * frame each. A process that hears nothing for `idleMs` exits, so that a harness killed with
 * SIGKILL cannot leave measuring processes behind.
 *
 * @example
 * const ctrl = await CtrlClient.connect(endpoint, "raw2:0");
 * await ctrl.send({ t: "hello", rank: 0, size: 2, pid: process.pid });
 */
import { Dealer, Router } from "zeromq";
import type { BenchName } from "./plan.ts";

/** Process → harness. */
export type ProcMessage =
  /** First message; `endpoint` is where a raw process's data socket listens (if it binds one). */
  | { t: "hello"; rank: number; size: number; pid: number; endpoint?: string; transport?: string; info?: Record<string, unknown> }
  /** A raw process has connected to its peers and can run commands. */
  | { t: "ready"; rank: number }
  /**
   * A command finished: this rank's wall, process CPU and event-loop-active time for the block,
   * its page faults, its garbage collections (pauses, and how many were full ones), and the
   * size of its young generation at the end (MiB).
   */
  | { t: "done"; seq: number; rank: number; seconds: number; cpuS: number; loopS: number; minorFaults: number; gcS: number; majorGcs: number; youngMiB: number }
  /** A command failed in this process (the harness stops the job). */
  | { t: "error"; seq: number; rank: number; message: string };

/** Harness → process. */
export type HarnessMessage =
  /** Every rank's data endpoint (raw jobs). */
  | { t: "peers"; endpoints: string[] }
  /** Barrier-synchronize, then run `iters` operations of `bench` on `bytes`-byte payloads. */
  | { t: "run"; seq: number; bench: BenchName; bytes: number; iters: number }
  /** Finish: Lifeline ranks finalize, raw processes close their sockets and exit. */
  | { t: "quit" };

function encode(msg: unknown): string {
  return JSON.stringify(msg);
}

function decode<T>(frame: Buffer | undefined): T {
  if (frame === undefined) throw new Error("empty control frame");
  const msg = JSON.parse(frame.toString("utf8")) as unknown;
  if (typeof msg !== "object" || msg === null || typeof (msg as { t?: unknown }).t !== "string") {
    throw new Error(`control frame is not a tagged object: ${frame.toString("utf8").slice(0, 80)}`);
  }
  return msg as T;
}

interface Waiter {
  resolve: (msg: ProcMessage) => void;
  reject: (err: Error) => void;
  timer: NodeJS.Timeout;
}

/** Harness side: one Router, per-id inboxes, bounded waits. */
export class CtrlServer {
  private readonly inbox = new Map<string, ProcMessage[]>();
  private readonly waiters = new Map<string, Waiter>();
  private readonly failed = new Map<string, Error>();
  private closed = false;

  private constructor(
    private readonly router: Router,
    readonly endpoint: string,
  ) {
    void this.readLoop();
  }

  static async open(endpoint: string): Promise<CtrlServer> {
    const router = new Router({ linger: 0, mandatory: true, sendTimeout: 5000 });
    await router.bind(endpoint);
    return new CtrlServer(router, router.lastEndpoint ?? endpoint);
  }

  private async readLoop(): Promise<void> {
    try {
      for await (const [idFrame, body] of this.router) {
        const id = idFrame!.toString("utf8");
        let msg: ProcMessage;
        try {
          msg = decode<ProcMessage>(body);
        } catch (err) {
          process.stderr.write(`bench: dropping a bad control frame from ${id}: ${(err as Error).message}\n`);
          continue;
        }
        const waiter = this.waiters.get(id);
        if (waiter !== undefined) {
          this.waiters.delete(id);
          clearTimeout(waiter.timer);
          waiter.resolve(msg);
        } else {
          let q = this.inbox.get(id);
          if (q === undefined) this.inbox.set(id, (q = []));
          q.push(msg);
        }
      }
    } catch (err) {
      if (!this.closed) process.stderr.write(`bench: control channel failed: ${(err as Error).message}\n`);
    }
  }

  async send(id: string, msg: HarnessMessage): Promise<void> {
    await this.router.send([id, encode(msg)]);
  }

  /** The next message from `id`, or a rejection after `timeoutMs` or once `fail(id)` is called. */
  next(id: string, timeoutMs: number, what: string): Promise<ProcMessage> {
    const queued = this.inbox.get(id)?.shift();
    if (queued !== undefined) return Promise.resolve(queued);
    const failure = this.failed.get(id);
    if (failure !== undefined) return Promise.reject(failure);
    if (this.waiters.has(id)) return Promise.reject(new Error(`two waits on ${id}`));
    return new Promise<ProcMessage>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiters.delete(id);
        reject(new Error(`${id}: no reply to ${what} within ${(timeoutMs / 1000).toFixed(0)} s`));
      }, timeoutMs);
      this.waiters.set(id, { resolve, reject, timer });
    });
  }

  /** Forgets everything about `id` (a new process is about to use it). */
  reset(id: string): void {
    this.failed.delete(id);
    this.inbox.delete(id);
  }

  /** Rejects the current and every later wait on `id` (its process is gone). */
  fail(id: string, err: Error): void {
    this.failed.set(id, err);
    const waiter = this.waiters.get(id);
    if (waiter !== undefined) {
      this.waiters.delete(id);
      clearTimeout(waiter.timer);
      waiter.reject(err);
    }
  }

  close(): void {
    this.closed = true;
    for (const [id, w] of this.waiters) {
      clearTimeout(w.timer);
      w.reject(new Error(`${id}: control channel closed`));
    }
    this.waiters.clear();
    this.router.close();
  }
}

/** Process side: one Dealer to the harness. */
export class CtrlClient {
  private constructor(private readonly dealer: Dealer) {}

  static async connect(endpoint: string, id: string): Promise<CtrlClient> {
    const dealer = new Dealer({ routingId: id, linger: 1000, sendTimeout: 10_000 });
    dealer.connect(endpoint);
    return new CtrlClient(dealer);
  }

  async send(msg: ProcMessage): Promise<void> {
    await this.dealer.send(encode(msg));
  }

  /** The next command. Exits the process after `idleMs` of silence: the harness is gone. */
  async receive(idleMs: number): Promise<HarnessMessage> {
    this.dealer.receiveTimeout = idleMs;
    try {
      const [body] = await this.dealer.receive();
      return decode<HarnessMessage>(body);
    } catch (err) {
      process.stderr.write(`bench process ${process.pid}: no command from the harness for ${idleMs} ms, exiting (${(err as Error).message})\n`);
      process.exit(3);
    }
  }

  close(): void {
    this.dealer.close();
  }
}

/** Parses `--name value` pairs given to a bench program. */
export function programArgs(argv: readonly string[]): Map<string, string> {
  const out = new Map<string, string>();
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (!a.startsWith("--")) continue;
    const eq = a.indexOf("=");
    if (eq > 0) out.set(a.slice(2, eq), a.slice(eq + 1));
    else if (i + 1 < argv.length && !argv[i + 1]!.startsWith("--")) out.set(a.slice(2), argv[++i]!);
    else out.set(a.slice(2), "true");
  }
  return out;
}

/**
 * Exits within a second once process `pid` (the harness) is gone, for processes it does not
 * spawn directly (Lifeline ranks are children of the launcher). One cheap check per second.
 */
export function exitWithHarness(pid: number | undefined): void {
  if (pid === undefined || !Number.isInteger(pid) || pid <= 0) return;
  setInterval(() => {
    try {
      process.kill(pid, 0);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ESRCH") process.exit(4);
    }
  }, 1000).unref();
}

/** Exits when the parent closes our stdin (the harness died), for processes it spawns directly. */
export function exitWithParent(): void {
  if (process.stdin.isTTY) return;
  process.stdin.on("end", () => process.exit(4));
  process.stdin.on("error", () => process.exit(4));
  process.stdin.resume();
}
