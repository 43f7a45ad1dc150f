/**
 * The `--kill` specs of `lifeline drill` (docs/cli.md) and how they become per-rank fault triggers
 * (`LIFELINE_FAULTS`, src/mpi/faults.ts).
 *
 * Forms:
 * - `r@step:N`, `r@send:N`, `r@line:N`, `r@time:T` (T with a unit: `1.5s`, `800ms`; a bare number is ms),
 *   `r@hang:<trigger>` (freeze rank r with SIGSTOP instead of killing it; caught by heartbeats),
 *   each optionally suffixed `@attempt=K`;
 * - `random:K`: K kills at points drawn from the seeded PRNG within what the reference run
 *   showed (each rank's step count and run time);
 * - Rabit's `mock=rank,version,seqno,ndeath`: rank dies when `version` checkpoints are done
 *   and the collective about to start is the `seqno`th since (0-based), in attempt `ndeath`.
 *
 * The faults of one run happen one after another: unless a spec names its attempt, the kth
 * fault (0-based, in command-line order) fires in the kth attempt — after k recoveries —
 * counting steps, sends and time from that attempt's start. (A fault aimed at attempt 0 of a
 * rank that the first recovery restarted would otherwise never fire.)
 *
 * @example
 * const specs = parseKillSpecs(["1@step:5", "random:2"], 4); // throws LAUNCH_USAGE on bad specs
 * const plan = planFaults(specs, { size: 4, mode: "cpr", seed: 7, reference }); // [{ rank: 1, trigger: "step:5", ... }, ...]
 */
import { LifelineError, isLifelineError } from "../errors.ts";
import type { Mode } from "../mpi/env.ts";
import { parseInject } from "./options.ts";

/** Most kills `random:K` may ask for in one run. */
export const RANDOM_KILLS_MAX = 64;

/** One `--kill` as written, parsed. */
export type KillSpec =
  /** A fault on a named rank; `trigger` is in LIFELINE_FAULTS form without `@attempt`. */
  { kind: "rank"; text: string; rank: number; trigger: string; attempt: number | undefined } | { kind: "random"; text: string; count: number };

/** One fault planned for a faulty run: which rank, which trigger, in which attempt. */
export interface PlannedFault {
  /** 1-based number of the fault in its run. */
  index: number;
  rank: number;
  /** LIFELINE_FAULTS trigger without `@attempt` (`step:5`, `time:1500`, `hang:step:3`, `mock:1,0`). */
  trigger: string;
  attempt: number;
  /** The spec it came from (`1@step:5`, `random:2`, `mock=1,1,0,0`). */
  source: string;
  /** For step triggers: steps the rank had completed when the fault hit (N - 1). */
  stepsBefore: number | undefined;
  hang: boolean;
}

/** What the reference run showed, for placing random kills. */
export interface ReferenceShape {
  /** Steps (checkpoint() calls) each rank made. */
  stepsByRank: readonly number[];
  /** Milliseconds from each rank's init() (rank-up) to its finalize(). */
  computeMsByRank: readonly number[];
}

/**
 * Parses the `--kill` specs of a job of `size` ranks. Throws one `LAUNCH_USAGE` listing every
 * bad spec.
 */
export function parseKillSpecs(texts: readonly string[], size: number | undefined): KillSpec[] {
  const problems: string[] = [];
  const out: KillSpec[] = [];
  for (const text of texts) {
    try {
      out.push(parseKillSpec(text, size));
    } catch (err) {
      if (!isLifelineError(err, "LAUNCH_USAGE")) throw err;
      problems.push(err.message);
    }
  }
  if (problems.length > 0) throw usage(problems.length === 1 ? problems[0]! : problems.map((p) => `- ${p}`).join("\n"));
  return out;
}

