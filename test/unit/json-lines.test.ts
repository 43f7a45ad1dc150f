import { PassThrough } from "node:stream";
import { describe, expect, it } from "vitest";
import { type JsonEvent, onJsonLines } from "../../src/testing/json-lines.ts";

describe("onJsonLines", () => {
  it("joins lines split across chunks and sorts events from other lines", async () => {
    const stream = new PassThrough();
    const events: JsonEvent[] = [];
    const other: string[] = [];
    onJsonLines(
      stream,
      (ev) => events.push(ev),
      (line) => other.push(line),
    );
    stream.write('{"event":"job-st');
    stream.write('arting","n":4}\nrank 1: hello\n{not json}\n');
    stream.write('["an","array"]\n{"event":"rank-step","steps":3}\n{"event":"partial"');
    stream.end();
    await new Promise((resolve) => stream.on("end", resolve).resume());
    expect(events).toEqual([
      { event: "job-starting", n: 4 },
      { event: "rank-step", steps: 3 },
    ]);
    // A "{" line that does not parse is a rank's own line; the unterminated last line is not reported.
    expect(other).toEqual(["rank 1: hello", "{not json}", '["an","array"]']);
  });
});
