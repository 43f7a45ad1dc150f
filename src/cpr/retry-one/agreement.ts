/**
 * Agreement on "who needs what" after a failure (Rabit's ActionSummary consensus), as one pure
 * function of the N round summaries.
 *
 * ## Why this is equivalent to Rabit's ActionSummary, and cheaper
 *
 * Rabit runs an allreduce of an ActionSummary (flags checkpoint-ack > checkpoint >
 * load-checkpoint > load-cache > normal, plus min/max seqno) before *every* collective and
 * checkpoint, failures or not, then acts on the reduced value. Two observations:
 *
 * 1. Without a failure since the last agreement, ranks are in lockstep on collectives: every
 *    rank makes the same collective calls in the same order (MPI's rule, checked on the wire by
 *    each collective's signature), so the reduced summary would always say "normal, min = max".
 *    Lifeline's coordinator tells every survivor about every failure (`peer-down`/`peer-up`),
 *    so a rank *knows* when lockstep may be broken. We therefore run rounds only from a view
 *    change until the round that finds every rank at the same collective ("proceed"); the
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
 * - load-checkpoint: a restarted rank at restore() gets its newest checkpoint that a live
 *   holder keeps (with the determinants logged after it, the global from a rank that kept its
 *   own of that version, the collective results from the checkpoint's collective index on,
 *   and the bootstrap cache) in one go; if no rank kept that global yet, it restores without
 *   it (its restored sender log may be what the others need to reach that checkpoint) and
 *   gets it in a later round, from the first survivor that keeps its own;
 * - load-cache: a rank at a bootstrap collective whose key some rank holds gets the whole
 *   cache it lacks (so later bootstrap calls, in any order, need no round);
 * - the ranks behind others on collectives (Rabit's "requester = min seqno") are served every
 *   result the furthest survivor holds, and replay them locally (identity-checked per call);
 * - normal: all ranks at the same collective with nothing to serve → `proceed` (run it on
 *   the wire).
 * Checkpoints are not part of the agreement: each rank's checkpoint is its own (independent
 *   checkpointing), safe once its successors hold it; sender-based message logging makes any
 *   rank's safe checkpoint a correct restart point without rolling anyone else back.
 *
 * Ranks that are not at a sync point (computing, in point-to-point calls, in a checkpoint)
 * answer rounds with a `run` position. They cannot be waited for in a round, so a round with
 * nothing to move and a running rank decides `wait`: the ranks at sync points wait until
 * some rank's position changes (it reaches a sync point and starts the next round).
 *
 * Progress: a `plan` always moves some rank forward (a restore, or at least one result or
 * cache entry), and results and cache entries are finite, so rounds end in `proceed`, `wait`
 * or `fail`. When every rank is at a sync point and none can serve another, nobody can ever
 * move: that is reported (`fail`), never waited on.
 *
 * Safety of the restore choice: a rank's checkpoint v at collective index c is *safe* once
 * every successor holds it and every rank has done the collectives before c; only then does
 * it broadcast `stored(v)`, and only after that do peers drop what older checkpoints needed
 * (messages it consumed before v, its older checkpoints and determinants, results below every
 * rank's safe index). A restarted rank restores the newest safe checkpoint any live rank
 * knows of. That is a complete restart point: its state, the determinants after it (every
 * successor acknowledged each one before anything depending on it left the rank), the
 * messages it received after it (in their senders' logs) and the results of the collectives
 * after c (in the buffers of the ranks that did them). And no rank can need a result that
 * only the failed rank had: every rank had done the collectives before c, and the results
 * after c are kept by every rank that did them until every rank's safe checkpoint is past
 * them. (A checkpoint that outran a collective some rank had not finished — its result held
 * by the failed rank alone — is never restored: the simulator found that case.)
 *
 * @example
 * const d = decide(summaries, { size: 4, replicas: 2 });
 * if (d.kind === "proceed") execute(d.pos, d.wireSeq);
 */
import type { LifelineErrorCode } from "../../errors.ts";
import { describePosition, type HeldVersion, type Position, sameIdentity, type Summary } from "./types.ts";

export type Transfer =
  /** Results from collective `fromIndex` on, all that `from` holds. */
  | { readonly kind: "results"; readonly from: number; readonly to: number; readonly fromIndex: number }
  | { readonly kind: "cache"; readonly from: number; readonly to: number; readonly keys: readonly string[] }
  /** `to`'s checkpoint `version` (0: the program's start) and its determinants after it. */
  | { readonly kind: "restore"; readonly from: number; readonly to: number; readonly version: number }
  /** `from`'s own global of its checkpoint `version`, for `to`'s restore. */
  | { readonly kind: "global"; readonly from: number; readonly to: number; readonly version: number }
  /** Everything `from` holds of `owner`, for the restarted `to` to hold again (it is one of owner's successors). */
  | { readonly kind: "held"; readonly from: number; readonly to: number; readonly owner: number };

