#!/usr/bin/env node
/**
 * The `lifeline` command (docs/cli.md): argv parsing only; the work happens in src/launch/.
 *
 * Exit codes: 0 when every rank finalized and exited 0; 2 for usage errors; 130/143/129 when
 * the launcher was stopped by SIGINT/SIGTERM/SIGHUP; otherwise the failed rank's exit status
 * (its code, or 128 + signal number), or 1 for failures the launcher detected itself.
 * docs/cli.md documents every flag and output format.
 *
 * @example
 * lifeline run -n 4 --mode none app.ts --size 1024
 * const code = await main(["run", "-n", "2", "--mode", "none", "app.js"], { stdout: process.stdout, stderr: process.stderr, env: process.env, cwd: process.cwd() });
 */
import { realpathSync } from "node:fs";
import { createRequire } from "node:module";
import { resolve as resolvePath } from "node:path";
import { fileURLToPath } from "node:url";
import { Command, CommanderError, Option } from "commander";
import { errorMessage, isLifelineError, LifelineError } from "./errors.ts";
import { MODES } from "./mpi/env.ts";
import { makeJobKeys, writeKeyDir } from "./mpi/keys.ts";
import { DEFAULTS, NP_MAX, parseCount, resolveRunConfig, type RunConfig, type RunFlags } from "./launch/options.ts";
import { runStandalone } from "./launch/standalone.ts";
import type { OutStream } from "./launch/progress.ts";
import { runJob } from "./launch/run.ts";
import { resolveDrillConfig, runDrill, type DrillFlags } from "./launch/drill.ts";
import { formatLines, listLines } from "./store/lines.ts";

/** Exit code of usage errors (bad flags), as is conventional for command-line tools. */
export const EXIT_USAGE = 2;

/** The streams and process context {@link main} works with (the real ones, or test doubles). */
export interface CliIo {
  stdout: OutStream;
  stderr: OutStream;
  env: NodeJS.ProcessEnv;
  cwd: string;
  /** See RunIo.handleSignals. */
  handleSignals?: boolean;
  /** The command line (shown in drill reports); {@link main} fills it in. */
  argv?: readonly string[];
}

/** Runs the CLI on `argv` (without node and script). Resolves to the process exit code. */
export async function main(argv: readonly string[], io: CliIo): Promise<number> {
  let exitCode = 0;
  const program = buildProgram({ ...io, argv: io.argv ?? argv.slice(1) }, (code) => (exitCode = code));
  try {
    await program.parseAsync([...argv], { from: "user" });
  } catch (err) {
    if (err instanceof CommanderError) {
      // Help and --version "fail" with exit code 0; everything else is a usage error.
      return err.exitCode === 0 ? 0 : EXIT_USAGE;
    }
    if (isLifelineError(err, "LAUNCH_USAGE")) {
      io.stderr.write(`lifeline: error: ${indent(err.message)}\n(see lifeline run --help)\n`);
      return EXIT_USAGE;
    }
    if (isLifelineError(err, "LAUNCH_RESUME")) {
      // The store holds what this command would overwrite: nothing was started.
      io.stderr.write(
        `${err.message
          .split("\n")
          .map((l, i) => `lifeline: ${i === 0 ? "error: " : ""}${l}`)
          .join("\n")}\n`,
      );
      return EXIT_USAGE;
    }
    if (isLifelineError(err) && err.code.startsWith("STORE_")) {
      io.stderr.write(`lifeline: error: ${err.message}\n`);
      return 1;
    }
    io.stderr.write(`lifeline: internal error: ${err instanceof Error ? (err.stack ?? err.message) : errorMessage(err)}\n`);
    return 1;
  }
  return exitCode;
}

