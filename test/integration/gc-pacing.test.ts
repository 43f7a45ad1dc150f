/**
 * Goal: a rank that mostly receives frees the messages it handled in scavenges that it paces
 * by the bytes arriving (src/mpi/zmq/gc-pacing.ts), not in full mark-compacts of its heap; and
 * `--no-gc-pacing` leaves that to V8.
 *
 * Method: test/fixtures/launch/gc-count.ts streams 1,500 messages of 1 MiB from rank 0 to rank
 * 1 through the real launcher and ZeroMQ, and rank 1 counts V8's full collections while it
 * receives them (Node's `gc` performance entries). Paced, it ran none (0 in runs made while the
 * test was written, under load too); unpaced, 20 to 38. The bounds leave room either side.
 */
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { CliProcess, FIXTURES, killAll, ROOT, tempDir } from "../launch/helpers.ts";

const { dir, cleanup } = tempDir("lifeline-gc-pacing-");
let started: CliProcess[] = [];

beforeAll(() => {
  if (!existsSync(join(ROOT, "dist", "index.js"))) throw new Error("dist/index.js is missing: run `npm run build` first");
});
afterEach(() => {
  for (const cli of started) {
    killAll(cli.rankPids());
    if (cli.child.exitCode === null && cli.child.signalCode === null) cli.child.kill("SIGKILL");
  }
  started = [];
});
afterAll(cleanup);

/** Rank 1's full collections while it received the stream, with `flags` added to `lifeline run`. */
async function fullCollections(name: string, flags: string[]): Promise<number> {
  const results = join(dir, `${name}.json`);
  const cli = new CliProcess(["run", "-n", "2", "--mode", "none", "--json", "--results", results, ...flags, join(FIXTURES, "gc-count.ts"), "1500"], {
    timeoutMs: 60_000,
  });
  started.push(cli);
  const r = await cli.done;
  expect(r.code, r.stderr).toBe(0);
  const doc = JSON.parse(readFileSync(results, "utf8")) as { ranks: { rank: number; full?: number }[] };
  return doc.ranks[1]!.full!;
}

describe("collections paced by what a rank receives", () => {
  it("the receiver of 1,500 MiB-sized messages runs (nearly) no full collection; --no-gc-pacing, many", async () => {
    expect(await fullCollections("paced", [])).toBeLessThanOrEqual(3);
    expect(await fullCollections("unpaced", ["--no-gc-pacing"])).toBeGreaterThanOrEqual(8);
  }, 120_000);
});
