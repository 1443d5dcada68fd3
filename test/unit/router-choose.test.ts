// The router's choice (services/router/choose.ts): the holder of the request's KV unless it is far
// busier than the least loaded decode; else, of the decodes not far busier than the least loaded,
// the one with the fewest conversations (requests in flight plus sessions parked), fewer session
// bytes, more free KV breaking a tie. And the pool's estimate between polls (decode-pool.ts): a new
// conversation's finished first turn counts as a session parked where it ran.
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";
import type { Registry } from "../../shared/platform/registry/registry.ts";
import { chooseDecode, Turns } from "../../services/router/choose.ts";
import { DecodePool, type DecodeTarget } from "../../services/router/decode-pool.ts";

const t = (id: string, load: number, kvFree = 1000, sessions = 0, sessionBytes = 0): DecodeTarget => ({
  id,
  publicUrl: `http://${id}`,
  internalUrl: `http://${id}:1`,
  load,
  kvFree,
  sessions,
  sessionBytes,
});

/** Places `n` new conversations one after another, each parked where it went before the next arrives. */
function place(targets: DecodeTarget[], n: number): string[] {
  return Array.from({ length: n }, () => {
    const route = chooseDecode(targets, undefined, 8)!;
    expect(route.reason).toBe("load");
    route.target.sessions++;
    return route.target.id;
  });
}

describe("chooseDecode", () => {
  it("without a holder: the least loaded, more free KV breaking a tie, then the first", () => {
    expect(chooseDecode([t("a", 3), t("b", 1), t("c", 2)], undefined, 8)).toMatchObject({ target: { id: "b" }, reason: "load" });
    expect(chooseDecode([t("a", 1, 10), t("b", 1, 20)], undefined, 8)?.target.id).toBe("b");
    expect(chooseDecode([t("a", 1), t("b", 1)], undefined, 8)?.target.id).toBe("a");
    expect(chooseDecode([], undefined, 8)).toBeUndefined();
  });

  it("new conversations alternate between two idle decodes when one already holds a session", () => {
    expect(place([t("a", 0, 1000, 1), t("b", 0)], 4)).toEqual(["b", "a", "b", "a"]);
    // Three already on `a`: the next three go to `b` before `a` gets another.
    expect(place([t("a", 0, 1000, 3), t("b", 0)], 5)).toEqual(["b", "b", "b", "a", "b"]);
  });

  it("a decode holding more sessions loses the tie; more session bytes then, before free KV", () => {
    expect(chooseDecode([t("a", 0, 1000, 2), t("b", 0, 1000, 1)], undefined, 8)?.target.id).toBe("b");
    expect(chooseDecode([t("a", 2, 1000, 2), t("b", 2, 1000, 3)], undefined, 8)?.target.id).toBe("a");
    // Equal conversations: fewer bytes parked wins even against more free KV.
    expect(chooseDecode([t("a", 0, 2000, 1, 500), t("b", 0, 1000, 1, 100)], undefined, 8)?.target.id).toBe("b");
    // A conversation in flight weighs as much as one parked: 1 + 0 against 0 + 2.
    expect(chooseDecode([t("a", 1, 1000, 0), t("b", 0, 1000, 2)], undefined, 8)?.target.id).toBe("a");
  });

  it("sessions do not outweigh more than `imbalance` requests in flight beyond the least loaded", () => {
    const targets = [t("a", 0, 1000, 20), t("b", 9, 1000, 0)];
    expect(chooseDecode(targets, undefined, 8)?.target.id).toBe("a"); // b is 9 beyond: not a candidate
    expect(chooseDecode(targets, undefined, 10)?.target.id).toBe("b"); // 9 + 0 conversations against 0 + 20
  });

  it("the holder of a session or a prefix, unless it has more than `imbalance` requests beyond the least loaded", () => {
    const targets = [t("a", 0), t("b", 8)];
    expect(chooseDecode(targets, { instanceId: "b", by: "session" }, 8)).toMatchObject({ target: { id: "b" }, reason: "session" });
    expect(chooseDecode(targets, { instanceId: "b", by: "prefix" }, 8)).toMatchObject({ target: { id: "b" }, reason: "prefix" });
    expect(chooseDecode(targets, { instanceId: "b", by: "session" }, 7)).toMatchObject({ target: { id: "a" }, reason: "holder_busy" });
    // A holder the router cannot reach (dead, draining, not listed): the least loaded.
    expect(chooseDecode(targets, { instanceId: "gone", by: "session" }, 8)).toMatchObject({ target: { id: "a" }, reason: "holder_gone" });
  });

  it("the holder keeps its turns whatever sessions it holds; a busy or gone holder's go where a new conversation would", () => {
    const crowded = [t("a", 0), t("b", 8, 1000, 30)];
    expect(chooseDecode(crowded, { instanceId: "b", by: "session" }, 8)).toMatchObject({ target: { id: "b" }, reason: "session" });
    expect(chooseDecode(crowded, { instanceId: "b", by: "prefix" }, 8)).toMatchObject({ target: { id: "b" }, reason: "prefix" });
    // Busy (10 > 0 + 8) or gone: the fewest conversations among the rest, not the least in flight.
    const targets = [t("a", 0, 1000, 3), t("b", 1, 1000, 0), t("c", 10)];
    expect(chooseDecode(targets, { instanceId: "c", by: "session" }, 8)).toMatchObject({ target: { id: "b" }, reason: "holder_busy" });
    expect(chooseDecode(targets, { instanceId: "gone", by: "prefix" }, 8)).toMatchObject({ target: { id: "b" }, reason: "holder_gone" });
  });

  it("round robin takes the decodes in turn", () => {
    const turns = new Turns();
    const targets = [t("a", 5), t("b", 0), t("c", 0)];
    expect([1, 2, 3, 4].map(() => turns.take(targets)?.id)).toEqual(["a", "b", "c", "a"]);
    expect(turns.take([])).toBeUndefined();
  });
});