export type Decision =
  | { readonly kind: "fail"; readonly code: LifelineErrorCode; readonly message: string }
  /**
   * The transfers run; then every rank at a sync point agrees again. `waitAfter`: a rank is
   * (or will be, once restored) without its checkpoint's global, which no live rank keeps yet;
   * as after a `wait`, a rank whose position or version changes starts the next round, so that
   * the first to reach that checkpoint hands the global on even if nobody reaches a sync point
   * (a program of point-to-point calls only).
   */
  | { readonly kind: "plan"; readonly transfers: readonly Transfer[]; readonly waitAfter?: true }
  /** Everyone is at `pos`: run it normally, as wire collective `wireSeq`. */
  | { readonly kind: "proceed"; readonly pos: Position; readonly wireSeq: number }
  /** Nothing to move and some rank is running: wait for a rank's position to change. */
  | { readonly kind: "wait" };

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

type Fail = Extract<Decision, { kind: "fail" }>;
const fail = (code: LifelineErrorCode, message: string): Fail => ({ kind: "fail", code, message });

/** A candidate restart point of a restarted rank: a checkpoint version and the rank that holds it. */
interface Candidate {
  readonly from: number;
  readonly held: HeldVersion;
  readonly detTo: number;
}

/**
 * The round's decision, the same on every rank for the same N summaries (ordered by rank).
 * Fails with `CPR_LOST` (a checkpoint or logged outcomes lost beyond the replicas, every rank
 * restarted), `CPR_RESTORE` (a restarted rank skipping restore(), a global that differs), `CPR_REPLAY` (ranks at different sync points that
 * nobody can serve), `MPI_COLLECTIVE_MISMATCH` (same point, different collective),
 * `CPR_PROTOCOL` (a bug: results a rank needs were dropped).
 */
