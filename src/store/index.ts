/**
 * The recovery-line store: rank-side part stores, the coordinator's line manifest, recovery
 * line choice, and the `lifeline lines` listing. See `types.ts` for the model and
 * `level-store.ts` for the on-disk layout.
 *
 * @example
 * import { LevelRecoveryStore, latestLine, localVerifier } from "./store/index.ts";
 * const choice = await latestLine(await store.openManifest(), localVerifier(parts));
 */
export type { JobRecord, LineJob, LineManifest, LineRecord, PartCheck, PartInfo, PartRef, RankPartStore, RecoveryStore, StoreFaults } from "./types.ts";
export { INLINE_BYTES_MAX, KEEP_LINES_DEFAULT, META_BYTES_MAX } from "./types.ts";
export { LevelRecoveryStore, STORE_MARKER, type LevelRecoveryStoreOptions } from "./level-store.ts";
export { MemoryRecoveryStore, type MemoryRecoveryStoreOptions } from "./memory-store.ts";
export { latestLine, localVerifier, pruneLines, recoverLocal, type PartVerifier, type RecoveryChoice } from "./recovery.ts";
export { formatLines, listLines, listLinesIn, type LineRow, type LinesReport } from "./lines.ts";
export { crc32, formatChecksum } from "./checksum.ts";
