/**
 * The run configuration of `lifeline run` (docs/cli.md) and the validation of its flags.
 *
 * The CLI hands raw strings to {@link resolveRunConfig}; every check lives here so that the
 * launcher can also be driven from code with the same errors. All problems with one command
 * line are reported together (one per line), so a user fixes them in one go.
 *
 * @example
 * const config = resolveRunConfig({ np: "4", mode: "none", app: "app.ts", appArgs: [] }, { cwd: process.cwd() });
 * // throws LifelineError LAUNCH_USAGE naming every bad flag
 */
import { existsSync, readFileSync, statSync } from "node:fs";
import { dirname, extname, isAbsolute, resolve } from "node:path";
import { LifelineError, isLifelineError } from "../errors.ts";
import { resolveBind } from "../mpi/bind.ts";
import { DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_UNEXPECTED_BYTES, MODES, type Mode } from "../mpi/env.ts";
import { parseFaults } from "../mpi/faults.ts";
import type { PlannedChange } from "./elastic-membership.ts";
import { launcherHosts, LAUNCHERS, parseHostfile, Placement, type HostSlots, type LauncherKind } from "./hosts.ts";

/** `cpr` is the default mode (docs/cli.md). */
export const DEFAULT_MODE: Mode = "cpr";

/** Largest job `-n` accepts; far beyond what one host runs, it guards against typos like `-n 40000`. */
export const NP_MAX = 1024;

/** App file types a rank can run: TypeScript through the bundled tsx loader, JavaScript as is. */
export const TS_EXTENSIONS = [".ts", ".mts", ".cts"] as const;
export const JS_EXTENSIONS = [".js", ".mjs", ".cjs"] as const;

/** When the initiator asks for a global checkpoint (cpr): every so often, or every so many steps. */
export type CheckpointEvery = { kind: "time"; ms: number } | { kind: "steps"; steps: number };

/** `--mode elastic`: the first world, its limits, and a replay of recorded changes. */
export interface ElasticConfig {
  /** The first world's size (`-n`). */
  readonly initial: number;
  /** `--min-np`: fewer ranks than this and the job waits for ranks to join, then fails. */
  readonly minNp: number;
  /** `--max-np`: the most ranks at once (and the rank processes at most: one per slot). */
  readonly maxNp: number;
  /** `--elastic-timeout`: how long to wait below `minNp`. */
  readonly waitMs: number;
  /** `--replay`: exactly these changes, without faults (one process per rank that joins). */
  readonly plan?: PlannedChange[] | undefined;
}

