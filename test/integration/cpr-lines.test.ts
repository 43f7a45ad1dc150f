/**
 * Goal: `lifeline lines --store <dir>` lists the recovery lines a --mode cpr run left in its
 * store — epoch, time, ranks, bytes, state — the newest --keep-lines of the committed ones.
 *
 * Method: the built launcher runs test/fixtures/cpr/crossing.ts (2 ranks, a line every step,
 * 128 KiB of state per rank) with --keep-lines 2, then `node dist/cli.js lines` on its store;
 * the table is parsed and checked against the run's --results (linesCommitted). Then, while a
 * heat job commits a line every 100 ms, `lifeline lines --json` runs again and again: every
 * listing succeeds and shows verified lines, and the job is undisturbed (exit 0, results
 * equal to a mode-none run, no warning).
 */
import { spawn, spawnSync } from "node:child_process";
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
  it(
    "lists the committed lines a cpr run kept (epoch, time, ranks, bytes, state)",
    async () => {
      const o = await runLauncher({
        np: 2,
        program: "test/fixtures/cpr/crossing.ts",
        // 5 ms at every point: at least 0.6 s of run, so that lines commit even when the
        // machine is idle (a clean-clone CI run finished in 0.3 s with none committed).
        args: ["allreduce-ring", "120", "5"],
        flags: ["--mode", "cpr", "--checkpoint-every", "1steps", "--keep-lines", "2"],
        dir,
        name: "job",
        timeoutMs: TIMEOUT_MS,
      });
      expect(o.code, context(o)).toBe(0);
      const committed = o.doc!.recovery!.linesCommitted;
      // How many lines commit depends on the machine's speed; at least one always does.
      expect(committed.length, context(o)).toBeGreaterThanOrEqual(1);

      const ls = spawnSync(process.execPath, [CLI, "lines", "--store", join(dir, "job.store")], { cwd: ROOT, encoding: "utf8", timeout: TIMEOUT_MS });
      expect(ls.status, ls.stderr).toBe(0);
      const [job, title, header, ...rows] = ls.stdout.trimEnd().split("\n");
      expect(job).toMatch(/^job crossing-[0-9a-f]{8}: \S+crossing\.ts allreduce-ring 120 5 on 2 ranks \(mode cpr\); run 1 finished at \d{4}-/);
      expect(title).toBe(`recovery lines in ${join(dir, "job.store")}:`);
      expect(header!.trim().split(/\s+/)).toEqual(["EPOCH", "TIME", "RANKS", "BYTES", "RUN", "STATE"]);
      const parsed = rows.map((r) => {
        const m = /^\s+(\d+)\s+(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\s+(\S+)\s+([\d.]+ (?:B|KiB|MiB|GiB))\s+(\S+)\s+(\S.*)$/.exec(r);
        expect(m, `row ${JSON.stringify(r)}`).not.toBeNull();
        return { epoch: Number(m![1]), time: m![2]!, ranks: m![3]!, bytes: m![4]!, run: m![5]!, state: m![6]! };
      });
      const listed = parsed.filter((r) => r.state === "committed");
      // --keep-lines 2: the (up to) two newest committed lines, every part verified, 2 ranks each.
      expect(listed.map((r) => r.epoch)).toEqual(committed.slice(-2));
      for (const r of listed) {
        expect(r.ranks).toBe("2");
        expect(r.run).toBe("1");
        // The ranks' state is small; a line also holds the messages of the collectives that
        // cross it (256 KiB allreduces), more of them when its round is slow on a loaded machine
        // (a clean-clone CI run saw 1.3 MiB): hundreds of KiB to a few MiB.
        expect(r.bytes).toMatch(/^[\d.]+ (KiB|MiB)$/);
        const [n, unit] = r.bytes.split(" ");
        expect(Number(n) * (unit === "MiB" ? 1024 : 1)).toBeLessThanOrEqual(16 * 1024);
        expect(Math.abs(Date.parse(r.time.replace(" ", "T")) - Date.now())).toBeLessThan(5 * 60_000);
      }
      // A job that ended leaves only committed lines: the parts of a round in progress at the
      // end (or of an aborted line) are deleted.
      expect(parsed.filter((x) => x.state !== "committed")).toEqual([]);
    },
    2 * TIMEOUT_MS,
  );

  it(
    "lists a running job's lines without disturbing it (no lock taken)",
    async () => {
      // Long enough (about 5 s alone) for several listings even on a loaded machine, where each
      // listing (a Node process opening the store) takes a second or more.
      const args = ["--rows", "96", "--cols", "96", "--iters", "20000", "--tol", "0"];
      const ref = await runLauncher({ np: 2, program: "examples/heat.ts", args, flags: ["--mode", "none"], dir, name: "heat-ref", timeoutMs: TIMEOUT_MS });
      expect(ref.code, context(ref)).toBe(0);
      let running = true;
      let committed = 0;
      const job = runLauncher({
        np: 2,
        program: "examples/heat.ts",
        args,
        flags: ["--mode", "cpr", "--checkpoint-every", "100ms"],
        dir,
        name: "heat",
        timeoutMs: TIMEOUT_MS,
        onEvent: (ev) => {
          if (ev.event === "line-committed") committed++;
        },
      }).finally(() => {
        running = false;
      });
      const listings: { code: number | null; doc: { job?: { state: string }; rows: { epoch: number; state: string }[] } | undefined; stderr: string }[] = [];
      while (committed === 0 && running) await new Promise((r) => setTimeout(r, 20));
      while (running) {
        const r = await new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
          const child = spawn(process.execPath, [CLI, "lines", "--json", "--store", join(dir, "heat.store")], { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
          let stdout = "";
          let stderr = "";
          child.stdout.setEncoding("utf8").on("data", (c: string) => {
            stdout += c;
          });
          child.stderr.setEncoding("utf8").on("data", (c: string) => {
            stderr += c;
          });
          child.on("close", (code) => resolve({ code, stdout, stderr }));
        });
        if (!running) break; // the job may have ended (and cleaned up) in the middle of this listing
        const doc = r.code === 0 ? (JSON.parse(r.stdout) as (typeof listings)[number]["doc"]) : undefined;
        // The launcher records the job as finished just before it exits: this listing saw its end.
        if (doc?.job?.state === "finished") break;
        listings.push({ code: r.code, doc, stderr: r.stderr });
      }
      const o = await job;
      expect(o.code, context(o)).toBe(0);
      expect(o.doc!.ranks).toEqual(ref.doc!.ranks);
      expect(o.stderr).not.toContain('"event":"warning"');
      expect(listings.length, "the job ended before a listing finished").toBeGreaterThanOrEqual(2);
      for (const l of listings) {
        expect(l.code, l.stderr).toBe(0);
        expect(l.doc!.job!.state).toBe("running");
        const done = l.doc!.rows.filter((r) => r.state !== "partial");
        expect(done.length).toBeGreaterThanOrEqual(1);
        for (const r of done) expect(r.state).toBe("committed");
      }
      // Lines were committed between listings: the listings saw the job progress.
      const newest = listings.map((l) => Math.max(...l.doc!.rows.filter((r) => r.state === "committed").map((r) => r.epoch)));
      expect(newest.at(-1)!).toBeGreaterThan(newest[0]!);
    },
    3 * TIMEOUT_MS,
  );
});
