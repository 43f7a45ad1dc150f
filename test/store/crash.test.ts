/**
 * Goal: `kill -9` of a process writing the store, at any moment, never makes the store
 * unusable and never loses a committed line (except lines that --keep-lines pruned), and a
 * second process cannot open what a live one holds.
 *
 * Method: a child process (test/fixtures/store/writer.ts, run with `node --import tsx`) plays
 * coordinator and 3 ranks: it recovers, then writes lines in a loop (parts from empty to a
 * few MiB, some lines aborted), committing and pruning to 2 lines, and prints
 * `committed <epoch>` after each commit resolved. The test SIGKILLs it at seeded random
 * moments — some during start-up (open, recovery, garbage collection), most while it writes
 * — KILLS times on one store. After each kill it reopens the store in this process and checks:
 * it opens; every committed line's parts verify and latestLine() needs no fallback; the newest
 * committed line is at least the newest one the child reported; every reported line is still
 * there unless at least 2 newer lines are committed (then it was pruned). At the end, a last
 * recovery must leave no part and no blob file outside the committed lines.
 * SEED=n reproduces the kill schedule (the moments themselves depend on the machine's speed).
 */
import { spawn } from "node:child_process";
import { mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LevelRecoveryStore } from "../../src/store/level-store.ts";
import { latestLine, localVerifier, recoverLocal } from "../../src/store/recovery.ts";
import type { RankPartStore } from "../../src/store/types.ts";
import { blockFilesNamed } from "./level-faults.ts";
import { expectCode } from "./suite.ts";
import { Prng } from "../../src/testing/prng.ts";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const WRITER = join(ROOT, "test", "fixtures", "store", "writer.ts");
const SEED = Number(process.env.SEED ?? 20261121);
const KILLS = 30;
const RANKS = 3;
const KEEP = 2;

/** Seeded, from the simulator's PRNG. */
function prng(seed: number): () => number {
  const p = new Prng(seed);
  return () => p.float();
}

interface Child {
  /** Resolves when the child starts opening the store. */
  readonly opening: Promise<void>;
  /** Resolves with the milliseconds from "opening" to "ready" (open + recovery). */
  readonly ready: Promise<number>;
  readonly exited: Promise<void>;
  readonly committed: number[];
  readonly warnings: string[];
  /** Whether "ready" was printed. */
  readonly wasReady: () => boolean;
  kill(): void;
}

function startWriter(dir: string, seed: number): Child {
  const proc = spawn(process.execPath, ["--import", "tsx", WRITER, dir, String(seed), String(RANKS), String(KEEP)], {
    cwd: ROOT,
    stdio: ["ignore", "pipe", "pipe"],
  });
  const committed: number[] = [];
  const warnings: string[] = [];
  let stderr = "";
  let pending = "";
  let onReady!: (recoveryMs: number) => void;
  let onOpening!: () => void;
  let onFail!: (err: Error) => void;
  let openingAt = 0;
  let sawReady = false;
  const ready = new Promise<number>((resolve, reject) => {
    onReady = resolve;
    onFail = reject;
  });
  const opening = new Promise<void>((resolve) => {
    onOpening = resolve;
  });
  ready.catch(() => undefined); // a kill before ready is fine; callers that wait see the rejection
  proc.stdout.setEncoding("utf8").on("data", (chunk: string) => {
    pending += chunk;
    const lines = pending.split("\n");
    pending = lines.pop()!;
    for (const line of lines) {
      if (line === "opening") {
        openingAt = performance.now();
        onOpening();
      } else if (line.startsWith("ready ")) {
        sawReady = true;
        onReady(performance.now() - openingAt);
      } else if (line.startsWith("committed ")) committed.push(Number(line.slice("committed ".length)));
      else if (line.startsWith("warning ")) warnings.push(line);
    }
  });
  proc.stderr.setEncoding("utf8").on("data", (chunk: string) => {
    stderr += chunk;
  });
  const exited = new Promise<void>((resolve) => {
    proc.on("exit", (code, signal) => {
      if (signal !== "SIGKILL") onFail(new Error(`writer exited by itself (code ${code}, signal ${signal}):\n${stderr}`));
      else onFail(new Error("killed before ready"));
      resolve();
    });
  });
  return { opening, ready, exited, committed, warnings, wasReady: () => sawReady, kill: () => proc.kill("SIGKILL") };
}

