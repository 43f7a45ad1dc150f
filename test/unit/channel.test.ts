/**
 * The channel's receipts: a sender lends pooled bounce buffers to large messages and gets them
 * back when the receiver acknowledges them — once per turn for all that arrived, on a reply
 * when the program sends one in the same turn, else in a receipt frame of its own. And frames
 * delivered again: from a recovery line as copies, held ones as they are.
 */
import { describe, expect, it } from "vitest";
import { Channel, PROTO_RECEIPT, PROTO_RECEIPT_WANTED } from "../../src/mpi/channel.ts";
import type { Host } from "../../src/mpi/host.ts";
import { Flag, Kind } from "../../src/mpi/wire.ts";
import { forgedHeader } from "../../src/testing/compromised.ts";
import { memChannels } from "./mem-channels.ts";

/** Two channels (ranks 0 and 1) over an in-memory FIFO; `sent` records what each sent. */
const pair = () => memChannels(2);

const settle = (): Promise<void> => new Promise((r) => setTimeout(r, 20));

/** A send's promise and whether it has resolved yet. */
function watch(p: Promise<void>): { readonly promise: Promise<void>; done: boolean } {
  const w = { promise: p, done: false };
  w.promise = p.then(() => {
    w.done = true;
  });
  return w;
}

describe("channel receipts", () => {
  it("three large messages get one receipt (once their sender pauses), which returns every buffer", async () => {
    const {
      channels: [a, b],
      sent,
      delivered,
    } = pair();
    const big = new Float64Array(16 * 1024);
    await Promise.all([a!.sendApp(big, 1, 1), a!.sendApp(big, 1, 2), a!.sendApp(big, 1, 3)]);
    expect(a!.lentCount).toBe(3);
    // The receipt waits for the sender's pause (a 2 ms timer, late on a loaded machine).
    for (const end = Date.now() + 5_000; (a!.lentCount > 0 || b!.lentCount > 0) && Date.now() < end;) await settle();
    expect(delivered.map((d) => d.tag)).toEqual([1, 2, 3]);
    expect(sent.filter((s) => s.from === 1 && s.kind === Kind.protocol)).toHaveLength(1);
    expect(a!.lentCount).toBe(0);
    expect(b!.lentCount).toBe(0);
  });

  it("a stream of 80 large messages gets a receipt per 4 MiB window and one when it pauses, not one each", async () => {
    const {
      channels: [a],
      sent,
    } = pair();
    const big = new Float64Array(8 * 1024); // 64 KiB
    for (let i = 0; i < 80; i++) await a!.sendApp(big, 1, 1);
    // The last receipt waits for the sender's pause (a 2 ms timer, late on a loaded machine).
    for (const end = Date.now() + 5_000; a!.lentCount > 0 && Date.now() < end;) await settle();
    const receipts = sent.filter((s) => s.from === 1 && s.kind === Kind.protocol).length;
    expect(receipts).toBeGreaterThanOrEqual(1);
    expect(receipts).toBeLessThanOrEqual(3);
    expect(a!.lentCount).toBe(0);
  });

  it("a reply sent in the same turn carries the receipt: no receipt frame", async () => {
    const {
      channels: [a, b],
      sent,
    } = pair();
    const big = new Float64Array(16 * 1024);
    // Rank 1 replies at once to what it receives, as a ping-pong does.
    (b as unknown as { deliver: unknown }).deliver = () => void b!.sendApp(new Float64Array(1), 0, 9);
    await a!.sendApp(big, 1, 1);
    await settle();
    expect(sent.filter((s) => s.from === 1).map((s) => s.kind)).toEqual([Kind.app]);
    expect(a!.lentCount).toBe(0);
  });

  it("a large reply on a quiet channel is sent from the program's memory; its send resolves on the receipt", async () => {
    const {
      channels: [a, b],
      sent,
    } = pair();
    const big = new Float64Array(16 * 1024); // 128 KiB
    let reply: Promise<void> | undefined;
    let replied = false;
    // Rank 1 answers what it receives with a large message, as a ping-pong does.
    (b as unknown as { deliver: unknown }).deliver = () => {
      reply ??= b!.sendApp(big, 0, 2).then(() => {
        replied = true;
      });
    };
    // Rank 0 has heard nothing from rank 1: its message is a copy, lent until the receipt.
    await a!.sendApp(big, 1, 1);
    expect(a!.lentCount).toBe(1);
    for (const end = Date.now() + 5_000; reply === undefined && Date.now() < end;) await settle();
    const [first, answer] = sent.filter((s) => s.kind === Kind.app);
    expect(first!.flags & Flag.rendezvous).toBe(0);
    // The answer: from the program's memory, and it carries the receipt of rank 0's message.
    expect(answer!.from).toBe(1);
    expect(answer!.flags & Flag.rendezvous).toBe(Flag.rendezvous);
    expect(answer!.flags & Flag.ack).toBe(Flag.ack);
    await reply;
    expect(replied).toBe(true);
    expect(a!.lentCount).toBe(0);
    expect(b!.lentCount).toBe(0);
    // Rank 0 now answers rank 1 in turn: from its memory as well (nothing of its is unacknowledged).
    const next = a!.sendApp(big, 1, 3);
    for (const end = Date.now() + 5_000; sent.filter((s) => s.kind === Kind.app).length < 3 && Date.now() < end;) await settle();
    expect(sent.filter((s) => s.kind === Kind.app)[2]!.flags & Flag.rendezvous).toBe(Flag.rendezvous);
    // Rank 1 sends nothing more: its receipt comes in a frame of its own, at the end of its turn.
    await next;
    expect(a!.lentCount).toBe(0);
  });

  it("a second large message to a rank that has not answered is a copy again (a stream)", async () => {
    const {
      channels: [a, b],
      sent,
    } = pair();
    const big = new Float64Array(16 * 1024);
    await b!.sendApp(new Float64Array(1), 0, 9); // rank 0 hears from rank 1 once
    await settle();
    await a!.sendApp(big, 1, 1); // a reply on a quiet channel: from the program's memory
    await a!.sendApp(big, 1, 2); // not a reply any more: a copy
    const flags = sent.filter((s) => s.from === 0 && s.kind === Kind.app).map((s) => s.flags & Flag.rendezvous);
    expect(flags).toEqual([Flag.rendezvous, 0]);
  });

  it("a very large message is sent from the program's memory and the send resolves on its receipt", async () => {
    const {
      channels: [a],
      sent,
    } = pair();
    const huge = new Float64Array(4 * 1024 * 1024); // 32 MiB
    const send = watch(a!.sendApp(huge, 1, 1));
    await new Promise((r) => setImmediate(r));
    expect(send.done).toBe(false);
    expect(a!.lentCount).toBe(1);
    await send.promise;
    expect(sent.filter((s) => s.from === 1 && s.kind === Kind.protocol)).toHaveLength(1);
    expect(a!.lentCount).toBe(0);
  });

  it("a large isend goes from the program's memory and resolves on the receipt, asked for once when its program waits", async () => {
    // Without the pause timer: only the request for the receipt brings it.
    const {
      channels: [a, b],
      sent,
      delivered,
      pause,
      release,
    } = memChannels(2, { timers: false });
    const big = new Float64Array(8 * 1024); // 64 KiB
    pause(1); // a receiver busy computing: nothing arrives, so nothing is acknowledged
    const done: boolean[] = [];
    // 40 in flight (2.5 MiB, under the receipt window): nothing would acknowledge them soon.
    const window = Array.from({ length: 40 }, (_, i) => a!.sendApp(big, 1, 5, true).then(() => void (done[i] = true)));
    for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
    expect(done.filter(Boolean)).toHaveLength(0);
    expect(a!.lentCount).toBe(40);
    const flags = sent.filter((s) => s.from === 0 && s.kind === Kind.app).map((s) => s.flags & (Flag.rendezvous | Flag.receipt));
    expect(flags).toEqual(Array.from({ length: 40 }, () => Flag.receipt));
    // The program waits: one request for the receipt, however often it waits meanwhile.
    a!.urgeReceipt(1);
    a!.urgeReceipt(1);
    await new Promise((r) => setImmediate(r));
    expect(sent.filter((s) => s.from === 0 && s.kind === Kind.protocol).map((s) => s.tag)).toEqual([PROTO_RECEIPT_WANTED]);
    release(1);
    await Promise.all(window);
    expect(delivered).toHaveLength(40);
    expect(a!.lentCount).toBe(0);
    expect(sent.filter((s) => s.from === 1 && s.kind === Kind.protocol).map((s) => s.tag)).toEqual([PROTO_RECEIPT]);
    expect(b!.lentCount).toBe(0);
    // Acknowledged: the next wait asks again.
    const more = a!.sendApp(big, 1, 5, true);
    a!.urgeReceipt(1);
    await more;
    expect(sent.filter((s) => s.from === 0 && s.kind === Kind.protocol)).toHaveLength(2);
  });

  it("a wait for an isend sent after the last request for a receipt asks again, before that receipt is back", async () => {
    const {
      channels: [a],
      sent,
      pause,
      release,
    } = memChannels(2, { timers: false });
    const big = new Float64Array(8 * 1024);
    pause(1);
    const first = a!.sendApp(big, 1, 5, true);
    a!.urgeReceipt(1);
    const second = a!.sendApp(big, 1, 5, true); // not covered by the first request
    a!.urgeReceipt(1);
    a!.urgeReceipt(1);
    await new Promise((r) => setImmediate(r));
    expect(sent.filter((s) => s.from === 0 && s.kind === Kind.protocol)).toHaveLength(2);
    release(1);
    await Promise.all([first, second]);
    expect(a!.lentCount).toBe(0);
  });

  it("an isend nobody waits for is acknowledged when its sender's traffic pauses, as a copy is", async () => {
    const {
      channels: [a],
      sent,
    } = pair();
    await a!.sendApp(new Float64Array(8 * 1024), 1, 5, true);
    expect(sent.filter((s) => s.from === 1)).toHaveLength(1);
    expect(a!.lentCount).toBe(0);
  });

  it("a small isend is copied at the call and resolves once the transport has it, as send does", async () => {
    const {
      channels: [a],
      sent,
      pause,
    } = pair();
    pause(1);
    await a!.sendApp(new Float64Array(16), 1, 5, true);
    expect(a!.lentCount).toBe(0);
    expect(sent[0]!.flags & Flag.receipt).toBe(0);
  });

  it("a send from the program's memory that the mode suppresses (the receiver holds it) resolves at once", async () => {
    const {
      channels: [a],
      sent,
    } = memChannels(2, { timers: false });
    // cpr after a rollback: the receiver already holds these messages, so they are not sent again.
    a!.stamper = { stamp: () => undefined, suppress: () => true };
    await a!.sendApp(new Float64Array(4 * 1024 * 1024), 1, 1); // 32 MiB: a rendezvous send
    await a!.sendApp(new Float64Array(8 * 1024), 1, 2, true); // 64 KiB: an isend's
    expect(sent).toHaveLength(0);
    expect(a!.lentCount).toBe(0);
  });

  it("a sender that runs ahead of a busy receiver waits once 16 MiB of its buffers are out, and goes on with their receipts", async () => {
    const m = pair();
    const [a] = m.channels;
    m.pause(1);
    const big = new Float64Array(128 * 1024); // 1 MiB
    // 16 MiB out: each send resolves once the transport has it.
    for (let i = 0; i < 16; i++) await a!.sendApp(big, 1, 1);
    const next = watch(a!.sendApp(big, 1, 1));
    await settle();
    expect(next.done).toBe(false);
    expect(a!.lentCount).toBe(17);
    // The receiver's loop runs again: every message arrives (in order), receipts come back.
    m.release(1);
    await next.promise;
    for (const end = Date.now() + 5_000; a!.lentCount > 0 && Date.now() < end;) await settle();
    expect(a!.lentCount).toBe(0);
    expect(m.delivered).toHaveLength(17);
  });

  it("16 MiB messages are copies too, and three of them may be out before a send waits", async () => {
    const m = pair();
    const [a] = m.channels;
    m.pause(1);
    const big = new Float64Array(2 * 1024 * 1024); // 16 MiB
    // Each of the three resolves once the transport has it: the window holds three messages
    // of this size (48 MiB), not only 16 MiB, so a stream of them keeps the link busy.
    const first = [0, 1, 2].map(() => watch(a!.sendApp(big, 1, 1)));
    await settle();
    expect(first.map((w) => w.done)).toEqual([true, true, true]);
    expect(m.sent.filter((s) => s.kind === Kind.app).map((s) => s.flags & Flag.rendezvous)).toEqual([0, 0, 0]);
    const fourth = watch(a!.sendApp(big, 1, 1));
    await settle();
    expect(fourth.done).toBe(false);
    expect(a!.lentCount).toBe(4);
    // A small message behind it waits in order, though it alone would fit the 16 MiB window.
    const small = watch(a!.sendApp(new Float64Array(128 * 1024), 1, 2));
    await settle();
    expect(small.done).toBe(false);
    m.release(1);
    await Promise.all([...first, fourth, small].map((w) => w.promise));
    for (const end = Date.now() + 5_000; a!.lentCount > 0 && Date.now() < end;) await settle();
    expect(a!.lentCount).toBe(0);
    expect(m.delivered).toHaveLength(5);
  });

  it("a message the transport refused holds no credit: later sends to that rank do not wait for it", async () => {
    const m = pair();
    const [a] = m.channels;
    m.pause(1);
    const big = new Float64Array(128 * 1024); // 1 MiB
    const transport = (a as unknown as { transport: { send: (d: number, f: unknown[]) => Promise<void> } }).transport;
    const send = transport.send;
    transport.send = () => Promise.reject(new Error("peer gone"));
    for (let i = 0; i < 16; i++) await expect(a!.sendApp(big, 1, 1)).rejects.toThrow("peer gone");
    transport.send = send;
    // 16 refused messages would have used up the window; these go out and resolve at once.
    for (let i = 0; i < 8; i++) await a!.sendApp(big, 1, 1);
    expect(a!.lentCount).toBe(8);
  });

  it("a send waiting for its buffers to come back fails with the abort's error", async () => {
    const m = pair();
    const [a] = m.channels;
    m.pause(1);
    const big = new Float64Array(128 * 1024);
    for (let i = 0; i < 16; i++) await a!.sendApp(big, 1, 1);
    const p = a!.sendApp(big, 1, 1);
    await settle();
    a!.forgetLent(new Error("aborted"));
    await expect(p).rejects.toThrow("aborted");
  });

  it("a rendezvous send still waiting when the rank aborts fails with the abort's error", async () => {
    const {
      channels: [a],
    } = pair();
    const p = a!.sendApp(new Float64Array(4 * 1024 * 1024), 1, 1); // 32 MiB
    a!.forgetLent(new Error("aborted"));
    await expect(p).rejects.toThrow("aborted");
  });
});

