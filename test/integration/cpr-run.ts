/**
 * Runs the built launcher (`node dist/cli.js run`) for the cpr integration tests: --json
 * events on stderr (the caller may watch them), --results read back. Every run has a
 * deadline; the child is SIGTERMed past it (the launcher takes its ranks down with it).
 */
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll } from "vitest";
import { RANK_MALLOC_TUNABLES } from "../../src/launch/rank-process.ts";
import { onJsonLines } from "../../src/testing/json-lines.ts";

export const ROOT = fileURLToPath(new URL("../..", import.meta.url));
export const CLI = join(ROOT, "dist", "cli.js");

/**
 * A temporary directory for one test file's runs (stores, results): made before its tests —
 * which need the built launcher, so that is checked first — and removed after them. Read
 * `path` inside tests and hooks.
 */
export function runDirFor(prefix: string): { readonly path: string } {
  let path: string | undefined;
  beforeAll(async () => {
    if (!existsSync(CLI)) throw new Error(`${CLI} is missing: run \`npm run build\` first`);
    path = await mkdtemp(join(tmpdir(), prefix));
  });
  afterAll(async () => {
    if (path !== undefined) await rm(path, { recursive: true, force: true });
  });
  return {
    get path(): string {
      if (path === undefined) throw new Error("runDirFor: the directory exists only inside tests and hooks");
      return path;
    },
  };
}

export interface RunOutcome {
  code: number | null;
  stdout: string;
  stderr: string;
  doc:
    | {
        ranks: unknown[];
        restarts: number;
        error?: { code: string; message: string };
        recovery?: { linesCommitted: number[]; rollbacks: { attempt: number; epoch: number }[] };
      }
    | undefined;
}

export interface RunSpec {
  readonly np: number;
  /** Program path relative to the repository root. */
  readonly program: string;
  readonly flags: readonly string[];
  readonly args?: readonly string[];
  /** Working directory for stores and results. */
  readonly dir: string;
  readonly name: string;
  readonly timeoutMs: number;
  /** Sees every --json event line (parsed). */
  readonly onEvent?: (ev: Record<string, unknown>) => void;
  /** Without --json (human progress output on stderr). */
  readonly human?: boolean;
  /** The launcher process's pid, once it is started. */
  readonly onSpawn?: (pid: number) => void;
  /** Variables added to the launcher's environment (the ranks inherit them). */
  readonly env?: NodeJS.ProcessEnv;
}

export async function runLauncher(spec: RunSpec): Promise<RunOutcome> {
  const results = join(spec.dir, `${spec.name}.json`);
  const argv = [
    CLI,
    "run",
    "-n",
    String(spec.np),
    ...(spec.human === true ? [] : ["--json"]),
    "--store",
    join(spec.dir, `${spec.name}.store`),
    "--results",
    results,
    ...spec.flags,
    spec.program,
    ...(spec.args ?? []),
  ];
  const child = spawn(process.execPath, argv, {
    cwd: ROOT,
    stdio: ["ignore", "pipe", "pipe"],
    ...(spec.env === undefined ? {} : { env: { ...process.env, ...spec.env } }),
  });
  if (child.pid !== undefined) spec.onSpawn?.(child.pid);
  let stdout = "";
  let stderr = "";
  child.stdout.setEncoding("utf8").on("data", (chunk: string) => {
    stdout += chunk;
  });
  child.stderr.setEncoding("utf8").on("data", (chunk: string) => {
    stderr += chunk;
  });
  if (spec.onEvent !== undefined) onJsonLines(child.stderr, spec.onEvent);
  const timer = setTimeout(() => child.kill("SIGTERM"), spec.timeoutMs);
  const code = await new Promise<number | null>((resolve, reject) => {
    child.on("error", reject);
    child.on("close", (c) => resolve(c));
  });
  clearTimeout(timer);
  const doc = existsSync(results) ? (JSON.parse(await readFile(results, "utf8")) as RunOutcome["doc"]) : undefined;
  return { code, stdout, stderr, doc };
}

/** A launcher run watched through its --json events (see {@link watchRun}). */
export interface WatchedRun {
  code: number | null;
  events: Record<string, unknown>[];
  stderr: string;
  doc: RunOutcome["doc"];
}

/**
 * Watches a launcher that `child` runs with `--json` (its stderr a pipe) and `--results
 * results`: each event goes to `onEvent` as it comes, and the child is SIGKILLed past
 * `timeoutMs`. Resolves at its exit with the events, its stderr and the results document.
 */
export function watchRun(child: ChildProcess, results: string, timeoutMs: number, onEvent?: (ev: Record<string, unknown>) => void): Promise<WatchedRun> {
  const events: Record<string, unknown>[] = [];
  let stderr = "";
  child.stderr!.setEncoding("utf8").on("data", (chunk: string) => {
    stderr += chunk;
  });
  onJsonLines(child.stderr!, (ev) => {
    events.push(ev);
    onEvent?.(ev);
  });
  const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
  return new Promise((resolve) => {
    child.on("exit", (code) => {
      clearTimeout(timer);
      const doc = existsSync(results) ? (JSON.parse(readFileSync(results, "utf8")) as WatchedRun["doc"]) : undefined;
      resolve({ code, events, stderr, doc });
    });
  });
}

/** Each rank's host by its `rank-spawned` events (of attempt `attempt`, if given). */
export const spawnedOn = (r: WatchedRun, attempt?: number): Record<number, string> =>
  Object.fromEntries(
    r.events.filter((e) => e.event === "rank-spawned" && (attempt === undefined || e.attempt === attempt)).map((e) => [e.rank as number, e.host as string]),
  );

/**
 * What test/fixtures/launch/ok.ts's ranks printed of their GLIBC_TUNABLES (on stderr: output
 * events), sorted, and what they print when they got the launcher's tunables once, before the
 * ones this process's environment gives.
 */
export function tunablesPrinted(events: readonly Record<string, unknown>[], np: number): { printed: string[]; launchers: string[] } {
  const own = process.env.GLIBC_TUNABLES === undefined || process.env.GLIBC_TUNABLES === "" ? "" : `:${process.env.GLIBC_TUNABLES}`;
  return {
    printed: events
      .filter((e) => e.event === "output" && / malloc: /.test(e.line as string))
      .map((e) => e.line as string)
      .sort(),
    launchers: Array.from({ length: np }, (_, rank) => `rank ${rank} malloc: ${RANK_MALLOC_TUNABLES}${own}`),
  };
}

/** The tail of a run's stderr without step events, for assertion messages. */
export const context = (o: { code: number | null; stderr: string }): string =>
  `exit ${o.code}\n${o.stderr
    .split("\n")
    .filter((l) => !l.includes('"rank-step"'))
    .slice(-40)
    .join("\n")}`;
