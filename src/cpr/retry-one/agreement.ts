/**
 * Agreement on "who needs what" after a failure (Rabit's ActionSummary consensus),
 * as one pure function of the N round summaries.
 *
 * ## Why this is equivalent to Rabit's ActionSummary, and cheaper
 *
 * Rabit runs an allreduce of an ActionSummary (flags checkpoint-ack > checkpoint >
 * load-checkpoint > load-cache > normal, plus min/max seqno) before *every* collective and
 * checkpoint, failures or not, then acts on the reduced value. Two observations:
 *
 * 1. Without a failure since the last agreement, ranks are in lockstep: every rank makes the
 *    same collective calls in the same order (MPI's rule, checked on the wire by each
 *    collective's signature), so the reduced summary would always say "normal, min = max".
 *    Lifeline's coordinator tells every survivor about every failure (`peer-down`/`peer-up`),
 *    so a rank *knows* when lockstep may be broken. We therefore run rounds only from a view
 *    change until the round that finds every rank at the same point ("proceed"); the
 *    failure-free path has no agreement traffic at all (0 extra messages per collective,
 *    where Rabit pays one extra allreduce: ×2 on small messages).
 * 2. In a round every rank receives every summary (an all-to-all of a few dozen bytes each;
 *    rounds are rare). The reduced ActionSummary is a function of the multiset of summaries,
 *    so a rank holding all of them can compute it, and everything else Rabit's routing
 *    rounds compute (who holds what), in one step and without further messages. Every rank
 *    evaluates the same deterministic `decide` on the same input, so all reach the same
 *    decision without a leader.
 *
 * Rabit's priorities map onto this function's steps:
 * - checkpoint-ack: a survivor that committed version C* proves every rank's state of C* is
 *   at its replicas (it heard `stored` from all), so every rank waiting at checkpoint C*
 *   commits too (`commit`), before anything else is decided;
 * - checkpoint: ranks at a checkpoint with the others behind wait; the ones behind are served
 *   results first (they have the lower seqno: Rabit's "requester = min seqno");
 * - load-checkpoint: a restarted rank at restore() gets the newest committed version C*
 *   from a live holder of its state (and the global, the results of version C* and the
 *   bootstrap cache) in one go;
 * - load-cache: a rank at a bootstrap collective whose key some rank holds gets the whole
 *   cache it lacks (so later bootstrap calls, in any order, need no round);
 * - normal: all ranks at the same point with nothing to serve → `proceed` (run it on the
 *   wire; for a checkpoint, the replica/stored protocol).
 * One deviation, on purpose: a result transfer carries *all* held results from the
 * requester's seqno on, not one, so a restarted rank replays a whole version locally
 * (identity-checked per call) instead of paying one round per repeated collective.
 *
 * Progress: a `plan` always moves some rank forward (a commit, a restore, or at least one
 * result or cache entry), and results and cache entries are finite, so rounds end in
 * `proceed` or `fail`. When every rank is blocked and none can serve another, nobody can
 * ever move: that is reported (`fail`), never waited on.
 *
 * Safety of the restore version: a checkpoint C* is committed only after every rank's state
 * of C* is stored at its successors, and a rank drops version C*-1 (states, results) only
 * after it committed C*. If some survivor committed C*, every survivor has passed all
 * collectives of C*-1, so nobody needs them; if none did, every survivor still holds version
 * C*-1 in full. Restoring C* = max committed over survivors is therefore always possible
 * when a live holder exists, and always sufficient.
 *
 * @example
 * const d = decide(summaries, { size: 4, replicas: 2 });
 * if (d.kind === "proceed") execute(d.pos, d.wireSeq);
 */
import type { LifelineErrorCode } from "../../errors.ts";
import { describePosition, type Position, sameIdentity, type Summary } from "./types.ts";

export type Transfer =
  /** Results of `version` from `fromSeqno` on, all that `from` holds. */
  | { readonly kind: "results"; readonly from: number; readonly to: number; readonly version: number; readonly fromSeqno: number }
  | { readonly kind: "cache"; readonly from: number; readonly to: number; readonly keys: readonly string[] }
  /** `to`'s own state and the global of `version` (0: the program's start, nothing). */
  | { readonly kind: "restore"; readonly from: number; readonly to: number; readonly version: number }
  /** `owner`'s state of `version`, for `to` to hold as a replica. */
  | { readonly kind: "replica"; readonly from: number; readonly to: number; readonly owner: number; readonly version: number };

export type Decision =
  | { readonly kind: "fail"; readonly code: LifelineErrorCode; readonly message: string }
  /** Ranks at checkpoint `commit - 1 → commit` commit it; then the transfers run. */
  | { readonly kind: "plan"; readonly commit: number | null; readonly transfers: readonly Transfer[] }
  /** Everyone is at `pos`: run it normally, as wire collective `wireSeq`. */
  | { readonly kind: "proceed"; readonly pos: Position; readonly wireSeq: number };

