/**
 * Goal: Rabit's recovery test scenarios (rabit/test: model_recover, local_recover,
 * lazy_recover with `mock=rank,version,seqno,ndeath`) and the failures retry-one must survive, each
 * over many seeded schedules on 4 ranks: the job ends with every rank's result equal to the
 * failure-free run's, or — where the failures exceed what the replicas cover, or a rank is
 * never restarted — with a clear error; never a hang, never a mixed result.
 * Method: the in-process harness (harness.ts) running the pure machines; the programs check
 * every collective result against its known value, the harness checks that every rank and
 * incarnation saw the same result for each (version, seqno) and bootstrap key.
 */
import { describe, expect, it } from "vitest";
import { type Mock, parseMocks, RetryOneSim, type SimConfig, type SimOutcome, type Trigger } from "./harness.ts";
import { type RabitProgramOptions, rabitProgram } from "./programs.ts";

const SEEDS = 30;
const SIZE = 4;

type Kind = RabitProgramOptions["kind"];

const reference = new Map<string, string>();
function referenceResults(p: RabitProgramOptions, size: number): string {
  const key = JSON.stringify([p, size]);
  let r = reference.get(key);
  if (r === undefined) {
    const o = new RetryOneSim({ seed: 1, size, replicas: 1, program: rabitProgram(p) }).run();
    expect(o.status).toBe("ok");
    r = JSON.stringify(o.results);
    reference.set(key, r);
  }
  return r;
}

interface Case {
  readonly program: RabitProgramOptions;
  readonly mocks?: readonly Mock[];
  readonly triggers?: readonly Trigger[];
  readonly replicas?: number;
  readonly noRestart?: readonly number[];
  readonly failureTimeoutMs?: number;
  readonly restartDelayMs?: readonly [number, number];
}

function runSeeds(c: Case, check: (o: SimOutcome) => void): SimOutcome[] {
  const outs: SimOutcome[] = [];
  for (let seed = 1; seed <= SEEDS; seed++) {
    const cfg: SimConfig = {
      seed,
      size: SIZE,
      replicas: c.replicas ?? 2,
      program: rabitProgram(c.program),
      mocks: c.mocks,
      triggers: c.triggers,
      noRestart: c.noRestart,
      failureTimeoutMs: c.failureTimeoutMs,
      restartDelayMs: c.restartDelayMs,
    };
    let o: SimOutcome;
    try {
      o = new RetryOneSim(cfg).run();
      check(o);
    } catch (err) {
      throw new Error(`scenario failed with seed ${seed}: ${(err as Error).message}`, { cause: err });
    }
    outs.push(o);
  }
  return outs;
}

function expectRecovered(c: Case, crashes?: number): SimOutcome[] {
  const want = referenceResults(c.program, SIZE);
  return runSeeds(c, (o) => {
    if (o.status !== "ok") throw new Error(`${o.status}: ${o.failures.map((f) => `${f.code} ${f.message}`).join("; ")}\n${o.trace.slice(-30).join("\n")}`);
    expect(JSON.stringify(o.results)).toBe(want);
    if (crashes !== undefined) expect(o.crashes).toBe(crashes);
  });
}

const program = (kind: Kind, more: Partial<RabitProgramOptions> = {}): RabitProgramOptions => ({ kind, iterations: 5, n: 4, bootstrap: true, ...more });

const DIE_SAME = "0,0,1,0 + 1,2,1,0 + 2,2,1,0 + 3,2,1,0";
const DIE_HARD = `${DIE_SAME} + 1,2,1,1 + 3,2,1,1 + 0,2,2,1`;

describe.each(["model", "local", "lazy"] as const)("%s_recover on 4 ranks", (kind) => {
  it("mock=0,0,1,0 + 1,1,1,0: a death before any checkpoint, one after", () => {
    const outs = expectRecovered({ program: program(kind), mocks: parseMocks("0,0,1,0 + 1,1,1,0") }, 2);
    expect(outs.every((o) => o.replayed > 0)).toBe(true);
  });

  it(`die same (${DIE_SAME}): three ranks die at the same collective; replicas 3 cover them`, () => {
    expectRecovered({ program: program(kind), mocks: parseMocks(DIE_SAME), replicas: 3 }, 4);
  });

  it(`die hard (${DIE_HARD}): restarted ranks 1 and 3 (1 is 3's tree parent) die again at the point where the survivor waits, then the survivor dies`, () => {
    expectRecovered({ program: program(kind), mocks: parseMocks(DIE_HARD), replicas: 3 }, 7);
  });
});

