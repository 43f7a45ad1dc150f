/**
 * Goal: on tcp, where anyone who reaches a port can try it, nothing from outside the
 * job and nothing a compromised rank sends changes a job's results or takes down a rank:
 * - a stranger without the job's keys — plain, and with a CURVE key of its own (knowing the
 *   coordinator's public key, or not) — tries every socket of a running `lifeline run
 *   --transport tcp` job (the coordinator's and each rank's data socket) with hellos,
 *   heartbeats, steps, aborts, results and data frames: nothing is accepted, the results are
 *   bit-identical to an undisturbed run, and the attempts are reported (ZAP's refusals with the
 *   stranger's address);
 * - a compromised rank (src/testing/compromised.ts: it holds the job's member key, its own
 *   channel keys and token) fuzzes rank 1's and rank 0's data sockets and the coordinator with
 *   over 10,000 frames — random bytes, headers with another job's key or claiming another rank,
 *   truncated and oversized frames, unknown kinds and encodings, bodies that do not decode,
 *   huge length fields, messages no receive takes, claims to be other ranks on its control
 *   link and on links of its own: no crash, no hang, no mis-delivery, the results
 *   bit-identical, memory flat; what it sends as itself that breaks the protocol (a flood of
 *   unmatched messages, a collective message out of turn) stops the job with an error naming
 *   it; its older incarnation's frames and another job's, replayed after a cpr restart, are
 *   refused (results bit-identical);
 * - a flood: a sender as fast as it can, a receiver that computes between receives: both
 *   stay under 200 MB resident (the queues hold 1,000 messages each way), and every message
 *   arrives in order; with messages of 16 MiB (copied, three of them on the way at most)
 *   both stay under 300 MB.
 *
 * Method: the built launcher with --json; the stranger is this test process (zeromq.js
 * sockets), finding the ranks' ports in /proc and the coordinator's public key in a rank's
 * key file (as if it had leaked); the compromised rank is test/fixtures/security/exchange.ts
 * with SECURITY_FUZZ. References are undisturbed `--mode none` runs of the same program.
 */
import { readdirSync, readFileSync, readlinkSync, statSync } from "node:fs";
import * as zmq from "zeromq";
import { afterEach, describe, expect, it } from "vitest";
import { encodeControl } from "../../src/mpi/control.ts";
import { forgedHeader } from "../../src/testing/compromised.ts";
import { runDirFor, runLauncher, type RunOutcome } from "./cpr-run.ts";

const TIMEOUT_MS = 60_000;
const runs = runDirFor("lifeline-security-");
const EXCHANGE = "test/fixtures/security/exchange.ts";
const sockets: zmq.Socket[] = [];
afterEach(() => {
  for (const s of sockets.splice(0)) s.close();
});

/** A run of the exchange program on 3 ranks over tcp (`env`: SECURITY_FUZZ, for a compromised rank). */
function exchange(name: string, flags: readonly string[], env?: NodeJS.ProcessEnv, args: readonly string[] = ["30"]): Promise<RunOutcome> {
  return runLauncher({
    np: 3,
    program: EXCHANGE,
    args,
    flags: ["--transport", "tcp", ...flags],
    dir: runs.path,
    name,
    timeoutMs: TIMEOUT_MS,
    ...(env === undefined ? {} : { env }),
  });
}

async function reference(name: string, iterations: string): Promise<unknown[]> {
  const ref = await exchange(name, ["--mode", "none"], undefined, [iterations]);
  expect(ref.code, ref.stderr).toBe(0);
  return ref.doc!.ranks;
}

