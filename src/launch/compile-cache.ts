/**
 * TypeScript programs without a loader in every rank: the launcher compiles the program's own
 * modules (not its packages) once per job with esbuild into one ES module, and the ranks run
 * that with plain `node --enable-source-maps` — instead of each rank loading the tsx loader
 * and compiling the same files again (about 0.2 s of CPU per rank on this kind of machine).
 *
 * What the program sees stays as if it ran from its sources:
 * - the module lives in `.lifeline-cache/` next to the program, so its packages resolve from
 *   the same node_modules (and a package's own name from inside it, as in our examples);
 * - `import.meta.url`, `import.meta.filename` and `import.meta.dirname` are replaced, in each
 *   of the program's modules, by that module's own source location, so files read relative
 *   to a module are found where they were;
 * - an inline source map names the original files, so stack traces show `.ts` files and lines.
 * The file name carries a hash of its contents: a re-run of unchanged sources reuses it, an
 * edit makes a new one. Anything the compiler refuses falls back to the tsx loader (the
 * caller warns); so do ranks on other hosts, which may not see this file.
 *
 * Old versions do not pile up: a compiled file's modification time says when a launcher last
 * used it. Each compile sets its own file's, a running launcher sets it again every hour
 * ({@link keepInUse}: its restarts start ranks from that file), and each compile deletes the
 * compiled files in the same directory that no launcher has used for a day.
 *
 * @example
 * const c = await compileApp("examples/heat.ts");
 * // → { app: "/…/examples/.lifeline-cache/heat-3f9c….mjs", cached: false }
 */
