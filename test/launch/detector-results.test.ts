/**
 * Goal: the failure detector suspects exactly the ranks that went silent (once armed), and
 * `--results` documents are valid JSON that keep the meaning of msgpack-only values.
 *
 * Method: drive FailureDetector with explicit times (it is pure); convert and write results to
 * a temp file and parse them back.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { FailureDetector } from "../../src/launch/detector.ts";
import { toJsonSafe, writeResultsFile } from "../../src/launch/results.ts";
import { tempDir } from "./helpers.ts";

describe("FailureDetector", () => {
  it("never suspects a rank that sent no heartbeat or step (nothing armed)", () => {
    const d = new FailureDetector({ size: 2, failureTimeoutMs: 100, stuckTimeoutMs: 100 });
    d.heard(0, 0, { heartbeat: false });
    expect(d.check(1_000_000)).toEqual([]);
  });

  it("suspects a rank silent for --failure-timeout after its first heartbeat, once", () => {
    const d = new FailureDetector({ size: 3, failureTimeoutMs: 1000, stuckTimeoutMs: undefined });
    d.heard(0, 0, { heartbeat: true });
    d.heard(1, 0, { heartbeat: true });
    d.heard(1, 900, { heartbeat: false }); // any message counts as being heard
    expect(d.check(999)).toEqual([]);
    expect(d.check(1000)).toEqual([{ kind: "heartbeat", rank: 0, silentMs: 1000 }]);
    expect(d.check(1900)).toEqual([{ kind: "heartbeat", rank: 1, silentMs: 1000 }]);
    expect(d.check(5000)).toEqual([]); // reported once
  });

  it("suspects a rank with no step boundary for --stuck-timeout, but not a finalized one", () => {
    const d = new FailureDetector({ size: 2, failureTimeoutMs: 10_000, stuckTimeoutMs: 500 });
    d.stepped(0, 100);
    d.stepped(1, 100);
    d.heard(0, 550, { heartbeat: true }); // heartbeats do not count as progress
    d.forget(1); // finalized: waiting for the others is not being stuck
    expect(d.check(599)).toEqual([]);
    expect(d.check(600)).toEqual([{ kind: "stuck", rank: 0, silentMs: 500 }]);
  });

  it("with --stuck-timeout, also suspects a rank that hangs before its first step", () => {
    const d = new FailureDetector({ size: 2, failureTimeoutMs: 10_000, stuckTimeoutMs: 500 });
    d.armSteps(0, 1000);
    d.armSteps(1, 1000);
    d.stepped(1, 1400);
    expect(d.check(1499)).toEqual([]);
    expect(d.check(1500)).toEqual([{ kind: "stuck", rank: 0, silentMs: 500 }]);
    expect(d.check(1900)).toEqual([{ kind: "stuck", rank: 1, silentMs: 500 }]);
  });

  it("suspects a process that has not joined --start-timeout after it started; its hello disarms that", () => {
    const d = new FailureDetector({ size: 3, failureTimeoutMs: 1000, stuckTimeoutMs: undefined, startTimeoutMs: 3000 });
    d.started(0, 0);
    d.started(1, 0);
    d.started(2, 500);
    d.joined(1);
    d.heard(1, 2500, { heartbeat: true });
    expect(d.check(2999)).toEqual([]);
    expect(d.check(3000)).toEqual([{ kind: "start", rank: 0, silentMs: 3000 }]);
    expect(d.check(3500)).toEqual([
      { kind: "heartbeat", rank: 1, silentMs: 1000 },
      { kind: "start", rank: 2, silentMs: 3000 },
    ]);
    // A new process of rank 0 is watched afresh, its start-up included.
    d.started(0, 4000);
    expect(d.check(6999)).toEqual([]);
    expect(d.check(7000)).toEqual([{ kind: "start", rank: 0, silentMs: 3000 }]);
  });

  it("watches a restarted rank afresh", () => {
    const d = new FailureDetector({ size: 1, failureTimeoutMs: 100, stuckTimeoutMs: undefined });
    d.heard(0, 0, { heartbeat: true });
    d.reset(0);
    expect(d.check(10_000)).toEqual([]);
  });
});

describe("results", () => {
  const { dir, cleanup } = tempDir("lifeline-results-");
  afterAll(cleanup);

  it("converts msgpack-only values to JSON-safe ones", () => {
    expect(
      toJsonSafe({
        big: 2n ** 70n,
        f64: new Float64Array([0.5, -1]),
        i64: new BigInt64Array([-3n]),
        bytes: Buffer.from([1, 2]),
        map: new Map<unknown, unknown>([
          ["a", 1],
          [2, new Set([3n])],
        ]),
        date: new Date(0),
        nan: NaN,
        inf: -Infinity,
        nothing: undefined,
        nested: [[1, undefined]],
      }),
    ).toEqual({
      big: "1180591620717411303424",
      f64: [0.5, -1],
      i64: ["-3"],
      bytes: [1, 2],
      map: { a: 1, 2: ["3"] },
      date: "1970-01-01T00:00:00.000Z",
      nan: "NaN",
      inf: "-Infinity",
      nothing: null,
      nested: [[1, null]],
    });
  });

  it("writes the document with null for ranks that did not finalize", async () => {
    const path = join(dir, "out.json");
    await writeResultsFile(path, {
      ranks: [7n, undefined, "x"],
      restarts: 0,
      mode: "none",
      size: 3,
      wallMs: 12,
      exitCode: 137,
      error: { code: "LAUNCH_RANK_FAILED", message: "rank 1 was killed by SIGKILL" },
    });
    expect(JSON.parse(readFileSync(path, "utf8"))).toEqual({
      ranks: ["7", null, "x"],
      restarts: 0,
      mode: "none",
      size: 3,
      wallMs: 12,
      exitCode: 137,
      error: { code: "LAUNCH_RANK_FAILED", message: "rank 1 was killed by SIGKILL" },
    });
  });

  it("fails with LAUNCH_USAGE when the file cannot be written", async () => {
    await expect(
      writeResultsFile(join(dir, "missing", "out.json"), { ranks: [], restarts: 0, mode: "none", size: 0, wallMs: 0, exitCode: 0 }),
    ).rejects.toMatchObject({
      code: "LAUNCH_USAGE",
    });
  });
});
