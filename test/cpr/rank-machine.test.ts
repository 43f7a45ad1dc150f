/**
 * Goal: the rank side of coordinated checkpointing (src/cpr/coordinated/rank.ts) follows the
 * protocol of Bronevetsky et al. (PPoPP 2003): checkpoint when due, late/early/intra-epoch classification at arrival,
 * markers with sent counts, readyToStopRecording, both ways to stop recording, the
 * non-determinism log and its replay, and suppression of early re-sends.
 *
 * Method: drive pure machines by hand (no I/O, no timers) and check their effects.
 */
import { describe, expect, it } from "vitest";
import { RankMachine, type RankEffect } from "../../src/cpr/coordinated/rank.ts";

const kinds = (effects: readonly RankEffect[]): string[] => effects.map((e) => (e.kind === "control" ? e.msg.t : e.kind));

describe("RankMachine", () => {
  it("pleaseCheckpoint makes a checkpoint due; taking it moves to the next epoch, records, and sends markers with sent counts", () => {
    const m = new RankMachine({ rank: 1, size: 3 });
    m.stamp(0);
    m.stamp(0);
    m.stamp(2);
    expect(m.checkpointDue).toBe(false);
    m.onControl({ t: "cpr-checkpoint", epoch: 1 });
    expect(m.checkpointDue).toBe(true);
    const eff = m.takeCheckpoint();
    expect(m.epoch).toBe(1);
    expect(m.recording).toBe(true);
    expect(m.checkpointDue).toBe(false);
    expect(eff).toContainEqual({ kind: "marker", dest: 0, epoch: 1, sent: 2 });
    expect(eff).toContainEqual({ kind: "marker", dest: 2, epoch: 1, sent: 1 });
    expect(kinds(eff)).toContain("cpr-checkpointed");
  });

  it("a message of a newer epoch is early: its id is remembered for our checkpoint and a checkpoint is due", () => {
    const m = new RankMachine({ rank: 0, size: 2 });
    const r = m.arrive({ source: 1, epoch: 1, recording: true, channelSeq: 7 }, undefined);
    expect(r.verdict).toBe("early");
    expect(m.checkpointDue).toBe(true);
    m.takeCheckpoint();
    expect(m.earlyFrom(1)).toEqual([7]);
  });

  it("a message of an older epoch after our checkpoint is late and logged; readiness needs every peer's marker, whose count must match", () => {
    const m = new RankMachine({ rank: 0, size: 3 });
    m.arrive({ source: 1, epoch: 0, recording: false, channelSeq: 0 }, "a");
    m.onControl({ t: "cpr-checkpoint", epoch: 1 });
    m.takeCheckpoint();
    expect(m.arrive({ source: 1, epoch: 0, recording: false, channelSeq: 1 }, "late-1").verdict).toBe("late");
    expect(m.onMarker(1, 1, 2)).toEqual([]); // 2 sent in epoch 0, 2 arrived: fine, rank 2 still missing
    const eff = m.onMarker(2, 1, 0);
    expect(kinds(eff)).toEqual(["cpr-ready"]);
    expect(m.partLogs().lateLog).toEqual(["late-1"]);
  });

  it("a marker whose count disagrees with the arrivals is a protocol error", () => {
    const m = new RankMachine({ rank: 0, size: 2 });
    m.onControl({ t: "cpr-checkpoint", epoch: 1 });
    m.takeCheckpoint();
    expect(kinds(m.onMarker(1, 1, 3))).toContain("fatal");
  });

  it("a marker that arrives before our own checkpoint counts once we take it", () => {
    const m = new RankMachine({ rank: 0, size: 2 });
    expect(m.onMarker(1, 1, 0)).toEqual([]);
    expect(m.checkpointDue).toBe(true);
    expect(kinds(m.takeCheckpoint())).toEqual(["cpr-checkpointed", "marker", "cpr-ready"]);
  });

  it("stops recording on stopRecording, and before delivering a same-epoch message from a rank that stopped", () => {
    const a = new RankMachine({ rank: 0, size: 2 });
    a.onControl({ t: "cpr-checkpoint", epoch: 1 });
    a.takeCheckpoint();
    expect(kinds(a.onControl({ t: "cpr-stop", epoch: 1 }))).toEqual(["write-part"]);
    expect(a.recording).toBe(false);
    const b = new RankMachine({ rank: 1, size: 2 });
    b.onControl({ t: "cpr-checkpoint", epoch: 1 });
    b.takeCheckpoint();
    const r = b.arrive({ source: 0, epoch: 1, recording: false, channelSeq: 0 }, undefined);
    expect(r.verdict).toBe("normal");
    expect(kinds(r.effects)).toEqual(["write-part"]);
    expect(b.recording).toBe(false);
  });

  it("logs non-deterministic outcomes by ordinal while recording, and a restored machine replays them, then runs freely", () => {
    const m = new RankMachine({ rank: 0, size: 1 });
    m.onControl({ t: "cpr-checkpoint", epoch: 1 });
    m.takeCheckpoint();
    const t0 = m.nondet("value");
    const t1 = m.nondet("match");
    m.logNondet(t1.ordinal, { k: "match", source: 3, tag: 9 });
    m.logNondet(t0.ordinal, { k: "value", v: 0.25 });
    m.onControl({ t: "cpr-stop", epoch: 1 });
    m.logNondet(m.nondet("value").ordinal, { k: "value", v: 1 }); // after the stop: not logged
    const logs = m.partLogs();
    expect(logs.nondet).toEqual([
      [0, { k: "value", v: 0.25 }],
      [1, { k: "match", source: 3, tag: 9 }],
    ]);

    const r = new RankMachine({ rank: 0, size: 1 });
    r.restore({ epoch: 1, earlyIds: [], nondet: logs.nondet });
    expect(r.epoch).toBe(1);
    expect(r.recording).toBe(false);
    expect(r.nondet("value").replay).toEqual({ k: "value", v: 0.25 });
    expect(r.nondet("match").replay).toEqual({ k: "match", source: 3, tag: 9 });
    expect(r.replaying).toBe(false);
    expect(r.nondet("value").replay).toBeUndefined();
  });

  it("a rank restored from a line without non-deterministic events is not replaying: it takes the next checkpoint it is asked for", () => {
    // Regression: an empty replay log used to count as a replay that never ended, so a job
    // restored from such a line (the heat stencil) committed no line after a restart.
    const r = new RankMachine({ rank: 0, size: 2 });
    r.restore({ epoch: 3, earlyIds: [], nondet: [] });
    expect(r.replaying).toBe(false);
    r.onControl({ t: "cpr-checkpoint", epoch: 4 });
    expect(r.mayCheckpoint).toBe(true);
    r.takeCheckpoint();
    expect(r.epoch).toBe(4);
  });

  it("a replay that meets another kind of call than logged reports CPR_REPLAY", () => {
    const r = new RankMachine({ rank: 0, size: 1 });
    r.restore({ epoch: 1, earlyIds: [], nondet: [[0, { k: "value", v: 1 }]] });
    const t = r.nondet("any");
    expect(t.replay).toBeUndefined();
    expect(t.effects).toMatchObject([{ kind: "fatal", code: "CPR_REPLAY" }]);
  });

  it("suppresses exactly the re-sends a peer reported holding, and counts them as sent", () => {
    const m = new RankMachine({ rank: 0, size: 2 });
    m.restore({ epoch: 2, earlyIds: [], nondet: [] });
    m.addSuppress(1, [4, 5]);
    expect(m.suppress(1, 3)).toBe(false);
    expect(m.suppress(1, 4)).toBe(true);
    expect(m.suppress(1, 4)).toBe(false);
    expect(m.suppress(1, 5)).toBe(true);
    expect(m.suppressedCount).toBe(2);
  });

  it("a restored rank counts the early frames it holds as arrived, so the next marker's count matches the sender's (which counts suppressed sends)", () => {
    const recv = new RankMachine({ rank: 0, size: 2 });
    recv.restore({
      epoch: 1,
      earlyIds: [
        [1, 0],
        [1, 1],
      ],
      nondet: [],
    });
    recv.arrive({ source: 1, epoch: 1, recording: false, channelSeq: 2 }, undefined);
    recv.onControl({ t: "cpr-checkpoint", epoch: 2 });
    recv.takeCheckpoint();
    expect(kinds(recv.onMarker(1, 2, 3))).toEqual(["cpr-ready"]);
  });

  it("epochs more than one apart, and late messages after recording stopped, are protocol errors", () => {
    const m = new RankMachine({ rank: 0, size: 2 });
    expect(kinds(m.arrive({ source: 1, epoch: 2, recording: true, channelSeq: 0 }, undefined).effects)).toEqual(["fatal"]);
    m.restore({ epoch: 3, earlyIds: [], nondet: [] });
    expect(kinds(m.arrive({ source: 1, epoch: 2, recording: false, channelSeq: 0 }, undefined).effects)).toEqual(["fatal"]);
  });
});

