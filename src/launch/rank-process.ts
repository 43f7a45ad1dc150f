/**
 * One rank's operating-system process: how it is started, how its output is read, and how it
 * is stopped.
 *
 * - Command: a `.ts` app runs as `node --import <tsx loader> app.ts` — one process, with the
 *   tsx that ships with lifeline, so users need no TypeScript tooling of their own; a `.js`
 *   app runs as `node app.js`.
 * - stdio: stdin is ignored (N ranks cannot share a terminal's input), except that a rank on
 *   another host reads its key file's text there (`RankSpawnSpec.stdin`); stdout and stderr are
 *   pipes read line by line; fd 3 is a pipe (the rank's heartbeats come back on it) whose other end only the launcher holds (libuv
 *   opens it close-on-exec, so sibling ranks do not inherit it). When the launcher dies, even
 *   by SIGKILL, the rank reads EOF there and ends itself (src/index.ts watches it).
 * - Each rank is its own process group (`detached`), so a terminal's Ctrl-C reaches only the
 *   launcher, which stops the job in order, and killing the group also takes any helper
 *   processes the rank started.
 * - A rank on another host ({@link spawnRemoteRank}) is started through a local helper that
 *   runs a shell line there — a remote-shell agent (`ssh`, or `--rsh`), called as `AGENT HOST
 *   COMMAND`, or `srun` (src/launch/spawners.ts says which); its output comes back through the
 *   helper, and so does its exit status. It has no launcher pipe: it ends itself when the
 *   coordinator's lease lapses (src/launch/watchdog-worker.ts). Its remote pid (and, for a Slurm
 *   step, the step's id) comes back as the first line of its output, so the launcher can signal
 *   it on its host; killing the helper alone would not stop it (ssh's remote command survives
 *   its client, and so does a step its srun no longer watches).
 *
 * @example
 * const proc = await spawnRank({ rank: 0, attempt: 0, app: "/abs/app.ts", appArgs: [], env, cwd }, sinks);
 * proc.signal("SIGTERM");           // to the whole process group
 * const exit = await proc.exited;   // { code, signal, status }
 */
import { spawn, type ChildProcess } from "node:child_process";
import { createRequire } from "node:module";
import { constants as osConstants } from "node:os";
import { extname, sep } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { LifelineError, errorMessage } from "../errors.ts";
import { shellQuote } from "./hosts.ts";
import { CACHE_DIR } from "./compile-cache.ts";
import { TS_EXTENSIONS } from "./options.ts";

/** How a rank process ended. `status` is the shell's view: the code, or 128 + signal number. */
export interface RankExit {
  code: number | null;
  signal: NodeJS.Signals | null;
  status: number;
}

/** What to start for one rank: its place, the program and the environment built for it. */
export interface RankSpawnSpec {
  rank: number;
  attempt: number;
  app: string;
  appArgs: readonly string[];
  env: NodeJS.ProcessEnv;
  cwd: string;
  /** Written to the rank's stdin, which is then closed (a remote rank's keys: LIFELINE_KEYS=-). */
  stdin?: string;
  /**
   * A rank on another host gets {@link RANK_MALLOC_TUNABLES} before its host's own
   * `GLIBC_TUNABLES` (a local rank's `env` has them already: {@link withMallocTunables}).
   */
  mallocTuning?: boolean;
}

/** Where a rank's output lines go. */
export interface RankOutputSink {
  line(rank: number, stream: "stdout" | "stderr", line: string): void;
  /** The rank's watchdog thread beat on the watch pipe (fd 3). */
  heartbeat?(rank: number, attempt: number): void;
}

/** Lines of stderr kept per rank for failure messages. */
export const STDERR_TAIL_LINES = 20;
/** A line longer than this is cut (and the rest forwarded as further lines) to bound memory. */
const LINE_CHARS_MAX = 64 * 1024;
/** Lines kept in the tail are cut to this length: a failure message must stay readable. */
const TAIL_LINE_CHARS_MAX = 1000;
/**
 * A line that states an error, as Node prints an uncaught one (`TypeError: x is not a
 * function`, `LifelineError [MPI_RANK]: ...`, `Error: bad argument`) or a program reports one.
 */
