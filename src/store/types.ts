/**
 * The recovery-line store: interfaces shared by the LevelDB/file store and the in-memory store.
 *
 * A *recovery line* is an epoch number, one *part* per rank (opaque bytes produced by the
 * protocol layer: snapshot, channel logs, counters; possibly 64 MiB and more) and a little
 * metadata. It is split along the process boundary of a job, because LevelDB admits one
 * process per database and ranks may later live on other hosts:
 *
 * - each rank process owns a {@link RankPartStore} and writes only its own parts;
 * - the coordinator process owns the {@link LineManifest} and is the only writer of commit
 *   records. A line is committed by one synced write of its commit record, which is issued
 *   only after every rank reported its part durable ({@link RankPartStore.putPart} resolved).
 *   No commit record, no line: an uncommitted line is never used.
 *
 * A {@link RecoveryStore} is the handle on one store location that opens both kinds.
 *
 * @example
 * const part = await (await store.openRank(0)).putPart(7, bytes); // in rank 0's process
 * await (await store.openManifest()).commitLine(7, [part, ...otherRanksParts]); // coordinator
 */

/**
 * What the manifest keeps about one rank's part of a line, and what a rank reports after
 * writing it. `checksum` is the CRC-32 of the part's bytes (see `checksum.ts`).
 *
 * @example
 * const ref: PartRef = { rank: 1, epoch: 7, checksum: 0xcbf43926, bytes: 9 };
 * await parts.readPart(ref); // the bytes, verified against `ref`
 */
export interface PartRef {
  readonly rank: number;
  readonly epoch: number;
  readonly checksum: number;
  readonly bytes: number;
}

/**
 * A part as its rank store lists it. `location` tells whether the bytes sit inside the rank's
 * LevelDB (`inline`, small parts), in a blob file next to it (`blob`, large parts), or in
 * block files that parts with equal bytes share (`blocks`, parts of {@link BLOCKED_BYTES_MIN}
 * or more).
 *
 * @example
 * for (const p of await parts.listParts()) console.log(p.epoch, p.bytes, p.location);
 * // 7 67108864 blob
 */
export interface PartInfo extends PartRef {
  readonly timeMs: number;
  readonly location: "inline" | "blob" | "blocks";
}

/**
 * A committed recovery line: one part per rank `0..parts.length-1`, sorted by rank.
 * `meta` is small opaque bytes the caller chose to keep with the commit record.
 *
 * @example
 * const line = await manifest.latestCommitted();
 * if (line !== undefined) console.log(`line ${line.epoch} of ${line.parts.length} ranks`);
 */
export interface LineRecord {
  readonly epoch: number;
  readonly timeMs: number;
  readonly parts: readonly PartRef[];
  readonly meta: Buffer | undefined;
  /** The job and the run of it that committed the line (absent in lines of older stores). */
  readonly job: LineJob | undefined;
}

/**
 * Which job, and which run of it (1 = its first start, 2 = its first resume, ...), a line
 * belongs to; kept in the line's commit record.
 *
 * @example
 * const job: LineJob = { id: "heat-3f9a1c2e", run: 2 };
 * await manifest.commitLine(7, refs, { job });
 */
export interface LineJob {
  readonly id: string;
  readonly run: number;
}

/**
 * What a store says about the job whose lines it holds, written by the launcher that holds
 * the manifest: at the start of every run (`state: "running"`) and at its end. A store holds
 * the lines of one job at a time; a new job may take the store over only when it holds no
 * line, or when the user says so (`lifeline run --fresh`).
 *
 * `app`, `args` and `size` are the job's identity: a run with the same three continues the
 * job from its newest line. `programSha256` is the app file's hash when the run started,
 * for a warning when it changed between runs.
 *
 * @example
 * const job = await manifest.job();
 * if (job?.state === "running") console.log(`run ${job.run} of ${job.id} by pid ${job.launcher.pid}`);
 */
export interface JobRecord {
  readonly id: string;
  readonly app: string;
  readonly args: readonly string[];
  readonly size: number;
  readonly mode: string;
  readonly programSha256: string;
  /** When run 1 started (ms since the epoch). */
  readonly createdMs: number;
  /** 1 for the first start, +1 per resume or restart from the beginning of the same job. */
  readonly run: number;
  readonly runStartedMs: number;
  /** The launcher process of this run. */
  readonly launcher: { readonly pid: number; readonly host: string };
  /**
   * `running` until the run ends (and forever when its launcher was killed); then `finished`
   * (every rank finalized), `failed` or `stopped` (interrupted by a signal).
   */
  readonly state: "running" | "finished" | "failed" | "stopped";
  /** When the run ended, and the launcher's exit code; absent while running. */
  readonly endedMs?: number | undefined;
  readonly exitCode?: number | undefined;
}