function buildProgram(io: CliIo, setExit: (code: number) => void): Command {
  const version = (createRequire(import.meta.url)("../package.json") as { version: string }).version;
  const program = new Command("lifeline")
    .description("Checkpoint-restart middleware for message-passing programs: start and supervise a job of ranks.")
    .version(version, "-V, --version")
    .enablePositionalOptions()
    .exitOverride()
    .configureOutput({
      writeOut: (s) => void io.stdout.write(s),
      writeErr: (s) => void io.stderr.write(s),
      outputError: (s, write) => write(`lifeline: ${s}`),
    })
    .showHelpAfterError("(add --help for usage)");

  const run = program
    .command("run")
    .summary("run a job (a .ts or .js app)")
    .description(
      "Start <ranks> processes of <app>, connect them through a coordinator and supervise them until every rank has called finalize().\n" +
        "Options after <app> are passed to the app.",
    )
    .argument("<app>", "program every rank runs (.ts/.mts/.cts run through lifeline's bundled tsx; .js/.mjs/.cjs as is)")
    .argument("[args...]", "arguments for the app");
  addRunOptions(run);
  run.passThroughOptions().action(async (app: string, args: string[], opts: Record<string, unknown>) => {
    const config = resolveRunConfig(toFlags(app, args, opts), { cwd: io.cwd, env: io.env });
    const outcome = await runJob(config, { stdout: io.stdout, stderr: io.stderr, env: io.env, handleSignals: io.handleSignals ?? true });
    setExit(outcome.exitCode);
  });

  const drill = program
    .command("drill")
    .summary("run clean, then under injected faults, and compare the results")
    .description(
      "Run <app> once cleanly (mode none) as the reference, then --repeat times in --mode with the --kill faults injected;\n" +
        "report each fault's detection and recovery, and exit 0 only if every faulty run's results equal the reference's bit for bit.\n" +
        "Options after <app> are passed to the app.",
    )
    .argument("<app>", "program every rank runs")
    .argument("[args...]", "arguments for the app");
  addRunOptions(drill);
  drill
    .option(
      "--kill <spec>",
      "a fault per run: 1@step:5, 2@time:1.5s, 0@send:100, 1@hang:step:3, random:3, mock=rank,version,seqno,ndeath (repeatable)",
      (v: string, prev: string[] | undefined) => [...(prev ?? []), v],
    )
    .option("--seed <n>", "seed of the random kills (default: random, printed)")
    .option("--repeat <n>", "faulty runs, each with a seed derived from --seed (default 1)")
    .option("--report <file.html>", "write a self-contained HTML picture of the runs")
    .passThroughOptions()
    .action(async (app: string, args: string[], opts: Record<string, unknown>) => {
      const str = (k: string): string | undefined => (typeof opts[k] === "string" ? opts[k] : undefined);
      const flags: DrillFlags = {
        ...toFlags(app, args, opts),
        kill: (opts.kill as string[] | undefined) ?? [],
        seed: str("seed"),
        repeat: str("repeat"),
        report: str("report"),
      };
      const config = resolveDrillConfig(flags, { cwd: io.cwd, command: ["lifeline", "drill", ...(io.argv ?? [])].join(" ") });
      const outcome = await runDrill(config, { stdout: io.stdout, stderr: io.stderr, env: io.env, handleSignals: io.handleSignals ?? true });
      setExit(outcome.exitCode);
    });

  const coordinator = program
    .command("coordinator")
    .summary("run a job's coordinator alone, for ranks that another engine starts")
    .description(
      "Run the coordinator of a job of <ranks> ranks that another engine starts (a Kubernetes Indexed Job, srun, mpirun): bind --bind:--port,\n" +
        "wait for the ranks to join (each with its engine's rank variables and LIFELINE_COORDINATOR=tcp://ADDRESS:PORT) and supervise them.\n" +
        "It restarts nothing: a failure stops the job (exit 1) for the engine to run it again; in cpr the next run resumes from the newest line.\n" +
        "<app> and its arguments name the job (they are not started here). See docs/cluster.md.",
    )
    .argument("<app>", "the program the ranks run (not started here: with its arguments it names the job)")
    .argument("[args...]", "the program's arguments");
  addRunOptions(coordinator);
  coordinator
    .option("--port <port>", "tcp port to listen on (default 0: one the OS picks, shown in the job-starting event)")
    .option("--keys <dir>", "the job's keys, made by `lifeline keys <dir>` (the ranks get <dir>/ranks.key as LIFELINE_KEYS); required unless --insecure")
    .passThroughOptions()
    .action(async (app: string, args: string[], opts: Record<string, unknown>) => {
      const flags = toFlags(app, args, opts);
      const config = resolveRunConfig({ ...flags, transport: flags.transport ?? "tcp" }, { cwd: io.cwd, env: io.env });
      const port = resolveStandalone(config, opts);
      setExit(await runStandalone({ ...config, port }, { stdout: io.stdout, stderr: io.stderr, env: io.env, handleSignals: io.handleSignals ?? true }));
    });

  program
    .command("keys")
    .summary("make the keys of a job that lifeline coordinator runs")
    .description(
      "Make a job's keys in <dir> (created 0700): coordinator.key for `lifeline coordinator --keys <dir>`, and ranks.key for the ranks\n" +
        "(LIFELINE_KEYS=<path of ranks.key>; on Kubernetes, a Secret made from it). Both 0600; existing keys are never overwritten.\n" +
        "`lifeline run` needs none of this: it makes each job's keys itself. See docs/security.md.",
    )
    .argument("<dir>", "directory for the key files")
    .action((dir: string) => {
      const files = writeKeyDir(resolvePath(io.cwd, dir), makeJobKeys({ curve: true }));
      io.stdout.write(
        `lifeline: made a job's keys: ${files.coordinator} (for lifeline coordinator --keys ${dir}), ${files.ranks} (for the ranks: LIFELINE_KEYS)\n`,
      );
    });

  program
    .command("lines")
    .summary("list the recovery lines in a store")
    .description(
      "List the recovery lines in a store (epoch, time, ranks, bytes, the run of the job that committed it, state) and the job they belong to, verifying every committed line's parts.\n" +
        "Works while a job uses the store: it reads a copy of the store's databases and never takes the job's locks.",
    )
    .option("--store <dir>", `the store (default ${DEFAULTS.store})`)
    .option("--json", "the listing as one JSON document on stdout")
    .action(async (opts: { store?: string; json?: boolean }) => {
      try {
        const report = await listLines(resolvePath(io.cwd, opts.store ?? DEFAULTS.store));
        io.stdout.write(opts.json === true ? `${JSON.stringify(report, null, 2)}\n` : formatLines(report));
      } catch (err) {
        if (!isLifelineError(err)) throw err;
        io.stderr.write(`lifeline: error: ${indent(err.message)}\n`);
        setExit(1);
      }
    });
  return program;
}

