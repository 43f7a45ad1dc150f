/**
 * Goal: the store's writes happen in the order that makes it crash-safe against power loss,
 * which kill -9 tests (crash.test.ts) cannot show, since the page cache survives a killed
 * process: a part's blob is durable before the record naming it is written; records are
 * deleted before their blobs; every commit-point write is one synced batch.
 *
 * Method: run the store logic (`KvRankPartStore`, `KvLineManifest`) over spy backends that
 * log each operation's start and end, and check the logs.
 */
import { describe, expect, it } from "vitest";
import type { BlobDir, KvDb, KvOp } from "../../src/store/backend.ts";
import { crc32 } from "../../src/store/checksum.ts";
import { KvLineManifest } from "../../src/store/manifest.ts";
import { KvRankPartStore } from "../../src/store/part-store.ts";
import { bytesOf } from "./suite.ts";

class Spy {
  readonly log: string[] = [];
  take(): string[] {
    return this.log.splice(0);
  }
}

class SpyKv implements KvDb {
  readonly location = "spy:kv";
  private readonly map = new Map<string, Buffer>();
  constructor(private readonly spy: Spy) {}
  async get(key: string): Promise<Buffer | undefined> {
    return this.map.get(key);
  }
  async write(ops: readonly KvOp[], opts: { sync: boolean }): Promise<void> {
    const desc = ops.map((o) => `${o.type} ${o.key.split("/")[0]}`).join(", ");
    this.spy.log.push(`kv.write start [${desc}] sync=${opts.sync}`);
    await new Promise((r) => setTimeout(r, 1));
    for (const o of ops) {
      if (o.type === "put") this.map.set(o.key, o.value);
      else this.map.delete(o.key);
    }
    this.spy.log.push("kv.write end");
  }
  async scan(prefix: string, opts: { reverse?: boolean; limit?: number }): Promise<[string, Buffer][]> {
    const keys = [...this.map.keys()].filter((k) => k.startsWith(prefix)).sort();
    if (opts.reverse === true) keys.reverse();
    return keys.slice(0, opts.limit === undefined || opts.limit < 0 ? undefined : opts.limit).map((k) => [k, this.map.get(k)!]);
  }
  async close(): Promise<void> {}
}

class SpyBlobs implements BlobDir {
  readonly location = "spy:blobs";
  private readonly files = new Map<string, Buffer>();
  constructor(private readonly spy: Spy) {}
  pathOf(name: string): string {
    return `${this.location}/${name}`;
  }
  async write(name: string, header: Buffer, payload: readonly Uint8Array[]): Promise<number> {
    this.spy.log.push("blob.write start");
    await new Promise((r) => setTimeout(r, 1));
    const sum = crc32(Buffer.concat(payload));
    this.files.set(name, Buffer.concat([header, ...payload]));
    this.spy.log.push("blob.write end (synced)");
    return sum;
  }
  async read(name: string, headerBytes: number): Promise<{ header: Buffer; payload: Buffer } | undefined> {
    const f = this.files.get(name);
    return f === undefined ? undefined : { header: f.subarray(0, headerBytes), payload: f.subarray(headerBytes) };
  }
  async remove(names: readonly string[]): Promise<void> {
    this.spy.log.push(`blob.remove ${names.length}`);
    for (const n of names) this.files.delete(n);
  }
  async list(): Promise<string[]> {
    return [...this.files.keys()];
  }
}

async function rankStore(spy: Spy): Promise<KvRankPartStore> {
  return KvRankPartStore.open({ rank: 0, kv: new SpyKv(spy), blobs: new SpyBlobs(spy), nowMs: () => 1, gc: false });
}

describe("store write order", () => {
  it("makes a blob durable before the record that names it, and deletes a replaced blob after", async () => {
    const spy = new Spy();
    const parts = await rankStore(spy);
    await parts.putPart(1, bytesOf(100_000, 1));
    expect(spy.take()).toEqual(["blob.write start", "blob.write end (synced)", "kv.write start [put part] sync=true", "kv.write end"]);
    await parts.putPart(1, bytesOf(100_000, 2));
    expect(spy.take()).toEqual(["blob.write start", "blob.write end (synced)", "kv.write start [put part] sync=true", "kv.write end", "blob.remove 1"]);
    await parts.putPart(2, bytesOf(100, 3));
    expect(spy.take()).toEqual(["kv.write start [put part] sync=true", "kv.write end"]);
  });

  it("deletes records (one synced batch) before their blobs", async () => {
    const spy = new Spy();
    const parts = await rankStore(spy);
    for (const e of [1, 2, 3]) await parts.putPart(e, bytesOf(100_000, e));
    spy.take();
    await parts.retain([3]);
    expect(spy.take()).toEqual(["kv.write start [del part, del part] sync=true", "kv.write end", "blob.remove 2"]);
  });

  it("writes each manifest change as one synced batch", async () => {
    const spy = new Spy();
    const manifest = new KvLineManifest({ kv: new SpyKv(spy), nowMs: () => 1 });
    const ref = (epoch: number) => ({ rank: 0, epoch, checksum: 0, bytes: 0 });
    await manifest.commitLine(1, [ref(1)]);
    await manifest.abortLine(2);
    await manifest.commitLine(3, [ref(3)]);
    await manifest.prune(1);
    expect(spy.take()).toEqual([
      "kv.write start [put line, del abort] sync=true",
      "kv.write end",
      "kv.write start [del line, put abort] sync=true",
      "kv.write end",
      "kv.write start [put line, del abort] sync=true",
      "kv.write end",
      "kv.write start [del line, del abort] sync=true",
      "kv.write end",
    ]);
  });
});
