/**
 * Fault injection for tests and drills: a rank told by `LIFELINE_FAULTS` kills itself
 * (SIGKILL, so nothing runs after it: no exit handler, no flushed socket) at a chosen point.
 *
 * The variable holds `;`-separated triggers for this rank:
 * - `step:N`   at the Nth `checkpoint()` call of this attempt (1-based), before anything is saved;
 * - `send:N`   at the Nth application send of this attempt (1-based), before it is handed over;
 * - `time:MS`  MS milliseconds after `init()` (fired from the rank's watchdog thread too, so
 *              it hits a rank busy in a synchronous loop);
 * - `line:N`   at the first `checkpoint()` call after this rank learned that recovery line N (or
 *              a newer one) is committed (mode cpr): a kill that certainly has a line to roll
 *              back to, however slow the machine;
 * - `mock:V,S` Rabit's coordinates: when V checkpoints have completed and the collective about
 *              to start is the Sth since the last one (0-based), as Rabit's `mock=r,V,S,ndeath`;
 * - `hang:step:N` / `hang:time:MS` freeze (SIGSTOP) instead of dying, for heartbeat tests.
 * Each trigger fires only in attempt 0 unless suffixed `@attempt=K` (Rabit's `ndeath`).
 *
 * @example
 * const faults = new FaultPlan(parseFaults("step:5;mock:1,0@attempt=1"), 1);
 * faults.onCheckpoint(); // kills the process at the 5th call when attempt is 0
 */
import { writeSync } from "node:fs";
import { LifelineError } from "../errors.ts";

export type FaultTrigger =
  | { kind: "step"; n: number; attempt: number; action: FaultAction }
  | { kind: "send"; n: number; attempt: number; action: FaultAction }
  | { kind: "line"; n: number; attempt: number; action: FaultAction }
  | { kind: "time"; ms: number; attempt: number; action: FaultAction }
  | { kind: "mock"; version: number; seqno: number; attempt: number; action: FaultAction };

export type FaultAction = "kill" | "hang";

function nonNegInt(raw: string, what: string, spec: string): number {
  const n = Number(raw);
  if (raw.trim() === "" || !Number.isInteger(n) || n < 0) {
    throw new LifelineError("LAUNCH_FAULT_SPEC", `fault spec ${JSON.stringify(spec)}: ${what} ${JSON.stringify(raw)} is not a non-negative integer`);
  }
  return n;
}

/** Parses a `LIFELINE_FAULTS` value. Throws `LAUNCH_FAULT_SPEC` naming the bad part. */
export function parseFaults(text: string): FaultTrigger[] {
  const out: FaultTrigger[] = [];
  for (const raw of text.split(";")) {
    const spec = raw.trim();
    if (spec === "") continue;
    let body = spec;
    let attempt = 0;
    const at = spec.lastIndexOf("@attempt=");
    if (at >= 0) {
      attempt = nonNegInt(spec.slice(at + "@attempt=".length), "attempt", spec);
      body = spec.slice(0, at);
    }
    let action: FaultAction = "kill";
    if (body.startsWith("hang:")) {
      action = "hang";
      body = body.slice("hang:".length);
    }
    const colon = body.indexOf(":");
    const kind = colon < 0 ? body : body.slice(0, colon);
    const arg = colon < 0 ? "" : body.slice(colon + 1);
    switch (kind) {
      case "step":
      case "send":
      case "line": {
        const n = nonNegInt(arg, "count", spec);
        if (n < 1) throw new LifelineError("LAUNCH_FAULT_SPEC", `fault spec ${JSON.stringify(spec)}: counts start at 1`);
        out.push({ kind, n, attempt, action });
        break;
      }
      case "time":
        out.push({ kind, ms: nonNegInt(arg, "milliseconds", spec), attempt, action });
        break;
      case "mock": {
        const parts = arg.split(",");
        if (parts.length !== 2) {
          throw new LifelineError("LAUNCH_FAULT_SPEC", `fault spec ${JSON.stringify(spec)}: mock takes version,seqno`);
        }
        out.push({ kind, version: nonNegInt(parts[0]!, "version", spec), seqno: nonNegInt(parts[1]!, "seqno", spec), attempt, action });
        break;
      }
      default:
        throw new LifelineError(
          "LAUNCH_FAULT_SPEC",
          `fault spec ${JSON.stringify(spec)}: unknown trigger ${JSON.stringify(kind)}; use step:N, send:N, line:N, time:MS, mock:V,S or hang:<trigger>`,
        );
    }
  }
  return out;
}

/**
 * Carries out a fault: SIGKILL (a crash) or SIGSTOP (a freeze) of this very process. The line
 * it writes first ends with the wall-clock time of the fault (`at <ms since the epoch>`, to the
 * microsecond), so that detection can be measured from the moment the rank died rather than
 * from when its last line reached the launcher.
 */
export function fire(action: FaultAction, why: string): void {
  const atMs = (performance.timeOrigin + performance.now()).toFixed(3);
  // Straight to fd 2, synchronously: from the watchdog thread, process.stderr is relayed through
  // the main thread, and the SIGKILL below would lose the line (drills date the fault by it).
  writeSync(2, `lifeline: injected fault: ${action === "kill" ? "killing" : "freezing"} this rank (${why}) at ${atMs}\n`);
  process.kill(process.pid, action === "kill" ? "SIGKILL" : "SIGSTOP");
}

/** The triggers of one rank in one attempt, with the counters they watch. */
export class FaultPlan {
  private steps = 0;
  private sends = 0;
  /** The newest committed recovery line this rank heard of. */
  private committed = 0;
  private readonly fired = new Set<FaultTrigger>();
  private readonly active: FaultTrigger[];
  private timer: NodeJS.Timeout | undefined;

  constructor(
    triggers: readonly FaultTrigger[],
    attempt: number,
    private readonly act = fire,
  ) {
    this.active = triggers.filter((t) => t.attempt === attempt);
    for (const t of this.active) {
      if (t.kind === "time") {
        this.timer = setTimeout(() => this.act(t.action, `time:${t.ms}`), t.ms);
        this.timer.unref();
      }
    }
  }

  get empty(): boolean {
    return this.active.length === 0;
  }

  /** Call at each checkpoint() location, before anything else happens there. */
  onCheckpoint(): void {
    this.steps++;
    for (const t of this.active) {
      if (t.kind === "step" && t.n === this.steps) this.act(t.action, `step:${t.n}`);
      else if (t.kind === "line" && this.committed >= t.n && !this.fired.has(t)) {
        this.fired.add(t); // once (a frozen rank that is continued goes on)
        this.act(t.action, `line:${t.n}`);
      }
    }
  }

  /** Call when the rank hears that recovery line `epoch` is committed. */
  onCommitted(epoch: number): void {
    if (epoch > this.committed) this.committed = epoch;
  }

  /** Call at each application send, before the message is handed to the transport. */
  onSend(): void {
    this.sends++;
    for (const t of this.active) if (t.kind === "send" && t.n === this.sends) this.act(t.action, `send:${t.n}`);
  }

  /** Call as a collective starts: `version` checkpoints done, `seqno` collectives since the last. */
  onCollective(version: number, seqno: number): void {
    for (const t of this.active) {
      if (t.kind === "mock" && t.version === version && t.seqno === seqno) this.act(t.action, `mock:${version},${seqno}`);
    }
  }

  dispose(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
  }
}
