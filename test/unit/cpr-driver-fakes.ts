/**
 * What the cpr driver's unit tests give it in place of World: a protocol frame's header, a
 * Host whose timers never fire (a test that counts armed timers passes its own `after`),
 * per-host stores whose copies go to the store `held` gives, and whole ranks ({@link fakeRank}):
 * a driver whose protocol frames are held for the test to deliver, through the codec as on the
 * wire, and whose stores record what was put.
 *
 * @example
 * driver.onProtocol(protocolHeader(1, PROTO_CPR_MARKER), { epoch: 1, sent: 0 });
 * const host = fakeHost();
 */
import { CoordinatedDriver, type HostStores, type PartStoreLike, PROTO_CPR_COUNT, PROTO_CPR_MARKER } from "../../src/cpr/coordinated/driver.ts";
import { decodeValue, encodeValue } from "../../src/mpi/codec.ts";
import type { RankToCoordinator } from "../../src/mpi/control.ts";
import type { CprWorldAccess } from "../../src/mpi/cpr-hook.ts";
import { crc32 } from "../../src/store/checksum.ts";
import type { Host, Timer } from "../../src/mpi/host.ts";
import { Kind, type Header } from "../../src/mpi/wire.ts";

export function protocolHeader(source: number, tag: number): Header {
  return { kind: Kind.protocol, flags: 0, encoding: 0, source, dest: 0, tag, epoch: 0, channelSeq: 0, key: 0, attempt: 0, bodyBytes: 0 } as unknown as Header;
}

export function fakeHost(after: () => Timer = () => ({ stop: () => undefined })): Host {
  return {
    now: () => 0,
    defer: (fn: () => void) => void queueMicrotask(fn),
    every: (): Timer => ({ stop: () => undefined }),
    after,
    exit: () => undefined,
    warn: () => undefined,
    pid: 1,
  } as unknown as Host;
}

export function fakeHostStores(held: (of: number) => Promise<PartStoreLike>): HostStores {
  return {
    held,
    heldRanks: async () => [],
    replica: async () => {
      throw new Error("not used");
    },
    scan: async () => ({ parts: [], problems: [] }),
    read: async () => Buffer.alloc(0),
    close: async () => undefined,
  };
}

/** A protocol frame a fake rank sent, held for delivery. */
export interface Sent {
  dest: number;
  tag: number;
  body: unknown;
  /** The body's encoded size: what crossed the network. */
  bytes: number;
  /** The body as the driver handed it over: a real transport reads its arrays later, in place. */
  given: unknown;
}

/**
 * Rank `rank` of `size`: its driver, the control messages it sent, its protocol frames (held),
 * its own parts (`own`, by epoch: pass another rank's map to restore from it) and the copies
 * it keeps for partners (`held`). `partner` makes the stores per-host ones. `writeLater`: its
 * stores read a part's bytes a tick after putPart is called, as a file write does.
 */
