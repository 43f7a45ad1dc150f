/**
 * How the supervisor starts a rank and reaches it afterwards, behind one interface
 * ({@link RankLauncher}), one implementation per `--launcher`:
 *
 * - `local`: a child process of the launcher on this host (src/launch/rank-process.ts
 *   `spawnRank`), signalled as a process group, watched through its pipe.
 * - `rsh`: on a host of the hostfile through a remote-shell agent, `AGENT HOST CMDLINE` as ssh
 *   takes it; signalled through the agent (`AGENT HOST 'kill -s SIG PID'`).
 * - `slurm`: as a job step of its own inside the allocation the launcher runs in
 *   (src/launch/slurm.ts), through `srun`; signalled through the controller
 *   (`scancel --ctld --signal=SIG JOB.STEP`).
 *
 * The remote kinds run the same shell line on the host (it prints the rank's pid and what the
 * signal needs, then execs node; see `spawnRemoteRank`), and their signal helpers never hold
 * the launcher up: they run detached and are killed after a few seconds, since a helper that
 * talks to a dead host may hang. Where the hosts come from is {@link launcherHosts}'s part; the
 * supervisor places ranks on them (src/launch/hosts.ts `Placement`).
 *
 * @example
 * const launcher = rankLauncherFor(config);                    // from --launcher, --rsh, the allocation
 * const proc = await launcher.start(spec, "node2", sink);      // a RankProcess, as for a local rank
 */
import { LifelineError } from "../errors.ts";
import type { HostSlots, LauncherKind } from "./hosts.ts";
import { runBounded, spawnRank, spawnRemoteRank, type RankOutputSink, type RankProcess, type RankSpawnSpec, type RemoteSite } from "./rank-process.ts";
import { scancelCommand, SLURM_STEP_WORDS, srunCommand, stepIdOf } from "./slurm.ts";

export { launcherHosts, LAUNCHERS, type LauncherKind } from "./hosts.ts";

/**
 * How long srun may outlive a SIGKILL sent to its step before it is killed itself: on a live
 * node it reports the step's end within tens of milliseconds; on a dead one it never does, and
 * the rank's replacement waits this long.
 */
const SRUN_GRACE_MS = 1_000;

/** Starts ranks on their hosts; what it starts can be signalled through the {@link RankProcess}. */
export interface RankLauncher {
  readonly kind: LauncherKind;
  /** The hosts ranks may run on, with their slots; undefined: this host alone. */
  readonly hosts: readonly HostSlots[] | undefined;
  /**
   * Starts the rank of `spec` on `host` (undefined for this host). Resolves once its process
   * (or the helper that runs it there) has started; rejects with `LAUNCH_SPAWN` otherwise.
   */
  start(spec: RankSpawnSpec, host: string | undefined, sink: RankOutputSink): Promise<RankProcess>;
}

/** What {@link rankLauncherFor} needs of the run configuration. */
export interface LauncherConfig {
  readonly launcher?: LauncherKind | undefined;
  readonly hosts: readonly HostSlots[] | undefined;
  readonly rsh: readonly string[];
  readonly slurmJobId?: string | undefined;
}

/** The launcher of a run configuration (its hosts were resolved by {@link launcherHosts}). */
export function rankLauncherFor(config: LauncherConfig): RankLauncher {
  const kind = config.launcher ?? (config.hosts === undefined ? "local" : "rsh");
  switch (kind) {
    case "local":
      return new LocalRankLauncher();
    case "rsh":
      return new RshRankLauncher(config.rsh, requireHosts(config, kind));
    case "slurm":
      if (config.slurmJobId === undefined) throw new LifelineError("LAUNCH_USAGE", "--launcher slurm needs the job id of the allocation (SLURM_JOB_ID)");
      return new SlurmRankLauncher(config.slurmJobId, requireHosts(config, kind));
  }
}

function requireHosts(config: LauncherConfig, kind: LauncherKind): readonly HostSlots[] {
  if (config.hosts === undefined) throw new LifelineError("LAUNCH_USAGE", `--launcher ${kind} needs hosts to start ranks on`);
  return config.hosts;
}

/** Every rank a child of the launcher, on this host. */
export class LocalRankLauncher implements RankLauncher {
  readonly kind = "local";
  readonly hosts = undefined;

  start(spec: RankSpawnSpec, _host: string | undefined, sink: RankOutputSink): Promise<RankProcess> {
    return spawnRank(spec, sink);
  }
}

/** Ranks on the hosts of a hostfile, through a remote-shell agent (`--rsh`, default ssh). */
export class RshRankLauncher implements RankLauncher {
  readonly kind = "rsh";

  constructor(
    private readonly agent: readonly string[],
    readonly hosts: readonly HostSlots[],
  ) {}

  start(spec: RankSpawnSpec, host: string | undefined, sink: RankOutputSink): Promise<RankProcess> {
    return host === undefined ? noHost(this.kind) : spawnRemoteRank(spec, this.site(host), sink);
  }

  private site(host: string): RemoteSite {
    const agent = this.agent;
    return {
      host,
      command: (line) => [...agent, host, line],
      idWords: "",
      failed: (err) => `the remote-shell agent ${JSON.stringify(agent.join(" "))} failed: ${err.message} (see --rsh)`,
      signal: (pid, _id, sig) => runBounded([...agent, host, `kill -s ${sig.replace(/^SIG/, "")} ${pid}`]),
    };
  }
}

/** Ranks as job steps of the Slurm allocation the launcher runs in, one step each. */
export class SlurmRankLauncher implements RankLauncher {
  readonly kind = "slurm";

  constructor(
    readonly jobId: string,
    readonly hosts: readonly HostSlots[],
  ) {}

  start(spec: RankSpawnSpec, host: string | undefined, sink: RankOutputSink): Promise<RankProcess> {
    return host === undefined ? noHost(this.kind) : spawnRemoteRank(spec, this.site(host), sink);
  }

  private site(host: string): RemoteSite {
    return {
      host,
      command: (line, rank) => srunCommand({ jobId: this.jobId, host, rank, line }),
      // The step inherits srun's environment: the rank's own variables travel in the shell
      // line, and none of the launcher's (LIFELINE_WATCH_FD names a pipe the step lacks).
      env: (rankEnv) => Object.fromEntries(Object.entries(rankEnv).filter(([k]) => !k.startsWith("LIFELINE_"))),
      idWords: SLURM_STEP_WORDS,
      failed: (err) => `srun failed: ${err.message} (--launcher slurm needs Slurm's srun on PATH)`,
      helperGraceMs: SRUN_GRACE_MS,
      signal: (_pid, id, sig) => {
        const step = stepIdOf(id);
        if (step !== undefined) runBounded(scancelCommand(step, sig));
      },
    };
  }
}

function noHost(kind: LauncherKind): Promise<never> {
  return Promise.reject(new LifelineError("LAUNCH_SPAWN", `--launcher ${kind} starts a rank on a named host, and none was given`));
}
