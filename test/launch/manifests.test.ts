/**
 * Goal: the deployment examples in docs/ are valid as shipped: the Kubernetes manifest
 * (docs/kubernetes/lifeline-job.yaml) against the Kubernetes API schemas, offline (kubectl's
 * dry run needs an API server), and consistent with itself and with the CLI (ranks, port,
 * mode, store); the Slurm batch script (docs/slurm/lifeline.sbatch) is valid bash and uses
 * only options `lifeline coordinator` has.
 *
 * Method: every YAML document is built into its kubernetes-models class and validated (types,
 * required fields, enums); the coordinator's command line goes through the CLI's own option
 * parsing; the batch script through `bash -n` and `lifeline coordinator --help`.
 */
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Job } from "kubernetes-models/batch/v1/Job";
import { PersistentVolumeClaim } from "kubernetes-models/v1/PersistentVolumeClaim";
import { Service } from "kubernetes-models/v1/Service";
import { afterAll, describe, expect, it } from "vitest";
import { parseAllDocuments } from "yaml";
import { main } from "../../src/cli.ts";
import { RANK_INITIAL_OLD_SPACE_MIB, RANK_MALLOC_TUNABLES } from "../../src/launch/rank-process.ts";
import { makeJobKeys, writeKeyDir } from "../../src/mpi/keys.ts";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const tempDir = mkdtempSync(join(tmpdir(), "lifeline-manifests-"));
afterAll(() => rmSync(tempDir, { recursive: true, force: true }));
type Doc = { apiVersion: string; kind: string; metadata: { name: string }; spec: Record<string, unknown> };

function manifest(): Doc[] {
  const docs = parseAllDocuments(readFileSync(join(ROOT, "docs/kubernetes/lifeline-job.yaml"), "utf8"));
  for (const d of docs) expect(d.errors, String(d.errors)).toEqual([]);
  return docs.map((d) => d.toJS() as Doc);
}