describe("RankMachine: polls of requests (test()/done)", () => {
  const frame = { header: Buffer.alloc(40, 1), body: [Buffer.from(new Float64Array([1.5, -2]).buffer)] };
  const recording = (): RankMachine => {
    const m = new RankMachine({ rank: 0, size: 2, nondetEntriesMax: 4 });
    m.onControl({ t: "cpr-checkpoint", epoch: 1 });
    m.takeCheckpoint();
    return m;
  };

  it("a polling loop's 'not done' outcomes cost no memory: only the last one is kept, so the log still reaches it", () => {
    const m = recording();
    for (let i = 0; i < 1000; i++) m.logNondet(m.nondet("test").ordinal, { k: "test", done: false }); // far past nondetEntriesMax 4
    expect(m.logNondet(m.nondet("test").ordinal, { k: "test", done: true, msg: frame })).toEqual([]);
    for (let i = 0; i < 10; i++) m.logNondet(m.nondet("test").ordinal, { k: "test", done: false });
    m.onControl({ t: "cpr-stop", epoch: 1 });
    const { nondet } = m.partLogs();
    expect(nondet).toEqual([
      [1000, { k: "test", done: true, msg: frame }],
      [1010, { k: "test", done: false }],
    ]);
  });

  it("a restored machine replays every poll up to the log's end ('not done' where the log has no entry, the message where it has one), then runs freely", () => {
    const r = new RankMachine({ rank: 0, size: 2 });
    r.restore({
      epoch: 1,
      earlyIds: [],
      nondet: [
        [2, { k: "test", done: true, msg: frame }],
        [3, { k: "value", v: 7 }],
        [5, { k: "test", done: false }],
      ],
    });
    expect(r.nondet("test").replay).toEqual({ k: "test", done: false });
    expect(r.nondet("test").replay).toEqual({ k: "test", done: false });
    const done = r.nondet("test").replay;
    expect(done).toEqual({ k: "test", done: true, msg: frame });
    expect(r.nondet("value").replay).toEqual({ k: "value", v: 7 });
    expect(r.nondet("test").replay).toEqual({ k: "test", done: false }); // #4: implied
    expect(r.replaying).toBe(true);
    expect(r.nondet("test").replay).toEqual({ k: "test", done: false }); // #5: the log's end
    expect(r.replaying).toBe(false);
    expect(r.nondet("test").replay).toBeUndefined();
  });

  it("a missing ordinal of another kind is not a poll: it runs freely (a wildcard match logged after the stop)", () => {
    const r = new RankMachine({ rank: 0, size: 2 });
    r.restore({ epoch: 1, earlyIds: [], nondet: [[1, { k: "test", done: true }]] });
    expect(r.nondet("match").replay).toBeUndefined();
    expect(r.nondet("test").replay).toEqual({ k: "test", done: true });
  });

  it("the bound counts only polls that saw a message; past it the recording is abandoned, and later polls are not logged", () => {
    const m = recording();
    for (let i = 0; i < 4; i++) expect(m.logNondet(m.nondet("test").ordinal, { k: "test", done: true, msg: frame })).toEqual([]);
    expect(m.logNondet(m.nondet("test").ordinal, { k: "test", done: true, msg: frame })).toMatchObject([{ kind: "abandon", epoch: 1 }]);
    expect(m.recording).toBe(false);
    m.logNondet(m.nondet("test").ordinal, { k: "test", done: false });
    expect(m.partLogs().nondet).toEqual([]);
  });
});