/** Everything `lifeline run` needs, validated. Options unused by a mode are still carried. */
export interface RunConfig {
  /** Number of ranks (elastic: of rank processes at most, the slots; `elastic.initial` is `-n`). */
  size: number;
  mode: Mode;
  /** Absolute path of the program every rank runs. */
  app: string;
  appArgs: string[];
  /** Working directory of the ranks (the launcher's). */
  cwd: string;
  checkpointEvery: CheckpointEvery;
  /** Absolute path of the recovery-line store (not created by mode none). */
  store: string;
  keepLines: number;
  maxRestarts: number;
  /** Healthy running for this long forgives the restarts so far (`--restart-reset`); `undefined` = never. */
  restartResetMs: number | undefined;
  /** Absolute path of the JSON failure record (`--error-file`); `undefined` = `<store>/errors.json`. */
  errorFile: string | undefined;
  heartbeatMs: number;
  failureTimeoutMs: number;
  /** No step boundary for this long = stuck; `undefined` = not monitored. */
  stuckTimeoutMs: number | undefined;
  /** A rank that has not said hello this long after the coordinator is up fails the job. */
  rendezvousTimeoutMs: number;
  /**
   * A rank process that has not joined (called init()) this long after it was started is
   * failed like a crashed one: killed, and restarted in cpr and retry-one (`--start-timeout`).
   */
  startTimeoutMs: number;
  /**
   * What to do with recovery lines of this job left in the store by an earlier run: `auto`
   * continues from the newest (the default, so a batch system's requeue of the same command
   * resumes), `resume` insists (`--resume`: an error if there is nothing to resume), `fresh`
   * discards every line in the store first (`--fresh`).
   */
  resume: "auto" | "resume" | "fresh";
  /** Absolute path of the results file, if any. */
  resultsPath: string | undefined;
  json: boolean;
  quiet: boolean;
  transport: "ipc" | "tcp";
  /**
   * tcp: `--bind`, the interface or IPv4 address the coordinator and the ranks bind and
   * advertise (each rank resolves it on its own host); undefined: the loopback address.
   */
  bind: string | undefined;
  /** `--bind` resolved on this host: the coordinator's address. */
  bindAddress: string | undefined;
  /** `--hostfile` or the Slurm allocation: the hosts ranks run on, with their slots; undefined: every rank on this host. */
  hosts: HostSlots[] | undefined;
  /** `--rsh`: the remote-shell agent's argv, called as `AGENT HOST COMMAND` (default `ssh`). */
  rsh: string[];
  /**
   * `--launcher`: how ranks are started (src/launch/spawners.ts): `local` (the default), `rsh`
   * (the default with `--hostfile`) or `slurm` (job steps of the allocation the launcher runs in).
   * Absent in configurations built by hand: `local`, or `rsh` when `hosts` is set.
   */
  launcher?: LauncherKind | undefined;
  /** `--launcher slurm`: the allocation's job id (SLURM_JOB_ID). */
  slurmJobId?: string | undefined;
  /**
   * cpr: `shared`: `--store` is one directory every rank reaches (one host, or a shared
   * filesystem); `host`: each host has its own `--store` directory, and parts are copied to a
   * partner rank on another host (src/store/partners.ts). `--store-scope`, default `host` when
   * the ranks run on several hosts (`--hostfile`, `--launcher slurm`), else `shared`.
   */
  storeScope: "shared" | "host";
  /** `LIFELINE_FAULTS` of each rank ("" = none), from `--inject`. */
  faults: string[];
  /** retry-one: ring successors that keep a copy of each rank's state (`--replicas`, default 2). */
  replicas?: number | undefined;
  /** retry-one: keep a warm spare process for the next restart (`--no-spare` turns it off; default on). */
  spare?: boolean | undefined;
  /** Ranks and spares get glibc's malloc tunables of RANK_MALLOC_TUNABLES (`--no-malloc-tuning` turns it off; default on). */
  mallocTuning?: boolean | undefined;
  /** Ranks pace scavenges by the bytes they receive (src/mpi/zmq/gc-pacing.ts; `--no-gc-pacing` turns it off; default on). */
  gcPacing?: boolean | undefined;
  /** retry-one: bound on each rank's sender log in bytes (`--log-limit`; the rank's default when undefined). */
  logLimitBytes?: number | undefined;
  /** retry-one: every how many own checkpoints a rank writes one to `--store` too (0: no durable floor). */
  durableEvery?: number | undefined;
  /**
   * `--insecure`: no CURVE on tcp (docs/security.md says what that gives up). Absent or false:
   * every tcp link is authenticated and encrypted.
   */
  insecure?: boolean | undefined;
  /** `lifeline coordinator --keys`: the job's key directory (or coordinator key file), absolute. */
  keys?: string | undefined;
  /** `--max-message`: the longest message body a rank sends or accepts, in bytes. */
  maxMessageBytes?: number | undefined;
  /** `--max-unexpected`: bytes of unmatched messages a rank may hold before the job stops. */
  maxUnexpectedBytes?: number | undefined;
  /** `--mode elastic`: the first world and its limits. */
  elastic?: ElasticConfig | undefined;
}

/** The raw strings the CLI collected; `undefined` = flag not given. */
export interface RunFlags {
  np?: string | undefined;
  mode?: string | undefined;
  checkpointEvery?: string | undefined;
  store?: string | undefined;
  keepLines?: string | undefined;
  maxRestarts?: string | undefined;
  restartReset?: string | undefined;
  errorFile?: string | undefined;
  heartbeat?: string | undefined;
  failureTimeout?: string | undefined;
  stuckTimeout?: string | undefined;
  rendezvousTimeout?: string | undefined;
  startTimeout?: string | undefined;
  resume?: boolean | undefined;
  fresh?: boolean | undefined;
  results?: string | undefined;
  json?: boolean | undefined;
  quiet?: boolean | undefined;
  transport?: string | undefined;
  bind?: string | undefined;
  hostfile?: string | undefined;
  rsh?: string | undefined;
  launcher?: string | undefined;
  storeScope?: string | undefined;
  inject?: string[] | undefined;
  replicas?: string | undefined;
  logLimit?: string | undefined;
  durableEvery?: string | undefined;
  /** false for `--no-spare`. */
  spare?: boolean | undefined;
  /** false for `--no-malloc-tuning`. */
  mallocTuning?: boolean | undefined;
  /** false for `--no-gc-pacing`. */
  gcPacing?: boolean | undefined;
  insecure?: boolean | undefined;
  keys?: string | undefined;
  maxMessage?: string | undefined;
  maxUnexpected?: string | undefined;
  minNp?: string | undefined;
  maxNp?: string | undefined;
  elasticTimeout?: string | undefined;
  replay?: string | undefined;
  app?: string | undefined;
  appArgs?: string[] | undefined;
}

