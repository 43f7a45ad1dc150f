/**
 * Goal: the coordinator's membership machine — which the real coordinator and the simulator
 * both run — decides who is in the job and what each rank is told: the rendezvous, the
 * tables, the release, aborts, retry-one's rank-down and rejoin, cpr's restart rounds, the
 * tables' preparation and the lease.
 *
 * Method: the pure machine alone, fed inputs by hand (time is a number); each test reads the
 * effects it returns (sends by routing identity, events). No sockets, no timers.
 */
import { describe, expect, it } from "vitest";
import { type CoordinatorEvent, Membership, type MembershipEffect, type MembershipOptions } from "../../src/launch/membership.ts";
import { encodeValue } from "../../src/mpi/codec.ts";
import { controlIdentity as id, type CoordinatorToRank, heartbeatIdentity, type RankToCoordinator } from "../../src/mpi/control.ts";

/** Channel keys that say which channel they are: 1000 * source + destination + 1. */
function channelKeys(size: number): Uint32Array {
  return Uint32Array.from({ length: size * size }, (_, i) => 1000 * Math.floor(i / size) + (i % size) + 1);
}

/** What rank `rank`'s table carries of {@link channelKeys}. */
function keysOf(rank: number, size: number): { keysIn: number[]; keysOut: number[] } {
  return { keysIn: Array.from({ length: size }, (_, s) => 1000 * s + rank + 1), keysOut: Array.from({ length: size }, (_, d) => 1000 * rank + d + 1) };
}

function machine(size: number, opts: Partial<MembershipOptions> = {}): Membership {
  const m = new Membership({ size, channelKeys: channelKeys(size), identity: id, heartbeatIdentity, ...opts });
  m.step({ kind: "start", nowMs: 0 });
  return m;
}

function hello(rank: number, attempt = 0, size = 3): RankToCoordinator {
  return { t: "hello", rank, attempt, pid: 100 + rank, endpoint: `tcp://h:${rank}.${attempt}`, size };
}

/** Feeds `msg` as sent by routing identity `from` (default: the rank's own incarnation `attempt`). */
function from(m: Membership, msg: RankToCoordinator, identity?: string): MembershipEffect[] {
  const attempt = "attempt" in msg ? msg.attempt : m.link(msg.rank).attempt;
  return m.step({ kind: "message", identity: identity ?? id(msg.rank, attempt), msg });
}

const sends = (effects: readonly MembershipEffect[]): { to: string; msg: CoordinatorToRank }[] =>
  effects.flatMap((e) => (e.kind === "send" ? [{ to: e.to, msg: e.msg }] : []));
const events = (effects: readonly MembershipEffect[]): CoordinatorEvent[] => effects.flatMap((e) => (e.kind === "event" ? [e.event] : []));
const warnings = (effects: readonly MembershipEffect[]): string[] => events(effects).flatMap((e) => (e.kind === "warning" ? [e.message] : []));

/** A job of `size` ranks past its rendezvous (tables sent). */
function running(size: number, opts: Partial<MembershipOptions> = {}): Membership {
  const m = machine(size, opts);
  for (let r = 0; r < size; r++) from(m, hello(r, 0, size));
  expect(m.phase).toBe("running");
  return m;
}