const ERROR_LINE_RE = /^\s*(?:Uncaught\s+)?(?:[A-Za-z_$][\w$.]*)?(?:Error|Exception)\b(?:\s*\[[^\]]*\])?:\s*\S/;
/** How a fault injected by `--inject`/`--kill` announces itself (src/mpi/faults.ts). */
const INJECTED_FAULT_PREFIX = "lifeline: injected fault:";

/**
 * The line that best says why a rank failed: `first`, the first stderr line that stated an
 * error (ERROR_LINE_RE, kept even after it left the tail), else the last non-empty line of
 * `tail` other than Node's version banner. `undefined` if it wrote nothing. Never throws.
 *
 * @example
 * errorLineOf("Error: bad argument", ["    at main (app.ts:3)", "", "Node.js v22.1.0"]); // "Error: bad argument"
 * errorLineOf(undefined, ["killed by the OOM reaper", "", "Node.js v22.1.0"]);          // "killed by the OOM reaper"
 */
export function errorLineOf(first: string | undefined, tail: readonly string[]): string | undefined {
  if (first !== undefined) return first;
  for (let i = tail.length - 1; i >= 0; i--) {
    const line = tail[i]!.trim();
    if (line !== "" && !/^Node\.js v\d/.test(line)) return line;
  }
  return undefined;
}

let tsxLoaderUrl: string | undefined;

/**
 * URL of the tsx ESM loader installed with lifeline (not the user's), for `node --import`.
 * Throws `LAUNCH_SPAWN` if it cannot be found.
 */
export function resolveTsxLoader(): string {
  if (tsxLoaderUrl !== undefined) return tsxLoaderUrl;
  try {
    // import.meta.resolve is synchronous in Node >= 20.6; some module runners (vitest) lack it.
    const resolveFn = (import.meta as { resolve?: (s: string) => string }).resolve;
    tsxLoaderUrl = typeof resolveFn === "function" ? resolveFn("tsx") : pathToFileURL(createRequire(import.meta.url).resolve("tsx")).href;
  } catch (err) {
    throw new LifelineError(
      "LAUNCH_SPAWN",
      `cannot find the tsx loader that lifeline uses to run .ts apps: ${errorMessage(err)}. Reinstall lifeline, or compile the app to .js.`,
      { cause: err },
    );
  }
  return tsxLoaderUrl;
}

/**
 * The old generation's size (MiB) up to which V8 starts no mark-compact of a rank's heap on its
 * own growth (`--initial-old-space-size`; Node refuses the flag in NODE_OPTIONS, so the
 * launcher passes it).
 *
 * Why: V8 counts the external memory allocated since the last mark-compact against the old
 * generation's limit, and received messages are external memory (zeromq.js counts each twice,
 * its own count and the ArrayBuffer's). Its default first limit is about 19 MiB for a heap of
 * 8 MiB. A rank exchanging MiB-sized messages has tens of MiB of them live at times, so any
 * allocation in the old generation then (a table of a long-lived Map growing, retry-one's
 * checkpoint bookkeeping, the program's own long-lived objects) started a mark-compact. In
 * `lifeline run -n 4 --mode retry-one bench/programs/allreduce-loop.ts --bytes 1048576 --iters
 * 350 --checkpoint-every 7 --v8-flags=--trace-gc`: 60–79 mark-compacts per rank without this
 * limit, 4–6 with it, and a median allreduce of 4.7–4.9 against 3.5–3.6 ms (mode none: 1 and
 * 0 mark-compacts, 3.1–3.3 ms either way).
 *
 * 128 rather than the 64 MiB first chosen: the limit never falls below this value (the trace of
 * `--v8-flags=--trace-incremental-marking` shows it at every start of marking), and V8 starts
 * marking once the old generation and the external memory allocated since the last
 * mark-compact come within the young generation's capacity of it. retry-one's ranks got there
 * at 64 MiB about once a second (which of their allocations does it was not pinned down):
 * `lifeline run -n 4 --mode retry-one --durable-every 0 bench/programs/allreduce-loop.ts
 * --bytes 65536 --iters 3000 --checkpoint-every 72 --v8-flags=--trace-gc` made 13–15
 * mark-compacts (all ranks together, three runs) at 64 MiB and none at 128. The cost: a rank
 * may hold up to this much garbage, its own and received messages', before a mark-compact.
 */
