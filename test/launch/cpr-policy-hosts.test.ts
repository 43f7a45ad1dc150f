/**
 * Goal: the cpr restart policy with per-host stores (`--store-scope host`) gathers the
 * recovery line from the hosts before the tables go out: it asks one rank per host, one host
 * after the other, what its host's store holds, chooses the newest complete line, fetches the
 * parts that are not on their rank's host, and puts them, the partner and the kept lines into
 * the tables; a restart cancels a preparation under way without touching the next one; a copy
 * that cannot be sent is dropped and the choice made again; a line's `cpr-committed` carries
 * its commit record and the job record.
 *
 * Method: a real store (LevelDB manifest in a temp directory) claimed as `lifeline run` does;
 * the policy driven directly, the ranks' answers played by the test.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CprRestartPolicy } from "../../src/launch/cpr-policy.ts";
import { claimStore, endRun } from "../../src/launch/job-store.ts";
import { resolveRunConfig, type RunConfig } from "../../src/launch/options.ts";
import type { CoordinatorToRank } from "../../src/mpi/control.ts";
import type { JobEvent } from "../../src/launch/progress.ts";

let dir: string;
let config: RunConfig;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "lifeline-policy-hosts-"));
  config = { ...resolveRunConfig({ np: "4", mode: "cpr", app: "examples/heat.ts", store: join(dir, "s"), storeScope: "host" }, { cwd: process.cwd() }) };
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

const ref = (rank: number, epoch: number) => ({ rank, epoch, checksum: 100 * epoch + rank, bytes: 8 });

/** A first run that committed lines 1 and 2, and was killed (its job record says running). */
async function storeWithLines(): Promise<void> {
  const claim = await claimStore(config, { jobIdBase: "heat" });
  for (const e of [1, 2])
    await claim.manifest.commitLine(
      e,
      [0, 1, 2, 3].map((r) => ref(r, e)),
      { job: { id: claim.job.id, run: 1 } },
    );
  await endRun(claim, { state: "failed", exitCode: 1 });
  await claim.manifest.close();
}

function harness() {
  const sent: { rank: number; msg: CoordinatorToRank }[] = [];
  const events: JobEvent[] = [];
  const broadcasts: CoordinatorToRank[] = [];
  const ctx = {
    broadcast: (msg: CoordinatorToRank) => broadcasts.push(msg),
    send: (rank: number, msg: CoordinatorToRank) => sent.push({ rank, msg }),
    report: (ev: JobEvent) => events.push(ev),
  };
  const next = async (pred: (s: { rank: number; msg: CoordinatorToRank }) => boolean): Promise<{ rank: number; msg: CoordinatorToRank }> => {
    for (let i = 0; i < 200; i++) {
      const hit = sent.find(pred);
      if (hit !== undefined) {
        sent.splice(sent.indexOf(hit), 1);
        return hit;
      }
      await new Promise((res) => setTimeout(res, 5));
    }
    throw new Error(`no such message; sent: ${JSON.stringify(sent.map((s) => [s.rank, s.msg.t]))}`);
  };
  return { sent, events, broadcasts, ctx, next };
}

const own = (rank: number, epoch: number) => ({ ref: ref(rank, epoch), where: `rank-${rank}` });
const held = (holder: number, rank: number, epoch: number) => ({ ref: ref(rank, epoch), where: `held-by-${holder}/rank-${rank}` });

