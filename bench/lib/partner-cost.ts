/**
 * What a partner copy costs a checkpoint (`npm run bench -- --hosts --only partner`): the
 * recovery program (bench/programs/recovery.ts) under `--mode cpr` on 4 ranks across two test
 * hosts (ranks 0-1 on host 1, 2-3 on host 2), its store on each host's own disk, with
 * `--store-scope host` (each part written locally and copied to a partner rank on the other
 * host before it counts) against `--store-scope shared` on the same directories (the local
 * write alone; nothing fails in these runs, so nothing reads the store across hosts). Runs
 * alternate between the two, the first of each pair rotating.
 *
 * Measured from the launcher's `line-committed` events: the duration of each line (the
 * initiator's request → its commit record durable), which is what a checkpoint costs the job
 * beyond its compute, and the line's bytes. The ratio host / shared of the median durations is
 * the figure (target ≤ 1.3).
 *
 * @example
 * const r = await partnerCostRun({ cluster, hostfile, root, dir, name: "p-host-0", scope: "host", globalMib: 32, localMib: 1, steps: 60, stepMs: 20 });
 */
import path from "node:path";
import { onJsonLines } from "../../src/testing/json-lines.ts";
import { netnsRshAgent, type TestCluster } from "../../src/testing/netns.ts";
import { spawnChild } from "./procs.ts";
import { recoveryProgram } from "./recovery.ts";
import { median } from "./stats.ts";

export interface PartnerCostConfig {
  readonly cluster: TestCluster;
  /** Two hosts with 2 slots each. */
  readonly hostfile: string;
  readonly root: string;
  readonly name: string;
  readonly scope: "host" | "shared";
  readonly globalMib: number;
  readonly localMib: number;
  readonly steps: number;
  readonly stepMs: number;
  readonly timeoutMs?: number;
}

export interface PartnerCostRun {
  readonly scope: "host" | "shared";
  readonly lines: number;
  /** Median line duration (request → commit durable), ms. */
  readonly lineMs: number;
  /** Median bytes of a line (all ranks' parts; the copies not counted). */
  readonly lineBytes: number;
}

export async function partnerCostRun(c: PartnerCostConfig): Promise<PartnerCostRun> {
  const argv = [
    process.execPath,
    path.join(c.root, "dist", "cli.js"),
    "run",
    "--json",
    "-n",
    "4",
    "--mode",
    "cpr",
    "--checkpoint-every",
    "5steps",
    "--store-scope",
    c.scope,
    "--store",
    path.join(c.cluster.diskPath, c.name),
    "--bind",
    c.cluster.hosts[0]!.address,
    "--hostfile",
    c.hostfile,
    "--rsh",
    netnsRshAgent,
    ...recoveryProgram({ ...c, failStep: c.steps + 1 }),
  ];
  const { command, args } = c.cluster.wrap(0, argv, c.root);
  const child = spawnChild(c.name, command, args, { cwd: c.root, env: { ...process.env, ...c.cluster.agentEnv } });
  const lines: { durationMs: number; bytes: number }[] = [];
  onJsonLines(child.proc.stderr!, (ev) => {
    if (ev.event === "line-committed") lines.push({ durationMs: ev.durationMs as number, bytes: ev.bytes as number });
  });
  const timer = setTimeout(() => void child.kill(), c.timeoutMs ?? 180_000);
  const status = await child.exited;
  clearTimeout(timer);
  if (status.code !== 0) throw new Error(`partner cost run ${c.name} (${c.scope}): exit ${status.code}\n${child.tail()}`);
  if (lines.length < 2)
    throw new Error(`partner cost run ${c.name} (${c.scope}): only ${lines.length} line(s) committed; run longer (--steps)\n${child.tail()}`);
  // The first line is taken while the ranks still warm up; it is left out.
  const steady = lines.slice(1);
  return { scope: c.scope, lines: lines.length, lineMs: median(steady.map((l) => l.durationMs)), lineBytes: median(steady.map((l) => l.bytes)) };
}

/** The summary table: median over runs of each scope's median line duration, and the ratio. */
export function renderPartnerTable(runs: readonly PartnerCostRun[], title: string): string {
  const of = (scope: "host" | "shared"): PartnerCostRun[] => runs.filter((r) => r.scope === scope);
  const host = of("host");
  const shared = of("shared");
  if (host.length === 0 || shared.length === 0) return `${title}\n\n(no complete pair of runs)\n`;
  const h = median(host.map((r) => r.lineMs));
  const s = median(shared.map((r) => r.lineMs));
  const mib = median(runs.map((r) => r.lineBytes)) / 2 ** 20;
  const ratio = h / s;
  return [
    title,
    "",
    "| store scope | runs | line (median of runs' medians) | line size |",
    "|---|---|---|---|",
    `| shared (local write alone) | ${shared.length} | ${s.toFixed(0)} ms | ${mib.toFixed(1)} MiB |`,
    `| host (+ copy to a partner on the other host) | ${host.length} | ${h.toFixed(0)} ms | ${mib.toFixed(1)} MiB |`,
    "",
    `Partner copy: ${ratio.toFixed(2)}x the local write alone (target <= 1.3: ${ratio <= 1.3 ? "met" : "NOT met"}).`,
    "",
  ].join("\n");
}
