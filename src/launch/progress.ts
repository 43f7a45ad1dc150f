/**
 * What the launcher tells people and machines while a job runs.
 *
 * The supervisor emits {@link JobEvent}s and forwards rank output; a {@link Reporter} renders
 * them in one of four styles:
 * - `tty`: a live status line on stderr (ranks up, per-rank steps, the newest committed recovery
 *   line and the restarts so far in cpr, elapsed), redrawn in place
 *   and cleared before any forwarded rank line, then event lines and a final summary;
 * - `plain` (stderr is a pipe or file): one line per event, no control characters;
 * - `json` (`--json`): one JSON object per line on stderr per event, for machines; rank stderr
 *   lines are carried as `output` events so that every stderr line parses;
 * - `quiet` (`--quiet`): only failures.
 * Rank output is forwarded in every style: stdout lines to stdout as `[rank] line`, stderr
 * lines to stderr likewise (as `output` events under `--json`). Launcher messages never go to
 * stdout, so a job's stdout can be piped on as the program's own output.
 *
 * In cpr a rank that dies and is recovered is not a job error: the human styles print it as
 * `failure detected: rank R … <cause>`, then `recovery N: every rank restarts … from recovery
 * line E`, then, once every rank is up again, `recovered from rank R's failure (<cause>):
 * rolled back to epoch E, every rank running again <t> after the failure was detected`. Only
 * a failure that no restart follows (the final one) prints as `error:`.
 *
 * Likewise in retry-one: `failure detected: rank R … <cause>`, `restarting rank R alone …`,
 * then, when the new process caught up, `recovered from rank R's failure (<cause>): restored
 * checkpoint version V from its peers, replayed N collective results, caught up <t> after the
 * failure was detected`.
 *
 * @example
 * const reporter = createReporter({ style: pickStyle({ json: false, quiet: false, stderr: process.stderr, env: process.env }), stdout, stderr, size: 4 });
 * reporter.event({ kind: "rank-up", rank: 0, pid: 123 });
 * reporter.rankLine(0, "stdout", "hello"); // "[0] hello" on stdout
 */
import { inspect } from "node:util";

/** Events of a job, in the order they happen. `t` (ms since launch) is added by the reporter. */
export type JobEvent =
  | { kind: "job-starting"; job: string; size: number; mode: string; app: string; coordinator: string; transport: string }
  /**
   * cpr: this run continues job `job` (run `run` of it) from recovery line `epoch`, committed
   * at `lineTime` by run `lineRun`; the run before ended `previousState` (`running`: its
   * launcher was killed) with `previousExitCode`.
   */
  | {
      kind: "job-resuming";
      job: string;
      run: number;
      epoch: number;
      lineTime: string;
      lineRun: number | undefined;
      previousState: string;
      previousExitCode: number | undefined;
    }
  /** `warm`: a spare process, started earlier, took the rank's place (retry-one). */
  | { kind: "rank-spawned"; rank: number; attempt: number; pid: number; warm?: boolean; host?: string }
  /** retry-one: a warm spare process is ready for the next restart (see --no-spare). */
  | { kind: "spare-ready"; pid: number }
  | { kind: "rank-up"; rank: number; pid: number }
  | { kind: "job-started"; rendezvousMs: number }
  | { kind: "rank-step"; rank: number; steps: number; epoch: number }
  | { kind: "rank-finalized"; rank: number }
  | {
      kind: "rank-failed";
      rank: number;
      pid: number | undefined;
      /** What went wrong, e.g. "exited with code 3 before finalizing". */
      reason: string;
      code: number | null;
      signal: string | null;
      stderrTail: string[];
      /** The line of its stderr that says why (the first error line), if it wrote one. */
      error?: string;
    }
  | { kind: "rank-exited"; rank: number; code: number | null; signal: string | null; killedByLauncher: boolean }
  /** The job is being stopped for a reason that is not one rank's fault (or not only). */
  | { kind: "job-stopping"; reason: string; rank?: number | undefined; stderrTail?: string[] | undefined; error?: string | undefined }
  | { kind: "warning"; message: string }
  /**
   * cpr: recovery line `epoch` is committed (every rank's part durable); `steps`: the fewest
   * steps any rank had reported when the line was asked for.
   */
  | { kind: "line-committed"; epoch: number; durationMs: number; bytes: number; steps?: number }
  /** cpr: every rank restarts (attempt) from line `epoch`, or from the beginning (`epoch` 0). */
  | { kind: "job-restarting"; attempt: number; epoch: number; restarts: number }
  /**
   * retry-one: `rank` is started again alone as `attempt` in `delayMs` (`restarts` so far,
   * counted against `maxRestarts`); the others keep running. `after`: the failure.
   */
  | { kind: "rank-restarting"; rank: number; attempt: number; delayMs: number; restarts: number; maxRestarts: number; after: string }
  /**
   * retry-one: restarted `rank` restored checkpoint `restored` from its peers (0: none yet),
   * got `replayed` collective results from their buffers and runs collective `seqno` of
   * version `version` on the wire with the others again.
   */
  | { kind: "rank-caught-up"; rank: number; attempt: number; restored: number; version: number; seqno: number; replayed: number }
  /**
   * elastic: the world changed at checkpoint `at` (`rollback`: back to it, after a loss) from
   * `from` to `to` ranks: `left` of the world before are gone, `joined` came in.
   */
  | { kind: "world-changed"; view: number; at: number; from: number; to: number; left: number; joined: number; rollback: boolean }
  | {
      kind: "job-finished";
      ok: boolean;
      exitCode: number;
      wallMs: number;
      size: number;
      finalized: number;
      restarts: number;
      error: { code: string; message: string } | undefined;
      results: readonly unknown[];
      resultsPath: string | undefined;
    };

