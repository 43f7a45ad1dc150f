/**
 * Goal: a job's key files say what the ranks and the coordinator need and nothing more (a rank's
 * file holds its own token, not the token secret; the ranks' file no coordinator secret); they
 * are written 0600 and never overwritten; a rank refuses another rank's file; tokens are the
 * same on both sides and differ per incarnation; Z85 matches ZeroMQ's.
 *
 * Method: the real functions on files in a temporary directory; Z85 against RFC 32's example
 * and against keys ZeroMQ made.
 */
import { chmodSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { curveKeyPair } from "zeromq";
import {
  coordinatorKeyText,
  loadRankKeys,
  makeJobKeys,
  parseCoordinatorKeys,
  parseRankKeys,
  rankKeyText,
  ranksKeyText,
  readCoordinatorKeys,
  tokenOf,
  writeKeyDir,
  writeKeyFile,
  z85Encode,
} from "../../src/mpi/keys.ts";
import { isLifelineError } from "../../src/errors.ts";

const dir = mkdtempSync(join(tmpdir(), "lifeline-keys-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("job keys", () => {
  it("a rank's file gives it its own token and the CURVE keys; the token secret and the coordinator's secret stay out", () => {
    const keys = makeJobKeys({ curve: true });
    const text = rankKeyText(keys, 2, 1);
    expect(text).not.toContain(keys.tokens.toString("hex"));
    expect(text).not.toContain(keys.curve!.server.secretKey);
    const mine = parseRankKeys(text, 2, 1);
    expect(mine.token).toBe(tokenOf(keys.tokens, 2, 1));
    expect(mine.curve).toEqual({ server: keys.curve!.server.publicKey, member: { publicKey: keys.curve!.member, secretKey: keys.curve!.memberSecret } });
    expect(() => parseRankKeys(text, 2, 0)).toThrow(/is for rank 2 attempt 1, but this is rank 2 attempt 0/);
    expect(() => parseRankKeys(text, 1, 1)).toThrow(/is for rank 2 attempt 1, but this is rank 1 attempt 1/);
  });

  it("tokens differ per rank and attempt and per job; the ranks' shared file derives the same ones", () => {
    const keys = makeJobKeys({ curve: false });
    const tokens = new Set([0, 1, 2].flatMap((r) => [0, 1].map((a) => tokenOf(keys.tokens, r, a))));
    expect(tokens.size).toBe(6);
    for (const t of tokens) expect(t).toMatch(/^[0-9a-f]{32}$/);
    expect(tokenOf(makeJobKeys({ curve: false }).tokens, 0, 0)).not.toBe(tokenOf(keys.tokens, 0, 0));
    const shared = ranksKeyText(keys);
    expect(parseRankKeys(shared, 3, 2)).toEqual({ token: tokenOf(keys.tokens, 3, 2) });
    expect(shared).not.toContain("coordinatorSecret");
  });

  it("the coordinator's file has its secret and the member's public key, not the member's secret", () => {
    const keys = makeJobKeys({ curve: true });
    const text = coordinatorKeyText(keys);
    expect(text).not.toContain(keys.curve!.memberSecret);
    expect(parseCoordinatorKeys(text, "f")).toEqual({ tokens: keys.tokens, curve: { server: keys.curve!.server, member: keys.curve!.member } });
    expect(() => parseCoordinatorKeys(ranksKeyText(keys), "f")).toThrow(/a "ranks" key file; the coordinator takes the coordinator key file/);
    expect(() => parseRankKeys(text, 0, 0, "f")).toThrow(/a "coordinator" key file, not one for ranks/);
  });

  it("key files are 0600, never overwritten; a readable one is used with a warning; garbage is MPI_INIT", () => {
    const keys = makeJobKeys({ curve: true });
    const made = writeKeyDir(join(dir, "job"), keys);
    for (const f of [made.coordinator, made.ranks]) expect(statSync(f).mode & 0o777).toBe(0o600);
    expect(statSync(join(dir, "job")).mode & 0o777).toBe(0o700);
    expect(() => writeKeyDir(join(dir, "job"), makeJobKeys({ curve: true }))).toThrow(/exists: keys are never overwritten/);
    expect(readCoordinatorKeys(join(dir, "job")).keys.tokens).toEqual(keys.tokens);
    expect(readCoordinatorKeys(join(dir, "job")).warning).toBeUndefined();

    const file = join(dir, "r0.0.key");
    writeKeyFile(file, rankKeyText(keys, 0, 0));
    expect(() => writeKeyFile(file, "x")).toThrow(/EEXIST/);
    expect(loadRankKeys({ keys: file, rank: 0, attempt: 0 }).warning).toBeUndefined();
    chmodSync(file, 0o644);
    expect(loadRankKeys({ keys: file, rank: 0, attempt: 0 }).warning).toMatch(/can be read by other users \(mode 644\): chmod 600 it/);
    expect(loadRankKeys({ rank: 0, attempt: 0 })).toEqual({ keys: {} });

    const junk = join(dir, "junk.key");
    writeFileSync(junk, "not json", { mode: 0o600 });
    for (const path of [junk, join(dir, "missing.key")]) {
      let caught: unknown;
      try {
        loadRankKeys({ keys: path, rank: 0, attempt: 0 });
      } catch (err) {
        caught = err;
      }
      expect(isLifelineError(caught, "MPI_INIT"), String(caught)).toBe(true);
    }
    expect(readFileSync(made.ranks, "utf8")).toContain('"for":"ranks"');
  });

  it("Z85 is ZeroMQ's: RFC 32's example, and the public keys it makes", () => {
    expect(z85Encode(Buffer.from([0x86, 0x4f, 0xd2, 0x6f, 0xb5, 0x59, 0xf7, 0x5b]))).toBe("HelloWorld");
    const { publicKey } = curveKeyPair();
    expect(publicKey).toMatch(/^.{40}$/);
    // Decode by brute force over each 5-character group: the encoder must give it back.
    const alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
    const bytes = Buffer.alloc(32);
    for (let g = 0; g < 8; g++) {
      let v = 0;
      for (const c of publicKey.slice(5 * g, 5 * g + 5)) v = v * 85 + alphabet.indexOf(c);
      bytes.writeUInt32BE(v, 4 * g);
    }
    expect(z85Encode(bytes)).toBe(publicKey);
  });
});