export interface DecideOptions {
  readonly size: number;
  /** Ring successors that hold each rank's state (already capped at size-1). */
  readonly replicas: number;
  /**
   * The host of each rank (an index; ranks with equal values share a host), when the job
   * spans hosts: a rank's replicas go to ranks on other hosts first, so that losing one host
   * loses no checkpoint. Fixed for the job's lifetime (the placement at its start), so every
   * rank, also a restarted one, computes the same holders.
   */
  readonly groups?: readonly number[] | undefined;
}

/**
 * The ranks that hold `rank`'s state: the next `replicas` ranks in ring order after it — those
 * on other hosts (by `groups`) before those on its own.
 *
 * @example
 * successors(3, { size: 4, replicas: 2 });                        // → [0, 1]
 * successors(0, { size: 4, replicas: 1, groups: [0, 0, 1, 1] });  // → [2]: rank 1 shares host 0
 */
export function successors(rank: number, opts: DecideOptions): number[] {
  const ring: number[] = [];
  for (let i = 1; i < opts.size; i++) ring.push((rank + i) % opts.size);
  const groups = opts.groups;
  const ordered = groups === undefined ? ring : [...ring.filter((r) => groups[r] !== groups[rank]), ...ring.filter((r) => groups[r] === groups[rank])];
  return ordered.slice(0, opts.replicas);
}

/**
 * The ranks whose states `rank` holds (those whose {@link successors} include it), nearest
 * first backwards around the ring. Without `groups`: its `replicas` ring predecessors.
 *
 * @example
 * predecessors(0, { size: 4, replicas: 2 }); // → [3, 2]
 */
export function predecessors(rank: number, opts: DecideOptions): number[] {
  const out: number[] = [];
  for (let i = 1; i < opts.size; i++) {
    const p = (rank - i + opts.size) % opts.size;
    if (successors(p, opts).includes(rank)) out.push(p);
  }
  return out;
}

const fail = (code: LifelineErrorCode, message: string): Decision => ({ kind: "fail", code, message });

/**
 * The round's decision, the same on every rank for the same N summaries (ordered by rank).
 * Fails with `CPR_RESTORE` (a checkpoint lost beyond the replicas, every rank restarted, a
 * restarted rank skipping restore()), `CPR_REPLAY` (ranks at different points that nobody
 * can serve), `MPI_COLLECTIVE_MISMATCH` (same point, different collective), `CPR_PROTOCOL`
 * (ranks more than one checkpoint apart: a bug).
 */