async function openAll(
  dir: string,
): Promise<{ close(): Promise<void>; manifest: Awaited<ReturnType<LevelRecoveryStore["openManifest"]>>; ranks: RankPartStore[] }> {
  const store = new LevelRecoveryStore(dir);
  const manifest = await store.openManifest();
  const ranks: RankPartStore[] = [];
  for (let r = 0; r < RANKS; r++) ranks.push(await store.openRank(r));
  return {
    manifest,
    ranks,
    close: async () => {
      await manifest.close();
      for (const r of ranks) await r.close();
    },
  };
}

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "lifeline-crash-"));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe("store under kill -9", () => {
  it(`keeps every committed line through ${KILLS} kills of a writing process (SEED=${SEED})`, async () => {
    const random = prng(SEED);
    const reported = new Set<number>();
    let recoveryMs = 20; // open + recovery time, refined from the children's own
    let killedBeforeReady = 0;
    let killedInRecovery = 0;
    let killedWhileWriting = 0;
    for (let kill = 0; kill < KILLS; kill++) {
      const child = startWriter(dir, SEED * 1000 + kill);
      const duringStartup = kill > 0 && random() < 0.25;
      const context = `kill ${kill} (SEED=${SEED})`;
      const within = <T>(p: Promise<T>, what: string): Promise<T> =>
        Promise.race([p, new Promise<T>((_, reject) => setTimeout(() => reject(new Error(`${context}: writer not ${what} in 20 s`)), 20_000))]);
      if (duringStartup) {
        // Aim at opening and recovery (garbage collection, retracting, deleting leftovers).
        await within(child.opening, "opening");
        await new Promise((r) => setTimeout(r, random() * recoveryMs * 1.2));
        killedBeforeReady++;
      } else {
        recoveryMs = Math.max(5, await within(child.ready, "ready"));
        if (kill === 0) {
          // A live holder locks out a second process, and the message names what is locked.
          const other = new LevelRecoveryStore(dir);
          const err = await expectCode(other.openManifest(), "STORE_LOCKED");
          expect(err.message).toContain(join(dir, "manifest"));
          const err1 = await expectCode(other.openRank(1), "STORE_LOCKED");
          expect(err1.message).toContain(join(dir, "rank-1", "parts"));
        }
        await new Promise((r) => setTimeout(r, random() * 400));
        killedWhileWriting++;
      }
      child.kill();
      await child.exited;
      if (duringStartup && !child.wasReady()) killedInRecovery++;
      expect(child.warnings, context).toEqual([]);
      for (const e of child.committed) reported.add(e);

      const { manifest, ranks, close } = await openAll(dir);
      try {
        const lines = await manifest.list();
        const epochs = lines.map((l) => l.epoch);
        // Every committed line is whole: the newest is what recovery uses, the older ones
        // are what it would fall back to.
        for (const line of lines) {
          for (const ref of line.parts) expect(await ranks[ref.rank]!.checkPart(ref), `${context}, line ${line.epoch}`).toEqual({ kind: "ok", ref });
        }
        const choice = await latestLine(manifest, localVerifier(ranks));
        expect(choice.warnings, context).toEqual([]);
        if (reported.size > 0) {
          const newestReported = Math.max(...reported);
          expect(choice.line?.epoch ?? -1, `${context}: newest committed line lost`).toBeGreaterThanOrEqual(newestReported);
          for (const e of reported) {
            const newer = epochs.filter((x) => x > e).length;
            if (!epochs.includes(e)) expect(newer, `${context}: line ${e} lost without being pruned`).toBeGreaterThanOrEqual(KEEP);
          }
        }
        expect(lines.length, context).toBeLessThanOrEqual(KEEP + 1); // a kill between commit and prune leaves one extra
      } finally {
        await close();
      }
    }
    expect(killedBeforeReady).toBeGreaterThan(0);
    expect(reported.size, "the writer committed too few lines for the test to mean much").toBeGreaterThan(KILLS);

    // A last recovery collects every leftover of aborted, interrupted and pruned lines.
    const { manifest, ranks, close } = await openAll(dir);
    let blocked = 0;
    const named: string[][] = [];
    const blockFiles: string[][] = [];
    try {
      await recoverLocal(manifest, ranks);
      const committed = (await manifest.list()).map((l) => l.epoch);
      for (const r of ranks) {
        const parts = await r.listParts();
        expect(parts.map((p) => p.epoch)).toEqual(committed);
        const files = await readdir(join(dir, `rank-${r.rank}`, "blobs"));
        expect(files.filter((f) => f.endsWith(".part")).length, `rank ${r.rank}'s blob files`).toBe(parts.filter((p) => p.location === "blob").length);
        blocked += parts.filter((p) => p.location === "blocks").length;
        blockFiles[r.rank] = files.filter((f) => f.endsWith(".blk")).sort();
      }
    } finally {
      await close();
    }
    // No block file that no record names, and none missing (the records read with the store closed).
    for (let r = 0; r < RANKS; r++) named[r] = (await blockFilesNamed(dir, r)).sort();
    expect(blockFiles).toEqual(named);
    console.log(
      `crash test: ${KILLS} kills (${killedBeforeReady} aimed at start-up, ${killedInRecovery} of them before "ready"; ${killedWhileWriting} while writing), ${reported.size} commits reported, ${blocked} blocked parts kept`,
    );
  }, 120_000);
});