describe("membership: rendezvous", () => {
  it("sends the tables once every rank said hello, in any order, endpoints by rank", () => {
    for (const order of [
      [0, 1, 2],
      [2, 0, 1],
      [1, 2, 0],
    ]) {
      const m = machine(3, { hosts: [0, 0, 1], mode: "cpr" });
      const all: MembershipEffect[] = [];
      for (const r of order) {
        expect(sends(all), "no table before everyone is up").toEqual([]);
        all.push(...from(m, hello(r)));
      }
      const table = (r: number) => ({
        t: "table",
        ...keysOf(r, 3),
        endpoints: ["tcp://h:0.0", "tcp://h:1.0", "tcp://h:2.0"],
        attempts: [0, 0, 0],
        hosts: [0, 0, 1],
        mode: "cpr",
      });
      expect(sends(all)).toEqual([0, 1, 2].map((r) => ({ to: id(r, 0), msg: table(r) })));
      expect(events(all).map((e) => e.kind)).toEqual(["rank-up", "rank-up", "rank-up", "ready"]);
      expect(
        events(all)
          .filter((e) => e.kind === "rank-up")
          .map((e) => (e as { rank: number }).rank),
      ).toEqual(order);
    }
  });

  it("adds the owner's fields to each rank's table (tableFor)", () => {
    const m = machine(2, { tableFor: (rank) => ({ partner: 1 - rank }) });
    from(m, hello(0, 0, 2));
    const tables = sends(from(m, hello(1, 0, 2)));
    expect(tables.map((s) => (s.msg as { partner?: number }).partner)).toEqual([1, 0]);
  });

  it("refuses a second hello, a hello of another job size, and one from another routing id", () => {
    const m = machine(3);
    from(m, hello(0));
    expect(warnings(from(m, hello(0)))).toEqual([expect.stringMatching(/second hello from rank 0/)]);
    expect(warnings(from(m, hello(1, 0, 9)))).toEqual([expect.stringMatching(/job of size 9/)]);
    expect(warnings(from(m, hello(1), "stray"))).toEqual([expect.stringMatching(/routing id "stray" \(expected "r1\.0"\)/)]);
    expect(m.missingRanks()).toEqual([1, 2]);
  });

  it("refuses the hellos of an old attempt once a new one is expected", () => {
    const m = running(2, { rendezvousTimeoutMs: 1000 });
    m.step({ kind: "restart-round", attempts: [1, 1], nowMs: 10 });
    const effects = from(m, hello(0, 0, 2));
    expect(warnings(effects)).toEqual([expect.stringMatching(/attempt 0; expected attempt 1/)]);
    expect(sends(effects)).toEqual([]);
    expect(m.link(0).up).toBe(false);
  });

  it("times out at the deadline given by the clock, naming the ranks missing", () => {
    const m = new Membership({ size: 3, channelKeys: channelKeys(3), identity: id, heartbeatIdentity, rendezvousTimeoutMs: 500 });
    m.step({ kind: "start", nowMs: 1000 });
    from(m, hello(1));
    expect(m.rendezvousDeadlineMs).toBe(1500);
    expect(m.step({ kind: "tick", nowMs: 1499 })).toEqual([]);
    expect(events(m.step({ kind: "tick", nowMs: 1500 }))).toEqual([{ kind: "rendezvous-timeout", missing: [0, 2], timeoutMs: 500 }]);
    expect(m.step({ kind: "tick", nowMs: 9999 }), "reported once").toEqual([]);
  });
});

describe("membership: tables prepared by the owner", () => {
  it("asks for the preparation, sends the tables only when told it is done, and reports a failure", () => {
    const m = machine(2, { prepareTables: true });
    from(m, hello(0, 0, 2));
    const effects = from(m, hello(1, 0, 2));
    expect(effects.filter((e) => e.kind === "prepare-tables")).toEqual([{ kind: "prepare-tables", round: 0 }]);
    expect(sends(effects)).toEqual([]);
    // Meanwhile the ranks' messages flow as usual.
    expect(events(from(m, { t: "cpr-held", rank: 1, parts: [] }))).toEqual([{ kind: "cpr", rank: 1, msg: { t: "cpr-held", rank: 1, parts: [] } }]);
    const done = m.step({ kind: "tables-prepared", round: 0 });
    expect(sends(done).map((s) => s.msg.t)).toEqual(["table", "table"]);
    expect(events(done)).toEqual([{ kind: "ready", endpoints: ["tcp://h:0.0", "tcp://h:1.0"] }]);

    const failing = machine(1, { prepareTables: true });
    from(failing, hello(0, 0, 1));
    expect(events(failing.step({ kind: "tables-failed", round: 0, code: "CPR_RESTORE", message: "no copy" }))).toEqual([
      { kind: "tables-failed", code: "CPR_RESTORE", message: "no copy" },
    ]);
  });

  it("a preparation superseded by a newer round sends nothing and reports nothing", () => {
    const m = machine(2, { prepareTables: true });
    from(m, hello(0, 0, 2));
    from(m, hello(1, 0, 2));
    m.step({ kind: "restart-round", attempts: [1, 1], nowMs: 0 });
    expect(m.step({ kind: "tables-prepared", round: 0 })).toEqual([]);
    expect(m.step({ kind: "tables-failed", round: 0, code: "CPR_RESTORE", message: "late" })).toEqual([]);
    from(m, hello(0, 1, 2));
    expect(from(m, hello(1, 1, 2)).filter((e) => e.kind === "prepare-tables")).toEqual([{ kind: "prepare-tables", round: 1 }]);
    expect(sends(m.step({ kind: "tables-prepared", round: 1 })).map((s) => [s.to, s.msg.t])).toEqual([
      [id(0, 1), "table"],
      [id(1, 1), "table"],
    ]);
  });
});