describe("Rabit's own integration test on 10 ranks (ranks 0, 4 and 9 die at once, rank 1 right after)", () => {
  it.each(["model", "local"] as const)("%s_recover, replicas 2", (kind) => {
    const p = program(kind, { iterations: 4 });
    const want = referenceResults(p, 10);
    for (let seed = 1; seed <= 10; seed++) {
      const o = new RetryOneSim({ seed, size: 10, replicas: 2, program: rabitProgram(p), mocks: parseMocks("0,1,1,0 + 4,1,1,0 + 9,1,1,0 + 1,1,2,0") }).run();
      if (o.status !== "ok") throw new Error(`seed ${seed}: ${o.status} ${o.failures.map((f) => f.message).join("; ")}`);
      expect(JSON.stringify(o.results)).toBe(want);
      expect(o.crashes).toBe(4);
    }
  });
});

describe("cost", () => {
  it("failure-free: no agreement frames at all; per checkpoint k replicas, N-1 `stored` and N-1 `ask` or `done` per rank", () => {
    const iterations = 5;
    for (let seed = 1; seed <= SEEDS; seed++) {
      const o = new RetryOneSim({ seed, size: SIZE, replicas: 2, program: rabitProgram(program("local")) }).run();
      expect(o.status).toBe("ok");
      expect(o.frames.summary ?? 0).toBe(0);
      expect(o.frames.xfer ?? 0).toBe(0);
      expect(o.frames.replica).toBe(SIZE * 2 * iterations);
      expect(o.frames.stored).toBe(SIZE * (SIZE - 1) * iterations);
      // Every rank checkpoints at the same index: one ask or done per ordered pair (an ask also
      // says where its sender is, so crossing asks need no done back).
      expect((o.frames.ask ?? 0) + (o.frames.done ?? 0)).toBeLessThanOrEqual(SIZE * (SIZE - 1) * iterations);
    }
  });

  it("one failure costs a few agreement rounds (all-to-all summaries), not one per replayed collective", () => {
    // Rounds: the bootstrap cache, the restore, the first collective together; and a `wait` for
    // each rank still running (computing, or in its checkpoint) when a round runs, which takes a
    // round of its own when it reaches the collective.
    for (let seed = 1; seed <= SEEDS; seed++) {
      const o = new RetryOneSim({ seed, size: SIZE, replicas: 2, program: rabitProgram(program("local")), mocks: parseMocks("1,3,2,0") }).run();
      expect(o.status).toBe("ok");
      // Two bootstrap keys and (3,0) at least; (3,1) too unless the dead rank's frames for it were lost.
      expect(o.replayed).toBeGreaterThanOrEqual(3);
      expect(o.frames.summary).toBeGreaterThan(0);
      const rounds = o.frames.summary! / (SIZE * (SIZE - 1));
      expect(rounds).toBeLessThanOrEqual(SIZE + 4);
    }
  });
});

