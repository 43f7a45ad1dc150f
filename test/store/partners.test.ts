/**
 * Goal: the two pure decisions of per-host stores (src/store/partners.ts) — which rank keeps
 * copies of which, and which committed line a restart can use when hosts (and their disks)
 * are gone — are right in the cases a host loss produces.
 */
import { describe, expect, it } from "vitest";
import { chooseAcrossHosts, partnerOf, type HostReport } from "../../src/store/partners.ts";
import type { LineRecord, PartRef } from "../../src/store/types.ts";

const ref = (rank: number, epoch: number): PartRef => ({ rank, epoch, checksum: 1000 * epoch + rank, bytes: 10 + rank });
const line = (epoch: number, size = 4): LineRecord => ({
  epoch,
  timeMs: epoch,
  parts: Array.from({ length: size }, (_, r) => ref(r, epoch)),
  meta: undefined,
  job: undefined,
});
const own = (rank: number, epoch: number) => ({ ref: ref(rank, epoch), where: `rank-${rank}` });
const copy = (holder: number, rank: number, epoch: number) => ({ ref: ref(rank, epoch), where: `held-by-${holder}/rank-${rank}` });

describe("partnerOf", () => {
  it("is the rank of the same place on the next host, one copy per rank on equal hosts", () => {
    expect([0, 1, 2, 3].map((r) => partnerOf(r, [0, 0, 1, 1]))).toEqual([2, 3, 0, 1]);
    expect([0, 1, 2, 3].map((r) => partnerOf(r, [0, 1, 0, 1]))).toEqual([1, 0, 3, 2]);
    expect([0, 1, 2].map((r) => partnerOf(r, [0, 1, 2]))).toEqual([1, 2, 0]);
    expect([0, 1, 2, 3, 4, 5].map((r) => partnerOf(r, [0, 0, 1, 1, 2, 2]))).toEqual([2, 3, 4, 5, 0, 1]);
    // Unequal hosts: the smaller host's ranks take the extra copies in turn.
    expect([0, 1, 2, 3, 4].map((r) => partnerOf(r, [0, 0, 0, 1, 1]))).toEqual([3, 4, 3, 0, 1]);
    // Host numbers need not be dense or ordered; the order is that of first appearance.
    expect([0, 1, 2, 3].map((r) => partnerOf(r, [7, 7, 3, 3]))).toEqual([2, 3, 0, 1]);
  });

  it("is always on another host, and every rank on a host of several has one", () => {
    for (let seed = 1; seed <= 300; seed++) {
      let x = seed;
      const rnd = (n: number): number => ((x = (x * 1103515245 + 12345) % 2 ** 31), x % n);
      const hosts = Array.from({ length: 1 + rnd(8) }, () => rnd(3));
      const distinct = new Set(hosts).size;
      hosts.forEach((h, r) => {
        const p = partnerOf(r, hosts);
        if (distinct < 2) expect(p).toBeUndefined();
        else expect(hosts[p!]).not.toBe(h);
      });
    }
  });

  it("is undefined when every rank is on one host", () => {
    expect(partnerOf(0, [0, 0, 0])).toBeUndefined();
    expect(partnerOf(0, [5])).toBeUndefined();
  });
});

describe("chooseAcrossHosts", () => {
  const lines = [line(1), line(2)];
  // Hosts 0 (ranks 0, 1) and 1 (ranks 2, 3); the copies as an older placement kept them (two
  // per holder): the choice goes by what each host reports, not by who the partner is now.
  const host0 = (epochs: number[]): HostReport => ({ host: 0, rank: 0, parts: epochs.flatMap((e) => [own(0, e), own(1, e), copy(0, 2, e), copy(0, 3, e)]) });
  const host1 = (epochs: number[]): HostReport => ({ host: 1, rank: 2, parts: epochs.flatMap((e) => [own(2, e), own(3, e), copy(2, 0, e), copy(2, 1, e)]) });

  it("every rank on its host, every part there: the newest line, nothing moves", () => {
    const c = chooseAcrossHosts(lines, [host0([1, 2]), host1([1, 2])], [0, 0, 1, 1]);
    expect(c.line?.epoch).toBe(2);
    expect(c.sources).toEqual([{ kind: "own" }, { kind: "own" }, { kind: "own" }, { kind: "own" }]);
    expect(c.warnings).toEqual([]);
  });

  it("host 1 lost, its ranks on a spare host 2: their parts come from the copies on host 0", () => {
    const spare: HostReport = { host: 2, rank: 2, parts: [] };
    const c = chooseAcrossHosts(lines, [host0([1, 2]), spare], [0, 0, 2, 2]);
    expect(c.line?.epoch).toBe(2);
    expect(c.sources).toEqual([
      { kind: "own" },
      { kind: "own" },
      { kind: "copy", holder: 0, where: "held-by-0/rank-2" },
      { kind: "copy", holder: 0, where: "held-by-0/rank-3" },
    ]);
  });

  it("a rank placed on another host than its own store (a resume): its own database there is preferred to a partner copy", () => {
    const c = chooseAcrossHosts(lines, [host1([1, 2]), { host: 2, rank: 0, parts: [] }], [2, 2, 1, 1]);
    expect(c.line?.epoch).toBe(2);
    expect(c.sources[0]).toEqual({ kind: "copy", holder: 2, where: "held-by-2/rank-0" });
    expect(c.sources[2]).toEqual({ kind: "own" });
    const both: HostReport = { host: 3, rank: 0, parts: [own(0, 2), copy(3, 0, 2)] };
    expect(chooseAcrossHosts([line(2)], [both, host1([2])], [2, 2, 1, 1]).sources[0]).toEqual({ kind: "copy", holder: 0, where: "rank-0" });
  });

  it("the newest line incomplete (a part nowhere, or damaged: not reported): falls back with a warning naming the rank", () => {
    const h0 = host0([1, 2]);
    const c = chooseAcrossHosts(
      lines,
      [
        { ...h0, parts: h0.parts.filter((p) => !(p.ref.rank === 3 && p.ref.epoch === 2)) },
        { host: 2, rank: 2, parts: [] },
      ],
      [0, 0, 2, 2],
    );
    expect(c.line?.epoch).toBe(1);
    expect(c.skipped).toEqual([{ epoch: 2, missing: [3] }]);
    expect(c.warnings[0]).toMatch(/recovery line 2 is unusable, falling back to line 1: no surviving host holds rank 3's part/);
  });

  it("a part whose checksum differs from the commit record does not count", () => {
    const stale = { ref: { ...ref(1, 2), checksum: 7 }, where: "rank-1" };
    const c = chooseAcrossHosts(
      [line(2)],
      [
        { host: 0, rank: 0, parts: [own(0, 2), stale, copy(0, 2, 2), copy(0, 3, 2)] },
        { host: 1, rank: 2, parts: [own(2, 2), own(3, 2)] },
      ],
      [0, 0, 1, 1],
    );
    expect(c.line).toBeUndefined();
    expect(c.skipped).toEqual([{ epoch: 2, missing: [1] }]);
    expect(c.warnings[0]).toMatch(/the job starts from the beginning/);
  });

  it("no line at all: starts from the beginning, no warning", () => {
    expect(chooseAcrossHosts([], [host0([])], [0, 0, 1, 1])).toEqual({ line: undefined, sources: [], skipped: [], warnings: [] });
  });
});
