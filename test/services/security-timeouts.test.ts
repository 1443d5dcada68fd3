// Listener intake limits (shared/platform/http/server.ts) on the real app middleware, no model needed:
// slow-body connections get 408 and are closed after the body idle timeout, a connection that
// never finishes its headers is closed, one that sends nothing is closed at the first-byte
// deadline, idle or half-sent connections at the cap (in all or per peer) give way to new ones
// while connections all serving requests refuse more, and none of it cuts a streaming response
// that runs longer than every timeout. And the registry's PostgreSQL
// calls: a server that stops answering fails them at the query deadline instead of hanging.
import net from "node:net";
import { streamSSE } from "hono/streaming";
import pino from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ConfigError, loadConfig } from "../../shared/platform/config.ts";
import { createApp } from "../../shared/platform/http/app.ts";
import { listen, type Listening } from "../../shared/platform/http/server.ts";
import { openDatabase } from "../../shared/platform/registry/db.ts";
import { Registry } from "../../shared/platform/registry/registry.ts";
import { startPostgres, type TestPostgres } from "../../tools/lib/postgres.ts";
import { until } from "../../tools/lib/services.ts";

const LIMITS = {
  headersTimeoutMs: 600,
  requestTimeoutMs: 2_000,
  bodyIdleTimeoutMs: 500,
  keepAliveTimeoutMs: 1_000,
  maxConnections: 30,
  maxConnectionsPerPeer: 30,
  firstByteTimeoutMs: 400,
};
const STREAM_MS = 2_500; // longer than every limit above: they bound receiving a request, never a response

interface RawResult {
  text: string;
  closedAfterMs: number;
}

/** Opens a raw connection, writes `head` (and optional drips), and resolves when the server closes it. */
function raw(
  port: number,
  head: string,
  opts: { drip?: { every: number; times: number } } = {},
): { done: Promise<RawResult>; socket: net.Socket } {
  const socket = net.connect(port, "127.0.0.1");
  const t0 = performance.now();
  let text = "";
  let drip: NodeJS.Timeout | undefined;
  socket.setEncoding("utf8").on("data", (d: string) => (text += d));
  socket.on("connect", () => {
    socket.write(head);
    if (opts.drip) {
      let n = 0;
      drip = setInterval(() => {
        if (++n > opts.drip!.times || socket.destroyed) return clearInterval(drip);
        socket.write("a");
      }, opts.drip.every);
    }
  });
  const done = new Promise<RawResult>((resolve) => {
    socket.on("error", () => {});
    socket.on("close", () => {
      clearInterval(drip);
      resolve({ text, closedAfterMs: performance.now() - t0 });
    });
  });
  return { done, socket };
}