describe("CprRestartPolicy, per-host stores", () => {
  it("a resume: asks host by host, fetches the lost host's parts from the partner copies, and tables carry part, partner and keep", async () => {
    await storeWithLines();
    const policy = new CprRestartPolicy(config, await claimStore(config, { jobIdBase: "heat" }));
    const h = harness();
    await policy.attach(h.ctx);
    // Ranks 0-1 on host 0 (which kept copies of 2 and 3), ranks 2-3 on host 2, a spare with an empty disk.
    const prepared = policy.beforeTables([0, 0, 2, 2]);
    const ask0 = await h.next((s) => s.msg.t === "cpr-inventory");
    expect(ask0.rank).toBe(0);
    expect(h.sent.some((s) => s.msg.t === "cpr-inventory")).toBe(false); // one host at a time
    policy.onCprMessage(0, { t: "cpr-held", rank: 0, parts: [1, 2].flatMap((e) => [own(0, e), own(1, e), held(0, 2, e), held(0, 3, e)]) });
    const ask2 = await h.next((s) => s.msg.t === "cpr-inventory");
    expect(ask2.rank).toBe(2);
    policy.onCprMessage(2, { t: "cpr-held", rank: 2, parts: [] });
    for (const r of [2, 3]) {
      const f = await h.next((s) => s.msg.t === "cpr-fetch");
      expect(f).toEqual({ rank: 0, msg: { t: "cpr-fetch", of: r, ref: ref(r, 2), where: `held-by-0/rank-${r}` } });
      policy.onCprMessage(0, { t: "cpr-copy", rank: 0, of: r, epoch: 2, part: Buffer.from(`part ${r}`) });
    }
    await prepared;
    expect(policy.tableFor(0)).toEqual({ keep: [1, 2], partner: 2, restore: { epoch: 2, ref: ref(0, 2) } });
    // Partners: the same place on the next host (0 ↔ 2, 1 ↔ 3).
    expect(policy.tableFor(3)).toEqual({ keep: [1, 2], partner: 1, restore: { epoch: 2, ref: ref(3, 2), part: Buffer.from("part 3") } });
    expect(h.events.find((e) => e.kind === "job-resuming")).toMatchObject({ epoch: 2, run: 2 });
    expect(h.events.filter((e) => e.kind === "warning").map((e) => (e as { message: string }).message)).toEqual([
      "rank 2's part of line 2 is not on its host: restoring it from the partner copy on rank 0's host (held-by-0/rank-2)",
      "rank 3's part of line 2 is not on its host: restoring it from the partner copy on rank 0's host (held-by-0/rank-3)",
    ]);
    await policy.close({ ok: true, exitCode: 0, interrupted: false });
  });

  it("a copy that cannot be sent counts as missing: the older line, whose parts are elsewhere too", async () => {
    await storeWithLines();
    const policy = new CprRestartPolicy(config, await claimStore(config, { jobIdBase: "heat" }));
    const h = harness();
    await policy.attach(h.ctx);
    const prepared = policy.beforeTables([0, 0, 1, 1]);
    await h.next((s) => s.msg.t === "cpr-inventory");
    policy.onCprMessage(0, { t: "cpr-held", rank: 0, parts: [own(0, 1), own(1, 1), own(0, 2), own(1, 2), held(0, 2, 2)] });
    await h.next((s) => s.msg.t === "cpr-inventory");
    policy.onCprMessage(2, { t: "cpr-held", rank: 2, parts: [own(3, 2), own(2, 1), own(3, 1)] });
    const f = await h.next((s) => s.msg.t === "cpr-fetch");
    expect(f.msg).toMatchObject({ of: 2, where: "held-by-0/rank-2" });
    policy.onCprMessage(0, { t: "cpr-copy", rank: 0, of: 2, epoch: 2, error: "disk error" });
    await prepared;
    expect(policy.tableFor(2)).toMatchObject({ restore: { epoch: 1, ref: ref(2, 1) } });
    expect(policy.tableFor(2)).not.toHaveProperty("restore.part");
    const warnings = h.events.filter((e) => e.kind === "warning").map((e) => (e as { message: string }).message);
    expect(warnings.some((w) => /could not send rank 2's part of line 2 \(held-by-0\/rank-2\): disk error/.test(w))).toBe(true);
    expect(warnings.some((w) => /recovery line 2 is unusable, falling back to line 1/.test(w))).toBe(true);
    await policy.close({ ok: true, exitCode: 0, interrupted: false });
  });

  it("a restart cancels the preparation under way; the next one runs on its own; commits carry their record", async () => {
    await storeWithLines();
    const policy = new CprRestartPolicy(config, await claimStore(config, { jobIdBase: "heat" }));
    const h = harness();
    await policy.attach(h.ctx);
    let firstSettled = false;
    void policy.beforeTables([0, 0, 1, 1]).finally(() => {
      firstSettled = true;
    });
    await h.next((s) => s.msg.t === "cpr-inventory");
    policy.decide(
      { kind: "exit", rank: 1, code: "LAUNCH_RANK_FAILED", message: "rank 1 died", exitStatus: 1 },
      { size: 4, mode: "cpr", restarts: 0, maxRestarts: 3, finalized: [false, false, false, false], backoffMs: 0 },
    );
    await policy.prepareRestart(1);
    const second = policy.beforeTables([0, 0, 1, 1]);
    const ask = await h.next((s) => s.msg.t === "cpr-inventory");
    expect(ask.rank).toBe(0);
    policy.onCprMessage(0, { t: "cpr-held", rank: 0, parts: [own(0, 2), own(1, 2)] });
    await h.next((s) => s.msg.t === "cpr-inventory");
    policy.onCprMessage(2, { t: "cpr-held", rank: 2, parts: [own(2, 2), own(3, 2)] });
    await second;
    expect(firstSettled).toBe(false);
    expect(policy.tableFor(1)).toEqual({ keep: [1, 2], partner: 3, restore: { epoch: 2, ref: ref(1, 2) } });
    expect(h.events.find((e) => e.kind === "job-restarting")).toMatchObject({ attempt: 1, epoch: 2 });
    await policy.close({ ok: true, exitCode: 0, interrupted: false });
  });
});