/** How the launcher talks: live status line, plain lines, JSON lines, or errors only. */
export type ReportStyle = "tty" | "plain" | "json" | "quiet";

/** Minimal writable the reporter needs (process.stdout/stderr or a test buffer). */
export interface OutStream {
  write(chunk: string): unknown;
  isTTY?: boolean;
  columns?: number;
}

/** Renders job events and forwards rank output in one {@link ReportStyle}. */
export interface Reporter {
  event(ev: JobEvent): void;
  /** Forwards one line of a rank's output. */
  rankLine(rank: number, stream: "stdout" | "stderr", line: string): void;
  /** Stops timers and clears the status line. */
  close(): void;
}

/** Chooses the style from the flags and where stderr goes. */
export function pickStyle(opts: { json: boolean; quiet: boolean; stderr: OutStream; env: NodeJS.ProcessEnv }): ReportStyle {
  if (opts.json) return "json";
  if (opts.quiet) return "quiet";
  if (opts.stderr.isTTY === true && opts.env.TERM !== "dumb" && opts.env.CI === undefined) return "tty";
  return "plain";
}

/** Construction options of {@link createReporter}. */
export interface ReporterOptions {
  style: ReportStyle;
  stdout: OutStream;
  stderr: OutStream;
  size: number;
  /** Milliseconds since launch; defaults to a clock started now. */
  elapsedMs?: () => number;
  /** Colour on tty (default: unless NO_COLOR is set). */
  color?: boolean;
}

/** Builds the reporter for a style. */
export function createReporter(opts: ReporterOptions): Reporter {
  const start = performance.now();
  const elapsedMs = opts.elapsedMs ?? (() => performance.now() - start);
  switch (opts.style) {
    case "json":
      return new JsonReporter(opts, elapsedMs);
    case "tty":
      return new HumanReporter(opts, elapsedMs, true);
    case "plain":
      return new HumanReporter(opts, elapsedMs, false);
    case "quiet":
      return new HumanReporter(opts, elapsedMs, false, true);
  }
}

// ---- JSON lines --------------------------------------------------------------------------

/** At most one `rank-step` event per rank per this many ms: steps can come thousands a second. */
export const STEP_EVENT_INTERVAL_MS = 250;

class JsonReporter implements Reporter {
  private readonly lastStepEmit: number[];
  private readonly pendingStep = new Map<number, Extract<JobEvent, { kind: "rank-step" }>>();
  private stepTimer: NodeJS.Timeout | undefined;

  constructor(
    private readonly opts: ReporterOptions,
    private readonly elapsedMs: () => number,
  ) {
    this.lastStepEmit = new Array<number>(opts.size).fill(-Infinity);
  }

