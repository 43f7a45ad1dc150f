/**
 * Safety properties of a simulated run, checked after every step (not once at the end), so a
 * failure points at the event that broke it.
 *
 * Network level (checked inside the network as it delivers): FIFO and exactly-once per
 * channel, nothing delivered to or from a dead node, a dead node runs no code.
 * Communicator level (here): every data frame's header names its real sender and incarnation
 * and numbers the channel's application and collective messages 0, 1, 2, … with no gap and no
 * repeat (in retry-one, where senders resend logged messages and restarted ranks re-execute
 * theirs: a message number on a channel always carries the same tag and bytes, whichever
 * incarnation sends it); the receive path never throws; the coordinator sees at most one finalize per rank
 * and releases only when all have finalized; at the end, a released job has every rank
 * finalized with the result the coordinator recorded.
 *
 * @example
 * const inv = clusterInvariants(cluster);
 * inv.afterStep(); // throws AssertionError naming the broken property
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { isDeepStrictEqual } from "node:util";
import { decodeHeader, Flag, type Header, HEADER_BYTES, Kind } from "../mpi/wire.ts";
import { decodeValue } from "../mpi/codec.ts";
import type { LibState, RawFrame } from "../mpi/cpr-hook.ts";
import { type CommittedLine, finishedOk, type SimCluster } from "./sim-cluster.ts";
import type { DataDelivery } from "./sim-network.ts";

export interface ClusterInvariants {
  afterStep(): void;
  atEnd(): void;
  /** A recovery line was committed: check it is a consistent cut with complete channel logs. */
  onLine(line: CommittedLine): void;
  /**
   * retry-one: every rank restarts from the durable floor. The re-execution from there logs
   * nothing it replays, so a message number may carry other content than before.
   */
  onRestartAll(): void;
}

/** A rank's part as the coordinated driver writes it (src/cpr/coordinated/driver.ts). */
interface PartView {
  epoch: number;
  lib: Buffer;
  early: [number, number][];
  late: RawFrame[];
}

/** The invariants' model of one channel's order at its receiver (see clusterInvariants). */
interface BulkOrderModel {
  /** Frames from the data connection not passed on yet, in arrival order. */
  readonly waiting: { readonly seq: number; readonly mark: boolean }[];
  /** Numbers of marks, and of bulk messages, not paired yet. */
  readonly marks: number[];
  readonly bulks: number[];
  /** Bulk messages paired with a mark that is still waiting in `waiting`. */
  paired: number;
}

/** Parses `sim://r<rank>.<attempt>`. */
export function parseRankNode(id: string): { rank: number; attempt: number } {
  const m = /^sim:\/\/r(\d+)\.(\d+)$/.exec(id);
  assert(m !== null, `not a rank node: ${id}`);
  return { rank: Number(m[1]), attempt: Number(m[2]) };
}

