/**
 * The coordinator side of the store, written once over a {@link KvDb} so that the LevelDB
 * store and the in-memory store follow the same rules.
 *
 * Keys: `line/<epoch>` holds a commit record (epoch, commit time, each rank's part checksum
 * and size, optional meta, the job and run that committed it), `abort/<epoch>` marks an
 * aborted line, `job` holds the job record (which job the lines belong to, see
 * {@link JobRecord}). A line exists exactly when
 * its commit record does, and every change is a single synced batch, so a crash at any moment
 * leaves either the old or the new set of lines. `prune` keeps at least one line, so the
 * newest committed line is never deleted by it.
 *
 * @example
 * const manifest = new KvLineManifest({ kv, nowMs: Date.now });
 * await manifest.commitLine(3, refs);
 */
import { isLifelineError } from "../errors.ts";
import type { KvDb, KvOp } from "./backend.ts";
import { KvHandle } from "./kv-handle.ts";
import {
  ABORT_PREFIX,
  FORMAT_VERSION,
  JOB_KEY,
  LINE_PREFIX,
  abortKey,
  bytesField,
  checkEpoch,
  checksumField,
  corrupt,
  decodeRecord,
  encodeRecord,
  epochOfKey,
  lineKey,
  storeError,
  uintField,
} from "./records.ts";
import { META_BYTES_MAX, type JobRecord, type LineJob, type LineManifest, type LineRecord, type PartRef } from "./types.ts";

/**
 * Options of {@link KvLineManifest}.
 *
 * @example
 * const opts: KvLineManifestOptions = { kv, nowMs: Date.now };
 * const manifest = new KvLineManifest(opts);
 */
export interface KvLineManifestOptions {
  readonly kv: KvDb;
  readonly nowMs: () => number;
  /** Reject writes with TypeError (inspection tools). */
  readonly readOnly?: boolean;
  /** Called once when the manifest is closed, after the database is; releases locks. */
  readonly onClose?: () => void;
}

/**
 * {@link LineManifest} over a key-value database. Errors as documented on {@link LineManifest}.
 *
 * @example
 * const manifest = new KvLineManifest({ kv, nowMs: Date.now });
 * console.log(await manifest.list());
 */
export class KvLineManifest extends KvHandle implements LineManifest {
  private readonly nowMs: () => number;

  // Writes run one at a time (KvHandle.serial), so the "newer than every committed line" check holds.
  constructor(opts: KvLineManifestOptions) {
    super(opts.kv, { what: "the line manifest", readOnly: opts.readOnly, onClose: opts.onClose });
    this.nowMs = opts.nowMs;
  }

  async commitLine(epoch: number, parts: readonly PartRef[], opts?: { meta?: Uint8Array; job?: LineJob; mixed?: boolean }): Promise<LineRecord> {
    checkEpoch(epoch);
    const sorted = checkParts(epoch, parts, opts?.mixed === true);
    const meta = opts?.meta;
    const job = opts?.job;
    if (job !== undefined && (typeof job.id !== "string" || job.id === "" || !Number.isSafeInteger(job.run) || job.run < 1)) {
      throw new TypeError("commitLine: job must be { id: a non-empty string, run: an integer >= 1 }");
    }
    if (meta !== undefined && !(meta instanceof Uint8Array)) throw new TypeError("commitLine: meta must be a Uint8Array");
    if (meta !== undefined && meta.byteLength > META_BYTES_MAX) {
      throw new RangeError(`commitLine: meta is ${meta.byteLength} bytes, more than ${META_BYTES_MAX}; store large data in a part`);
    }
    this.checkWritable("commitLine");
    this.ensureOpen(); // at call time: writes queued before close() still run
    return this.serial(async () => {
      let newest: number | undefined;
      try {
        newest = await this.newestCommittedEpoch();
      } catch (err) {
        throw storeError(err, `committing line ${epoch}`, this.location);
      }
      // Lines commit in epoch order (a checkpoint starts only after the previous one
      // committed); an older epoch here is a protocol bug, and accepting it would make
      // "newest" ambiguous.
      if (newest !== undefined && epoch <= newest) {
        throw new RangeError(`commitLine: line ${epoch} is not newer than the committed line ${newest}`);
      }
      const timeMs = this.nowMs();
      const record = encodeRecord({
        v: FORMAT_VERSION,
        epoch,
        timeMs,
        // A part of another epoch (a line of independent checkpoints) names its own.
        parts: sorted.map((p) => (p.epoch === epoch ? [p.rank, p.checksum, p.bytes] : [p.rank, p.checksum, p.bytes, p.epoch])),
        meta: meta ?? null,
        job: job === undefined ? null : [job.id, job.run],
      });
      try {
        // The commit point of the whole line: one synced batch.
        await this.kv.write(
          [
            { type: "put", key: lineKey(epoch), value: record },
            { type: "del", key: abortKey(epoch) },
          ],
          { sync: true },
        );
      } catch (err) {
        throw storeError(err, `committing line ${epoch}`, this.location);
      }
      return {
        epoch,
        timeMs,
        parts: sorted.map((p) => ({ rank: p.rank, epoch: p.epoch, checksum: p.checksum, bytes: p.bytes })),
        meta: meta === undefined ? undefined : Buffer.from(meta),
        job: job === undefined ? undefined : { id: job.id, run: job.run },
      };
    });
  }