  event(ev: JobEvent): void {
    if (ev.kind === "rank-step") {
      const now = this.elapsedMs();
      if (now - (this.lastStepEmit[ev.rank] ?? -Infinity) >= STEP_EVENT_INTERVAL_MS) {
        this.lastStepEmit[ev.rank] = now;
        this.pendingStep.delete(ev.rank);
        this.emit(ev);
      } else {
        // Keep the newest; flushed by the timer so the last count is never lost.
        this.pendingStep.set(ev.rank, ev);
        this.stepTimer ??= setTimeout(() => this.flushSteps(), STEP_EVENT_INTERVAL_MS);
        this.stepTimer.unref();
      }
      return;
    }
    if (ev.kind === "job-finished" || ev.kind === "rank-finalized" || ev.kind === "rank-failed") this.flushSteps();
    this.emit(ev);
  }

  rankLine(rank: number, stream: "stdout" | "stderr", line: string): void {
    if (stream === "stdout") this.opts.stdout.write(`[${rank}] ${line}\n`);
    else this.write({ event: "output", rank, stream, line });
  }

  close(): void {
    this.flushSteps();
  }

  private flushSteps(): void {
    if (this.stepTimer !== undefined) clearTimeout(this.stepTimer);
    this.stepTimer = undefined;
    const now = this.elapsedMs();
    for (const ev of this.pendingStep.values()) {
      this.lastStepEmit[ev.rank] = now;
      this.emit(ev);
    }
    this.pendingStep.clear();
  }

  private emit(ev: JobEvent): void {
    const { kind, ...fields } = ev;
    if (kind === "job-finished") {
      const f = fields as Omit<Extract<JobEvent, { kind: "job-finished" }>, "kind">;
      // Results go to --results; the event stays one short line.
      const { results: _results, ...rest } = f;
      void _results;
      this.write({ event: kind, ...rest });
      return;
    }
    this.write({ event: kind, ...fields });
  }

  private write(obj: Record<string, unknown>): void {
    obj.t = Math.round(this.elapsedMs());
    this.opts.stderr.write(`${JSON.stringify(obj)}\n`);
  }
}

// ---- people ------------------------------------------------------------------------------

/** Status line redraw period on a tty (elapsed time keeps moving even without events). */
const STATUS_REDRAW_MS = 200;
/** Least time between redraws caused by step events. */
const STATUS_STEP_REDRAW_MS = 100;
/** Per-rank step counts are listed up to this many ranks; larger jobs show min..max. */
const STATUS_RANKS_LISTED_MAX = 8;
/** Result previews in the summary: ranks shown, characters per result. */
const SUMMARY_RESULTS_MAX = 8;
const SUMMARY_RESULT_CHARS_MAX = 100;

class HumanReporter implements Reporter {
  private readonly steps: number[];
  private readonly up: boolean[];
  private readonly finalized: boolean[];
  private statusShown = false;
  /** cpr: the newest committed recovery line; restarts of the job so far. */
  private lineEpoch = 0;
  private restarts = 0;
  private lastDrawMs = -Infinity;
  private redrawTimer: NodeJS.Timeout | undefined;
  private job = "";
  private mode = "";
  private readonly color: boolean;
  /**
   * cpr: failures not shown yet. Whether a failure is an error depends on what follows: the
   * job restarts from a recovery line (a failure detected and recovered, not an error) or it
   * stops (the final failure: an error). Shown at the next job-level event.
   */
  private pendingFailures: { ev: Extract<JobEvent, { kind: "rank-failed" }>; atMs: number }[] = [];
  /** cpr: the recovery in progress (from the failure's detection until every rank is up). */
  private recovering: { failures: string[]; epoch: number; sinceMs: number } | undefined;
  /** Errors printed so far (the summary does not repeat the one that ended the job). */
  private readonly errorsShown: string[] = [];
  /** retry-one: ranks being restarted alone, from the restart's announcement until they catch up. */
  private readonly restartingRanks = new Map<number, { sinceMs: number; cause: string | undefined }>();

  constructor(
    private readonly opts: ReporterOptions,
    private readonly elapsedMs: () => number,
    private readonly tty: boolean,
    private readonly quiet = false,
  ) {
    this.steps = new Array<number>(opts.size).fill(0);
    this.up = new Array<boolean>(opts.size).fill(false);
    this.finalized = new Array<boolean>(opts.size).fill(false);
    this.color = tty && (opts.color ?? process.env.NO_COLOR === undefined);
    if (tty) {
      this.redrawTimer = setInterval(() => this.drawStatus(), STATUS_REDRAW_MS);
      this.redrawTimer.unref();
    }
  }