describe("listener timeouts and connection cap", () => {
  let server: Listening;
  /** Every answer the app made (the handler ended): its path and status. */
  const answered: { path: string; status: number }[] = [];

  beforeAll(async () => {
    const app = createApp({
      log: pino({ level: "silent" }),
      maxBodyBytes: 1 << 20,
      onResponse: (c) => void answered.push({ path: c.req.path, status: c.res.status }),
    });
    app.post("/v1/echo", async (c) => c.json({ got: await c.req.json() }));
    app.get("/v1/stream", (c) =>
      streamSSE(c, async (s) => {
        const end = performance.now() + STREAM_MS;
        let i = 0;
        while (performance.now() < end) {
          await s.writeSSE({ data: String(i++) });
          await s.sleep(100);
        }
        await s.writeSSE({ data: "[DONE]" });
      }),
    );
    app.get("/health", (c) => c.json({ status: "ok" }));
    server = await listen(app.fetch, "127.0.0.1", 0, LIMITS);
  });
  afterAll(async () => {
    await server?.close(0);
  });

  it("20 slow-body connections are answered 408 and closed after the body idle timeout; others are served meanwhile", async () => {
    const head = 'POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"a":';
    const slow = Array.from({ length: 20 }, () => raw(server.port, head));
    const health = await fetch(`${server.url}/health`);
    expect(health.status).toBe(200);
    const results = await Promise.all(slow.map((s) => s.done));
    // Each handler ended with the 408 (its body read failed), answered like any other request;
    // none ended in an error the app did not expect (a 500).
    await until("every stalled request is answered", () => answered.filter((a) => a.path === "/v1/echo" && a.status === 408).length === 20);
    expect(answered.filter((a) => a.status >= 500)).toEqual([]);
    for (const r of results) {
      expect(r.text).toMatch(/^HTTP\/1\.1 408 /);
      expect(r.text).toContain('"code":"request_timeout"');
      expect(r.closedAfterMs).toBeGreaterThanOrEqual(LIMITS.bodyIdleTimeoutMs - 50);
      expect(r.closedAfterMs).toBeLessThan(LIMITS.bodyIdleTimeoutMs + 1_500);
    }
    // A body that keeps coming (a byte per 200 ms, under the idle timeout) is read to the end.
    const body = '{"k":"' + "a".repeat(6);
    const ok = raw(
      server.port,
      `POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: ${body.length + 2 + 6}\r\n\r\n${body}`,
      { drip: { every: 200, times: 6 } },
    );
    ok.socket.on("connect", () => setTimeout(() => ok.socket.write('"}'), 200 * 7 + 50));
    const served = await ok.done;
    expect(served.text).toMatch(/^HTTP\/1\.1 200 /);
    expect(served.text).toContain('"got":{"k":"aaaaaaaaaaaa"}');
  });

  it("a connection that never finishes its headers is closed after the headers timeout", async () => {
    const { done } = raw(server.port, "POST /v1/echo HTTP/1.1\r\nHost: x\r\n");
    const r = await done;
    expect(r.closedAfterMs).toBeLessThan(LIMITS.headersTimeoutMs + 1_500);
    expect(r.text === "" || /^HTTP\/1\.1 408 /.test(r.text)).toBe(true);
  });

  it("a body dripped just under the idle timeout still ends at the whole-request timeout", async () => {
    const { done } = raw(
      server.port,
      "POST /v1/echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n",
      { drip: { every: 300, times: 100 } },
    );
    const r = await done;
    expect(r.text).toMatch(/^HTTP\/1\.1 408 /);
    expect(r.closedAfterMs).toBeGreaterThanOrEqual(LIMITS.requestTimeoutMs - 100);
    expect(r.closedAfterMs).toBeLessThan(LIMITS.requestTimeoutMs + 2_000);
  });

  it("a connection that sends nothing is closed at the first-byte deadline", async () => {
    const { done } = raw(server.port, "");
    const r = await done;
    expect(r.text).toBe("");
    expect(r.closedAfterMs).toBeGreaterThanOrEqual(LIMITS.firstByteTimeoutMs - 50);
    expect(r.closedAfterMs).toBeLessThan(LIMITS.firstByteTimeoutMs + 180); // before the headers timeout (600) would close it
  });

  it("at the cap, idle and half-sent connections give way: a real request is served", async () => {
    // Fill the cap with connections that send part of their headers (and then nothing).
    const squatters = Array.from({ length: LIMITS.maxConnections }, () => raw(server.port, "GET /health HTTP/1.1\r\nHo"));
    await new Promise((r) => setTimeout(r, 150));
    for (let i = 0; i < 5; i++) expect((await fetch(`${server.url}/health`)).status).toBe(200);
    // The real connection (fetch keeps one alive) closed the oldest squatter, before any deadline did.
    expect((await squatters[0]!.done).closedAfterMs).toBeLessThan(LIMITS.headersTimeoutMs);
    for (const s of squatters) s.socket.destroy();
  });

  it("connections beyond the cap are refused; streams longer than every timeout are not cut", async () => {
    const streams = Array.from({ length: LIMITS.maxConnections }, () =>
      raw(server.port, "GET /v1/stream HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    );
    await new Promise((r) => setTimeout(r, 300)); // every stream has started
    const extra = raw(server.port, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    const refused = await extra.done;
    expect(refused.text).toBe("");
    expect(refused.closedAfterMs).toBeLessThan(500);
    const results = await Promise.all(streams.map((s) => s.done));
    for (const r of results) {
      expect(r.text).toMatch(/^HTTP\/1\.1 200 /);
      expect(r.text).toContain("data: [DONE]");
      expect(r.closedAfterMs).toBeGreaterThanOrEqual(STREAM_MS);
    }
    // Under the cap again: served.
    expect((await fetch(`${server.url}/health`)).status).toBe(200);
  });
});

describe("the per-peer connection cap", () => {
  it("a peer at its cap closes its own oldest idle connection, or is refused while all of them serve requests", async () => {
    const app = createApp({ log: pino({ level: "silent" }), maxBodyBytes: 1 << 20 });
    app.get("/slow", async (c) => {
      await new Promise((r) => setTimeout(r, 1_500));
      return c.text("done");
    });
    app.get("/health", (c) => c.json({ status: "ok" }));
    const srv = await listen(app.fetch, "127.0.0.1", 0, {
      ...LIMITS,
      maxConnections: 100,
      maxConnectionsPerPeer: 4,
      firstByteTimeoutMs: 5_000,
    });
    try {
      const idle = Array.from({ length: 4 }, () => raw(srv.port, ""));
      await new Promise((r) => setTimeout(r, 100));
      expect((await fetch(`${srv.url}/health`)).status).toBe(200); // the oldest idle one made room
      expect((await idle[0]!.done).text).toBe("");
      for (const s of idle) s.socket.destroy();
      await new Promise((r) => setTimeout(r, 100));
      // Four connections busy with requests: a fifth from the same peer is refused at once.
      const busy = Array.from({ length: 4 }, () => raw(srv.port, "GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
      await new Promise((r) => setTimeout(r, 200));
      const refused = await raw(srv.port, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").done;
      expect(refused.text).toBe("");
      for (const r of await Promise.all(busy.map((b) => b.done))) expect(r.text).toContain("done");
    } finally {
      await srv.close(0);
    }
  });
});

describe("registry calls to a hung PostgreSQL end at --db-timeout-ms", () => {
  let pgServer: TestPostgres;
  let proxy: net.Server;
  let frozen = false;
  const sockets = new Set<net.Socket>();

  beforeAll(async () => {
    pgServer = await startPostgres("ctxbank_timeouts");
    const target = new URL(pgServer.url);
    // A TCP proxy in front of the server that can freeze: bytes stop flowing, sockets stay open
    // (what a SIGSTOPped or wedged server looks like to its clients).
    proxy = net.createServer((client) => {
      const upstream = net.connect(Number(target.port), target.hostname);
      for (const [from, to] of [
        [client, upstream],
        [upstream, client],
      ] as const) {
        sockets.add(from);
        from.on("data", (d) => {
          if (!frozen) to.write(d);
        });
        from.on("error", () => to.destroy());
        from.on("close", () => to.destroy());
      }
    });
    await new Promise<void>((r) => proxy.listen(0, "127.0.0.1", r));
  });
  afterAll(async () => {
    for (const s of sockets) s.destroy();
    await new Promise((r) => proxy?.close(r));
    await pgServer?.stop();
  });

  it("a query on a connection that stops answering, and a new connection, both fail within the deadline", async () => {
    const url = new URL(pgServer.url);
    url.port = String((proxy.address() as net.AddressInfo).port);
    const timeoutMs = 800;
    const db = await openDatabase(url.toString(), { timeoutMs });
    const registry = new Registry(db.db);
    try {
      expect(await registry.instances.findAlive("prefill", 10_000)).toEqual([]);
      frozen = true;
      const t0 = performance.now();
      const err = (await registry.instances.findAlive("prefill", 10_000).catch((e: unknown) => e)) as Error;
      expect(`${err.message} ${(err.cause as Error | undefined)?.message}`).toMatch(/timeout/i);
      expect(performance.now() - t0).toBeLessThan(timeoutMs + 1_000);
      const t1 = performance.now();
      await expect(openDatabase(url.toString(), { timeoutMs })).rejects.toThrow(/cannot open PostgreSQL/);
      expect(performance.now() - t1).toBeLessThan(timeoutMs + 1_000);
    } finally {
      frozen = false;
      await db.close().catch(() => {});
    }
  });
});

describe("listener limit flags", () => {
  it("are read from flags and the environment, with defaults, and a headers timeout over the request timeout is refused", () => {
    const d = loadConfig("serve", {}, {});
    expect([d.headersTimeoutMs, d.requestTimeoutMs, d.bodyIdleTimeoutMs, d.keepAliveTimeoutMs, d.maxConnections]).toEqual([
      10_000, 120_000, 10_000, 65_000, 1024,
    ]);
    expect([d.maxConnectionsPerPeer, d.firstByteTimeoutMs]).toEqual([256, 3_000]);
    const p = loadConfig("serve", { "max-connections-per-peer": "8" }, { CTXBANK_FIRST_BYTE_TIMEOUT_MS: "1500" });
    expect([p.maxConnectionsPerPeer, p.firstByteTimeoutMs]).toEqual([8, 1_500]);
    const c = loadConfig("serve", { "body-idle-timeout-ms": "2500", "max-connections": "64" }, { CTXBANK_HEADERS_TIMEOUT_MS: "3000" });
    expect([c.bodyIdleTimeoutMs, c.maxConnections, c.headersTimeoutMs]).toEqual([2500, 64, 3000]);
    expect(() => loadConfig("serve", { "headers-timeout-ms": "5000", "request-timeout-ms": "1000" }, {})).toThrow(ConfigError);
    expect(() => loadConfig("serve", { "max-connections": "0" }, {})).toThrow(/--max-connections/);
  });
});