describe("membership: results and aborts", () => {
  it("releases every rank only when all have finalized; a second finalize is refused", () => {
    const m = running(3);
    const result = (rank: number, v: unknown): RankToCoordinator => ({ t: "finalize", rank, result: encodeValue(v) });
    expect(events(from(m, result(2, "c")))).toEqual([{ kind: "finalized", rank: 2, result: "c" }]);
    expect(warnings(from(m, result(2, "c")))).toEqual([expect.stringMatching(/second finalize from rank 2/)]);
    expect(sends(from(m, result(0, "a")))).toEqual([]);
    const last = from(m, result(1, "b"));
    expect(sends(last)).toEqual([0, 1, 2].map((r) => ({ to: id(r, 0), msg: { t: "release" } })));
    expect(events(last).map((e) => e.kind)).toEqual(["finalized", "released"]);
    expect(m.phase).toBe("released");
    expect(m.links.map((l) => l.result)).toEqual(["a", "b", "c"]);
  });

  it("reports a result it cannot decode instead of inventing one", () => {
    const m = running(1);
    const effects = from(m, { t: "finalize", rank: 0, result: new Uint8Array([0xc1]) });
    expect(events(effects)).toEqual([expect.objectContaining({ kind: "bad-result", rank: 0 })]);
    expect(m.link(0).finalized).toBe(false);
  });

  it("sends an abort only to the ranks up", () => {
    const m = machine(3);
    from(m, hello(0));
    from(m, hello(2));
    expect(sends(m.step({ kind: "abort", code: "LAUNCH_RANK_FAILED", message: "rank 1 died" }))).toEqual(
      [0, 2].map((r) => ({ to: id(r, 0), msg: { t: "abort", code: "LAUNCH_RANK_FAILED", message: "rank 1 died" } })),
    );
    expect(m.phase).toBe("aborted");
    // A rank down (retry-one) is not told either.
    const r = running(3);
    r.step({ kind: "rank-down", rank: 1, attempt: 0 });
    expect(sends(r.step({ kind: "abort", code: "X", message: "y" })).map((s) => s.to)).toEqual([id(0, 0), id(2, 0)]);
  });

  it("relays a rank's own abort, its steps and its coordinated-checkpoint messages to the owner", () => {
    const m = running(2);
    const aborted = from(m, { t: "abort", rank: 1, code: "MPI_COLLECTIVE_MISMATCH", message: "bcast root" });
    expect(events(aborted)).toEqual([{ kind: "rank-abort", rank: 1, code: "MPI_COLLECTIVE_MISMATCH", message: "bcast root" }]);
    // The rank holds its program's failure (and so its exit) until the abort is confirmed.
    expect(sends(aborted)).toEqual([{ to: id(1, 0), msg: { t: "abort-heard" } }]);
    expect(events(from(m, { t: "step", rank: 0, steps: 3, epoch: 1 }))).toEqual([{ kind: "step", rank: 0, steps: 3, epoch: 1 }]);
    expect(m.link(0).steps).toBe(3);
    expect(warnings(from(m, { t: "cpr-ready", rank: 0 } as never))).toEqual([expect.stringMatching(/cpr-ready needs an epoch count/)]);
    expect(warnings(from(m, { t: "step", rank: 1, steps: 1, epoch: 0 }, id(0, 0)))).toEqual([expect.stringMatching(/claiming rank 1 from "r0\.0" \(rank 0\)/)]);
  });
});

