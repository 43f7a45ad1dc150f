/**
 * Goal: the coordinator speaks the coordinator side of src/mpi/control.ts correctly —
 * rendezvous, progress, results, release, aborts — and shrugs off stray traffic.
 *
 * Method: a real Coordinator (zeromq Router on a private ipc path or tcp port 0) and real
 * zeromq Dealers playing the ranks (FakeRank), no mocks. Every wait is bounded; every socket
 * is closed in afterEach.
 */
import { afterEach, describe, expect, it } from "vitest";
import { encodeValue } from "../../src/mpi/codec.ts";
import { Coordinator, type CoordinatorEvent } from "../../src/launch/coordinator.ts";
import { heartbeatIdentity } from "../../src/mpi/control.ts";
import { LifelineError } from "../../src/errors.ts";
import { EventLog, FakeRank, tempDir } from "./helpers.ts";

let cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.reverse()) await c();
  cleanups = [];
});

async function startCoordinator(
  size: number,
  opts: { transport?: "ipc" | "tcp"; rendezvousTimeoutMs?: number; warningsMax?: number; beforeTables?: () => Promise<void> } = {},
) {
  const { dir, cleanup } = tempDir("lifeline-coord-");
  const events = new EventLog<CoordinatorEvent>();
  const coord = new Coordinator({
    size,
    transport: opts.transport ?? "ipc",
    runDir: dir,
    rendezvousTimeoutMs: opts.rendezvousTimeoutMs ?? 10_000,
    onEvent: events.push,
    ...(opts.warningsMax === undefined ? {} : { warningsMax: opts.warningsMax }),
    ...(opts.beforeTables === undefined ? {} : { beforeTables: opts.beforeTables }),
  });
  const endpoint = await coord.start();
  cleanups.push(cleanup, () => coord.close());
  const ranks: FakeRank[] = [];
  const rank = (r: number, o: { attempt?: number; routingId?: string } = {}): FakeRank => {
    const fake = new FakeRank(endpoint, r, o);
    ranks.push(fake);
    cleanups.push(() => fake.close());
    return fake;
  };
  return { coord, endpoint, events, rank, ranks };
}

