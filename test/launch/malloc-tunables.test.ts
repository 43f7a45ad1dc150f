/**
 * Goal: ranks and spares start with glibc's malloc tunables of RANK_MALLOC_TUNABLES before any
 * the environment gives (glibc reads them in order, so the user's win), on this host and on
 * another one, whose shell line adds them to that host's own.
 *
 * Method: withMallocTunables on environments; spawnRemoteRank through a "remote shell" that is
 * `sh -c` on this machine, running a program that prints its GLIBC_TUNABLES (the launcher's
 * own path for ranks and spares is in test/integration/launcher.test.ts and cpr-spares.test.ts).
 */
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { RANK_MALLOC_TUNABLES, spawnRemoteRank, withMallocTunables, type RemoteSite } from "../../src/launch/rank-process.ts";
import { FIXTURES, ROOT } from "./helpers.ts";

describe("withMallocTunables", () => {
  it("sets the launcher's tunables when the environment has none", () => {
    expect(withMallocTunables({ PATH: "/bin" })).toEqual({ PATH: "/bin", GLIBC_TUNABLES: RANK_MALLOC_TUNABLES });
    expect(withMallocTunables({ GLIBC_TUNABLES: "" }).GLIBC_TUNABLES).toBe(RANK_MALLOC_TUNABLES);
  });

  it("puts the environment's own after them, so that they win", () => {
    const env = { GLIBC_TUNABLES: "glibc.malloc.arena_max=4" };
    expect(withMallocTunables(env).GLIBC_TUNABLES).toBe(`${RANK_MALLOC_TUNABLES}:glibc.malloc.arena_max=4`);
    expect(env.GLIBC_TUNABLES).toBe("glibc.malloc.arena_max=4"); // not changed in place
  });

  it("are settings this machine's glibc knows and takes, each once", () => {
    // The dynamic loader node runs under lists the tunables as it parsed them from the
    // environment (sizes in hex, counts in decimal): a name it does not know, or a value out of
    // its range, would not show.
    const loader = readFileSync("/proc/self/maps", "utf8")
      .split("\n")
      .map((l) => l.split(/\s+/)[5] ?? "")
      .find((f) => /\/ld-linux[^/]*\.so/.test(f));
    expect(loader, "no ld-linux*.so in this process's maps: is this glibc?").toBeDefined();
    const listed = execFileSync(loader!, ["--list-tunables"], { env: { GLIBC_TUNABLES: RANK_MALLOC_TUNABLES }, encoding: "utf8" });
    const given = RANK_MALLOC_TUNABLES.split(":").map((kv) => kv.split("="));
    expect(new Set(given.map(([name]) => name)).size).toBe(given.length);
    for (const [name, value] of given)
      expect(listed).toMatch(new RegExp(`^${name!.replaceAll(".", "\\.")}: (0x${Number(value).toString(16)}|${Number(value)}) `, "m"));
    // malloc ignores an mmap threshold above half its largest heap (32 MiB on 64-bit systems);
    // above it, no block comes from mmap at all.
    expect(Number(given.find(([name]) => name === "glibc.malloc.mmap_threshold")![1])).toBeLessThanOrEqual(32 * 1024 * 1024);
    expect(given.find(([name]) => name === "glibc.malloc.mmap_max")?.[1]).toBe("0");
  });
});

/** A site whose "remote shell" runs the line here, as `sh -c` (with the given environment). */
function localSite(env: NodeJS.ProcessEnv): RemoteSite {
  return {
    host: "localhost",
    command: (line) => ["sh", "-c", line],
    env: () => env,
    idWords: "",
    failed: (err) => err.message,
    signal: () => undefined,
  };
}

/** What the remote rank printed after its pid line, once it ended. */
async function remoteTunables(mallocTuning: boolean, hostEnv: NodeJS.ProcessEnv): Promise<string[]> {
  const lines: string[] = [];
  const proc = await spawnRemoteRank(
    { rank: 0, attempt: 0, app: join(FIXTURES, "print-tunables.js"), appArgs: [], env: { LIFELINE_RANK: "0" }, cwd: ROOT, mallocTuning },
    localSite(hostEnv),
    { line: (_rank, stream, line) => lines.push(`${stream}: ${line}`) },
  );
  const exit = await proc.exited;
  await proc.closed;
  expect(exit.code, lines.join("\n")).toBe(0);
  return lines.filter((l) => l.includes("tunables:"));
}

describe("a rank on another host", () => {
  const hostEnv = { PATH: process.env.PATH ?? "/usr/bin:/bin" };

  it("gets the launcher's tunables from its shell line", async () => {
    expect(await remoteTunables(true, hostEnv)).toEqual([`stdout: tunables: ${RANK_MALLOC_TUNABLES}`]);
  });

  it("keeps its host's own after them", async () => {
    const own = { ...hostEnv, GLIBC_TUNABLES: "glibc.malloc.tcache_count=7" };
    expect(await remoteTunables(true, own)).toEqual([`stdout: tunables: ${RANK_MALLOC_TUNABLES}:glibc.malloc.tcache_count=7`]);
  });

  it("with --no-malloc-tuning: its host's own only", async () => {
    expect(await remoteTunables(false, hostEnv)).toEqual(["stdout: tunables: (unset)"]);
    const own = { ...hostEnv, GLIBC_TUNABLES: "glibc.malloc.tcache_count=7" };
    expect(await remoteTunables(false, own)).toEqual(["stdout: tunables: glibc.malloc.tcache_count=7"]);
  });
});
