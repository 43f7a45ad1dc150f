/**
 * Goal: `lifeline run --mode none` end to end with real rank programs — a clean job delivers
 * every rank's result and output; any failure (crash, signal, exception, exit without
 * finalize, a rank that never joins, a stuck or frozen rank) fails the job fast, names the
 * rank, how it ended and its last stderr lines, sets the documented exit code, and leaves no
 * process behind.
 *
 * Method: run the source CLI (through tsx) on fixtures in test/fixtures/launch, which import
 * "lifeline" (the package's self-reference, so `npm run build` must have produced dist/).
 * `--json` events give the rank pids and the launcher's own timestamps, so the fail-fast bound
 * is measured inside the launcher, not across a loaded machine's process start-up. Jobs use
 * 2–4 ranks; every test kills what it started.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { RANK_INITIAL_OLD_SPACE_MIB, RANK_MALLOC_TUNABLES } from "../../src/launch/rank-process.ts";
import { CliProcess, FIXTURES, killCli, tempDir, requireBuild, waitGone } from "../launch/helpers.ts";
import { tunablesPrinted } from "./cpr-run.ts";

const { dir, cleanup } = tempDir("lifeline-launcher-");
let started: CliProcess[] = [];

beforeAll(requireBuild);
afterEach(() => {
  for (const cli of started) killCli(cli);
  started = [];
});
afterAll(cleanup);

function launch(args: string[], env?: NodeJS.ProcessEnv): CliProcess {
  const cli = new CliProcess(["run", "--mode", "none", "--json", ...args], { timeoutMs: 40_000, ...(env === undefined ? {} : { env }) });
  started.push(cli);
  return cli;
}

type Ev = Record<string, unknown>;
const ofKind = (events: Ev[], kind: string): Ev[] => events.filter((e) => e.event === kind);

/** Asserts that every rank process the launcher started is gone. */
async function expectNoSurvivors(cli: CliProcess): Promise<void> {
  const pids = cli.rankPids();
  expect(pids.length).toBeGreaterThan(0);
  expect(await waitGone(pids, 2_000)).toEqual([]);
}

