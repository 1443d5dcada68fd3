// The router's forward (services/router/forward.ts) against a local HTTP server standing in for a
// decode: a decode slower to start its answer than --router-timeout-ms is a 504 decode_timeout
// (it was a 500 internal_error, undici's HeadersTimeoutError unmapped), one that cannot be reached
// is Unreachable (the next choice is tried), and an answer in time streams through.
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { forward, Unreachable, type Outgoing } from "../../services/router/forward.ts";
import { ApiError } from "../../shared/platform/http/errors.ts";

let server: Server;
let url: string;

beforeAll(async () => {
  // Answers after ?delay= milliseconds.
  server = createServer((req, res) => {
    const delay = Number(new URL(req.url!, "http://x").searchParams.get("delay") ?? 0);
    setTimeout(() => res.writeHead(200, { "content-type": "application/json" }).end('{"ok":true}'), delay);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(() => new Promise<void>((r) => server.close(() => r())));

const outgoing = (path: string, timeoutMs: number): Outgoing => ({
  method: "GET",
  path,
  headers: new Headers(),
  body: undefined,
  signal: new AbortController().signal,
  timeoutMs,
});

describe("router forward", () => {
  it("answers 504 decode_timeout when the decode starts its answer past the deadline", async () => {
    const err = await forward(url, outgoing("/slow?delay=1500", 300)).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ApiError);
    expect(err).toMatchObject({ status: 504, code: "decode_timeout" });
    expect((err as Error).message).toMatch(/within 300 ms \(--router-timeout-ms\)/);
  });

  it("streams an answer that starts in time", async () => {
    const res = await forward(url, outgoing("/fine?delay=50", 2000));
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ ok: true });
  });

  it("a decode that cannot be reached is Unreachable: the router tries the next one", async () => {
    const closed = createServer();
    await new Promise<void>((r) => closed.listen(0, "127.0.0.1", r));
    const port = (closed.address() as AddressInfo).port;
    await new Promise<void>((r) => closed.close(() => r()));
    const err = await forward(`http://127.0.0.1:${port}`, outgoing("/", 1000)).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Unreachable);
  });
});
