/**
 * A released rank's cpr driver must close promptly even when a part write was still queued:
 * a copy to a partner that has already left would otherwise wait for its answer, and the
 * rank (with its watchdog) would outlive its release until the launcher kills it.
 */
import { describe, expect, it } from "vitest";
import {
  CoordinatedDriver,
  type PartStoreLike,
  PROTO_CPR_COPIED,
  PROTO_CPR_COPY,
  PROTO_CPR_COUNT,
  PROTO_CPR_MARKER,
} from "../../src/cpr/coordinated/driver.ts";
import type { RankToCoordinator } from "../../src/mpi/control.ts";
import type { CprWorldAccess } from "../../src/mpi/cpr-hook.ts";
import { fakeHost, fakeHostStores, protocolHeader as header } from "./cpr-driver-fakes.ts";

function harness() {
  const controls: RankToCoordinator[] = [];
  const protocols: { dest: number; tag: number; body: unknown }[] = [];
  const armed = new Set<number>();
  let nextTimer = 0;
  const access: CprWorldAccess = {
    rank: 0,
    size: 2,
    attempt: 0,
    captureLibState: () => ({}) as never,
    restoreLibState: () => undefined,
    inject: () => undefined,
    sendProtocol: (dest, tag, body) => void protocols.push({ dest, tag, body }),
    sendControl: (msg) => void controls.push(msg),
    fatal: (code, message) => {
      throw new Error(`${code}: ${message}`);
    },
  };
  const host = fakeHost(() => {
    const id = nextTimer++;
    armed.add(id);
    return { stop: () => void armed.delete(id) };
  });
  let releaseRetain: () => void = () => undefined;
  const retainGate = new Promise<void>((resolve) => {
    releaseRetain = resolve;
  });
  const parts: PartStoreLike = {
    putPart: async (epoch, bytes) => ({ rank: 0, epoch, checksum: 1, bytes: bytes.length }),
    readPart: async () => Buffer.alloc(0),
    retain: async () => {
      await retainGate;
      return [];
    },
    dropParts: async () => [],
    close: async () => undefined,
  };
  const opened: number[] = [];
  const hostStores = fakeHostStores(async (of) => {
    opened.push(of);
    return parts;
  });
  const driver = new CoordinatedDriver(access, host, async () => parts, { hostStores });
  return { driver, controls, protocols, armed, opened, releaseRetain };
}

describe("cpr driver close", () => {
  it("a part write queued behind others when close() begins sends no copy and arms no timer", async () => {
    const h = harness();
    await h.driver.beforeStart({ t: "table", keysIn: [0, 0], keysOut: [0, 0], endpoints: [], attempts: [0, 0], partner: 1 } as never);
    // A slow store operation holds the write chain.
    h.driver.onControl({ t: "cpr-committed", epoch: 0, keep: [0] });
    // Checkpoint 1: taken, the peer's marker arrives, the line stops → the part write queues.
    h.driver.onControl({ t: "cpr-checkpoint", epoch: 1 });
    // Rank 1's next checkpoint() call has the same count: both take it at the call after it (see PROTO_CPR_COUNT).
    h.driver.onProtocol(header(1, PROTO_CPR_COUNT), { epoch: 1, next: 1 });
    h.driver.checkpoint({ x: 1 }, undefined, () => undefined);
    expect(h.driver.epoch).toBe(0);
    h.driver.checkpoint({ x: 2 }, undefined, () => undefined);
    expect(h.driver.epoch).toBe(1);
    h.driver.onProtocol(header(1, PROTO_CPR_MARKER), { epoch: 1, sent: 0 });
    h.driver.onControl({ t: "cpr-stop", epoch: 1 });
    const closed = h.driver.close();
    h.releaseRetain();
    await closed;
    expect(h.protocols.filter((p) => p.tag === PROTO_CPR_COPY)).toEqual([]);
    expect(h.armed.size).toBe(0);
    expect(h.controls.find((m) => m.t === "cpr-part-failed")).toMatchObject({ epoch: 1, message: expect.stringContaining("closing") });
  });

  it("a partner's copy arriving after close() is refused without opening a store", async () => {
    const h = harness();
    await h.driver.close();
    h.driver.onProtocol(header(1, PROTO_CPR_COPY), { epoch: 3, chunks: [new Uint8Array([1, 2, 3])] });
    await new Promise((r) => setTimeout(r, 10));
    expect(h.opened).toEqual([]);
    expect(h.protocols).toEqual([{ dest: 1, tag: PROTO_CPR_COPIED, body: { epoch: 3, failure: "the partner is closing" } }]);
  });
});
