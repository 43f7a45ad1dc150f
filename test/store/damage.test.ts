/**
 * Goal: every kind of record the store keeps — a rank's part record (bytes inline, or naming a
 * blob file), a blob file's header and payload, a line's commit record, an abort marker, the
 * job record — truncated or with one bit flipped gives a clear STORE_CORRUPT error naming it or
 * a fallback to the previous line, never another exception, and never a restore of bytes that
 * are not the ones written.
 *
 * Method: a real LevelRecoveryStore with lines 1..3 of two ranks (rank 0's parts inline, rank
 * 1's in blob files), an aborted line 4 and a job record. (1) Each record's bytes as stored, read
 * through a raw LevelDB handle: every single-bit flip and every truncation through the record
 * decoder. (2) A seeded sample of the same damage done to the store on disk, then what a
 * restart does — the job record, the commit records, the choice of the line, the restore of
 * every part of it — and what `lifeline lines` does.
 */
import { cp, open, readdir, readFile, rm, stat, truncate } from "node:fs/promises";
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Level } from "level";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LifelineError } from "../../src/errors.ts";
import { LevelRecoveryStore } from "../../src/store/level-store.ts";
import { listLines } from "../../src/store/lines.ts";
import { BLOB_HEADER_BYTES, decodeRecord, parseBlobHeader } from "../../src/store/records.ts";
import { latestLine, localVerifier } from "../../src/store/recovery.ts";
import type { JobRecord } from "../../src/store/types.ts";
import { Prng, seedFromEnv } from "../../src/testing/prng.ts";
import { bytesOf } from "./suite.ts";

const SEED = seedFromEnv() ?? 0xda11a9e;
const SIZES = [100, 100_000]; // rank 0: inline; rank 1: a blob file
const seedOf = (rank: number, epoch: number): number => 10 * epoch + rank;
const JOB: JobRecord = {
  id: "heat-1a2b3c4d",
  app: "/app/heat.ts",
  args: ["--iters", "10"],
  size: 2,
  mode: "cpr",
  programSha256: "0".repeat(64),
  createdMs: 1_700_000_000_000,
  run: 1,
  runStartedMs: 1_700_000_000_000,
  launcher: { pid: 4242, host: "node1" },
  state: "running",
};

let root: string;
let pristine: string;
let n = 0;

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "lifeline-damage-"));
  pristine = join(root, "pristine");
  const store = new LevelRecoveryStore(pristine);
  const m = await store.openManifest();
  const ranks = [await store.openRank(0), await store.openRank(1)];
  for (const e of [1, 2, 3]) await m.commitLine(e, await Promise.all(ranks.map((r) => r.putPart(e, bytesOf(SIZES[r.rank]!, seedOf(r.rank, e))))));
  await m.abortLine(4);
  await m.putJob(JOB);
  await m.close();
  for (const r of ranks) await r.close();
});
afterAll(() => rm(root, { recursive: true, force: true }));

/** The raw records under `db` (a LevelDB directory of the store). */
async function rawRecords(db: string): Promise<Map<string, Buffer>> {
  const level = new Level<string, Buffer>(db, { keyEncoding: "utf8", valueEncoding: "buffer", createIfMissing: false });
  await level.open();
  try {
    return new Map(await level.iterator().all());
  } finally {
    await level.close();
  }
}

async function putRaw(db: string, key: string, value: Buffer): Promise<void> {
  const level = new Level<string, Buffer>(db, { keyEncoding: "utf8", valueEncoding: "buffer", createIfMissing: false });
  await level.open();
  try {
    await level.put(key, value, { sync: true });
  } finally {
    await level.close();
  }
}

const flipBit = (b: Buffer, bit: number): Buffer => {
  const c = Buffer.from(b);
  c[bit >> 3]! ^= 1 << (bit & 7);
  return c;
};

