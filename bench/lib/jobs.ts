/**
 * The measuring jobs the harness keeps running while it alternates between them:
 *
 * - {@link LifelineJob}: `node dist/cli.js run -n N --mode M ... bench/programs/mpi-bench.ts`,
 *   i.e. the real launcher starting N ranks of an ordinary Lifeline program; jobs of different
 *   modes can run side by side (own name, control ids, results file and store dir);
 * - {@link RawJob}: N processes of a raw zeromq.js program, spawned directly, rendezvous
 *   through the harness (each reports the endpoint it bound, the harness hands out the table).
 *
 * Both answer the same `run` command with each rank's wall time for the timed block.
 */
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import type { CtrlServer, ProcMessage } from "./ctrl.ts";
import type { BenchName, LifelineMode } from "./plan.ts";
import { spawnChild, type Child } from "./procs.ts";

/** cpr jobs' `--checkpoint-every`: longer than any run, so that no checkpoint is ever due. */
const CPR_NOTHING_DUE = "1000000s";

export interface JobEnv {
  ctrl: CtrlServer;
  /** Repository root (cwd of every child). */
  root: string;
  /** Private temp dir of this run (ipc endpoints, results files). */
  tmpDir: string;
  transport: "ipc" | "tcp";
  /** Recovery mode of a Lifeline job constructed without one (raw jobs have none). */
  mode: LifelineMode;
  payload: "f64" | "u8";
  /** Echo children's output (--verbose). */
  echo: boolean;
  /** Bound on start-up (all ranks said hello). */
  startTimeoutMs: number;
  /** Bound on one command. */
  commandTimeoutMs: number;
  /** How long a child waits for a command before it gives up and exits. */
  idleMs: number;
  /** Directory for CPU profiles of every measuring process (--cpu-prof), or undefined. */
  cpuProf: string | undefined;
  /**
   * `--hosts`: rank r of every job runs on test host r (src/testing/netns.ts), over tcp on the
   * hosts' own addresses; the Lifeline launcher on host 0 starts its ranks through the rsh agent.
   */
  hosts?: HostsEnv | undefined;
}

/** The test hosts of a `--hosts` run. */
export interface HostsEnv {
  /** The command that runs `argv` on host `i`. */
  wrap(i: number, argv: string[], cwd: string): { command: string; args: string[] };
  readonly addresses: readonly string[];
  readonly hostfile: string;
  readonly agent: string;
  readonly agentEnv: Record<string, string>;
}

export abstract class Job {
  private seq = 0;
  protected readonly ids: string[];
  /** Set once the job has failed; it is not used again. */
  broken: Error | undefined;

  constructor(
    readonly name: string,
    readonly np: number,
    protected readonly env: JobEnv,
  ) {
    this.ids = Array.from({ length: np }, (_, r) => `${name}:${r}`);
    for (const id of this.ids) env.ctrl.reset(id);
  }

  abstract start(): Promise<void>;
  /** Asks every rank to finish, waits (bounded), kills what is left; returns a summary. */
  abstract stop(): Promise<Record<string, unknown>>;
  abstract kill(): Promise<void>;
  abstract tail(): string;

  /** Runs one timed block on every rank; resolves to each rank's wall and CPU seconds. */
  async run(
    bench: BenchName,
    bytes: number,
    iters: number,
  ): Promise<{ seconds: number[]; cpuS: number[]; loopS: number[]; minorFaults: number[]; gcS: number[]; majorGcs: number[]; youngMiB: number[] }> {
    if (this.broken !== undefined) throw this.broken;
    const seq = ++this.seq;
    try {
      await Promise.all(this.ids.map((id) => this.env.ctrl.send(id, { t: "run", seq, bench, bytes, iters })));
      const replies = await Promise.all(this.ids.map((id) => this.expect(id, `run ${bench} ${bytes} B x ${iters}`, this.env.commandTimeoutMs)));
      const seconds: number[] = [];
      const cpuS: number[] = [];
      const loopS: number[] = [];
      const minorFaults: number[] = [];
      const gcS: number[] = [];
      const majorGcs: number[] = [];
      const youngMiB: number[] = [];
      replies.forEach((m, r) => {
        if (m.t === "error") throw new Error(`${this.name} rank ${r}: ${m.message}`);
        if (m.t !== "done" || m.seq !== seq) throw new Error(`${this.name} rank ${r}: unexpected reply ${JSON.stringify(m)}`);
        if (!(m.seconds > 0)) throw new Error(`${this.name} rank ${r}: non-positive time ${m.seconds}`);
        seconds.push(m.seconds);
        cpuS.push(m.cpuS);
        loopS.push(m.loopS);
        minorFaults.push(m.minorFaults);
        gcS.push(m.gcS);
        majorGcs.push(m.majorGcs);
        youngMiB.push(m.youngMiB);
      });
      return { seconds, cpuS, loopS, minorFaults, gcS, majorGcs, youngMiB };
    } catch (err) {
      this.broken = err as Error;
      throw err;
    }
  }