export function fakeRank(
  rank: number,
  opts: { size?: number; partner?: number; own?: Map<number, Buffer>; maxMessageBytes?: number; writeLater?: boolean } = {},
) {
  const size = opts.size ?? 2;
  const controls: RankToCoordinator[] = [];
  const out: Sent[] = [];
  const access: CprWorldAccess = {
    rank,
    size,
    attempt: 0,
    captureLibState: () => ({ channelSeqOut: new Array<number>(size).fill(0) }) as never,
    restoreLibState: () => undefined,
    inject: () => undefined,
    // As the wire does: the receiver sees decoded copies, never the sender's objects.
    sendProtocol: (dest, tag, body) => {
      const enc = encodeValue(body);
      out.push({ dest, tag, body: decodeValue(enc), bytes: enc.byteLength, given: body });
    },
    ...(opts.maxMessageBytes === undefined ? {} : { maxMessageBytes: opts.maxMessageBytes }),
    sendControl: (msg) => void controls.push(msg),
    fatal: (code, message) => {
      throw new Error(`${code}: ${message}`);
    },
  };
  const store = (into: Map<number, Buffer>): PartStoreLike => ({
    putPart: async (epoch, bytes) => {
      // writeLater: the bytes are read a little later, as a file write reads them.
      if (opts.writeLater === true) await settle();
      const whole = Buffer.concat(bytes instanceof Uint8Array ? [bytes] : bytes);
      into.set(epoch, whole);
      return { rank, epoch, checksum: crc32(whole), bytes: whole.length };
    },
    readPart: async (ref) => into.get(ref.epoch)!,
    retain: async () => [],
    dropParts: async () => [],
    close: async () => undefined,
  });
  const own = opts.own ?? new Map<number, Buffer>();
  const held = new Map<number, Buffer>();
  const hostStores = opts.partner === undefined ? undefined : fakeHostStores(async () => store(held));
  const driver = new CoordinatedDriver(access, fakeHost(), async () => store(own), hostStores === undefined ? {} : { hostStores });
  const zeros = new Array<number>(size).fill(0);
  const table = { t: "table", keysIn: zeros, keysOut: zeros, endpoints: [], attempts: zeros, partner: opts.partner } as never;
  /** The table of a restart from line `epoch`, this rank's part of it in `own`. */
  const restoreTable = (epoch: number) => {
    const bytes = own.get(epoch)!;
    return { ...(table as object), restore: { epoch, ref: { rank, epoch, checksum: crc32(bytes), bytes: bytes.length } } } as never;
  };
  return { rank, size, driver, controls, out, own, held, table, restoreTable };
}

export type FakeRank = ReturnType<typeof fakeRank>;

/** Delivers `from`'s held frames with `tag` to `to` (all of them, in order), removing them. */
export function deliver(from: FakeRank, to: FakeRank, tag: number): Sent[] {
  const taken = from.out.filter((s) => s.tag === tag && s.dest === to.rank);
  from.out.splice(0, from.out.length, ...from.out.filter((s) => !taken.includes(s)));
  for (const s of taken) to.driver.onProtocol(protocolHeader(from.rank, s.tag), s.body);
  return taken;
}

export const settle = (): Promise<void> => new Promise((r) => setTimeout(r, 5));

/**
 * Rank `a` is asked for checkpoint `epoch` and hears that its peers' next checkpoint() call has
 * the same count as its own, so it takes it one call later (see {@link takeCheckpoint}).
 */
export function requestCheckpoint(a: FakeRank, epoch: number): void {
  a.driver.onControl({ t: "cpr-checkpoint", epoch });
  const own = a.out.find((s) => s.tag === PROTO_CPR_COUNT && (s.body as { epoch: number }).epoch === epoch);
  a.out.splice(0, a.out.length, ...a.out.filter((s) => s.tag !== PROTO_CPR_COUNT));
  const next = (own?.body as { next: number } | undefined)?.next ?? 1;
  for (let r = 0; r < a.size; r++) if (r !== a.rank) a.driver.onProtocol(protocolHeader(r, PROTO_CPR_COUNT), { epoch, next });
}

/** Rank `a`'s checkpoint() calls with `state` (and `global`) until one takes the checkpoint asked for; how many it made. */
export function takeCheckpoint(a: FakeRank, state: unknown, global?: unknown): number {
  const epoch = a.driver.epoch;
  for (let calls = 1; calls <= 3; calls++) {
    a.driver.checkpoint(state, global, () => undefined);
    if (a.driver.epoch !== epoch) return calls;
  }
  throw new Error(`rank ${a.rank} took no checkpoint in 3 calls`);
}

/** Rank `a` takes checkpoint `epoch` of `state` (and `global`) and writes its part (its peers' markers came, the round stopped). */
export async function round(a: FakeRank, epoch: number, state: unknown, global?: unknown): Promise<void> {
  requestCheckpoint(a, epoch);
  takeCheckpoint(a, state, global);
  for (let r = 0; r < a.size; r++) if (r !== a.rank) a.driver.onProtocol(protocolHeader(r, PROTO_CPR_MARKER), { epoch, sent: 0 });
  a.driver.onControl({ t: "cpr-stop", epoch });
  await settle();
}
