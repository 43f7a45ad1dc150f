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
 *
 * Over that socket the coordinator answers every beat with a `lease`. Once one has come, a
 * silence of `failureTimeoutMs` means the coordinator is gone (its host died, the network is
 * partitioned) or has replaced this incarnation: the thread tells the main thread, which ends
 * the rank with EXIT_COORDINATOR_LOST; should the main thread not get to it (a long
 * synchronous computation), the thread kills the process itself a little later. A rank never
 * waits for a coordinator that will not come back.
 */
import { Socket } from "node:net";
import { parentPort, workerData } from "node:worker_threads";
import { decodeControl, encodeControl, heartbeatIdentity } from "../mpi/control.ts";
import { fire, parseFaults } from "../mpi/faults.ts";
import type { WatchdogOptions } from "./watchdog.ts";

const data = workerData as WatchdogOptions & { pid: number };
/** How long the main thread has to exit by itself once the lease has lapsed. */
const LOST_EXIT_GRACE_MS = 1_000;
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
  const tick = (): void => void pipe.write(beat);
  tick(); // at once: a rank that freezes while it is still starting up is watched too
  timers.push(setInterval(tick, data.heartbeatMs));
  parentPort?.postMessage("ready");
} else if (data.heartbeatMs > 0 && data.coordinator !== undefined) {
  const { Dealer } = await import("zeromq");
  const curve = data.keys?.curve;
  // A small high-water mark: while the coordinator is unreachable, beats are dropped, not hoarded.
  const socket = new Dealer({
    routingId: heartbeatIdentity(data.rank, data.attempt, data.keys?.token),
    linger: 0,
    sendHighWaterMark: 4,
    ...(curve === undefined ? {} : { curveServerKey: curve.server, curvePublicKey: curve.member.publicKey, curveSecretKey: curve.member.secretKey }),
  });
  socket.connect(data.coordinator);
  closers.push(() => socket.close());
  const beat = encodeControl({ t: "heartbeat", rank: data.rank, attempt: data.attempt });
  let sending = false;
  const tick = (): void => {
    if (sending) return;
    sending = true;
    socket.send(beat).then(
      () => {
        sending = false;
      },
      () => {
        sending = false;
      },
    );
  };
  tick();
  timers.push(setInterval(tick, data.heartbeatMs));
  // The lease: its clock starts with the first answer (before it, init()'s own rendezvous
  // timeout bounds the wait for a coordinator that is not up yet), or once the rank joined its
  // job: a rank cut off from the coordinator before the first answer came must end too.
  let leaseMs: number | undefined;
  parentPort?.on("message", (msg: unknown) => {
    if (msg === "joined") leaseMs ??= performance.now();
  });
  void (async () => {
    try {
      for await (const [frame] of socket) {
        try {
          if (decodeControl(frame).t === "lease") leaseMs = performance.now();
        } catch {
          // not a message of ours; the lease is all this socket listens for
        }
      }
    } catch {
      // the socket was closed: the thread is stopping
    }
  })();
  const leaseTimeoutMs = data.failureTimeoutMs ?? 0;
  if (leaseTimeoutMs > 0) {
    timers.push(
      setInterval(
        () => {
          if (leaseMs === undefined || performance.now() - leaseMs < leaseTimeoutMs) return;
          const silentMs = Math.round(performance.now() - leaseMs);
          leaseMs = undefined;
          // This thread's socket goes first: a process that exits while a worker holds a ZeroMQ
          // socket aborts in the addon's teardown.
          for (const t of timers) clearTimeout(t);
          for (const close of closers.splice(0)) close();
          parentPort?.postMessage({ t: "coordinator-lost", silentMs, coordinator: data.coordinator });
          // The main thread exits at once (EXIT_COORDINATOR_LOST) unless it is busy in a
          // synchronous loop; then the process ends anyway, by a signal of its own (SIGUSR2:
          // 128 + 12 = 140) so that the cause stays visible, and by SIGKILL if the program
          // catches that one.
          setTimeout(() => {
            process.kill(data.pid, "SIGUSR2");
            setTimeout(die, LOST_EXIT_GRACE_MS);
          }, LOST_EXIT_GRACE_MS);
        },
        Math.max(10, Math.min(data.heartbeatMs, leaseTimeoutMs / 4)),
      ),
    );
  }
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
