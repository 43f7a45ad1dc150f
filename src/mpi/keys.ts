/**
 * A job's secrets: the CURVE keys of its tcp links and the tokens that bind each rank's
 * control link to its incarnation (docs/security.md, "How keys flow").
 *
 * - **CURVE** (ZeroMQ's authenticated encryption, RFC 26): the coordinator is a CURVE server
 *   with the job's *coordinator key pair*; every rank connects with the job's *member key
 *   pair* (the coordinator's ZAP handler accepts that key only). Each rank's data socket is a
 *   CURVE server with a key pair the rank makes for itself at start (its public key goes to its
 *   peers in the coordinator's table; its secret never leaves the process), and accepts the
 *   member key only. ipc needs none of this: its sockets are files in a private directory.
 * - **Tokens**: a rank incarnation's control routing id is `r<rank>.<attempt>/<token>`, the
 *   token a keyed hash of (rank, attempt) under the job's token secret. zeromq.js cannot tell
 *   a Router which authenticated connection a message came from except by routing id, so the
 *   routing id itself must be unguessable: a message counts as rank r's only over the
 *   connection that carries r's token, and a Router never gives one routing id to two
 *   connections at once.
 *
 * Keys reach a rank through a key file (`LIFELINE_KEYS`, mode 0600), never a command line, an
 * environment value or a log line; a rank on another host reads the same text from its stdin
 * (`LIFELINE_KEYS=-`), carried by the remote-shell agent. Three kinds of file:
 * - `rank`: one incarnation's, written by `lifeline run` (its token, not the token secret);
 * - `ranks`: every rank's, for engines that start the ranks (`lifeline keys`; Kubernetes Secret);
 * - `coordinator`: `lifeline coordinator --keys`' (the coordinator's secret key, no member secret).
 *
 * @example
 * const keys = makeJobKeys({ curve: true });
 * writeKeyFile("/run/dir/r1.0.key", rankKeyText(keys, 1, 0));   // 0600, for rank 1's first start
 * const mine = parseRankKeys(readFileSync(path, "utf8"), 1, 0); // on the rank: { curve, token }
 */
import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { closeSync, existsSync, fstatSync, mkdirSync, openSync, readFileSync, statSync, writeSync } from "node:fs";
import { join } from "node:path";
import { curveKeyPair } from "zeromq";
import { LifelineError, type LifelineErrorCode } from "../errors.ts";

/** A CURVE key pair, Z85-encoded (40 characters each) as ZeroMQ takes them. */
export interface CurveKeyPair {
  readonly publicKey: string;
  readonly secretKey: string;
}

/** Everything the job's coordinator needs. */
export interface CoordinatorKeys {
  /** Absent: no CURVE (ipc, `--insecure`). */
  readonly curve?: { readonly server: CurveKeyPair; readonly member: string } | undefined;
  /** The secret every incarnation's token derives from (absent: routing ids carry no token). */
  readonly tokens?: Buffer | undefined;
}

/** What one rank incarnation needs. */
export interface RankKeys {
  /** Absent: no CURVE. `server`: the coordinator's public key; `member`: the job's member key pair. */
  readonly curve?: { readonly server: string; readonly member: CurveKeyPair } | undefined;
  /** This incarnation's token (absent: a job without tokens, `lifeline coordinator --insecure`). */
  readonly token?: string | undefined;
}

/** A job's keys as the launcher makes them. */
export interface JobKeys extends CoordinatorKeys {
  readonly curve?: { readonly server: CurveKeyPair; readonly member: string; readonly memberSecret: string } | undefined;
  readonly tokens: Buffer;
}