describe("Coordinator rendezvous", () => {
  it("sends every rank the table once all have said hello, endpoints in rank order", async () => {
    const { events, rank, endpoint } = await startCoordinator(3);
    expect(endpoint).toMatch(/^ipc:\/\/.*\/coordinator$/);
    const r = [rank(0), rank(1), rank(2)];
    // Out of order on purpose: the table is by rank, not by arrival.
    await r[2]!.hello(3);
    await events.waitFor((e) => e.kind === "rank-up" && e.rank === 2);
    await r[0]!.hello(3);
    await events.waitFor((e) => e.kind === "rank-up" && e.rank === 0);
    expect(events.all.some((e) => e.kind === "ready")).toBe(false);
    expect(r[0]!.inbox.all).toHaveLength(0); // no table before everyone is up
    await r[1]!.hello(3);
    await events.waitFor((e) => e.kind === "ready");
    const tables: { keysIn: number[]; keysOut: number[] }[] = [];
    for (const fake of r) {
      const table = await fake.inbox.waitFor((m) => m.t === "table");
      expect(table).toEqual({
        t: "table",
        keysIn: expect.any(Array),
        keysOut: expect.any(Array),
        endpoints: ["tcp://127.0.0.1:20000", "tcp://127.0.0.1:20001", "tcp://127.0.0.1:20002"],
        attempts: [0, 0, 0],
      });
      tables.push(table as { keysIn: number[]; keysOut: number[] });
    }
    // Each channel's key is the same at both of its ends, and the keys are random per channel.
    for (let s = 0; s < 3; s++) for (let d = 0; d < 3; d++) expect(tables[d]!.keysIn[s]).toBe(tables[s]!.keysOut[d]);
    expect(new Set(tables.flatMap((t) => t.keysOut)).size).toBe(9);
    const ups = events.all.filter((e) => e.kind === "rank-up");
    expect(ups.map((e) => (e as { rank: number }).rank)).toEqual([2, 0, 1]);
    expect(ups[0]).toMatchObject({ pid: 10_002, attempt: 0 });
  });

  it("with beforeTables: the tables go out only when it resolves, and the ranks' messages flow meanwhile; a rejection is reported", async () => {
    let release!: () => void;
    const gate = new Promise<void>((res) => {
      release = res;
    });
    const { events, rank, coord } = await startCoordinator(2, { beforeTables: () => gate });
    const r = [rank(0), rank(1)];
    await r[0]!.hello(2);
    await r[1]!.hello(2);
    await events.waitFor((e) => e.kind === "rank-up" && e.rank === 1);
    coord.sendToRank(1, { t: "cpr-inventory" });
    await r[1]!.inbox.waitFor((m) => m.t === "cpr-inventory");
    await r[1]!.send({ t: "cpr-held", rank: 1, parts: [{ ref: { rank: 1, epoch: 2, checksum: 3, bytes: 4 }, where: "rank-1" }] });
    await events.waitFor((e) => e.kind === "cpr" && e.msg.t === "cpr-held");
    expect(r[0]!.inbox.all.some((m) => m.t === "table")).toBe(false);
    release();
    await events.waitFor((e) => e.kind === "ready");
    await r[0]!.inbox.waitFor((m) => m.t === "table");

    const failing = await startCoordinator(1, { beforeTables: () => Promise.reject(new LifelineError("CPR_RESTORE", "no copy of rank 0's part")) });
    await failing.rank(0).hello(1);
    expect(await failing.events.waitFor((e) => e.kind === "tables-failed")).toEqual({
      kind: "tables-failed",
      code: "CPR_RESTORE",
      message: "no copy of rank 0's part",
    });
    expect(failing.events.all.some((e) => e.kind === "ready")).toBe(false);
  });

  it("binds tcp on 127.0.0.1 with an OS-chosen port", async () => {
    const { endpoint, events, rank } = await startCoordinator(1, { transport: "tcp" });
    const m = /^tcp:\/\/127\.0\.0\.1:(\d+)$/.exec(endpoint);
    expect(m).not.toBeNull();
    expect(Number(m![1])).toBeGreaterThan(0);
    const r0 = rank(0);
    await r0.hello(1);
    await events.waitFor((e) => e.kind === "ready");
    await r0.inbox.waitFor((m) => m.t === "table");
  });

  it("rejects an ipc path longer than a Unix socket allows with LAUNCH_SPAWN", async () => {
    const coord = new Coordinator({
      size: 1,
      transport: "ipc",
      runDir: `/tmp/${"x".repeat(120)}`,
      rendezvousTimeoutMs: 1_000,
      onEvent: () => undefined,
    });
    cleanups.push(() => coord.close());
    await expect(coord.start()).rejects.toMatchObject({ code: "LAUNCH_SPAWN", message: expect.stringMatching(/longer than 107 bytes.*--transport tcp/) });
  });

  it("reports the ranks that never said hello when the rendezvous times out", async () => {
    const { events, rank } = await startCoordinator(3, { rendezvousTimeoutMs: 300 });
    await rank(1).hello(3);
    const ev = await events.waitFor((e) => e.kind === "rendezvous-timeout", 3_000);
    expect(ev).toEqual({ kind: "rendezvous-timeout", missing: [0, 2], timeoutMs: 300 });
  });
});