export const RANK_INITIAL_OLD_SPACE_MIB = 128;
const RANK_V8_FLAGS: readonly string[] = [`--initial-old-space-size=${RANK_INITIAL_OLD_SPACE_MIB}`];

/**
 * glibc's malloc settings for rank and spare processes (`GLIBC_TUNABLES`; `--no-malloc-tuning`
 * leaves glibc's defaults): one arena for every thread, every block from the heap rather than
 * mmap (blocks up to 32 MiB even where mmap is allowed back), and up to 256 MiB of freed heap
 * kept rather than given back.
 *
 * Why: ZeroMQ's I/O thread allocates each received message, and the main thread frees it when
 * the garbage collector drops its buffer. With glibc's defaults the I/O thread has an arena of
 * its own, made of 64 MiB heaps that go back to the system as soon as they are empty, and
 * freed memory at a heap's top goes back too; so the next message's pages are new, and the
 * kernel faults each one in as it copies the message in. One arena, a high mmap threshold and a
 * high trim threshold keep that memory for the next message; either half alone does not. One
 * job at a time (`node --import tsx bench/tools/mode-ab.ts --np 4 --sizes 1048576,16777216
 * --iters 40 --modes none,none+--no-malloc-tuning`), the 4-rank allreduce of 1 and 16 MiB made
 * 3.4 and 142 page faults per operation instead of 191 and 2,246, and took 1.17x and 1.14x as
 * long without them (docs/cli.md, "The C allocator", has the other cases). Blocks over 32 MiB
 * (glibc's largest mmap threshold: the 32 MiB halves of a 2-rank allreduce of 64 MiB, its
 * 64 MiB result) would still come from mmap, fresh each time, without `mmap_max=0`. Small
 * blocks come from glibc's per-thread cache, without the arena's lock.
 *
 * The cost: a rank keeps up to 256 MiB of freed memory at its heap's top, and memory freed
 * below blocks still in use stays the rank's until they go.
 */
export const RANK_MALLOC_TUNABLES =
  "glibc.malloc.arena_max=1:glibc.malloc.mmap_threshold=33554432:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=268435456";

/**
 * `env` with {@link RANK_MALLOC_TUNABLES} in `GLIBC_TUNABLES`, before any of the environment's
 * own: glibc reads the list in order, so a setting the user gives wins.
 *
 * @example
 * withMallocTunables({ GLIBC_TUNABLES: "glibc.malloc.arena_max=4" }).GLIBC_TUNABLES;
 * // → "glibc.malloc.arena_max=1:…:glibc.malloc.arena_max=4"
 */
export function withMallocTunables(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  const own = env.GLIBC_TUNABLES;
  return { ...env, GLIBC_TUNABLES: own === undefined || own === "" ? RANK_MALLOC_TUNABLES : `${RANK_MALLOC_TUNABLES}:${own}` };
}

/** The `node` command line for an app. */
export function rankCommand(app: string, appArgs: readonly string[]): { command: string; args: string[] } {
  const ts = (TS_EXTENSIONS as readonly string[]).includes(extname(app));
  return { command: process.execPath, args: [...nodeFlags(app, ts), app, ...appArgs] };
}

/**
 * The `node` flags of a rank or spare process for `app`: the ranks' V8 flags, then the tsx
 * loader when it runs TypeScript (`ts`), or, for a program compiled for the job
 * (compile-cache.ts), source maps, so that its stack traces point at its sources.
 */
function nodeFlags(app: string, ts: boolean): string[] {
  if (ts) return [...RANK_V8_FLAGS, "--import", resolveTsxLoader()];
  return app.includes(`${sep}${CACHE_DIR}${sep}`) ? [...RANK_V8_FLAGS, "--enable-source-maps"] : [...RANK_V8_FLAGS];
}

/** Exit status as a shell reports it. */
export function exitStatus(code: number | null, signal: NodeJS.Signals | null): number {
  if (code !== null) return code;
  if (signal !== null) return 128 + (osConstants.signals[signal] ?? 0);
  return 1;
}