export function decide(all: readonly Summary[], opts: DecideOptions): Decision {
  const { size } = opts;
  if (all.length !== size || all.some((s, i) => s.rank !== i)) {
    return fail("CPR_PROTOCOL", `agreement round with ${all.length} summaries for ${size} ranks`);
  }
  const survivors = all.filter((s) => !s.restoring);
  const restoring = all.filter((s) => s.restoring);
  if (survivors.length === 0) {
    // Never a silent restart from version 0 (Rabit's behaviour when too many die).
    return fail(
      "CPR_RESTORE",
      `all ${size} ranks were restarted and no rank kept its memory: the in-memory checkpoints and results are lost and retry-one cannot recover (it never restarts silently from the beginning); use --mode cpr for disk-backed recovery lines`,
    );
  }
  for (const f of restoring) {
    if (f.pos.kind !== "restore" && f.pos.kind !== "boot") {
      return fail(
        "CPR_RESTORE",
        `rank ${f.rank} was restarted and called ${describePosition(f.pos)} before restore(); in retry-one mode a program must call restore() before its main loop (only bootstrap collectives may come before it)`,
      );
    }
  }

  // checkpoint-ack: a survivor that committed C* proves C* complete (it heard `stored` from all).
  const cStar = Math.max(...survivors.map((s) => s.committed));
  let commit: number | null = null;
  const committing = new Set<number>();
  for (const s of survivors) {
    if (s.committed === cStar) continue;
    if (s.committed === cStar - 1 && s.pos.kind === "ckpt" && s.pos.version === cStar - 1) {
      commit = cStar;
      committing.add(s.rank);
      continue;
    }
    return fail(
      "CPR_PROTOCOL",
      `rank ${s.rank} has committed version ${s.committed} and is at ${describePosition(s.pos)}, but another rank committed version ${cStar}; ranks drifted more than one checkpoint apart`,
    );
  }
  const holds = (s: Summary, owner: number, version: number): boolean => s.holds.some((h) => h.owner === owner && h.version === version);
  /** The first live holder of (owner, version) in ring order after the owner. */
  const holderOf = (owner: number, version: number, exclude: number): number | undefined => {
    for (let i = 0; i < size; i++) {
      const r = (owner + i) % size;
      const s = all[r]!;
      if (r !== exclude && !s.restoring && holds(s, owner, version)) return r;
    }
    return undefined;
  };
  /** The survivor with the most results of `version` beyond `seqno` (lowest rank on ties). */
  const resultServer = (version: number, seqno: number, exclude: number): number | undefined => {
    let best: Summary | undefined;
    for (const s of survivors) {
      if (s.rank === exclude || committing.has(s.rank) || s.bufVersion !== version || s.bufCount <= seqno) continue;
      if (best === undefined || s.bufCount > best.bufCount) best = s;
    }
    return best?.rank;
  };
  const transfers: Transfer[] = [];
  /**
   * Every bootstrap key some rank holds and `to` lacks, grouped by the first holder. A
   * restarted rank that has not restored yet may hold keys too: it ran or received them in
   * this incarnation, so they are as good as anyone's.
   */
  const pushCache = (to: Summary): void => {
    const have = new Set(to.cacheKeys);
    const bySource = new Map<number, string[]>();
    for (const s of all) {
      if (s.rank === to.rank) continue;
      for (const k of s.cacheKeys) {
        if (have.has(k)) continue;
        have.add(k);
        const list = bySource.get(s.rank) ?? [];
        list.push(k);
        bySource.set(s.rank, list);
      }
    }
    for (const [from, keys] of bySource) transfers.push({ kind: "cache", from, to: to.rank, keys });
  };
  const cacheHolder = (key: string, exclude: number): boolean => all.some((s) => s.rank !== exclude && s.cacheKeys.includes(key));

  // load-checkpoint and load-cache for restarted ranks.
  for (const f of restoring) {
    if (f.pos.kind === "boot") {
      if (cacheHolder(f.pos.key, f.rank)) pushCache(f);
      continue;
    }
    const version = cStar;
    let from: number | undefined;
    if (version > 0) {
      from = holderOf(f.rank, version, f.rank);
      if (from === undefined) {
        const holders = successors(f.rank, opts).join(", ");
        return fail(
          "CPR_RESTORE",
          `rank ${f.rank}'s checkpoint of version ${version} is lost: it and every rank holding a replica of it (${holders}) failed before it could be restored; more failures than --replicas ${opts.replicas} can cover (retry-one keeps checkpoints only in memory; use --mode cpr or more replicas)`,
        );
      }
    } else {
      // Before the first checkpoint the "checkpoint" is the program's start: nothing to copy.
      from = survivors[0]!.rank;
    }
    transfers.push({ kind: "restore", from, to: f.rank, version });
    const rs = resultServer(version, 0, f.rank);
    if (rs !== undefined) transfers.push({ kind: "results", from: rs, to: f.rank, version, fromSeqno: 0 });
    pushCache(f);
    if (version > 0) {
      for (const p of predecessors(f.rank, opts)) {
        if (p === f.rank) continue;
        const h = holderOf(p, version, f.rank);
        if (h !== undefined) transfers.push({ kind: "replica", from: h, to: f.rank, owner: p, version });
      }
    }
  }

  // Ranks behind others: serve them what the others completed.
  for (const s of survivors) {
    if (committing.has(s.rank)) continue;
    if (s.pos.kind === "coll") {
      const from = resultServer(s.pos.version, s.pos.seqno, s.rank);
      if (from !== undefined) transfers.push({ kind: "results", from, to: s.rank, version: s.pos.version, fromSeqno: s.pos.seqno });
    } else if (s.pos.kind === "boot") {
      if (cacheHolder(s.pos.key, s.rank)) pushCache(s);
    }
  }
  if (commit !== null || transfers.length > 0) return { kind: "plan", commit, transfers };

  // normal: nothing to move, so everyone must stand at the same point.
  const first = all[0]!.pos;
  for (const s of all) {
    if (!samePoint(first, s.pos)) {
      const where = all.map((x) => `rank ${x.rank}: ${describePosition(x.pos)}`).join("; ");
      return fail(
        "CPR_REPLAY",
        `ranks cannot proceed together and none holds what another needs (${where}); after a restart the program must repeat the same collective calls, checkpoints and bootstrap keys`,
      );
    }
  }
  for (const s of all) {
    const p = s.pos;
    if ((p.kind === "coll" || p.kind === "boot") && first.kind === p.kind && !sameIdentity(first.ident, p.ident)) {
      return fail(
        "MPI_COLLECTIVE_MISMATCH",
        `at ${describePosition(first)} rank ${s.rank} called ${describePosition(p)}; every rank must make the same collective calls in the same order`,
      );
    }
  }
  return { kind: "proceed", pos: first, wireSeq: Math.max(...all.map((s) => s.wireSeq)) };
}

/** The same program point (identity aside, which is checked separately for a clear error). */
function samePoint(a: Position, b: Position): boolean {
  switch (a.kind) {
    case "boot":
      return b.kind === "boot" && a.key === b.key;
    case "restore":
      return b.kind === "restore";
    case "coll":
      return b.kind === "coll" && a.version === b.version && a.seqno === b.seqno;
    case "ckpt":
      return b.kind === "ckpt" && a.version === b.version && a.count === b.count;
    case "final":
      return b.kind === "final" && a.version === b.version && a.count === b.count;
  }
}
