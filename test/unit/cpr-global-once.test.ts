/**
 * A line's `global` is stored once: the global writer (rank 0) keeps it in
 * its part; every other rank whose global has the same SHA-256 names the writer's instead of
 * holding a copy, and on a restore gets the bytes from the writer, checked against the SHA-256
 * its part recorded. A rank whose global differs keeps its own; a global that does not check
 * out stops the restore (CPR_RESTORE) instead of restoring something else. Ranks asked for a
 * checkpoint at counts one apart take it at the same count, so that their globals are equal.
 */
import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import { PROTO_CPR_COUNT, PROTO_CPR_EARLY, PROTO_CPR_GLOBAL, PROTO_CPR_GLOBAL_SUM, PROTO_CPR_GLOBAL_WANT } from "../../src/cpr/coordinated/driver.ts";
import { decodeValue, encodeValue } from "../../src/mpi/codec.ts";
import { deliver, fakeRank, type FakeRank, protocolHeader, round, type Sent, settle } from "./cpr-driver-fakes.ts";

const model = (seed: number, n = 20_000) => Float64Array.from({ length: n }, (_, i) => Math.cos(i * seed));

interface StoredPart {
  v: number;
  global: Buffer | null;
  globalFrom: { rank: number; bytes: number } | null;
}

/** Every rank of `size` takes checkpoint 1 (globals from `globalOf`); the sums are delivered; parts written. */
async function line(size: number, globalOf: (rank: number) => unknown, stateOf = (rank: number): unknown => ({ step: 10 + rank })): Promise<FakeRank[]> {
  const ranks = Array.from({ length: size }, (_, r) => fakeRank(r, { size }));
  for (const r of ranks) await r.driver.beforeStart(r.table);
  for (const r of ranks) await round(r, 1, stateOf(r.rank), globalOf(r.rank));
  for (const from of ranks) for (const to of ranks) if (to !== from) deliver(from, to, PROTO_CPR_GLOBAL_SUM);
  await settle();
  for (const r of ranks) expect(r.controls.filter((m) => m.t === "cpr-part").map((m) => (m as { epoch: number }).epoch)).toEqual([1]);
  return ranks;
}

/** The ranks restart from line 1: each restores from its own part; the exchange runs; resolves to what restore() gives. */
async function restart(old: FakeRank[], tamper?: (body: { global?: Uint8Array[] }) => void, maxMessageBytes?: number, delivered?: Sent[]) {
  const ranks = old.map((o) => fakeRank(o.rank, { size: o.size, own: o.own, ...(maxMessageBytes === undefined ? {} : { maxMessageBytes }) }));
  for (const r of ranks) await r.driver.beforeStart(r.restoreTable(1));
  const started = ranks.map((r) =>
    r.driver.afterStart().then(
      () => ({ ok: true as const }),
      (err: unknown) => ({ ok: false as const, err: err as Error }),
    ),
  );
  for (const tag of [PROTO_CPR_GLOBAL_WANT, PROTO_CPR_GLOBAL, PROTO_CPR_EARLY]) {
    for (const from of ranks)
      for (const to of ranks) {
        if (to === from) continue;
        if (tag === PROTO_CPR_GLOBAL && tamper !== undefined) for (const s of from.out) if (s.tag === tag) tamper(s.body as { global?: Uint8Array[] });
        const taken = deliver(from, to, tag);
        delivered?.push(...taken);
      }
    await settle();
  }
  const outcomes = await Promise.all(started);
  return ranks.map((r, i) => ({ outcome: outcomes[i]!, restored: outcomes[i]!.ok ? r.driver.restored() : undefined }));
}

const partOf = (r: FakeRank): StoredPart => decodeValue(r.own.get(1)!) as StoredPart;