/** Parses one `--kill` spec (see the module comment for the forms). */
export function parseKillSpec(raw: string, size: number | undefined): KillSpec {
  const text = raw.trim();
  const random = /^random:(.*)$/.exec(text);
  if (random !== null) {
    const count = /^\d+$/.test(random[1]!) ? Number(random[1]) : NaN;
    if (!Number.isSafeInteger(count) || count < 1 || count > RANDOM_KILLS_MAX) {
      throw usage(`--kill ${JSON.stringify(raw)}: random:K needs a count K from 1 to ${RANDOM_KILLS_MAX}`);
    }
    return { kind: "random", text, count };
  }
  const mock = /^mock=(.*)$/.exec(text);
  if (mock !== null) {
    const parts = mock[1]!.split(",").map((p) => p.trim());
    const nums = parts.map((p) => (/^\d+$/.test(p) ? Number(p) : NaN));
    if (parts.length !== 4 || nums.some((n) => !Number.isSafeInteger(n))) {
      throw usage(`--kill ${JSON.stringify(raw)}: Rabit's mock form is mock=rank,version,seqno,ndeath with four whole numbers, e.g. mock=1,2,0,0`);
    }
    const [rank, version, seqno, ndeath] = nums as [number, number, number, number];
    checkRank(raw, rank, size);
    return { kind: "rank", text, rank, trigger: `mock:${version},${seqno}`, attempt: ndeath };
  }
  let inj: { rank: number; spec: string };
  try {
    inj = parseInject(text, size);
  } catch (err) {
    if (!isLifelineError(err, "LAUNCH_USAGE")) throw err;
    // The parser is --inject's; say which flag the user wrote and list the drill's forms.
    const detail = err.message.split(`--inject ${JSON.stringify(text)}`).join(`--kill ${JSON.stringify(raw)}`);
    throw usage(/^--kill/.test(detail) ? detail : `--kill ${JSON.stringify(raw)}: ${detail}`, KILL_FORMS);
  }
  const at = inj.spec.lastIndexOf("@attempt=");
  const trigger = at < 0 ? inj.spec : inj.spec.slice(0, at);
  const attempt = at < 0 ? undefined : Number(inj.spec.slice(at + "@attempt=".length));
  return { kind: "rank", text, rank: inj.rank, trigger, attempt };
}

const KILL_FORMS = "write r@step:N, r@time:1.5s, r@send:N, r@line:N, r@hang:<trigger>, random:K or mock=rank,version,seqno,ndeath";

/**
 * Turns the parsed specs of one faulty run into concrete faults. Random kills are drawn from
 * `seed` within `reference`'s shape; without a reference shape they are refused.
 */
export function planFaults(specs: readonly KillSpec[], ctx: { size: number; mode: Mode; seed: number; reference: ReferenceShape | undefined }): PlannedFault[] {
  const prng = new DrillPrng(ctx.seed);
  const drafts: { rank: number; trigger: string; attempt: number | undefined; source: string }[] = [];
  for (const spec of specs) {
    if (spec.kind === "rank") {
      drafts.push({ rank: spec.rank, trigger: spec.trigger, attempt: spec.attempt, source: spec.text });
      continue;
    }
    if (ctx.reference === undefined) throw usage(`--kill ${spec.text}: random kills need a reference run to place them`);
    for (let k = 0; k < spec.count; k++) drafts.push({ ...drawRandomKill(prng, ctx.reference), attempt: undefined, source: spec.text });
  }
  // Attempts: the kth fault fires in attempt k (restart-all modes bump every rank's attempt),
  // or, in retry-one and elastic, in the rank's own kth life.
  const livesByRank = new Array<number>(ctx.size).fill(0);
  return drafts.map((d, k) => {
    const own = livesByRank[d.rank]!;
    livesByRank[d.rank] = own + 1;
    const attempt = d.attempt ?? (ctx.mode === "retry-one" || ctx.mode === "elastic" ? own : k);
    const step = /^(?:hang:)?step:(\d+)$/.exec(d.trigger);
    return {
      index: k + 1,
      rank: d.rank,
      trigger: d.trigger,
      attempt,
      source: d.source,
      stepsBefore: step === null ? undefined : Number(step[1]) - 1,
      hang: d.trigger.startsWith("hang:"),
    };
  });
}