describe("DecodePool", () => {
  let server: Server | undefined;
  afterEach(() => new Promise<void>((done) => (server ? server.close(() => done()) : done())));

  /** A pool over decodes `a` and `b` whose status answers `statuses[id]` (read at each poll). */
  async function pool(statuses: Record<string, Record<string, unknown>>): Promise<DecodePool> {
    server = createServer((req, res) => {
      const id = req.url!.split("/")[1]!;
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(statuses[id]));
    });
    await new Promise<void>((ready) => server!.listen(0, "127.0.0.1", ready));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const rows = Object.keys(statuses).map((id) => ({ id, publicUrl: `http://${id}`, baseUrl: `${url}/${id}` }));
    const registry = { instances: { findAlive: async () => rows } } as unknown as Registry;
    const p = new DecodePool({ registry, internalSecret: "s", heartbeatTimeoutMs: 60_000, pollMs: 60_000, log: pino({ level: "silent" }) });
    await p.poll();
    return p;
  }
  const status = (sessions?: { count: number; bytes: number }) => ({
    state: "ready",
    requests_in_flight: 0,
    kv_reserved_bytes: 0,
    kv_budget_bytes: 1000,
    ...(sessions ? { sessions } : {}),
  });

  it("reads each decode's parked sessions, and counts a new conversation placed since the poll as one", async () => {
    const statuses = { a: status({ count: 0, bytes: 0 }), b: status({ count: 0, bytes: 0 }) };
    const p = await pool(statuses);
    // Four conversations start on idle decodes within one poll interval, each first turn over before the next.
    const went = [1, 2, 3, 4].map(() => {
      const { target } = chooseDecode(p.targets(), undefined, 8)!;
      p.dispatched(target.id)(true);
      return target.id;
    });
    expect(went).toEqual(["a", "b", "a", "b"]);
    expect(p.targets().map((d) => [d.load, d.sessions])).toEqual([
      [0, 2],
      [0, 2],
    ]);
    // A request that parks nothing (no session, or the holder's own turn) leaves the count alone.
    p.dispatched("a")();
    expect(p.targets()[0]).toMatchObject({ load: 0, sessions: 2 });
    // The next poll's counts replace the estimate; a decode that reports no sessions holds none.
    statuses.a = status({ count: 3, bytes: 300 });
    statuses.b = status();
    await p.poll();
    expect(p.targets().map((d) => [d.id, d.sessions, d.sessionBytes])).toEqual([
      ["a", 3, 300],
      ["b", 0, 0],
    ]);
  });
});