const FILE_TAG = "lifeline-keys";
const FILE_VERSION = 1;
const Z85_RE = /^[0-9a-zA-Z.\-:+=^!/*?&<>()[\]{}@%$#]{40}$/;
const HEX32_RE = /^[0-9a-f]{32}$/;
const HEX64_RE = /^[0-9a-f]{64}$/;

/** Fresh keys for one job: a token secret, and CURVE key pairs unless `curve` is false. */
export function makeJobKeys(opts: { curve: boolean }): JobKeys {
  const tokens = randomBytes(32);
  if (!opts.curve) return { tokens };
  const server = curveKeyPair();
  const member = curveKeyPair();
  return { tokens, curve: { server, member: member.publicKey, memberSecret: member.secretKey } };
}

/**
 * The token of incarnation `attempt` of `rank` under the token secret `tokens`: 128 bits of an
 * HMAC-SHA-256, hex.
 */
export function tokenOf(tokens: Buffer, rank: number, attempt: number): string {
  return createHmac("sha256", tokens).update(`lifeline/control/r${rank}.${attempt}`).digest("hex").slice(0, 32);
}

/** Compares two tokens without leaking where they differ. */
export function sameToken(a: string, b: string): boolean {
  return a.length === b.length && timingSafeEqual(Buffer.from(a, "latin1"), Buffer.from(b, "latin1"));
}

// ---- files -----------------------------------------------------------------------------------

/** The key file of incarnation `attempt` of `rank`, written by `lifeline run` for it alone. */
export function rankKeyText(keys: JobKeys, rank: number, attempt: number): string {
  return `${JSON.stringify({
    [FILE_TAG]: FILE_VERSION,
    for: "rank",
    rank,
    attempt,
    token: tokenOf(keys.tokens, rank, attempt),
    ...curveFieldsForRanks(keys),
  })}\n`;
}

/** The key file every rank of a job may share (engines that start the ranks: Kubernetes, srun). */
export function ranksKeyText(keys: JobKeys): string {
  return `${JSON.stringify({ [FILE_TAG]: FILE_VERSION, for: "ranks", tokens: keys.tokens.toString("hex"), ...curveFieldsForRanks(keys) })}\n`;
}

/** The coordinator's key file (`lifeline coordinator --keys`): its secret key, the member's public key. */
export function coordinatorKeyText(keys: JobKeys): string {
  return `${JSON.stringify({
    [FILE_TAG]: FILE_VERSION,
    for: "coordinator",
    tokens: keys.tokens.toString("hex"),
    ...(keys.curve === undefined
      ? {}
      : { coordinator: keys.curve.server.publicKey, coordinatorSecret: keys.curve.server.secretKey, member: keys.curve.member }),
  })}\n`;
}

function curveFieldsForRanks(keys: JobKeys): Record<string, string> {
  return keys.curve === undefined ? {} : { coordinator: keys.curve.server.publicKey, member: keys.curve.member, memberSecret: keys.curve.memberSecret };
}

/**
 * Writes a new key file readable by its owner only (0600). Refuses to replace a file that is
 * there (`EEXIST`): keys are never overwritten silently.
 */
export function writeKeyFile(path: string, text: string): void {
  const fd = openSync(path, "wx", 0o600);
  try {
    writeSync(fd, text);
  } finally {
    closeSync(fd);
  }
}

/**
 * Reads a key file; `-` reads this process's stdin to its end (a rank on another host, see the
 * file comment). Returns the text and, for a file that other users can read, a warning.
 */
export function readKeyFile(path: string, code: LifelineErrorCode): { text: string; warning?: string } {
  let fd: number;
  try {
    fd = path === "-" ? 0 : openSync(path, "r");
  } catch (err) {
    throw new LifelineError(code, `cannot read the key file ${path}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`, { cause: err });
  }
  try {
    const mode = fstatSync(fd).mode;
    const text = readFileSync(fd, "utf8");
    const open = path !== "-" && (mode & 0o077) !== 0;
    return open ? { text, warning: `key file ${path} can be read by other users (mode ${(mode & 0o777).toString(8)}): chmod 600 it` } : { text };
  } catch (err) {
    throw new LifelineError(code, `cannot read the key file ${path}: ${(err as Error).message}`, { cause: err });
  } finally {
    if (path !== "-") closeSync(fd);
  }
}

function parseFile(text: string, what: string, code: LifelineErrorCode): Record<string, unknown> {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch {
    throw new LifelineError(code, `${what} is not a lifeline key file (not JSON)`);
  }
  if (doc === null || typeof doc !== "object" || (doc as Record<string, unknown>)[FILE_TAG] !== FILE_VERSION) {
    throw new LifelineError(code, `${what} is not a lifeline key file of version ${FILE_VERSION}`);
  }
  return doc as Record<string, unknown>;
}

function field(doc: Record<string, unknown>, name: string, re: RegExp, what: string, code: LifelineErrorCode): string {
  const v = doc[name];
  if (typeof v !== "string" || !re.test(v)) throw new LifelineError(code, `${what}: field ${name} is missing or malformed`);
  return v;
}

/**
 * The keys of incarnation `attempt` of `rank` from the text of a `rank` or `ranks` key file.
 * Throws `MPI_INIT` for a malformed file, or one made for another rank or attempt.
 */
export function parseRankKeys(text: string, rank: number, attempt: number, what = "the key file"): RankKeys {
  const code = "MPI_INIT";
  const doc = parseFile(text, what, code);
  let token: string;
  if (doc.for === "rank") {
    if (doc.rank !== rank || doc.attempt !== attempt) {
      throw new LifelineError(code, `${what} is for rank ${String(doc.rank)} attempt ${String(doc.attempt)}, but this is rank ${rank} attempt ${attempt}`);
    }
    token = field(doc, "token", HEX32_RE, what, code);
  } else if (doc.for === "ranks") {
    token = tokenOf(Buffer.from(field(doc, "tokens", HEX64_RE, what, code), "hex"), rank, attempt);
  } else {
    throw new LifelineError(code, `${what} is a ${JSON.stringify(doc.for)} key file, not one for ranks (give ranks the ranks key file of \`lifeline keys\`)`);
  }
  if (doc.coordinator === undefined) return { token };
  return {
    token,
    curve: {
      server: field(doc, "coordinator", Z85_RE, what, code),
      member: { publicKey: field(doc, "member", Z85_RE, what, code), secretKey: field(doc, "memberSecret", Z85_RE, what, code) },
    },
  };
}

/** The coordinator's keys from the text of a `coordinator` key file. Throws `LAUNCH_USAGE`. */
export function parseCoordinatorKeys(text: string, what: string): CoordinatorKeys {
  const code = "LAUNCH_USAGE";
  const doc = parseFile(text, what, code);
  if (doc.for !== "coordinator") {
    throw new LifelineError(code, `${what} is a ${JSON.stringify(doc.for)} key file; the coordinator takes the coordinator key file of \`lifeline keys\``);
  }
  const tokens = Buffer.from(field(doc, "tokens", HEX64_RE, what, code), "hex");
  if (doc.coordinator === undefined) return { tokens };
  return {
    tokens,
    curve: {
      server: { publicKey: field(doc, "coordinator", Z85_RE, what, code), secretKey: field(doc, "coordinatorSecret", Z85_RE, what, code) },
      member: field(doc, "member", Z85_RE, what, code),
    },
  };
}

// ---- Z85 (ZeroMQ RFC 32), for the raw 32-byte keys a ZAP request carries ----------------------

const Z85_CHARS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

/** Z85 text of `bytes` (a multiple of 4 long). */
export function z85Encode(bytes: Uint8Array): string {
  let out = "";
  for (let i = 0; i + 4 <= bytes.length; i += 4) {
    let v = ((bytes[i]! << 24) | (bytes[i + 1]! << 16) | (bytes[i + 2]! << 8) | bytes[i + 3]!) >>> 0;
    let chunk = "";
    for (let j = 0; j < 5; j++) {
      chunk = Z85_CHARS[v % 85]! + chunk;
      v = Math.floor(v / 85);
    }
    out += chunk;
  }
  return out;
}

/**
 * This rank's keys: from its key file (`place.keys`; `-`: stdin), or none when it has none (a
 * job without keys: `lifeline coordinator --insecure`). Throws `MPI_INIT` for a file that
 * cannot be read or is not this rank's; `warning` says when others can read it.
 */
export function loadRankKeys(place: { readonly keys?: string | undefined; readonly rank: number; readonly attempt: number }): {
  keys: RankKeys;
  warning?: string;
} {
  if (place.keys === undefined) return { keys: {} };
  const what = place.keys === "-" ? "the key file on stdin" : `the key file ${place.keys}`;
  const { text, warning } = readKeyFile(place.keys, "MPI_INIT");
  const keys = parseRankKeys(text, place.rank, place.attempt, what);
  return warning === undefined ? { keys } : { keys, warning };
}

// ---- a job's key directory (`lifeline keys`, `lifeline coordinator --keys`) -------------------

/** The coordinator's file in a key directory. */
export const COORDINATOR_KEY_FILE = "coordinator.key";
/** The ranks' file in a key directory. */
export const RANKS_KEY_FILE = "ranks.key";

/**
 * Makes a job's keys in `dir` (created 0700 if missing): {@link COORDINATOR_KEY_FILE} and
 * {@link RANKS_KEY_FILE}, each 0600. Refuses (`LAUNCH_USAGE`) to replace keys that are there.
 */
export function writeKeyDir(dir: string, keys: JobKeys): { coordinator: string; ranks: string } {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const coordinator = join(dir, COORDINATOR_KEY_FILE);
  const ranks = join(dir, RANKS_KEY_FILE);
  for (const path of [coordinator, ranks]) {
    if (existsSync(path))
      throw new LifelineError("LAUNCH_USAGE", `${path} exists: keys are never overwritten; remove the old ones first, or choose another directory`);
  }
  writeKeyFile(coordinator, coordinatorKeyText(keys));
  writeKeyFile(ranks, ranksKeyText(keys));
  return { coordinator, ranks };
}

/** The coordinator's keys from `path`: a key directory, or its coordinator key file. Throws `LAUNCH_USAGE`. */
export function readCoordinatorKeys(path: string): { keys: CoordinatorKeys; warning?: string } {
  const file = existsSync(path) && statSync(path).isDirectory() ? join(path, COORDINATOR_KEY_FILE) : path;
  const { text, warning } = readKeyFile(file, "LAUNCH_USAGE");
  const keys = parseCoordinatorKeys(text, `the key file ${file}`);
  return warning === undefined ? { keys } : { keys, warning };
}
