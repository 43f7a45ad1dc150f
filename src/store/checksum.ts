/**
 * The store's checksum: CRC-32 (IEEE 802.3, the zlib/PNG polynomial).
 *
 * Why CRC-32 and not SHA-256: the store guards against accidental damage (torn or bit-rotten
 * files, truncation, a part file from another line), not against an adversary who can write the
 * store directory. SHA-256 costs two to three times as much as `zlib.crc32` over a 64 MiB part
 * (`node --import tsx bench/store-bench.ts` prints both next to the synced write they add to),
 * which would alone eat most of the part write's 1.25x budget.
 *
 * `zlib.crc32` exists from Node 20.15 / 22.2. On older 20.x releases the same function is
 * computed by a table-driven fallback, so stores stay readable across Node versions (only slower).
 *
 * @example
 * const sum = crc32(Buffer.from("123456789")); // 0xcbf43926
 * formatChecksum(sum);                          // "cbf43926"
 */
import * as zlib from "node:zlib";

type Crc32 = (data: Uint8Array, value?: number) => number;

const native: Crc32 | undefined = (zlib as { crc32?: Crc32 }).crc32;

let table: Uint32Array | undefined;

function crc32Fallback(data: Uint8Array, value = 0): number {
  if (table === undefined) {
    table = new Uint32Array(256);
    for (let n = 0; n < 256; n++) {
      let c = n;
      for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
      table[n] = c >>> 0;
    }
  }
  let crc = ~value >>> 0;
  for (let i = 0; i < data.length; i++) crc = table[(crc ^ data[i]!) & 0xff]! ^ (crc >>> 8);
  return ~crc >>> 0;
}

/**
 * CRC-32 of `data` (unsigned 32-bit), optionally continuing from a previous value.
 * Never throws.
 *
 * @example
 * const whole = crc32(Buffer.from("abcdef"));
 * whole === crc32(Buffer.from("def"), crc32(Buffer.from("abc"))); // true
 */
export function crc32(data: Uint8Array, value = 0): number {
  return native !== undefined ? native(data, value) : crc32Fallback(data, value);
}

/**
 * Default for {@link sliced}: the work done in one turn of the event loop before it yields.
 * Each turn costs more than its own work when a program computes between its calls (it holds
 * the loop, so a yield may wait for its next call, tens of ms), so turns are few and long:
 * a CRC-32 of 64 MiB (about 10 ms here) takes one or two, a SHA-256 of it (about 40 ms) four.
 */
export const SLICE_TURN_MS = 8;

/**
 * Feeds `data` to `update` in slices of at most `sliceBytes`, yielding to the event loop once
 * `turnMs` of work went by since the last yield (never before the first slice), so a long
 * checksum neither blocks the loop for long nor takes a turn per slice.
 *
 * @example
 * const hash = createHash("sha256");
 * await sliced([part], (s) => hash.update(s));
 */
export async function sliced(
  data: Uint8Array | readonly Uint8Array[],
  update: (slice: Uint8Array) => void,
  opts: { sliceBytes?: number; turnMs?: number } = {},
): Promise<void> {
  const sliceBytes = opts.sliceBytes ?? 4 << 20;
  const turnMs = opts.turnMs ?? SLICE_TURN_MS;
  let turnStart = performance.now();
  for (const chunk of data instanceof Uint8Array ? [data] : data) {
    for (let off = 0; off < chunk.byteLength; off += sliceBytes) {
      if (performance.now() - turnStart >= turnMs) {
        await new Promise<void>((resolve) => setImmediate(resolve));
        turnStart = performance.now();
      }
      update(chunk.subarray(off, Math.min(off + sliceBytes, chunk.byteLength)));
    }
  }
}

/**
 * CRC-32 of `data` computed in slices (see {@link sliced}). Used while the same bytes are
 * being written (and synced) by the thread pool, whose completion is handled between turns.
 * Never rejects.
 *
 * @example
 * const [sum] = await Promise.all([crc32Yielding(bytes), writeAndSync(bytes)]);
 * sum === crc32(bytes); // true
 */
export async function crc32Yielding(data: Uint8Array | readonly Uint8Array[], opts: { sliceBytes?: number; turnMs?: number } = {}): Promise<number> {
  let sum = 0;
  await sliced(data, (slice) => (sum = crc32(slice, sum)), opts);
  return sum;
}

/**
 * The portable implementation (used when `zlib.crc32` is missing); exported so tests can
 * check it agrees with `zlib.crc32`. Never throws.
 *
 * @example
 * crc32Portable(Buffer.from("123456789")); // 0xcbf43926
 * crc32Portable(buf) === crc32(buf);        // true
 */
export const crc32Portable: Crc32 = crc32Fallback;

/**
 * A checksum as people read it in messages and in `lifeline lines`: 8 lowercase hex digits.
 *
 * @example
 * formatChecksum(0xcbf43926); // "cbf43926"
 * formatChecksum(1);          // "00000001"
 */
export function formatChecksum(sum: number): string {
  return (sum >>> 0).toString(16).padStart(8, "0");
}