/**
 * How a rank on another host is reached, started and signalled (src/launch/spawners.ts builds
 * one per host: through a remote-shell agent, or as a Slurm job step).
 */
export interface RemoteSite {
  readonly host: string;
  /** The local helper's argv that runs the POSIX shell line `line` (rank `rank`'s) on the host. */
  command(line: string, rank: number): string[];
  /** The helper's environment, given the rank's; undefined: the launcher's own. */
  env?(rankEnv: NodeJS.ProcessEnv): NodeJS.ProcessEnv;
  /** Shell words the line prints after the rank's pid, naming what {@link signal} needs besides it ("" for nothing). */
  readonly idWords: string;
  /** What failed when the helper could not be started, for the LAUNCH_SPAWN message. */
  failed(err: Error): string;
  /**
   * Set when the helper ends by itself once the rank has ended on its host (srun, when its
   * step ends) and a signal to the helper would reach the rank as well (srun cancels its step):
   * once the rank is known, signals then go to the rank alone, and the helper is killed only if
   * it outlives a SIGKILL by this long (its host may be gone). So the rank's exit means it is
   * gone from its host — a restart must not meet its predecessor's files or locks — at a
   * bounded cost when the host is dead. Undefined: the helper gets every signal too, at once.
   */
  readonly helperGraceMs?: number;
  /** Sends `sig` to the rank (`pid` and `id` as its shell printed them) without waiting, bounded in time. */
  signal(pid: number, id: string, sig: NodeJS.Signals): void;
}

/** The first line a remote rank's shell prints: its pid, which the node process then takes over (exec). */
const REMOTE_PID_PREFIX = "lifeline-remote-pid ";
/** A helper that signals a remote rank is given up after this long (its host may be gone: ssh hangs then). */
const REMOTE_SIGNAL_TIMEOUT_MS = 5_000;

/** A running (or ended) rank process. */
export class RankProcess {
  /** Resolves when the process has ended (exit event; output may still be draining). */
  readonly exited: Promise<RankExit>;
  /** Resolves when the process has ended and its output pipes are drained. */
  readonly closed: Promise<void>;
  private exitInfo: RankExit | undefined;
  private readonly tail: string[] = [];
  private firstError: string | undefined;
  private injected = false;
  /** A remote rank's pid on its host, once its shell printed it, and what else it printed ({@link RemoteSite.idWords}). */
  private remotePid: number | undefined;
  private remoteId = "";
  /** Kills the helper of a remote rank that a SIGKILL did not end ({@link RemoteSite.helperGraceMs}). */
  private helperTimer: NodeJS.Timeout | undefined;

  constructor(
    readonly rank: number,
    readonly attempt: number,
    readonly pid: number,
    private readonly child: ChildProcess,
    sink: RankOutputSink,
    /** Set for a rank on another host: `pid` is then the local helper's. */
    readonly remote?: RemoteSite,
  ) {
    this.exited = new Promise((resolve) => {
      child.once("exit", (code, signal) => {
        this.exitInfo = { code, signal, status: exitStatus(code, signal) };
        resolve(this.exitInfo);
      });
    });
    const drains = [
      readLines(child.stdout!, (line) => {
        if (remote !== undefined && this.remotePid === undefined && line.startsWith(REMOTE_PID_PREFIX)) {
          const [pid = "", ...id] = line.slice(REMOTE_PID_PREFIX.length).split(" ");
          this.remotePid = Number(pid) || undefined;
          this.remoteId = id.join(" ");
          return;
        }
        sink.line(rank, "stdout", line);
      }),
      readLines(child.stderr!, (line) => {
        const cut = line.length > TAIL_LINE_CHARS_MAX ? `${line.slice(0, TAIL_LINE_CHARS_MAX)}…` : line;
        if (this.firstError === undefined && ERROR_LINE_RE.test(line)) this.firstError = cut.trim();
        if (line.startsWith(INJECTED_FAULT_PREFIX)) this.injected = true;
        this.tail.push(cut);
        if (this.tail.length > STDERR_TAIL_LINES) this.tail.shift();
        sink.line(rank, "stderr", line);
      }),
    ];
    this.closed = Promise.all([this.exited, ...drains]).then(() => undefined);
    // The watch pipe (a socketpair): kept open until the rank ends; its EOF tells the rank
    // that the launcher is gone. The rank's watchdog thread writes a byte per heartbeat into
    // it. Its errors (EPIPE when the rank closed its end) are expected and carry no information.
    const watch = child.stdio[3] as (NodeJS.ReadableStream & { on(ev: string, fn: (...a: unknown[]) => void): unknown }) | null;
    watch?.on("error", () => undefined);
    watch?.on("data", () => sink.heartbeat?.(rank, attempt));
  }