/**
 * The outcome of verifying one part against its {@link PartRef}: never thrown, so that
 * recovery can weigh every part of a line before it chooses. `message` says which line, rank
 * and file, and what is wrong.
 *
 * @example
 * const check = await parts.checkPart(ref);
 * if (check.kind !== "ok") console.warn(check.message);
 */
export type PartCheck =
  | { readonly kind: "ok"; readonly ref: PartRef }
  | { readonly kind: "missing"; readonly ref: PartRef; readonly message: string }
  | { readonly kind: "corrupt"; readonly ref: PartRef; readonly message: string };

/**
 * One rank's side of the store: the parts this rank wrote, one per epoch, each carrying its
 * checksum. Held by exactly one process at a time (the rank's own); a second opener gets
 * `STORE_LOCKED`. Writes from one handle are applied in call order.
 *
 * Every method rejects with `STORE_NOT_OPEN` after {@link close}; with `STORE_IO` (the OS
 * error as `cause`) when the disk fails; bad arguments (an epoch that is not a non-negative
 * safe integer) throw `RangeError`.
 *
 * @example
 * const parts = await store.openRank(world.rank);
 * const ref = await parts.putPart(epoch, encodeValue(snapshot)); // durable once resolved
 */
export interface RankPartStore {
  readonly rank: number;
  /** Where the rank's data lives, for messages: a directory, or `memory:<name>/rank-<r>`. */
  readonly location: string;

  /**
   * Stores this rank's part of line `epoch` durably (synced), replacing an earlier part of the
   * same epoch (from an aborted attempt) atomically. Resolves to the reference the coordinator
   * puts into the commit record. `bytes` — one buffer, or chunks that together make the part
   * (written as they are, never joined into a copy) — must not change until the promise
   * settles. With `signal` aborted, the put stops before its next sync and rejects, leaving no
   * part. With `blocks`, a part of {@link BLOCKED_BYTES_MIN} or more is stored as blocks that
   * parts with equal bytes share; without, in a blob file of its own. Rejects with
   * `STORE_NOT_OPEN`, `STORE_IO`.
   *
   * @example
   * const ref = await parts.putPart(3, Buffer.from("state"));
   * ref.bytes; // 5
   * await parts.putPart(4, [head, model]); // the same as putPart(4, Buffer.concat([head, model]))
   */
  putPart(epoch: number, bytes: Uint8Array | readonly Uint8Array[], signal?: AbortSignal, blocks?: BlockOptions): Promise<PartRef>;

  /**
   * The bytes of this rank's part of `epoch`, verified against the part's own checksum, or
   * `undefined` if there is no such part. Rejects with `STORE_CORRUPT` (damaged record, or
   * blob file missing, truncated or failing its checksum), `STORE_NOT_OPEN`, `STORE_IO`.
   *
   * @example
   * const bytes = await parts.getPart(3);
   * if (bytes === undefined) console.log("no part for line 3");
   */
  getPart(epoch: number): Promise<Buffer | undefined>;

  /**
   * The bytes of the part `ref` names, verified against `ref` (from the manifest) as well as
   * the part's own checksum: this is what a restarting rank calls. Rejects with
   * `STORE_CORRUPT` when the part is missing or does not match (the message names the line,
   * rank and file, and says to fall back to an older line), `STORE_NOT_OPEN`, `STORE_IO`.
   *
   * @example
   * const line = await manifest.latestCommitted();
   * const bytes = await parts.readPart(line!.parts[parts.rank]!);
   */
  readPart(ref: PartRef): Promise<Buffer>;

  /**
   * Like {@link readPart} but reports the result instead of throwing it and drops the bytes:
   * `missing` / `corrupt` / `ok`. Rejects only with `STORE_NOT_OPEN` or `STORE_IO`.
   *
   * @example
   * const check = await parts.checkPart(ref);
   * if (check.kind === "ok") console.log(`line ${ref.epoch} verified on rank ${ref.rank}`);
   */
  checkPart(ref: PartRef): Promise<PartCheck>;

