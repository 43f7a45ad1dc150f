/**
 * The typed arrays and Buffers inside a decoded value (itself, or nested in objects and arrays),
 * for tests that check whose memory a value holds.
 *
 * @example
 * for (const a of arrayViewsIn(decoded)) expect(a.buffer).not.toBe(sent.buffer);
 */
export function arrayViewsIn(v: unknown): ArrayBufferView[] {
  if (ArrayBuffer.isView(v)) return [v];
  return typeof v === "object" && v !== null ? Object.values(v).flatMap(arrayViewsIn) : [];
}
