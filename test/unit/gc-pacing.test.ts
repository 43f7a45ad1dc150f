import { PerformanceObserver, constants } from "node:perf_hooks";
import { runInNewContext } from "node:vm";
import { describe, expect, it } from "vitest";
import { GC_PACING_BYTES, GC_PACING_CHECK_BYTES, minorGc, ReceiveGcPacer } from "../../src/mpi/zmq/gc-pacing.ts";

const MiB = 1024 * 1024;

/** A pacer over a fake heap: `used` is what the heap reports, `runs` counts its scavenges. */
function fake(): { pacer: ReceiveGcPacer; heap: { used: number }; runs: () => number } {
  const heap = { used: 1000 };
  let runs = 0;
  const pacer = new ReceiveGcPacer(
    () => {
      runs++;
      heap.used = 500; // a scavenge frees something
    },
    () => heap.used,
  );
  return { pacer, heap, runs: () => runs };
}

describe("ReceiveGcPacer", () => {
  it("runs a scavenge once 16 MiB arrived with no collection seen, then counts again from there", () => {
    const { pacer, heap, runs } = fake();
    expect(GC_PACING_BYTES).toBe(16 * MiB);
    for (let i = 0; i < 15; i++) {
      pacer.received(MiB);
      heap.used += 10; // the heap only grows: V8 collected nothing
    }
    expect(runs()).toBe(0);
    pacer.received(MiB);
    expect(runs()).toBe(1);
    for (let i = 0; i < 15; i++) {
      pacer.received(MiB);
      heap.used += 10;
    }
    expect(runs()).toBe(1);
    pacer.received(MiB);
    expect(runs()).toBe(2);
  });

  it("runs none while V8 collects on its own (the used heap shrinks between looks)", () => {
    const { pacer, heap, runs } = fake();
    for (let i = 0; i < 200; i++) {
      pacer.received(MiB);
      // Every 8 MiB, a collection of V8's own.
      heap.used = i % 8 === 7 ? heap.used - 300 : heap.used + 10;
    }
    expect(runs()).toBe(0);
  });

  it("looks at the heap only every 4 MiB, whatever the message sizes", () => {
    let looks = 0;
    const pacer = new ReceiveGcPacer(
      () => undefined,
      () => ++looks,
    );
    expect(GC_PACING_CHECK_BYTES).toBe(4 * MiB);
    for (let i = 0; i < 4096; i++) pacer.received(1024); // 4 MiB of 1 KiB messages
    expect(looks).toBe(1);
    pacer.received(64 * MiB); // one large message: one look (and a scavenge)
    expect(looks).toBe(3);
  });

  it("refuses a look interval longer than the pacing interval", () => {
    const pacer = (afterBytes: number, checkBytes: number): ReceiveGcPacer =>
      new ReceiveGcPacer(
        () => undefined,
        () => 0,
        afterBytes,
        checkBytes,
      );
    expect(() => pacer(4 * MiB, 8 * MiB)).toThrow(RangeError);
    expect(() => pacer(4 * MiB, 0)).toThrow(RangeError);
  });
});

describe("minorGc", () => {
  it("runs a real scavenge, without giving this context or later ones a gc()", async () => {
    const before = typeof (globalThis as { gc?: unknown }).gc;
    const gc = minorGc();
    expect(gc).toBeTypeOf("function");
    // Neither this context's global object nor a context made afterwards got a gc.
    expect(typeof (globalThis as { gc?: unknown }).gc).toBe(before);
    expect(runInNewContext("typeof gc")).toBe("undefined");
    // V8 reports each collection (the entries come a little later) with its start time: those
    // that started during the call are its own, a minor one and no full one (V8 may start
    // others of its own afterwards).
    const during: number[] = [];
    let seen = 0;
    let t0 = 0;
    let t1 = 0;
    const obs = new PerformanceObserver((list) => {
      for (const e of list.getEntries()) {
        seen++;
        if (e.startTime >= t0 && e.startTime <= t1) during.push((e as unknown as { detail: { kind: number } }).detail.kind);
      }
    });
    obs.observe({ entryTypes: ["gc"] });
    t0 = performance.now();
    gc!();
    t1 = performance.now();
    for (let i = 0; i < 100 && seen === 0; i++) await new Promise((r) => setTimeout(r, 10));
    obs.disconnect();
    expect(during).toContain(constants.NODE_PERFORMANCE_GC_MINOR);
    expect(during).not.toContain(constants.NODE_PERFORMANCE_GC_MAJOR);
  });
});