describe("frames injected again", () => {
  /** A channel of rank 1 of 2 whose deliveries are captured with their body buffers. */
  const receiver = () => {
    const got: Buffer[][] = [];
    const ch = new Channel({
      rank: 1,
      size: 2,
      attempt: 0,
      host: { transport: { endpoint: "mem://1" } } as unknown as Host,
      deliver: (_h, body) => void got.push(body),
    });
    ch.join({ keysIn: [7, 7], keysOut: [7, 7], attempts: [0, 0] });
    const header = forgedHeader({ kind: Kind.collective, key: 7 });
    return { ch, got, header };
  };

  it("a frame from the recovery line arrives as a copy: a collective combining into it leaves the line's bytes alone", () => {
    const { ch, got, header } = receiver();
    // Decoded from a part, a frame views the part's bytes, which the store may still be writing.
    const part = Buffer.alloc(64, 3);
    ch.inject({ header, body: [part.subarray(0, 32)] }, true);
    got[0]![0]!.fill(0xa5);
    expect(part.every((b) => b === 3)).toBe(true);
  });

  it("a frame held from the network is delivered as it is (it is the receiver's own)", () => {
    const { ch, got, header } = receiver();
    const body = Buffer.alloc(32, 3);
    ch.inject({ header, body: [body] });
    expect(got[0]![0]).toBe(body);
  });
});
