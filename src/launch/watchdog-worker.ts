/**
 * The body of the rank's watchdog thread (see watchdog.ts). Runs on its own event loop, so a
 * rank busy in a long synchronous computation still heartbeats and still dies with its
 * launcher; only a frozen (stopped) or wedged process goes silent.
 */
import { Socket } from "node:net";
import { workerData } from "node:worker_threads";
import { Dealer } from "zeromq";
import { encodeControl, heartbeatIdentity } from "../mpi/control.ts";
import { fire, parseFaults } from "../mpi/faults.ts";
import type { WatchdogOptions } from "./watchdog.ts";

const data = workerData as WatchdogOptions & { pid: number };
const die = (): void => void process.kill(data.pid, "SIGKILL");

if (data.fd !== undefined) {
  try {
    const pipe = new Socket({ fd: data.fd, readable: true, writable: false });
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
  if (t.kind === "time" && t.attempt === data.attempt) setTimeout(() => fire(t.action, `time:${t.ms}`), t.ms);
}

if (data.coordinator !== undefined && data.heartbeatMs > 0) {
  // A small high-water mark: while the coordinator is unreachable, beats are dropped, not hoarded.
  const socket = new Dealer({ routingId: heartbeatIdentity(data.rank, data.attempt), linger: 0, sendHighWaterMark: 4 });
  socket.connect(data.coordinator);
  const beat = encodeControl({ t: "heartbeat", rank: data.rank, attempt: data.attempt });
  let sending = false;
  const tick = (): void => {
    if (sending) return;
    sending = true;
    socket.send(beat).then(() => { sending = false; }, () => { sending = false; });
  };
  tick(); // at once: a rank that freezes while it is still starting up is watched too
  setInterval(tick, data.heartbeatMs);
}