  /**
   * Every part this rank holds, by ascending epoch. Does not read part bytes.
   * Rejects with `STORE_CORRUPT` (a malformed part record), `STORE_NOT_OPEN`, `STORE_IO`.
   *
   * @example
   * const epochs = (await parts.listParts()).map((p) => p.epoch);
   * console.log(epochs); // [5, 6, 7]
   */
  listParts(): Promise<PartInfo[]>;

  /**
   * Deletes the parts of every epoch not in `keep` that is older than the newest epoch in
   * `keep` — the leftovers of pruned and aborted lines — and, with `dropNewer`, also those
   * newer than it (what a rank does when the job restarts from the newest line in `keep`,
   * since no line can be in progress then). Parts newer than all of `keep` are otherwise kept:
   * they may belong to a line being written right now. With `keep` empty and no `dropNewer`,
   * nothing is deleted. Resolves to the deleted epochs.
   * Rejects with `STORE_CORRUPT`, `STORE_NOT_OPEN`, `STORE_IO`.
   *
   * @example
   * await parts.retain([6, 7]);                      // drops 5 and aborted 4; keeps in-progress 8
   * await parts.retain([6, 7], { dropNewer: true }); // on restart: drops 8 too
   */
  retain(keep: readonly number[], opts?: { dropNewer?: boolean }): Promise<number[]>;

  /**
   * Deletes this rank's parts of the given epochs, if it has them (records first, then their
   * blob files): what a rank does with its part of a line that was aborted, so the line
   * leaves nothing behind. Resolves to the epochs that had a part.
   * Rejects with `STORE_NOT_OPEN`, `STORE_IO`.
   *
   * @example
   * await parts.dropParts([8]); // line 8 was aborted: its part goes
   */
  dropParts(epochs: readonly number[]): Promise<number[]>;

  /**
   * Waits for queued writes, then releases the rank's lock. Idempotent.
   *
   * @example
   * await parts.close();
   * await parts.listParts(); // rejects with STORE_NOT_OPEN
   */
  close(): Promise<void>;
}

/**
 * The coordinator's side of the store: commit records of recovery lines. Held by one
 * process (the coordinator); a second opener gets `STORE_LOCKED`.
 *
 * Every method rejects with `STORE_NOT_OPEN` after {@link close}, with `STORE_IO` on disk
 * failures, and reading methods with `STORE_CORRUPT` when a record fails its checksum or is
 * malformed (the message names the line and the manifest path).
 *
 * @example
 * const manifest = await store.openManifest();
 * const record = await manifest.commitLine(7, refsFromAllRanks);
 */
export interface LineManifest {
  /** Where the manifest lives, for messages. */
  readonly location: string;

  /**
   * Commits line `epoch` with one part per rank, in one synced write: after it resolves the
   * line survives any crash; if it does not, the line does not exist. Call it only after
   * every rank's {@link RankPartStore.putPart} resolved. `parts` must name ranks
   * `0..n-1` once each, all with this epoch (with `opts.mixed`, each part may be of its own
   * epoch: a line of independent checkpoints, as retry-one's durable floor commits), and
   * `epoch` must be newer than every committed line (`RangeError` otherwise); `opts.meta` is
   * at most {@link META_BYTES_MAX} bytes; `opts.job` records which job and run committed the
   * line.
   * Clears an abort marker of the same epoch. Rejects with `STORE_NOT_OPEN`, `STORE_IO`,
   * `STORE_CORRUPT` (the newest existing record is damaged).
   *
   * @example
   * const line = await manifest.commitLine(7, refs, { meta: encodeValue({ job: "heat" }) });
   * line.parts.length; // the job size
   */
  commitLine(epoch: number, parts: readonly PartRef[], opts?: { meta?: Uint8Array; job?: LineJob; mixed?: boolean }): Promise<LineRecord>;

  /**
   * Marks line `epoch` aborted, so that its parts may be deleted. If `epoch` had been
   * committed, its commit record is removed in the same write: a coordinator does this for
   * the lines {@link latestLine} skipped as unusable, before the job resumes from an older
   * line and reuses their epoch numbers. Rejects with `STORE_NOT_OPEN`, `STORE_IO`.
   *
   * @example
   * await manifest.abortLine(8); // a phase timed out: line 8 will never be committed
   * (await manifest.aborted()).includes(8); // true
   */
  abortLine(epoch: number): Promise<void>;

