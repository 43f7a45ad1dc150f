/**
 * Shared helpers for launcher tests: collecting events with bounded waits, a real zeromq
 * Dealer that speaks the rank side of src/mpi/control.ts, and process bookkeeping.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { Dealer } from "zeromq";
import { isLifelineError } from "../../src/errors.ts";
import { controlIdentity, decodeControl, encodeControl, type CoordinatorToRank, type RankToCoordinator } from "../../src/mpi/control.ts";
import { onJsonLines } from "../../src/testing/json-lines.ts";

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
      const timer = setTimeout(
        () => reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}; saw ${JSON.stringify(this.all, replacer)}`)),
        timeoutMs,
      );
      this.waiters.push({
        pred,
        resolve: (e) => {
          clearTimeout(timer);
          resolve(e);
        },
      });
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

  constructor(
    endpoint: string,
    readonly rank: number,
    opts: { attempt?: number; routingId?: string } = {},
  ) {
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

/** The message of the `LAUNCH_USAGE` error `fn` throws; fails if it throws none (other errors pass through). */
export function usageMessage(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    if (isLifelineError(err, "LAUNCH_USAGE")) return err.message;
    throw err;
  }
  throw new Error("expected a LAUNCH_USAGE error");
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

// ---- running the CLI as a real process ---------------------------------------------------

export const ROOT = fileURLToPath(new URL("../..", import.meta.url));
export const CLI_SRC = join(ROOT, "src", "cli.ts");
export const FIXTURES = join(ROOT, "test", "fixtures", "launch");
export const TSX_LOADER = pathToFileURL(createRequire(import.meta.url).resolve("tsx")).href;

export interface CliResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  /** Wall time of the launcher process. */
  ms: number;
}

/** A launcher process started from the source CLI (through tsx), with live JSON events. */
export class CliProcess {
  readonly child: ChildProcess;
  /** `--json` events parsed from stderr as they arrive (non-JSON lines are skipped). */
  readonly events = new EventLog<Record<string, unknown>>();
  readonly done: Promise<CliResult>;
  stdout = "";
  stderr = "";

  constructor(args: readonly string[], opts: { cwd?: string; env?: NodeJS.ProcessEnv; timeoutMs?: number } = {}) {
    const start = performance.now();
    this.child = spawn(process.execPath, ["--import", TSX_LOADER, CLI_SRC, ...args], {
      cwd: opts.cwd ?? ROOT,
      env: opts.env ?? process.env,
      stdio: ["ignore", "pipe", "pipe"],
    });
    this.child.stdout!.setEncoding("utf8").on("data", (s: string) => (this.stdout += s));
    this.child.stderr!.setEncoding("utf8").on("data", (s: string) => (this.stderr += s));
    onJsonLines(this.child.stderr!, (ev) => this.events.push(ev));
    const timeoutMs = opts.timeoutMs ?? 30_000;
    this.done = new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        // SIGTERM first: the launcher then stops its ranks itself (SIGCONT + SIGTERM + SIGKILL),
        // which matters for a frozen (SIGSTOPped) rank, whose watchdog cannot run and which
        // would outlive a SIGKILLed launcher. SIGKILL only if the launcher does not go.
        this.child.kill("SIGTERM");
        setTimeout(() => this.child.kill("SIGKILL"), 3000).unref();
        reject(new Error(`launcher did not finish within ${timeoutMs} ms\n--- stderr\n${this.stderr}`));
      }, timeoutMs);
      this.child.on("error", reject);
      this.child.on("close", (code, signal) => {
        clearTimeout(timer);
        resolve({ code, signal, stdout: this.stdout, stderr: this.stderr, ms: performance.now() - start });
      });
    });
  }

  /** Pids of the ranks the launcher reported (`rank-spawned` events). */
  rankPids(): number[] {
    return this.events.all.filter((e) => e.event === "rank-spawned").map((e) => e.pid as number);
  }
}

/** Throws at once when dist/ is not built: the fixtures import "lifeline", which resolves there. */
export function requireBuild(): void {
  if (!existsSync(join(ROOT, "dist", "index.js"))) throw new Error("dist/index.js is missing: run `npm run build` first");
}

/** SIGKILLs whatever is left of a launcher and of the ranks it reported (test cleanup). */
export function killCli(cli: CliProcess): void {
  killAll(cli.rankPids());
  if (cli.child.exitCode === null && cli.child.signalCode === null) cli.child.kill("SIGKILL");
}

/** Runs the CLI to completion. */
export function runCli(args: readonly string[], opts: { cwd?: string; env?: NodeJS.ProcessEnv; timeoutMs?: number } = {}): Promise<CliResult> {
  return new CliProcess(args, opts).done;
}

/** A writable that keeps what is written (stdout/stderr of in-process CLI runs). */
export class Sink {
  text = "";
  write(s: string): boolean {
    this.text += s;
    return true;
  }
}

/** Runs the CLI's `main` in this process with `cwd`, capturing its output. */
export function inProcessCli(cwd: string): (...argv: string[]) => Promise<{ code: number; stdout: string; stderr: string }> {
  return async (...argv) => {
    const { main } = await import("../../src/cli.ts");
    const stdout = new Sink();
    const stderr = new Sink();
    const code = await main(argv, { stdout, stderr, env: { ...process.env, NO_COLOR: "1" }, cwd, handleSignals: false });
    return { code, stdout: stdout.text, stderr: stderr.text };
  };
}
