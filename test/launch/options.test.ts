/**
 * Goal: every `lifeline run` flag is validated with a message that names the flag and the bad
 * value, all problems of one command line are reported together, and good values land in the
 * run configuration with the documented defaults.
 *
 * Method: call resolveRunConfig / the parsers directly with raw strings, as the CLI does.
 */
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { DEFAULTS, parseBytes, parseCheckpointEvery, parseDuration, parseInject, resolveRunConfig, type RunFlags } from "../../src/launch/options.ts";
import { MODES } from "../../src/mpi/env.ts";
import { tempDir, usageMessage } from "./helpers.ts";

const { dir, cleanup } = tempDir("lifeline-options-");
afterAll(cleanup);
writeFileSync(join(dir, "app.ts"), "export {};\n");
writeFileSync(join(dir, "app.js"), "\n");
writeFileSync(join(dir, "notes.txt"), "\n");

function resolveWith(flags: RunFlags) {
  return resolveRunConfig({ np: "2", mode: "none", app: "app.ts", ...flags }, { cwd: dir });
}

describe("resolveRunConfig", () => {
  it("fills in the documented defaults", () => {
    const c = resolveWith({ appArgs: ["--size", "8"] });
    expect(c).toMatchObject({
      size: 2,
      mode: "none",
      app: join(dir, "app.ts"),
      appArgs: ["--size", "8"],
      cwd: dir,
      checkpointEvery: { kind: "time", ms: 10_000 },
      store: join(dir, ".lifeline"),
      keepLines: DEFAULTS.keepLines,
      maxRestarts: DEFAULTS.maxRestarts,
      heartbeatMs: 500,
      failureTimeoutMs: 5_000,
      stuckTimeoutMs: undefined,
      rendezvousTimeoutMs: 30_000,
      startTimeoutMs: 10_000,
      resume: "auto",
      resultsPath: undefined,
      json: false,
      quiet: false,
      transport: "ipc",
      faults: ["", ""],
    });
  });

  it("carries every option, also those mode none does not use yet", () => {
    const c = resolveWith({
      np: "4",
      checkpointEvery: "50steps",
      store: "ckpt",
      keepLines: "3",
      maxRestarts: "7",
      heartbeat: "200",
      failureTimeout: "2s",
      stuckTimeout: "1.5m",
      rendezvousTimeout: "5s",
      results: "out.json",
      json: true,
      transport: "tcp",
      inject: ["1@step:5", "2@send:3", "1@time:1.5s", "0@hang:step:2"],
    });
    expect(c).toMatchObject({
      size: 4,
      checkpointEvery: { kind: "steps", steps: 50 },
      store: join(dir, "ckpt"),
      keepLines: 3,
      maxRestarts: 7,
      heartbeatMs: 200,
      failureTimeoutMs: 2_000,
      stuckTimeoutMs: 90_000,
      rendezvousTimeoutMs: 5_000,
      resultsPath: join(dir, "out.json"),
      json: true,
      transport: "tcp",
      faults: ["hang:step:2", "step:5;time:1500", "send:3", ""],
    });
  });

  it("--start-timeout: at least 10 s or --failure-timeout by default, below --rendezvous-timeout when given", () => {
    expect(resolveWith({ failureTimeout: "20s" }).startTimeoutMs).toBe(20_000);
    expect(resolveWith({ startTimeout: "2s" }).startTimeoutMs).toBe(2_000);
    expect(usageMessage(() => resolveWith({ startTimeout: "30s", rendezvousTimeout: "30s" }))).toContain(
      "--start-timeout (30000 ms) must be shorter than --rendezvous-timeout (30000 ms)",
    );
    expect(usageMessage(() => resolveWith({ startTimeout: "soon" }))).toContain('--start-timeout "soon" is not a duration');
  });

  it("--store-scope: host by default with a hostfile, shared without; anything else is refused", () => {
    writeFileSync(join(dir, "hosts"), "127.0.0.1 slots=2\n");
    expect(resolveWith({}).storeScope).toBe("shared");
    expect(resolveWith({ hostfile: "hosts", bind: "127.0.0.1" }).storeScope).toBe("host");
    expect(resolveWith({ hostfile: "hosts", bind: "127.0.0.1", storeScope: "shared" }).storeScope).toBe("shared");
    expect(resolveWith({ storeScope: "host" }).storeScope).toBe("host");
    expect(usageMessage(() => resolveWith({ storeScope: "nfs" }))).toContain('--store-scope "nfs": expected shared');
  });

  it("--bind: implies tcp, resolved here for the coordinator, refused with ipc or an address of no interface", () => {
    expect(resolveWith({ bind: "127.0.0.1" })).toMatchObject({ transport: "tcp", bind: "127.0.0.1", bindAddress: "127.0.0.1" });
    expect(resolveWith({})).toMatchObject({ transport: "ipc", bind: undefined, bindAddress: undefined });
    expect(usageMessage(() => resolveWith({ transport: "ipc", bind: "127.0.0.1" }))).toContain('--bind "127.0.0.1" is for --transport tcp');
    expect(usageMessage(() => resolveWith({ bind: "0.0.0.0" }))).toContain("would listen on every interface");
    expect(usageMessage(() => resolveWith({ bind: "198.19.255.254" }))).toMatch(
      /198\.19\.255\.254 is not an address of this host; its IPv4 addresses are: .*127\.0\.0\.1/,
    );
  });

  it("--resume / --fresh: cpr, or retry-one with its durable floor; not both", () => {
    expect(resolveWith({ mode: "cpr", resume: true }).resume).toBe("resume");
    expect(resolveWith({ mode: "cpr", fresh: true }).resume).toBe("fresh");
    expect(resolveWith({ mode: "retry-one", resume: true }).resume).toBe("resume");
    expect(resolveWith({ mode: "retry-one", fresh: true, durableEvery: "3" }).resume).toBe("fresh");
    expect(usageMessage(() => resolveWith({ mode: "cpr", resume: true, fresh: true }))).toContain("--resume and --fresh contradict each other");
    expect(usageMessage(() => resolveWith({ mode: "none", resume: true }))).toContain("--resume needs recovery lines, and --mode none keeps none");
    expect(usageMessage(() => resolveWith({ mode: "retry-one", fresh: true, durableEvery: "0" }))).toContain(
      "--fresh: --mode retry-one keeps its checkpoints in the ranks' memory, and its durable floor is off",
    );
  });

  it("--durable-every: retry-one's durable floor, on by default with a shared store, off on each host's own disk", () => {
    expect(resolveWith({ mode: "retry-one" }).durableEvery).toBe(200);
    expect(resolveWith({ mode: "retry-one", durableEvery: "4" }).durableEvery).toBe(4);
    expect(resolveWith({ mode: "retry-one", durableEvery: "0" }).durableEvery).toBe(0);
    expect(resolveWith({ mode: "cpr" }).durableEvery).toBe(0);
    expect(resolveWith({ mode: "retry-one", storeScope: "host" }).durableEvery).toBe(0);
    expect(usageMessage(() => resolveWith({ mode: "retry-one", durableEvery: "often" }))).toMatch(/--durable-every/);
    expect(usageMessage(() => resolveWith({ mode: "retry-one", durableEvery: "-1" }))).toMatch(/--durable-every/);
    expect(usageMessage(() => resolveWith({ mode: "cpr", durableEvery: "5" }))).toContain(
      "--durable-every is retry-one's durable floor; it does nothing in --mode cpr",
    );
    expect(usageMessage(() => resolveWith({ mode: "retry-one", storeScope: "host", durableEvery: "5" }))).toContain(
      "--durable-every needs --store in a directory every rank reaches",
    );
  });

  it("accepts .js apps and keeps app arguments that look like flags", () => {
    const c = resolveWith({ app: "app.js", appArgs: ["-n", "9", "--mode", "x"] });
    expect(c.app).toBe(join(dir, "app.js"));
    expect(c.appArgs).toEqual(["-n", "9", "--mode", "x"]);
  });

  it("accepts every mode (retry-one landed with --replicas, default 2) and refuses unknown ones", () => {
    for (const mode of MODES) expect(resolveWith({ mode }).mode).toBe(mode);
    expect(resolveWith({ mode: "retry-one" }).replicas).toBe(2);
    expect(resolveWith({ mode: "retry-one", replicas: "3" }).replicas).toBe(3);
    expect(usageMessage(() => resolveWith({ mode: "retry-one", replicas: "two" }))).toMatch(/--replicas/);
    // retry-one's message log bound: sizes with units; meaningless in other modes.
    expect(resolveWith({ mode: "retry-one" }).logLimitBytes).toBeUndefined();
    expect(resolveWith({ mode: "retry-one", logLimit: "256MiB" }).logLimitBytes).toBe(256 * 1024 * 1024);
    expect(resolveWith({ mode: "retry-one", logLimit: "2GB" }).logLimitBytes).toBe(2e9);
    expect(resolveWith({ mode: "retry-one", logLimit: "65536" }).logLimitBytes).toBe(65536);
    expect(usageMessage(() => resolveWith({ mode: "retry-one", logLimit: "lots" }))).toMatch(/--log-limit "lots" is not a size; write e\.g\. 65536, 64KiB/);
    expect(usageMessage(() => resolveWith({ mode: "retry-one", logLimit: "12" }))).toMatch(/--log-limit "12" must be from 1024 to/);
    expect(usageMessage(() => resolveWith({ mode: "cpr", logLimit: "1GiB" }))).toMatch(
      /--log-limit bounds retry-one's message log; it does nothing in --mode cpr/,
    );
    expect(usageMessage(() => resolveWith({ mode: "fast" }))).toMatch(/--mode "fast" is not a mode; use one of cpr, retry-one, elastic, none/);
  });

  it.each([
    [{ np: undefined }, /missing -n\/--np/],
    [{ np: "0" }, /-n\/--np must be a whole number from 1 to 1024, got "0"/],
    [{ np: "2.5" }, /-n\/--np .* got "2.5"/],
    [{ np: "four" }, /-n\/--np .* got "four"/],
    [{ np: "5000" }, /-n\/--np .* got "5000"/],
    [{ checkpointEvery: "10x" }, /--checkpoint-every "10x" is neither a duration .* nor a step count/],
    [{ checkpointEvery: "10" }, /--checkpoint-every "10" is ambiguous; write a duration \(10s\) or a step count \(10steps\)/],
    [{ checkpointEvery: "0steps" }, /step count must be at least 1/],
    [{ mode: "retry-one", checkpointEvery: "10s" }, /--checkpoint-every 10s: in --mode retry-one it takes a step count \(e\.g\. 50steps/],
    [{ keepLines: "0" }, /--keep-lines must be a whole number from 1/],
    [{ maxRestarts: "-1" }, /--max-restarts must be a whole number from 0/],
    [{ heartbeat: "fast" }, /--heartbeat "fast" is not a duration/],
    [{ heartbeat: "1" }, /--heartbeat "1" must be between 10ms and 1h/],
    [{ heartbeat: "1000", failureTimeout: "1500" }, /--failure-timeout \(1500 ms\) must be at least twice --heartbeat \(1000 ms\)/],
    [{ stuckTimeout: "soon" }, /--stuck-timeout "soon" is not a duration/],
    [{ stuckTimeout: "500ms" }, /--stuck-timeout "500ms" must be between 1s and 720h/],
    [{ transport: "udp" }, /--transport "udp" must be ipc or tcp/],
    [{ json: true, quiet: true }, /--json and --quiet cannot be combined/],
    [{ results: "no/such/dir/out.json" }, /--results "no\/such\/dir\/out.json": directory .* does not exist/],
    [{ results: "." }, /--results "." is a directory/],
    [{ app: undefined }, /missing <app>/],
    [{ app: "missing.ts" }, /app "missing.ts" not found/],
    [{ app: "notes.txt" }, /lifeline runs TypeScript .* not ".txt"/],
    [{ inject: ["2@step:1"] }, /--inject "2@step:1": rank 2 is outside 0..1/],
    [{ inject: ["x@step:1"] }, /"x" is not a rank number/],
    [{ inject: ["step:1"] }, /write <rank>@<trigger>/],
    [{ inject: ["1@boom:3"] }, /--inject "1@boom:3": .*unknown trigger "boom"/],
    [{ inject: ["1@step:0"] }, /counts start at 1/],
  ] as [RunFlags, RegExp][])("rejects %j", (flags, message) => {
    expect(usageMessage(() => resolveWith(flags))).toMatch(message);
  });

  it("reports all problems of one command line together", () => {
    const message = usageMessage(() => resolveWith({ np: "0", heartbeat: "x", transport: "udp" }));
    expect(message.split("\n")).toHaveLength(3);
    expect(message).toMatch(/^- -n\/--np/m);
    expect(message).toMatch(/^- --heartbeat/m);
    expect(message).toMatch(/^- --transport/m);
  });
});

describe("parsers", () => {
  it("parses durations with units; a bare number is milliseconds", () => {
    expect(parseDuration("1500", "--x")).toBe(1500);
    expect(parseDuration("250ms", "--x")).toBe(250);
    expect(parseDuration("1.5s", "--x")).toBe(1500);
    expect(parseDuration("2m", "--x")).toBe(120_000);
    expect(parseDuration("1h", "--x")).toBe(3_600_000);
    expect(() => parseDuration("1.5 fortnights", "--x")).toThrow(/--x "1.5 fortnights" is not a duration/);
    expect(() => parseDuration("-5s", "--x")).toThrow(/not a duration/);
  });

  it("retry-one: --checkpoint-every as a step count; without it, no count (every call a checkpoint)", () => {
    expect(resolveWith({ mode: "retry-one", checkpointEvery: "10steps" }).checkpointEvery).toEqual({ kind: "steps", steps: 10 });
    // The time default is cpr's: retry-one passes no step count on then.
    expect(resolveWith({ mode: "retry-one" }).checkpointEvery.kind).toBe("time");
  });

  it("parses --checkpoint-every as time or steps", () => {
    expect(parseCheckpointEvery("10s")).toEqual({ kind: "time", ms: 10_000 });
    expect(parseCheckpointEvery("50steps")).toEqual({ kind: "steps", steps: 50 });
    expect(parseCheckpointEvery("1 step")).toEqual({ kind: "steps", steps: 1 });
  });

  it("parses --inject into the rank's LIFELINE_FAULTS form", () => {
    expect(parseInject("1@step:5", 4)).toEqual({ rank: 1, spec: "step:5" });
    expect(parseInject("0@time:1500", 4)).toEqual({ rank: 0, spec: "time:1500" });
    expect(parseInject("0@time:2s", 4)).toEqual({ rank: 0, spec: "time:2000" });
    expect(parseInject("3@hang:time:0.5s", 4)).toEqual({ rank: 3, spec: "hang:time:500" });
    expect(parseInject("2@step:3@attempt=1", 4)).toEqual({ rank: 2, spec: "step:3@attempt=1" });
    expect(parseInject("2@mock:1,0", 4)).toEqual({ rank: 2, spec: "mock:1,0" });
  });
});

describe("security and limits flags", () => {
  it("--max-message and --max-unexpected take sizes with binary units; --insecure and --keys land in the configuration", () => {
    expect(parseBytes("65536", "--x", 1, 2 ** 40)).toBe(65536);
    expect(parseBytes("64KiB", "--x", 1, 2 ** 40)).toBe(65536);
    expect(parseBytes("1.5g", "--x", 1, 2 ** 40)).toBe(1.5 * 2 ** 30);
    expect(parseBytes("256 MiB", "--x", 1, 2 ** 40)).toBe(2 ** 28);
    expect(resolveWith({})).toMatchObject({ insecure: false, keys: undefined, maxMessageBytes: 2 ** 30, maxUnexpectedBytes: 2 ** 30 });
    expect(resolveWith({ insecure: true, maxMessage: "1MiB", maxUnexpected: "8MiB" })).toMatchObject({
      insecure: true,
      maxMessageBytes: 2 ** 20,
      maxUnexpectedBytes: 2 ** 23,
    });
    expect(resolveWith({ keys: "." }).keys).toBe(dir);
  });

  it("refuses sizes that are not sizes or out of range, --keys that is not there, and --keys with --insecure", () => {
    expect(usageMessage(() => resolveWith({ maxMessage: "lots" }))).toMatch(/--max-message "lots" is not a size; write e\.g\. 65536, 64KiB/);
    expect(usageMessage(() => resolveWith({ maxMessage: "10" }))).toMatch(/--max-message "10" must be from 1024 to/);
    expect(usageMessage(() => resolveWith({ maxMessage: "8GiB" }))).toMatch(/--max-message "8GiB" must be from 1024 to 4294836224 bytes/);
    expect(usageMessage(() => resolveWith({ maxUnexpected: "1TB" }))).toMatch(/--max-unexpected "1TB" is not a size/);
    expect(usageMessage(() => resolveWith({ keys: "nowhere" }))).toMatch(
      /--keys "nowhere": .* does not exist \(make the job's keys with `lifeline keys nowhere`\)/,
    );
    expect(usageMessage(() => resolveWith({ keys: ".", insecure: true }))).toMatch(/--keys and --insecure contradict each other/);
  });
});