  /** True until the process has exited. */
  get alive(): boolean {
    return this.exitInfo === undefined;
  }

  get exit(): RankExit | undefined {
    return this.exitInfo;
  }

  /** The last {@link STDERR_TAIL_LINES} lines the rank wrote to stderr. */
  stderrTail(): string[] {
    return [...this.tail];
  }

  /** The line of its stderr that says why it failed ({@link errorLineOf}), if it wrote any. */
  errorLine(): string | undefined {
    return errorLineOf(this.firstError, this.tail);
  }

  /** It announced a fault injected on purpose (`--inject`, `lifeline drill --kill`). */
  get faultInjected(): boolean {
    return this.injected;
  }

  /**
   * Sends `sig` to the rank's process group (the rank and anything it started; for a remote
   * rank, its helper's, and the rank on its host). Returns false if nothing was there. Safe
   * after exit: the group id cannot be reused while a member lives.
   */
  signal(sig: NodeJS.Signals): boolean {
    // A remote rank first, on its host: its local helper's end does not stop it.
    if (this.remote !== undefined && this.remotePid !== undefined && this.alive) {
      this.remote.signal(this.remotePid, this.remoteId, sig);
      const graceMs = this.remote.helperGraceMs;
      if (graceMs !== undefined) {
        if (sig === "SIGKILL" && this.helperTimer === undefined) {
          this.helperTimer = setTimeout(() => this.signalGroup("SIGKILL"), graceMs);
          this.helperTimer.unref();
          void this.exited.then(() => clearTimeout(this.helperTimer));
        }
        return true;
      }
    }
    return this.signalGroup(sig);
  }

  private signalGroup(sig: NodeJS.Signals): boolean {
    try {
      process.kill(-this.pid, sig);
      return true;
    } catch {
      // ESRCH: the group is gone, which is the goal. EPERM cannot happen for our own children.
      return false;
    }
  }

  /** Stops the rank: SIGTERM (plus SIGCONT so a frozen rank can act on it) now, SIGKILL after `graceMs`. */
  terminate(graceMs: number): void {
    this.signal("SIGTERM");
    this.signal("SIGCONT");
    const timer = setTimeout(() => this.signal("SIGKILL"), graceMs);
    timer.unref();
    void this.closed.then(() => {
      // The rank is gone; sweep the group once more for helpers it left, then stop the timer.
      this.signal("SIGKILL");
      clearTimeout(timer);
    });
  }

  /** Kills at once (SIGKILL to the group). */
  kill(): void {
    this.signal("SIGKILL");
  }
}

/**
 * Runs `argv` (a helper that signals a remote rank) without waiting for it: detached, its
 * output ignored, and its process group killed after {@link REMOTE_SIGNAL_TIMEOUT_MS} if it is
 * still there (a helper talking to a dead host may hang). Never throws.
 */
export function runBounded(argv: readonly string[]): void {
  let helper: ChildProcess;
  try {
    helper = spawn(argv[0]!, argv.slice(1), { stdio: "ignore", detached: true, windowsHide: true });
  } catch {
    return;
  }
  helper.on("error", () => undefined);
  helper.unref();
  const timer = setTimeout(() => {
    try {
      process.kill(-helper.pid!, "SIGKILL");
    } catch {
      // done already
    }
  }, REMOTE_SIGNAL_TIMEOUT_MS);
  timer.unref();
  helper.once("exit", () => clearTimeout(timer));
}

/**
 * Starts a rank on `site.host` through the site's helper (`AGENT HOST COMMAND`, or `srun …
 * sh -c COMMAND`), the command a shell line that prints the remote pid (and the site's
 * {@link RemoteSite.idWords}), changes to the launcher's working directory and runs the same
 * `node` command as a local rank, with the rank's LIFELINE_* variables (the launcher's other
 * variables are the local machine's; the remote side brings its own). Resolves once the helper
 * runs; rejects with `LAUNCH_SPAWN` if it cannot be started.
 */
