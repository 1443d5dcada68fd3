// Listening and closing: an @hono/node-server bound to host:port (0 = any free port) with
// SSE-friendly timeouts, and a close that stops accepting, lets in-flight requests finish within
// a deadline, then drops whatever is left.
import type http from "node:http";
import type { AddressInfo } from "node:net";
import { serve } from "@hono/node-server";

export interface Listening {
  server: http.Server;
  port: number;
  /** http://host:port with the bound port. */
  url: string;
  /** Requests being served now. */
  readonly inFlight: number;
  /** Stops accepting, waits up to `drainMs` for in-flight requests, then closes every connection. */
  close(drainMs?: number): Promise<void>;
}

export async function listen(fetch: (req: Request) => Response | Promise<Response>, host: string, port: number): Promise<Listening> {
  let inFlight = 0;
  const idle: Array<() => void> = [];
  const server = serve({ fetch, hostname: host, port }) as http.Server;
  server.requestTimeout = 0; // long generations and SSE streams
  server.headersTimeout = 30_000;
  server.keepAliveTimeout = 65_000;
  server.on("request", (_req, res) => {
    inFlight++;
    res.once("close", () => {
      inFlight--;
      if (inFlight === 0) idle.splice(0).forEach((f) => f());
    });
  });
  await new Promise<void>((resolve, reject) => {
    if (server.listening) return resolve();
    server.once("listening", resolve);
    server.once("error", reject);
  });
  const bound = (server.address() as AddressInfo).port;
  const shownHost = host === "0.0.0.0" || host === "::" ? "127.0.0.1" : host.includes(":") ? `[${host}]` : host;
  let closing: Promise<void> | undefined;
  return {
    server,
    port: bound,
    url: `http://${shownHost}:${bound}`,
    get inFlight() {
      return inFlight;
    },
    close(drainMs = 10_000) {
      closing ??= (async () => {
        const closed = new Promise<void>((r) => server.close(() => r()));
        server.closeIdleConnections();
        if (inFlight > 0) {
          await Promise.race([new Promise<void>((r) => idle.push(r)), new Promise((r) => setTimeout(r, drainMs).unref())]);
        }
        server.closeAllConnections();
        await closed;
      })();
      return closing;
    },
  };
}