  protected expect(id: string, what: string, timeoutMs: number): Promise<ProcMessage> {
    return this.env.ctrl.next(id, timeoutMs, what);
  }

  protected failAll(err: Error): void {
    for (const id of this.ids) this.env.ctrl.fail(id, err);
  }
}

/**
 * N ranks of bench/programs/mpi-bench.ts under the real launcher, in one recovery mode.
 * Named `lifeline<N>` (mode none), `lifeline<N>-cpr` or `lifeline<N>-retry-one`, then
 * `-<incarnation>` for a restarted job; the name is the prefix of its control ids, results
 * file and store dir, so jobs of different modes or incarnations do not collide.
 */
export class LifelineJob extends Job {
  private child: Child | undefined;
  private readonly resultsFile: string;
  /** What the ranks reported in their hello (transport, pid, mode). */
  readonly hellos: ProcMessage[] = [];
  readonly mode: LifelineMode;
  /** Run with `--insecure` (no CURVE on tcp): the baseline of `--curve`. */
  readonly insecure: boolean;

  constructor(np: number, env: JobEnv, incarnation = 0, mode: LifelineMode = env.mode, insecure = false) {
    super(`lifeline${np}${mode === "none" ? "" : `-${mode}`}${insecure ? "-insecure" : ""}${incarnation > 0 ? `-${incarnation}` : ""}`, np, env);
    this.mode = mode;
    this.insecure = insecure;
    this.resultsFile = path.join(env.tmpDir, `${this.name}-results.json`);
  }

  static available(root: string): string | undefined {
    for (const f of ["dist/cli.js", "dist/index.js"]) {
      if (!existsSync(path.join(root, f))) return `${f} is missing (run \`npm run build\`, or use --variant raw)`;
    }
    return undefined;
  }

  command(): string[] {
    const hosts = this.env.hosts;
    const where =
      hosts === undefined ? ["--transport", this.env.transport] : ["--bind", hosts.addresses[0]!, "--hostfile", hosts.hostfile, "--rsh", hosts.agent];
    return [
      "dist/cli.js",
      "run",
      "-n",
      String(this.np),
      "--mode",
      this.mode,
      ...where,
      ...(this.insecure ? ["--insecure"] : []),
      "--results",
      this.resultsFile,
      "--store",
      path.join(this.env.tmpDir, `${this.name}-store`),
      // The message path without retry-one's durable floor (on by default with a shared
      // store): these jobs measure what logging and checkpoints in memory cost; what the
      // floor adds is the `durable` benchmark's question (bench/lib/durable.ts).
      ...(this.mode === "retry-one" ? ["--durable-every", "0"] : []),
      // cpr with nothing due: no checkpoint is asked for while the job measures (the program
      // never calls checkpoint() anyway); what a checkpoint costs is cpr-bench's question.
      ...(this.mode === "cpr" ? ["--checkpoint-every", CPR_NOTHING_DUE] : []),
      "bench/programs/mpi-bench.ts",
      "--ctrl",
      this.env.ctrl.endpoint,
      "--id",
      this.name,
      "--payload",
      this.env.payload,
      "--idle-ms",
      String(this.env.idleMs),
      "--harness-pid",
      String(process.pid),
      ...(this.env.cpuProf !== undefined ? ["--cpu-prof", this.env.cpuProf] : []),
    ];
  }

  async start(): Promise<void> {
    const hosts = this.env.hosts;
    const { command, args } =
      hosts === undefined ? { command: process.execPath, args: this.command() } : hosts.wrap(0, [process.execPath, ...this.command()], this.env.root);
    const child = spawnChild(this.name, command, args, {
      cwd: this.env.root,
      echo: this.env.echo,
      ...(hosts === undefined ? {} : { env: { ...process.env, ...hosts.agentEnv } }),
    });
    this.child = child;
    void child.exited.then((s) => {
      this.failAll(new Error(`${this.name}: launcher exited (code ${s.code}, signal ${s.signal})\n${child.tail()}`));
    });
    try {
      for (const id of this.ids) {
        const hello = await this.expect(id, "hello (start-up)", this.env.startTimeoutMs);
        if (hello.t !== "hello") throw new Error(`${id}: expected hello, got ${hello.t}`);
        child.relatedPids.add(hello.pid);
        this.hellos.push(hello);
      }
    } catch (err) {
      this.broken = err as Error;
      await child.kill();
      throw new Error(`${(err as Error).message}\n${child.tail()}`);
    }
  }

