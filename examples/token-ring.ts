/**
 * token-ring.ts — a token travels around the ring of ranks for K laps.
 *
 * Demonstrates: `probe`/`iprobe` to learn a message's source and tag before receiving it.
 * While a rank waits for the token it does background work in chunks (a fixed series sum),
 * polling with `iprobe` between chunks; once its background work is done it blocks in `probe`.
 * Rank 0 starts every lap and picks its direction from the token's contents: clockwise laps
 * (rank r -> r + 1) carry TAG_CW, counter-clockwise laps (r -> r - 1) carry TAG_CCW. The other
 * ranks cannot know in advance which way the next lap goes, so they probe with ANY_SOURCE and
 * ANY_TAG, check that the envelope is consistent (a TAG_CW token must come from the left
 * neighbour), receive exactly that message, and pass it on in the same direction.
 * The token is an object holding a counter and a Float64Array payload, which every rank mixes
 * its own contribution into.
 *
 * Run (2..N ranks):
 *   npx lifeline run -n 4 --mode none examples/token-ring.ts
 *   npx lifeline run -n 4 --mode cpr --checkpoint-every 20steps examples/token-ring.ts --laps 1000
 *
 * Args: --laps K (default 150), --len L (payload length, default 1024),
 *       --work N (background series terms per rank, default 2000000).
 *
 * Each rank finalizes a SHA-256 chained over everything it saw (source, tag, counter, payload
 * bytes), lap by lap, plus its background sum. How much background work got done while waiting
 * depends on timing, but the sum's terms are added in one fixed order, so the sum does not.
 */
import { createHash } from "node:crypto";
import { setImmediate as yieldToEventLoop } from "node:timers/promises";
import { parseArgs } from "node:util";
import { init, ANY_SOURCE, ANY_TAG } from "lifeline";

const TAG_CW = 10; // a clockwise lap: rank r sends to r + 1
const TAG_CCW = 11; // a counter-clockwise lap: rank r sends to r - 1

interface Token {
  lap: number;
  /** Hops since the start of the run. */
  hops: number;
  payload: Float64Array;
}

interface State {
  /** Laps this rank has finished. */
  lap: number;
  /** SHA-256 chain over every token this rank received (hex). */
  seen: string;
  /** Rank 0 holds the token between laps; the others hold null. */
  token: Token | null;
  /** Background work: next series term, and the sum of 1/k^2 over the terms done. */
  workNext: number;
  workSum: number;
  /** Background chunks done while waiting for the token (timing-dependent, not digested). */
  overlapped: number;
}

/** Series terms per background chunk, between two polls. */
const CHUNK = 5000;

const { values: args } = parseArgs({
  options: {
    laps: { type: "string", default: "150" },
    len: { type: "string", default: "1024" },
    work: { type: "string", default: "2000000" },
  },
});
const laps = intArg("laps", args.laps, 0);
const len = intArg("len", args.len, 1);
const workTerms = intArg("work", args.work, 0);

const world = await init();
const { rank, size } = world;
if (size < 2) throw new RangeError("token-ring needs at least 2 ranks");
const right = (rank + 1) % size;
const left = (rank + size - 1) % size;

const saved = await world.restore<State>();
const s: State = saved?.state ?? {
  lap: 0,
  seen: "",
  token: rank === 0 ? { lap: 0, hops: 0, payload: new Float64Array(len).fill(1) } : null,
  workNext: 1,
  workSum: 0,
  overlapped: 0,
};

while (s.lap < laps) {
  if (rank === 0) {
    const token = s.token!;
    token.lap = s.lap;
    contribute(token);
    const tag = chooseDirection(token);
    await world.send(token, tag === TAG_CW ? right : left, tag);
    s.token = (await receiveToken()).token;
  } else {
    const { token, tag } = await receiveToken();
    contribute(token);
    // Pass it on the way it came: the tag tells us the lap's direction.
    await world.send(token, tag === TAG_CW ? right : left, tag);
  }
  s.lap++;
  await world.checkpoint(s);
}

// Whatever background work the waits left over is done now; the sum is the same either way.
while (s.workNext <= workTerms) backgroundChunk();
const overlapped = await world.reduce(s.overlapped, "sum", 0);
if (rank === 0) {
  const t = s.token!;
  let sum = 0;
  for (const v of t.payload) sum += v;
  console.log(
    `token-ring: ${laps} laps on ${size} ranks, ${t.hops} hops, payload sum ${sum.toFixed(9)}; ${overlapped}/${size * Math.ceil(workTerms / CHUNK)} background chunks overlapped the waits`,
  );
}
await world.finalize(
  createHash("sha256")
    .update(s.seen)
    .update(new Float64Array([s.workSum]))
    .digest("hex"),
);

/** Receives the token, whichever way it comes, and folds what we saw into `s.seen`. */
async function receiveToken(): Promise<{ token: Token; tag: number }> {
  const status = await waitForToken();
  const expectedSource = status.tag === TAG_CW ? left : status.tag === TAG_CCW ? right : -1;
  if (status.source !== expectedSource) {
    throw new Error(`rank ${rank}: a message with tag ${status.tag} from rank ${status.source} does not fit the ring`);
  }
  const msg = await world.recv<Token>(status.source, status.tag);
  const token = msg.data;
  if (!(token.payload instanceof Float64Array) || token.payload.length !== len) {
    throw new Error(`rank ${rank}: token payload arrived as ${Object.prototype.toString.call(token.payload)} of length ${token.payload?.length}`);
  }
  const h = createHash("sha256").update(s.seen);
  h.update(`${msg.source}/${msg.tag}/${token.lap}/${token.hops}/`);
  h.update(new Uint8Array(token.payload.buffer, token.payload.byteOffset, token.payload.byteLength));
  s.seen = h.digest("hex");
  return { token, tag: msg.tag };
}

/**
 * Polls for the token with iprobe, doing a chunk of background work between polls; the yield
 * to the event loop is what lets arriving messages in. With no work left, probe blocks instead.
 */
async function waitForToken(): Promise<{ source: number; tag: number }> {
  for (;;) {
    const status = world.iprobe(ANY_SOURCE, ANY_TAG);
    if (status !== undefined) return status;
    if (s.workNext > workTerms) return world.probe(ANY_SOURCE, ANY_TAG);
    backgroundChunk();
    s.overlapped++;
    await yieldToEventLoop();
  }
}

/** The next CHUNK terms of sum 1/k^2 (-> pi^2/6), always added in order k = 1, 2, 3, ... */
function backgroundChunk(): void {
  const end = Math.min(workTerms, s.workNext + CHUNK - 1);
  let acc = s.workSum;
  for (let k = s.workNext; k <= end; k++) acc += 1 / (k * k);
  s.workSum = acc;
  s.workNext = end + 1;
}

/** Every rank mixes its own mark into the payload, so the order of visits shows in the result. */
function contribute(token: Token): void {
  const p = token.payload;
  for (let i = 0; i < p.length; i++) p[i] = 0.75 * p[i] + 0.25 * Math.sin(rank + 1 + 0.01 * i + token.lap);
  token.hops++;
}

/** Rank 0's rule for the lap's direction: any deterministic function of the token will do. */
function chooseDirection(token: Token): number {
  return token.payload[token.lap % token.payload.length] >= 0 ? TAG_CW : TAG_CCW;
}

function intArg(name: string, raw: string | undefined, min: number): number {
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min) throw new RangeError(`--${name} must be an integer >= ${min}, got ${raw}`);
  return n;
}
