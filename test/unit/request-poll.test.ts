/**
 * Goal: a request's public polls (`test()`, `done`) go through the poller World installs in
 * mode cpr, while the layer's own views (`settled`, `peek()`, waitAny, waitAll) never do, so
 * they are neither logged nor replayed.
 *
 * Method: RequestImpl with a scripted poller, no World.
 */
import { describe, expect, it } from "vitest";
import { RequestImpl, waitAll, waitAny } from "../../src/mpi/request.ts";

describe("RequestImpl polls", () => {
  it("test() and done answer from the poller; settled, peek, waitAny and waitAll do not call it", async () => {
    let polls = 0;
    const script = [
      { done: false, value: undefined },
      { done: true, value: 42 },
      { done: true, value: 42 },
    ];
    const req = new RequestImpl<number>(() => script[polls++]);
    const other = new RequestImpl<number>(() => {
      throw new Error("polled");
    });
    expect(req.test()).toBeUndefined();
    expect(req.test()).toBe(42); // the log says done before the layer completed it (replay)
    expect(req.done).toBe(true);
    expect(req.settled).toBe(false);
    req.complete(42);
    other.complete(1);
    expect(req.peek()).toBe(42);
    expect(await waitAny([other, req])).toEqual({ index: 0, value: 1 });
    expect(await waitAll([req, other])).toEqual([42, 1]);
    expect(polls).toBe(3);
  });

  it("a failed request is not polled: test() throws its error", () => {
    let polls = 0;
    const req = new RequestImpl<number>(() => {
      polls++;
      return undefined;
    });
    req.fail(new Error("aborted"));
    expect(() => req.test()).toThrow("aborted");
    expect(req.done).toBe(true);
    expect(polls).toBe(0);
  });

  it("a pending request urges on wait(), test(), done, waitAny and waitAll; a settled one never", async () => {
    let urged = 0;
    const req = new RequestImpl<number>(undefined, () => void urged++);
    expect(req.test()).toBeUndefined();
    expect(req.done).toBe(false);
    const waited = req.wait();
    const any = waitAny([req]);
    const all = waitAll([req]);
    expect(urged).toBe(5);
    req.complete(7);
    expect(await waited).toBe(7);
    expect(await any).toEqual({ index: 0, value: 7 });
    expect(await all).toEqual([7]);
    req.test();
    void req.done;
    await req.wait();
    await waitAny([req]);
    expect(urged).toBe(5);
  });
});
