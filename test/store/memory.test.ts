/**
 * Goal: the in-memory store the simulator uses keeps the store contract, and its crash()
 * models `kill -9` of every process using the store.
 *
 * Method: the shared contract suite (`suite.ts`) against `MemoryRecoveryStore`, then a few
 * tests of crash(): handles die with STORE_NOT_OPEN, locks are released, written data stays.
 */
import { describe, expect, it } from "vitest";
import { MemoryRecoveryStore } from "../../src/store/memory-store.ts";
import { latestLine, localVerifier } from "../../src/store/recovery.ts";
import { bytesOf, expectCode, recoveryStoreSuite } from "./suite.ts";

recoveryStoreSuite("memory", async ({ nowMs }) => {
  const store = new MemoryRecoveryStore({ nowMs });
  return { store, faults: store, cleanup: async () => undefined };
});

describe("MemoryRecoveryStore.crash()", () => {
  it("kills open handles, releases locks and keeps what was written", async () => {
    const store = new MemoryRecoveryStore({ name: "sim" });
    const m = await store.openManifest();
    const p = await store.openRank(0);
    const ref = await p.putPart(1, bytesOf(200_000, 1));
    await m.commitLine(1, [ref]);
    const inFlight = p.putPart(2, bytesOf(10, 2)); // queued behind nothing, but runs after crash()
    store.crash();
    await expectCode(inFlight, "STORE_NOT_OPEN");
    await expectCode(m.list(), "STORE_NOT_OPEN");
    await expectCode(p.listParts(), "STORE_NOT_OPEN");
    const m2 = await store.openManifest();
    const p2 = await store.openRank(0);
    const choice = await latestLine(m2, localVerifier([p2]));
    expect(choice.line!.epoch).toBe(1);
    expect((await p2.listParts()).map((i) => i.epoch)).toEqual([1]);
    expect(p2.location).toBe("memory:sim/rank-0/parts");
  });
});