/** Defaults of the optional flags (docs/cli.md lists them for users). */
export const DEFAULTS = {
  checkpointEvery: { kind: "time", ms: 10_000 } as CheckpointEvery,
  store: ".lifeline",
  keepLines: 2,
  maxRestarts: 3,
  // The rank side (src/mpi/env.ts) uses the same defaults when the variables are missing.
  heartbeatMs: 500,
  failureTimeoutMs: 5_000,
  rendezvousTimeoutMs: 30_000,
  /** At least this, or --failure-timeout if longer: a start takes 1-3 s on a loaded machine. */
  startTimeoutMs: 10_000,
  transport: "ipc" as "ipc" | "tcp",
  replicas: 2,
  rsh: "ssh",
  /**
   * retry-one's durable floor: every 200th checkpoint of each rank. Measured with
   * `npm run bench -- --only durable` (4 ranks, 65 MiB per checkpoint, ~70 ms per step): a write
   * round costs the program about 0.4 s of wall time on 2 cores; the program's wall time was
   * 1.023x at N = 100 and 1.028x at N = 200 on a quiet machine (see docs/cli.md).
   */
  durableEvery: 200,
  maxMessageBytes: DEFAULT_MAX_MESSAGE_BYTES,
  maxUnexpectedBytes: DEFAULT_MAX_UNEXPECTED_BYTES,
  /** elastic: how long a world below --min-np waits for ranks to join. */
  elasticTimeoutMs: 30_000,
} as const;

/** The largest `--max-message`: a Node buffer's limit, less ZeroMQ's frame slack. */
const MAX_MESSAGE_LIMIT = 2 ** 32 - 128 * 1024;

/** Size units: `k`/`m`/`g` and `KiB`/`MiB`/`GiB` are binary, `KB`/`MB`/`GB` decimal. */
const UNIT_BYTES: Record<string, number> = {
  b: 1,
  k: 1024,
  kb: 1000,
  kib: 1024,
  m: 1024 ** 2,
  mb: 1000 ** 2,
  mib: 1024 ** 2,
  g: 1024 ** 3,
  gb: 1000 ** 3,
  gib: 1024 ** 3,
};

/**
 * Parses a size: a number of bytes with an optional unit (see UNIT_BYTES), e.g. `65536`,
 * `64KiB`, `1GiB`, `1.5G`, `2GB`. Throws `LAUNCH_USAGE` naming `flag` for anything else or
 * outside [min, max].
 */
export function parseBytes(text: string, flag: string, min: number, max: number): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$/i.exec(text);
  const unit = UNIT_BYTES[(m?.[2] ?? "").toLowerCase() || "b"];
  if (m === null || unit === undefined) throw usage(`${flag} ${JSON.stringify(text)} is not a size; write e.g. 65536, 64KiB, 256MiB or 1GiB`);
  const n = Math.floor(Number(m[1]) * unit);
  if (!Number.isSafeInteger(n) || n < min || n > max) throw usage(`${flag} ${JSON.stringify(text)} must be from ${min} to ${max} bytes`);
  return n;
}

const UNIT_MS: Record<string, number> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000 };

/**
 * Parses a duration: a number with an optional unit `ms`, `s`, `m` or `h` (`1500`, `1500ms`,
 * `1.5s`, `2m`). A bare number is milliseconds. Returns whole milliseconds.
 * Throws `LAUNCH_USAGE` naming `flag`.
 */
export function parseDuration(text: string, flag: string): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$/.exec(text);
  if (m === null) {
    throw usage(`${flag} ${JSON.stringify(text)} is not a duration; write e.g. 500ms, 10s, 2m or 1h (a bare number is milliseconds)`);
  }
  const ms = Math.round(Number(m[1]) * UNIT_MS[m[2] ?? "ms"]!);
  if (!Number.isSafeInteger(ms)) throw usage(`${flag} ${JSON.stringify(text)} is too large`);
  return ms;
}

/** Parses `--checkpoint-every`: a duration (`10s`) or a step count (`50steps`). */
export function parseCheckpointEvery(text: string): CheckpointEvery {
  const steps = /^\s*(\d+)\s*steps?\s*$/.exec(text);
  if (steps !== null) {
    const n = Number(steps[1]);
    if (!Number.isSafeInteger(n) || n < 1) throw usage(`--checkpoint-every ${JSON.stringify(text)}: the step count must be at least 1`);
    return { kind: "steps", steps: n };
  }
  if (/^\s*\d+(\.\d+)?\s*$/.test(text)) {
    throw usage(`--checkpoint-every ${JSON.stringify(text)} is ambiguous; write a duration (${text.trim()}s) or a step count (${text.trim()}steps)`);
  }
  let ms: number;
  try {
    ms = parseDuration(text, "--checkpoint-every");
  } catch {
    throw usage(`--checkpoint-every ${JSON.stringify(text)} is neither a duration (10s, 500ms, 2m) nor a step count (50steps)`);
  }
  if (ms < 1) throw usage(`--checkpoint-every ${JSON.stringify(text)} must be longer than 0`);
  return { kind: "time", ms };
}

