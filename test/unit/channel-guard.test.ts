/**
 * Goal: what the channel lets through from a peer it cannot tell apart by connection (one Pull
 * socket takes every peer's frames): a frame counts as rank s's only with the key of the
 * channel s → this rank, so a rank (or another job) cannot pass its frames off as another
 * rank's; frames of an incarnation the coordinator said was replaced are refused; a message
 * over the limit is refused by the sender with MPI_LIMIT (nothing counted, nothing lent) and
 * dropped by the receiver with a warning naming the sender.
 *
 * Method: three Channels over an in-memory transport with the coordinator's kind of key
 * matrix; rank 2 plays the compromised peer by handing rank 1 frames it built itself.
 */
import { describe, expect, it } from "vitest";
import { encodeBody } from "../../src/mpi/codec.ts";
import type { Header } from "../../src/mpi/wire.ts";
import { forgedHeader } from "../../src/testing/compromised.ts";
import { isLifelineError } from "../../src/errors.ts";
import { memChannels } from "./mem-channels.ts";
import { ControlLink } from "../../src/mpi/control-link.ts";

const SIZE = 3;
const key = (s: number, d: number): number => (0x9e3779b9 * (s * SIZE + d + 1)) >>> 0;

const cluster = (maxMessageBytes = 1 << 20) => memChannels(SIZE, { maxMessageBytes, key });

/** A frame as a peer could build it: a header with any fields, and a raw body. */
function forged(h: Partial<Header>, body: string): Buffer[] {
  return [forgedHeader({ source: 2, tag: 5, arrayType: 12, ...h }), Buffer.from(body)];
}

const settle = (): Promise<void> => new Promise((r) => setTimeout(r, 20));

describe("channel: who a frame is from", () => {
  it("rank 2 cannot pass a frame off as rank 0's (it lacks channel 0→1's key); its own frames carry its name", async () => {
    const { channels, delivered, warnings } = cluster();
    const victim = channels[1]!;
    victim.onFrames(forged({ source: 0, key: key(2, 1) }, "forged as 0"));
    victim.onFrames(forged({ source: 0, key: key(0, 2) }, "another channel's key"));
    victim.onFrames(forged({ source: 2, key: 12345 }, "another job's key"));
    victim.onFrames(forged({ source: 2, key: key(2, 1) }, "honest"));
    await channels[0]!.sendApp(Buffer.from("real"), 1, 5);
    await settle();
    expect(delivered.map(({ source, data }) => ({ source, data }))).toEqual([
      { source: 2, data: "honest" },
      { source: 0, data: "real" },
    ]);
    expect(warnings).toHaveLength(3);
    for (const w of warnings) expect(w).toMatch(/rank 1: dropping a malformed frame: frame claims to come from rank [02] without the key of that channel/);
  });

  it("frames of an incarnation the coordinator replaced are refused; the new one's pass", async () => {
    const { channels, delivered } = cluster();
    const victim = channels[1]!;
    victim.peerRestarted(2, 3);
    victim.onFrames(forged({ source: 2, key: key(2, 1), attempt: 2 }, "old incarnation"));
    victim.onFrames(forged({ source: 2, key: key(2, 1), attempt: 3 }, "current"));
    victim.peerRestarted(2, 1); // news older than what it knows changes nothing
    victim.onFrames(forged({ source: 2, key: key(2, 1), attempt: 2 }, "old again"));
    await settle();
    expect(delivered.map((d) => d.data)).toEqual(["current"]);
  });
});

describe("channel: the message limit", () => {
  it("the sender refuses a message over the limit with MPI_LIMIT, before counting it; the next one goes as #0", async () => {
    const { channels, delivered, sent } = cluster(4096);
    let caught: unknown;
    await channels[0]!.sendApp(new Float64Array(513), 1, 1).catch((err: unknown) => (caught = err));
    expect(isLifelineError(caught, "MPI_LIMIT")).toBe(true);
    expect((caught as Error).message).toMatch(/a message of 4104 bytes to rank 1 is longer than the job's limit of 4096 bytes \(--max-message\)/);
    await expect(channels[0]!.sendApp({ nested: [new Float64Array(600)] }, 1, 1)).rejects.toMatchObject({ code: "MPI_LIMIT" });
    await channels[0]!.sendApp(new Float64Array(512), 1, 2);
    await settle();
    expect(sent.map((x) => x.channelSeq)).toEqual([0]);
    expect(delivered.map((d) => d.tag)).toEqual([2]);
    expect(channels[0]!.lentCount).toBe(0);
  });

  it("a logged send (retry-one) over the limit is refused with MPI_LIMIT too, before it is counted or logged", async () => {
    const { channels, delivered, sent } = cluster(4096);
    const logged: number[] = [];
    channels[0]!.appLog = { copyBody: (_dest, b) => Buffer.from(b), record: (_dest, f) => void logged.push(f.appSeq) };
    await expect(channels[0]!.sendApp(new Float64Array(513), 1, 1)).rejects.toMatchObject({ code: "MPI_LIMIT" });
    await channels[0]!.sendApp(new Float64Array(512), 1, 2);
    await settle();
    expect(logged).toEqual([0]);
    expect(sent.map((x) => x.channelSeq)).toEqual([0]);
    expect(delivered.map((d) => d.tag)).toEqual([2]);
  });

  it("the receiver drops a message over the limit (one frame or several) with a warning naming its sender", async () => {
    const { channels, delivered, warnings } = cluster(4096);
    const victim = channels[1]!;
    victim.onFrames(forged({ source: 2, key: key(2, 1) }, "x".repeat(4097)));
    const body = encodeBody({ a: Buffer.alloc(3000), b: Buffer.alloc(3000) }, { copy: true });
    const h = forged({ source: 2, key: key(2, 1), encoding: body.encoding, arrayType: 0 }, "")[0]!;
    victim.onFrames([h, ...body.frames.map((f) => Buffer.from(f))]);
    victim.onFrames(forged({ source: 2, key: key(2, 1) }, "x".repeat(4096)));
    await settle();
    expect(delivered.map((d) => d.data.length)).toEqual([4096]);
    expect(warnings).toEqual([
      expect.stringMatching(/rank 1: dropping a malformed frame from rank 2: a message longer than the job's limit of 4096 bytes/),
      expect.stringMatching(/from rank 2: a message longer than the job's limit/),
    ]);
  });
});

describe("control link: the message limit", () => {
  it("refuses a message to the coordinator over the limit with MPI_LIMIT (the coordinator would drop the link)", async () => {
    const link = ControlLink.connect("tcp://127.0.0.1:9", "r0.0", () => undefined, { maxMessageBytes: 1024 });
    try {
      await expect(link.send({ t: "finalize", rank: 0, result: Buffer.alloc(2048) })).rejects.toMatchObject({
        code: "MPI_LIMIT",
        message: expect.stringMatching(/a finalize message of \d+ bytes to the coordinator is longer than the job's limit of 1024 bytes/),
      });
    } finally {
      await link.close();
    }
  });
});
