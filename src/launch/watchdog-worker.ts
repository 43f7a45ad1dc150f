/**
 * The body of the rank's watchdog thread (see watchdog.ts). Runs on its own event loop, so a
 * rank busy in a long synchronous computation still heartbeats and still dies with its
 * launcher; only a frozen (stopped) or wedged process goes silent.
 *
 * Started by `lifeline run`, it beats on the launcher pipe itself (fd 3, a socketpair): no
 * native addon in this thread, so stopping it can never race with a socket being built (a
 * worker terminated inside ZeroMQ's socket constructor aborts the whole process). Only under
 * another launcher, without the pipe, does it beat over a ZeroMQ socket to the coordinator.
 * It is stopped by a message, which it handles only after its start-up code has run.
 */
import { Socket } from "node:net";
import { parentPort, workerData } from "node:worker_threads";
import { encodeControl, heartbeatIdentity } from "../mpi/control.ts";
import { fire, parseFaults } from "../mpi/faults.ts";
import type { WatchdogOptions } from "./watchdog.ts";

const data = workerData as WatchdogOptions & { pid: number };
const die = (): void => void process.kill(data.pid, "SIGKILL");

const timers: NodeJS.Timeout[] = [];
const closers: (() => void)[] = [];
let pipe: Socket | undefined;

if (data.fd !== undefined) {
  try {
    pipe = new Socket({ fd: data.fd, readable: true, writable: true });
    pipe.on("data", () => undefined);
    pipe.on("end", die);
    pipe.on("close", die);
    pipe.on("error", die);
  } catch (err) {
    process.stderr.write(`lifeline: cannot watch the launcher pipe (fd ${data.fd}): ${(err as Error).message}\n`);
  }
}

// Time-triggered faults fire from this thread too, so they hit a rank even while its main
// thread is busy; the main thread's own timer may fire as well, which changes nothing.
for (const t of parseFaults(data.faults)) {
  if (t.kind === "time" && t.attempt === data.attempt) timers.push(setTimeout(() => fire(t.action, `time:${t.ms}`), t.ms));
}

if (data.heartbeatMs > 0 && pipe !== undefined) {
  const beat = Buffer.from([1]);
  const tick = (): void => void pipe!.write(beat);
  tick(); // at once: a rank that freezes while it is still starting up is watched too
  timers.push(setInterval(tick, data.heartbeatMs));
  parentPort?.postMessage("ready");
} else if (data.heartbeatMs > 0 && data.coordinator !== undefined) {
  const { Dealer } = await import("zeromq");
  // A small high-water mark: while the coordinator is unreachable, beats are dropped, not hoarded.
  const socket = new Dealer({ routingId: heartbeatIdentity(data.rank, data.attempt), linger: 0, sendHighWaterMark: 4 });
  socket.connect(data.coordinator);
  closers.push(() => socket.close());
  const beat = encodeControl({ t: "heartbeat", rank: data.rank, attempt: data.attempt });
  let sending = false;
  const tick = (): void => {
    if (sending) return;
    sending = true;
    socket.send(beat).then(() => { sending = false; }, () => { sending = false; });
  };
  tick();
  timers.push(setInterval(tick, data.heartbeatMs));
  parentPort?.postMessage("ready");
} else {
  parentPort?.postMessage("ready");
}

parentPort?.on("message", (msg: unknown) => {
  if (msg !== "stop") return;
  // A clean end of the rank: stop watching (the pipe closing is no longer a reason to die).
  for (const t of timers) clearTimeout(t);
  pipe?.removeAllListeners();
  pipe?.on("error", () => undefined);
  for (const close of closers) close();
  parentPort?.close();
});