export function clusterInvariants(cluster: SimCluster): ClusterInvariants {
  const { net, coordinator } = cluster;
  /** Next expected channel sequence number of app/collective frames, per src>dst incarnation pair. */
  const expectSeq = new Map<string, number>();
  /** Per receiving incarnation and source rank: app/collective frames delivered so far (last seq + 1). */
  const arrived = new Map<string, number[]>();
  /** At each rank's local checkpoint of an epoch: its `arrived` counts then, and its attempt. */
  const atCheckpoint = new Map<string, { attempt: number; arrived: number[] }>();
  /** The keys of the channels into each rank (a column of the coordinator's matrix). */
  const keysIn = new Map<number, number[]>();
  const keysInOf = (rank: number): number[] => {
    let col = keysIn.get(rank);
    if (col === undefined) keysIn.set(rank, (col = Array.from({ length: cluster.size }, (_, s) => coordinator.channelKeys[s * cluster.size + rank]!)));
    return col;
  };
  const onData = (d: DataDelivery): void => {
    const src = parseRankNode(d.src);
    const dst = parseRankNode(d.dst);
    let h: Header;
    try {
      // A small body may travel inline after the 40-byte header, in the same frame.
      const first = d.frames[0];
      h = decodeHeader(first !== undefined && first.length > HEADER_BYTES ? first.subarray(0, HEADER_BYTES) : first, {
        keysIn: keysInOf(dst.rank),
        size: cluster.size,
      });
    } catch (err) {
      return net.violation(`${d.src} sent ${d.dst} a frame with a bad header: ${(err as Error).message}`);
    }
    if (h.source !== src.rank) net.violation(`${d.src} sent a frame claiming source ${h.source}`);
    if (h.attempt !== src.attempt) net.violation(`${d.src} sent a frame claiming attempt ${h.attempt}`);
    if (h.kind === Kind.protocol) return;
    const bulk = (h.flags & Flag.bulk) !== 0;
    const mark = (h.flags & Flag.bulkMark) !== 0;
    if (bulk !== d.bulk)
      net.violation(`${d.src} sent ${d.dst} a frame ${bulk ? "flagged bulk on the data connection" : "on the bulk connection without the bulk flag"}`);
    const retry = cluster.mode === "retry-one";
    if (retry) {
      if (h.kind === Kind.app && !mark) sameContent(d, h);
      return;
    }
    const key = `${d.src}>${dst.rank}`;
    // The receiver's incarnation too: a restarted receiver's channel starts empty.
    let order = inOrder.get(`${key}.${dst.attempt}`);
    if (order === undefined) inOrder.set(`${key}.${dst.attempt}`, (order = { waiting: [], marks: [], bulks: [], paired: 0 }));
    if (bulk) {
      // Numbered at its mark; it pairs with the oldest mark that has no message yet.
      order.bulks.push(h.channelSeq);
      pair(key, order);
      arrive(d.dst, h.source, order);
      return;
    }
    if (mark) {
      order.marks.push(h.channelSeq);
      pair(key, order);
    }
    order.waiting.push({ seq: h.channelSeq, mark });
    const want = expectSeq.get(key);
    // Numbering is 0, 1, 2, … in a first attempt. A restored rank continues from its line's
    // counters, and skips the early messages its peers already hold (suppressed, never sent).
    const strict = src.attempt === 0;
    if (strict ? h.channelSeq !== (want ?? 0) : want !== undefined && h.channelSeq < want) {
      net.violation(
        `channel ${d.src}→rank ${dst.rank}: message numbered #${h.channelSeq} arrived where #${want ?? 0} was next (a message lost, repeated or numbered out of order)`,
      );
    }
    expectSeq.set(key, h.channelSeq + 1);
    arrive(d.dst, h.source, order);
  };
  /** Per src>dst incarnation pair, a reference model of the receiver's order (Channel.inOrder). */
  const inOrder = new Map<string, BulkOrderModel>();
  /** The n-th bulk message on a channel is the n-th mark's: they carry one number. */
  const pair = (key: string, o: BulkOrderModel): void => {
    while (o.marks.length > 0 && o.bulks.length > 0) {
      const m = o.marks.shift()!;
      const b = o.bulks.shift()!;
      if (m !== b) net.violation(`channel ${key}: bulk message #${b} arrived for the mark of #${m}`);
      o.paired++;
    }
  };
  /** Passes on what the receiver's channel delivers now: frames up to the first mark whose message has not come. */
  const arrive = (dst: string, source: number, o: BulkOrderModel): void => {
    let counts = arrived.get(dst);
    if (counts === undefined) arrived.set(dst, (counts = new Array<number>(cluster.size).fill(0)));
    while (o.waiting.length > 0) {
      const f = o.waiting[0]!;
      if (f.mark) {
        if (o.paired === 0) return;
        o.paired--;
      }
      o.waiting.shift();
      counts[source] = f.seq + 1;
    }
  };
  /** retry-one: per channel and application message number, its tag and bytes (as first sent). */
  const appContent = new Map<string, string>();
  const sameContent = (d: DataDelivery, h: Header): void => {
    const hash = createHash("sha1").update(`${h.tag}/${h.encoding}/${h.arrayType}/`);
    d.frames.forEach((f, i) => hash.update(i === 0 ? f.subarray(HEADER_BYTES) : f));
    const key = `${h.source}>${parseRankNode(d.dst).rank}#${h.collSeq}`;
    const digest = hash.digest("hex");
    const first = appContent.get(key);
    if (first === undefined) appContent.set(key, digest);
    else if (first !== digest) net.violation(`channel ${key}: message sent again (by ${d.src}) with other content than the first time`);
  };
  net.controlObservers.push((src, _dst, msg) => {
    if (msg.t !== "cpr-checkpointed") return;
    const me = parseRankNode(src);
    atCheckpoint.set(`${me.rank}/${msg.epoch}`, { attempt: me.attempt, arrived: [...(arrived.get(src) ?? new Array<number>(cluster.size).fill(0))] });
  });
  net.dataObservers.push(onData);

  return {
    afterStep() {
      assert.deepEqual(net.violations, [], "network invariant violated");
      if (net.callbackErrors.length > 0) {
        const first = net.callbackErrors[0]!;
        throw new assert.AssertionError({
          message: `the receive path of ${first.node} threw: ${(first.error as Error)?.stack ?? String(first.error)}`,
        });
      }
      if (coordinator.phase === "released") {
        assert(
          coordinator.links.every((l) => l.finalized),
          "released before every rank finalized",
        );
      }
      cluster.ends.forEach((e, r) => {
        if (e.kind === "finalized") assert(coordinator.links[r]!.finalized, `rank ${r}'s finalize() returned but the coordinator has no result`);
      });
    },
    onLine(line: CommittedLine) {
      checkLine(
        line,
        cluster.size,
        (rank) => atCheckpoint.get(`${rank}/${line.record.epoch}`),
        (m) => net.violations.push(m),
      );
    },
    onRestartAll() {
      appContent.clear();
    },
    atEnd() {
      this.afterStep();
      if (coordinator.phase === "released") {
        cluster.ends.forEach((e, r) => {
          assert(finishedOk(e, coordinator.links[r]!.finalized), `job released but rank ${r} ended ${JSON.stringify(e)}`);
          if (e.kind === "finalized") {
            assert(
              isDeepStrictEqual(e.returned, coordinator.links[r]!.result) || sameDigest(e.returned, coordinator.links[r]!.result),
              `rank ${r}: the coordinator's result differs from what the program returned`,
            );
          }
        });
      }
    },
  };
}

