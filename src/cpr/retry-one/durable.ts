/**
 * Retry-one's durable floor: each rank writes some of its own checkpoints to the store, and the
 * launcher restarts every rank from a *consistent* set of them when failures exceed what the
 * in-memory replicas cover (or resumes the job from one after the launcher is gone).
 *
 * Each rank checkpoints on its own, so the ranks' newest durable checkpoints need not fit
 * together. A set of checkpoints, one per rank (or a rank's program start), is a consistent
 * restart point for *every* rank at once when, for every pair of ranks s ≠ r:
 * - no orphan: r consumed no message of s that s had not sent at its checkpoint
 *   (`consumed_r[s] ≤ sent_s[r]`), since s's re-execution might send another one in its place;
 * - nothing in flight is lost: the messages s sent r that r had not consumed
 *   (`consumed_r[s] ≤ appSeq < sent_s[r]`) are in s's sender log, which is part of s's
 *   checkpoint (`logFrom_s[r] ≤ consumed_r[s]`): after the restart s sends them again;
 * - and all ranks stand at the same collective (their collectives re-run on the wire together;
 *   nobody keeps results across a restart of all).
 * Everyone restarts, so nothing needs replaying: non-deterministic outcomes may come out
 * differently, as after any restart of the whole job.
 *
 * {@link newestConsistentLine} finds the newest such set by rollback (the classic
 * recovery-line computation for independent checkpoints): start from each rank's newest
 * checkpoint; while a condition fails, move the rank that the condition forces back (the
 * orphan's receiver, the sender whose log lacks the messages, the ranks past the lowest
 * collective) to its previous checkpoint. Each condition, once it fails, fails for every set
 * at or above the current one in that rank's position, so the fixpoint is the newest
 * consistent set; it exists since the program's start (nothing sent, consumed, logged) is one.
 *
 * @example
 * const versions = newestConsistentLine(partsByRank, 4); // e.g. [6, 0, 3, 3]; 0 = the rank's start
 */

/** What the launcher records of one durable checkpoint (all counts per peer rank). */
export interface DurableMeta {
  readonly version: number;
  /** Collectives done before it. */
  readonly index: number;
  /** Per destination, application messages sent before it. */
  readonly sent: readonly number[];
  /** Per source, application messages consumed before it. */
  readonly consumed: readonly number[];
  /** Per destination, the first message its sender log still holds (= sent when it holds none). */
  readonly logFrom: readonly number[];
}

/** A rank's program start as a restart point: nothing done, sent, consumed or logged. */
export function startMeta(size: number): DurableMeta {
  const zeros = new Array<number>(size).fill(0);
  return { version: 0, index: 0, sent: zeros, consumed: zeros, logFrom: zeros };
}

/**
 * Per rank, the version of the newest consistent set of its durable checkpoints
 * (`candidates[r]`, oldest first; the program's start is always a candidate below them).
 * 0 means the rank restarts from its program's start.
 */
export function newestConsistentLine(candidates: readonly (readonly DurableMeta[])[], size: number): number[] {
  if (candidates.length !== size) throw new RangeError(`candidates for ${candidates.length} ranks, expected ${size}`);
  const start = startMeta(size);
  // Per rank, the position in its candidates (-1: its start).
  const at = candidates.map((c) => c.length - 1);
  const meta = (r: number): DurableMeta => (at[r]! < 0 ? start : candidates[r]![at[r]!]!);
  const back = (r: number): boolean => {
    if (at[r]! < 0) throw new Error(`durable line: rank ${r} cannot go back past its start (the start must be consistent)`);
    at[r]!--;
    return true;
  };
  for (let changed = true; changed;) {
    changed = false;
    const low = Math.min(...at.map((_, r) => meta(r).index));
    for (let r = 0; r < size; r++) while (meta(r).index > low) changed = back(r);
    for (let s = 0; s < size && !changed; s++) {
      for (let r = 0; r < size && !changed; r++) {
        if (s === r) continue;
        const ms = meta(s);
        const mr = meta(r);
        if ((mr.consumed[s] ?? 0) > (ms.sent[r] ?? 0)) changed = back(r);
        else if ((ms.logFrom[r] ?? 0) > (mr.consumed[s] ?? 0)) changed = back(s);
      }
    }
  }
  return at.map((_, r) => meta(r).version);
}

/** A durable checkpoint the launcher heard of: its counts, where it is, when it was reported. */
export interface DurableCandidate<Ref> {
  readonly meta: DurableMeta;
  readonly ref: Ref;
  readonly atMs: number;
}

/** The newest consistent set of candidates, one per rank (each rank's `versions[r]`, all past their start). */
export interface DurableChoice<Ref> {
  readonly versions: number[];
  readonly chosen: DurableCandidate<Ref>[];
  /** The collective index every chosen checkpoint stands at. */
  readonly index: number;
}

/**
 * The launcher's side of the durable floor, without I/O: the durable checkpoints each rank
 * reported that a newer line may still use, and the newest consistent set of them that is not
 * the last line yet. The restart policy (src/launch/retry-one-policy.ts) and the simulator
 * both commit what {@link next} gives them to their line manifest.
 *
 * @example
 * const floor = new DurableCandidates<PartRef>(4);
 * floor.add(2, meta, ref, performance.now());
 * const line = floor.next(); // undefined until every rank has a checkpoint in a consistent set
 * if (line !== undefined) { await commit(line); floor.committed(line.versions); }
 */
export class DurableCandidates<Ref> {
  private lists: DurableCandidate<Ref>[][];
  /** The versions of the newest line (committed, or restarted from). */
  private last: readonly number[] | undefined;

  constructor(private readonly size: number) {
    this.lists = Array.from({ length: size }, () => []);
  }

  /**
   * Rank `rank`'s durable checkpoint. A version at or below one already known belongs to an
   * execution given up since (the rank restarted from an older checkpoint): those go.
   */
  add(rank: number, meta: DurableMeta, ref: Ref, atMs: number): void {
    const list = this.lists[rank];
    if (list === undefined) throw new RangeError(`durable checkpoint of rank ${rank}, outside 0..${this.size - 1}`);
    while (list.length > 0 && list[list.length - 1]!.meta.version >= meta.version) list.pop();
    list.push({ meta, ref, atMs });
  }

  /** The newest consistent set if it is a line (no rank at its start) newer than the last. */
  next(): DurableChoice<Ref> | undefined {
    const versions = newestConsistentLine(
      this.lists.map((l) => l.map((c) => c.meta)),
      this.size,
    );
    if (versions.some((v) => v === 0)) return undefined;
    const last = this.last;
    if (last !== undefined && versions.every((v, r) => v === last[r])) return undefined;
    const chosen = versions.map((v, r) => this.lists[r]!.find((c) => c.meta.version === v)!);
    return { versions, chosen, index: chosen[0]!.meta.index };
  }

  /**
   * `versions` is a line now. Candidates older than it can never be part of a newer one: the
   * newest consistent set only moves forward while the ranks run on.
   */
  committed(versions: readonly number[]): void {
    this.last = [...versions];
    this.lists = this.lists.map((l, r) => l.filter((c) => c.meta.version >= versions[r]!));
  }

  /**
   * Every rank restarts from the line `versions` (undefined: from the start): what the dead
   * execution reported is not part of the new one.
   */
  restarted(versions: readonly number[] | undefined): void {
    this.last = versions === undefined ? undefined : [...versions];
    this.lists = this.lists.map(() => []);
  }
}