describe("a line's global, stored once", () => {
  it("the writer's part holds it, the others' name it; a restart gives every rank the same global, bit for bit", async () => {
    const g = model(3);
    const ranks = await line(3, () => g);
    // The writer is rank 0.
    expect(partOf(ranks[0]!).global).not.toBeNull();
    for (const r of [1, 2]) {
      const part = partOf(ranks[r]!);
      expect(part.v).toBe(3);
      expect(part.global).toBeNull();
      expect(part.globalFrom).toMatchObject({ rank: 0, bytes: encodeValue(g).length });
      expect(ranks[r]!.own.get(1)!.length).toBeLessThan(4096);
    }
    const restored = await restart(ranks);
    for (const [r, { outcome, restored: got }] of restored.entries()) {
      expect(outcome.ok, String(!outcome.ok && outcome.err)).toBe(true);
      expect(got!.state).toEqual({ step: 10 + r });
      expect(Buffer.from((got!.global as Float64Array).buffer, (got!.global as Float64Array).byteOffset, g.byteLength).equals(Buffer.from(g.buffer))).toBe(
        true,
      );
    }
  });

  it("the writer's restored global is memory of its own, not the bytes it serves to the others", async () => {
    // A transport reads what the writer serves from the writer's memory, later, while the
    // writer's program may already be changing its global. Where the global lies in the
    // part's bytes shifts with the size of the state before it: every alignment is tried.
    for (let pad = 0; pad < 8; pad++) {
      const g = model(13);
      const ranks = await line(
        2,
        () => g,
        (rank) => ({ step: rank, pad: "x".repeat(pad) }),
      );
      const delivered: Sent[] = [];
      const restored = await restart(ranks, undefined, undefined, delivered);
      const served = delivered.filter((s) => s.tag === PROTO_CPR_GLOBAL).flatMap((s) => (s.given as { global: Uint8Array[] }).global);
      expect(served.length).toBeGreaterThan(0);
      const mine = restored[0]!.restored!.global as Float64Array;
      for (const chunk of served) expect(mine.buffer === chunk.buffer, `pad ${pad}: the restored global views a served chunk`).toBe(false);
      // What rank 1 got is the line's global, whatever the writer's program does with its own.
      mine.fill(-1);
      expect((restored[1]!.restored!.global as Float64Array)[1]).toBe(Math.cos(13));
    }
  });

  it("a rank whose global differs from the writer's (another checkpoint count) keeps its own", async () => {
    const ranks = await line(2, (r) => model(r === 0 ? 5 : 7));
    for (const r of ranks) {
      expect(partOf(r).global).not.toBeNull();
      expect(partOf(r).globalFrom ?? null).toBeNull();
    }
    const restored = await restart(ranks);
    expect(ranks.map((r) => r.out.filter((s) => s.tag === PROTO_CPR_GLOBAL_WANT))).toEqual([[], []]);
    expect((restored[0]!.restored!.global as Float64Array)[1]).toBe(Math.cos(5));
    expect((restored[1]!.restored!.global as Float64Array)[1]).toBe(Math.cos(7));
  });

  it("a small global is kept by every rank", async () => {
    const ranks = await line(2, () => model(2, 100));
    for (const r of ranks) expect(partOf(r).global).not.toBeNull();
  });

  it("a global that does not match the part's SHA-256 stops the restore with CPR_RESTORE", async () => {
    const ranks = await line(2, () => model(4));
    // The writer is rank 0; rank 1's part names it. One byte of what rank 0 sends changes.
    const restored = await restart(ranks, (body) => {
      const data = body.global?.at(-1);
      if (data !== undefined) data[100] = data[100]! ^ 1;
    });
    expect(restored[0]!.outcome.ok).toBe(true);
    expect(restored[1]!.outcome.ok).toBe(false);
    expect(!restored[1]!.outcome.ok && restored[1]!.outcome.err.message).toMatch(/CPR_RESTORE|SHA-256/);
  });

  it("a run resumed with a --max-message below the global's size stops the restore with a clear CPR_RESTORE, not a timeout", async () => {
    const ranks = await line(2, () => model(9));
    const restored = await restart(ranks, undefined, 100_000);
    expect(restored[0]!.outcome.ok).toBe(true);
    expect(!restored[1]!.outcome.ok && restored[1]!.outcome.err.message).toMatch(/longer than this run's --max-message of 100000/);
  });

  it("a writer whose sum never comes (the line is aborted) leaves the rank's own global in its part", async () => {
    const size = 2;
    const ranks = Array.from({ length: size }, (_, r) => fakeRank(r, { size }));
    for (const r of ranks) await r.driver.beforeStart(r.table);
    const g = model(6);
    await round(ranks[1]!, 1, { step: 1 }, g);
    // Rank 1 waits for rank 0's sum; the initiator aborts the line instead.
    expect(ranks[1]!.controls.some((m) => m.t === "cpr-part")).toBe(false);
    ranks[1]!.driver.onControl({ t: "cpr-aborted", epoch: 1 });
    await settle();
    expect(partOf(ranks[1]!).global).not.toBeNull();
  });

  it("parts of format 2 (a global named by its plain SHA-256, not its blocks') still restore", async () => {
    const g = model(11);
    const ranks = await line(2, () => g);
    const writerGlobal = (decodeValue(ranks[0]!.own.get(1)!) as { global: Buffer }).global;
    for (const r of ranks) {
      const p = decodeValue(r.own.get(1)!) as StoredPart & { globalFrom: { sha256: Buffer } | null };
      const v2 = {
        ...p,
        v: 2,
        ...(p.globalFrom === null ? {} : { globalFrom: { ...p.globalFrom, sha256: createHash("sha256").update(writerGlobal).digest() } }),
      };
      r.own.set(1, encodeValue(v2));
    }
    const restored = await restart(ranks);
    for (const { outcome, restored: got } of restored) {
      expect(outcome.ok, String(!outcome.ok && outcome.err)).toBe(true);
      expect((got!.global as Float64Array)[1]).toBe(Math.cos(11));
    }
  });

  it("parts of format 1 (every rank its own global) still restore", async () => {
    const r = fakeRank(0, { size: 1 });
    const g = model(8);
    const lib = encodeValue({ channelSeqOut: [0] });
    r.own.set(1, encodeValue({ v: 1, epoch: 1, state: encodeValue({ step: 4 }), global: encodeValue(g), lib, early: [], late: [], nondet: [] }));
    await r.driver.beforeStart(r.restoreTable(1));
    await r.driver.afterStart();
    const got = r.driver.restored()!;
    expect(got.state).toEqual({ step: 4 });
    expect((got.global as Float64Array)[1]).toBe(Math.cos(8));
  });
});

describe("checkpoints at the same count (so that the global can be stored once)", () => {
  /**
   * Rank 0 of 2 has made `before` checkpoint() calls when asked; rank 1 says its next is
   * `theirs` (or nothing), after rank 0's first `late` calls since the request.
   */
  async function takenAt(before: number, theirs: number | undefined, late = 0): Promise<number> {
    const a = fakeRank(0, { size: 2 });
    await a.driver.beforeStart(a.table);
    for (let i = 0; i < before; i++) a.driver.checkpoint({ i }, undefined, () => undefined);
    a.driver.onControl({ t: "cpr-checkpoint", epoch: 1 });
    for (let call = before + 1; call <= before + 6; call++) {
      if (theirs !== undefined && call === before + 1 + late) a.driver.onProtocol(protocolHeader(1, PROTO_CPR_COUNT), { epoch: 1, next: theirs });
      a.driver.checkpoint({ call }, undefined, () => undefined);
      if (a.driver.epoch === 1) return call;
    }
    return -1;
  }

  it("ranks that step together take it at the call after the highest count: one behind passes up two calls, the others one", async () => {
    expect(await takenAt(10, 12)).toBe(13);
    expect(await takenAt(10, 11)).toBe(12);
    expect(await takenAt(10, 10)).toBe(12);
  });

  it("counts far apart (a master and its workers): at the next call", async () => {
    expect(await takenAt(10, 30)).toBe(11);
  });

  it("a rank whose peers' counts have not come yet passes up calls while they come, two at most", async () => {
    // The peer, a step behind, heard the request one call later.
    expect(await takenAt(10, 12, 1)).toBe(13);
    // Far apart once heard: at once.
    expect(await takenAt(10, 30, 1)).toBe(12);
    // Never heard, or heard too late: not held up for more than two calls.
    expect(await takenAt(10, undefined)).toBe(13);
    expect(await takenAt(10, 12, 3)).toBe(13);
  });
});
