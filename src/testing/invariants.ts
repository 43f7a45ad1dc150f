/**
 * Safety properties of a simulated run, checked after every step (not once at the end), so a
 * failure points at the event that broke it.
 *
 * Network level (checked inside the network as it delivers): FIFO and exactly-once per
 * channel, nothing delivered to or from a dead node, a dead node runs no code.
 * Communicator level (here): every data frame's header names its real sender and incarnation
 * and numbers the channel's application and collective messages 0, 1, 2, … with no gap and no
 * repeat; the receive path never throws; the coordinator sees at most one finalize per rank
 * and releases only when all have finalized; at the end, a released job has every rank
 * finalized with the result the coordinator recorded.
 *
 * @example
 * const inv = clusterInvariants(cluster);
 * inv.afterStep(); // throws AssertionError naming the broken property
 */
import assert from "node:assert/strict";
import { isDeepStrictEqual } from "node:util";
import { decodeHeader, type Header, Kind } from "../mpi/wire.ts";
import type { SimCluster } from "./sim-cluster.ts";
import type { DataDelivery } from "./sim-network.ts";

export interface ClusterInvariants {
  afterStep(): void;
  atEnd(): void;
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
  const onData = (d: DataDelivery): void => {
    const src = parseRankNode(d.src);
    const dst = parseRankNode(d.dst);
    let h: Header;
    try {
      h = decodeHeader(d.frames[0], { jobKey: coordinator.jobKey, size: cluster.size });
    } catch (err) {
      return net.violation(`${d.src} sent ${d.dst} a frame with a bad header: ${(err as Error).message}`);
    }
    if (h.source !== src.rank) net.violation(`${d.src} sent a frame claiming source ${h.source}`);
    if (h.attempt !== src.attempt) net.violation(`${d.src} sent a frame claiming attempt ${h.attempt}`);
    if (h.kind === Kind.protocol) return;
    const key = `${d.src}>${dst.rank}`;
    const want = expectSeq.get(key) ?? 0;
    if (h.channelSeq !== want) {
      net.violation(`channel ${d.src}→rank ${dst.rank}: message numbered #${h.channelSeq} arrived where #${want} was next (a message lost, repeated or numbered out of order)`);
    }
    expectSeq.set(key, want + 1);
  };
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
        assert(coordinator.links.every((l) => l.finalized), "released before every rank finalized");
      }
      cluster.ends.forEach((e, r) => {
        if (e.kind === "finalized") assert(coordinator.links[r]!.finalized, `rank ${r}'s finalize() returned but the coordinator has no result`);
      });
    },
    atEnd() {
      this.afterStep();
      if (coordinator.phase === "released") {
        cluster.ends.forEach((e, r) => {
          assert.equal(e.kind, "finalized", `job released but rank ${r} ended ${JSON.stringify(e)}`);
          if (e.kind === "finalized") {
            assert(isDeepStrictEqual(e.returned, coordinator.links[r]!.result) || sameDigest(e.returned, coordinator.links[r]!.result),
              `rank ${r}: the coordinator's result differs from what the program returned`);
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