function addRunOptions(cmd: Command): void {
  cmd
    .option("-n, --np <ranks>", `number of ranks, 1..${NP_MAX} (required)`)
    .addOption(new Option("--mode <mode>", `recovery mode: ${MODES.join(" | ")} (default cpr)`))
    .option(
      "--checkpoint-every <when>",
      "cpr: how often to take a global checkpoint, a duration (10s) or steps (50steps); default 10s. retry-one: steps only, every Nth checkpoint() call (default: every call)",
    )
    .option("--store <dir>", `directory of the recovery-line store (default ${DEFAULTS.store})`)
    .option("--keep-lines <n>", `recovery lines to keep (default ${DEFAULTS.keepLines})`)
    .option("--max-restarts <n>", `restarts allowed before the job fails (default ${DEFAULTS.maxRestarts})`)
    .option("--replicas <k>", `retry-one: ring successors that keep a copy of each rank's state in memory (default ${DEFAULTS.replicas})`)
    .option(
      "--durable-every <n>",
      `retry-one: every n-th checkpoint of each rank also goes to --store, the floor a restart of every rank falls back to (default ${DEFAULTS.durableEvery}; 0: none)`,
    )
    .option(
      "--log-limit <size>",
      "retry-one: bound on each rank's log of sent messages its receivers' checkpoints do not cover yet, e.g. 256MiB (default 1GiB)",
    )
    .option("--no-spare", "do not keep warm spare processes for restarts (one in retry-one, one per rank in cpr; restarted ranks then start cold)")
    .option(
      "--no-malloc-tuning",
      "leave glibc's malloc settings of ranks at their defaults (the launcher sets GLIBC_TUNABLES for fewer page faults on large messages)",
    )
    .option(
      "--no-gc-pacing",
      "ranks leave garbage collection to V8 alone (by default a rank runs a young-generation collection after each 16 MiB it receives without one, which frees received messages before V8 starts a full one)",
    )
    .option("--min-np <n>", "elastic: the fewest ranks the job goes on with; below, it waits --elastic-timeout for ranks to join, then fails (default 1)")
    .option("--max-np <n>", "elastic: the most ranks at once; -n start, the others join when up (default -n)")
    .option("--elastic-timeout <dur>", `elastic: how long a job below --min-np waits for ranks to join (default ${DEFAULTS.elasticTimeoutMs / 1000}s)`)
    .option("--replay <results.json>", "elastic: run the changes of the world another run recorded in its --results file, without faults")
    .option("--restart-reset <dur>", "healthy running for this long forgives earlier restarts: --max-restarts and the back-off start over (default: never)")
    .option("--error-file <file>", "JSON record of every failure: rank, attempt, cause, time, last stderr lines (default <store>/errors.json)")
    .option("--heartbeat <ms>", `rank heartbeat interval (default ${DEFAULTS.heartbeatMs}ms)`)
    .option("--failure-timeout <ms>", `a rank silent this long is failed (default ${DEFAULTS.failureTimeoutMs}ms, at least 2x --heartbeat)`)
    .option("--stuck-timeout <dur>", "a rank with no checkpoint() call for this long is stuck and failed (default: not monitored)")
    .option("--rendezvous-timeout <dur>", `time for every rank to call init() (default ${DEFAULTS.rendezvousTimeoutMs / 1000}s)`)
    .option(
      "--start-timeout <dur>",
      `a rank that has not called init() this long after its process started is failed: killed, and restarted in cpr and retry-one (default ${DEFAULTS.startTimeoutMs / 1000}s, or --failure-timeout if longer)`,
    )
    .option(
      "--resume",
      "cpr: continue the job from the newest recovery line an earlier run of it left in --store; an error if there is none (without --resume or --fresh the job resumes when it can)",
    )
    .option("--fresh", "cpr: discard every recovery line in --store, whoever's it is, and start the job from the beginning")
    .option("--results <file>", "write every rank's finalize() result and the job's outcome as JSON")
    .option("--json", "events as JSON lines on stderr, for machines")
    .option("-q, --quiet", "print only errors (the ranks' own output is still forwarded)")
    .option("--transport <ipc|tcp>", `how ranks and coordinator connect (default ${DEFAULTS.transport}; tcp with --bind)`)
    .option(
      "--bind <address|interface>",
      "tcp: the interface or IPv4 address the coordinator and the ranks listen on and advertise (default 127.0.0.1); implies --transport tcp",
    )
    .option(
      "--hostfile <file>",
      "run the ranks on these hosts (Open MPI's format: `host slots=N` per line; extra slots are spares for restarts), started through --rsh; needs --bind",
    )
    .option(
      "--store-scope <scope>",
      "cpr: shared (one --store directory every rank reaches) or host (a --store directory on each host; each part also copied to a partner on another host); default host with --hostfile or --launcher slurm, else shared",
    )
    .option("--rsh <command>", `remote-shell agent for --hostfile, called as COMMAND HOST CMDLINE (default ${DEFAULTS.rsh})`)
    .option(
      "--launcher <local|rsh|slurm>",
      "how ranks are started: local (this host), rsh (--hostfile's hosts through --rsh) or slurm (job steps of the Slurm allocation lifeline runs in, on its nodes or --hostfile's; needs --bind); default rsh with --hostfile, else local",
    )
    .option("--insecure", "tcp without CURVE: links neither authenticated nor encrypted, for a network you trust (a warning says so); see docs/security.md")
    .option("--max-message <size>", "the longest message a rank sends or accepts, e.g. 64MiB (default 1GiB); longer ones are refused")
    .option("--max-unexpected <size>", "bytes of messages a rank may hold that no receive has taken yet (default 1GiB); past it the job stops with MPI_LIMIT")
    .option(
      "--inject <rank@trigger>",
      "inject a fault: 1@step:5, 2@send:3, 0@time:1500, 1@hang:step:2 (repeatable)",
      (v: string, prev: string[] | undefined) => [...(prev ?? []), v],
    )
    .addHelpText(
      "after",
      "\nExit codes: 0 every rank finalized and exited 0; 2 usage error; 130/143/129 interrupted by SIGINT/SIGTERM/SIGHUP;\n" +
        "otherwise the failed rank's exit code (128+signal if killed), or 1 for failures the launcher detected.\n" +
        "Durations take ms, s, m or h (a bare number is milliseconds).\n",
    );
}