  event(ev: JobEvent): void {
    switch (ev.kind) {
      case "job-starting":
        this.job = ev.job;
        this.mode = ev.mode;
        this.info(`job ${ev.job}: starting ${ev.size} rank${plural(ev.size)} of ${ev.app} (mode ${ev.mode})`);
        break;
      case "job-resuming": {
        const before =
          ev.previousState === "running"
            ? "its launcher died"
            : ev.previousState === "stopped"
              ? "it was interrupted"
              : `it failed${ev.previousExitCode === undefined ? "" : ` with exit code ${ev.previousExitCode}`}`;
        this.lineEpoch = ev.epoch;
        this.info(
          `resuming job ${ev.job} (run ${ev.run}) from recovery line ${ev.epoch}, committed ${ev.lineTime}${ev.lineRun === undefined ? "" : ` by run ${ev.lineRun}`} (the run before ended without finishing: ${before}); --fresh would start over`,
        );
        break;
      }
      case "rank-spawned":
      case "spare-ready":
        break;
      case "rank-up":
        this.up[ev.rank] = true;
        break;
      case "job-started":
        this.info(`all ${this.opts.size} rank${plural(this.opts.size)} up after ${secs(ev.rendezvousMs)}`);
        if (this.recovering !== undefined) {
          const r = this.recovering;
          this.recovering = undefined;
          const back = r.epoch === 0 ? "restarted from the beginning (no line was committed)" : `rolled back to epoch ${r.epoch}`;
          this.info(
            `recovered from ${r.failures.join("; ")}: ${back}, every rank running again ${secs(this.elapsedMs() - r.sinceMs)} after the failure was detected`,
          );
        }
        break;
      case "rank-step":
        this.steps[ev.rank] = ev.steps;
        break;
      case "rank-finalized":
        this.finalized[ev.rank] = true;
        this.info(`rank ${ev.rank} finalized at ${secs(this.elapsedMs())}`);
        break;
      case "rank-failed": {
        const restarting = this.restartingRanks.get(ev.rank);
        if (this.mode === "retry-one" && restarting !== undefined && restarting.cause === undefined) {
          // Its restart was announced already (the failure's output drains first): not an error.
          restarting.cause = ev.reason;
          this.info(`failure detected: ${failureText(ev)}`);
          break;
        }
        if (this.mode === "cpr" || this.mode === "retry-one" || this.mode === "elastic") {
          this.pendingFailures.push({ ev, atMs: this.elapsedMs() });
          break;
        }
        this.error(failureText(ev));
        break;
      }
      case "rank-exited":
        break;
      case "job-stopping":
        this.flushFailuresAsErrors();
        if (ev.stderrTail !== undefined && ev.rank !== undefined)
          this.error(`stopping the job: ${ev.reason}${errorSuffix(ev.reason, ev.error, ev.stderrTail)}`);
        else if (ev.reason.startsWith("interrupted")) this.info(`stopping the job: ${ev.reason}`);
        else this.error(`stopping the job: ${ev.reason}`);
        break;
      case "warning":
        if (!this.quiet) this.print(`${this.paint("warning:", "33")} ${ev.message}`);
        break;
      case "line-committed":
        this.lineEpoch = Math.max(this.lineEpoch, ev.epoch);
        this.info(`recovery line ${ev.epoch} committed (${ev.bytes} bytes, ${secs(ev.durationMs)})`);
        break;
      case "job-restarting": {
        this.restarts = ev.restarts;
        this.lineEpoch = ev.epoch;
        this.up.fill(false);
        this.finalized.fill(false);
        const failures = this.pendingFailures.splice(0);
        for (const { ev: f } of failures) {
          this.info(`failure detected: ${failureText(f)}`);
        }
        if (failures.length > 0) {
          this.recovering = {
            failures: failures.map(({ ev: f }) => `rank ${f.rank}'s failure (${f.reason})`),
            epoch: ev.epoch,
            sinceMs: Math.min(...failures.map((f) => f.atMs)),
          };
        }
        this.info(
          `recovery ${ev.restarts}: every rank restarts (attempt ${ev.attempt}) ${ev.epoch === 0 ? "from the beginning (no line committed yet)" : `from recovery line ${ev.epoch}`}`,
        );
        break;
      }
      case "rank-restarting": {
        this.restarts = ev.restarts;
        this.up[ev.rank] = false;
        this.finalized[ev.rank] = false;
        const i = this.pendingFailures.findIndex((f) => f.ev.rank === ev.rank);
        const pending = i < 0 ? undefined : this.pendingFailures.splice(i, 1)[0];
        this.restartingRanks.set(ev.rank, { sinceMs: pending?.atMs ?? this.elapsedMs(), cause: pending?.ev.reason });
        if (pending !== undefined) {
          const f = pending.ev;
          this.info(`failure detected: ${failureText(f)}`);
        }
        this.info(
          `restarting rank ${ev.rank} alone (attempt ${ev.attempt}) in ${ev.delayMs} ms, restart ${ev.restarts} of at most ${ev.maxRestarts}; the other ranks keep running`,
        );
        break;
      }
      case "rank-caught-up": {
        const r = this.restartingRanks.get(ev.rank);
        this.restartingRanks.delete(ev.rank);
        const from = ev.restored === 0 ? "restarted from the beginning (no checkpoint yet)" : `restored checkpoint version ${ev.restored} from its peers`;
        const replayed = `${ev.replayed} collective result${plural(ev.replayed)} replayed from the others' buffers`;
        const since = r === undefined ? "" : `, caught up ${secs(this.elapsedMs() - r.sinceMs)} after the failure was detected`;
        this.info(`recovered from rank ${ev.rank}'s failure${r?.cause === undefined ? "" : ` (${r.cause})`}: ${from}, ${replayed}${since}`);
        break;
      }
      case "world-changed": {
        // The job went on: the failures before were recovered from, not errors.
        for (const { ev: f } of this.pendingFailures.splice(0)) this.info(`failure detected: ${failureText(f)}`);
        const how = [ev.left > 0 ? `${ev.left} left` : "", ev.joined > 0 ? `${ev.joined} joined` : ""].filter((x) => x !== "").join(", ");
        this.info(
          `the world changed at checkpoint ${ev.at}${ev.rollback ? " (the ranks went back to it)" : ""}: ${ev.from} → ${ev.to} rank${plural(ev.to)}${how === "" ? "" : ` (${how})`}`,
        );
        break;
      }
      case "job-finished":
        this.flushFailuresAsErrors();
        this.finish(ev);
        break;
      default: {
        const never: never = ev;
        void never;
      }
    }
    // Steps can arrive hundreds of times a second: redraw for them at most every
    // STATUS_STEP_REDRAW_MS (the timer catches up); redraw at once for everything else.
    if (ev.kind !== "rank-step" || performance.now() - this.lastDrawMs >= STATUS_STEP_REDRAW_MS) this.drawStatus();
  }