  async abortLine(epoch: number): Promise<void> {
    checkEpoch(epoch);
    this.checkWritable("abortLine");
    this.ensureOpen(); // at call time: writes queued before close() still run
    return this.serial(async () => {
      try {
        const marker = encodeRecord({ v: FORMAT_VERSION, epoch, timeMs: this.nowMs() });
        await this.kv.write(
          [
            { type: "del", key: lineKey(epoch) },
            { type: "put", key: abortKey(epoch), value: marker },
          ],
          { sync: true },
        );
      } catch (err) {
        throw storeError(err, `aborting line ${epoch}`, this.location);
      }
    });
  }

  async latestCommitted(): Promise<LineRecord | undefined> {
    this.ensureOpen();
    const rows = await this.scan(LINE_PREFIX, { reverse: true, limit: 1 });
    const row = rows[0];
    return row === undefined ? undefined : this.decodeLine(row[0], row[1]);
  }

  async list(): Promise<LineRecord[]> {
    this.ensureOpen();
    return (await this.scan(LINE_PREFIX, {})).map(([key, value]) => this.decodeLine(key, value));
  }

  async aborted(): Promise<number[]> {
    this.ensureOpen();
    return (await this.scan(ABORT_PREFIX, {})).map(([key, value]) => {
      const keyEpoch = epochOfKey(key, ABORT_PREFIX);
      const what = `abort marker ${JSON.stringify(key)} in the manifest ${this.location}`;
      const rec = decodeRecord(value, what);
      const epoch = uintField(rec, "epoch", what);
      if (epoch !== keyEpoch) throw corrupt(`${what}: marker belongs to line ${epoch}`);
      return epoch;
    });
  }

  async prune(keep: number): Promise<number[]> {
    if (typeof keep !== "number" || !Number.isInteger(keep) || keep < 1) {
      throw new RangeError(`prune: keep must be an integer >= 1 (the newest line is never deleted), got ${String(keep)}`);
    }
    this.checkWritable("prune");
    this.ensureOpen(); // at call time: writes queued before close() still run
    return this.serial(async () => {
      try {
        // Keys only: pruning must work even if an old record is damaged.
        const lines = (await this.kv.scan(LINE_PREFIX, {})).map(([key]) => ({ key, epoch: epochOfKey(key, LINE_PREFIX) }));
        const aborts = (await this.kv.scan(ABORT_PREFIX, {})).map(([key]) => ({ key, epoch: epochOfKey(key, ABORT_PREFIX) }));
        const doomed = lines.slice(0, Math.max(0, lines.length - keep));
        const oldestKept = lines[doomed.length]?.epoch;
        const ops: KvOp[] = doomed.map(({ key }) => ({ type: "del", key }));
        if (oldestKept !== undefined) {
          for (const a of aborts) if (a.epoch === undefined || a.epoch < oldestKept) ops.push({ type: "del", key: a.key });
        }
        if (ops.length > 0) await this.kv.write(ops, { sync: true });
        return doomed.map((d) => d.epoch).filter((e): e is number => e !== undefined);
      } catch (err) {
        throw storeError(err, `pruning lines (keep ${keep})`, this.location);
      }
    });
  }