/** The tcp ports process `pid` listens on (from /proc: its socket inodes, matched in the net table). */
function listeningPorts(pid: number): number[] {
  const inodes = new Set<string>();
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`, { encoding: "utf8" }) ?? "");
    if (m !== null) inodes.add(m[1]!);
  }
  return readFileSync(`/proc/${pid}/net/tcp`, "utf8")
    .split("\n")
    .slice(1)
    .map((l) => l.trim().split(/\s+/))
    .filter((f) => f[3] === "0A" && inodes.has(f[9]!))
    .map((f) => parseInt(f[1]!.split(":")[1]!, 16));
}

/** The coordinator's public key, from the key file a rank's environment names. */
/** Rank `pid`'s key file (the path its environment names), its mode, and its command line. */
function keysOf(pid: number): { file: { coordinator: string; memberSecret: string; token: string }; mode: number; cmdline: string } {
  const env = readFileSync(`/proc/${pid}/environ`, "utf8").split("\0");
  const path = env.find((e) => e.startsWith("LIFELINE_KEYS="))!.slice("LIFELINE_KEYS=".length);
  return { file: JSON.parse(readFileSync(path, "utf8")) as never, mode: statSync(path).mode & 0o777, cmdline: readFileSync(`/proc/${pid}/cmdline`, "utf8") };
}

function open<S extends zmq.Push | zmq.Dealer>(socket: S, endpoint: string): S {
  // Its queue holds the stranger's few messages; nothing ever leaves a refused connection.
  socket.connect(endpoint);
  sockets.push(socket);
  return socket;
}

/** A data frame as a stranger would forge it: a well-formed header claiming rank `source`, a guessed key. */
function forgedFrame(source: number): Buffer[] {
  return [forgedHeader({ source, tag: 7, key: (Math.random() * 2 ** 32) >>> 0 }), Buffer.from(new Float64Array(64).fill(1e6).buffer)];
}

/** A stranger's control messages: it claims to be rank 1 (and rank 0's watchdog). */
const CONTROL = [
  { t: "hello", rank: 1, attempt: 0, pid: 1, endpoint: "tcp://127.0.0.1:1", size: 3 },
  { t: "heartbeat", rank: 1, attempt: 0 },
  { t: "step", rank: 1, steps: 99, epoch: 0 },
  { t: "abort", rank: 1, code: "MPI_OP", message: "a stranger's abort" },
  { t: "finalize", rank: 1, result: Buffer.from([0xc0]) },
].map((m) => encodeControl(m as never));

describe("a stranger without the job's keys", () => {
  it(
    "tries the coordinator and every rank's data socket, plain and with keys of its own: nothing is accepted, results are bit-identical, the attempts are reported",
    async () => {
      const ref = await reference("stranger-ref", "40");
      const pids: number[] = [];
      let endpoint: string | undefined;
      let attack: Promise<void> | undefined;
      let keys: ReturnType<typeof keysOf> | undefined;
      const run = await runLauncher({
        np: 3,
        program: EXCHANGE,
        args: ["40", "40"], // 40 iterations, 40 ms apart: the attack has time
        flags: ["--mode", "none", "--transport", "tcp"],
        dir: runs.path,
        name: "stranger",
        timeoutMs: TIMEOUT_MS,
        onEvent: (ev) => {
          if (ev.event === "job-starting") endpoint = ev.coordinator as string;
          if (ev.event === "rank-spawned") pids.push(ev.pid as number);
          if (ev.event === "job-started") {
            keys = keysOf(pids[1]!);
            attack = strangerAttack(endpoint!, pids);
          }
        },
      });
      const tried = await attack!;
      expect(run.code, run.stderr).toBe(0);
      expect(run.doc!.ranks).toEqual(ref);
      // The keys: a 0600 file; in no command line, output line, results file or job id.
      expect(keys!.mode).toBe(0o600);
      for (const secret of [keys!.file.memberSecret, keys!.file.token]) {
        expect(secret).toMatch(/^.{32,40}$/);
        for (const [what, text] of Object.entries({ cmdline: keys!.cmdline, stdout: run.stdout, stderr: run.stderr, results: JSON.stringify(run.doc) }))
          expect(text.includes(secret), `a key in the ${what}`).toBe(false);
      }
      // Nothing counted: no rank came up twice, no abort, no extra step or result.
      const events = parseEvents(run);
      expect(events.filter((e) => e.event === "rank-up")).toHaveLength(3);
      expect(events.some((e) => e.event === "rank-abort" || e.event === "job-stopping")).toBe(false);
      // Reported: ZAP's refusals with the stranger's address, the failed handshakes, on every socket.
      const warnings = events.filter((e) => e.event === "warning").map((e) => e.message as string);
      expect(warnings).toContainEqual(expect.stringMatching(/^refused a connection from 127\.0\.0\.1 on the control socket: its key is not one of this job's/));
      expect(warnings).toContainEqual(expect.stringMatching(/^refused a connection without CURVE on the control socket/));
      expect(warnings).toContainEqual(expect.stringMatching(/^refused a connection with a wrong CURVE key on the control socket/));
      for (const r of [0, 1, 2]) {
        const lines = rankLines(run, r);
        expect(lines, `rank ${r}`).toContainEqual(expect.stringMatching(/refused a connection to its data socket of a connection without CURVE/));
        expect(lines, `rank ${r}`).toContainEqual(expect.stringMatching(/refused a connection to its data socket of a connection with a wrong CURVE key/));
        expect(
          lines.some((l) => l.includes("dropping a malformed frame")),
          `rank ${r}: a stranger's frame reached the channel`,
        ).toBe(false);
      }
      expect(tried).toBeUndefined();
    },
    TIMEOUT_MS,
  );
});

/**
 * Attacks every listening socket of the job for ~1 s: the coordinator (plain, a CURVE key of its
 * own with the coordinator's public key, a wrong server key) and each rank's data socket (plain,
 * a wrong server key), each sending its messages every 50 ms.
 */