  rankLine(rank: number, stream: "stdout" | "stderr", line: string): void {
    // Clear only; the timer redraws. Redrawing after every line would double the output of a
    // chatty program and make the status line flicker.
    this.clearStatus();
    (stream === "stdout" ? this.opts.stdout : this.opts.stderr).write(`[${rank}] ${line}\n`);
  }

  close(): void {
    if (this.redrawTimer !== undefined) clearInterval(this.redrawTimer);
    this.redrawTimer = undefined;
    this.clearStatus();
  }

  private finish(ev: Extract<JobEvent, { kind: "job-finished" }>): void {
    this.close();
    if (ev.ok) {
      if (this.quiet) return;
      const lines = [
        `${this.paint("done:", "32")} ${ev.finalized}/${ev.size} rank${plural(ev.size)} finalized in ${secs(ev.wallMs)}` +
          (ev.restarts > 0 ? `, ${ev.restarts} restart${plural(ev.restarts)}` : ""),
      ];
      lines.push(...resultPreview(ev.results));
      if (ev.resultsPath !== undefined) lines.push(`results written to ${ev.resultsPath}`);
      this.print(lines.join("\n"));
      return;
    }
    const message = ev.error?.message;
    // The failure that ended the job was printed as an error already: say it once.
    const shown = message !== undefined && this.errorsShown.some((e) => e.includes(message));
    const what = message === undefined ? "the job failed" : shown ? "see the error above" : message;
    const headline = ev.error?.code === "LAUNCH_INTERRUPTED" ? "job stopped" : "job failed";
    const lines = [`${this.paint(headline, "31")} (exit ${ev.exitCode}) after ${secs(ev.wallMs)}, ${ev.finalized}/${ev.size} ranks finalized: ${what}`];
    if (ev.resultsPath !== undefined) lines.push(`partial results written to ${ev.resultsPath}`);
    this.print(lines.join("\n"));
  }

  /** Failures that no recovery followed: the job's final failure, an error. */
  private flushFailuresAsErrors(): void {
    for (const { ev } of this.pendingFailures.splice(0)) {
      this.error(failureText(ev));
    }
  }

