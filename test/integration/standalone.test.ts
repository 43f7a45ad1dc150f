/**
 * Goal: `lifeline coordinator` runs a job whose ranks another engine starts — each with its
 * engine's rank variables (Kubernetes' JOB_COMPLETION_INDEX, Open MPI's OMPI_COMM_WORLD_*) and
 * LIFELINE_COORDINATOR — with results equal to `lifeline run`'s; a failed rank stops the job
 * (exit 1, every other rank aborted) for the engine to run it again, and in cpr that next run
 * resumes from the newest line, bit-identical; a rank started for another mode is refused.
 * Its links use the keys of `lifeline keys` (the ranks read ranks.key through LIFELINE_KEYS);
 * a rank without them is refused at once with a clear error; `--insecure` runs without keys.
 *
 * Method: the built CLI as the coordinator (`--json`, port 0, the endpoint read from its
 * `job-starting` event), rank processes started by the test as an engine would (no
 * LIFELINE_RANK, no launcher pipe), heartbeat 100 ms / failure timeout 1 s. References are
 * `lifeline run --mode none` runs.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { rankCommand } from "../../src/launch/rank-process.ts";
import { makeJobKeys, writeKeyDir } from "../../src/mpi/keys.ts";
import { CLI, ROOT, runDirFor, runLauncher } from "./cpr-run.ts";

const TIMEOUT_MS = 60_000;
const runs = runDirFor("lifeline-standalone-");
const HEAT = ["examples/heat.ts", "--rows", "96", "--cols", "96", "--iters", "2500", "--tol", "0"];
const FAST = { LIFELINE_HEARTBEAT_MS: "100", LIFELINE_FAILURE_TIMEOUT_MS: "1000" };
const children: ChildProcess[] = [];
afterEach(() => {
  for (const c of children.splice(0)) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
});

interface Proc {
  child: ChildProcess;
  output: () => string;
  exited: Promise<number | null>;
}

function start(command: string, args: readonly string[], env: NodeJS.ProcessEnv, onLine?: (line: string) => void): Proc {
  const child = spawn(command, args, { cwd: ROOT, env, stdio: ["ignore", "pipe", "pipe"] });
  children.push(child);
  let out = "";
  let partial = "";
  const take = (c: string): void => {
    out += c;
    partial += c;
    const lines = partial.split("\n");
    partial = lines.pop()!;
    for (const l of lines) onLine?.(l);
  };
  child.stdout.setEncoding("utf8").on("data", take);
  child.stderr.setEncoding("utf8").on("data", take);
  return { child, output: () => out, exited: new Promise((resolve) => child.on("exit", (code) => resolve(code))) };
}

/** The job `name`'s key directory, made by the first call (as a batch script would). */
function keysOf(name: string): string {
  const dir = join(runs.path, `${name}.keys`);
  if (!existsSync(join(dir, "ranks.key"))) writeKeyDir(dir, makeJobKeys({ curve: true }));
  return dir;
}

/** The coordinator (with the job `name`'s keys unless `--insecure` is among `flags`); resolves its endpoint once it listens. */
async function coordinator(
  name: string,
  flags: readonly string[],
  onEvent?: (ev: Record<string, unknown>) => void,
): Promise<{ proc: Proc; endpoint: string; results: string }> {
  const results = join(runs.path, `${name}.json`);
  const keys = flags.includes("--insecure") ? [] : ["--keys", keysOf(name)];
  let resolveEndpoint!: (e: string) => void;
  const endpoint = new Promise<string>((resolve) => (resolveEndpoint = resolve));
  const proc = start(
    process.execPath,
    [
      CLI,
      "coordinator",
      "-n",
      "3",
      "--json",
      "--heartbeat",
      "100",
      "--failure-timeout",
      "1s",
      "--results",
      results,
      "--store",
      join(runs.path, `${name}.store`),
      ...keys,
      ...flags,
      ...HEAT,
    ],
    process.env,
    (line) => {
      if (!line.startsWith("{")) return;
      const ev = JSON.parse(line) as Record<string, unknown>;
      if (ev.event === "job-starting") resolveEndpoint(ev.coordinator as string);
      onEvent?.(ev);
    },
  );
  const ep = await Promise.race([
    endpoint,
    proc.exited.then((code) => {
      throw new Error(`the coordinator exited with ${code}:\n${proc.output()}`);
    }),
  ]);
  return { proc, endpoint: ep, results };
}