describe("Coordinator after the rendezvous", () => {
  async function runningJob(size: number) {
    const job = await startCoordinator(size);
    const ranks = Array.from({ length: size }, (_, r) => job.rank(r));
    for (const fake of ranks) await fake.hello(size);
    await job.events.waitFor((e) => e.kind === "ready");
    for (const fake of ranks) await fake.inbox.waitFor((m) => m.t === "table");
    return { ...job, ranks };
  }

  it("relays steps, decodes finalize results and releases everyone after the last", async () => {
    const { events, ranks, coord } = await runningJob(3);
    await ranks[1]!.send({ t: "step", rank: 1, steps: 7, epoch: 2 });
    expect(await events.waitFor((e) => e.kind === "step")).toEqual({ kind: "step", rank: 1, steps: 7, epoch: 2 });
    expect(coord.rank(1).steps).toBe(7);

    const values: unknown[] = [{ digest: "ab12", n: 3 }, new Float64Array([1.5, -0]), 12345678901234567890n];
    await ranks[0]!.send({ t: "finalize", rank: 0, result: encodeValue(values[0]) });
    await ranks[2]!.send({ t: "finalize", rank: 2, result: encodeValue(values[2]) });
    await events.waitFor((e) => e.kind === "finalized" && e.rank === 2);
    // Not everyone finalized yet: nobody is released.
    expect(ranks.some((f) => f.inbox.all.some((m) => m.t === "release"))).toBe(false);
    await ranks[1]!.send({ t: "finalize", rank: 1, result: encodeValue(values[1]) });
    await events.waitFor((e) => e.kind === "released");
    for (const fake of ranks) await fake.inbox.waitFor((m) => m.t === "release");

    const results = new Map<number, unknown>();
    for (const e of events.all) if (e.kind === "finalized") results.set(e.rank, e.result);
    expect(results.get(0)).toEqual(values[0]);
    expect(results.get(1)).toBeInstanceOf(Float64Array);
    expect(Array.from(results.get(1) as Float64Array)).toEqual([1.5, -0]);
    expect(results.get(2)).toBe(12345678901234567890n);
  });

  it("reports a rank's abort and delivers abort to every rank when asked", async () => {
    const { events, ranks, coord } = await runningJob(2);
    await ranks[1]!.send({ t: "abort", rank: 1, code: "MPI_COLLECTIVE_MISMATCH", message: "bcast root 0 vs 1" });
    expect(await events.waitFor((e) => e.kind === "rank-abort")).toEqual({
      kind: "rank-abort",
      rank: 1,
      code: "MPI_COLLECTIVE_MISMATCH",
      message: "bcast root 0 vs 1",
    });
    expect(await ranks[1]!.inbox.waitFor((m) => m.t === "abort-heard")).toEqual({ t: "abort-heard" });
    await coord.abort("MPI_COLLECTIVE_MISMATCH", "rank 1 aborted the job");
    for (const fake of ranks) {
      expect(await fake.inbox.waitFor((m) => m.t === "abort")).toEqual({ t: "abort", code: "MPI_COLLECTIVE_MISMATCH", message: "rank 1 aborted the job" });
    }
  });

  it("reports a finalize result that cannot be decoded instead of inventing a value", async () => {
    const { events, ranks } = await runningJob(1);
    await ranks[0]!.send({ t: "finalize", rank: 0, result: new Uint8Array([9, 9]) });
    const ev = await events.waitFor((e) => e.kind === "bad-result");
    expect(ev).toMatchObject({ kind: "bad-result", rank: 0 });
    expect(events.all.some((e) => e.kind === "finalized" || e.kind === "released")).toBe(false);
  });

  it("hands coordinated-checkpoint messages to its owner", async () => {
    const { events, ranks } = await runningJob(1);
    await ranks[0]!.send({ t: "cpr-ready", rank: 0, epoch: 3 });
    expect(await events.waitFor((e) => e.kind === "cpr")).toEqual({ kind: "cpr", rank: 0, msg: { t: "cpr-ready", rank: 0, epoch: 3 } });
    await ranks[0]!.send({ t: "cpr-ready", rank: 0 } as never);
    expect((await events.waitFor((e) => e.kind === "warning")) as { message: string }).toMatchObject({
      message: expect.stringMatching(/cpr-ready needs an epoch count/),
    });
  });

  it("counts heartbeats as liveness events", async () => {
    const { events, ranks } = await runningJob(1);
    await ranks[0]!.send({ t: "heartbeat", rank: 0, attempt: 0 });
    expect(await events.waitFor((e) => e.kind === "heartbeat")).toEqual({ kind: "heartbeat", rank: 0 });
  });

  it("answers a watchdog's heartbeat with a lease, for the current incarnation only", async () => {
    const { coord, events, endpoint } = await runningJob(2);
    const watchdog = new FakeRank(endpoint, 1, { routingId: heartbeatIdentity(1, 0) });
    cleanups.push(() => watchdog.close());
    await watchdog.send({ t: "heartbeat", rank: 1, attempt: 0 });
    expect(await watchdog.inbox.waitFor((m) => m.t === "lease")).toEqual({ t: "lease" });
    // Rank 1 is replaced (attempt 1): the old incarnation's beats get no lease any more.
    coord.restartRound([1, 1]);
    const before = events.all.filter((e) => e.kind === "heartbeat").length;
    await watchdog.send({ t: "heartbeat", rank: 1, attempt: 0 });
    await new Promise((r) => setTimeout(r, 200));
    expect(watchdog.inbox.all.filter((m) => m.t === "lease")).toHaveLength(1);
    expect(events.all.filter((e) => e.kind === "heartbeat")).toHaveLength(before);
  });
});

