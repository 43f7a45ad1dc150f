/**
 * Where a rank finds its place in the job (docs/cli.md, "What each rank gets"): `LIFELINE_*` variables set by
 * `lifeline run`, or the rank variables of another launcher (Open MPI, PMI, Slurm, Kubernetes
 * indexed jobs) plus `LIFELINE_COORDINATOR`. `init(options)` accepts the same fields.
 *
 * @example
 * const place = resolveRankPlace({}, process.env); // throws MPI_INIT naming what is missing
 */
import { LifelineError } from "../errors.ts";

export type Mode = "cpr" | "retry-one" | "elastic" | "none";
export const MODES: readonly Mode[] = ["cpr", "retry-one", "elastic", "none"];

/** Names of the variables the launcher sets for each rank. */
export const ENV = {
  rank: "LIFELINE_RANK",
  size: "LIFELINE_SIZE",
  coordinator: "LIFELINE_COORDINATOR",
  job: "LIFELINE_JOB",
  mode: "LIFELINE_MODE",
  store: "LIFELINE_STORE",
  attempt: "LIFELINE_ATTEMPT",
  /** Fault injection for tests and drills, see faults.ts. */
  faults: "LIFELINE_FAULTS",
  /** "ipc" or "tcp": how the rank's data socket binds. */
  transport: "LIFELINE_TRANSPORT",
  /** A private directory for ipc endpoints. */
  runDir: "LIFELINE_RUN_DIR",
  /** File descriptor of a pipe from the launcher; its end means the launcher is gone. */
  watchFd: "LIFELINE_WATCH_FD",
  heartbeatMs: "LIFELINE_HEARTBEAT_MS",
  failureTimeoutMs: "LIFELINE_FAILURE_TIMEOUT_MS",
  /** retry-one: ring successors that keep a copy of each rank's state (`--replicas`). */
  replicas: "LIFELINE_REPLICAS",
  /** retry-one: bound on the sender log, in bytes (messages not yet covered by their receiver's checkpoint). */
  retryLogBytes: "LIFELINE_RETRY_LOG_BYTES",
  /** retry-one: every how many own checkpoints one goes to the store too (`--durable-every`; 0: none). */
  durableEvery: "LIFELINE_DURABLE_EVERY",
  /** tcp: the interface or address the rank's data socket binds and advertises (`--bind`). */
  bind: "LIFELINE_BIND",
  /** The rank's key file (keys.ts; docs/security.md): a path, or `-` for stdin. Never the keys themselves. */
  keys: "LIFELINE_KEYS",
  /** The longest message body, in bytes (`--max-message`). */
  maxMessageBytes: "LIFELINE_MAX_MESSAGE_BYTES",
  /** Bytes of unmatched messages a rank may hold (`--max-unexpected`). */
  maxUnexpectedBytes: "LIFELINE_MAX_UNEXPECTED_BYTES",
  /** `0`: no scavenges paced by the bytes received (`--no-gc-pacing`); `1` or unset: paced. */
  gcPacing: "LIFELINE_GC_PACING",
} as const;

/** The longest message body a rank sends or accepts, unless `--max-message` says otherwise. */
export const DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024 * 1024;
/** Bytes of unmatched messages (received, no receive posted yet) a rank holds before the job stops, unless `--max-unexpected` says otherwise. */
export const DEFAULT_MAX_UNEXPECTED_BYTES = 1024 * 1024 * 1024;

export interface InitOptions {
  rank?: number;
  size?: number;
  coordinator?: string;
  job?: string;
  mode?: Mode;
  store?: string;
  attempt?: number;
  transport?: "ipc" | "tcp";
  runDir?: string;
  faults?: string;
  /** tcp: interface or IPv4 address to bind (default the loopback address). */
  bind?: string;
  /** The key file (see {@link ENV}.keys). */
  keys?: string;
}

export interface RankPlace {
  rank: number;
  size: number;
  coordinator: string;
  job: string;
  mode: Mode;
  store: string;
  attempt: number;
  transport: "ipc" | "tcp";
  runDir: string | undefined;
  faults: string;
  watchFd: number | undefined;
  heartbeatMs: number;
  failureTimeoutMs: number;
  /** retry-one: ring successors holding each rank's state (default 2). */
  replicas?: number | undefined;
  /** retry-one: bound on the sender log in bytes (default 1 GiB). */
  retryLogBytes?: number | undefined;
  /** retry-one: every how many own checkpoints one is written to the store too (0: none). */
  durableEvery?: number | undefined;
  /** tcp: interface or IPv4 address the data socket binds and advertises; undefined: loopback. */
  bind?: string | undefined;
  /** The key file (`-`: stdin); undefined: none (no CURVE, no token). */
  keys?: string | undefined;
  /** The longest message body sent or accepted. */
  maxMessageBytes: number;
  /** Bytes of unmatched messages held before the job stops. */
  maxUnexpectedBytes: number;
  /** Scavenges paced by the bytes received (src/mpi/zmq/gc-pacing.ts; from the environment: on unless `0`). */
  gcPacing?: boolean | undefined;
  /**
   * Application payloads from this size on go on the transport's bulk connection (default
   * 2 MiB; not set from the environment: the simulator lowers it so that its programs'
   * messages take that path too).
   */
  bulkBytesMin?: number | undefined;
}

