/**
 * Which address a socket binds and advertises (`--bind`, `LIFELINE_BIND`): an IPv4 address of
 * this host, or the name of one of its interfaces (its first IPv4 address). ipc stays the
 * one-host default; tcp without `--bind` uses the loopback address. A wildcard (`0.0.0.0`) is
 * refused: it would listen on every interface, and it is no address a peer could connect to.
 * Resolved where the socket lives — the launcher for the coordinator, each rank on its own
 * host — since interface names and addresses differ from host to host.
 *
 * @example
 * resolveBind("eth0");        // "198.18.0.2"
 * resolveBind("127.0.0.1");   // "127.0.0.1"
 * resolveBind("10.9.9.9");    // throws: not an address of this host (lists the interfaces)
 */
import { networkInterfaces, type NetworkInterfaceInfo } from "node:os";
import { isIPv4, isIPv6 } from "node:net";

/** The loopback address tcp binds when no `--bind` is given. */
export const DEFAULT_TCP_HOST = "127.0.0.1";

/** The outcome of {@link resolveBind}: the address, or why there is none. */
export type BindResolution = { readonly address: string } | { readonly problem: string };

/**
 * Resolves a `--bind` spec against this host's interfaces (`interfaces` for tests). Never
 * throws: a problem is a sentence saying what is wrong and which addresses there are.
 *
 * @example
 * const r = resolveBind("eth0");
 * if ("problem" in r) throw new Error(r.problem);
 */
export function resolveBind(spec: string, interfaces: NodeJS.Dict<NetworkInterfaceInfo[]> = networkInterfaces()): BindResolution {
  const ipv4 = Object.entries(interfaces).flatMap(([name, infos]) =>
    (infos ?? []).filter((i) => i.family === "IPv4").map((i) => ({ name, address: i.address })),
  );
  const available = ipv4.length === 0 ? "none" : ipv4.map((i) => `${i.name} ${i.address}`).join(", ");
  const text = spec.trim();
  if (text === "") return { problem: `an empty address; name an interface or an IPv4 address of this host (${available})` };
  if (text === "0.0.0.0" || text === "*" || text === "::") {
    return {
      problem: `${JSON.stringify(text)} would listen on every interface and is no address a peer can connect to; name one interface or address (${available})`,
    };
  }
  if (isIPv6(text) || isIPv6(text.replace(/^\[|\]$/g, "")))
    return { problem: `${JSON.stringify(text)} is an IPv6 address; only IPv4 is supported so far (${available})` };
  if (isIPv4(text)) {
    return ipv4.some((i) => i.address === text)
      ? { address: text }
      : { problem: `${text} is not an address of this host; its IPv4 addresses are: ${available}` };
  }
  const own = ipv4.find((i) => i.name === text);
  if (own !== undefined) return { address: own.address };
  const known = interfaces[text] !== undefined;
  return {
    problem: known
      ? `interface ${text} has no IPv4 address (${available})`
      : `${JSON.stringify(text)} is neither an IPv4 address nor an interface of this host (${available})`,
  };
}
