/**
 * Round summaries for hand-built agreement situations: a rank holding nothing, at `pos`.
 *
 * @example
 * const s = emptySummary(1, 4, { kind: "restore" }, { restoring: true });
 */
import type { Position, Summary } from "../../src/cpr/retry-one/types.ts";

export function emptySummary(rank: number, size: number, pos: Position, more: Partial<Summary> = {}): Summary {
  return {
    rank,
    pos,
    restoring: false,
    version: 0,
    knownSafe: new Array<number>(size).fill(0),
    safeIndex: new Array<number>(size).fill(0),
    bufFrom: 0,
    bufTo: 0,
    cacheKeys: [],
    holds: [],
    globals: [],
    logsKnown: [],
    wireSeq: 0,
    ...more,
  };
}