/** Rank `rank` of 3, started as an engine would: its rank variables, the coordinator's address and (given `keys`, a job's name) the ranks' key file. */
function rank(rank: number, endpoint: string, extra: NodeJS.ProcessEnv = {}, keys?: string): Proc {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith("LIFELINE_") && !k.startsWith("OMPI_")) env[k] = v;
  // Rank 0 and 1 as a Kubernetes Indexed Job starts them, rank 2 as mpirun does.
  Object.assign(env, rank < 2 ? { JOB_COMPLETION_INDEX: String(rank), LIFELINE_SIZE: "3" } : { OMPI_COMM_WORLD_RANK: String(rank), OMPI_COMM_WORLD_SIZE: "3" });
  Object.assign(env, { LIFELINE_COORDINATOR: endpoint, ...FAST, ...extra });
  if (keys !== undefined) env.LIFELINE_KEYS = join(keysOf(keys), "ranks.key");
  const { command, args } = rankCommand(join(ROOT, HEAT[0]!), HEAT.slice(1));
  return start(command, args, env);
}

const doc = (path: string): { ranks: unknown[]; run?: number; error?: { code: string; message: string } } => JSON.parse(readFileSync(path, "utf8"));

describe("lifeline coordinator, with ranks another engine starts", () => {
  it(
    "mode none: the job runs to the end; results equal lifeline run's",
    async () => {
      const ref = await runLauncher({
        np: 3,
        program: HEAT[0]!,
        args: HEAT.slice(1),
        flags: ["--mode", "none"],
        dir: runs.path,
        name: "ref",
        timeoutMs: TIMEOUT_MS,
      });
      expect(ref.code, ref.stderr).toBe(0);
      const c = await coordinator("none", ["--mode", "none"]);
      expect(c.endpoint).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+$/);
      const ranks = [0, 1, 2].map((r) => rank(r, c.endpoint, {}, "none"));
      expect(await c.proc.exited, c.proc.output()).toBe(0);
      for (const r of ranks) expect(await r.exited, r.output()).toBe(0);
      expect(doc(c.results).ranks).toEqual(ref.doc!.ranks);
    },
    TIMEOUT_MS,
  );

  it(
    "cpr: a rank killed stops the job (exit 1, the others aborted); the same commands again resume from the newest line, bit-identical",
    async () => {
      const ref = await runLauncher({
        np: 3,
        program: HEAT[0]!,
        args: HEAT.slice(1),
        flags: ["--mode", "none"],
        dir: runs.path,
        name: "ref2",
        timeoutMs: TIMEOUT_MS,
      });
      const store = join(runs.path, "cpr.store");
      const cprEnv = { LIFELINE_MODE: "cpr", LIFELINE_STORE: store };
      let lines = 0;
      let victim: Proc | undefined; // eslint-disable-line prefer-const -- set by the callback below
      const first = await coordinator("cpr", ["--mode", "cpr", "--checkpoint-every", "100ms"], (ev) => {
        if (ev.event === "line-committed" && ++lines === 2) victim!.child.kill("SIGKILL");
      });
      const ranks = [0, 1, 2].map((r) => rank(r, first.endpoint, cprEnv, "cpr"));
      victim = ranks[1];
      expect(await first.proc.exited, first.proc.output()).toBe(1);
      expect(doc(first.results).error).toMatchObject({ code: "LAUNCH_HEARTBEAT", message: expect.stringMatching(/^rank 1 sent no heartbeat/) });
      for (const r of [ranks[0]!, ranks[2]!]) expect(await r.exited).not.toBe(0);

      // The engine runs the job again: the coordinator with the same command, and the ranks.
      const events: Record<string, unknown>[] = [];
      const again = await coordinator("cpr", ["--mode", "cpr", "--checkpoint-every", "100ms"], (ev) => events.push(ev));
      const ranks2 = [0, 1, 2].map((r) => rank(r, again.endpoint, cprEnv, "cpr"));
      expect(await again.proc.exited, again.proc.output()).toBe(0);
      for (const r of ranks2) expect(await r.exited, r.output()).toBe(0);
      expect(events.find((e) => e.event === "job-resuming")).toMatchObject({ run: 2 });
      expect(doc(again.results)).toMatchObject({ ranks: ref.doc!.ranks, run: 2 });
    },
    2 * TIMEOUT_MS,
  );

  it(
    "a rank started for another mode is refused with a clear error; retry-one is refused at once",
    async () => {
      const c = await coordinator("mismatch", ["--mode", "cpr", "--rendezvous-timeout", "20s"]);
      const ranks = [0, 1, 2].map((r) =>
        rank(r, c.endpoint, r === 2 ? {} : { LIFELINE_MODE: "cpr", LIFELINE_STORE: join(runs.path, "mismatch.store") }, "mismatch"),
      );
      expect(await ranks[2]!.exited).not.toBe(0);
      expect(ranks[2]!.output()).toContain("the coordinator runs the job in mode cpr, but this rank was started for mode none: set LIFELINE_MODE=cpr");
      c.proc.child.kill("SIGTERM");
      await c.proc.exited;
      const retry = start(process.execPath, [CLI, "coordinator", "-n", "2", "--mode", "retry-one", ...HEAT], process.env);
      expect(await retry.exited).toBe(2);
      expect(retry.output()).toContain("--mode retry-one restarts one rank into the running job, which only the launcher can do");
      expect(existsSync(join(runs.path, "mismatch.json"))).toBe(true);
    },
    TIMEOUT_MS,
  );

  it(
    "keys: a rank without the job's keys, or with another job's, is refused at once with a clear error; --insecure runs without them; no keys at all is a usage error",
    async () => {
      const c = await coordinator("keys", ["--mode", "none", "--rendezvous-timeout", "20s"]);
      const started = performance.now();
      const none = rank(0, c.endpoint);
      const other = rank(1, c.endpoint, {}, "another-job");
      expect(await none.exited).not.toBe(0);
      // The handshake's failure shows as a mechanism mismatch or as closes, whichever comes first.
      expect(none.output()).toMatch(
        /refused this rank's connection \((one side uses CURVE, the other does not|it closed the connection during the handshake, three times)\): it wants the job's keys; set LIFELINE_KEYS/,
      );
      expect(await other.exited).not.toBe(0);
      expect(other.output()).toMatch(
        /refused this rank's connection \(it closed the connection during the handshake, three times\): LIFELINE_KEYS names keys of another job/,
      );
      for (const r of [none, other]) expect(r.output()).toContain("code: 'MPI_INIT'");
      expect(performance.now() - started).toBeLessThan(10_000); // not the rendezvous timeout
      c.proc.child.kill("SIGTERM");
      await c.proc.exited;
      expect(c.proc.output()).toMatch(/refused a connection with a wrong CURVE key on the control socket/);
      // (The plain rank's refusal is reported too, unless its own side closed first: libzmq
      // then reports a disconnect, not the mismatch. test/integration/security.test.ts retries.)
      expect(c.proc.output()).not.toMatch(/"r[01]\.0\/[0-9a-f]/); // no token in any line

      const open = await coordinator("insecure", ["--mode", "none", "--insecure"]);
      const ranks = [0, 1, 2].map((r) => rank(r, open.endpoint));
      expect(await open.proc.exited, open.proc.output()).toBe(0);
      for (const r of ranks) expect(await r.exited).toBe(0);
      expect(open.proc.output()).toContain("--insecure: the job's tcp links are neither authenticated nor encrypted");

      const bare = start(process.execPath, [CLI, "coordinator", "-n", "2", "--mode", "none", ...HEAT], process.env);
      expect(await bare.exited).toBe(2);
      expect(bare.output()).toContain("lifeline coordinator needs the job's keys: make them with `lifeline keys DIR`");
    },
    TIMEOUT_MS,
  );
});
