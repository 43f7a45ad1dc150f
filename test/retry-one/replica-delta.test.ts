/**
 * Goal: a checkpoint goes to a successor that holds the rank's safe checkpoint as what it adds
 * to that one, and the successor holds the whole checkpoint again; a successor that cannot
 * (it lacks the base) asks for it whole and gets it. Method: the sender log's codec on packed
 * checkpoints built by hand (the same shape as the retry-one mode's), and two rank machines
 * driven by hand with a codec that records its calls. The simulator's swarms
 * (test/sim/retry-one.sim.test.ts) run the codec inside real Worlds, with crashes.
 */
import { describe, expect, it } from "vitest";
import { LifelineError } from "../../src/errors.ts";
import { RetryOneRank } from "../../src/cpr/retry-one/rank.ts";
import type { Lazy, ProtoFrame, RankEffect, RankInput } from "../../src/cpr/retry-one/types.ts";
import { packedLogCodec } from "../../src/mpi/modes/retry-one.ts";
import type { ReplicaCodec } from "../../src/mpi/retry-hook.ts";

const b = (s: string): Buffer => Buffer.from(s);
/** A packed checkpoint: 3 ranks, this one rank 0, messages to ranks 1 and 2. */
function packed(appSeqOut: number[], log: [number, number][], tag: string): { s: Buffer; lib: object; log: unknown[] } {
  return {
    s: b(`state ${tag}`),
    lib: { channelSeqOut: [...appSeqOut], appSeqOut, consumed: [0, 0, 0], ordinal: 0, calls: 1 },
    log: log.map(([dest, seq]) => [dest, seq, b(`h${dest}.${seq}`), b(`m${dest}.${seq}`)]),
  };
}