/** Parses a whole number within [min, max]; throws `LAUNCH_USAGE` naming `flag`. */
export function parseCount(text: string, flag: string, min: number, max: number): number {
  const n = /^\s*\d+\s*$/.test(text) ? Number(text) : NaN;
  if (!Number.isSafeInteger(n) || n < min || n > max) {
    throw usage(`${flag} must be a whole number from ${min} to ${max}, got ${JSON.stringify(text)}`);
  }
  return n;
}

/**
 * Parses one `--inject <rank>@<trigger>` (`1@step:5`, `2@send:3`, `0@time:1500`, `0@time:1.5s`,
 * `1@hang:step:2`, `1@step:3@attempt=1`). The trigger is checked with the rank side's own
 * parser (src/mpi/faults.ts), so the launcher never hands a rank a spec it would reject.
 */
export function parseInject(text: string, size: number | undefined): { rank: number; spec: string } {
  const at = text.indexOf("@");
  if (at <= 0 || at === text.length - 1) {
    throw usage(`--inject ${JSON.stringify(text)}: write <rank>@<trigger>, e.g. 1@step:5, 2@send:3 or 0@time:1500`);
  }
  const rankText = text.slice(0, at);
  const rank = /^\d+$/.test(rankText) ? Number(rankText) : NaN;
  if (!Number.isSafeInteger(rank)) throw usage(`--inject ${JSON.stringify(text)}: ${JSON.stringify(rankText)} is not a rank number`);
  if (size !== undefined && rank >= size) {
    throw usage(`--inject ${JSON.stringify(text)}: rank ${rank} is outside 0..${size - 1} (the job has ${size} rank${size === 1 ? "" : "s"})`);
  }
  // Accept a unit on time triggers (as drill's --kill does: 2@time:1.5s); the rank side wants ms.
  let spec = text.slice(at + 1).replace(/^((?:hang:)?time:)([^@;]+)/, (_all, head: string, dur: string) => {
    if (/^\d+$/.test(dur)) return head + dur;
    return head + String(parseDuration(dur, `--inject ${JSON.stringify(text)}: time`));
  });
  spec = spec.trim();
  try {
    parseFaults(spec);
  } catch (err) {
    if (isLifelineError(err, "LAUNCH_FAULT_SPEC")) throw usage(`--inject ${JSON.stringify(text)}: ${err.message}`);
    throw err;
  }
  return { rank, spec };
}