export function spawnRemoteRank(spec: RankSpawnSpec, site: RemoteSite, sink: RankOutputSink): Promise<RankProcess> {
  const { command, args } = rankCommand(spec.app, spec.appArgs);
  const vars = Object.entries(spec.env).flatMap(([k, v]) =>
    k.startsWith("LIFELINE_") && v !== undefined && k !== "LIFELINE_WATCH_FD" && k !== "LIFELINE_RUN_DIR" ? [`${k}=${v}`] : [],
  );
  const id = site.idWords === "" ? "" : ` ${site.idWords}`;
  // The tunables go before the host's own, as for a local rank (withMallocTunables).
  const malloc = spec.mallocTuning === true ? `export GLIBC_TUNABLES=${RANK_MALLOC_TUNABLES}\${GLIBC_TUNABLES:+:$GLIBC_TUNABLES} && ` : "";
  const line = `echo ${REMOTE_PID_PREFIX}$$${id}; cd ${shellQuote([spec.cwd])} && ${malloc}exec ${shellQuote(["env", ...vars, command, ...args])}`;
  const argv = site.command(line, spec.rank);
  const env = site.env?.(spec.env);
  return new Promise((resolve, reject) => {
    let child: ChildProcess;
    try {
      child = spawn(argv[0]!, argv.slice(1), {
        cwd: spec.cwd,
        stdio: [spec.stdin === undefined ? "ignore" : "pipe", "pipe", "pipe"],
        detached: true,
        windowsHide: true,
        ...(env === undefined ? {} : { env }),
      });
    } catch (err) {
      reject(
        new LifelineError(
          "LAUNCH_SPAWN",
          `cannot start rank ${spec.rank} on ${site.host}: ${site.failed(err instanceof Error ? err : new Error(errorMessage(err)))}`,
          { cause: err },
        ),
      );
      return;
    }
    const onError = (err: Error): void => {
      reject(new LifelineError("LAUNCH_SPAWN", `cannot start rank ${spec.rank} on ${site.host}: ${site.failed(err)}`, { cause: err }));
    };
    child.once("error", onError);
    child.once("spawn", () => {
      child.off("error", onError);
      child.on("error", () => undefined);
      if (spec.stdin !== undefined) {
        child.stdin!.on("error", () => undefined); // EPIPE: the agent died; its exit tells
        child.stdin!.end(spec.stdin);
      }
      resolve(new RankProcess(spec.rank, spec.attempt, child.pid!, child, sink, site));
    });
  });
}

/**
 * A warm spare (retry-one; src/launch/spare-entry.ts): a process started like a rank — same
 * stdio, process group and environment (without the rank's own LIFELINE_ variables) — that has
 * loaded Node, tsx and lifeline and waits on stdin for the place of a failed rank.
 */
export class SpareProcess {
  private ended = false;
  private readonly onReady: () => void;
  /** Resolves when the spare is warm (it wrote its byte on the watch pipe). */
  readonly ready: Promise<void>;

  constructor(
    private readonly child: ChildProcess,
    readonly pid: number,
  ) {
    child.once("exit", () => {
      this.ended = true;
    });
    let resolve!: () => void;
    this.ready = new Promise((r) => {
      resolve = r;
    });
    this.onReady = () => resolve();
    const watch = child.stdio[3] as NodeJS.ReadableStream | null;
    watch?.on("error", () => undefined);
    watch?.once("data", this.onReady);
  }

  /** Still waiting for an assignment (not exited, not assigned). */
  get usable(): boolean {
    return !this.ended && this.child.stdin?.writable === true;
  }

  /** Turns the spare into the rank of `spec` (same app and cwd as it was started with). */
  assign(spec: RankSpawnSpec, sink: RankOutputSink): RankProcess {
    (this.child.stdio[3] as NodeJS.ReadableStream | null)?.off("data", this.onReady);
    const proc = new RankProcess(spec.rank, spec.attempt, this.pid, this.child, sink);
    this.child.stdin!.end(`${JSON.stringify({ env: spec.env, app: spec.app, appArgs: spec.appArgs })}\n`);
    return proc;
  }

