/**
 * A retry-one rank that fails (here: a peer down for longer than the failure timeout, which
 * ends the job with CPR_LOST-like errors) must ask the coordinator to stop the job *before*
 * the program's pending call fails: a program that dies of the error first exits with code 1,
 * and the launcher takes that for a crash of this rank (one more restart) instead of the
 * rank's abort — with CPR_LOST, the difference between restarting one rank and restarting
 * every rank from the durable floor. Seen in CI under load: the rank's exit overtook its abort.
 *
 * Also how a collective's decision comes back to the communicator: as a value when the
 * protocol decides at once (no promise to wait on), as the failure's promise otherwise.
 */
import { describe, expect, it } from "vitest";
import { RetryOneDriver } from "../../src/cpr/retry-one/driver.ts";
import type { Host, Timer } from "../../src/mpi/host.ts";
import type { RetryWorldAccess } from "../../src/mpi/retry-hook.ts";

const FAILURE_TIMEOUT_MS = 1_000;

function harness() {
  let now = 0;
  const ticks: (() => void)[] = [];
  const host = {
    now: () => now,
    defer: (fn: () => void) => void queueMicrotask(fn),
    every: (_ms: number, fn: () => void): Timer => {
      ticks.push(fn);
      return { stop: () => undefined };
    },
    after: (): Timer => ({ stop: () => undefined }),
    exit: () => undefined,
    warn: () => undefined,
    pid: 1,
  } as unknown as Host;
  const aborts: { code: string; message: string }[] = [];
  /** Run once the coordinator "has" the abort (undefined: no abort on its way). */
  let waiters: (() => void)[] | undefined;
  const access = {
    rank: 0,
    size: 2,
    attempt: 0,
    sendProtocol: () => undefined,
    caughtUp: () => undefined,
    recycle: () => undefined,
    ownReleased: () => undefined,
    abandonCollective: () => undefined,
    inject: () => undefined,
    fatal: (code: string, message: string) => {
      aborts.push({ code, message });
      waiters ??= [];
    },
    afterAbort: (fn: () => void) => {
      if (waiters === undefined) fn();
      else waiters.push(fn);
    },
    setGate: () => undefined,
    peerSafe: () => undefined,
    sendControl: () => undefined,
  } as unknown as RetryWorldAccess;
  const driver = new RetryOneDriver(access, host, { replicas: 1, failureTimeoutMs: FAILURE_TIMEOUT_MS });
  return {
    driver,
    aborts,
    advance: (ms: number) => {
      now += ms;
      for (const t of ticks) t();
    },
    abortHeard: () => {
      const w = waiters ?? [];
      waiters = undefined;
      for (const fn of w) fn();
    },
  };
}

const settle = (): Promise<void> => new Promise((r) => setTimeout(r, 5));

describe("retry-one: a rank's failure reaches the coordinator before its program", () => {
  it("the pending collective and the next one fail only once the abort was heard", async () => {
    const h = harness();
    await h.driver.beforeStart({ t: "table", keysIn: [0, 0], keysOut: [0, 0], endpoints: [], attempts: [0, 0], down: [1] } as never);
    // A decision taken at once comes back as it is (no promise): it counts as a success.
    const outcome = (p: unknown) => {
      const o: { err?: Error } = {};
      Promise.resolve(p).then(
        () => undefined,
        (err: Error) => (o.err = err),
      );
      return o;
    };
    const pending = outcome(h.driver.beforeCollective({ ident: { op: "allreduce", root: -1, type: "Float64Array", length: 4 } }));
    // Rank 1 stays down past the failure timeout: this rank fails the job.
    h.advance(FAILURE_TIMEOUT_MS + 100);
    await settle();
    expect(h.aborts).toHaveLength(1);
    expect(pending.err).toBeUndefined();
    const later = outcome(h.driver.beforeCollective({ ident: { op: "allreduce", root: -1, type: "Float64Array", length: 4 } }));
    const resumed = outcome(h.driver.resumeCollective());
    await settle();
    expect(later.err).toBeUndefined();
    expect(resumed.err).toBeUndefined();
    h.abortHeard();
    await settle();
    for (const o of [pending, later, resumed]) expect((o.err as { code?: string } | undefined)?.code).toBe(h.aborts[0]!.code);
  });
});

describe("retry-one: how a collective's decision comes back", () => {
  const ident = { op: "allreduce", root: -1, type: "Float64Array", length: 4 };

  it("at once, not as a promise, when the protocol can decide at once; numbered in call order", async () => {
    const h = harness();
    await h.driver.beforeStart({ t: "table", keysIn: [0, 0], keysOut: [0, 0], endpoints: [], attempts: [0, 0] } as never);
    for (let seq = 0; seq < 3; seq++) {
      const d = h.driver.beforeCollective({ ident });
      expect(d).not.toBeInstanceOf(Promise);
      expect(d).toEqual({ run: { wireSeq: seq, viewId: 0, purgeBelow: 0 } });
      h.driver.afterCollective(Buffer.from([seq]));
    }
    expect(h.driver.progress.seqno).toBe(3);
    // A second call while one runs is a program error, and it comes back as the failure.
    expect(h.driver.beforeCollective({ ident })).not.toBeInstanceOf(Promise);
    const second = h.driver.beforeCollective({ ident });
    expect(second).toBeInstanceOf(Promise);
    h.abortHeard();
    await expect(second).rejects.toMatchObject({ code: "CPR_PROTOCOL" });
    expect(h.aborts.map((a) => a.code)).toEqual(["CPR_PROTOCOL"]);
  });
});