export function decide(all: readonly Summary[], opts: DecideOptions): Decision {
  const { size } = opts;
  if (all.length !== size || all.some((s, i) => s.rank !== i)) {
    return fail("CPR_PROTOCOL", `agreement round with ${all.length} summaries for ${size} ranks`);
  }
  const survivors = all.filter((s) => !s.restoring);
  const restoring = all.filter((s) => s.restoring);
  if (survivors.length === 0) {
    // Never a silent restart from the beginning (Rabit's behaviour when too many die).
    return fail(
      "CPR_LOST",
      `all ${size} ranks were restarted and no rank kept its memory: the in-memory checkpoints, logs and results are lost and retry-one cannot recover them`,
    );
  }
  for (const f of restoring) {
    if (f.pos.kind !== "restore" && f.pos.kind !== "boot" && f.pos.kind !== "run") {
      return fail(
        "CPR_RESTORE",
        `rank ${f.rank} was restarted and called ${describePosition(f.pos)} before restore(); in retry-one mode a program must call restore() before its main loop (only bootstrap collectives may come before it)`,
      );
    }
  }

  const transfers: Transfer[] = [];
  /** Some rank restored (or restoring) without its global waits for a survivor to reach that checkpoint. */
  let waiting = false;
  /** The survivor holding the most results from `index` on (lowest rank on ties), if any holds more. */
  const resultServer = (index: number, exclude: number): number | undefined | "dropped" => {
    let best: Summary | undefined;
    let dropped = false;
    for (const s of survivors) {
      if (s.rank === exclude || s.bufTo <= index) continue;
      if (s.bufFrom > index) {
        dropped = true;
        continue;
      }
      if (best === undefined || s.bufTo > best.bufTo) best = s;
    }
    if (best === undefined && dropped) return "dropped";
    return best?.rank;
  };
  const pushResults = (to: number, index: number): Decision | undefined => {
    const server = resultServer(index, to);
    if (server === "dropped") {
      return fail("CPR_PROTOCOL", `rank ${to} needs the collective results from #${index} on, but every rank holding later ones dropped them`);
    }
    if (server !== undefined) transfers.push({ kind: "results", from: server, to, fromIndex: index });
    return undefined;
  };
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
    if (f.pos.kind !== "restore") continue;
    const chosen = restartPoint(f.rank, all, opts);
    if ("code" in chosen) return chosen;
    // Its global may still be missing (no rank kept it yet): it restores all the same, and gets
    // the global in a later round (awaitsGlobal, below). Waiting for the global before the
    // restore could wait forever: its peers may need the messages of its restored sender log
    // to reach that checkpoint and keep the global.
    transfers.push({ kind: "restore", from: chosen.from, to: f.rank, version: chosen.held.version });
    if (chosen.global !== undefined) transfers.push({ kind: "global", from: chosen.global, to: f.rank, version: chosen.held.version });
    else if (chosen.held.key !== null) waiting = true;
    // Every result a survivor keeps, not only those after f's checkpoint: f keeps them as the
    // others do, since another rank restarting from an older checkpoint may need them.
    const server = bufferServer(chosen.held.index, survivors);
    if (server === "dropped")
      return fail("CPR_PROTOCOL", `rank ${f.rank} needs the collective results from #${chosen.held.index} on, but every rank holding later ones dropped them`);
    if (server !== undefined) transfers.push({ kind: "results", from: server, to: f.rank, fromIndex: 0 });
    pushCache(f);
    // Coverage back at once: what f held of its predecessors comes from another holder (the
    // predecessor pushes it too when it can, but it may be down itself).
    for (const p of predecessors(f.rank, opts)) {
      const h = bestHolder(p, all, f.rank);
      if (h !== undefined) transfers.push({ kind: "held", from: h, to: f.rank, owner: p });
    }
  }

  // A rank restored without its checkpoint's global: from a rank that keeps its own of that
  // checkpoint, else wait for one that has not reached it yet.
  for (const s of survivors) {
    const need = s.awaitsGlobal;
    if (need === undefined) continue;
    const g = globalOwner(need, all, s.rank);
    if (g !== undefined) transfers.push({ kind: "global", from: g, to: s.rank, version: need.version });
    else if (someoneReaches(need.version, all, s.rank)) waiting = true;
    else return noGlobal(s.rank, need.version);
  }

  // Ranks behind others on collectives: serve them what the others completed.
  for (const s of survivors) {
    if (s.pos.kind === "coll") {
      const r = pushResults(s.rank, s.pos.index);
      if (r !== undefined) return r;
    } else if (s.pos.kind === "boot") {
      if (cacheHolder(s.pos.key, s.rank)) pushCache(s);
    }
  }
  if (transfers.length > 0) return waiting ? { kind: "plan", transfers, waitAfter: true } : { kind: "plan", transfers };

  // Nothing to move. A running rank cannot be waited for here: wait for positions to change.
  if (waiting || all.some((s) => s.pos.kind === "run")) return { kind: "wait" };

  // normal: everyone must stand at the same point.
  const first = all[0]!.pos;
  for (const s of all) {
    if (!samePoint(first, s.pos)) {
      const where = all.map((x) => `rank ${x.rank}: ${describePosition(x.pos)}`).join("; ");
      return fail(
        "CPR_REPLAY",
        `ranks cannot proceed together and none holds what another needs (${where}); after a restart the program must repeat the same collective calls and bootstrap keys`,
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

/**
 * The checkpoint a restarted rank `f` restores: its newest *safe* one, as any live rank knows
 * it (a checkpoint is safe once every successor holds it and every rank has done the
 * collectives before it; only then did anyone drop what older checkpoints needed), from a
 * holder that keeps it, preferring the one with the most determinants. Version 0 (the
 * program's start) when none was ever safe, from a holder that kept the determinants since
 * the start.
 */
function restartPoint(f: number, all: readonly Summary[], opts: DecideOptions): (Candidate & { readonly global: number | undefined }) | Fail {
  const target = restartTarget(f, all);
  const candidates: Candidate[] = [];
  for (const s of all) {
    if (s.rank === f) continue;
    const h = s.holds.find((x) => x.owner === f);
    if (h === undefined) continue;
    if (target === 0) {
      if (h.detFrom === 0) candidates.push({ from: s.rank, held: { version: 0, index: 0, key: null, detCount: 0 }, detTo: h.detTo });
      continue;
    }
    const v = h.versions.find((x) => x.version === target);
    if (v !== undefined && h.detFrom <= v.detCount) candidates.push({ from: s.rank, held: v, detTo: h.detTo });
  }
  // The most determinants first; then ring order after f (deterministic).
  const ringDistance = (r: number): number => (r - f + opts.size) % opts.size;
  candidates.sort((a, b) => b.detTo - a.detTo || ringDistance(a.from) - ringDistance(b.from));
  // Never checkpointed and never logged an outcome (as every rank that could know says):
  // the program's start is a complete restart point, whoever gives it.
  if (candidates.length === 0 && target === 0 && !all.some((s) => s.rank !== f && s.logsKnown.includes(f))) {
    const giver = all.find((s) => s.rank !== f && !s.restoring);
    if (giver !== undefined) candidates.push({ from: giver.rank, held: { version: 0, index: 0, key: null, detCount: 0 }, detTo: 0 });
  }
  const c = candidates[0];
  if (c !== undefined) {
    if (c.held.key === null) return { ...c, global: undefined };
    const g = globalOwner(c.held, all, f);
    if (g !== undefined) return { ...c, global: g };
    // A rank that has not called that checkpoint yet will keep its global when it does:
    // restore without it (the rank then awaits it, see decide).
    if (someoneReaches(c.held.version, all, f)) return { ...c, global: undefined };
    return noGlobal(f, c.held.version);
  }
  const holders = successors(f, opts).join(", ");
  return fail(
    "CPR_LOST",
    target > 0
      ? `rank ${f}'s checkpoint ${target} is lost: it and every rank holding a replica of it (${holders}) failed before it could be restored; more failures than --replicas ${opts.replicas} can cover`
      : `rank ${f}'s logged outcomes are lost: it and every rank holding them (${holders || "none: --replicas 0"}) failed; more failures than --replicas ${opts.replicas} can cover`,
  );
}

/**
 * The survivor whose buffer covers `index` and reaches furthest (the lowest start on ties), if
 * any survivor holds results; "dropped" if results after `index` exist but none covers it.
 */
function bufferServer(index: number, survivors: readonly Summary[]): number | undefined | "dropped" {
  let best: Summary | undefined;
  let dropped = false;
  for (const s of survivors) {
    if (s.bufTo <= s.bufFrom) continue;
    if (s.bufFrom > index) {
      dropped ||= s.bufTo > index;
      continue;
    }
    if (best === undefined || s.bufTo > best.bufTo || (s.bufTo === best.bufTo && s.bufFrom < best.bufFrom)) best = s;
  }
  if (best === undefined && dropped) return "dropped";
  return best?.rank;
}

/** The rank (not `exclude`, not the owner) holding the most of `owner`'s data: newest checkpoint, then most determinants. */
function bestHolder(owner: number, all: readonly Summary[], exclude: number): number | undefined {
  let best: { rank: number; version: number; detTo: number } | undefined;
  for (const s of all) {
    if (s.rank === exclude || s.rank === owner) continue;
    const h = s.holds.find((x) => x.owner === owner);
    if (h === undefined) continue;
    const version = Math.max(0, ...h.versions.map((v) => v.version));
    if (best === undefined || version > best.version || (version === best.version && h.detTo > best.detTo)) best = { rank: s.rank, version, detTo: h.detTo };
  }
  return best?.rank;
}

/** The checkpoint version restarted rank `f` restores: its newest that a live rank knows to be safe (0: the program's start). */
function restartTarget(f: number, all: readonly Summary[]): number {
  return Math.max(0, ...all.filter((s) => s.rank !== f).map((s) => s.knownSafe[f] ?? 0));
}

/**
 * Some rank other than `f` will still call checkpoint `version`, and keep its own global of it
 * then: a survivor not there yet, or a restarted rank that restores an older checkpoint and
 * runs through that one again (the global is the same on every rank at the same checkpoint).
 * Without the second, ranks that all lost that global would give up although a rank going
 * through that checkpoint again is about to make it anew (the simulator found that case).
 */
function someoneReaches(version: number, all: readonly Summary[], f: number): boolean {
  return all.some((s) => s.rank !== f && (s.restoring ? restartTarget(s.rank, all) < version : s.version < version));
}

/** Nobody keeps `f`'s global of checkpoint `version`, and every rank is past that checkpoint or restores it. */
function noGlobal(f: number, version: number): Fail {
  return fail(
    "CPR_RESTORE",
    `rank ${f}'s checkpoint ${version} is held, but no rank kept the global of its own checkpoint ${version} with the same content; the global must be identical on every rank at the same checkpoint (pass it only then)`,
  );
}

/** A rank other than `f`, not restoring, that kept its own global of `held.version` with the same key. */
function globalOwner(held: Pick<HeldVersion, "version" | "key">, all: readonly Summary[], f: number): number | undefined {
  for (const s of all) {
    if (s.rank === f || s.restoring) continue;
    if (s.globals.some((g) => g.version === held.version && g.key === held.key)) return s.rank;
  }
  return undefined;
}

/** The same program point (identity aside, which is checked separately for a clear error). */
function samePoint(a: Position, b: Position): boolean {
  switch (a.kind) {
    case "boot":
      return b.kind === "boot" && a.key === b.key;
    case "restore":
      return b.kind === "restore";
    case "coll":
      return b.kind === "coll" && a.index === b.index;
    case "final":
      return b.kind === "final" && a.index === b.index;
    case "run":
      return false;
  }
}
