// Goal: the collective registry fails a collective's pending and later receives when the
// collective fails, matches messages filed before or after their receive, remembers the
// signatures of the last HISTORY_MAX finished collectives (for peers' queries and stray
// messages), and forgets older ones. Method: drive the registry directly with made-up frames.
import { describe, expect, it } from "vitest";
import { LifelineError } from "../../src/errors.ts";
import { CollectiveRegistry, HISTORY_MAX } from "../../src/mpi/coll-registry.ts";
import type { Arrival } from "../../src/mpi/collectives.ts";
import { Encoding, type Header, Kind } from "../../src/mpi/wire.ts";

function arrival(source: number, collSeq: number, signature: number, epoch = 0): Arrival {
  const header: Header = {
    kind: Kind.collective,
    flags: 0,
    encoding: Encoding.none,
    key: 0,
    source,
    tag: 0,
    channelSeq: 0,
    epoch,
    collSeq,
    signature,
    arrayType: 0,
    attempt: 0,
  };
  return { header, frames: [Buffer.alloc(4)] };
}

describe("CollectiveRegistry", () => {
  it("delivers a message filed before its receive, and one that arrives after it", async () => {
    const reg = new CollectiveRegistry(0);
    const c = reg.begin(7, "bcast(root=1)", 0);
    expect(reg.arrive(arrival(1, c.seq, 7), 0)).toBeUndefined();
    expect(reg.filedBytes).toBe(4);
    await expect(reg.recv(c, 1, 0)).resolves.toMatchObject({ header: { source: 1 } });
    expect(reg.filedBytes).toBe(0);
    const later = reg.recv(c, 2, 1);
    expect(reg.arrive(arrival(2, c.seq, 7), 1)).toBeUndefined();
    await expect(later).resolves.toMatchObject({ header: { source: 2 } });
    reg.end(c);
    expect(reg.activeCount).toBe(0);
  });

  it("a failed collective rejects its waiting receive and every later one with the first error", async () => {
    const reg = new CollectiveRegistry(0);
    const c = reg.begin(7, "allreduce(sum)", 0);
    const waiting = reg.recv(c, 1, 0);
    const first = new LifelineError("MPI_COLLECTIVE_MISMATCH", "first");
    c.fail(first);
    c.fail(new LifelineError("MPI_ABORTED", "second"));
    await expect(waiting).rejects.toBe(first);
    await expect(reg.recv(c, 2, 0)).rejects.toBe(first);
    // Another collective's receive is not touched.
    const d = reg.begin(8, "barrier()", 0);
    const other = reg.recv(d, 1, 0);
    reg.arrive(arrival(1, d.seq, 8), 0);
    await expect(other).resolves.toMatchObject({ header: { collSeq: d.seq } });
  });

  it("a message with another signature fails the receive as a mismatch", async () => {
    const reg = new CollectiveRegistry(0);
    const c = reg.begin(7, "bcast(root=0)", 0);
    const r = reg.recv(c, 1, 0);
    reg.arrive(arrival(1, c.seq, 99), 0);
    await expect(r).rejects.toMatchObject({ code: "MPI_COLLECTIVE_MISMATCH" });
  });

  it("abandon rejects the pending receives and drops the collective's filed messages", async () => {
    const reg = new CollectiveRegistry(0);
    reg.supersede = true;
    const c = reg.begin(7, "allreduce(sum)", 0);
    reg.arrive(arrival(2, c.seq, 7), 1);
    const waiting = reg.recv(c, 1, 0);
    const why = new Error("abandoned");
    reg.abandon(c.seq, why);
    await expect(waiting).rejects.toBe(why);
    expect(reg.filedBytes).toBe(0);
    expect(reg.activeCount).toBe(0);
  });

  it("remembers the signatures of the last HISTORY_MAX collectives, and names them in a stray's error", () => {
    const reg = new CollectiveRegistry(0);
    const n = HISTORY_MAX + 10;
    for (let i = 0; i < n; i++) reg.end(reg.begin(1000 + i, `bcast(root=${i})`, 0));
    expect(reg.signatureOf(n - 1)).toEqual({ signature: 1000 + n - 1, call: `bcast(root=${n - 1})` });
    expect(reg.signatureOf(n - HISTORY_MAX)).toEqual({ signature: 1000 + n - HISTORY_MAX, call: `bcast(root=${n - HISTORY_MAX})` });
    expect(reg.signatureOf(n - HISTORY_MAX - 1)).toBeUndefined();
    expect(reg.signatureOf(n)).toBeUndefined(); // not reached yet
    expect(reg.signatureOf(-1)).toBeUndefined();
    expect(reg.signatureOf(1.5)).toBeUndefined();
    expect(reg.arrive(arrival(3, n - 2, 1), 0)?.message).toContain(`bcast(root=${n - 2})`);
    expect(reg.arrive(arrival(3, 2, 1), 0)?.message).toContain("a message that the collective on rank 0 does not use");
  });

  it("reset forgets the history and numbering", () => {
    const reg = new CollectiveRegistry(0);
    reg.end(reg.begin(5, "barrier()", 0));
    reg.reset(new Error("new world"));
    expect(reg.signatureOf(0)).toBeUndefined();
    expect(reg.started).toBe(0);
  });
});