describe("store records, bit by bit", () => {
  it("every single-bit flip and every truncation of every record is STORE_CORRUPT from the decoder", async () => {
    const records = [
      ...(await rawRecords(join(pristine, "manifest"))),
      ...(await rawRecords(join(pristine, "rank-0", "parts"))),
      ...(await rawRecords(join(pristine, "rank-1", "parts"))),
    ];
    expect(records.map(([k]) => k.replace(/\/0+/, "/")).sort()).toEqual([
      "abort/4",
      "job",
      "line/1",
      "line/2",
      "line/3",
      "part/1",
      "part/1",
      "part/2",
      "part/2",
      "part/3",
      "part/3",
    ]);
    let damaged = 0;
    for (const [key, value] of records) {
      expect(() => decodeRecord(value, key)).not.toThrow();
      const bad = [
        ...Array.from({ length: value.length * 8 }, (_, bit) => flipBit(value, bit)),
        ...Array.from({ length: value.length }, (_, k) => value.subarray(0, k)),
      ];
      for (const b of bad) {
        let caught: unknown;
        try {
          decodeRecord(b, key);
        } catch (err) {
          caught = err;
        }
        if (!(caught instanceof LifelineError) || caught.code !== "STORE_CORRUPT") expect.fail(`${key}: damage not caught: ${String(caught)}`);
        expect(caught.message).toContain(key);
        damaged++;
      }
    }
    expect(damaged).toBeGreaterThan(10_000);
  });

  it("every single-bit flip and every truncation of a blob file's header is refused by its parser", async () => {
    const blobs = join(pristine, "rank-1", "blobs");
    for (const name of await readdir(blobs)) {
      const header = (await readFile(join(blobs, name))).subarray(0, BLOB_HEADER_BYTES);
      expect(typeof parseBlobHeader(header)).toBe("object");
      for (let bit = 0; bit < BLOB_HEADER_BYTES * 8; bit++) expect(typeof parseBlobHeader(flipBit(header, bit)), `${name} bit ${bit}`).toBe("string");
      for (let k = 0; k < BLOB_HEADER_BYTES; k++) expect(typeof parseBlobHeader(header.subarray(0, k))).toBe("string");
    }
  });
});

/** One kind of damage done to the store on disk. */
interface Damage {
  readonly what: string;
  apply(dir: string): Promise<void>;
}

async function blobOf(dir: string, epoch: number): Promise<string> {
  const blobs = join(dir, "rank-1", "blobs");
  const name = (await readdir(blobs)).find((f) => f.startsWith(epoch.toString(16).padStart(16, "0")))!;
  return join(blobs, name);
}

async function flipFileBit(path: string, bit: number): Promise<void> {
  const fh = await open(path, "r+");
  try {
    const b = Buffer.alloc(1);
    await fh.read(b, 0, 1, bit >> 3);
    b[0]! ^= 1 << (bit & 7);
    await fh.write(b, 0, 1, bit >> 3);
  } finally {
    await fh.close();
  }
}

/** A seeded sample of damage to each kind of record: bits flipped, tails cut off. */
async function damages(p: Prng): Promise<Damage[]> {
  const out: Damage[] = [];
  const dbs: [string, string][] = [
    [join("manifest"), "manifest"],
    [join("rank-0", "parts"), "rank 0's parts"],
    [join("rank-1", "parts"), "rank 1's parts"],
  ];
  for (const [db, name] of dbs) {
    for (const [key, value] of await rawRecords(join(pristine, db))) {
      for (let i = 0; i < 3; i++) {
        const bit = p.index(value.length * 8);
        out.push({ what: `${name} ${key} bit ${bit}`, apply: (dir) => putRaw(join(dir, db), key, flipBit(value, bit)) });
      }
      const cut = p.index(value.length);
      out.push({ what: `${name} ${key} cut to ${cut} bytes`, apply: (dir) => putRaw(join(dir, db), key, value.subarray(0, cut)) });
    }
  }
  for (const epoch of [2, 3]) {
    const size = (await stat(await blobOf(pristine, epoch))).size;
    for (let i = 0; i < 3; i++) {
      const bit = i === 0 ? p.index(BLOB_HEADER_BYTES * 8) : BLOB_HEADER_BYTES * 8 + p.index((size - BLOB_HEADER_BYTES) * 8);
      out.push({ what: `blob of line ${epoch} bit ${bit}`, apply: async (dir) => flipFileBit(await blobOf(dir, epoch), bit) });
    }
    for (const cut of [0, p.index(BLOB_HEADER_BYTES), BLOB_HEADER_BYTES + p.index(size - BLOB_HEADER_BYTES)]) {
      out.push({ what: `blob of line ${epoch} cut to ${cut} bytes`, apply: async (dir) => truncate(await blobOf(dir, epoch), cut) });
    }
  }
  return out;
}