describe("membership: retry-one", () => {
  it("a rank down: the others get peer-down; its rejoin gets the table with the ranks down, the others get peer", () => {
    const m = running(4);
    const down = m.step({ kind: "rank-down", rank: 1, attempt: 0 });
    expect(sends(down)).toEqual([0, 2, 3].map((r) => ({ to: id(r, 0), msg: { t: "peer-down", rank: 1, attempt: 0 } })));
    m.step({ kind: "rank-down", rank: 3, attempt: 0 });
    m.step({ kind: "restart-rank", rank: 1, attempt: 1 });
    m.step({ kind: "restart-rank", rank: 3, attempt: 1 });
    const back = from(m, hello(1, 1, 4));
    expect(events(back)).toEqual([{ kind: "rank-up", rank: 1, attempt: 1, pid: 101, endpoint: "tcp://h:1.1" }]);
    expect(sends(back)).toEqual([
      {
        to: id(1, 1),
        // Rank 3 is restarted but not back: still its dead incarnation here, and down.
        msg: { t: "table", ...keysOf(1, 4), endpoints: ["tcp://h:0.0", "tcp://h:1.1", "tcp://h:2.0", ""], attempts: [0, 1, 0, 0], down: [3], reached: 0 },
      },
      ...[0, 2].map((r) => ({ to: id(r, 0), msg: { t: "peer", rank: 1, endpoint: "tcp://h:1.1", attempt: 1 } })),
    ]);
    expect(m.phase).toBe("running");
  });

  it("a restart of every rank (retry-one's durable floor) forgets the single restarts of the execution given up", () => {
    const m = running(3);
    m.step({ kind: "rank-down", rank: 1, attempt: 0 });
    m.step({ kind: "restart-rank", rank: 1, attempt: 1 });
    m.step({ kind: "rank-down", rank: 2, attempt: 0 });
    m.step({ kind: "round-over" });
    m.step({ kind: "restart-round", attempts: [2, 2, 2], nowMs: 0 });
    for (let r = 0; r < 3; r++) from(m, hello(r, 2, 3));
    expect(m.phase).toBe("running");
    // Later, rank 0 alone restarts: its table names no rank down and no position reached.
    m.step({ kind: "rank-down", rank: 0, attempt: 2 });
    m.step({ kind: "restart-rank", rank: 0, attempt: 3 });
    const back = sends(from(m, hello(0, 3, 3)));
    expect(back[0]!.msg).toMatchObject({ t: "table", attempts: [3, 2, 2], down: [], reached: 0 });
  });

  it("the dead incarnation's last messages are dropped quietly; the release waits for the new one's result", () => {
    const m = running(2);
    from(m, { t: "finalize", rank: 1, result: encodeValue(1) });
    m.step({ kind: "rank-down", rank: 1, attempt: 0 });
    expect(from(m, { t: "step", rank: 1, steps: 9, epoch: 0 }, id(1, 0))).toEqual([]);
    expect(from(m, { t: "heartbeat", rank: 1, attempt: 0 }, heartbeatIdentity(1, 0))).toEqual([]);
    m.step({ kind: "restart-rank", rank: 1, attempt: 1 });
    from(m, hello(1, 1, 2));
    expect(sends(from(m, { t: "finalize", rank: 0, result: encodeValue(0) }))).toEqual([]);
    expect(sends(from(m, { t: "finalize", rank: 1, result: encodeValue(1) })).map((s) => s.to)).toEqual([id(0, 0), id(1, 1)]);
  });

  it("a rank-down of an incarnation already replaced, or before the job runs, changes nothing", () => {
    const m = running(2);
    m.step({ kind: "rank-down", rank: 0, attempt: 0 });
    m.step({ kind: "restart-rank", rank: 0, attempt: 1 });
    expect(m.step({ kind: "rank-down", rank: 0, attempt: 0 })).toEqual([]);
    const early = machine(2);
    from(early, hello(0, 0, 2));
    expect(early.step({ kind: "rank-down", rank: 0, attempt: 0 })).toEqual([]);
    // Restarted before the job started: its new hello counts in the rendezvous.
    early.step({ kind: "restart-rank", rank: 0, attempt: 1 });
    from(early, hello(1, 0, 2));
    expect(early.phase).toBe("rendezvous");
    expect(sends(from(early, hello(0, 1, 2))).map((s) => s.to)).toEqual([id(0, 1), id(1, 0)]);
  });
});