  /** Ends an unused spare (its process group). */
  kill(): void {
    this.child.stdin?.destroy();
    try {
      process.kill(-this.pid, "SIGKILL");
    } catch {
      // already gone
    }
  }
}

/** Starts a spare for `app`; rejects with `LAUNCH_SPAWN` if the process could not be started. */
export function spawnSpare(app: string, env: NodeJS.ProcessEnv, cwd: string): Promise<SpareProcess> {
  const fromSource = import.meta.url.endsWith(".ts");
  const entry = fileURLToPath(new URL(fromSource ? "./spare-entry.ts" : "./spare-entry.js", import.meta.url));
  const ts = fromSource || (TS_EXTENSIONS as readonly string[]).includes(extname(app));
  const args = [...nodeFlags(app, ts), entry];
  return new Promise((resolve, reject) => {
    let child: ChildProcess;
    try {
      child = spawn(process.execPath, args, { cwd, env, stdio: ["pipe", "pipe", "pipe", "pipe"], detached: true, windowsHide: true });
    } catch (err) {
      reject(new LifelineError("LAUNCH_SPAWN", `cannot start a spare process: ${errorMessage(err)}`, { cause: err }));
      return;
    }
    const onError = (err: Error): void => reject(new LifelineError("LAUNCH_SPAWN", `cannot start a spare process: ${err.message}`, { cause: err }));
    child.once("error", onError);
    child.once("spawn", () => {
      child.off("error", onError);
      child.on("error", () => undefined);
      child.stdin!.on("error", () => undefined); // EPIPE if it died; `usable` tells
      resolve(new SpareProcess(child, child.pid!));
    });
  });
}

/**
 * Starts a rank. Resolves once the OS has started the process; rejects with `LAUNCH_SPAWN`
 * if it could not be started.
 */
export function spawnRank(spec: RankSpawnSpec, sink: RankOutputSink): Promise<RankProcess> {
  const { command, args } = rankCommand(spec.app, spec.appArgs);
  return new Promise((resolve, reject) => {
    let child: ChildProcess;
    try {
      child = spawn(command, args, {
        cwd: spec.cwd,
        env: spec.env,
        stdio: ["ignore", "pipe", "pipe", "pipe"],
        detached: true,
        windowsHide: true,
      });
    } catch (err) {
      reject(new LifelineError("LAUNCH_SPAWN", `cannot start rank ${spec.rank}: ${errorMessage(err)}`, { cause: err }));
      return;
    }
    const onError = (err: Error): void => {
      reject(new LifelineError("LAUNCH_SPAWN", `cannot start rank ${spec.rank} (${command}): ${err.message}`, { cause: err }));
    };
    child.once("error", onError);
    child.once("spawn", () => {
      child.off("error", onError);
      // Later errors (a failed kill) are not fatal; exits are reported through `exit`.
      child.on("error", () => undefined);
      resolve(new RankProcess(spec.rank, spec.attempt, child.pid!, child, sink));
    });
  });
}

/** Calls `onLine` for each line of `stream` (without its newline); resolves at end of stream. */
function readLines(stream: NodeJS.ReadableStream, onLine: (line: string) => void): Promise<void> {
  return new Promise((resolve) => {
    let pending = "";
    stream.setEncoding("utf8"); // decodes multi-byte characters split across chunks
    stream.on("data", (chunk: string) => {
      pending += chunk;
      let nl: number;
      while ((nl = pending.indexOf("\n")) >= 0) {
        onLine(stripCr(pending.slice(0, nl)));
        pending = pending.slice(nl + 1);
      }
      while (pending.length > LINE_CHARS_MAX) {
        onLine(pending.slice(0, LINE_CHARS_MAX));
        pending = pending.slice(LINE_CHARS_MAX);
      }
    });
    const finish = (): void => {
      if (pending !== "") onLine(stripCr(pending));
      pending = "";
      resolve();
    };
    stream.once("end", finish);
    stream.once("close", finish);
    stream.once("error", finish);
  });
}

function stripCr(line: string): string {
  return line.endsWith("\r") ? line.slice(0, -1) : line;
}