async function strangerAttack(coordinator: string, pids: readonly number[]): Promise<void> {
  const serverKey = keysOf(pids[0]!).file.coordinator;
  const own = zmq.curveKeyPair();
  const wrong = zmq.curveKeyPair();
  const keyed = [
    { curveServerKey: serverKey, curvePublicKey: own.publicKey, curveSecretKey: own.secretKey },
    { curveServerKey: wrong.publicKey, curvePublicKey: own.publicKey, curveSecretKey: own.secretKey },
  ];
  const ports = pids.flatMap((pid) => listeningPorts(pid));
  expect(ports).toHaveLength(3);
  const targets = ports.map((port) => `tcp://127.0.0.1:${port}`);
  // Keyed sockets retry by themselves (every 100 ms); a plain one gives up after its first
  // mechanism mismatch, so the stranger opens a fresh plain connection each round.
  const control = keyed.flatMap((keys) => ["r1.0", "hb:r0.0"].map((routingId) => open(new zmq.Dealer({ linger: 0, routingId, ...keys }), coordinator)));
  const data = targets.map((target) => open(new zmq.Push({ linger: 0, ...keyed[1]! }), target));
  // A send never completes on a socket whose handshake fails, and zeromq.js takes one at a
  // time: each socket gets its next message once the last one went (or never).
  const busy = new Set<zmq.Socket>();
  const send = (socket: zmq.Push | zmq.Dealer, frames: Buffer | Buffer[]): void => {
    if (busy.has(socket)) return;
    busy.add(socket);
    socket.send(frames).then(
      () => busy.delete(socket),
      () => undefined,
    );
  };
  for (let round = 0; round < 20; round++) {
    const plain = [
      ...["r1.0", "hb:r0.0"].map((routingId) => open(new zmq.Dealer({ linger: 0, routingId }), coordinator)),
      ...targets.map((target) => open(new zmq.Push({ linger: 0 }), target)),
    ];
    for (const d of [...control, ...plain.slice(0, 2)]) send(d, CONTROL[round % CONTROL.length]!);
    for (const p of [...data, ...plain.slice(2)]) send(p, forgedFrame(round % 3));
    await new Promise((r) => setTimeout(r, 50));
  }
}

function parseEvents(run: RunOutcome): Record<string, unknown>[] {
  return run.stderr.split("\n").flatMap((l) => (l.startsWith("{") ? [JSON.parse(l) as Record<string, unknown>] : []));
}

/** What rank `rank` wrote: its stderr lines (output events) and its stdout lines (`[rank] line` on the launcher's stdout). */
function rankLines(run: RunOutcome, rank: number): string[] {
  const stderr = parseEvents(run)
    .filter((e) => e.event === "output" && e.rank === rank)
    .map((e) => e.line as string);
  const prefix = `[${rank}] `;
  return [...stderr, ...run.stdout.split("\n").flatMap((l) => (l.startsWith(prefix) ? [l.slice(prefix.length)] : []))];
}

