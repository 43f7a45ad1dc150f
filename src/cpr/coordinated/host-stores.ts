/**
 * A rank's stores on its host's disk, for coordinated checkpointing: its own part store
 * (`<store>/rank-<r>`), and — for per-host stores (src/store/partners.ts) — the copies it keeps
 * of its partners' parts (`<store>/held-by-<r>/rank-<of>`) and its copy of the commit records
 * (`<store>/replica-<r>/manifest`). Each is a database of its own that only this rank's process
 * writes (LevelDB admits one process per database), so ranks sharing a host, or a directory on
 * a shared filesystem, never contend. Every store of its own is opened on first use, once.
 *
 * Before the table of a start of all ranks, one rank per host reads the whole host's store for
 * the launcher ({@link HostStores.scan}, {@link HostStores.read}): other ranks' databases too
 * (ranks placed elsewhere now, or gone with their host), opened read-only for the moment and
 * closed again before any table goes out, so their owners can open them afterwards. The hosts
 * are asked one after the other: on a store directory that several hosts share, one host's
 * scan then finds the databases another's ranks hold locked, and leaves them to that host.
 *
 * @example
 * const stores = rankStores("/var/tmp/heat", 2);
 * const world = await World.join(place, { cpr: coordinatedHook(stores.open, { hostStores: stores.hostStores }) });
 */
import { readdir } from "node:fs/promises";
import { join } from "node:path";
import { isLifelineError, LifelineError } from "../../errors.ts";
import type { PartRefWire } from "../../mpi/control.ts";
import { LevelRecoveryStore } from "../../store/level-store.ts";
import type { LineManifest, RankPartStore } from "../../store/types.ts";
import type { HostStores } from "./driver.ts";

/** A database of the store, as `cpr-held` names it. */
const WHERE_RE = /^(?:held-by-(\d+)\/)?rank-(\d+)$/;

export function rankStores(store: string, rank: number): { open: () => Promise<RankPartStore>; hostStores: HostStores } {
  let own: Promise<RankPartStore> | undefined;
  let replica: Promise<LineManifest> | undefined;
  const held = new Map<number, Promise<RankPartStore>>();
  const heldRoot = new LevelRecoveryStore(join(store, `held-by-${rank}`));
  // A failed open is not kept: the next use tries again.
  const open = (): Promise<RankPartStore> =>
    (own ??= new LevelRecoveryStore(store).openRank(rank).catch((err: unknown) => {
      own = undefined;
      throw err;
    }));
  const heldOf = (of: number): Promise<RankPartStore> => {
    let s = held.get(of);
    if (s === undefined) {
      s = heldRoot.openRank(of);
      s.catch(() => held.delete(of));
      held.set(of, s);
    }
    return s;
  };

  /** Runs `fn` on database `where`: this rank's own handles, or another's opened read-only for it. */
  const withStore = async <T>(where: string, fn: (s: RankPartStore) => Promise<T>): Promise<T> => {
    const m = WHERE_RE.exec(where);
    if (m === null)
      throw new LifelineError("CPR_RESTORE", `rank ${rank}: ${JSON.stringify(where)} is not a database of the store (rank-N or held-by-P/rank-N)`);
    const holder = m[1] === undefined ? undefined : Number(m[1]);
    const of = Number(m[2]);
    if (holder === undefined && of === rank) return fn(await open());
    if (holder === rank) return fn(await heldOf(of));
    const base = holder === undefined ? store : join(store, `held-by-${holder}`);
    const s = await new LevelRecoveryStore(base, { readOnly: true }).openRank(of);
    try {
      return await fn(s);
    } finally {
      await s.close();
    }
  };

  const verified = (where: string): Promise<{ ref: PartRefWire; where: string }[]> =>
    withStore(where, async (s) => {
      const out: { ref: PartRefWire; where: string }[] = [];
      for (const p of await s.listParts()) {
        const ref = { rank: p.rank, epoch: p.epoch, checksum: p.checksum, bytes: p.bytes };
        if ((await s.checkPart(ref)).kind === "ok") out.push({ ref, where });
      }
      return out;
    });

  return {
    open,
    hostStores: {
      held: heldOf,
      heldRanks: () => heldRoot.ranks(),
      replica: () => (replica ??= new LevelRecoveryStore(join(store, `replica-${rank}`)).openManifest()),
      async scan() {
        const out: { ref: PartRefWire; where: string }[] = [];
        const problems: string[] = [];
        const add = async (where: string): Promise<void> => {
          try {
            out.push(...(await verified(where)));
          } catch (err) {
            // Locked: a live rank of this job holds it (the store is shared by several hosts,
            // whose ranks are asked one after the other), and that rank's host reported it.
            if (!isLifelineError(err, "STORE_LOCKED")) problems.push(`${where}: ${(err as Error).message}`);
          }
        };
        for (const r of await new LevelRecoveryStore(store).ranks()) await add(`rank-${r}`);
        for (const dir of (await readdir(store)).filter((n) => /^held-by-\d+$/.test(n)).sort()) {
          for (const r of await new LevelRecoveryStore(join(store, dir)).ranks()) await add(`${dir}/rank-${r}`);
        }
        return { parts: out, problems };
      },
      read: (where, ref) => withStore(where, (s) => s.readPart(ref)),
      async close() {
        for (const s of held.values())
          await s.then(
            (x) => x.close(),
            () => undefined,
          );
        await replica?.then(
          (m) => m.close(),
          () => undefined,
        );
      },
    },
  };
}
