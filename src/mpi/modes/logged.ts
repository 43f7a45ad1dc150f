/**
 * The base of the modes that log non-deterministic outcomes and replay them after a restore
 * (cpr while it records a checkpoint; retry-one always, as determinants). World asks its mode
 * for a ticket at every such call (wildcard matches, probes, `waitAny`, `nondet()`); this class
 * adds the polls of requests (`test()`/`done`) and `nondet(fn)`, which are the same in both
 * modes, on top of the subclass's `ticket`/`logNondet`.
 *
 * A replayed poll that says "done" for a receive whose message has not arrived again yet
 * completes the request from the logged frame and leaves its posted receive in place as a
 * *ghost*, narrowed to the logged (source, tag), to swallow the copy the sender sends again.
 *
 * @example
 * class CprMode extends LoggedMode { override ticket(k) { ... } override logNondet(o, e) { ... } }
 */
import { LifelineError } from "../../errors.ts";
import { decodeBody } from "../codec.ts";
import type { NondetEntry } from "../cpr-hook.ts";
import type { Poller, RequestImpl } from "../request.ts";
import type { Message } from "../types.ts";
import { decodeHeader } from "../wire.ts";
import { type AppEnvelope, NoneMode, type PolledRecv } from "./none.ts";

export abstract class LoggedMode extends NoneMode {
  /** App envelopes keep their frame: a poll logs the message it saw done. */
  override readonly keepsFrames: boolean = true;
  /**
   * Receives completed from the log by a replayed poll whose re-sent copy has not arrived yet
   * (their posted receives stay in place and swallow it). A checkpoint waits for them.
   */
  protected ghosts = 0;

  override recvPoller<T>(recv: PolledRecv): Poller<Message<T>> {
    return (req) => this.pollRecv(req, recv);
  }

  override sendPoller(): Poller<void> {
    return (req) => this.pollSend(req);
  }

  override ghostSwallowed(): void {
    this.ghosts--;
  }

  /**
   * A poll (`test()`/`done`) of an irecv: its outcome depends on timing, so it is logged — for
   * a receive seen done, with the message's frame — and replayed after a restore.
   */
  private pollRecv<T>(req: RequestImpl<Message<T>>, recv: PolledRecv): { done: boolean; value: Message<T> | undefined } | undefined {
    const ticket = this.ticket("test");
    const r = ticket?.replay;
    if (r?.k === "test") {
      if (!r.done) return { done: false, value: undefined };
      if (req.settled) return { done: true, value: req.peek() };
      if (r.msg === undefined) {
        this.core.fatal(
          new LifelineError("CPR_REPLAY", `rank ${this.core.rank}: replay: a receive's poll #${ticket!.ordinal} was logged done without its message`),
        );
        return undefined;
      }
      const h = decodeHeader(r.msg.header, { keysIn: "stored", size: this.core.size });
      const env: AppEnvelope = { source: h.source, tag: h.tag, data: decodeBody(h.encoding, h.arrayType, r.msg.body), raw: r.msg };
      const w = recv.waiter!;
      this.core.matcher.replace(w, { ...w, source: env.source, tag: env.tag });
      recv.waiter = undefined;
      this.core.recvCompletedFromLog();
      this.ghosts++;
      req.complete({ source: env.source, tag: env.tag, data: env.data } as Message<T>);
      return { done: true, value: req.peek() };
    }
    const done = req.settled;
    if (ticket !== undefined) {
      const raw = done ? recv.raw() : undefined;
      // Copied: the program may change the arrays it received.
      const msg = raw === undefined ? undefined : { header: Buffer.from(raw.header), body: raw.body.map((b) => Buffer.from(b)) };
      this.logNondet(ticket.ordinal, msg === undefined ? { k: "test", done } : { k: "test", done, msg });
    }
    return { done, value: done ? req.peek() : undefined };
  }

  /** A poll of an isend: whether it was done is timing; logged and replayed. */
  private pollSend(req: RequestImpl<void>): { done: boolean; value: undefined } {
    const ticket = this.ticket("test");
    if (ticket?.replay?.k === "test") return { done: ticket.replay.done, value: undefined };
    const done = req.settled;
    if (ticket !== undefined) this.logNondet(ticket.ordinal, { k: "test", done });
    return { done, value: undefined };
  }

  override nondet<T>(fn: () => T): T {
    if (typeof fn !== "function") throw new TypeError("nondet(fn) needs a function");
    const ticket = this.ticket("value");
    if (ticket?.replay?.k === "value") return ticket.replay.v as T;
    const v = fn();
    if (ticket !== undefined) this.logNondet(ticket.ordinal, { k: "value", v } satisfies NondetEntry);
    return v;
  }
}
