/**
 * ZAP (ZeroMQ RFC 27): who may connect to this process's CURVE servers.
 *
 * libzmq asks a ZAP handler — a socket bound at `inproc://zeromq.zap.01` in the same context —
 * about every connection to a socket that has a ZAP domain, once the client has proven that it
 * holds the secret key of the public key it presents. This module runs one handler per process
 * (a Router in zeromq.js's default context) and answers per domain: each server socket
 * registers its own domain with the public keys it accepts ({@link registerZap}) and hears of
 * each refusal, with the peer's address, to warn about it. The handler lives while a domain is
 * registered, and is closed with the last one so that it never holds the process open.
 *
 * Servers also set `zapEnforceDomain`: should the handler be missing, libzmq refuses the
 * connection instead of letting it through.
 *
 * @example
 * const zap = await registerZap({ allowed: [memberPublicKey], refused: (address) => warn(address) });
 * const pull = new zmq.Pull({ ...curveServer(myKeys, zap.domain) });
 * // ... zap.close() after pull.close()
 */
import { Router } from "zeromq";
import { LifelineError } from "../../errors.ts";
import { z85Encode, type CurveKeyPair } from "../keys.ts";

const ZAP_ENDPOINT = "inproc://zeromq.zap.01";

/** What one domain accepts, and whom to tell about refusals. */
export interface ZapPolicy {
  /** Public keys (Z85) that may connect. */
  readonly allowed: readonly string[];
  /** A connection from `address` (the peer's IP address) was refused: `reason` says why. */
  readonly refused: (address: string, reason: string) => void;
}

/** A registered domain; {@link close} it after its socket is closed. */
export interface ZapDomain {
  readonly domain: string;
  close(): void;
}

interface Handler {
  readonly socket: Router;
  readonly bound: Promise<void>;
  readonly domains: Map<string, ZapPolicy>;
}

let handler: Handler | undefined;
let domainCount = 0;

/** Registers a domain (starting the process's handler if it is not running). Rejects with `MPI_INIT` if the handler cannot bind. */
export async function registerZap(policy: ZapPolicy): Promise<ZapDomain> {
  const h = (handler ??= startHandler());
  const domain = `lifeline/${process.pid}/${++domainCount}`;
  h.domains.set(domain, policy);
  try {
    await h.bound;
  } catch (err) {
    h.domains.delete(domain);
    if (handler === h) handler = undefined;
    throw err;
  }
  return {
    domain,
    close: () => {
      h.domains.delete(domain);
      if (h.domains.size === 0 && handler === h) {
        handler = undefined;
        h.socket.close();
      }
    },
  };
}

function startHandler(): Handler {
  const socket = new Router({ linger: 0 });
  const domains = new Map<string, ZapPolicy>();
  const bound = bindSoon(socket).catch((err: unknown) => {
    socket.close();
    throw new LifelineError(
      "MPI_INIT",
      `cannot start the ZAP handler at ${ZAP_ENDPOINT} (is another ZAP handler running in this process?): ${(err as Error).message}`,
      { cause: err },
    );
  });
  void bound.then(
    () => serve(socket, domains),
    () => undefined,
  );
  return { socket, bound, domains };
}

/**
 * Binds the handler's endpoint. A handler closed a moment ago (its last domain went) still
 * holds the endpoint until libzmq has closed its socket, a few milliseconds later: retried.
 */