describe("a clean job", () => {
  it("4 ranks of a .ts app: every result in --results, output prefixed by rank, exit 0", async () => {
    const results = join(dir, "ok.json");
    // A glibc tunable of the user's own: it comes after the launcher's, so it wins (rank-process.ts).
    const cli = launch(["-n", "4", "--results", results, join(FIXTURES, "ok.ts"), "3"], { ...process.env, GLIBC_TUNABLES: "glibc.malloc.tcache_count=7" });
    const r = await cli.done;
    expect(r.code, r.stderr).toBe(0);
    const doc = JSON.parse(readFileSync(results, "utf8"));
    // allreduce(rank + i) over 4 ranks for i = 0..2: (6) + (10) + (14) = 30.
    expect(doc).toMatchObject({ restarts: 0, mode: "none", size: 4, exitCode: 0 });
    expect(typeof doc.wallMs).toBe("number");
    expect(doc.ranks).toEqual(
      [0, 1, 2, 3].map((rank) => ({
        rank,
        size: 4,
        sum: 30,
        big: String(2n ** 62n + BigInt(rank)),
        v: [rank, 0.5],
      })),
    );
    for (let rank = 0; rank < 4; rank++) expect(r.stdout).toContain(`[${rank}] rank ${rank} of 4: sum 30\n`);
    // Every rank's V8 starts with the larger first old-generation limit (rank-process.ts).
    for (let rank = 0; rank < 4; rank++)
      expect(r.stdout).toMatch(new RegExp(`^\\[${rank}\\] rank ${rank} node flags: .*--initial-old-space-size=${RANK_INITIAL_OLD_SPACE_MIB}\\b`, "m"));
    // Each paces its scavenges (the default: no variable), and took V8's gc() for that without
    // giving the program's global object one (gc-pacing.ts).
    for (let rank = 0; rank < 4; rank++) expect(r.stdout).toContain(`[${rank}] rank ${rank} gc pacing: (unset); global gc: undefined\n`);
    const events = cli.events.all;
    // And glibc's malloc tunables (on stderr: an event each), the user's after the launcher's.
    expect(tunablesPrinted(events, 4).printed).toEqual([0, 1, 2, 3].map((rank) => `rank ${rank} malloc: ${RANK_MALLOC_TUNABLES}:glibc.malloc.tcache_count=7`));
    expect(ofKind(events, "rank-spawned")).toHaveLength(4);
    expect(ofKind(events, "rank-up")).toHaveLength(4);
    expect(ofKind(events, "job-started")).toHaveLength(1);
    expect(
      ofKind(events, "rank-finalized")
        .map((e) => e.rank)
        .sort(),
    ).toEqual([0, 1, 2, 3]);
    expect(ofKind(events, "output").map((e) => e.line)).toContain("rank 2 says goodbye on stderr");
    expect(ofKind(events, "job-finished")).toEqual([expect.objectContaining({ ok: true, exitCode: 0, finalized: 4, size: 4 })]);
    // Under --json every stderr line is an event.
    for (const line of r.stderr.trimEnd().split("\n")) expect(() => JSON.parse(line)).not.toThrow();
    await expectNoSurvivors(cli);
  });

  it("a .js app over tcp, with plain progress lines on a pipe (and glibc's malloc defaults, V8's collections unpaced)", async () => {
    const cli = new CliProcess(["run", "-n", "2", "--mode", "none", "--transport", "tcp", "--no-malloc-tuning", "--no-gc-pacing", join(FIXTURES, "ok.js")], {
      timeoutMs: 40_000,
    });
    started.push(cli);
    const r = await cli.done;
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain("[0] js rank 0: total 3\n");
    expect(r.stdout).toContain("[1] js rank 1: total 3\n");
    expect(r.stdout).toMatch(new RegExp(`^\\[1\\] js rank 1 node flags: .*--initial-old-space-size=${RANK_INITIAL_OLD_SPACE_MIB}\\b`, "m"));
    // --no-malloc-tuning: the ranks get the launcher's environment's tunables (if any) and no more.
    expect(r.stdout).toContain(`[1] js rank 1 malloc: ${process.env.GLIBC_TUNABLES ?? "(unset)"}\n`);
    expect(r.stdout).toContain("[1] js rank 1 gc pacing: 0; global gc: undefined\n");

    expect(r.stderr).not.toMatch(/[\x00-\x09\x0b-\x1f]/);
    expect(r.stderr).toMatch(/^lifeline: job ok-[0-9a-f]{8}: starting 2 ranks of .*ok\.js \(mode none\)$/m);
    expect(r.stderr).toMatch(/^lifeline: all 2 ranks up after \d+\.\d+s$/m);
    expect(r.stderr).toMatch(/^lifeline: rank 1 finalized at /m);
    expect(r.stderr).toMatch(/^lifeline: done: 2\/2 ranks finalized in /m);
    expect(r.stderr).toMatch(/^lifeline: {3}rank 0: \{ rank: 0, total: 3 \}$/m);
  });
});

