/**
 * The decision that settles a change of the world in `--mode elastic`: from the coordinator's
 * news (who is in the next world, in rank order) and every participant's summary, which
 * checkpoint the new world starts from, and who sends it to whom. Pure; the coordinator's
 * machine (src/launch/elastic-membership.ts) runs it once per round and sends the result to
 * every participant, which applies it ({@link ElasticRank}).
 *
 * Why the coordinator decides, not the ranks among themselves: a round must be superseded
 * when a participant dies in it, and ranks deciding locally could then disagree — some would
 * have applied round k before news k+1 reached them, others would drop it — leaving members
 * whose checkpoints of one version differ (two lineages). With one decider, a round is either
 * decided, and then every live participant applies it (the decision travels on the same FIFO
 * control channel as any later news, so it arrives first), or it is never decided and nobody
 * applied anything of it. So at any news, every participant has applied every earlier decision.
 *
 * Correctness of the rollback target (a member is gone): let R be the smallest `reached` among
 * the new world's members that hold state. (1) Every holder has checkpoint R: it reached at
 * least R, and a rank drops a checkpoint only below its `committed` — the smallest version it
 * knows every member of its world reached — which is at most every member's reached, hence at
 * most R; a holder whose `oldest` is above R joined at a later checkpoint and is treated as a
 * joiner. (2) R is consistent: all holders are in one lineage (see above), and within a lineage
 * checkpoint R is the state after the same R steps of the same worlds, on every rank. (3) No
 * work the new world needs is lost: steps after R are redone by the new world. Every holder's
 * `started` must be true: a rank still in its bootstrap collectives cannot continue in another
 * world (they would run again with other ranks), so the job fails clearly then.
 *
 * Correctness of the grow target (nobody is gone): J = `at` for a replayed change, else one
 * more than the largest `reached`; every rank blocks at its next checkpoint until the decision
 * is there, so no rank passes J before it knows J, and every rank reaches J (the program makes
 * the same checkpoint calls everywhere) unless the job ends first (then the change never
 * happens and the coordinator releases the world before it).
 *
 * The members that keep their own checkpoint are the leading ones that hold it — the members
 * that stay, in their order (the coordinator appends joiners) — and every member after them
 * takes the root's: the same split as a replay of the recorded change, where the kept ranks
 * come first and every new rank gets rank 0's. (Joiners may receive their state in any order,
 * so a later joiner can hold it while an earlier one does not; it takes the root's too.) With
 * no leading holder, the first member that holds it is the root and the others take its.
 *
 * @example
 * const d = decide(news, summaries); // { view, target, root, joiners } or { fail }
 */
import type { LifelineErrorCode } from "../../errors.ts";
import type { Decision, Member, Summary, ViewNews } from "./types.ts";

/** Everyone who answers the news: the next world's members and those that leave with it. */
export function participants(news: ViewNews): Member[] {
  return [...news.members, ...news.leaving];
}

/** The decision on `news`, or why the job cannot go on. `summaries` by slot, one per participant. */
export function decide(news: ViewNews, summaries: ReadonlyMap<number, Summary>): Decision | { fail: { code: LifelineErrorCode; message: string } } {
  const of = (m: Member): Summary => {
    const s = summaries.get(m.slot);
    if (s === undefined) throw new Error(`decide: no summary of slot ${m.slot}`);
    return s;
  };
  const fail = (code: LifelineErrorCode, message: string): { fail: { code: LifelineErrorCode; message: string } } => ({ fail: { code, message } });
  const stateful = news.members.filter((m) => of(m).hasState);
  // A replayed change may keep none of the world before (its worlds at one checkpoint composed):
  // then the first rank that leaves sends the state, as the world before's rank 0 did.
  const leavingRoot = news.rollback ? undefined : news.leaving.find((m) => of(m).hasState);
  if (stateful.length === 0 && leavingRoot === undefined) {
    return fail(
      "CPR_RESTORE",
      `elastic: no rank that holds the job's state is left (every rank of the world before is gone); the ${news.members.length} rank(s) left have nothing to continue from`,
    );
  }
  let target: number;
  let holds: (m: Member) => boolean;
  if (news.rollback) {
    const early = stateful.filter((m) => !of(m).started);
    if (early.length > 0) {
      return fail(
        "CPR_RESTORE",
        `elastic: a rank left while rank slot(s) ${early.map((m) => m.slot).join(", ")} were still in their bootstrap collectives (before restore()); ` +
          "an elastic job can change its world only once every rank has called restore()",
      );
    }
    target = Math.min(...stateful.map((m) => of(m).reached));
    holds = (m) => of(m).hasState && of(m).oldest <= target;
  } else {
    const old = participants(news).filter((m) => of(m).hasState);
    const furthest = Math.max(...old.map((m) => of(m).reached));
    target = news.at ?? furthest + 1;
    if (furthest > target) {
      return fail("CPR_PROTOCOL", `elastic: a rank is at checkpoint ${furthest}, past checkpoint ${target} where the replayed change is due`);
    }
    holds = (m) => of(m).hasState;
  }
  // The members that keep their own checkpoint are the leading ones that hold it (those that
  // stay, in their order); every member after the first that lacks it takes the root's, as a
  // replay of the change gives every rank after the kept ones the root's (see the file comment).
  let kept = 0;
  while (kept < news.members.length && holds(news.members[kept]!)) kept++;
  const root = kept > 0 ? news.members[0] : (news.members.find(holds) ?? leavingRoot);
  if (root === undefined) return fail("CPR_RESTORE", `elastic: no rank of world ${news.id} holds checkpoint ${target}`);
  const joiners = news.members.filter((m, i) => i >= kept && m !== root);
  return { view: news.id, target, root: root.slot, joiners: joiners.map((m) => m.slot) };
}