/** Builds the run configuration from raw flags. Throws one `LAUNCH_USAGE` listing every problem. */
export function resolveRunConfig(flags: RunFlags, ctx: { cwd: string; env?: NodeJS.ProcessEnv }): RunConfig {
  const problems: string[] = [];
  const check = <T>(fn: () => T): T | undefined => {
    try {
      return fn();
    } catch (err) {
      if (isLifelineError(err, "LAUNCH_USAGE")) {
        problems.push(err.message);
        return undefined;
      }
      throw err;
    }
  };

  let size: number | undefined;
  if (flags.np === undefined) problems.push("missing -n/--np <ranks>: how many ranks to start");
  else size = check(() => parseCount(flags.np!, "-n/--np", 1, NP_MAX));

  const mode = check((): Mode => {
    const raw = flags.mode ?? DEFAULT_MODE;
    if (!(MODES as readonly string[]).includes(raw)) {
      throw usage(`--mode ${JSON.stringify(raw)} is not a mode; use one of ${MODES.join(", ")}`);
    }
    return raw as Mode;
  });

  const elasticFlags = (["minNp", "maxNp", "elasticTimeout", "replay"] as const).filter((k) => flags[k] !== undefined);
  if (mode !== undefined && mode !== "elastic" && elasticFlags.length > 0) {
    const names = { minNp: "--min-np", maxNp: "--max-np", elasticTimeout: "--elastic-timeout", replay: "--replay" };
    problems.push(`${elasticFlags.map((k) => names[k]).join(", ")}: for --mode elastic only (this job runs in --mode ${mode})`);
  }
  const elastic = mode === "elastic" && size !== undefined ? check(() => resolveElastic(flags, size, ctx.cwd)) : undefined;
  // An elastic job has one rank process per slot: up to --max-np, or one per rank a replay takes in.
  const slots = elastic === undefined ? size : elasticSlots(elastic);

  const checkpointEvery = flags.checkpointEvery === undefined ? DEFAULTS.checkpointEvery : check(() => parseCheckpointEvery(flags.checkpointEvery!));
  // retry-one: only a step count, the same on every rank (ranks that pass a `global` must take
  // their checkpoints at the same counts, which a clock read on each rank would not give).
  if (mode === "retry-one" && flags.checkpointEvery !== undefined && checkpointEvery?.kind === "time") {
    problems.push(
      `--checkpoint-every ${flags.checkpointEvery}: in --mode retry-one it takes a step count (e.g. 50steps: a checkpoint at every 50th checkpoint() call); without it every call is a checkpoint`,
    );
  }
  const keepLines = flags.keepLines === undefined ? DEFAULTS.keepLines : check(() => parseCount(flags.keepLines!, "--keep-lines", 1, 1000));
  const maxRestarts = flags.maxRestarts === undefined ? DEFAULTS.maxRestarts : check(() => parseCount(flags.maxRestarts!, "--max-restarts", 0, 1_000_000));
  const replicas = flags.replicas === undefined ? DEFAULTS.replicas : check(() => parseCount(flags.replicas!, "--replicas", 0, 1_000));
  const logLimitBytes = flags.logLimit === undefined ? undefined : check(() => parseBytes(flags.logLimit!, "--log-limit", 1024, 2 ** 50));
  if (flags.logLimit !== undefined && mode !== undefined && mode !== "retry-one") {
    problems.push(`--log-limit bounds retry-one's message log; it does nothing in --mode ${mode}`);
  }
  const restartResetMs =
    flags.restartReset === undefined
      ? undefined
      : check(() => bounded(parseDuration(flags.restartReset!, "--restart-reset"), "--restart-reset", flags.restartReset!, 1, 30 * 86_400_000));
  const errorFile =
    flags.errorFile === undefined
      ? undefined
      : check(() => {
          if (flags.errorFile!.trim() === "") throw usage("--error-file needs a file name");
          const path = resolve(ctx.cwd, flags.errorFile!);
          if (existsSync(path) && statSync(path).isDirectory()) throw usage(`--error-file ${JSON.stringify(flags.errorFile)} is a directory; give a file name`);
          return path;
        });
  const heartbeatMs =
    flags.heartbeat === undefined
      ? DEFAULTS.heartbeatMs
      : check(() => bounded(parseDuration(flags.heartbeat!, "--heartbeat"), "--heartbeat", flags.heartbeat!, 10, 3_600_000));
  const failureTimeoutMs =
    flags.failureTimeout === undefined
      ? Math.max(DEFAULTS.failureTimeoutMs, 2 * (heartbeatMs ?? DEFAULTS.heartbeatMs))
      : check(() => bounded(parseDuration(flags.failureTimeout!, "--failure-timeout"), "--failure-timeout", flags.failureTimeout!, 1, 86_400_000));
  if (heartbeatMs !== undefined && failureTimeoutMs !== undefined && failureTimeoutMs < 2 * heartbeatMs) {
    problems.push(
      `--failure-timeout (${failureTimeoutMs} ms) must be at least twice --heartbeat (${heartbeatMs} ms), so that one late heartbeat is not taken for a failure`,
    );
  }
  // Ranks report steps at most every 200 ms (src/mpi/world.ts), so shorter bounds would see
  // a busy rank as stuck.
  const stuckTimeoutMs =
    flags.stuckTimeout === undefined
      ? undefined
      : check(() => bounded(parseDuration(flags.stuckTimeout!, "--stuck-timeout"), "--stuck-timeout", flags.stuckTimeout!, 1_000, 30 * 86_400_000));
  const rendezvousTimeoutMs =
    flags.rendezvousTimeout === undefined
      ? DEFAULTS.rendezvousTimeoutMs
      : check(() => bounded(parseDuration(flags.rendezvousTimeout!, "--rendezvous-timeout"), "--rendezvous-timeout", flags.rendezvousTimeout!, 1, 86_400_000));

  const startTimeoutMs =
    flags.startTimeout === undefined
      ? Math.max(DEFAULTS.startTimeoutMs, failureTimeoutMs ?? 0)
      : check(() => bounded(parseDuration(flags.startTimeout!, "--start-timeout"), "--start-timeout", flags.startTimeout!, 100, 86_400_000));
  if (flags.startTimeout !== undefined && startTimeoutMs !== undefined && rendezvousTimeoutMs !== undefined && startTimeoutMs >= rendezvousTimeoutMs) {
    problems.push(
      `--start-timeout (${startTimeoutMs} ms) must be shorter than --rendezvous-timeout (${rendezvousTimeoutMs} ms): a rank slow to start is restarted within the time the whole job has to start`,
    );
  }

  if (flags.resume === true && flags.fresh === true) {
    problems.push(
      "--resume and --fresh contradict each other: --resume continues the job from its newest recovery line, --fresh discards the lines and starts over",
    );
  }

  const launcher = check((): LauncherKind => {
    const raw = flags.launcher ?? (flags.hostfile === undefined ? "local" : "rsh");
    if (!(LAUNCHERS as readonly string[]).includes(raw)) throw usage(`--launcher ${JSON.stringify(raw)} is not a launcher; use one of ${LAUNCHERS.join(", ")}`);
    return raw as LauncherKind;
  });
  const transport = check((): "ipc" | "tcp" => {
    // --bind is for tcp: it names an address other hosts reach.
    const remote = flags.hostfile !== undefined || (launcher !== undefined && launcher !== "local");
    const t = flags.transport ?? (flags.bind !== undefined || remote ? "tcp" : DEFAULTS.transport);
    if (t !== "ipc" && t !== "tcp") throw usage(`--transport ${JSON.stringify(t)} must be ipc or tcp`);
    if (t === "ipc" && flags.bind !== undefined)
      throw usage(`--bind ${JSON.stringify(flags.bind)} is for --transport tcp (ipc endpoints are files in a private directory and bind no address)`);
    return t;
  });
  const hostfile =
    flags.hostfile === undefined
      ? undefined
      : check(() => {
          const path = resolve(ctx.cwd, flags.hostfile!);
          let text: string;
          try {
            text = readFileSync(path, "utf8");
          } catch (err) {
            throw usage(`--hostfile ${JSON.stringify(flags.hostfile)}: cannot read ${path} (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`);
          }
          const parsed = parseHostfile(text, flags.hostfile!);
          if (slots !== undefined) new Placement(parsed, slots); // enough slots?
          return parsed;
        });
  // A hostfile that could not be read is a problem already; the launcher's hosts wait for it.
  const placed =
    launcher === undefined || (flags.hostfile !== undefined && hostfile === undefined)
      ? undefined
      : check(() => {
          const found = launcherHosts(launcher, hostfile, ctx.env ?? process.env);
          if (launcher === "slurm" && hostfile === undefined && slots !== undefined) new Placement(found.hosts!, slots, "allocation"); // enough slots?
          return found;
        });
  const hosts = placed?.hosts;
  if (flags.hostfile !== undefined && flags.bind === undefined) {
    problems.push("--hostfile needs --bind: the interface or address (of this host) on which ranks on the other hosts reach the coordinator");
  } else if (launcher === "slurm" && flags.bind === undefined) {
    problems.push(
      "--launcher slurm needs --bind: the interface (e.g. eth0, ib0, present on every node) on which ranks on the allocation's nodes reach the coordinator on this host",
    );
  }
  if (launcher === "slurm" && flags.rsh !== undefined)
    problems.push("--rsh is the agent of --launcher rsh; --launcher slurm starts ranks with srun: drop --rsh");
  const rsh = (flags.rsh ?? DEFAULTS.rsh)
    .trim()
    .split(/\s+/)
    .filter((w) => w !== "");
  // Ranks on several hosts: each host's own disk, with partner copies, unless told the store is shared.
  const storeScope =
    flags.storeScope === undefined
      ? hosts === undefined
        ? "shared"
        : "host"
      : check(() => {
          if (flags.storeScope !== "shared" && flags.storeScope !== "host")
            throw usage(
              `--store-scope ${JSON.stringify(flags.storeScope)}: expected shared (one directory every rank reaches) or host (a directory on each host, parts copied to a partner on another host)`,
            );
          return flags.storeScope;
        });
  // retry-one's durable floor: on a store every rank reaches (one host, or a shared filesystem).
  const durableEvery = check(() => {
    if (flags.durableEvery === undefined) return mode === "retry-one" && storeScope === "shared" ? DEFAULTS.durableEvery : 0;
    if (mode !== undefined && mode !== "retry-one") {
      throw usage(
        `--durable-every is retry-one's durable floor; it does nothing in --mode ${mode}${mode === "cpr" ? " (cpr's lines are on disk already)" : ""}`,
      );
    }
    const n = parseCount(flags.durableEvery, "--durable-every", 0, 1_000_000);
    if (n > 0 && storeScope === "host") {
      throw usage(
        "--durable-every needs --store in a directory every rank reaches (--store-scope shared: one host, or a shared filesystem); with a store on each host's own disk, retry-one relies on its in-memory replicas on other hosts",
      );
    }
    return n;
  });
  if ((flags.resume === true || flags.fresh === true) && mode !== undefined && mode !== "cpr" && !(mode === "retry-one" && (durableEvery ?? 0) > 0)) {
    const flag = flags.resume === true ? "--resume" : "--fresh";
    problems.push(
      mode === "none"
        ? `${flag} needs recovery lines, and --mode none keeps none; run with --mode cpr to take lines a later run can resume from`
        : `${flag}: --mode ${mode} keeps its checkpoints in the ranks' memory, and its durable floor is off (--durable-every 0 or --store-scope host), so nothing outlives the launcher to resume from`,
    );
  }
  if (rsh.length === 0) problems.push('--rsh needs a command (e.g. ssh, or "ssh -p 2222")');
  const bindAddress =
    flags.bind === undefined
      ? undefined
      : check(() => {
          const r = resolveBind(flags.bind!);
          if ("problem" in r) throw usage(`--bind ${JSON.stringify(flags.bind)}: ${r.problem}`);
          return r.address;
        });

  const maxMessageBytes =
    flags.maxMessage === undefined ? DEFAULTS.maxMessageBytes : check(() => parseBytes(flags.maxMessage!, "--max-message", 1024, MAX_MESSAGE_LIMIT));
  const maxUnexpectedBytes =
    flags.maxUnexpected === undefined
      ? DEFAULTS.maxUnexpectedBytes
      : check(() => parseBytes(flags.maxUnexpected!, "--max-unexpected", 1024, Number.MAX_SAFE_INTEGER));
  const keys =
    flags.keys === undefined
      ? undefined
      : check(() => {
          if (flags.insecure === true)
            throw usage("--keys and --insecure contradict each other: --keys secures the links with the job's keys, --insecure turns that off");
          const path = resolve(ctx.cwd, flags.keys!);
          if (!existsSync(path))
            throw usage(`--keys ${JSON.stringify(flags.keys)}: ${path} does not exist (make the job's keys with \`lifeline keys ${flags.keys}\`)`);
          return path;
        });

  if (flags.json === true && flags.quiet === true) {
    problems.push("--json and --quiet cannot be combined: --json is for machines, which can filter its events themselves");
  }

  const resultsPath =
    flags.results === undefined
      ? undefined
      : check(() => {
          if (flags.results!.trim() === "") throw usage("--results needs a file name");
          const path = resolve(ctx.cwd, flags.results!);
          // Checked now rather than after a long job: a missing directory would lose every result.
          const dir = dirname(path);
          if (!existsSync(dir) || !statSync(dir).isDirectory()) throw usage(`--results ${JSON.stringify(flags.results)}: directory ${dir} does not exist`);
          if (existsSync(path) && statSync(path).isDirectory()) throw usage(`--results ${JSON.stringify(flags.results)} is a directory; give a file name`);
          return path;
        });

  const faults: string[] = slots === undefined ? [] : new Array<string>(slots).fill("");
  for (const text of flags.inject ?? []) {
    const inj = check(() => parseInject(text, slots));
    if (inj !== undefined && slots !== undefined) faults[inj.rank] = faults[inj.rank] === "" ? inj.spec : `${faults[inj.rank]};${inj.spec}`;
  }

  const app = check(() => {
    if (flags.app === undefined || flags.app === "") throw usage("missing <app>: the .ts or .js program every rank runs");
    const path = isAbsolute(flags.app) ? flags.app : resolve(ctx.cwd, flags.app);
    if (!existsSync(path)) throw usage(`app ${JSON.stringify(flags.app)} not found (looked for ${path})`);
    if (!statSync(path).isFile()) throw usage(`app ${JSON.stringify(flags.app)} is not a file`);
    const ext = extname(path);
    if (!(TS_EXTENSIONS as readonly string[]).includes(ext) && !(JS_EXTENSIONS as readonly string[]).includes(ext)) {
      throw usage(
        `app ${JSON.stringify(flags.app)}: lifeline runs TypeScript (${TS_EXTENSIONS.join(" ")}) or JavaScript (${JS_EXTENSIONS.join(" ")}) programs, not ${JSON.stringify(ext || "files without an extension")}`,
      );
    }
    return path;
  });

  if (problems.length > 0) {
    throw usage(problems.length === 1 ? problems[0]! : problems.map((p) => `- ${p}`).join("\n"));
  }
  return {
    size: slots!,
    mode: mode!,
    app: app!,
    appArgs: flags.appArgs ?? [],
    cwd: ctx.cwd,
    checkpointEvery: checkpointEvery!,
    store: resolve(ctx.cwd, flags.store ?? DEFAULTS.store),
    keepLines: keepLines!,
    storeScope: storeScope!,
    maxRestarts: maxRestarts!,
    restartResetMs,
    errorFile,
    heartbeatMs: heartbeatMs!,
    failureTimeoutMs: failureTimeoutMs!,
    stuckTimeoutMs,
    rendezvousTimeoutMs: rendezvousTimeoutMs!,
    startTimeoutMs: startTimeoutMs!,
    resume: flags.fresh === true ? "fresh" : flags.resume === true ? "resume" : "auto",
    resultsPath,
    json: flags.json === true,
    quiet: flags.quiet === true,
    transport: transport!,
    bind: flags.bind,
    bindAddress,
    hosts,
    rsh,
    launcher: launcher!,
    slurmJobId: placed?.slurmJobId,
    faults,
    replicas: replicas!,
    spare: flags.spare !== false,
    mallocTuning: flags.mallocTuning !== false,
    gcPacing: flags.gcPacing !== false,
    logLimitBytes,
    durableEvery: durableEvery ?? 0,
    insecure: flags.insecure === true,
    keys,
    maxMessageBytes: maxMessageBytes!,
    maxUnexpectedBytes: maxUnexpectedBytes!,
    ...(elastic === undefined ? {} : { elastic }),
  };
}