describe("fail fast in mode none", () => {
  /** Runs crash.ts with `how` on rank 1 of 3 and returns the launcher's result and events. */
  async function crash(how: string, extra: string[] = []) {
    const results = join(dir, `crash-${how}.json`);
    const cli = launch(["-n", "3", "--results", results, ...extra, join(FIXTURES, "crash.ts"), "1", how]);
    const r = await cli.done;
    const events = cli.events.all;
    const failed = ofKind(events, "rank-failed");
    const finished = ofKind(events, "job-finished")[0]!;
    const died = ofKind(events, "rank-exited").find((e) => e.rank === 1)!;
    return { cli, r, events, failed, finished, died, doc: JSON.parse(readFileSync(results, "utf8")) };
  }

  it("a rank killed by SIGKILL: exit 137 within 1 s, rank, signal and stderr tail reported", async () => {
    const { cli, r, failed, finished, died, doc } = await crash("sigkill");
    expect(r.code, r.stderr).toBe(137);
    expect(failed).toEqual([expect.objectContaining({ rank: 1, signal: "SIGKILL", code: null, reason: "was killed by SIGKILL before finalizing" })]);
    // The last 20 stderr lines, the newest last.
    const tail = failed[0]!.stderrTail as string[];
    expect(tail).toHaveLength(20);
    expect(tail.at(-1)).toBe("rank 1 is about to fail (sigkill)");
    expect(tail[0]).toBe("rank 1 stderr line 7");
    // Measured on the launcher's clock: from the rank's death to the job being over.
    expect((finished.t as number) - (died.t as number)).toBeLessThan(1_000);
    expect(finished).toMatchObject({ ok: false, exitCode: 137, error: { code: "LAUNCH_RANK_FAILED" } });
    expect((finished.error as { message: string }).message).toMatch(/^rank 1 \(pid \d+\) was killed by SIGKILL before finalizing$/);
    expect(doc).toMatchObject({ ranks: [null, null, null], exitCode: 137, error: { code: "LAUNCH_RANK_FAILED" } });
    expect(doc.error.message).toContain("rank 1 is about to fail (sigkill)");
    await expectNoSurvivors(cli);
  });

  it("a rank that exits with code 3: exit 3, in plain text too", async () => {
    const cli = new CliProcess(["run", "-n", "2", "--mode", "none", join(FIXTURES, "crash.ts"), "1", "exit3"], { timeoutMs: 40_000 });
    started.push(cli);
    const r = await cli.done;
    expect(r.code, r.stderr).toBe(3);
    // The failure in one line, with the last line of its stderr (no line states an error);
    // the stderr itself was forwarded as it came, and is not repeated.
    expect(r.stderr).toMatch(/^lifeline: error: rank 1 \(pid \d+\) exited with code 3 before finalizing: rank 1 is about to fail \(exit3\)$/m);
    expect(r.stderr).toMatch(/^\[1\] rank 1 is about to fail \(exit3\)$/m);
    expect(r.stderr.match(/rank 1 stderr line 25$/gm)).toHaveLength(1);
    expect(r.stderr).toMatch(/^lifeline: job failed \(exit 3\) after .*, 0\/2 ranks finalized: see the error above$/m);
  });

  it("an uncaught exception: the stack trace is in the tail", async () => {
    const { cli, r, failed } = await crash("throw");
    expect(r.code, r.stderr).toBe(1);
    expect(failed[0]).toMatchObject({ rank: 1, code: 1, reason: "exited with code 1 before finalizing" });
    const tail = (failed[0]!.stderrTail as string[]).join("\n");
    expect(tail).toContain("deliberate failure in rank code");
    // The .ts program ran compiled for the job (.lifeline-cache/), its trace mapped back.
    expect(tail).toContain(`${join(FIXTURES, "crash.ts")}:22`);
    await expectNoSurvivors(cli);
  });

  it("a rank that exits 0 without calling finalize() fails the job with exit 1", async () => {
    const { cli, r, failed, finished } = await crash("exit0");
    expect(r.code, r.stderr).toBe(1);
    expect(failed[0]).toMatchObject({ rank: 1, code: 0, reason: "exited with code 0 without calling finalize()" });
    expect(finished).toMatchObject({ exitCode: 1 });
    await expectNoSurvivors(cli);
  });

  it("a rank that asks for an abort stops the job with the rank's error code and message", async () => {
    const cli = launch(["-n", "3", join(FIXTURES, "mismatch.ts")]);
    const r = await cli.done;
    expect(r.code, r.stderr).toBe(1);
    const failed = ofKind(cli.events.all, "rank-failed");
    expect(failed).toEqual([expect.objectContaining({ rank: 0 })]);
    expect(failed[0]!.reason).toMatch(/^aborted the job: MPI_COLLECTIVE_MISMATCH: scatter: the root must pass an array of exactly 3 items/);
    expect(ofKind(cli.events.all, "job-finished")[0]).toMatchObject({ exitCode: 1, error: { code: "MPI_COLLECTIVE_MISMATCH" } });
    await expectNoSurvivors(cli);
  });

  it("--inject kills the chosen rank at the chosen point", async () => {
    const cli = launch(["-n", "2", "--inject", "1@step:2", join(FIXTURES, "ok.ts"), "5"]);
    const r = await cli.done;
    expect(r.code, r.stderr).toBe(137);
    const failed = ofKind(cli.events.all, "rank-failed");
    expect(failed).toEqual([expect.objectContaining({ rank: 1, signal: "SIGKILL" })]);
    expect((failed[0]!.stderrTail as string[]).join("\n")).toMatch(/injected fault.*step:2/);
    await expectNoSurvivors(cli);
  });
});