function intFrom(name: string, raw: string | undefined): number | undefined {
  if (raw === undefined || raw === "") return undefined;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 0) throw new LifelineError("MPI_INIT", `${name}=${JSON.stringify(raw)} is not a non-negative integer`);
  return n;
}

function flagFrom(name: string, raw: string | undefined): boolean | undefined {
  if (raw === undefined || raw === "") return undefined;
  if (raw === "0" || raw === "1") return raw === "1";
  throw new LifelineError("MPI_INIT", `${name}=${JSON.stringify(raw)} is not 0 or 1`);
}

function positive(name: string, raw: string | undefined): number | undefined {
  const n = intFrom(name, raw);
  if (n === 0) throw new LifelineError("MPI_INIT", `${name}=0: the limit must be at least 1 byte`);
  return n;
}

/** Resolves this process's place from explicit options first, then the environment. */
export function resolveRankPlace(opts: InitOptions, env: NodeJS.ProcessEnv): RankPlace {
  const rank =
    opts.rank ??
    intFrom(ENV.rank, env[ENV.rank]) ??
    intFrom("OMPI_COMM_WORLD_RANK", env.OMPI_COMM_WORLD_RANK) ??
    intFrom("PMI_RANK", env.PMI_RANK) ??
    intFrom("SLURM_PROCID", env.SLURM_PROCID) ??
    intFrom("JOB_COMPLETION_INDEX", env.JOB_COMPLETION_INDEX);
  const size =
    opts.size ??
    intFrom(ENV.size, env[ENV.size]) ??
    intFrom("OMPI_COMM_WORLD_SIZE", env.OMPI_COMM_WORLD_SIZE) ??
    intFrom("PMI_SIZE", env.PMI_SIZE) ??
    intFrom("SLURM_NTASKS", env.SLURM_NTASKS);
  const coordinator = opts.coordinator ?? env[ENV.coordinator];
  const missing: string[] = [];
  if (rank === undefined) missing.push(`${ENV.rank} (or OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID, JOB_COMPLETION_INDEX)`);
  if (size === undefined) missing.push(`${ENV.size} (or OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS)`);
  if (coordinator === undefined || coordinator === "") missing.push(ENV.coordinator);
  if (missing.length > 0) {
    throw new LifelineError(
      "MPI_INIT",
      `init() cannot find its place in a job: ${missing.join(", ")} not set. Start the program with \`lifeline run -n <ranks> <app>\`, or pass these fields to init().`,
    );
  }
  if (size! < 1) throw new LifelineError("MPI_INIT", `job size ${size} must be at least 1`);
  if (rank! >= size!) throw new LifelineError("MPI_INIT", `rank ${rank} is outside 0..${size! - 1}`);
  const mode = (opts.mode ?? env[ENV.mode] ?? "none") as Mode;
  if (!MODES.includes(mode)) throw new LifelineError("MPI_INIT", `mode ${JSON.stringify(mode)} is not one of ${MODES.join(", ")}`);
  const transport = (opts.transport ?? env[ENV.transport] ?? "tcp") as "ipc" | "tcp";
  if (transport !== "ipc" && transport !== "tcp") throw new LifelineError("MPI_INIT", `transport ${JSON.stringify(transport)} is not ipc or tcp`);
  return {
    rank: rank!,
    size: size!,
    coordinator: coordinator!,
    job: opts.job ?? env[ENV.job] ?? "job",
    mode,
    store: opts.store ?? env[ENV.store] ?? ".lifeline",
    attempt: opts.attempt ?? intFrom(ENV.attempt, env[ENV.attempt]) ?? 0,
    transport,
    runDir: opts.runDir ?? env[ENV.runDir],
    faults: opts.faults ?? env[ENV.faults] ?? "",
    watchFd: intFrom(ENV.watchFd, env[ENV.watchFd]),
    heartbeatMs: intFrom(ENV.heartbeatMs, env[ENV.heartbeatMs]) ?? 500,
    failureTimeoutMs: intFrom(ENV.failureTimeoutMs, env[ENV.failureTimeoutMs]) ?? 5000,
    replicas: intFrom(ENV.replicas, env[ENV.replicas]) ?? 2,
    retryLogBytes: intFrom(ENV.retryLogBytes, env[ENV.retryLogBytes]),
    durableEvery: intFrom(ENV.durableEvery, env[ENV.durableEvery]) ?? 0,
    bind: opts.bind ?? (env[ENV.bind] === "" ? undefined : env[ENV.bind]),
    keys: opts.keys ?? (env[ENV.keys] === "" ? undefined : env[ENV.keys]),
    maxMessageBytes: positive(ENV.maxMessageBytes, env[ENV.maxMessageBytes]) ?? DEFAULT_MAX_MESSAGE_BYTES,
    maxUnexpectedBytes: positive(ENV.maxUnexpectedBytes, env[ENV.maxUnexpectedBytes]) ?? DEFAULT_MAX_UNEXPECTED_BYTES,
    gcPacing: flagFrom(ENV.gcPacing, env[ENV.gcPacing]) ?? true,
  };
}
