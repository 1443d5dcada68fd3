// The bounded per-key fair queue (shared/platform/queue/fair-queue.ts) on its own: the least
// recently served key goes next (a newcomer waits for one running request at most), a per-key cap
// that leaves places to the others, a full queue refusing with 429 queue_full and Retry-After, the
// key over its share pushed out instead of a newcomer, and a cancelled waiter leaving at once.
import { describe, expect, it } from "vitest";
import { ApiError } from "../../shared/platform/http/errors.ts";
import { DrainRate, FairQueue } from "../../shared/platform/queue/fair-queue.ts";

const never = () => new AbortController().signal;

/** Enters `q` for each tenant in order (without awaiting), recording who got a place when. */
function enterAll(q: FairQueue, tenants: string[], served: string[]) {
  return tenants.map((t, i) =>
    q.enter(t, never()).then(
      (release) => {
        served.push(`${t}${i}`);
        return release;
      },
      (e: unknown) => e as ApiError,
    ),
  );
}

describe("FairQueue", () => {
  it("serves keys in turn: one key's burst does not hold another key's request behind all of it", async () => {
    const q = new FairQueue({ stage: "test", limit: 1, capacity: 100 });
    const served: string[] = [];
    const entries = enterAll(q, [...Array(17).fill("a"), "b", "b"], served);
    await Promise.resolve();
    expect(q.running).toBe(1);
    expect(q.queued).toBe(18);
    expect(q.queuedFor("b")).toBe(2);
    // Run them one by one: release each place as soon as it is given.
    const tags = entries.map((_, j) => `${j < 17 ? "a" : "b"}${j}`);
    while (served.length < entries.length) {
      await new Promise((r) => setTimeout(r, 0));
      const release = (await entries[tags.indexOf(served.at(-1)!)]!) as () => void;
      release();
    }
    await Promise.all(entries);
    // FIFO would serve b after all 17 a's; a holds the place when b arrives, so b goes next.
    expect(served.slice(0, 5)).toEqual(["a0", "b17", "a1", "b18", "a2"]);
    expect(q.running).toBe(0);
    expect(q.queued).toBe(0);
  });

  it("refuses with 429 queue_full and a Retry-After when full; the key over its share is pushed out for a newcomer", async () => {
    const q = new FairQueue({ stage: "prefill", limit: 1, capacity: 3 });
    const served: string[] = [];
    const a = enterAll(q, ["a", "a", "a", "a"], served); // 1 running + 3 waiting: full
    await Promise.resolve();
    const refused = await enterAll(q, ["a"], served)[0]; // the same key: refused at once
    expect(refused).toBeInstanceOf(ApiError);
    expect((refused as ApiError).status).toBe(429);
    expect((refused as ApiError).code).toBe("queue_full");
    expect(Number((refused as ApiError).headers["retry-after"])).toBeGreaterThanOrEqual(1);
    // Another key fits: a's newest waiter gives up its place.
    const b = enterAll(q, ["b"], served);
    const pushedOut = await a[3];
    expect((pushedOut as ApiError).code).toBe("queue_full");
    expect(q.queuedFor("a")).toBe(2);
    expect(q.queuedFor("b")).toBe(1);
    expect(q.rejected).toBe(2);
    ((await a[0]) as () => void)(); // b goes next: a was served last
    await b[0];
    expect(served).toEqual(["a0", "b0"]);
  });

  it("a key that took a place straight away waits behind a newcomer (one running request at most ahead of it)", async () => {
    const q = new FairQueue({ stage: "prefill", limit: 1, capacity: 10 });
    const served: string[] = [];
    const [a0, a1, a2] = enterAll(q, ["a", "a", "a"], served); // a0 runs at once, a1 and a2 wait
    await Promise.resolve();
    const [b] = enterAll(q, ["b"], served);
    ((await a0!) as () => void)();
    await b;
    expect(served).toEqual(["a0", "b0"]); // not behind a1
    ((await b!) as () => void)();
    ((await a1!) as () => void)();
    ((await a2!) as () => void)();
    expect(served).toEqual(["a0", "b0", "a1", "a2"]);
  });

  it("a per-key cap leaves a place free for the others", async () => {
    const q = new FairQueue({ stage: "tokenize", limit: 2, capacity: 10, perTenant: 1 });
    const served: string[] = [];
    const as = enterAll(q, ["a", "a", "a"], served);
    await Promise.resolve();
    expect(q.running).toBe(1); // a holds one of two places; its others wait
    expect(q.queuedFor("a")).toBe(2);
    const [b] = enterAll(q, ["b"], served);
    await b; // the free place, at once
    expect(served).toEqual(["a0", "b0"]);
    expect(q.runningFor("b")).toBe(1);
    ((await as[0]!) as () => void)();
    ((await as[1]!) as () => void)();
    ((await b!) as () => void)();
    ((await as[2]!) as () => void)();
    expect(served).toEqual(["a0", "b0", "a1", "a2"]);
    expect(q.running).toBe(0);
  });

  it("a cancelled waiter leaves the queue at once", async () => {
    const q = new FairQueue({ stage: "test", limit: 1, capacity: 2 });
    const first = await q.enter("a", never());
    const ac = new AbortController();
    const waiting = q.enter("b", ac.signal);
    expect(q.queued).toBe(1);
    ac.abort(new Error("client gone"));
    await expect(waiting).rejects.toThrow("client gone");
    expect(q.queued).toBe(0);
    first();
    expect(q.running).toBe(0);
  });

  it("estimates Retry-After from how fast the stage drains", async () => {
    const q = new FairQueue({ stage: "test", limit: 1, capacity: 2 });
    const releases: Array<() => void> = [await q.enter("a", never())];
    const waiters = [q.enter("b", never()), q.enter("a", never())]; // served in this order (b: never served yet)
    for (const w of waiters) {
      await new Promise((r) => setTimeout(r, 300));
      releases.shift()!();
      releases.push(await w);
    }
    // Full again: two waiting at ~300 ms per release -> about 1 s.
    const more = [q.enter("c", never()), q.enter("d", never())];
    const refused = await q.enter("e", never()).catch((e: ApiError) => e);
    expect((refused as ApiError).headers["retry-after"]).toBe("1");
    releases.shift()!();
    for (const m of more) (await m)();
  });
});

describe("DrainRate", () => {
  it("estimates from the gaps between places freed while saturated, ignoring idle gaps", () => {
    const d = new DrainRate();
    expect(d.retryAfterSeconds(5)).toBe(1); // no estimate yet
    d.freed(false, 0);
    d.freed(false, 60_000); // idle: says nothing
    expect(d.retryAfterSeconds(5)).toBe(1);
    d.freed(true, 62_000); // 2 s per place while saturated
    expect(d.retryAfterSeconds(1)).toBe(2);
    expect(d.retryAfterSeconds(10)).toBe(20);
    expect(d.retryAfterSeconds(1000)).toBe(60); // capped at a minute
  });
});
