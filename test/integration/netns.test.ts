/**
 * Goal: the test hosts (src/testing/netns.ts) are what the many-host tests assume: hosts that
 * reach each other over their own addresses and nothing else, each with a private disk; a host
 * killed takes its processes and its disk with it and its agent sessions hang; a partition
 * cuts a host off and heals; teardown leaves no namespace, process or file behind.
 *
 * Method: a real 3-host cluster (root, network and mount namespaces, veth on a bridge). Node
 * one-liners on the hosts serve and connect over tcp; the rsh agent runs commands as ssh would.
 * Without root or the tools, the test fails and says what is missing (never skips).
 */
import { spawn } from "node:child_process";
import { existsSync, readdirSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { clusterSupport, netnsRshAgent, TestCluster } from "../../src/testing/netns.ts";

let cluster: TestCluster;

beforeAll(async () => {
  const problem = await clusterSupport();
  if (problem !== undefined) throw new Error(`the many-host tests need test hosts, and here ${problem}`);
  cluster = await TestCluster.create(3, { diskMb: 16 });
}, 60_000);

afterAll(async () => {
  await cluster?.destroy();
});

const SERVE = (address: string, port: number): string[] => [
  "node",
  "-e",
  `require("net").createServer((s) => s.end("hello from ${address}")).listen(${port}, "${address}", () => console.log("listening"))`,
];
const FETCH = (address: string, port: number): string[] => [
  "node",
  "-e",
  `const s = require("net").connect(${port}, "${address}"); let d = ""; s.on("data", (c) => d += c); s.on("end", () => console.log(d)); s.on("error", (e) => { console.log("error " + e.code); }); setTimeout(() => { console.log("timeout"); process.exit(0); }, 1500).unref();`,
];

async function serve(host: number, port: number): Promise<void> {
  const child = cluster.spawn(host, SERVE(cluster.hosts[host]!.address, port), { stdio: ["ignore", "pipe", "ignore"] });
  await new Promise<void>((resolve, reject) => {
    child.stdout!.setEncoding("utf8").once("data", () => resolve());
    child.once("exit", (code) => reject(new Error(`server on host ${host} exited with ${code}`)));
  });
}

describe("test hosts in network namespaces", () => {
  it("hosts reach each other's addresses over the bridge; a host's disk is its own", async () => {
    await serve(1, 7001);
    expect((await cluster.exec(0, FETCH("198.18.0.2", 7001))).stdout.trim()).toBe("hello from 198.18.0.2");
    // Each host has its own eth0 address and sees no other interface of the machine.
    const addrs = (await cluster.exec(2, ["ip", "-4", "-o", "addr"])).stdout;
    expect(addrs).toMatch(/eth0\s+inet 198\.18\.0\.3\/24/);
    expect(addrs.split("\n").filter((l) => l.includes("inet ")).length).toBe(2); // lo and eth0
    await cluster.exec(0, ["sh", "-c", `echo host0 > ${cluster.diskPath}/mark`]);
    expect((await cluster.exec(0, ["cat", `${cluster.diskPath}/mark`])).stdout.trim()).toBe("host0");
    await expect(cluster.exec(1, ["cat", `${cluster.diskPath}/mark`])).rejects.toThrow();
    expect(existsSync(`${cluster.diskPath}/mark`)).toBe(false); // not on the machine's own disk either
  });

  it("the rsh agent runs a command on a host as ssh would (stdio, exit status)", async () => {
    const r = await new Promise<{ code: number | null; out: string }>((resolve) => {
      const child = spawn(netnsRshAgent, ["198.18.0.3", "ip -4 -o addr show dev eth0; exit 7"], {
        env: { ...process.env, ...cluster.agentEnv },
        stdio: ["ignore", "pipe", "pipe"],
      });
      let out = "";
      child.stdout.setEncoding("utf8").on("data", (c: string) => {
        out += c;
      });
      child.on("exit", (code) => resolve({ code, out }));
    });
    expect(r.code).toBe(7);
    expect(r.out).toContain("inet 198.18.0.3/24");
  });

  it("a partition cuts a host off until it heals", async () => {
    await serve(2, 7002);
    await cluster.partition(2, true);
    expect((await cluster.exec(0, FETCH("198.18.0.3", 7002))).stdout.trim()).toBe("timeout");
    await cluster.partition(2, false);
    expect((await cluster.exec(0, FETCH("198.18.0.3", 7002))).stdout.trim()).toBe("hello from 198.18.0.3");
  });

  it("a killed host loses its processes and its disk, and its agent sessions hang", async () => {
    await cluster.exec(1, ["sh", "-c", `echo host1 > ${cluster.diskPath}/mark`]);
    const agent = spawn(netnsRshAgent, ["198.18.0.2", "sleep 30"], { env: { ...process.env, ...cluster.agentEnv }, stdio: "ignore" });
    await new Promise((r) => setTimeout(r, 300));
    expect((await cluster.pids(1)).length).toBeGreaterThanOrEqual(1); // the sleep (the host's init is not counted)
    await cluster.killHost(1);
    expect(await cluster.pids(1)).toEqual([]);
    await new Promise((r) => setTimeout(r, 300));
    expect(agent.exitCode).toBeNull(); // hangs, like ssh to a vanished machine
    agent.kill("SIGKILL");
    expect((await cluster.exec(0, FETCH("198.18.0.2", 7001))).stdout.trim()).toBe("timeout");
  });

  it("teardown leaves no namespace, process or file", async () => {
    const other = await TestCluster.create(2, { diskMb: 8 });
    const names = other.hosts.map((h) => h.name);
    const state = other.stateDir;
    await other.exec(0, ["true"]);
    await other.destroy();
    const left = readdirSync("/run/netns").filter((n) => names.includes(n) || n.startsWith(names[0]!.slice(0, 8)));
    expect(left).toEqual([]);
    expect(existsSync(state)).toBe(false);
  });
});