  async job(): Promise<JobRecord | undefined> {
    this.ensureOpen();
    let value: Buffer | undefined;
    try {
      value = await this.kv.get(JOB_KEY);
    } catch (err) {
      throw storeError(err, "reading the job record", this.location);
    }
    return value === undefined ? undefined : decodeJob(value, `the job record in the manifest ${this.location}`);
  }

  async putJob(job: JobRecord): Promise<void> {
    const record = encodeRecord({ v: FORMAT_VERSION, ...checkJob(job) });
    this.checkWritable("putJob");
    this.ensureOpen(); // at call time: writes queued before close() still run
    return this.serial(async () => {
      try {
        await this.kv.write([{ type: "put", key: JOB_KEY, value: record }], { sync: true });
      } catch (err) {
        throw storeError(err, "writing the job record", this.location);
      }
    });
  }

  private async scan(prefix: string, opts: { reverse?: boolean; limit?: number }): Promise<[string, Buffer][]> {
    try {
      return await this.kv.scan(prefix, opts);
    } catch (err) {
      throw storeError(err, "reading the line manifest", this.location);
    }
  }

  private async newestCommittedEpoch(): Promise<number | undefined> {
    const row = (await this.kv.scan(LINE_PREFIX, { reverse: true, limit: 1 }))[0];
    if (row === undefined) return undefined;
    const epoch = epochOfKey(row[0], LINE_PREFIX);
    if (epoch === undefined)
      throw corrupt(`the line manifest ${this.location} holds a malformed key ${JSON.stringify(row[0])}; move the store aside and start fresh`);
    return epoch;
  }

  private decodeLine(key: string, value: Buffer): LineRecord {
    const keyEpoch = epochOfKey(key, LINE_PREFIX);
    const what = `the commit record of line ${keyEpoch ?? JSON.stringify(key)} in the manifest ${this.location}`;
    const advice = "the manifest is damaged; move the store directory aside and start the job fresh";
    try {
      const rec = decodeRecord(value, what);
      const epoch = uintField(rec, "epoch", what);
      const timeMs = uintField(rec, "timeMs", what);
      if (epoch !== keyEpoch) throw corrupt(`${what}: record belongs to line ${epoch}`);
      const rawParts = rec["parts"];
      if (!Array.isArray(rawParts) || rawParts.length === 0) throw corrupt(`${what}: no parts`);
      const parts = rawParts.map((p: unknown, i): PartRef => {
        if (!Array.isArray(p) || (p.length !== 3 && p.length !== 4)) throw corrupt(`${what}: part ${i} is malformed`);
        const [rank, checksum, bytes, own] = p as unknown[];
        const fields = { rank, checksum, bytes, own: own ?? epoch };
        const r = uintField(fields, "rank", what);
        if (r !== i) throw corrupt(`${what}: part ${i} names rank ${r}`);
        return { rank: r, epoch: uintField(fields, "own", what), checksum: checksumField(fields, "checksum", what), bytes: uintField(fields, "bytes", what) };
      });
      return { epoch, timeMs, parts, meta: bytesField(rec, "meta", what), job: lineJobField(rec, what) };
    } catch (err) {
      if (isLifelineError(err, "STORE_CORRUPT")) throw corrupt(`${err.message}; ${advice}`);
      throw err;
    }
  }
}

/** The `job` field of a commit record: `[id, run]`, or absent in records of older stores. */
function lineJobField(rec: Record<string, unknown>, what: string): LineJob | undefined {
  const raw = rec["job"];
  if (raw === undefined || raw === null) return undefined;
  if (!Array.isArray(raw) || raw.length !== 2 || typeof raw[0] !== "string") throw corrupt(`${what}: field job is malformed`);
  return { id: raw[0], run: uintField({ run: raw[1] }, "run", what) };
}

const JOB_STATES: readonly JobRecord["state"][] = ["running", "finished", "failed", "stopped"];

