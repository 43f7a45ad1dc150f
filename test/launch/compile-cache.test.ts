/**
 * A .ts program compiled once for the job (src/launch/compile-cache.ts) must behave as if it
 * ran from its sources: local imports (`./x.ts` and the `./x.js` spelling), files read
 * relative to `import.meta.url`, stack traces naming the .ts file and line; unchanged
 * sources reuse the compiled file, an edit makes a new one; a syntax error is a clear error.
 * Old compiled files do not pile up: a compile deletes those no launcher used for a day, and a
 * running launcher keeps its own marked as in use.
 */
import { execFile } from "node:child_process";
import { mkdtemp, readdir, readFile, rm, stat, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CACHE_DIR, compileApp, keepInUse, STALE_COMPILED_MS } from "../../src/launch/compile-cache.ts";
import { isLifelineError } from "../../src/errors.ts";

const run = promisify(execFile);
let dir: string;

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "lifeline-compile-"));
  await writeFile(join(dir, "package.json"), JSON.stringify({ type: "module" }));
  await writeFile(join(dir, "data.txt"), "payload next to the sources\n");
  await writeFile(join(dir, "lib.ts"), ["export function twice(n: number): number {", "  return 2 * n;", "}", ""].join("\n"));
  await writeFile(
    join(dir, "helper.ts"),
    [
      'import { readFileSync } from "node:fs";',
      "export const here: string = import.meta.url;",
      "export function data(): string {",
      '  return readFileSync(new URL("./data.txt", import.meta.url), "utf8").trim();',
      "}",
      "export function fail(): never {",
      '  throw new Error("boom from helper");',
      "}",
      "",
    ].join("\n"),
  );
  await writeFile(
    join(dir, "main.ts"),
    [
      'import { twice } from "./lib.ts";',
      'import { data, fail, here } from "./helper.js";',
      "const x: number = twice(21);",
      "console.log(JSON.stringify({ x, data: data(), here, main: import.meta.url }));",
      'if (process.argv.includes("--fail")) fail();',
      "",
    ].join("\n"),
  );
});

afterAll(async () => {
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

describe("compileApp", () => {
  it("runs as from its sources: local imports, import.meta.url per module, relative files", async () => {
    const c = await compileApp(join(dir, "main.ts"));
    expect(c.app.startsWith(join(dir, CACHE_DIR))).toBe(true);
    const { stdout } = await run(process.execPath, ["--enable-source-maps", c.app]);
    expect(JSON.parse(stdout)).toEqual({
      x: 42,
      data: "payload next to the sources",
      here: `file://${join(dir, "helper.ts")}`,
      main: `file://${join(dir, "main.ts")}`,
    });
  });

  it("a stack trace names the .ts file and line", async () => {
    const c = await compileApp(join(dir, "main.ts"));
    const err = await run(process.execPath, ["--enable-source-maps", c.app, "--fail"]).then(
      () => undefined,
      (e: { stderr: string }) => e,
    );
    expect(err?.stderr).toContain("boom from helper");
    expect(err?.stderr).toContain(`${join(dir, "helper.ts")}:7`);
  });

  it("unchanged sources reuse the compiled file; an edit makes a new one", async () => {
    const first = await compileApp(join(dir, "main.ts"));
    const again = await compileApp(join(dir, "main.ts"));
    expect(again).toEqual({ app: first.app, cached: true });
    await writeFile(join(dir, "lib.ts"), ["export function twice(n: number): number {", "  return n + n;", "}", ""].join("\n"));
    const edited = await compileApp(join(dir, "main.ts"));
    expect(edited.cached).toBe(false);
    expect(edited.app).not.toBe(first.app);
    expect((await readdir(join(dir, CACHE_DIR))).filter((n) => n.includes(".tmp-"))).toEqual([]);
    // Out of the user's git status without touching their own .gitignore.
    expect(await readFile(join(dir, CACHE_DIR, ".gitignore"), "utf8")).toBe("*\n");
  });

  it("a compile deletes the compiled files no launcher used for a day, and keeps the rest", async () => {
    const first = await compileApp(join(dir, "main.ts"));
    const cache = join(dir, CACHE_DIR);
    const longAgo = new Date(Date.now() - STALE_COMPILED_MS - 60 * 60 * 1000);
    const anHourAgo = new Date(Date.now() - 60 * 60 * 1000);
    const files: [string, Date][] = [
      ["old-0123456789abcdef.mjs", longAgo],
      ["old-0123456789abcdef.mjs.tmp-0a1b2c3d", longAgo],
      ["recent-fedcba9876543210.mjs", anHourAgo],
      ["notes.txt", longAgo],
    ];
    for (const [name, when] of files) {
      await writeFile(join(cache, name), "x");
      await utimes(join(cache, name), when, when);
    }
    // The program's own compiled file, unused for as long: reusing it marks it in use again.
    await utimes(first.app, longAgo, longAgo);
    const started = Date.now();
    const again = await compileApp(join(dir, "main.ts"));
    expect(again).toEqual({ app: first.app, cached: true });
    expect((await stat(first.app)).mtimeMs).toBeGreaterThanOrEqual(started - 1000);
    const left = await readdir(cache);
    expect(left).not.toContain("old-0123456789abcdef.mjs");
    expect(left).not.toContain("old-0123456789abcdef.mjs.tmp-0a1b2c3d");
    expect(left).toContain("recent-fedcba9876543210.mjs");
    expect(left).toContain("notes.txt");
    expect(left).toContain(".gitignore");
  });

  it("keepInUse marks a compiled file as in use until it is stopped", async () => {
    const path = join(dir, CACHE_DIR, "kept-00000000000000aa.mjs");
    await writeFile(path, "x");
    const longAgo = new Date(Date.now() - STALE_COMPILED_MS - 60 * 60 * 1000);
    await utimes(path, longAgo, longAgo);
    const stop = keepInUse(path, 10);
    await new Promise((r) => setTimeout(r, 100));
    expect((await stat(path)).mtimeMs).toBeGreaterThan(Date.now() - 60_000);
    stop();
    await utimes(path, longAgo, longAgo);
    await new Promise((r) => setTimeout(r, 60));
    // Not marked again: still a day old (mtimeMs is a float, so no exact comparison).
    expect((await stat(path)).mtimeMs).toBeLessThan(Date.now() - STALE_COMPILED_MS);
  });

  it('a .ts file outside a "type": "module" package is refused (the caller falls back to tsx)', async () => {
    const cjs = await mkdtemp(join(tmpdir(), "lifeline-compile-cjs-"));
    try {
      await writeFile(join(cjs, "package.json"), JSON.stringify({ name: "old-style" }));
      await writeFile(join(cjs, "main.ts"), "console.log(1);\n");
      const err = await compileApp(join(cjs, "main.ts")).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(isLifelineError(err, "LAUNCH_SPAWN")).toBe(true);
      expect((err as Error).message).toMatch(/"type": "module"/);
    } finally {
      await rm(cjs, { recursive: true, force: true });
    }
  });

  it("a syntax error is LAUNCH_SPAWN naming the file and line", async () => {
    await writeFile(join(dir, "broken.ts"), "const x: number = ;\n");
    const err = await compileApp(join(dir, "broken.ts")).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(isLifelineError(err, "LAUNCH_SPAWN")).toBe(true);
    expect((err as Error).message).toMatch(/broken\.ts:1/);
  });
});
