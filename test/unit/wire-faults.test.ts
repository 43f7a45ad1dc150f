// Goal: the frame header round-trips every field and rejects garbage with a reason; fault
// specs parse, reject malformed input with LAUNCH_FAULT_SPEC, and fire at the right count.
import { describe, expect, it } from "vitest";
import { decodeHeader, encodeHeader, Encoding, type Header, Kind } from "../../src/mpi/wire.ts";
import { FaultPlan, parseFaults } from "../../src/mpi/faults.ts";
import { isLifelineError } from "../../src/errors.ts";

const h: Header = {
  kind: Kind.collective,
  flags: 3,
  encoding: Encoding.typedArray,
  key: 0xdeadbeef,
  source: 2,
  tag: 77,
  channelSeq: 2 ** 32 - 1,
  epoch: 9,
  collSeq: 5,
  signature: 0x12345678,
  arrayType: 9,
  attempt: 3,
};

describe("wire header", () => {
  it("round-trips every field", () => {
    expect(decodeHeader(encodeHeader(h), { keysIn: [0, 0, 0xdeadbeef, 0], size: 4 })).toEqual(h);
  });

  it.each([
    ["short", Buffer.alloc(10), "bytes"],
    ["bad magic", Buffer.alloc(40), "magic"],
    ["another channel's key", encodeHeader({ ...h, key: 1 }), "without the key of that channel"],
    ["another source's claim", encodeHeader({ ...h, source: 1 }), "from rank 1 without the key"],
    ["source out of range", encodeHeader({ ...h, source: 4 }), "source rank 4"],
    [
      "unknown kind",
      (() => {
        const b = encodeHeader(h);
        b[5] = 9;
        return b;
      })(),
      "kind",
    ],
  ])("rejects %s", (_, buf, reason) => {
    let caught: unknown;
    try {
      decodeHeader(buf, { keysIn: [0, 0, 0xdeadbeef, 0], size: 4 });
    } catch (err) {
      caught = err;
    }
    expect(isLifelineError(caught, "MPI_DECODE")).toBe(true);
    expect((caught as Error).message).toContain(reason);
  });
});

describe("fault specs", () => {
  it("parses every trigger kind", () => {
    expect(parseFaults("step:5; send:2 ;time:1500;mock:1,0@attempt=1;hang:step:3")).toEqual([
      { kind: "step", n: 5, attempt: 0, action: "kill" },
      { kind: "send", n: 2, attempt: 0, action: "kill" },
      { kind: "time", ms: 1500, attempt: 0, action: "kill" },
      { kind: "mock", version: 1, seqno: 0, attempt: 1, action: "kill" },
      { kind: "step", n: 3, attempt: 0, action: "hang" },
    ]);
  });

  it.each(["step:0", "step:x", "boom:1", "mock:1", "time:-1", "send:1@attempt=z"])("rejects %s", (spec) => {
    let caught: unknown;
    try {
      parseFaults(spec);
    } catch (err) {
      caught = err;
    }
    expect(isLifelineError(caught, "LAUNCH_FAULT_SPEC")).toBe(true);
  });

  it("fires at the Nth event of the matching attempt only", () => {
    const fired: string[] = [];
    const plan = new FaultPlan(parseFaults("step:2;send:1@attempt=1;mock:0,1"), 0, (_, why) => fired.push(why));
    plan.onSend();
    plan.onCheckpoint();
    expect(fired).toEqual([]);
    plan.onCheckpoint();
    plan.onCollective(0, 0);
    plan.onCollective(0, 1);
    expect(fired).toEqual(["step:2", "mock:0,1"]);
    plan.dispose();
  });

  it("line:N fires once, at the first checkpoint() after line N or a newer one is committed", () => {
    const fired: string[] = [];
    const plan = new FaultPlan(parseFaults("hang:line:2"), 0, (action, why) => fired.push(`${action} ${why}`));
    plan.onCheckpoint();
    plan.onCommitted(1);
    plan.onCheckpoint();
    expect(fired).toEqual([]);
    plan.onCommitted(3);
    expect(fired).toEqual([]);
    plan.onCheckpoint();
    plan.onCheckpoint();
    expect(fired).toEqual(["hang line:2"]);
  });
});
