/**
 * The `--results` file: every rank's `finalize()` value plus how the job went, as JSON.
 *
 * Results are anything msgpack carries, which JSON does not: bigints become decimal strings,
 * typed arrays and Sets become arrays (64-bit integer arrays: arrays of strings), Maps become
 * objects keyed by `String(key)`, Dates ISO strings, non-finite numbers the strings "NaN",
 * "Infinity", "-Infinity". A rank that did not finalize has `null`.
 *
 * @example
 * await writeResultsFile("out.json", { ranks: [1n, new Float64Array([0.5])], restarts: 0, mode: "none", size: 2, wallMs: 812, exitCode: 0 });
 * // {"ranks":["1",[0.5]],"restarts":0,"mode":"none","size":2,"wallMs":812,"exitCode":0}
 */
import { rename, writeFile } from "node:fs/promises";
import { LifelineError, errorMessage } from "../errors.ts";

/** The content of a `--results` file (docs/cli.md, "The results file"). */
export interface ResultsDocument {
  ranks: unknown[];
  restarts: number;
  mode: string;
  size: number;
  wallMs: number;
  exitCode: number;
  /** Why the job failed, when it did. */
  error?: { code: string; message: string } | undefined;
  job?: string;
  /** cpr: which run of the job this was (1 = its first start; a resume adds one). */
  run?: number;
  /**
   * cpr: lines committed, the epochs rolled back to (`{ attempt, epoch }`, 0 = the beginning)
   * and `resumedFrom`, the line a resumed run restored at its start.
   */
  recovery?: Record<string, unknown>;
}

/** Depth past which nested data is cut (results come from user code and may be cyclic in theory). */
const DEPTH_MAX = 256;

/** Converts a value to one that `JSON.stringify` renders without loss of meaning or throwing. */
export function toJsonSafe(value: unknown, depth = 0): unknown {
  if (depth > DEPTH_MAX) return "[nested too deep]";
  switch (typeof value) {
    case "undefined":
      return null;
    case "bigint":
      return value.toString();
    case "number":
      return Number.isFinite(value) ? value : String(value);
    case "string":
    case "boolean":
      return value;
    case "function":
    case "symbol":
      return String(value);
  }
  if (value === null) return null;
  if (ArrayBuffer.isView(value) && !(value instanceof DataView)) {
    return Array.from(value as unknown as ArrayLike<number | bigint>, (x) => toJsonSafe(x, depth + 1));
  }
  if (value instanceof Date) return Number.isNaN(value.getTime()) ? null : value.toISOString();
  if (value instanceof Map) {
    const out: Record<string, unknown> = {};
    for (const [k, v] of value) out[String(k)] = toJsonSafe(v, depth + 1);
    return out;
  }
  if (value instanceof Set) return [...value].map((v) => toJsonSafe(v, depth + 1));
  if (Array.isArray(value)) return value.map((v) => toJsonSafe(v, depth + 1));
  if (value instanceof RegExp) return String(value);
  const out: Record<string, unknown> = {};
  for (const k of Object.keys(value as object)) out[k] = toJsonSafe((value as Record<string, unknown>)[k], depth + 1);
  return out;
}

/**
 * Writes the results document atomically (temp file + rename), so a reader never sees half a
 * file. Rejects with `LAUNCH_USAGE` if the file cannot be written.
 */
export async function writeResultsFile(path: string, doc: ResultsDocument): Promise<void> {
  const safe = { ...doc, ranks: doc.ranks.map((r) => toJsonSafe(r)) };
  if (safe.error === undefined) delete safe.error;
  const tmp = `${path}.${process.pid}.tmp`;
  try {
    await writeFile(tmp, `${JSON.stringify(safe, null, 2)}\n`);
    await rename(tmp, path);
  } catch (err) {
    throw new LifelineError("LAUNCH_USAGE", `cannot write --results file ${path}: ${errorMessage(err)}`, { cause: err });
  }
}
