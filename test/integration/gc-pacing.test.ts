/**
 * Goal: a rank that mostly receives frees the messages it handled in scavenges that it paces
 * by the bytes arriving (src/mpi/zmq/gc-pacing.ts), not in full mark-compacts of its heap; and
 * `--no-gc-pacing` leaves that to V8.
 *
 * Method: test/fixtures/launch/gc-count.ts streams 1,500 messages of 1 MiB from rank 0 to rank
 * 1 through the real launcher and ZeroMQ, and rank 1 counts, from Node's `gc` performance
 * entries, V8's full collections and the young-generation ones forced by a `gc()` call (only
 * the pacing calls it there) while it receives them.
 * - Paced: a forced scavenge per 16 MiB that V8 did not collect by itself (93 in every run made
 *   while the test was written, with two busy loops beside it too), and no full collection.
 * - Unpaced: no forced scavenge, whatever the load. Its full collections are not asserted: 20
 *   to 38 on an idle machine, but 4 in a CI run. With zmqHost hard-wired to `gcPacing: false`,
 *   the paced run had 0 forced scavenges (and 6 full collections) and the test failed.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { CliProcess, FIXTURES, killCli, tempDir, requireBuild } from "../launch/helpers.ts";

const { dir, cleanup } = tempDir("lifeline-gc-pacing-");
let started: CliProcess[] = [];

beforeAll(requireBuild);
afterEach(() => {
  for (const cli of started) killCli(cli);
  started = [];
});
afterAll(cleanup);

/** Rank 1's collections while it received the stream, with `flags` added to `lifeline run`. */
async function collections(name: string, flags: string[]): Promise<{ full: number; forced: number }> {
  const results = join(dir, `${name}.json`);
  const cli = new CliProcess(["run", "-n", "2", "--mode", "none", "--json", "--results", results, ...flags, join(FIXTURES, "gc-count.ts"), "1500"], {
    timeoutMs: 60_000,
  });
  started.push(cli);
  const r = await cli.done;
  expect(r.code, r.stderr).toBe(0);
  const doc = JSON.parse(readFileSync(results, "utf8")) as { ranks: { rank: number; full?: number; forced?: number }[] };
  return { full: doc.ranks[1]!.full!, forced: doc.ranks[1]!.forced! };
}

describe("collections paced by what a rank receives", () => {
  it("the receiver of 1,500 MiB-sized messages runs scavenges of its own and (nearly) no full collection; --no-gc-pacing, none of its own", async () => {
    const paced = await collections("paced", []);
    expect(paced.forced, JSON.stringify(paced)).toBeGreaterThanOrEqual(10);
    expect(paced.full, JSON.stringify(paced)).toBeLessThanOrEqual(5);
    const unpaced = await collections("unpaced", ["--no-gc-pacing"]);
    expect(unpaced.forced, JSON.stringify(unpaced)).toBe(0);
  }, 120_000);
});