function toFlags(app: string, args: string[], o: Record<string, unknown>): RunFlags {
  const str = (k: string): string | undefined => (typeof o[k] === "string" ? o[k] : undefined);
  return {
    np: str("np"),
    mode: str("mode"),
    checkpointEvery: str("checkpointEvery"),
    store: str("store"),
    keepLines: str("keepLines"),
    maxRestarts: str("maxRestarts"),
    replicas: str("replicas"),
    logLimit: str("logLimit"),
    durableEvery: str("durableEvery"),
    spare: o.spare === false ? false : undefined,
    mallocTuning: o.mallocTuning === false ? false : undefined,
    gcPacing: o.gcPacing === false ? false : undefined,
    minNp: str("minNp"),
    maxNp: str("maxNp"),
    elasticTimeout: str("elasticTimeout"),
    replay: str("replay"),
    restartReset: str("restartReset"),
    errorFile: str("errorFile"),
    heartbeat: str("heartbeat"),
    failureTimeout: str("failureTimeout"),
    stuckTimeout: str("stuckTimeout"),
    rendezvousTimeout: str("rendezvousTimeout"),
    startTimeout: str("startTimeout"),
    resume: o.resume === true,
    fresh: o.fresh === true,
    results: str("results"),
    json: o.json === true,
    quiet: o.quiet === true,
    transport: str("transport"),
    bind: str("bind"),
    hostfile: str("hostfile"),
    storeScope: str("storeScope"),
    rsh: str("rsh"),
    launcher: str("launcher"),
    inject: (o.inject as string[] | undefined) ?? [],
    insecure: o.insecure === true,
    keys: str("keys"),
    maxMessage: str("maxMessage"),
    maxUnexpected: str("maxUnexpected"),
    app,
    appArgs: args,
  };
}

