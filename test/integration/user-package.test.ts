/**
 * Goal: lifeline works as a user gets it — installed from the published tarball into a fresh
 * project that has no TypeScript tooling of its own — and `npx lifeline run` runs both a
 * TypeScript and a JavaScript program there.
 *
 * Method: `npm pack` this repository (without re-running the build, so it packs the dist/
 * that `npm test` just built and other test files are reading), install the tarball into a
 * temp project with `npm install --prefer-offline`, write app.ts (with TypeScript-only syntax)
 * and app.js, and run each with 4 ranks and `--results`. Slow (~10–30 s) because of the
 * install, hence its own file.
 */
import { execFile } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ROOT, tempDir } from "../launch/helpers.ts";

const exec = promisify(execFile);
const { dir, cleanup } = tempDir("lifeline-user-");
const project = join(dir, "my-app");

const APP_TS = `import { init } from "lifeline";

interface Tally { total: number }
const world = await init();
const tally: Tally = { total: await world.allreduce(world.rank + 1, "sum") };
console.log(\`ts rank \${world.rank} of \${world.size}: total \${tally.total}\`);
await world.finalize(tally.total * 100 + world.rank);
`;

const APP_JS = `import { init } from "lifeline";

const world = await init();
const max = await world.allreduce(world.rank * 3, "max");
console.log(\`js rank \${world.rank}: max \${max}\`);
await world.finalize({ rank: world.rank, max });
`;

beforeAll(async () => {
  if (!existsSync(join(ROOT, "dist", "cli.js"))) throw new Error("dist/cli.js is missing: run `npm run build` first");
  await exec("npm", ["pack", "--ignore-scripts", "--silent", "--pack-destination", dir, ROOT], { cwd: dir, timeout: 60_000 });
  const tarball = readdirSync(dir).find((f) => f.endsWith(".tgz"));
  if (tarball === undefined) throw new Error("npm pack produced no tarball");
  mkdirSync(project);
  // "type": "module" so that top-level await and `import` work in .ts and .js alike.
  writeFileSync(join(project, "package.json"), JSON.stringify({ name: "my-app", version: "1.0.0", private: true, type: "module" }, null, 2));
  await exec("npm", ["install", "--prefer-offline", "--no-audit", "--no-fund", join(dir, tarball)], { cwd: project, timeout: 120_000 });
  writeFileSync(join(project, "app.ts"), APP_TS);
  writeFileSync(join(project, "app.js"), APP_JS);
}, 180_000);

afterAll(cleanup);

async function npxLifeline(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await exec("npx", ["lifeline", ...args], { cwd: project, timeout: 60_000, env: { ...process.env, CI: "1" } });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code?: number; stdout?: string; stderr?: string };
    return { code: typeof e.code === "number" ? e.code : -1, stdout: e.stdout ?? "", stderr: e.stderr ?? "" };
  }
}

describe("lifeline installed from its tarball", () => {
  it("installs the lifeline binary without the user installing tsx or typescript", () => {
    const pkg = JSON.parse(readFileSync(join(project, "package.json"), "utf8")) as { dependencies: Record<string, string> };
    expect(Object.keys(pkg.dependencies)).toEqual(["lifeline"]);
    expect(existsSync(join(project, "node_modules", ".bin", "lifeline"))).toBe(true);
  });

  it("npx lifeline run -n 4 --mode none app.ts", async () => {
    const r = await npxLifeline(["run", "-n", "4", "--mode", "none", "--results", "ts.json", "app.ts"]);
    expect(r.code, r.stderr).toBe(0);
    for (let rank = 0; rank < 4; rank++) expect(r.stdout).toContain(`[${rank}] ts rank ${rank} of 4: total 10\n`);
    expect(r.stderr).toMatch(/lifeline: done: 4\/4 ranks finalized/);
    const doc = JSON.parse(readFileSync(join(project, "ts.json"), "utf8"));
    expect(doc).toMatchObject({ ranks: [1000, 1001, 1002, 1003], restarts: 0, mode: "none", size: 4, exitCode: 0 });
  });

  it("npx lifeline run -n 4 --mode none app.js", async () => {
    const r = await npxLifeline(["run", "-n", "4", "--mode", "none", "--results", "js.json", "app.js"]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain("[3] js rank 3: max 9\n");
    const doc = JSON.parse(readFileSync(join(project, "js.json"), "utf8"));
    expect(doc.ranks).toEqual([0, 1, 2, 3].map((rank) => ({ rank, max: 9 })));
  });

  it("npx lifeline with a bad flag exits 2 with a message", async () => {
    const r = await npxLifeline(["run", "-n", "0", "--mode", "bogus", "app.ts"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/-n/);
    expect(r.stderr).toMatch(/bogus/);
  });
});
