/**
 * What the cpr driver's unit tests give it in place of World: a protocol frame's header, a
 * Host whose timers never fire (a test that counts armed timers passes its own `after`), and
 * per-host stores whose copies go to the store `held` gives.
 *
 * @example
 * driver.onProtocol(protocolHeader(1, PROTO_CPR_MARKER), { epoch: 1, sent: 0 });
 * const host = fakeHost();
 */
import type { HostStores, PartStoreLike } from "../../src/cpr/coordinated/driver.ts";
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