/** The fields of a job record as stored, checked (TypeError for a caller's bad record). */
function checkJob(job: JobRecord): Record<string, unknown> {
  const bad = (field: string): never => {
    throw new TypeError(`putJob: job.${field} is malformed`);
  };
  const str = (v: unknown, field: string): string => (typeof v === "string" ? v : bad(field));
  const uint = (v: unknown, field: string): number => (typeof v === "number" && Number.isSafeInteger(v) && v >= 0 ? v : bad(field));
  if (job === null || typeof job !== "object") throw new TypeError("putJob: job must be a JobRecord");
  if (!Array.isArray(job.args) || !job.args.every((a) => typeof a === "string")) bad("args");
  if (!JOB_STATES.includes(job.state)) bad("state");
  if (job.launcher === null || typeof job.launcher !== "object") bad("launcher");
  if (job.id === "") bad("id");
  return {
    id: str(job.id, "id"),
    app: str(job.app, "app"),
    args: [...job.args],
    size: uint(job.size, "size"),
    mode: str(job.mode, "mode"),
    programSha256: str(job.programSha256, "programSha256"),
    createdMs: uint(job.createdMs, "createdMs"),
    run: uint(job.run, "run"),
    runStartedMs: uint(job.runStartedMs, "runStartedMs"),
    launcherPid: uint(job.launcher.pid, "launcher.pid"),
    launcherHost: str(job.launcher.host, "launcher.host"),
    state: job.state,
    endedMs: job.endedMs === undefined ? null : uint(job.endedMs, "endedMs"),
    exitCode: job.exitCode === undefined ? null : uint(job.exitCode, "exitCode"),
  };
}

/** A stored job record; `STORE_CORRUPT` naming `what` when it is damaged or malformed. */
function decodeJob(value: Buffer, what: string): JobRecord {
  const rec = decodeRecord(value, what);
  const str = (name: string): string => {
    const v = rec[name];
    if (typeof v !== "string") throw corrupt(`${what}: field ${name} is ${JSON.stringify(v)}, not a string`);
    return v;
  };
  const optUint = (name: string): number | undefined => (rec[name] === null || rec[name] === undefined ? undefined : uintField(rec, name, what));
  const args = rec["args"];
  if (!Array.isArray(args) || !args.every((a) => typeof a === "string")) throw corrupt(`${what}: field args is not a list of strings`);
  const state = rec["state"];
  if (!JOB_STATES.includes(state as JobRecord["state"])) throw corrupt(`${what}: field state is ${JSON.stringify(state)}`);
  return {
    id: str("id"),
    app: str("app"),
    args: args,
    size: uintField(rec, "size", what),
    mode: str("mode"),
    programSha256: str("programSha256"),
    createdMs: uintField(rec, "createdMs", what),
    run: uintField(rec, "run", what),
    runStartedMs: uintField(rec, "runStartedMs", what),
    launcher: { pid: uintField(rec, "launcherPid", what), host: str("launcherHost") },
    state: state as JobRecord["state"],
    endedMs: optUint("endedMs"),
    exitCode: optUint("exitCode"),
  };
}

/** Checks a line's parts: ranks 0..n-1 once each, all of `epoch` (or, `mixed`, each of its own). Returns them sorted by rank. */
function checkParts(epoch: number, parts: readonly PartRef[], mixed: boolean): PartRef[] {
  if (!Array.isArray(parts) || parts.length === 0) throw new RangeError("commitLine: a line needs at least one part");
  parts.forEach((p, i) => {
    if (p === null || typeof p !== "object") throw new TypeError(`commitLine: parts[${i}] is not a PartRef`);
    if (!Number.isInteger(p.rank) || p.rank < 0) throw new RangeError(`commitLine: parts[${i}].rank is not a non-negative integer`);
    if (mixed ? !Number.isSafeInteger(p.epoch) || p.epoch < 0 : p.epoch !== epoch) {
      throw new RangeError(`commitLine: rank ${p.rank}'s part is of line ${String(p.epoch)}, not ${epoch}`);
    }
    if (!Number.isInteger(p.checksum) || p.checksum < 0 || p.checksum > 0xffffffff)
      throw new RangeError(`commitLine: rank ${p.rank}'s checksum is not a 32-bit unsigned integer`);
    if (!Number.isSafeInteger(p.bytes) || p.bytes < 0) throw new RangeError(`commitLine: rank ${p.rank}'s byte count is not a non-negative integer`);
  });
  const sorted = [...parts].sort((a, b) => a.rank - b.rank);
  sorted.forEach((p, i) => {
    if (p.rank !== i) {
      const problem = p.rank < i ? `rank ${p.rank} appears twice` : `rank ${i} is missing`;
      throw new RangeError(`commitLine: the parts must be of ranks 0..${parts.length - 1}, once each; ${problem}`);
    }
  });
  return sorted;
}