/** The rank processes an elastic job has: one per slot (`--max-np`), or in a replay one per rank it ever has. */
export function elasticSlots(e: ElasticConfig): number {
  return e.plan === undefined ? e.maxNp : e.initial + e.plan.reduce((n, c) => n + c.joined, 0);
}

/** `--min-np`, `--max-np`, `--elastic-timeout` and `--replay` of an elastic job of `np` ranks at first. */
function resolveElastic(flags: RunFlags, np: number, cwd: string): ElasticConfig {
  const problems: string[] = [];
  const collect = <T>(fn: () => T): T | undefined => {
    try {
      return fn();
    } catch (err) {
      if (!isLifelineError(err, "LAUNCH_USAGE")) throw err;
      problems.push(err.message);
      return undefined;
    }
  };
  const minNp = flags.minNp === undefined ? 1 : collect(() => parseCount(flags.minNp!, "--min-np", 1, np));
  const maxNp = flags.maxNp === undefined ? np : collect(() => parseCount(flags.maxNp!, "--max-np", np, NP_MAX));
  const waitMs =
    flags.elasticTimeout === undefined
      ? DEFAULTS.elasticTimeoutMs
      : collect(() => bounded(parseDuration(flags.elasticTimeout!, "--elastic-timeout"), "--elastic-timeout", flags.elasticTimeout!, 1, 86_400_000));
  const plan = flags.replay === undefined ? undefined : collect(() => readReplay(resolve(cwd, flags.replay!), flags.replay!, np));
  if (problems.length > 0) throw usage(problems.join("\n"));
  return { initial: np, minNp: minNp!, maxNp: maxNp!, waitMs: waitMs!, ...(plan === undefined ? {} : { plan }) };
}

