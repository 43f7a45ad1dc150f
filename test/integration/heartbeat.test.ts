// Goal: heartbeats come from the rank's watchdog thread: a long synchronous computation is not
// a failure, a frozen rank (SIGSTOP) is detected within --failure-timeout, and a rank whose
// launcher vanishes dies. Method: real ranks through the real launcher.
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { ROOT, runCli } from "../launch/helpers.ts";

const FIX = join(ROOT, "test", "fixtures", "world");

describe("heartbeats from the watchdog thread", () => {
  it("ends cleanly when a rank finalizes right after init() (the watchdog is stopped, never torn down mid-start)", async () => {
    // A worker terminated while it built a ZeroMQ socket used to abort the rank (SIGABRT):
    // jobs that finalize at once hit that window. Several in a row, 4 ranks each.
    for (let i = 0; i < 4; i++) {
      const r = await runCli(["run", "-n", "4", "--mode", "none", join(ROOT, "test", "fixtures", "launch", "ok.ts"), "0"]);
      expect(r.code, r.stderr).toBe(0);
      expect(r.stderr).not.toMatch(/SIGABRT|FATAL ERROR/);
    }
  });

  it("keeps a rank busy in a 2.5 s synchronous loop alive under a 1 s failure timeout", async () => {
    const r = await runCli(["run", "-n", "2", "--mode", "none", "--heartbeat", "100", "--failure-timeout", "1000", join(FIX, "busy.ts"), "2500"]);
    expect(r.code, r.stderr).toBe(0);
  });

  it("detects a rank that freezes while it is still starting up (before it joined the job)", async () => {
    // Rank start-up (node + tsx + init) takes well over 150 ms, so the freeze hits before hello;
    // its watchdog has beaten already, so --failure-timeout applies, not the 30 s rendezvous.
    const r = await runCli(
      ["run", "-n", "2", "--mode", "none", "--heartbeat", "50", "--failure-timeout", "1000", "--inject", "1@hang:time:150", join(FIX, "busy.ts"), "60000"],
      { timeoutMs: 30_000 },
    );
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/rank 1/);
    expect(r.stderr).toMatch(/heartbeat|frozen|silent/i);
    expect(r.ms).toBeLessThan(15_000);
  });

  it("detects a frozen rank within the failure timeout", async () => {
    const r = await runCli(
      ["run", "-n", "2", "--mode", "none", "--heartbeat", "100", "--failure-timeout", "1000", "--inject", "1@hang:time:300", join(FIX, "busy.ts"), "60000"],
      { timeoutMs: 30_000 },
    );
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/rank 1/);
    expect(r.stderr).toMatch(/heartbeat|frozen|silent/i);
    // Started, froze at 0.3 s, silent for 1 s: well under the 60 s the program would run.
    expect(r.ms).toBeLessThan(15_000);
  });
});