describe("Coordinator and stray traffic", () => {
  it("ignores garbage with warnings and still completes the rendezvous", async () => {
    const { events, rank, endpoint } = await startCoordinator(2, { warningsMax: 100 });
    const stray = new FakeRank(endpoint, 0, { routingId: "stray-process" });
    const anonymous = new FakeRank(endpoint, 0, { routingId: "\x01\x02binary" });
    try {
      await stray.sendRaw(Buffer.from([0xc1, 0xff, 0x00])); // not msgpack
      await stray.sendRaw("a", "b", "c"); // three frames
      await stray.sendRaw(Buffer.from([0x93, 1, 2, 3])); // msgpack, but not a tagged map
      await stray.send({ t: "step", rank: 0, steps: 1, epoch: 0 }); // never said hello
      await stray.send({ t: "hello", rank: 0, attempt: 0, pid: 1, endpoint: "tcp://x:1", size: 2 }); // wrong routing id
      await stray.send({ t: "hello", rank: 5, attempt: 0, pid: 1, endpoint: "tcp://x:1", size: 2 } as never); // rank out of range
      await stray.send({ t: "nonsense", rank: 0 } as never);
      await anonymous.sendRaw(Buffer.alloc(0));
      const r0 = rank(0);
      await r0.send({ t: "hello", rank: 0, attempt: 0, pid: 1, endpoint: "tcp://x:1", size: 9 }); // wrong job size
      await r0.hello(2);
      await r0.hello(2); // duplicate
      await r0.send({ t: "step", rank: 1, steps: 1, epoch: 0 }); // claims another rank
      await events.waitFor((e) => e.kind === "rank-up" && e.rank === 0);
      await rank(1).hello(2);
      await events.waitFor((e) => e.kind === "ready");
      // Messages from different peers arrive in any order: wait for all 11 warnings.
      const deadline = Date.now() + 3_000;
      while (events.all.filter((e) => e.kind === "warning").length < 11 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
      const warnings = events.all.filter((e) => e.kind === "warning").map((e) => (e as { message: string }).message);
      // Every stray message got its own warning, naming its sender where it could.
      expect(warnings).toHaveLength(11);
      expect(warnings.join("\n")).toMatch(/"stray-process"/);
      expect(warnings.join("\n")).toMatch(/binary id/);
      expect(warnings.join("\n")).toMatch(/job of size 9/);
      expect(warnings.join("\n")).toMatch(/second hello/);
      expect(events.all.filter((e) => e.kind === "step")).toHaveLength(0);
    } finally {
      await stray.close();
      await anonymous.close();
    }
  });

  it("stops printing after a bounded number of stray-traffic warnings", async () => {
    const { events, coord, endpoint } = await startCoordinator(1);
    const stray = new FakeRank(endpoint, 0, { routingId: "spammer" });
    try {
      for (let i = 0; i < 40; i++) await stray.sendRaw(Buffer.from([0xc1]));
      await stray.send({ t: "nonsense", rank: 0 } as never);
      const deadline = Date.now() + 3_000;
      while (coord.suppressedWarningCount < 31 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
      expect(events.all.filter((e) => e.kind === "warning")).toHaveLength(10);
      expect(coord.suppressedWarningCount).toBe(31);
    } finally {
      await stray.close();
    }
  });
});