/**
 * The changes a `--results` file of an elastic run recorded (`recovery.changes`), checked to
 * chain: the first is for a world of `np` ranks, each next for the world the one before left.
 */
export function readReplay(path: string, shown: string, np: number): PlannedChange[] {
  let doc: unknown;
  try {
    doc = JSON.parse(readFileSync(path, "utf8"));
  } catch (err) {
    throw usage(`--replay ${JSON.stringify(shown)}: cannot read ${path} as JSON (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`);
  }
  const changes = (doc as { recovery?: { changes?: unknown } } | null)?.recovery?.changes;
  if (!Array.isArray(changes))
    throw usage(`--replay ${JSON.stringify(shown)}: no recorded changes (recovery.changes) in it; give the --results file of a --mode elastic run`);
  const isCount = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) >= 0;
  let size = np;
  let at = 0;
  return changes.map((c: unknown, i) => {
    const ch = c as Partial<PlannedChange> | null;
    const keep = ch?.keep;
    const fine =
      ch !== null &&
      isCount(ch.at) &&
      isCount(ch.size) &&
      isCount(ch.joined) &&
      Array.isArray(keep) &&
      keep.every((r, j) => isCount(r) && r < size && (j === 0 || r > keep[j - 1]!)) &&
      ch.at >= at &&
      ch.size === size &&
      keep.length + ch.joined >= 1;
    if (!fine) {
      throw usage(
        `--replay ${JSON.stringify(shown)}: change ${i + 1} (${JSON.stringify(c)}) does not follow the one before: it must be at a checkpoint from ${at} on, for a world of ${size} ranks, keep ranks below ${size} in increasing order and leave at least one`,
      );
    }
    size = keep.length + ch.joined;
    at = ch.at!;
    return { at: ch.at, size: ch.size, keep: [...keep], joined: ch.joined };
  });
}

function bounded(ms: number, flag: string, text: string, min: number, max: number): number {
  if (ms < min || ms > max) throw usage(`${flag} ${JSON.stringify(text)} must be between ${fmtMs(min)} and ${fmtMs(max)}`);
  return ms;
}

function fmtMs(ms: number): string {
  if (ms % 3_600_000 === 0) return `${ms / 3_600_000}h`;
  if (ms % 60_000 === 0) return `${ms / 60_000}m`;
  if (ms % 1_000 === 0) return `${ms / 1_000}s`;
  return `${ms}ms`;
}

function usage(message: string): LifelineError {
  return new LifelineError("LAUNCH_USAGE", message);
}