/** What a restart makes of the store: the job record, the line chosen, every part of it restored. */
async function restart(dir: string): Promise<{ job: JobRecord | undefined; line: number | undefined; warnings: readonly string[]; aborted: number[] }> {
  const store = new LevelRecoveryStore(dir);
  const m = await store.openManifest();
  const ranks = [await store.openRank(0), await store.openRank(1)];
  try {
    const job = await m.job();
    const aborted = await m.aborted();
    const choice = await latestLine(m, localVerifier(ranks));
    for (const ref of choice.line?.parts ?? []) {
      const bytes = await ranks[ref.rank]!.readPart(ref);
      // Never a wrong restore: exactly what that rank wrote for that line.
      if (!bytes.equals(bytesOf(SIZES[ref.rank]!, seedOf(ref.rank, ref.epoch)))) expect.fail(`rank ${ref.rank} restored wrong bytes for line ${ref.epoch}`);
    }
    return { job, line: choice.line?.epoch, warnings: choice.warnings, aborted };
  } finally {
    await m.close();
    for (const r of ranks) await r.close();
  }
}

describe("a damaged store, restarted", () => {
  it("each damage is a STORE_CORRUPT naming the record, or a fallback to line 2 with a warning naming line 3; never a crash or wrong bytes", async () => {
    const clean = join(root, "clean");
    await cp(pristine, clean, { recursive: true });
    expect(await restart(clean)).toEqual({ job: JOB, line: 3, warnings: [], aborted: [4] });

    const outcomes = new Map<string, number>();
    for (const d of await damages(new Prng(SEED))) {
      const dir = join(root, `d${n++}`);
      await cp(pristine, dir, { recursive: true });
      await d.apply(dir);
      let outcome: string;
      try {
        const r = await restart(dir);
        // Damage to line 3 or its parts falls back to line 2; damage to older records is not
        // on the way of a restore from line 3 (and is caught when they are needed).
        if (r.line === 2) {
          expect(r.warnings, d.what).toEqual([expect.stringMatching(/^recovery line 3 is unusable, falling back to line 2: /)]);
          outcome = "fallback to line 2";
        } else {
          expect(r.line, d.what).toBe(3);
          expect(d.what, "damage to line 3 went unnoticed").not.toMatch(/line\/0+3|part\/0+3|line 3/);
          outcome = "line 3, damage elsewhere";
        }
        expect(r.job, d.what).toEqual(JOB);
      } catch (err) {
        if (!(err instanceof LifelineError) || err.code !== "STORE_CORRUPT") throw new Error(`${d.what}: ${String(err)}`, { cause: err });
        expect(err.message, d.what).toMatch(/commit record of line \d|abort marker|job record|damaged/);
        outcome = "STORE_CORRUPT";
      }
      // `lifeline lines` on the same damage: a listing or STORE_CORRUPT, nothing else.
      await listLines(dir).catch((err: unknown) => {
        if (!(err instanceof LifelineError) || err.code !== "STORE_CORRUPT") throw new Error(`lifeline lines, ${d.what}: ${String(err)}`, { cause: err });
      });
      outcomes.set(outcome, (outcomes.get(outcome) ?? 0) + 1);
      await rm(dir, { recursive: true, force: true });
    }
    // Every kind of outcome happened: the sample reaches the manifest, the parts and the blobs.
    expect([...outcomes.keys()].sort()).toEqual(["STORE_CORRUPT", "fallback to line 2", "line 3, damage elsewhere"]);
  }, 60_000);
});