describe("packedLogCodec", () => {
  const base = packed(
    [0, 5, 2],
    [
      [1, 3],
      [1, 4],
      [2, 0],
      [2, 1],
    ],
    "a",
  );

  it("sends only the messages the base did not have, and patches back the same checkpoint with the same buffers", () => {
    // Rank 1's checkpoint covered message 3; rank 2's covered nothing; 2 and 1 new messages.
    const next = packed(
      [0, 7, 3],
      [
        [1, 4],
        [1, 5],
        [1, 6],
        [2, 0],
        [2, 1],
        [2, 2],
      ],
      "b",
    );
    // The shared messages are the very entries of the base (as the mode's log keeps them).
    next.log[0] = base.log[1];
    next.log[3] = base.log[2];
    next.log[4] = base.log[3];
    const delta = packedLogCodec.diff(base, next) as { logFrom: number[]; logAdd: unknown[] };
    expect(delta.logFrom).toEqual([0, 4, 0]);
    expect(delta.logAdd).toEqual([next.log[1], next.log[2], next.log[5]]);
    const back = packedLogCodec.patch(base, delta) as typeof next;
    expect(back.s).toBe(next.s);
    expect(back.lib).toBe(next.lib);
    // Per destination in order (the order restore() rebuilds the log in), the same entries.
    const byDest = (log: unknown[]): unknown[][] => [1, 2].map((d) => log.filter((e) => (e as number[])[0] === d));
    expect(byDest(back.log)).toEqual(byDest(next.log));
    byDest(back.log).forEach((entries, i) => entries.forEach((e, k) => expect(e).toBe(byDest(next.log)[i]![k])));
  });

  it("sends the whole checkpoint when the difference would not be shorter, or the base lacks what it keeps", () => {
    // Every message is new: nothing to leave out.
    expect(packedLogCodec.diff(base, packed([0, 6, 2], [[1, 5]], "c"))).toBeUndefined();
    // A log that starts before the base's (never from the same rank; a foreign base): whole.
    expect(
      packedLogCodec.diff(
        base,
        packed(
          [0, 6, 2],
          [
            [1, 2],
            [1, 5],
          ],
          "d",
        ),
      ),
    ).toBeUndefined();
    // Not a packed checkpoint (other states): whole.
    expect(packedLogCodec.diff({ x: 1 }, base)).toBeUndefined();
  });

  it("refuses a difference that does not fit its base (a clear CPR_PROTOCOL error, never a wrong log)", () => {
    const delta = { s: b("s"), lib: base.lib, logFrom: [0, 1, 0], logAdd: [] };
    expect(() => packedLogCodec.patch(base, delta)).toThrowError(LifelineError);
    expect(() => packedLogCodec.patch(base, delta)).toThrowError(/before its base's/);
    expect(() => packedLogCodec.patch(base, { junk: true })).toThrowError(/does not fit/);
  });
});

/** States are lists; a difference is what a list adds to its base (a prefix of it). */
function recordingCodec(): ReplicaCodec & { diffs: unknown[]; patches: unknown[] } {
  const diffs: unknown[] = [];
  const patches: unknown[] = [];
  return {
    diffs,
    patches,
    diff(base, next) {
      const a = base as string[],
        n = next as string[];
      if (a.length === 0 || a.some((x, i) => n[i] !== x)) return undefined;
      const d = { add: n.slice(a.length) };
      diffs.push(d);
      return d;
    },
    patch(base, delta) {
      patches.push(delta);
      const d = delta as { add?: string[] };
      if (!Array.isArray(d.add)) throw new Error("not a difference");
      return [...(base as string[]), ...d.add];
    },
  };
}

const val = (value: unknown): Lazy => ({ kind: "value", value });
const ckpt = (state: unknown): RankInput => ({ kind: "checkpoint", state: val(state), global: val(null), key: null, consumed: [0, 0] });

/** Two ranks (each the other's successor) with the codec; routes frames until quiet, recording them. */
function pair(codec: ReplicaCodec): {
  ms: RetryOneRank[];
  route: (r: number, i: RankInput) => void;
  sent: { from: number; frame: ProtoFrame }[];
  seen: RankEffect[][];
} {
  const ms = [0, 1].map((rank) => new RetryOneRank({ rank, size: 2, attempt: 0, attempts: [0, 0], replicas: 1, failureTimeoutMs: 1000, replicaCodec: codec }));
  const sent: { from: number; frame: ProtoFrame }[] = [];
  const seen: RankEffect[][] = [[], []];
  const route = (r: number, input: RankInput): void => {
    const queue: { to: number; input: RankInput }[] = [{ to: r, input }];
    while (queue.length > 0) {
      const { to, input: i } = queue.shift()!;
      for (const e of ms[to]!.step(i)) {
        if (e.kind === "send") {
          sent.push({ from: to, frame: e.frame });
          queue.push({ to: e.to, input: { kind: "frame", from: to, attempt: 0, frame: e.frame } });
        } else seen[to]!.push(e);
      }
    }
  };
  return { ms, route, sent, seen };
}

describe("RetryOneRank: replicas as differences", () => {
  it("the first checkpoint goes whole; later ones go as what they add to the safe one, and the holder takes them whole", () => {
    const codec = recordingCodec();
    const { route, sent, seen } = pair(codec);
    route(0, ckpt(["m1", "m2"]));
    const first = sent.find((s) => s.from === 0 && s.frame.t === "replica")!.frame as Extract<ProtoFrame, { t: "replica" }>;
    expect(first.base).toBeUndefined();
    expect(first.state).toEqual(["m1", "m2"]);
    expect(seen[0]).toContainEqual({ kind: "checkpointed", version: 1 });
    sent.length = 0;
    route(0, ckpt(["m1", "m2", "m3"]));
    const second = sent.find((s) => s.from === 0 && s.frame.t === "replica")!.frame as Extract<ProtoFrame, { t: "replica" }>;
    expect(second).toMatchObject({ version: 2, base: 1, state: { add: ["m3"] } });
    // The holder patched it onto the version it holds and acknowledged it: safe.
    expect(codec.patches).toEqual([{ add: ["m3"] }]);
    expect(sent.map((s) => s.frame.t)).toContain("rack");
    expect(sent.map((s) => s.frame.t)).not.toContain("rnak");
    expect(seen[0]).toContainEqual({ kind: "checkpointed", version: 2 });
  });

  it("a holder that lacks the base asks for the checkpoint whole, and its owner sends it whole", () => {
    const codec = recordingCodec();
    const { ms, route, sent, seen } = pair(codec);
    route(0, ckpt(["m1"]));
    sent.length = 0;
    // Rank 1 is handed a difference from a checkpoint of rank 0 it never held.
    const effects = ms[1]!.step({
      kind: "frame",
      from: 0,
      attempt: 0,
      frame: {
        t: "replica",
        view: [0, 0],
        version: 7,
        index: 0,
        key: null,
        detCount: 0,
        safe: false,
        state: { add: ["x"] },
        base: 6,
        known: { safe: [], logs: [] },
      },
    });
    expect(effects).toEqual([{ kind: "send", to: 0, frame: { t: "rnak", view: [0, 0], version: 7 } }]);
    // A difference that does not patch (the codec throws) is asked for whole too.
    expect(
      ms[1]!.step({
        kind: "frame",
        from: 0,
        attempt: 0,
        frame: { t: "replica", view: [0, 0], version: 7, index: 0, key: null, detCount: 0, safe: false, state: "junk", base: 1, known: { safe: [], logs: [] } },
      }),
    ).toEqual([{ kind: "send", to: 0, frame: { t: "rnak", view: [0, 0], version: 7 } }]);
    // The owner's pending checkpoint, refused as a difference: sent again whole, then safe.
    // Its sends are dropped: as if the difference went to a holder without the base.
    const effects2 = ms[0]!.step(ckpt(["m1", "m2"]));
    const replicas = effects2.flatMap((e) => (e.kind === "send" && e.frame.t === "replica" ? [e.frame] : []));
    expect(replicas).toMatchObject([{ version: 2, base: 1, state: { add: ["m2"] } }]);
    for (const e of effects2) if (e.kind !== "send") seen[0]!.push(e);
    expect(seen[0]).not.toContainEqual({ kind: "checkpointed", version: 2 });
    route(0, { kind: "frame", from: 1, attempt: 0, frame: { t: "rnak", view: [0, 0], version: 2 } });
    const whole = sent.filter((s) => s.from === 0 && s.frame.t === "replica").map((s) => s.frame as Extract<ProtoFrame, { t: "replica" }>);
    expect(whole.at(-1)).toMatchObject({ version: 2, state: ["m1", "m2"] });
    expect(whole.at(-1)!.base).toBeUndefined();
    expect(seen[0]).toContainEqual({ kind: "checkpointed", version: 2 });
  });
});