  /**
   * The newest committed line, or `undefined` if there is none. Does not read any part.
   * Rejects with `STORE_CORRUPT`, `STORE_NOT_OPEN`, `STORE_IO`.
   *
   * @example
   * const line = await manifest.latestCommitted();
   * console.log(line?.epoch ?? "no line yet");
   */
  latestCommitted(): Promise<LineRecord | undefined>;

  /**
   * Every committed line, by ascending epoch. Rejects with `STORE_CORRUPT`,
   * `STORE_NOT_OPEN`, `STORE_IO`.
   *
   * @example
   * const epochs = (await manifest.list()).map((l) => l.epoch);
   * console.log(epochs); // [6, 7]
   */
  list(): Promise<LineRecord[]>;

  /**
   * Epochs marked by {@link abortLine} and not yet pruned, ascending. Rejects with
   * `STORE_CORRUPT`, `STORE_NOT_OPEN`, `STORE_IO`.
   *
   * @example
   * await manifest.abortLine(8);
   * await manifest.aborted(); // [8]
   */
  aborted(): Promise<number[]>;

  /**
   * Deletes the commit records of all but the newest `keep` committed lines, and abort
   * markers older than the oldest line kept, in one synced write; resolves to the epochs of
   * the deleted lines. `keep` is an integer >= 1 (`RangeError` otherwise), so the newest
   * committed line is never deleted. Delete the pruned lines' parts afterwards (never
   * before), with {@link RankPartStore.retain}. Rejects with `STORE_NOT_OPEN`, `STORE_IO`.
   *
   * @example
   * await manifest.prune(2);   // keeps the two newest lines
   * await parts.retain((await manifest.list()).map((l) => l.epoch));
   */
  prune(keep: number): Promise<number[]>;

  /**
   * The job record (see {@link JobRecord}), or `undefined` in a store no launcher has
   * claimed yet. Rejects with `STORE_CORRUPT` (naming the manifest), `STORE_NOT_OPEN`,
   * `STORE_IO`.
   *
   * @example
   * const job = await manifest.job();
   * console.log(job === undefined ? "no job yet" : `${job.id}, run ${job.run}, ${job.state}`);
   */
  job(): Promise<JobRecord | undefined>;

  /**
   * Replaces the job record, in one synced write. Rejects with `STORE_NOT_OPEN`, `STORE_IO`;
   * malformed fields throw `TypeError`.
   *
   * @example
   * await manifest.putJob({ ...job, state: "finished", endedMs: Date.now(), exitCode: 0 });
   */
  putJob(job: JobRecord): Promise<void>;

  /**
   * Releases the manifest's lock. Idempotent.
   *
   * @example
   * await manifest.close();
   * await manifest.list(); // rejects with STORE_NOT_OPEN
   */
  close(): Promise<void>;
}

/**
 * A store location: opens the coordinator's manifest and the ranks' part stores.
 * Implementations: `LevelRecoveryStore` (a directory) and `MemoryRecoveryStore` (the
 * simulator's), which behave alike, errors included.
 *
 * @example
 * const store = new LevelRecoveryStore(".lifeline");
 * const parts = await store.openRank(2); // STORE_LOCKED if another process holds rank 2
 */
export interface RecoveryStore {
  /** The store's location, for messages. */
  readonly location: string;

  /**
   * Opens the manifest, creating an empty store if there is none. Rejects with
   * `STORE_LOCKED` (another process or handle holds it; the message names the path),
   * `STORE_CORRUPT` (the manifest database is damaged), `STORE_NOT_FOUND` (the location
   * exists but is not a Lifeline store), `STORE_IO`.
   *
   * @example
   * const manifest = await store.openManifest();
   * await manifest.close();
   */
  openManifest(): Promise<LineManifest>;

  /**
   * Opens rank `rank`'s part store, creating it if needed, and deletes blob files that no
   * part record references (left by a crash between writing a blob and recording it).
   * Rejects like {@link openManifest}.
   *
   * @example
   * const parts = await store.openRank(0);
   * await parts.close();
   */
  openRank(rank: number): Promise<RankPartStore>;

  /**
   * The ranks that have a part store at this location, ascending (for listing and garbage
   * collection). Rejects with `STORE_NOT_FOUND`, `STORE_IO`.
   *
   * @example
   * await store.ranks(); // [0, 1, 2, 3]
   */
  ranks(): Promise<number[]>;
}

