/**
 * Goal: what a new run does with a store's lines is decided by which job they belong to and
 * how its last run ended — resume an unfinished run of the same job, start over after a
 * finished one, refuse another job's lines unless `--fresh` — and `claimStore` records the new
 * run in the store.
 *
 * Method: `decideClaim` (pure) over every combination that matters; `claimStore` and `endRun`
 * against a real store directory (LevelDB), reading the job record back.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isLifelineError } from "../../src/errors.ts";
import { claimStore, decideClaim, endRun, identityOf } from "../../src/launch/job-store.ts";
import { describeIdentity, type JobIdentity } from "../../src/store/job.ts";
import { resolveRunConfig } from "../../src/launch/options.ts";
import { LevelRecoveryStore } from "../../src/store/level-store.ts";
import type { JobRecord, LineRecord } from "../../src/store/types.ts";

const me: JobIdentity = { app: "/w/heat.ts", args: ["--iters", "400"], size: 4 };
const record = (over: Partial<JobRecord> = {}): JobRecord => ({
  id: "heat-0badcafe",
  app: me.app,
  args: [...me.args],
  size: me.size,
  mode: "cpr",
  programSha256: "",
  createdMs: 1_700_000_000_000,
  run: 1,
  runStartedMs: 1_700_000_000_000,
  launcher: { pid: 999_999, host: "h" },
  state: "running",
  ...over,
});
const line = (epoch: number): LineRecord => ({
  epoch,
  timeMs: 1_700_000_100_000 + epoch,
  parts: [{ rank: 0, epoch, checksum: 1, bytes: 1024 }],
  meta: undefined,
  job: { id: "heat-0badcafe", run: 1 },
});
const ctx = { location: "/s", alive: () => false };

describe("decideClaim", () => {
  it("an empty store, or one without lines: start (a new run of the same unfinished job keeps its id)", () => {
    expect(decideClaim({ job: undefined, lines: [] }, me, "auto", ctx)).toEqual({ kind: "fresh", discard: [], why: undefined, continues: undefined });
    const same = record();
    expect(decideClaim({ job: same, lines: [] }, me, "auto", ctx)).toMatchObject({ kind: "fresh", continues: same });
    expect(decideClaim({ job: record({ state: "finished" }), lines: [] }, me, "auto", ctx)).toMatchObject({ kind: "fresh", continues: undefined });
    expect(decideClaim({ job: record({ args: [] }), lines: [] }, me, "auto", ctx)).toMatchObject({ kind: "fresh", continues: undefined });
  });

  it("lines of an unfinished run of the same job: resume, with or without --resume, whatever ended it", () => {
    for (const state of ["running", "failed", "stopped"] as const) {
      const job = record({ state });
      expect(decideClaim({ job, lines: [line(3), line(4)] }, me, "auto", ctx)).toEqual({ kind: "resume", job });
      expect(decideClaim({ job, lines: [line(3)] }, me, "resume", ctx)).toEqual({ kind: "resume", job });
    }
  });

  it("lines of a finished run: start over (saying why); --resume is refused", () => {
    const job = record({ state: "finished", endedMs: 1_700_000_200_000 });
    const d = decideClaim({ job, lines: [line(3)] }, me, "auto", ctx);
    expect(d).toMatchObject({ kind: "fresh", discard: [line(3)] });
    expect(d.kind === "fresh" && d.why).toMatch(/^they belong to run 1 of this job, which finished at /);
    const r = decideClaim({ job, lines: [line(3)] }, me, "resume", ctx);
    expect(r.kind === "refuse" && r.message).toMatch(/^--resume: the job in the store \/s \(heat-0badcafe\) finished at .*nothing to resume/);
  });

  it("lines of another job (program, arguments, size, or unknown) are refused, saying what the store holds and what differs", () => {
    const cases: [Partial<JobRecord>, string][] = [
      [{ app: "/w/other.ts" }, "another program"],
      [{ args: ["--iters", "500"] }, "other arguments"],
      [{ size: 2 }, "-n 4, not 2"],
    ];
    for (const [over, differs] of cases) {
      const d = decideClaim({ job: record(over), lines: [line(3), line(4)] }, me, "auto", ctx);
      expect(d.kind).toBe("refuse");
      const msg = d.kind === "refuse" ? d.message : "";
      expect(msg).toContain("the store /s holds 2 recovery lines (newest: line 4, 1.0 KiB, committed ");
      expect(msg).toContain("of job heat-0badcafe (run 1, ended without finishing (its launcher, pid 999999 on h, is gone))");
      expect(msg).toContain(`this run is:\n  ${describeIdentity(me)} (${differs})`);
      expect(msg).toContain("add --fresh");
      expect(decideClaim({ job: record(over), lines: [line(3)] }, me, "resume", ctx).kind).toBe("refuse");
    }
    const unknown = decideClaim({ job: undefined, lines: [line(1)] }, me, "auto", ctx);
    expect(unknown.kind === "refuse" && unknown.message).toContain("of an unknown job");
  });

  it("--fresh discards whatever the store holds", () => {
    expect(decideClaim({ job: record({ app: "/w/other.ts" }), lines: [line(3)] }, me, "fresh", ctx)).toEqual({
      kind: "fresh",
      discard: [line(3)],
      why: "--fresh",
      continues: undefined,
    });
  });

  it("--resume with no line is refused", () => {
    const d = decideClaim({ job: undefined, lines: [] }, me, "resume", ctx);
    expect(d.kind === "refuse" && d.message).toMatch(/^--resume: the store \/s holds no recovery line, so there is nothing to resume/);
  });

  it("a run whose launcher is alive is never resumed from under it", () => {
    const d = decideClaim({ job: record(), lines: [line(3)] }, me, "auto", { ...ctx, alive: () => true });
    expect(d.kind === "refuse" && d.message).toMatch(/is in use: run 1 of job heat-0badcafe is running/);
  });
});

describe("claimStore / endRun", () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "lifeline-claim-"));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("writes the run's job record, holds the manifest, and records how the run ended", async () => {
    const config = resolveRunConfig(
      { np: "2", mode: "cpr", app: "examples/heat.ts", appArgs: ["--iters", "9"], store: join(dir, "s") },
      { cwd: process.cwd() },
    );
    const claim = await claimStore(config, { jobIdBase: "heat", nowMs: () => 1_700_000_000_000 });
    expect(claim.action).toEqual({ kind: "fresh", discard: [], why: undefined, continues: undefined });
    expect(claim.job).toMatchObject({
      app: identityOf(config).app,
      args: ["--iters", "9"],
      size: 2,
      mode: "cpr",
      run: 1,
      state: "running",
      launcher: { pid: process.pid },
    });
    expect(claim.job.id).toMatch(/^heat-[0-9a-f]{8}$/);
    expect(claim.job.programSha256).toMatch(/^[0-9a-f]{64}$/);
    // The manifest is held: another launcher cannot claim the store meanwhile.
    const second = await claimStore(config, { jobIdBase: "heat" }).then(
      () => undefined,
      (err: unknown) => err,
    );
    expect(isLifelineError(second, "STORE_LOCKED") && second.message).toMatch(/is in use by another running job/);
    expect(await endRun(claim, { state: "stopped", exitCode: 143, nowMs: 1_700_000_005_000 })).toBeUndefined();
    await claim.manifest.close();

    const m = await new LevelRecoveryStore(join(dir, "s")).openManifest();
    expect(await m.job()).toMatchObject({ id: claim.job.id, run: 1, state: "stopped", exitCode: 143, endedMs: 1_700_000_005_000 });
    await m.close();

    // No line was committed: the next run of the same job starts from the beginning, as run 2 of the same id.
    const again = await claimStore(config, { jobIdBase: "heat" });
    expect(again.job).toMatchObject({ id: claim.job.id, run: 2, createdMs: 1_700_000_000_000 });
    await again.manifest.close();
  });
});
