/**
 * Goal: `lifeline lines --store <dir>` lists the recovery lines a --mode cpr run left in its
 * store — epoch, time, ranks, bytes, state — the newest --keep-lines of the committed ones.
 *
 * Method: the built launcher runs test/fixtures/cpr/crossing.ts (2 ranks, a line every step,
 * 128 KiB of state per rank) with --keep-lines 2, then `node dist/cli.js lines` on its store;
 * the table is parsed and checked against the run's --results (linesCommitted).
 */
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CLI, ROOT, context, runLauncher } from "./cpr-run.ts";

const TIMEOUT_MS = 30_000;
let dir: string;

beforeAll(async () => {
  if (!existsSync(CLI)) throw new Error(`${CLI} is missing: run \`npm run build\` first`);
  dir = await mkdtemp(join(tmpdir(), "lifeline-lines-"));
});

afterAll(async () => {
  if (dir !== undefined) await rm(dir, { recursive: true, force: true });
});

describe("lifeline lines", () => {
  it("lists the committed lines a cpr run kept (epoch, time, ranks, bytes, state)", async () => {
    const o = await runLauncher({ np: 2, program: "test/fixtures/cpr/crossing.ts", args: ["allreduce-ring", "120"], flags: ["--mode", "cpr", "--checkpoint-every", "1steps", "--keep-lines", "2"], dir, name: "job", timeoutMs: TIMEOUT_MS });
    expect(o.code, context(o)).toBe(0);
    const committed = o.doc!.recovery!.linesCommitted;
    // How many lines commit depends on the machine's speed; at least one always does.
    expect(committed.length, context(o)).toBeGreaterThanOrEqual(1);

    const ls = spawnSync(process.execPath, [CLI, "lines", "--store", join(dir, "job.store")], { cwd: ROOT, encoding: "utf8", timeout: TIMEOUT_MS });
    expect(ls.status, ls.stderr).toBe(0);
    const [title, header, ...rows] = ls.stdout.trimEnd().split("\n");
    expect(title).toBe(`recovery lines in ${join(dir, "job.store")}:`);
    expect(header!.trim().split(/\s+/)).toEqual(["EPOCH", "TIME", "RANKS", "BYTES", "STATE"]);
    const parsed = rows.map((r) => {
      const m = /^\s+(\d+)\s+(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\s+(\S+)\s+([\d.]+ (?:B|KiB|MiB|GiB))\s+(\S.*)$/.exec(r);
      expect(m, `row ${JSON.stringify(r)}`).not.toBeNull();
      return { epoch: Number(m![1]), time: m![2]!, ranks: m![3]!, bytes: m![4]!, state: m![5]! };
    });
    const listed = parsed.filter((r) => r.state === "committed");
    // --keep-lines 2: the (up to) two newest committed lines, every part verified, 2 ranks each.
    expect(listed.map((r) => r.epoch)).toEqual(committed.slice(-2));
    for (const r of listed) {
      expect(r.ranks).toBe("2");
      expect(r.bytes).toMatch(/KiB$/); // 2 × (128 KiB of state + the library's own)
      expect(Math.abs(Date.parse(r.time.replace(" ", "T")) - Date.now())).toBeLessThan(5 * 60_000);
    }
    // Anything else is a line the run left unfinished (an in-progress round at finalize).
    for (const r of parsed.filter((x) => x.state !== "committed")) expect(r.state).toMatch(/^partial/);
  }, 2 * TIMEOUT_MS);
});