describe("failures retry-one must survive", () => {
  it("lazy checkpoints: the global function runs only for a restore it serves", () => {
    const clean = new RetryOneSim({ seed: 3, size: SIZE, replicas: 2, program: rabitProgram(program("lazy")) }).run();
    expect(clean.stats.globalThunks).toBe(0);
    expect(clean.stats.stateThunks).toBe(SIZE * 5); // once per rank and checkpoint, for the replicas
    const outs = expectRecovered({ program: program("lazy"), mocks: parseMocks("1,2,1,0") }, 1);
    // The restarted rank's global, and the older one the giver still keeps (a peer may restart from it).
    for (const o of outs) expect(o.stats.globalThunks).toBeGreaterThanOrEqual(1);
    for (const o of outs) expect(o.stats.globalThunks).toBeLessThanOrEqual(2);
  });

  it("die same with replicas 2: when rank 1 and both its holders are dead at once → a clear CPR_LOST error, no hang", () => {
    // Slow restarts, so that the three are usually dead at once; where a schedule lets rank 1
    // come back before the others die, recovery must succeed instead.
    const want = referenceResults(program("local"), SIZE);
    const outs = runSeeds({ program: program("local"), mocks: parseMocks(DIE_SAME), replicas: 2, restartDelayMs: [2000, 3000] }, (o) => {
      if (o.status === "ok") {
        expect(JSON.stringify(o.results)).toBe(want);
        return;
      }
      expect(o.status).toBe("failed");
      expect(o.failures[0]!.code).toBe("CPR_LOST");
      expect(o.failures[0]!.message).toMatch(/rank 1's checkpoint 2 is lost.*--replicas 2/);
    });
    expect(outs.filter((o) => o.status === "failed").length).toBeGreaterThan(SEEDS / 2);
  });

  it("a rank dying at the first collective right after a checkpoint, with the bootstrap cache on", () => {
    expectRecovered({ program: program("local"), mocks: parseMocks("1,1,0,0 + 2,3,0,0") }, 2);
  });

  it("a rank dying inside a checkpoint (after pushing one replica)", () => {
    expectRecovered({ program: program("local"), triggers: [{ kind: "after-replica", rank: 2, attempt: 0, version: 2 }] }, 1);
  });

  it("dying at a checkpoint call (mock seqno = collectives in the version)", () => {
    expectRecovered({ program: program("local"), mocks: parseMocks("3,1,3,0") }, 1);
  });

  it("a survivor killed while it serves a restore: another replica serves", () => {
    expectRecovered({ program: program("local"), mocks: parseMocks("1,1,1,0"), triggers: [{ kind: "serving-restore", rank: 2, attempt: 0 }] }, 2);
  });

  it("a rank killed again while its checkpoint arrives: its next incarnation restores", () => {
    expectRecovered({ program: program("local"), mocks: parseMocks("1,1,1,0"), triggers: [{ kind: "receiving-restore", rank: 1, attempt: 1 }] }, 2);
  });

  it("a kill during a bootstrap collective: the bootstrap results are served from peers' caches", () => {
    expectRecovered({ program: program("model"), triggers: [{ kind: "at-boot", rank: 2, attempt: 0, key: "ncol" }], mocks: parseMocks("0,1,1,0") }, 2);
  });

  it("a dead rank never restarted: the survivors fail with MPI_TIMEOUT within the failure timeout", () => {
    runSeeds({ program: program("local"), mocks: parseMocks("2,1,1,0"), noRestart: [2], failureTimeoutMs: 3000 }, (o) => {
      expect(o.status).toBe("failed");
      expect(o.failures[0]!.code).toBe("MPI_TIMEOUT");
      expect(o.failures[0]!.message).toMatch(/rank 2 failed and was not running again within the failure timeout/);
      // Ticks are at most 50 ms apart and the coordinator's news may lag a few events.
      expect(o.failures[0]!.atMs - o.lastCrashMs).toBeLessThanOrEqual(3000 + 200);
    });
  });

  it("a replay that diverges (the restarted program calls another op at the same point) → CPR_REPLAY, never a mixed result", () => {
    const outs = runSeeds({ program: program("model", { divergeFromAttempt: 1 }), mocks: parseMocks("1,1,2,0") }, (o) => {
      expect(o.status).toBe("failed");
      // Version 1, seqno 1: three collectives per iteration, so collective #4. Served from a
      // buffer, the replay's identity check stops it; when the survivors had not finished #4
      // yet (the rank finished it first, then died), it runs on the wire, where the frames'
      // identity hash stops it.
      const f = o.failures[0]!;
      if (f.code === "CPR_REPLAY") expect(f.message).toMatch(/replay diverged at collective #4/);
      else {
        expect(f.code).toBe("MPI_COLLECTIVE_MISMATCH");
        expect(f.message).toMatch(/at collective #4 allreduce:sum.*called collective #4 allreduce:max/);
      }
    });
    // Most schedules take the replay path.
    expect(outs.filter((o) => o.failures[0]!.code === "CPR_REPLAY").length).toBeGreaterThan(outs.length / 2);
  });
});