describe("docs/kubernetes/lifeline-job.yaml", () => {
  it("every object validates against the Kubernetes API schemas", () => {
    const docs = manifest();
    expect(docs.map((d) => `${d.apiVersion} ${d.kind}`)).toEqual(["v1 Service", "v1 PersistentVolumeClaim", "batch/v1 Job", "batch/v1 Job"]);
    for (const d of docs) {
      const model = d.kind === "Service" ? new Service(d) : d.kind === "PersistentVolumeClaim" ? new PersistentVolumeClaim(d) : new Job(d as never);
      expect(() => model.validate(), `${d.kind} ${d.metadata.name}`).not.toThrow();
    }
  });

  it("the ranks, the coordinator and the service agree (size, port, mode, store, keys), and the coordinator's command line parses", async () => {
    const [service, , coordinator, ranks] = manifest() as [Doc, Doc, Doc, Doc];
    type Mount = { name: string; mountPath: string; readOnly?: boolean };
    type Volume = { name: string; secret?: { secretName: string; defaultMode: number; items: { key: string; path: string }[] } };
    const pod = (job: Doc) =>
      (
        job.spec.template as {
          spec: {
            containers: { command: string[]; env?: { name: string; value: string }[]; volumeMounts: Mount[] }[];
            subdomain?: string;
            volumes: Volume[];
          };
        }
      ).spec;
    const cmd = pod(coordinator).containers[0]!.command;
    const env = Object.fromEntries(pod(ranks).containers[0]!.env!.map((e) => [e.name, e.value]));
    const flag = (name: string): string => cmd[cmd.indexOf(name) + 1]!;
    expect(ranks.spec).toMatchObject({ completionMode: "Indexed", completions: Number(flag("-n")), parallelism: Number(flag("-n")) });
    expect(env.LIFELINE_SIZE).toBe(flag("-n"));
    expect(env.LIFELINE_MODE).toBe(flag("--mode"));
    expect(env.LIFELINE_STORE).toBe(flag("--store"));
    const port = (service.spec.ports as { port: number }[])[0]!.port;
    expect(flag("--port")).toBe(String(port));
    expect(env.LIFELINE_COORDINATOR).toBe(`tcp://${service.metadata.name}:${port}`);
    expect(pod(ranks).subdomain).toBe(service.metadata.name);
    // Keys: one Secret; the coordinator sees only its own file, the ranks only theirs, read-only, 0400.
    const keyFile = (job: Doc): string => {
      const spec = pod(job);
      const volume = spec.volumes.find((v) => v.secret !== undefined)!;
      const mount = spec.containers[0]!.volumeMounts.find((m) => m.name === volume.name)!;
      expect(volume.secret).toMatchObject({ secretName: "heat-keys", defaultMode: 0o400 });
      expect(volume.secret!.items).toHaveLength(1);
      expect(mount.readOnly).toBe(true);
      return `${mount.mountPath}/${volume.secret!.items[0]!.path}`;
    };
    expect(keyFile(coordinator)).toBe(flag("--keys"));
    expect(flag("--keys")).toMatch(/\/coordinator\.key$/);
    expect(env.LIFELINE_KEYS).toBe(keyFile(ranks));
    expect(env.LIFELINE_KEYS).toMatch(/\/ranks\.key$/);
    // What `lifeline run` gives its ranks besides their place (rank-process.ts).
    expect(pod(ranks).containers[0]!.command).toContain(`--initial-old-space-size=${RANK_INITIAL_OLD_SPACE_MIB}`);
    expect(env.GLIBC_TUNABLES).toBe(RANK_MALLOC_TUNABLES);
    // The CLI takes the coordinator's command line: run it here, with this machine's address,
    // a temporary store, any port and the .ts program, until no rank joins (not a usage error).
    const args = cmd.slice(cmd.indexOf("coordinator") + 1).map((a) => (a === "examples/heat.js" ? "examples/heat.ts" : a));
    const keyDir = join(tempDir, "keys");
    writeKeyDir(keyDir, makeJobKeys({ curve: true }));
    const here: Record<string, string> = {
      "--keys": join(keyDir, "coordinator.key"),
      "--bind": "127.0.0.1",
      "--port": "0",
      "--store": join(tempDir, "store"),
      "--results": join(tempDir, "results.json"),
    };
    const local = args.map((a, i) => here[args[i - 1]!] ?? a);
    let err = "";
    const code = await main(["coordinator", "--rendezvous-timeout", "300ms", "--results", here["--results"]!, ...local], {
      stdout: { write: () => true },
      stderr: {
        write: (s: string) => {
          err += s;
          return true;
        },
      },
      env: process.env,
      cwd: ROOT,
      handleSignals: false,
    });
    expect(code, err).toBe(1);
    expect(JSON.parse(readFileSync(here["--results"]!, "utf8")).error.code, err).toBe("LAUNCH_RENDEZVOUS");
  });
});

describe("docs/slurm/lifeline.sbatch", () => {
  it("is valid bash and uses only options lifeline coordinator has", async () => {
    const path = join(ROOT, "docs/slurm/lifeline.sbatch");
    const syntax = spawnSync("bash", ["-n", path], { encoding: "utf8" });
    expect(syntax.status, syntax.stderr).toBe(0);
    let help = "";
    await main(["coordinator", "--help"], {
      stdout: {
        write: (s: string) => {
          help += s;
          return true;
        },
      },
      stderr: { write: () => true },
      env: process.env,
      cwd: ROOT,
      handleSignals: false,
    });
    const script = readFileSync(path, "utf8");
    const line = script
      .replace(/\\\n/g, " ")
      .split("\n")
      .find((l) => l.startsWith("npx lifeline coordinator"))!;
    // The options before the program (those after it are the program's own).
    const own = line.slice(0, line.indexOf(" examples/"));
    const used = [...own.matchAll(/\s(--[a-z-]+|-n)\b/g)].map((m) => m[1]!);
    expect(used.length).toBeGreaterThan(3);
    for (const opt of used) expect(help, `lifeline coordinator has no ${opt}`).toContain(opt);
    expect(script).toMatch(/#SBATCH --requeue/);
    // The ranks get what `lifeline run` gives its ranks (rank-process.ts).
    expect(script).toContain(`node --initial-old-space-size=${RANK_INITIAL_OLD_SPACE_MIB} `);
    expect(script).toContain(`TUNABLES=${RANK_MALLOC_TUNABLES}\n`);
    expect(script).toContain('GLIBC_TUNABLES="$TUNABLES${GLIBC_TUNABLES:+:$GLIBC_TUNABLES}"');
  });
});
