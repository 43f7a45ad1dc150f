/**
 * Per-host stores: a checkpoint's serialized state goes to the partner as soon as the
 * checkpoint is taken (PROTO_CPR_AHEAD); the part's copy then carries only what the round
 * added and names those frames. The partner must keep exactly the bytes the rank wrote itself,
 * also when a newer checkpoint's state arrives before an older part's copy, and must refuse —
 * never keep something else — when a state it is told of never came. The line's global writer
 * sends its global neither ahead nor with the copy: the copy names it by SHA-256 and the
 * partner, which holds an equal global, writes its own bytes in its place — or, when its global
 * differs or it has none, asks for the part again, whole.
 */
import { describe, expect, it } from "vitest";
import { PROTO_CPR_AHEAD, PROTO_CPR_COPIED, PROTO_CPR_COPY, PROTO_CPR_GLOBAL_SUM, PROTO_CPR_MARKER } from "../../src/cpr/coordinated/driver.ts";
import { decodeValue } from "../../src/mpi/codec.ts";
import { crc32 } from "../../src/store/checksum.ts";
import { deliver, fakeRank, protocolHeader as header, requestCheckpoint, round, settle, takeCheckpoint } from "./cpr-driver-fakes.ts";

/** Ranks 0 and 1, each the other's partner, started. */
async function partners() {
  const pair = [fakeRank(0, { partner: 1 }), fakeRank(1, { partner: 0 })] as const;
  for (const r of pair) await r.driver.beforeStart(r.table);
  return pair;
}

const bigState = (seed: number) => ({ model: Float64Array.from({ length: 200_000 }, (_, i) => Math.sin(i * seed)), step: seed });