describe("membership: cpr restart rounds", () => {
  it("a new round ignores the old identities and sends the tables of the new attempts", () => {
    const m = running(2);
    m.step({ kind: "restart-round", attempts: [1, 1], nowMs: 0 });
    expect(m.phase).toBe("rendezvous");
    // The old incarnations' messages are not accepted (neither results nor steps).
    const old = from(m, { t: "finalize", rank: 0, result: encodeValue(0) }, id(0, 0));
    expect(events(old)).toEqual([{ kind: "warning", message: expect.stringMatching(/"r0\.0", which has not said hello/) }]);
    from(m, hello(0, 1, 2));
    const effects = from(m, hello(1, 1, 2));
    expect(sends(effects).map((s) => [s.to, (s.msg as { attempts?: number[] }).attempts])).toEqual([
      [id(0, 1), [1, 1]],
      [id(1, 1), [1, 1]],
    ]);
    expect(m.links.map((l) => l.identity)).toEqual([id(0, 1), id(1, 1)]);
  });

  it("once a restart of all is decided (round-over), a late finalize of the dying attempt releases nothing; then a new round", () => {
    const m = running(2);
    from(m, { t: "finalize", rank: 0, result: encodeValue(0) });
    m.step({ kind: "round-over" });
    expect(m.phase).toBe("restarting");
    // Rank 1, cut off and declared dead, delivers its finalize after the partition heals.
    const late = from(m, { t: "finalize", rank: 1, result: encodeValue(1) }, id(1, 0));
    expect(events(late)).toEqual([]);
    expect(sends(late)).toEqual([]);
    expect(sends(from(m, { t: "heartbeat", rank: 1, attempt: 0 }, heartbeatIdentity(1, 0)))).toEqual([]); // no lease either
    m.step({ kind: "restart-round", attempts: [1, 1], nowMs: 0 });
    from(m, hello(0, 1, 2));
    expect(events(from(m, hello(1, 1, 2))).map((e) => e.kind)).toEqual(["rank-up", "ready"]);
  });

  it("answers a watchdog's heartbeat with a lease for the current incarnation only", () => {
    const m = running(2);
    expect(sends(from(m, { t: "heartbeat", rank: 1, attempt: 0 }, heartbeatIdentity(1, 0)))).toEqual([{ to: heartbeatIdentity(1, 0), msg: { t: "lease" } }]);
    // A heartbeat on the rank's own control link is liveness, with no lease.
    expect(sends(from(m, { t: "heartbeat", rank: 1, attempt: 0 }, id(1, 0)))).toEqual([]);
    m.step({ kind: "restart-round", attempts: [1, 1], nowMs: 0 });
    const stale = from(m, { t: "heartbeat", rank: 1, attempt: 0 }, heartbeatIdentity(1, 0));
    expect(sends(stale)).toEqual([]);
    expect(events(stale).some((e) => e.kind === "heartbeat")).toBe(false);
    // The new incarnation's watchdog beats before its hello: accepted.
    expect(sends(from(m, { t: "heartbeat", rank: 1, attempt: 1 }, heartbeatIdentity(1, 1)))).toEqual([{ to: heartbeatIdentity(1, 1), msg: { t: "lease" } }]);
  });
});

describe("membership: stray traffic", () => {
  it("caps its warnings and counts the rest", () => {
    const m = machine(1, { warningsMax: 3 });
    const all = Array.from({ length: 5 }, () => m.step({ kind: "stray", message: "garbage" })).flatMap(warnings);
    expect(all).toEqual(["garbage", "garbage", "garbage (further warnings about stray control traffic are suppressed)"]);
    expect(m.suppressedWarningCount).toBe(2);
  });

  it("reads nothing before the start or after the close", () => {
    const m = new Membership({ size: 1, channelKeys: channelKeys(1), identity: id, heartbeatIdentity });
    expect(from(m, hello(0, 0, 1))).toEqual([]);
    m.step({ kind: "start", nowMs: 0 });
    m.step({ kind: "close" });
    expect(from(m, hello(0, 0, 1))).toEqual([]);
    expect(m.step({ kind: "abort", code: "X", message: "y" })).toEqual([]);
  });
});