import { createHash, randomBytes } from "node:crypto";
import { mkdir, readdir, readFile, rename, stat, unlink, utimes, writeFile } from "node:fs/promises";
import { basename, dirname, extname, join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { LifelineError, errorMessage } from "../errors.ts";

/** The directory, next to the program, that holds its compiled forms. */
export const CACHE_DIR = ".lifeline-cache";
/** A compiled file that no launcher has used for this long is deleted by the next compile in its directory. */
export const STALE_COMPILED_MS = 24 * 60 * 60 * 1000;
/** How often a running launcher marks its compiled file as in use ({@link keepInUse}). */
export const IN_USE_REFRESH_MS = 60 * 60 * 1000;
/** A compiled file's name (`<name>-<16 hex digits>.mjs`), or a writer's temporary one beside it. */
const COMPILED_NAME_RE = /-[0-9a-f]{16}\.mjs(\.tmp-[0-9a-f]{8})?$/;

export interface CompiledApp {
  /** The module the ranks run. */
  readonly app: string;
  /** It was there already (same sources, same compiler). */
  readonly cached: boolean;
}

const IMPORT_META_RE = /\bimport\.meta\.(url|filename|dirname)\b/g;

/**
 * Compiles `app` (a `.ts` or `.mts` file) and its local imports into one cached ES module.
 * Rejects with `LAUNCH_SPAWN` saying why if it cannot (a syntax error, an unwritable
 * directory): the caller then runs the program through the tsx loader.
 */
export async function compileApp(app: string): Promise<CompiledApp> {
  const entry = resolve(app);
  const outDir = join(dirname(entry), CACHE_DIR);
  if (extname(entry) === ".ts" && !(await isModuleScope(dirname(entry)))) {
    // A .ts file outside "type": "module" is CommonJS to the loader; the bundle is ESM.
    throw new LifelineError("LAUNCH_SPAWN", `cannot compile ${app} as an ES module: its package.json does not say "type": "module"`);
  }
  let code: Uint8Array;
  try {
    const esbuild = await import("esbuild");
    const result = await esbuild.build({
      entryPoints: [entry],
      bundle: true,
      packages: "external",
      format: "esm",
      platform: "node",
      target: `node${process.versions.node.split(".")[0]}`,
      sourcemap: "inline",
      write: false,
      outdir: outDir,
      outExtension: { ".js": ".mjs" },
      logLevel: "silent",
      plugins: [
        {
          name: "lifeline-import-meta",
          setup(build) {
            // Each module keeps its own location (a bundle would otherwise give them all its own).
            build.onLoad({ filter: /\.[cm]?[jt]sx?$/ }, async (args) => {
              if (args.path.includes(`${"/"}node_modules${"/"}`)) return undefined;
              const text = await readFile(args.path, "utf8");
              const url = pathToFileURL(args.path).href;
              const contents = text.replace(IMPORT_META_RE, (_all, what: string) =>
                JSON.stringify(what === "url" ? url : what === "filename" ? args.path : dirname(args.path)),
              );
              const ext = extname(args.path);
              const loader = ext === ".tsx" ? "tsx" : ext === ".jsx" ? "jsx" : ext.endsWith("ts") ? "ts" : "js";
              return { contents, loader };
            });
          },
        },
      ],
    });
    // An import or require the bundler cannot follow (a computed path) would fail at run time
    // from the cache directory: such a program runs through the loader instead.
    const unfollowed = result.warnings.find((w) => /import|require/i.test(w.text) && /cannot|not|unsupported/i.test(w.text));
    if (unfollowed !== undefined) throw Object.assign(new Error("unfollowed import"), { errors: [unfollowed] });
    const out = result.outputFiles[0];
    if (out === undefined) throw new Error("esbuild produced no output");
    code = out.contents;
  } catch (err) {
    throw new LifelineError("LAUNCH_SPAWN", `cannot compile ${app}: ${describeBuildError(err)}`, { cause: err });
  }
  const hash = createHash("sha256").update(code).digest("hex").slice(0, 16);
  const target = join(outDir, `${basename(entry, extname(entry))}-${hash}.mjs`);
  // Reused if it is there: marking it in use first (which fails if it is not) keeps another
  // launcher's compile in this directory from deleting it as stale from now on. One this user
  // may not mark (another's, read-only) is reused all the same.
  if ((await markInUse(target)) || (await exists(target))) {
    await pruneStale(outDir, target);
    return { app: target, cached: true };
  }
  try {
    await mkdir(outDir, { recursive: true });
    // Keeps the directory out of the user's git status without touching their .gitignore.
    await writeFile(join(outDir, ".gitignore"), "*\n", { flag: "wx" }).catch(() => undefined);
    // Written under a temporary name and renamed: a launcher running the same program at the
    // same time sees the whole file or none.
    const tmp = `${target}.tmp-${randomBytes(4).toString("hex")}`;
    await writeFile(tmp, code);
    await rename(tmp, target);
  } catch (err) {
    throw new LifelineError("LAUNCH_SPAWN", `cannot write the compiled program to ${outDir}: ${errorMessage(err)}`, { cause: err });
  }
  await pruneStale(outDir, target);
  return { app: target, cached: false };
}

/**
 * Marks a compiled file as in use every {@link IN_USE_REFRESH_MS} until the returned function
 * is called, so that no compile in the same directory deletes it while the job may still start
 * ranks from it. Keeps no process alive.
 */
export function keepInUse(app: string, everyMs: number = IN_USE_REFRESH_MS): () => void {
  const timer = setInterval(() => void markInUse(app), everyMs);
  timer.unref();
  return () => clearInterval(timer);
}

async function exists(path: string): Promise<boolean> {
  try {
    await stat(path);
    return true;
  } catch {
    return false;
  }
}

/** Sets the file's times to now; false if it is not there (or cannot be changed). */
async function markInUse(path: string): Promise<boolean> {
  const now = new Date();
  try {
    await utimes(path, now, now);
    return true;
  } catch {
    return false;
  }
}

/**
 * Deletes the compiled files (and writers' leftover temporary files) in `dir`, other than
 * `keep`, that no launcher has used for {@link STALE_COMPILED_MS}. Never fails: a file another
 * launcher deletes first, or one this user may not delete, is left alone.
 */
async function pruneStale(dir: string, keep: string): Promise<void> {
  let names: string[];
  try {
    names = await readdir(dir);
  } catch {
    return;
  }
  const before = Date.now() - STALE_COMPILED_MS;
  await Promise.all(
    names
      .filter((n) => COMPILED_NAME_RE.test(n))
      .map(async (n) => {
        const path = join(dir, n);
        if (path === keep) return;
        try {
          if ((await stat(path)).mtimeMs < before) await unlink(path);
        } catch {
          // gone already, or not ours to delete
        }
      }),
  );
}

/** esbuild's first error as `file:line:column: text`, else the error's first line. */
function describeBuildError(err: unknown): string {
  const first = (err as { errors?: { text: string; location?: { file: string; line: number; column: number } | null }[] }).errors?.[0];
  if (first !== undefined)
    return first.location === undefined || first.location === null
      ? first.text
      : `${first.location.file}:${first.location.line}:${first.location.column}: ${first.text}`;
  const line =
    errorMessage(err)
      .split("\n")
      .find((l) => l.trim() !== "") ?? errorMessage(err);
  return line.length > 300 ? `${line.slice(0, 300)}…` : line;
}

/** The nearest package.json above `dir` says `"type": "module"`. */
async function isModuleScope(dir: string): Promise<boolean> {
  for (let d = dir; ; d = dirname(d)) {
    try {
      const pkg = JSON.parse(await readFile(join(d, "package.json"), "utf8")) as { type?: unknown };
      return pkg.type === "module";
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "ENOENT") return false;
    }
    if (dirname(d) === d) return false;
  }
}
