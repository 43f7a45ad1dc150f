/**
 * Start-up: a whole `lifeline run -n 4 --mode none` of examples/heat.ts (50 sweeps) as `.ts`
 * (the launcher compiles it once per job: src/launch/compile-cache.ts) next to the same program
 * compiled to `.js` by hand beforehand, wall time from spawning the launcher to its exit,
 * variants alternating. The first `.ts` run starts with no compiled file (cold); the others
 * find it (warm). Target: `.ts` (warm) ≤ 1.3x `.js`.
 *
 * @example
 * const r = await startupRuns({ root, runs: 5, np: 4 });
 * console.log(renderStartupTable(r));
 */
import { spawn } from "node:child_process";
import { copyFileSync, mkdtempSync, rmSync } from "node:fs";
import path from "node:path";

export const STARTUP_TARGET = 1.3;

export interface StartupResult {
  readonly np: number;
  readonly program: string;
  /** Wall seconds of each run, by variant. */
  readonly runs: { readonly ts: number[]; readonly tsCold: number[]; readonly js: number[] };
  readonly errors: string[];
}

const ARGS = ["--iters", "50"];

function jobSeconds(root: string, np: number, app: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const child = spawn(process.execPath, [path.join(root, "dist", "cli.js"), "run", "-n", String(np), "--mode", "none", "--quiet", app, ...ARGS], {
      cwd: root,
      stdio: ["ignore", "ignore", "pipe"],
    });
    let err = "";
    child.stderr.on("data", (d: Buffer) => (err = (err + d.toString()).slice(-2000)));
    child.on("error", reject);
    child.on("exit", (code) => (code === 0 ? resolve((performance.now() - t0) / 1000) : reject(new Error(`${app}: exit ${code}\n${err}`))));
  });
}

export async function startupRuns(opts: { root: string; runs: number; np: number; progress: (line: string) => void }): Promise<StartupResult> {
  const source = path.join(opts.root, "examples", "heat.ts");
  // A private copy of the program (it imports only packages), inside the package so that
  // `lifeline` resolves as from the source: its compiled form goes to a cache directory of its
  // own, which starts empty (the cold run). Emptying examples/.lifeline-cache instead would
  // pull the compiled program from under any job running an example meanwhile (a test, or the
  // user's own run).
  const dir = mkdtempSync(path.join(opts.root, "examples", ".bench-startup-"));
  const program = path.join(dir, "heat.ts");
  const js = path.join(dir, "heat.mjs");
  const result: StartupResult = { np: opts.np, program: "examples/heat.ts", runs: { ts: [], tsCold: [], js: [] }, errors: [] };
  try {
    copyFileSync(source, program);
    const esbuild = await import("esbuild");
    // The same program as plain JavaScript, compiled once here (its own modules bundled, its
    // packages imported).
    await esbuild.build({ entryPoints: [program], bundle: true, packages: "external", format: "esm", platform: "node", outfile: js, logLevel: "silent" });
    for (let k = 0; k < opts.runs; k++) {
      for (const variant of k % 2 === 0 ? (["ts", "js"] as const) : (["js", "ts"] as const)) {
        try {
          const s = await jobSeconds(opts.root, opts.np, variant === "ts" ? program : js);
          if (variant === "js") result.runs.js.push(s);
          else if (result.runs.tsCold.length === 0) result.runs.tsCold.push(s);
          else result.runs.ts.push(s);
          opts.progress(`  ${variant === "js" ? ".js" : ".ts"} run ${k + 1}: ${s.toFixed(3)} s`);
        } catch (err) {
          result.errors.push(`${variant} run ${k + 1}: ${(err as Error).message}`);
        }
      }
    }
    // One more warm .ts run: the cold one does not count among them.
    try {
      result.runs.ts.push(await jobSeconds(opts.root, opts.np, program));
    } catch (err) {
      result.errors.push(`ts run: ${(err as Error).message}`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  return result;
}

const median = (xs: readonly number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.floor((s.length - 1) / 2)]!;
};

export function startupRatio(r: StartupResult): number {
  return median(r.runs.ts) / median(r.runs.js);
}

export function renderStartupTable(r: StartupResult): string {
  const js = median(r.runs.js);
  const row = (label: string, xs: readonly number[]): string => `| ${label} | ${xs.length} | ${median(xs).toFixed(3)} | ${(median(xs) / js).toFixed(2)}x |`;
  const ratio = startupRatio(r);
  return [
    `### Start-up: lifeline run -n ${r.np} --mode none ${r.program} ${ARGS.join(" ")}, whole job (median; seconds)`,
    "",
    "| program | runs | wall s | / .js |",
    "| --- | ---: | ---: | ---: |",
    row(".js (compiled beforehand)", r.runs.js),
    row(".ts (compiled once per job, cache warm)", r.runs.ts),
    row(".ts (first run, cache cold)", r.runs.tsCold),
    "",
    `Target (.ts warm / .js) <= ${STARTUP_TARGET}x: ${ratio <= STARTUP_TARGET ? "met" : "NOT met"} (${ratio.toFixed(2)}x).`,
    "",
  ].join("\n");
}