/**
 * Damage a test (or the simulator) can do to a store, to check that recovery copes. Both
 * stores implement it with the same effects. Damage closed stores (the LevelDB one edits
 * records through LevelDB, which admits one opener), except {@link breakBlobs}, which breaks
 * the disk under an open rank store.
 *
 * @example
 * await faults.corruptPart(1, 7); // flip a byte of rank 1's part of line 7
 * (await latestLine(manifest, verifier)).warnings; // ["recovery line 7 is unusable ..."]
 */
export interface StoreFaults {
  /** Flips one byte of the part's payload (blob file, middle block file, or inline record). */
  corruptPart(rank: number, epoch: number): Promise<void>;
  /** Removes the part's bytes: its blob file, its middle block file, or its record if the part is inline. */
  removePart(rank: number, epoch: number): Promise<void>;
  /** Flips one byte of line `epoch`'s commit record in the manifest. */
  corruptLineRecord(epoch: number): Promise<void>;
  /** Makes writing new blob files of rank `rank` fail with an OS error (ENOTDIR). */
  breakBlobs(rank: number): Promise<void>;
}

/**
 * `--keep-lines` default: the newest committed line plus one to fall back to if a part of
 * the newest turns out damaged.
 *
 * @example
 * await pruneLines(manifest, parts, opts.keepLines ?? KEEP_LINES_DEFAULT);
 * KEEP_LINES_DEFAULT; // 2
 */
export const KEEP_LINES_DEFAULT = 2;

/** Largest `meta` a commit record takes; the manifest is for small records. */
export const META_BYTES_MAX = 1 << 20;

/**
 * Parts up to this size live inside the rank's LevelDB, where a synced put costs one fsync;
 * larger ones go to a blob file, so that LevelDB never copies them into its tables (a plain
 * synced 64 MiB put costs about 2x a file write: the reference row of bench/store-bench.ts).
 */
export const INLINE_BYTES_MAX = 64 * 1024;

/**
 * Parts of at least this size that are put with {@link BlockOptions} are stored as blocks:
 * each chunk of {@link INLINE_BYTES_MAX} or more is cut into pieces of {@link BLOCK_BYTES},
 * and each piece goes to a block file named in the part's record by its SHA-256. A piece equal
 * to one the store already holds (the same bytes in an older line's part, as a large global
 * that changed in a few places) is not written again: the new record names the same file. A
 * line of 64 MiB whose global changed in one place writes about one block of it.
 *
 * Opt-in, because every piece must be hashed: worth it when the caller has the digests anyway
 * (a cpr rank names its global by them), not where it would hash only for the store (a
 * retry-one rank's durable checkpoint: hashing 64 MiB on every rank cost its job more than
 * writing it whole, in `npm run bench -- --only durable`).
 */
export const BLOCKED_BYTES_MIN = 4 << 20;
/** The size of a block (see {@link BLOCKED_BYTES_MIN}); the last piece of a chunk is shorter. */
export const BLOCK_BYTES = 1 << 20;

/**
 * The SHA-256 of a piece of a blocked part that the caller already has (a cpr rank hashes its
 * saved global block by block when it takes the checkpoint), or undefined for the store to
 * hash it. A piece is a view of one of the part's chunks: `BLOCK_BYTES` (or the chunk's rest)
 * from a multiple of `BLOCK_BYTES` into it. The caller vouches for the digest: a wrong one
 * makes the part fail its CRC-32 when read (unusable, never restored wrong).
 *
 * @example
 * const known: KnownSha256 = (piece) => (piece.buffer === global.buffer ? sums[(piece.byteOffset - global.byteOffset) / BLOCK_BYTES] : undefined);
 */
export type KnownSha256 = (piece: Uint8Array) => Promise<Buffer> | undefined;

/**
 * {@link RankPartStore.putPart}'s choice of blocks (see {@link BLOCKED_BYTES_MIN}), with the
 * digests the caller already has; those it has not the store computes.
 *
 * @example
 * await parts.putPart(7, [head, global], undefined, { knownSha256: known });
 * await parts.putPart(8, [head, global], undefined, {}); // blocks, every digest computed by the store
 */
export interface BlockOptions {
  readonly knownSha256?: KnownSha256;
}
