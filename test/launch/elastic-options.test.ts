/**
 * Goal: the flags of `--mode elastic` (--min-np, --max-np, --elastic-timeout, --replay) are
 * validated with messages that name the flag and say what to do, an elastic job has one rank
 * process per slot, a replay's recorded changes must chain, and `lifeline coordinator` refuses
 * the mode (it starts ranks into the running job, which only `lifeline run` does).
 *
 * Method: resolveRunConfig / readReplay / the CLI's main() with raw strings; nothing is started.
 */
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { main } from "../../src/cli.ts";
import { resolveDrillConfig } from "../../src/launch/drill.ts";
import { DEFAULTS, readReplay, resolveRunConfig, type RunFlags } from "../../src/launch/options.ts";
import { tempDir, usageMessage } from "./helpers.ts";

const { dir, cleanup } = tempDir("lifeline-elastic-options-");
afterAll(cleanup);
writeFileSync(join(dir, "app.ts"), "export {};\n");

const resolveWith = (flags: RunFlags) => resolveRunConfig({ np: "4", mode: "elastic", app: "app.ts", ...flags }, { cwd: dir });

function replayFile(name: string, doc: unknown): string {
  const path = join(dir, name);
  writeFileSync(path, typeof doc === "string" ? doc : JSON.stringify(doc));
  return path;
}

describe("elastic flags", () => {
  it("defaults: the first world is -n, --min-np 1, --max-np -n, one process per slot", () => {
    const c = resolveWith({});
    expect(c.size).toBe(4);
    expect(c.elastic).toEqual({ initial: 4, minNp: 1, maxNp: 4, waitMs: DEFAULTS.elasticTimeoutMs });
    const wide = resolveWith({ minNp: "2", maxNp: "6", elasticTimeout: "5s", inject: ["5@step:3"] });
    expect(wide.size).toBe(6); // slots 4 and 5 start at once and join
    expect(wide.elastic).toEqual({ initial: 4, minNp: 2, maxNp: 6, waitMs: 5000 });
    expect(wide.faults[5]).toBe("step:3");
  });

  it("refuses limits that do not fit -n, and the flags in other modes", () => {
    expect(usageMessage(() => resolveWith({ minNp: "5" }))).toMatch(/--min-np must be a whole number from 1 to 4, got "5"/);
    expect(usageMessage(() => resolveWith({ maxNp: "3" }))).toMatch(/--max-np must be a whole number from 4 to 1024, got "3"/);
    expect(usageMessage(() => resolveWith({ elasticTimeout: "soon" }))).toMatch(/--elastic-timeout "soon" is not a duration/);
    expect(usageMessage(() => resolveWith({ mode: "cpr", minNp: "2", replay: "x.json" }))).toMatch(
      /--min-np, --replay: for --mode elastic only \(this job runs in --mode cpr\)/,
    );
    expect(usageMessage(() => resolveWith({ resume: true }))).toMatch(/--resume: --mode elastic keeps its checkpoints in the ranks' memory/);
  });

  it("a hostfile must have a slot for every rank up to --max-np", () => {
    writeFileSync(join(dir, "hosts"), "10.0.0.1 slots=2\n10.0.0.2 slots=2\n");
    expect(usageMessage(() => resolveWith({ maxNp: "5", hostfile: "hosts", bind: "127.0.0.1" }))).toMatch(/the hostfile has 4 slots for 5 ranks/);
  });

  it("--replay takes the changes a --results file recorded; the slots are the first world plus every rank that joins", () => {
    const path = replayFile("ok.json", {
      recovery: {
        changes: [
          { at: 12, size: 4, keep: [0, 2, 3], joined: 0 },
          { at: 30, size: 3, keep: [0, 1, 2], joined: 2 },
        ],
      },
    });
    const c = resolveWith({ replay: path });
    expect(c.size).toBe(6);
    expect(c.elastic?.plan).toEqual([
      { at: 12, size: 4, keep: [0, 2, 3], joined: 0 },
      { at: 30, size: 3, keep: [0, 1, 2], joined: 2 },
    ]);
  });

  it("--replay refuses what is not a chain of changes of this job", () => {
    const bad = (name: string, doc: unknown): string => usageMessage(() => readReplay(replayFile(name, doc), name, 4));
    expect(bad("garbage.json", "{")).toMatch(/cannot read .* as JSON/);
    expect(bad("nothing.json", { ranks: [] })).toMatch(/no recorded changes \(recovery.changes\) in it; give the --results file of a --mode elastic run/);
    expect(bad("size.json", { recovery: { changes: [{ at: 1, size: 3, keep: [0], joined: 0 }] } })).toMatch(/change 1 .* for a world of 4 ranks/);
    expect(bad("order.json", { recovery: { changes: [{ at: 1, size: 4, keep: [2, 1], joined: 0 }] } })).toMatch(/keep ranks below 4 in increasing order/);
    expect(
      bad("back.json", {
        recovery: {
          changes: [
            { at: 5, size: 4, keep: [0, 1], joined: 0 },
            { at: 4, size: 2, keep: [0], joined: 0 },
          ],
        },
      }),
    ).toMatch(/change 2 .* at a checkpoint from 5 on/);
    expect(bad("empty.json", { recovery: { changes: [{ at: 1, size: 4, keep: [], joined: 0 }] } })).toMatch(/leave at least one/);
  });

  it("lifeline drill replays each faulty run's changes itself: --replay is refused", () => {
    expect(usageMessage(() => resolveDrillConfig({ np: "4", mode: "elastic", replay: "x.json", app: "app.ts" }, { cwd: dir }))).toMatch(
      /drill replays each faulty run's changes of the world itself \(--mode elastic\): drop --replay/,
    );
  });

  it("lifeline coordinator refuses --mode elastic before anything starts", async () => {
    let err = "";
    const io = { stdout: { write: () => true }, stderr: { write: (s: string) => (err += s) }, env: process.env, cwd: dir, handleSignals: false };
    const code = await main(["coordinator", "-n", "2", "--mode", "elastic", "--bind", "127.0.0.1", "app.ts"], io);
    expect(code).toBe(2);
    expect(err).toContain("--mode elastic starts ranks into the running job (and decides when to), which only the launcher does");
  });
});