async function bindSoon(socket: Router): Promise<void> {
  for (let tries = 1; ; tries++) {
    try {
      await socket.bind(ZAP_ENDPOINT);
      return;
    } catch (err) {
      if ((err as { code?: unknown }).code !== "EADDRINUSE" || tries >= BIND_TRIES) throw err;
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  }
}

/** Tries of {@link bindSoon}, 10 ms apart. */
const BIND_TRIES = 100;

async function serve(socket: Router, domains: Map<string, ZapPolicy>): Promise<void> {
  try {
    for await (const frames of socket) {
      const reply = answer(frames, domains);
      if (reply !== undefined) await socket.send(reply);
    }
  } catch {
    // closed with its last domain
  }
}

/** The reply to one ZAP request (RFC 27), or undefined for a request too broken to answer. */
function answer(frames: Buffer[], domains: Map<string, ZapPolicy>): (Buffer | string)[] | undefined {
  const [id, empty, version, requestId, domain, address, , mechanism, ...credentials] = frames;
  if (id === undefined || empty === undefined || version === undefined || requestId === undefined) return undefined;
  const reply = (status: "200" | "400", text: string): (Buffer | string)[] => [id, empty, "1.0", requestId, status, text, "", ""];
  const policy = domain === undefined ? undefined : domains.get(domain.toString("latin1"));
  const peer = address?.toString("latin1") || "an unknown address";
  if (policy === undefined) return reply("400", "unknown domain");
  const key = credentials[0];
  if (mechanism?.toString("latin1") !== "CURVE" || key === undefined || key.length !== 32) {
    policy.refused(peer, "not a CURVE connection");
    return reply("400", "CURVE required");
  }
  if (!policy.allowed.includes(z85Encode(key))) {
    policy.refused(peer, "its key is not one of this job's");
    return reply("400", "key not allowed");
  }
  return reply("200", "OK");
}

/** Socket options of a CURVE server that asks ZAP domain `domain` about every client. */
export function curveServer(
  keys: CurveKeyPair,
  domain: string,
): {
  curveServer: true;
  curvePublicKey: string;
  curveSecretKey: string;
  zapDomain: string;
  zapEnforceDomain: true;
} {
  return { curveServer: true, curvePublicKey: keys.publicKey, curveSecretKey: keys.secretKey, zapDomain: domain, zapEnforceDomain: true };
}

/** Socket options of a CURVE client with key pair `keys` that expects server key `serverKey`. */
export function curveClient(keys: CurveKeyPair, serverKey: string): { curveServerKey: string; curvePublicKey: string; curveSecretKey: string } {
  return { curveServerKey: serverKey, curvePublicKey: keys.publicKey, curveSecretKey: keys.secretKey };
}

/**
 * Watches a CURVE server socket for handshakes that failed before ZAP was asked (a plain
 * connection, or a client that does not know the server's key): libzmq reports those without
 * the peer's address. `failed` hears each (the caller rate-limits its warnings).
 */
export function watchHandshakes(
  socket: { events: { on(type: "handshake:error:protocol", fn: (e: { error: Error & { code?: string } }) => void): unknown } },
  failed: (reason: string) => void,
): void {
  socket.events.on("handshake:error:protocol", (e) => {
    const code = e.error.code ?? "";
    failed(
      code === "ERR_ZMTP_MECHANISM_MISMATCH"
        ? "a connection without CURVE"
        : code === "ERR_ZMTP_CRYPTOGRAPHIC"
          ? "a connection with a wrong CURVE key"
          : `a connection that broke the protocol (${code || e.error.message})`,
    );
  });
}

/** Warnings about refused connections, per kind of refusal, before further ones of that kind are only counted. */
export const REFUSALS_WARNED_PER_KIND = 3;

/**
 * A rate limiter for refusal warnings: each kind (`kind`, e.g. "wrong key") is reported
 * {@link REFUSALS_WARNED_PER_KIND} times, the last with a note that more are suppressed, so
 * that a stranger retrying one way every 100 ms cannot hide its other attempts.
 */
export function refusalWarnings(warn: (line: string) => void): (kind: string, line: string) => void {
  const seen = new Map<string, number>();
  return (kind, line) => {
    const n = (seen.get(kind) ?? 0) + 1;
    seen.set(kind, n);
    if (n < REFUSALS_WARNED_PER_KIND) warn(line);
    else if (n === REFUSALS_WARNED_PER_KIND) warn(`${line} (further refusals of this kind are not reported)`);
  };
}