/** Results are compared as plain JSON-ish digests (the codec may turn e.g. Buffer into Uint8Array). */
function sameDigest(a: unknown, b: unknown): boolean {
  return JSON.stringify(a) === JSON.stringify(b);
}

const seqOf = (f: RawFrame): { source: number; seq: number } => ({ source: f.header.readInt32LE(12), seq: f.header.readUInt32LE(20) });

/**
 * A committed line must be a consistent cut with complete channel logs (Chandy and
 * Lamport's conditions in the protocol's terms). With S = what the sender's part says it had
 * sent on s→r at its checkpoint, for every channel s→r:
 * - every late message logged by r was sent before s's checkpoint (seq < S), each logged once,
 *   and the late log is exactly the tail of the channel up to S (contiguous, ending at S - 1);
 * - every early id (received before r's checkpoint, sent after s's) has seq ≥ S, once each;
 * - no orphan: every message held in r's state (undelivered or collective inbox) was sent
 *   before s's checkpoint, or is listed as early (so it is suppressed on re-execution);
 * - where the simulator saw r's checkpoint in a first attempt, counts match exactly: the late
 *   log is [arrived, S) and the early list is [S, arrived).
 */
export function checkLine(
  line: CommittedLine,
  size: number,
  seen: (rank: number) => { attempt: number; arrived: number[] } | undefined,
  fail: (message: string) => void,
): void {
  const epoch = line.record.epoch;
  const parts = line.parts.map((b) => decodeValue(b) as PartView);
  const libs = parts.map((p) => decodeValue(p.lib) as LibState);
  for (let r = 0; r < size; r++) {
    const part = parts[r]!;
    if (part.epoch !== epoch) fail(`line ${epoch}: rank ${r}'s part is of epoch ${part.epoch}`);
    for (let s = 0; s < size; s++) {
      if (s === r) continue;
      const where = `line ${epoch}, channel ${s}→${r}`;
      const sent = libs[s]!.channelSeqOut[r]!;
      const late = part.late
        .map(seqOf)
        .filter((x) => x.source === s)
        .map((x) => x.seq);
      const early = part.early.filter(([src]) => src === s).map(([, seq]) => seq);
      const held = [...libs[r]!.unexpected, ...libs[r]!.collInbox]
        .map(seqOf)
        .filter((x) => x.source === s)
        .map((x) => x.seq);
      if (new Set(late).size !== late.length) fail(`${where}: a late message is logged twice (${late.join(",")})`);
      if (new Set(early).size !== early.length) fail(`${where}: an early id is listed twice (${early.join(",")})`);
      for (const q of late) if (q >= sent) fail(`${where}: late message #${q} was not sent before the sender's checkpoint (sent ${sent})`);
      const sorted = [...late].sort((a, b) => a - b);
      if (sorted.length > 0 && (sorted[sorted.length - 1] !== sent - 1 || sorted[sorted.length - 1]! - sorted[0]! !== sorted.length - 1)) {
        fail(`${where}: the late log ${sorted.join(",")} is not the channel's tail up to #${sent - 1}`);
      }
      for (const q of early) if (q < sent) fail(`${where}: early id #${q} was sent before the sender's checkpoint (sent ${sent})`);
      for (const q of held) {
        if (q >= sent && !early.includes(q))
          fail(`${where}: orphan #${q} held in the receiver's state, sent after the sender's checkpoint and not listed as early`);
        if (sorted.length > 0 && q >= sorted[0]!) fail(`${where}: #${q} held before the checkpoint but late #${sorted[0]} arrived after it`);
      }
      const snap = seen(r);
      if (snap !== undefined && snap.attempt === 0) {
        const got = snap.arrived[s]!;
        const wantLate = Array.from({ length: Math.max(0, sent - got) }, (_, i) => got + i);
        const wantEarly = Array.from({ length: Math.max(0, got - sent) }, (_, i) => sent + i);
        if (sorted.join(",") !== wantLate.join(","))
          fail(`${where}: late log ${sorted.join(",")}, but #${wantLate.join(",")} were in flight (arrived ${got}, sent ${sent})`);
        if ([...early].sort((a, b) => a - b).join(",") !== wantEarly.join(","))
          fail(`${where}: early ids ${early.join(",")}, but #${wantEarly.join(",")} crossed the line backwards (arrived ${got}, sent ${sent})`);
      }
    }
  }
}
