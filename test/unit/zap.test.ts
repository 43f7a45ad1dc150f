/**
 * Goal: a rank's data socket on tcp with keys takes messages only from holders of the job's
 * member key: a plain connection, a wrong server key and a wrong client key are refused and
 * reported (the last with the peer's address, which ZAP sees); the member key gets through.
 * Its queues are finite (a reader that does not read holds its sender back, losing nothing),
 * and a frame far over the message limit costs its sender the connection, not the receiver
 * its memory.
 *
 * Method: real ZmqTransport sockets on 127.0.0.1, and plain zeromq.js sockets as strangers.
 */
import * as zmq from "zeromq";
import { afterEach, describe, expect, it } from "vitest";
import { makeJobKeys } from "../../src/mpi/keys.ts";
import { FRAME_SLACK_BYTES, HIGH_WATER_MARK, ZmqTransport } from "../../src/mpi/zmq/zmq-transport.ts";

const closers: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
});

async function rankSocket(maxMessageBytes = 1 << 20) {
  const keys = makeJobKeys({ curve: true });
  const member = { publicKey: keys.curve!.member, secretKey: keys.curve!.memberSecret };
  const refused: string[] = [];
  const got: Buffer[][] = [];
  const t = await ZmqTransport.bind({ transport: "tcp", name: "r0.0", curve: { member }, maxMessageBytes, refused: (_why, w) => refused.push(w) });
  closers.push(() => t.close());
  return {
    t,
    member,
    refused,
    got,
    start: () =>
      t.start(
        (f) => got.push(f),
        () => undefined,
      ),
  };
}

function push(opts: ConstructorParameters<typeof zmq.Push>[0], endpoint: string): zmq.Push {
  const p = new zmq.Push({ linger: 0, ...opts });
  p.connect(endpoint);
  closers.push(() => p.close());
  return p;
}

const until = async (cond: () => boolean, ms = 5000): Promise<void> => {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error("timed out");
    await new Promise((r) => setTimeout(r, 10));
  }
};

describe("a rank's data socket with CURVE", () => {
  it("takes the member key; refuses and reports a plain peer, a wrong server key and a wrong client key (with its address)", async () => {
    const s = await rankSocket();
    s.start();
    expect(s.t.curveKey).toMatch(/^.{40}$/);
    const stranger = zmq.curveKeyPair();
    void push({}, s.t.endpoint).send("plain");
    void push({ curveServerKey: stranger.publicKey, curvePublicKey: s.member.publicKey, curveSecretKey: s.member.secretKey }, s.t.endpoint).send(
      "wrong server key",
    );
    void push({ curveServerKey: s.t.curveKey!, curvePublicKey: stranger.publicKey, curveSecretKey: stranger.secretKey }, s.t.endpoint).send("wrong client key");
    void push({ curveServerKey: s.t.curveKey!, curvePublicKey: s.member.publicKey, curveSecretKey: s.member.secretKey }, s.t.endpoint).send("member");
    await until(() => s.refused.some((r) => r.includes("from 127.0.0.1: its key is not one of this job's")));
    await until(() => s.refused.some((r) => r.includes("without CURVE")) && s.refused.some((r) => r.includes("wrong CURVE key")));
    await new Promise((r) => setTimeout(r, 200));
    expect(s.got.map((f) => f.map((b) => b.toString()))).toEqual([["member"]]);
  });

  it("a sender to a reader that does not read stops at the high-water marks, and loses nothing once it reads", async () => {
    const s = await rankSocket();
    const sender = await ZmqTransport.bind({ transport: "tcp", name: "r1.0", curve: { member: s.member } });
    closers.push(() => sender.close());
    sender.connect(0, s.t.endpoint, s.t.curveKey);
    const body = Buffer.alloc(64 * 1024, 1);
    let queued = 0;
    const all = Array.from({ length: 4 * HIGH_WATER_MARK }, (_, i) =>
      sender.send(0, [Buffer.from(String(i)), body]).then(() => {
        queued++;
      }),
    );
    await new Promise((r) => setTimeout(r, 500));
    // Both queues and the kernel's buffers hold some, and the rest waits with the sender.
    expect(queued).toBeGreaterThan(HIGH_WATER_MARK / 2);
    expect(queued).toBeLessThan(4 * HIGH_WATER_MARK);
    s.start();
    await Promise.all(all);
    await until(() => s.got.length === 4 * HIGH_WATER_MARK, 20_000);
    expect(s.got.map((f) => Number(f[0]!.toString()))).toEqual(Array.from({ length: 4 * HIGH_WATER_MARK }, (_, i) => i));
  });

  it("a frame far over the message limit costs its sender the connection; the receiver holds nothing", async () => {
    const s = await rankSocket(64 * 1024);
    s.start();
    const p = push({ curveServerKey: s.t.curveKey!, curvePublicKey: s.member.publicKey, curveSecretKey: s.member.secretKey }, s.t.endpoint);
    await p.send(Buffer.alloc(64 * 1024 + FRAME_SLACK_BYTES + 1));
    await p.send("after");
    await new Promise((r) => setTimeout(r, 500));
    expect(s.got.every((f) => f[0]!.length <= 64 * 1024 + FRAME_SLACK_BYTES)).toBe(true);
  });
});

describe("the process's ZAP handler", () => {
  it("closes with its last domain and starts again at once for the next one", async () => {
    let s = await rankSocket();
    for (let i = 0; i < 5; i++) {
      const closing = s.t.close(); // closes the handler's socket; libzmq lets go of it a little later
      s = await rankSocket();
      await closing;
    }
  });
});