describe("membership: identity bound to the incarnation's token", () => {
  // As the coordinator runs it with keys: each incarnation's routing ids carry its token.
  const token = (rank: number, attempt: number): string => `t${rank}x${attempt}`.padEnd(32, "0");
  const ided = (size: number) =>
    machine(size, {
      identity: (r, a) => id(r, a, token(r, a)),
      heartbeatIdentity: (r, a) => heartbeatIdentity(r, a, token(r, a)),
    });

  it("a hello, heartbeat, step or abort counts only over the incarnation's own routing id; warnings never show a token", () => {
    const m = ided(2);
    const all: MembershipEffect[] = [];
    // A stranger (no token), a guess, and rank 1's own token used for rank 0: none counts.
    all.push(...from(m, hello(0, 0, 2), "r0.0"));
    all.push(...from(m, hello(0, 0, 2), "r0.0/0123456789abcdef0123456789abcdef"));
    all.push(...from(m, hello(0, 0, 2), id(1, 0, token(1, 0))));
    all.push(...from(m, { t: "heartbeat", rank: 0, attempt: 0 }, "hb:r0.0"));
    all.push(...from(m, { t: "abort", rank: 0, code: "X", message: "forged" }, "r0.0"));
    expect(events(all).filter((e) => e.kind !== "warning")).toEqual([]);
    expect(m.missingRanks()).toEqual([0, 1]);
    for (const w of warnings(all)) expect(w).not.toMatch(/t[01]x0|0123456789abcdef/);
    expect(warnings(all)[0]).toMatch(/routing id "r0\.0" \(expected "r0\.0\/…"\)/);

    from(m, hello(0, 0, 2), id(0, 0, token(0, 0)));
    from(m, hello(1, 0, 2), id(1, 0, token(1, 0)));
    expect(m.phase).toBe("running");
    // Rank 1, up, speaks for rank 0: refused. Rank 0's watchdog beats for itself: counted.
    const claims = [
      ...from(m, { t: "step", rank: 0, steps: 9, epoch: 0 }, id(1, 0, token(1, 0))),
      ...from(m, { t: "abort", rank: 0, code: "X", message: "blame rank 0" }, id(1, 0, token(1, 0))),
      ...from(m, { t: "heartbeat", rank: 0, attempt: 0 }, heartbeatIdentity(1, 0, token(1, 0))),
    ];
    expect(events(claims).filter((e) => e.kind !== "warning")).toEqual([]);
    expect(warnings(claims)).toEqual([
      expect.stringMatching(/step message claiming rank 0 from "r1\.0\/…" \(rank 1\)/),
      expect.stringMatching(/abort message claiming rank 0 from "r1\.0\/…" \(rank 1\)/),
      expect.stringMatching(/heartbeat message from "hb:r1\.0\/…", which has not said hello/),
    ]);
    expect(events(from(m, { t: "heartbeat", rank: 0, attempt: 0 }, heartbeatIdentity(0, 0, token(0, 0))))).toEqual([{ kind: "heartbeat", rank: 0 }]);
  });

  it("a restarted rank's new incarnation replaces the old one: the old routing ids count no more", () => {
    const m = ided(2);
    from(m, hello(0, 0, 2), id(0, 0, token(0, 0)));
    from(m, hello(1, 0, 2), id(1, 0, token(1, 0)));
    m.step({ kind: "rank-down", rank: 1, attempt: 0 });
    m.step({ kind: "restart-rank", rank: 1, attempt: 1 });
    expect(events(from(m, { t: "heartbeat", rank: 1, attempt: 0 }, heartbeatIdentity(1, 0, token(1, 0))))).toEqual([]);
    expect(events(from(m, { t: "abort", rank: 1, code: "X", message: "old" }, id(1, 0, token(1, 0))))).toEqual([]);
    expect(warnings(from(m, hello(1, 1, 2), id(1, 0, token(1, 0))))).toEqual([
      expect.stringMatching(/ignored hello for rank 1 attempt 1 from routing id "r1\.0\/…"/),
    ]);
    expect(events(from(m, hello(1, 1, 2), id(1, 1, token(1, 1)))).map((e) => e.kind)).toEqual(["rank-up"]);
  });
});