  private info(message: string): void {
    if (!this.quiet) this.print(message);
  }

  private error(message: string): void {
    this.errorsShown.push(message);
    this.print(`${this.paint("error:", "31")} ${message}`);
  }

  private print(message: string): void {
    this.clearStatus();
    this.opts.stderr.write(
      message
        .split("\n")
        .map((l) => `lifeline: ${l}`)
        .join("\n") + "\n",
    );
  }

  private paint(text: string, sgr: string): string {
    return this.color ? `\x1b[${sgr}m${text}\x1b[0m` : text;
  }

  private statusText(): string {
    const size = this.opts.size;
    const upCount = this.up.filter(Boolean).length;
    const doneCount = this.finalized.filter(Boolean).length;
    const parts = [`lifeline ${this.job}`, `${upCount}/${size} up`];
    if (doneCount > 0) parts.push(`${doneCount}/${size} finalized`);
    if (this.lineEpoch > 0) parts.push(`epoch ${this.lineEpoch}`);
    if (this.restarts > 0) parts.push(`${this.restarts} restart${plural(this.restarts)}`);
    if (this.steps.some((s) => s > 0)) {
      parts.push(size <= STATUS_RANKS_LISTED_MAX ? `steps ${this.steps.join(" ")}` : `steps ${Math.min(...this.steps)}..${Math.max(...this.steps)}`);
    }
    parts.push(secs(this.elapsedMs()));
    const text = parts.join(" · ");
    // A pseudo-terminal without a size reports 0 columns.
    const cols = this.opts.stderr.columns || 80;
    return text.length >= cols ? text.slice(0, Math.max(0, cols - 2)) + "…" : text;
  }

  private drawStatus(): void {
    if (!this.tty || this.redrawTimer === undefined) return;
    // \r + erase line, then the status without a newline: the next draw overwrites it.
    this.opts.stderr.write(`\r\x1b[2K${this.paint(this.statusText(), "2")}`);
    this.statusShown = true;
    this.lastDrawMs = performance.now();
  }

  private clearStatus(): void {
    if (!this.statusShown) return;
    this.opts.stderr.write("\r\x1b[2K");
    this.statusShown = false;
  }
}

/**
 * A failed rank in one line: `rank 1 (pid 13011) exited with code 1 before finalizing: Error:
 * bad argument`. Its stderr itself was forwarded as it came (`[1] ...`), so it is not repeated
 * here; the error line it contains says why in the same line as the failure.
 */
function failureText(ev: Extract<JobEvent, { kind: "rank-failed" }>): string {
  return `rank ${ev.rank}${ev.pid === undefined ? "" : ` (pid ${ev.pid})`} ${ev.reason}${errorSuffix(ev.reason, ev.error, ev.stderrTail)}`;
}

function errorSuffix(reason: string, error: string | undefined, tail: readonly string[]): string {
  if (error !== undefined) return errorLineSuffix(reason, error);
  return tail.length === 0 ? " (it wrote nothing to stderr)" : "";
}

/** `: <error line>` after a failure's reason, unless the reason says it already (or there is none). */
export function errorLineSuffix(reason: string, error: string | undefined): string {
  return error === undefined || reason.includes(error) ? "" : `: ${error}`;
}

function resultPreview(results: readonly unknown[]): string[] {
  if (results.every((r) => r === undefined)) return [];
  const lines = results.slice(0, SUMMARY_RESULTS_MAX).map((r, rank) => {
    const text = inspect(r, { depth: 2, breakLength: Infinity, maxArrayLength: 8, maxStringLength: SUMMARY_RESULT_CHARS_MAX, compact: true });
    return `  rank ${rank}: ${text.length > SUMMARY_RESULT_CHARS_MAX ? `${text.slice(0, SUMMARY_RESULT_CHARS_MAX)}…` : text}`;
  });
  if (results.length > SUMMARY_RESULTS_MAX) lines.push(`  … and ${results.length - SUMMARY_RESULTS_MAX} more (use --results <file>)`);
  return ["results:", ...lines];
}

function secs(ms: number): string {
  return ms < 10_000
    ? `${(ms / 1000).toFixed(2)}s`
    : ms < 600_000
      ? `${(ms / 1000).toFixed(1)}s`
      : `${Math.floor(ms / 60_000)}m${Math.round((ms % 60_000) / 1000)}s`;
}

function plural(n: number): string {
  return n === 1 ? "" : "s";
}