describe("RankMachine: a recording that never stops is abandoned (bounded memory, the line aborted, the job goes on)", () => {
  const start = (): RankMachine => {
    const m = new RankMachine({ rank: 0, size: 3 });
    m.arrive({ source: 1, epoch: 0, recording: false, channelSeq: 0 }, undefined);
    m.onControl({ t: "cpr-checkpoint", epoch: 1 });
    m.takeCheckpoint();
    return m;
  };

  it("the recording timeout abandons the round: logs dropped, abandon effect (the driver warns and reports the part failed), no part written", () => {
    const m = start();
    m.arrive({ source: 1, epoch: 0, recording: false, channelSeq: 1 }, "late");
    m.logNondet(m.nondet("value").ordinal, { k: "value", v: 3 });
    const eff = m.onRecordingTimeout(1, 120_000);
    expect(eff).toEqual([{ kind: "abandon", epoch: 1, reason: expect.stringMatching(/did not stop within 120000 ms/) }]);
    expect(m.recording).toBe(false);
    expect(m.partLogs()).toEqual({ earlyIds: [], lateLog: [], nondet: [] });
    // A stop or a second timer for it later changes nothing.
    expect(m.onControl({ t: "cpr-stop", epoch: 1 })).toEqual([]);
    expect(m.onRecordingTimeout(1, 120_000)).toEqual([]);
  });

  it("a timer of a round that already stopped, or of an older epoch, is ignored", () => {
    const m = start();
    m.onControl({ t: "cpr-stop", epoch: 1 });
    expect(m.onRecordingTimeout(1, 1000)).toEqual([]);
    expect(m.onRecordingTimeout(0, 1000)).toEqual([]);
  });

  it("after abandoning, late frames of the old epoch are delivered unlogged and markers of the abandoned epoch ignored (no protocol error)", () => {
    const m = start();
    m.onRecordingTimeout(1, 1000);
    const late = m.arrive({ source: 1, epoch: 0, recording: false, channelSeq: 1 }, "late");
    expect(late).toEqual({ verdict: "normal", effects: [] });
    expect(m.onMarker(1, 1, 2)).toEqual([]);
    expect(m.onMarker(2, 1, 0)).toEqual([]);
    expect(m.partLogs().lateLog).toEqual([]);
    // Memory stays bounded however long the peers keep sending: nothing is kept.
    for (let i = 0; i < 1000; i++) m.logNondet(m.nondet("value").ordinal, { k: "value", v: i });
    expect(m.partLogs().nondet).toEqual([]);
  });

  it("the next round runs normally after an abandoned one", () => {
    const m = start();
    m.onRecordingTimeout(1, 1000);
    m.onMarker(1, 1, 2);
    m.onMarker(2, 1, 0);
    m.onControl({ t: "cpr-checkpoint", epoch: 2 });
    expect(m.checkpointDue).toBe(true);
    expect(kinds(m.takeCheckpoint())).toEqual(["cpr-checkpointed", "marker", "marker"]);
    expect(m.recording).toBe(true);
    expect(kinds(m.onMarker(1, 2, 0))).toEqual([]);
    expect(kinds(m.onMarker(2, 2, 0))).toEqual(["cpr-ready"]);
    expect(kinds(m.onControl({ t: "cpr-stop", epoch: 2 }))).toEqual(["write-part"]);
  });

  it("too many non-deterministic outcomes abandon the recording instead of failing the job", () => {
    const m = new RankMachine({ rank: 0, size: 1, nondetEntriesMax: 2 });
    m.onControl({ t: "cpr-checkpoint", epoch: 1 });
    m.takeCheckpoint();
    m.logNondet(m.nondet("value").ordinal, { k: "value", v: 1 });
    m.logNondet(m.nondet("value").ordinal, { k: "value", v: 2 });
    expect(kinds(m.logNondet(m.nondet("value").ordinal, { k: "value", v: 3 }))).toEqual(["abandon"]);
    expect(m.recording).toBe(false);
  });
});