/** The checks of `lifeline coordinator` beyond run's; resolves to the port. Throws LAUNCH_USAGE. */
function resolveStandalone(config: RunConfig, opts: Record<string, unknown>): number {
  const problems: string[] = [];
  if (config.transport !== "tcp") problems.push("lifeline coordinator listens on tcp (other engines' ranks connect to it): drop --transport ipc");
  if (config.mode === "retry-one")
    problems.push("--mode retry-one restarts one rank into the running job, which only the launcher can do: use lifeline run, or --mode cpr / none here");
  if (config.mode === "elastic")
    problems.push(
      "--mode elastic starts ranks into the running job (and decides when to), which only the launcher does: use lifeline run, or --mode cpr / none here",
    );
  if (config.launcher === "slurm")
    problems.push(
      "--launcher slurm starts ranks as job steps; lifeline coordinator leaves that to the engine (srun in the batch script): drop it (or use lifeline run)",
    );
  else if (config.hosts !== undefined) problems.push("--hostfile starts ranks; lifeline coordinator leaves that to the engine: drop it (or use lifeline run)");
  if (config.storeScope === "host")
    problems.push(
      "--store-scope host needs to know each rank's host, which only lifeline run does (--hostfile); lifeline coordinator keeps lines in one --store every rank reaches",
    );
  if (config.faults.some((f) => f !== "")) problems.push("--inject sets the ranks' fault variables, which the engine starts: set LIFELINE_FAULTS there");
  if (config.keys === undefined && config.insecure !== true)
    problems.push(
      "lifeline coordinator needs the job's keys: make them with `lifeline keys DIR`, pass --keys DIR, and give the ranks DIR/ranks.key as LIFELINE_KEYS (or run with --insecure on a network you trust)",
    );
  let port = 0;
  if (typeof opts.port === "string") {
    try {
      port = parseCount(opts.port, "--port", 0, 65535);
    } catch (err) {
      problems.push((err as Error).message);
    }
  }
  if (problems.length > 0) throw new LifelineError("LAUNCH_USAGE", problems.length === 1 ? problems[0]! : problems.map((p) => `- ${p}`).join("\n"));
  return port;
}

function indent(message: string): string {
  return message.includes("\n") ? `the command line has ${message.split("\n").length} problems:\n${message}` : message;
}

/** True when this file is the program being run (also through npm's bin symlink). */
function isEntryPoint(): boolean {
  const script = process.argv[1];
  if (script === undefined) return false;
  try {
    return realpathSync(script) === realpathSync(fileURLToPath(import.meta.url));
  } catch {
    return false;
  }
}

if (isEntryPoint()) {
  // A reader of our stdout that went away (`lifeline run ... | head`) must not crash the
  // launcher mid-job: that would kill the ranks. Further output is simply dropped.
  process.stdout.on("error", () => undefined);
  process.stderr.on("error", () => undefined);
  const code = await main(process.argv.slice(2), { stdout: process.stdout, stderr: process.stderr, env: process.env, cwd: process.cwd() });
  // Output to pipes, files and terminals is synchronous on Linux, so nothing is lost by exiting
  // now; exiting explicitly does not wait for handles a rank's helper processes may hold.
  process.exit(code);
}
