/**
 * Child processes of the harness: each is spawned as the leader of its own process group
 * (so that killing the group also reaches what it spawned, e.g. the launcher's ranks), its
 * output is kept in a bounded tail for error reports, and every child still alive is killed
 * when the harness exits — normally, on an error, or on SIGINT/SIGTERM.
 */
import { spawn, type ChildProcess } from "node:child_process";

const TAIL_LINES_MAX = 60;

export interface ExitStatus {
  code: number | null;
  signal: NodeJS.Signals | null;
}

export class Child {
  readonly exited: Promise<ExitStatus>;
  private readonly tailLines: string[] = [];
  private status: ExitStatus | undefined;
  /** Extra pids to kill with this child (e.g. ranks that might have left its process group). */
  readonly relatedPids = new Set<number>();

  constructor(
    readonly name: string,
    readonly proc: ChildProcess,
    private readonly echo: boolean,
  ) {
    live.add(this);
    const onData = (stream: string) => {
      let partial = "";
      return (chunk: Buffer): void => {
        const lines = (partial + chunk.toString("utf8")).split("\n");
        partial = lines.pop() ?? "";
        for (const line of lines) this.pushLine(`${stream} ${line}`);
      };
    };
    proc.stdout?.on("data", onData("out"));
    proc.stderr?.on("data", onData("err"));
    proc.stdin?.on("error", () => {}); // EPIPE once the child is gone: nothing to do
    this.exited = new Promise((resolve) => {
      proc.on("exit", (code, signal) => {
        this.status = { code, signal };
        resolve(this.status);
      });
      proc.on("error", (err) => {
        this.pushLine(`spawn error: ${err.message}`);
        this.status = { code: -1, signal: null };
        resolve(this.status);
      });
    }).finally(() => live.delete(this)) as Promise<ExitStatus>;
  }

  private pushLine(line: string): void {
    if (this.echo) process.stderr.write(`  [${this.name}] ${line}\n`);
    this.tailLines.push(line);
    if (this.tailLines.length > TAIL_LINES_MAX) this.tailLines.shift();
  }

  get running(): boolean {
    return this.status === undefined;
  }

  tail(n = 20): string {
    return this.tailLines
      .slice(-n)
      .map((l) => `    ${this.name}: ${l}`)
      .join("\n");
  }

  /** SIGTERM to the group, SIGKILL after `graceMs`; also kills `relatedPids`. */
  async kill(graceMs = 2000): Promise<ExitStatus> {
    if (this.running) {
      signalGroup(this.proc.pid, "SIGTERM");
      const timer = setTimeout(() => signalGroup(this.proc.pid, "SIGKILL"), graceMs);
      await this.exited;
      clearTimeout(timer);
    }
    signalGroup(this.proc.pid, "SIGKILL"); // stragglers left in the group
    for (const pid of this.relatedPids) signalPid(pid, "SIGKILL");
    return this.exited;
  }

  /** Waits for a normal exit up to `timeoutMs`, then kills. */
  async waitOrKill(timeoutMs: number): Promise<ExitStatus & { killed: boolean }> {
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<"timeout">((resolve) => (timer = setTimeout(() => resolve("timeout"), timeoutMs)));
    const r = await Promise.race([this.exited, timedOut]);
    clearTimeout(timer);
    if (r === "timeout") return { ...(await this.kill()), killed: true };
    for (const pid of this.relatedPids) signalPid(pid, "SIGKILL");
    return { ...r, killed: false };
  }
}

function signalGroup(pid: number | undefined, sig: NodeJS.Signals): void {
  if (pid !== undefined) signalPid(-pid, sig);
}

/** Sends a signal; a process or group that is already gone (ESRCH) is not an error. */
function signalPid(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    // ESRCH: already gone. EPERM: the pid was reused by a process that is not ours.
    if (code !== "ESRCH" && code !== "EPERM") throw err;
  }
}

const live = new Set<Child>();

export function spawnChild(name: string, cmd: string, args: string[], opts: { env?: NodeJS.ProcessEnv; cwd?: string; echo?: boolean }): Child {
  const proc = spawn(cmd, args, {
    cwd: opts.cwd,
    env: opts.env ?? process.env,
    stdio: ["pipe", "pipe", "pipe"],
    detached: true, // own process group; the harness still holds the stdin pipe
  });
  return new Child(name, proc, opts.echo ?? false);
}

/** Synchronous last resort, for the exit handler: SIGKILL every child group still running. */
export function killAllSync(): void {
  for (const c of live) {
    signalGroup(c.proc.pid, "SIGKILL");
    for (const pid of c.relatedPids) signalPid(pid, "SIGKILL");
  }
}

let installed = false;
/** Installs the exit and signal handlers that kill every child. */
export function installCleanup(onSignal?: () => void): void {
  if (installed) return;
  installed = true;
  process.on("exit", killAllSync);
  for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"] as const) {
    process.on(sig, () => {
      process.stderr.write(`\nbench: ${sig}, stopping child processes\n`);
      onSignal?.();
      killAllSync();
      process.exit(130);
    });
  }
}