  async stop(): Promise<Record<string, unknown>> {
    const child = this.child;
    if (child === undefined) return {};
    if (this.broken === undefined && child.running) {
      await Promise.all(this.ids.map((id) => this.env.ctrl.send(id, { t: "quit" }).catch(() => undefined)));
    }
    const status = await child.waitOrKill(this.broken === undefined ? 30_000 : 0);
    const summary: Record<string, unknown> = {
      mode: this.mode,
      ...(this.insecure ? { insecure: true } : {}),
      ...(this.mode === "retry-one" ? { durableEvery: 0 } : {}),
      ...(this.mode === "cpr" ? { checkpointEvery: CPR_NOTHING_DUE } : {}),
      exitCode: status.code,
      signal: status.signal,
      killed: status.killed,
    };
    if (existsSync(this.resultsFile)) {
      const res = JSON.parse(readFileSync(this.resultsFile, "utf8")) as { ranks?: unknown[]; restarts?: number };
      const ranks = res.ranks ?? [];
      summary.restarts = res.restarts;
      summary.ranksFinalized = ranks.filter((x) => x !== null && x !== undefined).length;
      summary.blocksPerRank = ranks.map((x) => (x as { blocks?: unknown[] } | null)?.blocks?.length ?? null);
    } else {
      summary.resultsFile = "missing";
    }
    return summary;
  }

  async kill(): Promise<void> {
    await this.child?.kill();
  }

  tail(): string {
    return this.child?.tail() ?? "";
  }
}

/** N processes of a raw zeromq.js baseline program. */
export class RawJob extends Job {
  private readonly children: Child[] = [];

  constructor(
    readonly program: "raw-pingpong" | "raw-pushpull",
    np: number,
    env: JobEnv,
    incarnation = 0,
  ) {
    super(`${program === "raw-pingpong" ? "rawpp" : "rawpush"}${np}${incarnation > 0 ? `-${incarnation}` : ""}`, np, env);
  }

  async start(): Promise<void> {
    for (let r = 0; r < this.np; r++) {
      const args = [
        "--import",
        "tsx",
        `bench/programs/${this.program}.ts`,
        "--ctrl",
        this.env.ctrl.endpoint,
        "--id",
        this.name,
        "--rank",
        String(r),
        "--size",
        String(this.np),
        "--transport",
        this.env.transport,
        "--dir",
        this.env.tmpDir,
        "--payload",
        this.env.payload,
        "--idle-ms",
        String(this.env.idleMs),
        ...(this.env.cpuProf !== undefined ? ["--cpu-prof", this.env.cpuProf] : []),
        ...(this.env.hosts !== undefined ? ["--host", this.env.hosts.addresses[r]!] : []),
      ];
      const hosts = this.env.hosts;
      const run = hosts === undefined ? { command: process.execPath, args } : hosts.wrap(r, [process.execPath, ...args], this.env.root);
      const child = spawnChild(`${this.name}.${r}`, run.command, run.args, { cwd: this.env.root, echo: this.env.echo });
      this.children.push(child);
      void child.exited.then((s) => {
        if (s.code !== 0) this.failAll(new Error(`${this.name} rank ${r} exited (code ${s.code}, signal ${s.signal})\n${child.tail()}`));
      });
    }
    try {
      const endpoints: string[] = [];
      for (let r = 0; r < this.np; r++) {
        const hello = await this.expect(this.ids[r]!, "hello (start-up)", this.env.startTimeoutMs);
        if (hello.t !== "hello") throw new Error(`${this.ids[r]}: expected hello, got ${hello.t}`);
        endpoints.push(hello.endpoint ?? "");
      }
      await Promise.all(this.ids.map((id) => this.env.ctrl.send(id, { t: "peers", endpoints })));
      for (const id of this.ids) {
        const ready = await this.expect(id, "ready (connect)", this.env.startTimeoutMs);
        if (ready.t !== "ready") throw new Error(`${id}: expected ready, got ${ready.t}`);
      }
    } catch (err) {
      this.broken = err as Error;
      await this.kill();
      throw new Error(`${(err as Error).message}\n${this.tail()}`);
    }
  }

  async stop(): Promise<Record<string, unknown>> {
    if (this.broken === undefined) {
      await Promise.all(this.ids.map((id) => this.env.ctrl.send(id, { t: "quit" }).catch(() => undefined)));
    }
    const statuses = await Promise.all(this.children.map((c) => c.waitOrKill(this.broken === undefined ? 10_000 : 0)));
    return { exitCodes: statuses.map((s) => s.code), killed: statuses.some((s) => s.killed) };
  }

  async kill(): Promise<void> {
    await Promise.all(this.children.map((c) => c.kill()));
  }

  tail(): string {
    return this.children.map((c) => c.tail(8)).join("\n");
  }
}
