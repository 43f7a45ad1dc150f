/**
 * `lifeline drill --mode elastic`: a faulty run's results differ from a fault-free run of the
 * first world's size (its world changed), so its reference is the fault-free replay of the
 * changes it went through (`--replay`): the same worlds from the same checkpoints, entered
 * without a fault. For each of `--repeat` runs: the faulty run (the `--kill` faults; its
 * results file records the changes), then that replay, compared bit for bit. A drill with a
 * random kill first runs the program once without faults, to place the kills within its steps.
 *
 * @example
 * const outcome = await runElasticDrill(resolveDrillConfig({ np: "4", mode: "elastic", kill: ["1@step:20"], app, appArgs: [] }, { cwd }), io);
 */
import { basename } from "node:path";
import type { PlannedChange } from "./elastic-membership.ts";
import { describeTrigger, type ReferenceShape } from "./drill-spec.ts";
import { describeFault, describeVerdict, differenceLines, verdictOf, type DrillRun } from "./drill-report.ts";
import {
  closeDrill,
  faultsOfRun,
  type DrillConfig,
  type DrillIo,
  type DrillOutcome,
  DrillOutput,
  executeRun,
  faultJson,
  finishDrill,
  referenceShape,
} from "./drill.ts";

export async function runElasticDrill(config: DrillConfig, io: DrillIo): Promise<DrillOutcome> {
  const out = new DrillOutput(config, io.stderr);
  const base = config.run;
  const elastic = base.elastic!;
  const runs: DrillRun[] = [];
  const finish = (pass: boolean, exitCode: number, summary: string): Promise<DrillOutcome> => finishDrill(config, out, runs, pass, exitCode, summary);
  out.info(
    `${basename(base.app)} on ${elastic.initial} rank${elastic.initial === 1 ? "" : "s"} (mode elastic): ${config.repeat} faulty run${config.repeat === 1 ? "" : "s"}, ` +
      `each compared with the fault-free replay of the changes of the world it went through · seed ${config.seed}`,
  );
  out.json({
    event: "drill-starting",
    app: base.app,
    size: elastic.initial,
    mode: base.mode,
    seed: config.seed,
    repeat: config.repeat,
    kills: config.kills.map((k) => k.text),
  });

  // Random kills are placed within what a fault-free run did.
  let shape: ReferenceShape | undefined;
  if (config.kills.some((k) => k.kind === "random")) {
    out.info("run 0 (fault-free, to place the random kills): starting");
    const clean = await executeRun(
      { ...base, resultsPath: undefined },
      { index: 0, label: "fault-free", mode: base.mode, seed: undefined, faults: [] },
      config,
      io,
      out,
    );
    runs.push(clean);
    if (!clean.result.ok)
      return finish(false, 1, `the fault-free run failed, so the kills cannot be placed: ${clean.result.error?.message.split("\n")[0] ?? ""}`);
    shape = referenceShape(clean.events, base.size);
  }

  for (let k = 0; k < config.repeat; k++) {
    const planned = faultsOfRun(config, k, shape);
    if ("problem" in planned) return finish(false, 1, planned.problem);
    const { seed, faults, perRank } = planned;
    const label = config.repeat === 1 ? "faulty run" : `faulty run ${k + 1}/${config.repeat}`;
    out.info(
      `run ${2 * k + 1} (${label}, seed ${seed}): ${faults.map((f) => `fault ${f.index}: rank ${f.rank} @ ${describeTrigger(f.trigger)}`).join("; ") || "no faults"}`,
    );
    const faulty = await executeRun(
      { ...base, faults: perRank, resultsPath: undefined },
      { index: 2 * k + 1, label, mode: base.mode, seed, faults },
      config,
      io,
      out,
    );
    for (const r of faulty.faultReports) out.detail(describeFault(r));
    runs.push(faulty);
    if (faulty.result.error?.code === "LAUNCH_INTERRUPTED") return finish(false, faulty.result.exitCode, "drill interrupted");
    const changes = (faulty.result.recovery?.changes ?? []) as PlannedChange[];
    out.info(
      `run ${2 * k + 1}: ${faulty.result.ok ? `finished on ${faulty.result.results.length} ranks; changes of the world: ${describeChanges(changes)}` : "failed"}`,
    );

    // Its reference: the same changes, without a fault.
    const slots = elastic.initial + changes.reduce((n, c) => n + c.joined, 0);
    const replay = await executeRun(
      { ...base, size: slots, faults: new Array<string>(slots).fill(""), resultsPath: undefined, elastic: { ...elastic, plan: changes } },
      { index: 2 * k + 2, label: `replay of run ${2 * k + 1}`, mode: base.mode, seed: undefined, faults: [] },
      config,
      io,
      out,
    );
    runs.push(replay);
    if (replay.result.error?.code === "LAUNCH_INTERRUPTED") return finish(false, replay.result.exitCode, "drill interrupted");
    if (!replay.result.ok) {
      faulty.verdict = { kind: "failed", message: `its replay failed: ${replay.result.error?.message.split("\n")[0] ?? `exit ${replay.result.exitCode}`}` };
    } else {
      faulty.verdict = verdictOf(faulty, replay.result.results);
    }
    const size = faulty.result.results.length;
    out.runVerdict(2 * k + 1, describeVerdict(faulty.verdict, size).replace("the reference", "its replay"), faulty.verdict.kind === "identical");
    if (faulty.verdict.kind === "differs") for (const l of differenceLines(replay.result.results, faulty.result.results, faulty.verdict.ranks)) out.detail(l);
    out.json({ event: "drill-run-finished", run: 2 * k + 1, seed, verdict: faulty.verdict, changes, faults: faulty.faultReports.map(faultJson) });
  }

  return closeDrill(
    finish,
    runs.filter((r) => r.verdict !== undefined),
    { same: "the fault-free replay of their changes of the world", against: "its replay", missed: "match their replay" },
  );
}

/** "4 → 3 at checkpoint 19; 3 → 4 at 40", or "none". */
function describeChanges(changes: readonly PlannedChange[]): string {
  if (changes.length === 0) return "none";
  return changes.map((c) => `${c.size} → ${c.keep.length + c.joined} at checkpoint ${c.at}`).join("; ");
}