describe("ranks that are alive but not working", () => {
  it("a program that never calls init() fails the rendezvous with its stderr", async () => {
    const cli = launch(["-n", "2", "--rendezvous-timeout", "1s", join(FIXTURES, "no-init.mjs")]);
    const r = await cli.done;
    expect(r.code, r.stderr).toBe(1);
    const finished = ofKind(cli.events.all, "job-finished")[0]!;
    expect(finished).toMatchObject({ exitCode: 1, error: { code: "LAUNCH_RENDEZVOUS" } });
    expect((finished.error as { message: string }).message).toMatch(/ranks 0, 1 did not join the job within 1000 ms/);
    const stopping = ofKind(cli.events.all, "job-stopping")[0]!;
    expect(stopping.stderrTail).toEqual(["this program forgot to call init()"]);
    await expectNoSurvivors(cli);
  });

  it("a rank with no step boundary for --stuck-timeout is killed and fails the job", async () => {
    const cli = launch(["-n", "2", "--stuck-timeout", "1500ms", join(FIXTURES, "forever.ts"), "stall"]);
    const r = await cli.done;
    expect(r.code, r.stderr).toBe(1);
    const failed = ofKind(cli.events.all, "rank-failed");
    expect(failed).toEqual([expect.objectContaining({ rank: 1 })]);
    expect(failed[0]!.reason).toMatch(/reached no step boundary .* for \d+ ms \(--stuck-timeout 1500 ms\): stuck, killed/);
    expect(ofKind(cli.events.all, "job-finished")[0]).toMatchObject({ error: { code: "LAUNCH_STUCK" } });
    await expectNoSurvivors(cli);
  });

  it("a program that ends without finalize() (its process cannot end: Lifeline's sockets hold it): each rank says so on stderr after 5 s", async () => {
    const cli = launch(["-n", "2", join(FIXTURES, "idle.ts"), "forget"]);
    const isWarning = (e: Ev): boolean => e.event === "output" && e.stream === "stderr" && /has not called world\.finalize\(\)/.test(String(e.line));
    const first = await cli.events.waitFor(isWarning, 15_000, "the idle warning");
    await cli.events.waitFor((e) => isWarning(e) && e.rank !== first.rank, 5_000, "the other rank's idle warning");
    expect(String(first.line)).toMatch(
      /^lifeline: rank [01]: the program has made no Lifeline call for 5 s and waits for nothing .* end every rank's program with `await world\.finalize\(\)`\.$/,
    );
    // Not before the 5 s are up (the idle stretch starts after the allreduce, after the job started).
    const started = ofKind(cli.events.all, "job-started")[0]!;
    expect((first.t as number) - (started.t as number)).toBeGreaterThanOrEqual(5_000);
    expect(ofKind(cli.events.all, "rank-finalized")).toEqual([]);
    cli.child.kill("SIGTERM");
    const r = await cli.done;
    expect(r.code, r.stderr).toBe(143);
    // Once per idle stretch.
    expect(cli.events.all.filter(isWarning)).toHaveLength(2);
    await expectNoSurvivors(cli);
  });

  it("waits longer than 5 s that are not the end (a timer of the program's, a receive, a barrier, a send waiting for its receipt): no idle warning", async () => {
    const cli = launch(["-n", "2", join(FIXTURES, "idle.ts"), "waits"]);
    const r = await cli.done;
    expect(r.code, r.stderr).toBe(0);
    expect(ofKind(cli.events.all, "job-finished")[0]).toMatchObject({ exitCode: 0 });
    // The three waits of 7.5 s each did happen.
    expect(r.ms).toBeGreaterThan(22_000);
    expect(r.stderr).not.toContain("world.finalize()");
  });

  it("a frozen rank that stops heartbeating is killed after --failure-timeout", async () => {
    const cli = launch(["-n", "2", "--heartbeat", "100", "--failure-timeout", "1000", join(FIXTURES, "proto-rank.ts"), "1", "100"]);
    const r = await cli.done;
    expect(r.code, r.stderr).toBe(1);
    const failed = ofKind(cli.events.all, "rank-failed");
    expect(failed).toEqual([expect.objectContaining({ rank: 1, stderrTail: ["rank 1 freezing now"] })]);
    expect(failed[0]!.reason).toMatch(/sent no heartbeat for \d+ ms \(--failure-timeout 1000 ms\): frozen or unreachable, killed/);
    expect(ofKind(cli.events.all, "job-finished")[0]).toMatchObject({ error: { code: "LAUNCH_HEARTBEAT" } });
    await expectNoSurvivors(cli);
  });
});