describe("partner copies sent ahead", () => {
  it("the state goes at the checkpoint, the copy names it, and the partner keeps the very bytes of the part", async () => {
    const [a, b] = await partners();
    requestCheckpoint(a, 1);
    takeCheckpoint(a, bigState(1));
    // Before the round ends, the state is on its way.
    const ahead = deliver(a, b, PROTO_CPR_AHEAD);
    expect(ahead).toHaveLength(1);
    expect(ahead[0]!.bytes).toBeGreaterThan(1_600_000);
    a.driver.onProtocol(header(1, PROTO_CPR_MARKER), { epoch: 1, sent: 0 });
    a.driver.onControl({ t: "cpr-stop", epoch: 1 });
    await settle();
    const copy = deliver(a, b, PROTO_CPR_COPY);
    expect(copy).toHaveLength(1);
    // Only the head and the round's logs travel now.
    expect(copy[0]!.bytes).toBeLessThan(4096);
    await settle();
    expect(b.held.get(1)).toBeDefined();
    expect(b.held.get(1)!.equals(a.own.get(1)!)).toBe(true);
    deliver(b, a, PROTO_CPR_COPIED);
    await settle();
    expect(a.controls.filter((m) => m.t === "cpr-part" || m.t === "cpr-part-failed")).toEqual([
      { t: "cpr-part", rank: 0, epoch: 1, ref: { rank: 0, epoch: 1, checksum: crc32(a.own.get(1)!), bytes: a.own.get(1)!.length } },
    ]);
  });

  it("a newer checkpoint's state arriving before an older part's copy (the older line aborted meanwhile): the newer copy is whole", async () => {
    const [a, b] = await partners();
    await round(a, 1, bigState(1));
    // The initiator gave up on line 1 before its copy reached the partner, and began line 2.
    for (const r of [a, b]) r.driver.onControl({ t: "cpr-aborted", epoch: 1 });
    await round(a, 2, bigState(2));
    // Both states first, then the copies: line 2's leaves once line 1's is answered (a rank
    // writes its parts in turn).
    expect(deliver(a, b, PROTO_CPR_AHEAD).map((s) => (s.body as { epoch: number }).epoch)).toEqual([1, 2]);
    const answers: unknown[] = [];
    for (const epoch of [1, 2]) {
      expect(deliver(a, b, PROTO_CPR_COPY).map((s) => (s.body as { epoch: number }).epoch)).toEqual([epoch]);
      await settle();
      answers.push(...deliver(b, a, PROTO_CPR_COPIED).map((s) => s.body));
      await settle();
    }
    expect(answers).toEqual([
      { epoch: 1, failure: "line 1 was aborted" },
      { epoch: 2, checksum: crc32(a.own.get(2)!) },
    ]);
    expect(b.held.has(1)).toBe(false);
    expect(b.held.get(2)!.equals(a.own.get(2)!)).toBe(true);
    expect(a.controls.filter((m) => m.t === "cpr-part").map((m) => (m as { epoch: number }).epoch)).toEqual([2]);
  });

  it("a copy whose state never came (the partner restarted meanwhile) is refused, and the rank's part fails", async () => {
    const [a, b] = await partners();
    await round(a, 1, bigState(3));
    a.out.splice(0, a.out.length, ...a.out.filter((s) => s.tag !== PROTO_CPR_AHEAD)); // lost
    deliver(a, b, PROTO_CPR_COPY);
    await settle();
    expect(b.held.size).toBe(0);
    const answers = deliver(b, a, PROTO_CPR_COPIED);
    expect(answers[0]!.body).toMatchObject({ epoch: 1, failure: expect.stringContaining("did not arrive") });
    await settle();
    expect(a.controls.find((m) => m.t === "cpr-part-failed")).toMatchObject({ epoch: 1, message: expect.stringContaining("did not arrive") });
    expect(a.controls.some((m) => m.t === "cpr-part")).toBe(false);
  });

  it("a malformed copy or state is dropped or refused, never kept", async () => {
    const [, b] = await partners();
    b.driver.onProtocol(header(0, PROTO_CPR_AHEAD), { epoch: 1, frames: ["not bytes"] });
    b.driver.onProtocol(header(0, PROTO_CPR_COPY), { epoch: 1, chunks: [new Uint8Array([1]), "x"] });
    b.driver.onProtocol(header(0, PROTO_CPR_COPY), { epoch: 2, chunks: [7] });
    b.driver.onProtocol(header(0, PROTO_CPR_COPY), { epoch: 3 });
    await settle();
    expect(b.held.size).toBe(0);
    expect(b.out.map((s) => s.body)).toEqual([
      { epoch: 1, failure: "a chunk of the part is neither bytes nor a reference to its state" },
      { epoch: 2, failure: "the state of line 2, sent ahead of the part, did not arrive" },
    ]);
  });

  const globalOf = (seed: number) => Float64Array.from({ length: 100_000 }, (_, i) => Math.cos(i * seed));

  /**
   * Line 1 on ranks 0 and 1, each the other's partner: rank 0, the global writer, with global
   * `gw`, rank 1 with `gp`. Every frame but the copies' answers is delivered; resolves to the
   * frames the writer sent its partner.
   */
  async function lineWithGlobals(gp: unknown, gw: unknown) {
    const [writer, partner] = await partners();
    await round(partner, 1, { step: 1 }, gp);
    await round(writer, 1, { step: 1 }, gw);
    deliver(writer, partner, PROTO_CPR_GLOBAL_SUM);
    await settle();
    const sent = [...deliver(writer, partner, PROTO_CPR_AHEAD), ...deliver(writer, partner, PROTO_CPR_COPY)];
    deliver(partner, writer, PROTO_CPR_AHEAD);
    deliver(partner, writer, PROTO_CPR_COPY);
    await settle();
    return { writer, partner, sent };
  }

  it("the global writer's global travels by name: the partner writes its own equal global, and keeps the very bytes of the part", async () => {
    const g = globalOf(1);
    const { writer, partner, sent } = await lineWithGlobals(g, g);
    // 800 KB of global stayed home: only the state, the head and the round's logs crossed.
    expect(sent.map((s) => s.tag)).toEqual([PROTO_CPR_AHEAD, PROTO_CPR_COPY]);
    expect(sent.reduce((n, s) => n + s.bytes, 0)).toBeLessThan(8192);
    expect((decodeValue(writer.own.get(1)!) as { global: Buffer | null }).global).not.toBeNull();
    expect(partner.held.get(1)!.equals(writer.own.get(1)!)).toBe(true);
    expect(partner.out.filter((s) => s.tag === PROTO_CPR_COPIED && s.dest === 0).map((s) => s.body)).toEqual([
      { epoch: 1, checksum: crc32(writer.own.get(1)!) },
    ]);
    deliver(partner, writer, PROTO_CPR_COPIED);
    deliver(writer, partner, PROTO_CPR_COPIED);
    await settle();
    for (const r of [writer, partner]) expect(r.controls.filter((m) => m.t === "cpr-part" || m.t === "cpr-part-failed").map((m) => m.t)).toEqual(["cpr-part"]);
  });

  it.each([
    ["differs (the partner checkpointed at another count)", globalOf(2)],
    ["is missing (the partner has none)", undefined],
  ])("when the partner's global %s, it asks again and the whole part comes", async (_, partnerGlobal) => {
    const { writer, partner } = await lineWithGlobals(partnerGlobal, globalOf(1));
    expect(partner.held.has(1)).toBe(false);
    const asked = deliver(partner, writer, PROTO_CPR_COPIED);
    expect(asked.map((s) => s.body)).toEqual([{ epoch: 1, resend: expect.stringContaining("holds no global of line 1") }]);
    await settle();
    const again = deliver(writer, partner, PROTO_CPR_COPY);
    expect(again).toHaveLength(1);
    expect(again[0]!.bytes).toBeGreaterThan(800_000);
    await settle();
    expect(partner.held.get(1)!.equals(writer.own.get(1)!)).toBe(true);
    deliver(partner, writer, PROTO_CPR_COPIED);
    await settle();
    expect(writer.controls.filter((m) => m.t === "cpr-part" || m.t === "cpr-part-failed")).toEqual([
      { t: "cpr-part", rank: 0, epoch: 1, ref: { rank: 0, epoch: 1, checksum: crc32(writer.own.get(1)!), bytes: writer.own.get(1)!.length } },
    ]);
  });
});

describe("a part the launcher fetched from the partner (this host lost its own)", () => {
  it("the copy the rank keeps again is the line's bytes, whatever its program does with the restored state at once", async () => {
    // The restored state views the fetched bytes where its arrays lie aligned in them, which
    // shifts with what comes before them in the part: every alignment is tried.
    for (let pad = 0; pad < 8; pad++) {
      const first = fakeRank(0, { size: 1 });
      await first.driver.beforeStart(first.table);
      await round(first, 1, { pad: "x".repeat(pad), ...bigState(3) });
      const fetched = first.own.get(1)!;
      const again = fakeRank(0, { size: 1, writeLater: true });
      const table = first.restoreTable(1) as { restore: object };
      await again.driver.beforeStart({ ...table, restore: { ...table.restore, part: Buffer.from(fetched) } } as never);
      await again.driver.afterStart();
      (again.driver.restored()!.state as ReturnType<typeof bigState>).model.fill(-1);
      await settle();
      expect(again.own.get(1)?.equals(fetched), `pad ${pad}`).toBe(true);
    }
  });
});
