/**
 * The rank's watchdog: a worker thread that ends this process when the launcher is gone.
 *
 * The launcher hands each rank the read end of a pipe (fd `LIFELINE_WATCH_FD`) and keeps the
 * write end; when the launcher dies for any reason, SIGKILL included, the kernel closes the
 * write end and the read end sees EOF. The watch runs on its own thread with its own event
 * loop, so a rank stuck in a long synchronous computation still dies at once instead of
 * lingering as an orphan.
 *
 * @example
 * const stop = startWatchdog(3); // ... later, on a clean exit: stop();
 */
import { Worker } from "node:worker_threads";

const WORKER_SOURCE = `
const { workerData } = require("node:worker_threads");
const net = require("node:net");
const die = () => process.kill(workerData.pid, "SIGKILL");
let sock;
try {
  sock = new net.Socket({ fd: workerData.fd, readable: true, writable: false });
} catch (err) {
  process.stderr.write("lifeline: cannot watch the launcher pipe (fd " + workerData.fd + "): " + err.message + "\\n");
}
if (sock) {
  sock.on("data", () => {});
  sock.on("end", die);
  sock.on("close", die);
  sock.on("error", die);
}
`;

/** Starts watching `fd`; returns a function that stops the watch (for a clean exit). */
export function startWatchdog(fd: number): () => void {
  const worker = new Worker(WORKER_SOURCE, { eval: true, workerData: { fd, pid: process.pid } });
  worker.unref();
  worker.on("error", (err) => process.stderr.write(`lifeline: watchdog failed: ${err.message}\n`));
  return () => {
    void worker.terminate();
  };
}