describe("a compromised rank", () => {
  it(
    "fuzzes rank 1's and rank 0's data sockets and the coordinator with over 10,000 frames from inside the job: results bit-identical, no crash, no hang, memory flat",
    async () => {
      const ref = await reference("fuzz-ref", "30");
      const run = await exchange("fuzz", ["--mode", "none", "--max-message", "64KiB"], { SECURITY_FUZZ: "harmless" });
      expect(run.code, run.stderr).toBe(0);
      expect(run.doc!.ranks).toEqual(ref);
      const events = parseEvents(run);
      const said = (rank: number, re: RegExp): RegExpExecArray => {
        const line = rankLines(run, rank).find((l) => re.test(l));
        expect(line, `rank ${rank}: ${re}`).toBeDefined();
        return re.exec(line!)!;
      };
      const sent = said(2, /sent (\d+) hostile frames: (\d+) to rank 1, (\d+) to rank 0, (\d+) control/);
      expect(Number(sent[1])).toBeGreaterThanOrEqual(10_000);
      // Read before the end (its last message on each connection was taken), and all but the
      // well-formed messages no receive takes were dropped, with warnings naming rank 2 where
      // the frame proved it.
      expect(Number(said(1, /dropped (\d+) frames/)[1])).toBeGreaterThan(0.8 * Number(sent[2]));
      expect(Number(said(0, /dropped (\d+) frames/)[1])).toBe(Number(sent[3]));
      // Warned about, rate-limited: a frame that proved its sender names it.
      const warned = rankLines(run, 1).filter((l) => l.includes("dropping a malformed frame"));
      expect(warned.length).toBeLessThanOrEqual(10);
      expect(warned.at(-1)).toMatch(/further warnings suppressed/);
      expect(warned).toContainEqual(expect.stringMatching(/dropping a malformed frame from rank 2: /));
      for (const r of [0, 1, 2]) {
        const mem = said(r, /heap grew (-?\d+) MB, rss (\d+) MB/);
        expect(Number(mem[1]), `rank ${r} heap`).toBeLessThan(64);
        expect(Number(mem[2]), `rank ${r} rss`).toBeLessThan(256);
      }
      // The coordinator heard claims to be other ranks, and counted none.
      const warnings = events.filter((e) => e.event === "warning").map((e) => e.message as string);
      expect(warnings).toContainEqual(expect.stringMatching(/claiming rank [01] from "r2\.0\/…" \(rank 2\)/));
      expect(events.some((e) => e.event === "rank-abort" || e.event === "job-stopping")).toBe(false);
      expect(events.filter((e) => e.event === "rank-finalized")).toHaveLength(3);
    },
    TIMEOUT_MS,
  );

  it(
    "stops the job with an error naming it when what it sends as itself breaks the rules: unmatched messages past --max-unexpected, a collective message out of turn",
    async () => {
      const flood = await exchange("flood-unmatched", ["--mode", "none", "--max-unexpected", "256KiB"], { SECURITY_FUZZ: "flood" });
      expect(flood.code).not.toBe(0);
      expect(flood.doc!.error).toMatchObject({
        code: "MPI_LIMIT",
        message: expect.stringMatching(
          /rank 1 .*aborted the job: MPI_LIMIT: rank 1 holds \d+ bytes of messages no receive has taken \(\d+ application messages, most from rank 2\), more than the job's bound of 262144 bytes \(--max-unexpected\)/,
        ),
      });
      const stray = await exchange("stray", ["--mode", "none"], { SECURITY_FUZZ: "stray" });
      expect(stray.code).not.toBe(0);
      expect(stray.doc!.error!.message).toMatch(
        /MPI_COLLECTIVE_MISMATCH: collective #0: rank 2 sent this rank a message that allreduce\(sum, Float64Array\[64\]\) on rank 1 does not use/,
      );
    },
    TIMEOUT_MS,
  );

  it(
    "cpr: after a restart, frames of its older incarnation and another job's, replayed to rank 1, are refused; results bit-identical",
    async () => {
      const ref = await reference("replay-ref", "30");
      const run = await exchange("replay", ["--mode", "cpr", "--checkpoint-every", "5steps", "--inject", "0@step:12"], { SECURITY_FUZZ: "replay" });
      expect(run.code, run.stderr).toBe(0);
      expect(run.doc!.restarts).toBe(1);
      expect(run.doc!.ranks).toEqual(ref);
      expect(rankLines(run, 1)).toContainEqual(expect.stringMatching(/frame claims to come from rank 2 without the key of that channel/));
    },
    TIMEOUT_MS,
  );
});

describe("a flood", () => {
  /** flood.ts on 2 ranks over tcp with these arguments (count, bytes, µs of work); its ranks' reports once it exited 0. */
  const flood = async (name: string, args: string[]): Promise<{ maxRssMb: number; inOrder: boolean }[]> => {
    const run = await runLauncher({
      np: 2,
      program: "test/fixtures/security/flood.ts",
      args,
      flags: ["--mode", "none", "--transport", "tcp"],
      dir: runs.path,
      name,
      timeoutMs: TIMEOUT_MS,
    });
    expect(run.code, run.stderr).toBe(0);
    return run.doc!.ranks as { maxRssMb: number; inOrder: boolean }[];
  };

  it(
    "a sender as fast as it can, a receiver that computes between receives: both stay under 200 MB, every message arrives in order",
    async () => {
      // 320 MB in all, 100 µs of work per message
      const [sender, receiver] = await flood("flood", ["20000", "16384", "100"]);
      expect(receiver!.inOrder).toBe(true);
      expect(sender!.maxRssMb).toBeLessThan(200);
      expect(receiver!.maxRssMb).toBeLessThan(200);
    },
    TIMEOUT_MS,
  );

  it(
    "messages of 16 MiB to a receiver that computes 20 ms after each: both stay under 300 MB, every message arrives in order",
    async () => {
      // 640 MB in all. A send copies them into pooled buffers, and a destination holds at most
      // three un-acknowledged (48 MiB): the sender's copies, the receiver's queue and ZeroMQ's
      // buffers stay a few messages deep.
      const [sender, receiver] = await flood("flood-large", ["40", String(16 * 1024 * 1024), "20000"]);
      expect(receiver!.inOrder).toBe(true);
      expect(sender!.maxRssMb).toBeLessThan(300);
      expect(receiver!.maxRssMb).toBeLessThan(300);
    },
    TIMEOUT_MS,
  );
});