/** One random kill: a rank, then a step or a time inside what that rank did in the reference. */
function drawRandomKill(prng: DrillPrng, ref: ReferenceShape): { rank: number; trigger: string } {
  const rank = prng.index(ref.stepsByRank.length);
  const steps = ref.stepsByRank[rank] ?? 0;
  const computeMs = ref.computeMsByRank[rank] ?? 0;
  // A step kill needs a step that is not the last (the rank must still have work after it);
  // a time kill needs time enough to land inside the computation.
  const canStep = steps >= 2;
  const canTime = computeMs >= 50;
  const useStep = canStep && (!canTime || prng.chance(0.5));
  if (useStep) return { rank, trigger: `step:${prng.rangeInclusive(1, steps - 1)}` };
  if (canTime) {
    // Between 10% and 80% of the rank's computing time: after start-up noise, before the end.
    return { rank, trigger: `time:${prng.rangeInclusive(Math.round(computeMs * 0.1), Math.round(computeMs * 0.8))}` };
  }
  return { rank, trigger: "step:1" };
}

/** The text a rank prints when a trigger fires (src/mpi/faults.ts `fire`), for matching. */
export function firedWhy(trigger: string): string {
  return trigger.startsWith("hang:") ? trigger.slice("hang:".length) : trigger;
}

/** `time:1500` → `time:1.5s` for people; other triggers unchanged. */
export function describeTrigger(trigger: string): string {
  return trigger.replace(/time:(\d+)$/, (_all, ms: string) => `time:${Number(ms) >= 1000 ? `${Number(ms) / 1000}s` : `${ms}ms`}`);
}

/**
 * A small seeded PRNG (SplitMix32-style mixing of a Weyl sequence), so that `--seed` reproduces
 * a drill's random kills exactly on every platform.
 */
export class DrillPrng {
  private state: number;

  constructor(seed: number) {
    this.state = (Math.floor(seed) ^ 0x9e3779b9) >>> 0;
  }

  /** A uniform 32-bit unsigned integer. */
  nextU32(): number {
    this.state = (this.state + 0x9e3779b9) >>> 0;
    let z = this.state;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
    return (z ^ (z >>> 16)) >>> 0;
  }

  /** Uniform in [0, 1). */
  float(): number {
    return this.nextU32() / 0x1_0000_0000;
  }

  /** Uniform integer in [0, n). */
  index(n: number): number {
    if (!(n >= 1)) throw new RangeError(`index(n) needs n >= 1, got ${n}`);
    return Math.floor(this.float() * n);
  }

  /** Uniform integer in [min, max]. */
  rangeInclusive(min: number, max: number): number {
    if (max < min) throw new RangeError(`rangeInclusive(${min}, ${max}): max < min`);
    return min + this.index(max - min + 1);
  }

  chance(p: number): boolean {
    return this.float() < p;
  }
}

/**
 * The seed of repetition `k` (0-based) of a drill with seed `seed`: the first repetition uses
 * the seed itself, so `--seed` printed by a failed repetition reproduces it with `--repeat 1`.
 */
export function deriveSeed(seed: number, k: number): number {
  if (k === 0) return seed >>> 0;
  const prng = new DrillPrng((seed ^ Math.imul(k, 0x27d4eb2d)) >>> 0);
  return prng.nextU32();
}

function checkRank(raw: string, rank: number, size: number | undefined): void {
  if (size !== undefined && rank >= size) {
    throw usage(`--kill ${JSON.stringify(raw)}: rank ${rank} is outside 0..${size - 1} (the job has ${size} rank${size === 1 ? "" : "s"})`);
  }
}

function usage(message: string, hint?: string): LifelineError {
  return new LifelineError("LAUNCH_USAGE", hint === undefined || message.includes(hint) ? message : `${message} (${hint})`);
}
