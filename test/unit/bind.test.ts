/**
 * Goal: `--bind` / `LIFELINE_BIND` name exactly one address of this host — an IPv4 address it
 * has, or an interface's first IPv4 address — and anything else (a wildcard, an address of
 * another host, an unknown interface, IPv6 for now) is refused with the addresses there are.
 *
 * Method: resolveBind over a fixed interface table, and over the machine's own (loopback).
 */
import type { NetworkInterfaceInfo } from "node:os";
import { describe, expect, it } from "vitest";
import { resolveBind } from "../../src/mpi/bind.ts";

const iface = (address: string, family: "IPv4" | "IPv6" = "IPv4"): NetworkInterfaceInfo =>
  ({ address, family, netmask: "255.255.255.0", mac: "00:00:00:00:00:00", internal: false, cidr: `${address}/24` }) as NetworkInterfaceInfo;
const table = {
  lo: [iface("127.0.0.1"), iface("::1", "IPv6")],
  eth0: [iface("fe80::1", "IPv6"), iface("198.18.0.2"), iface("198.18.1.2")],
  tun0: [iface("fe80::2", "IPv6")],
};

describe("resolveBind", () => {
  it("an interface binds its first IPv4 address; an address of this host binds itself", () => {
    expect(resolveBind("eth0", table)).toEqual({ address: "198.18.0.2" });
    expect(resolveBind("198.18.1.2", table)).toEqual({ address: "198.18.1.2" });
    expect(resolveBind(" lo ", table)).toEqual({ address: "127.0.0.1" });
  });

  it("refuses wildcards, other hosts' addresses, unknown interfaces and IPv6, listing what there is", () => {
    const list = "lo 127.0.0.1, eth0 198.18.0.2, eth0 198.18.1.2";
    expect(resolveBind("0.0.0.0", table)).toEqual({
      problem: `"0.0.0.0" would listen on every interface and is no address a peer can connect to; name one interface or address (${list})`,
    });
    expect(resolveBind("10.1.2.3", table)).toEqual({ problem: `10.1.2.3 is not an address of this host; its IPv4 addresses are: ${list}` });
    expect(resolveBind("wlan9", table)).toEqual({ problem: `"wlan9" is neither an IPv4 address nor an interface of this host (${list})` });
    expect(resolveBind("tun0", table)).toEqual({ problem: `interface tun0 has no IPv4 address (${list})` });
    expect("problem" in resolveBind("::1", table)).toBe(true);
    expect("problem" in resolveBind("", table)).toBe(true);
  });

  it("works against the machine's own interfaces", () => {
    expect(resolveBind("127.0.0.1")).toEqual({ address: "127.0.0.1" });
  });
});
