// Listening and closing: an @hono/node-server bound to host:port (0 = any free port) with
// bounded request intake and a close that stops accepting, lets in-flight requests finish within
// a deadline, then drops whatever is left.
//
// Intake limits (ListenLimits): a connection cap, in all and per peer address (at the cap, a new
// connection closes the oldest one serving no request, so idle or half-sent connections cannot
// keep real clients out; only when every connection is serving one is the new one dropped), a
// deadline for a connection's first byte, one for a request's headers and one for the whole
// request (Node's own, answered 408), a body idle timeout (no body byte for that long: 408 and
// the connection closed; a sweep over the requests whose body is still arriving), and a
// keep-alive idle timeout. None of them touches a response: once a request is received, an SSE
// stream runs as long as it needs.
import type http from "node:http";
import type { AddressInfo, Socket } from "node:net";
import { serve } from "@hono/node-server";
import { errorBody } from "./errors.ts";

/** Set on a request (node's IncomingMessage) whose body stalled: the reason, for the 408. */
export const BODY_TIMED_OUT = Symbol("ctxbank.bodyTimedOut");
type TimedOut = http.IncomingMessage & { [BODY_TIMED_OUT]?: string };

/** The stall reason when `incoming` (node's request) timed out reading its body. */
export function bodyTimedOut(incoming: unknown): string | undefined {
  return (incoming as TimedOut | undefined)?.[BODY_TIMED_OUT];
}

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

export interface ListenLimits {
  /** Time from a connection's (or a keep-alive request's) first byte to the end of its headers. */
  headersTimeoutMs: number;
  /** Time to receive a whole request, headers and body. */
  requestTimeoutMs: number;
  /** Longest pause between two body bytes before the request is answered 408 and its connection closed. */
  bodyIdleTimeoutMs: number;
  keepAliveTimeoutMs: number;
  /** Connections open at once (in all, and from one peer address); see evict() for what one more does. */
  maxConnections: number;
  maxConnectionsPerPeer: number;
  /** Time from accepting a connection to its first byte; then it is closed. */
  firstByteTimeoutMs: number;
}

export const DEFAULT_LIMITS: ListenLimits = {
  headersTimeoutMs: 10_000,
  requestTimeoutMs: 120_000,
  bodyIdleTimeoutMs: 10_000,
  keepAliveTimeoutMs: 65_000,
  maxConnections: 1024,
  maxConnectionsPerPeer: 256,
  firstByteTimeoutMs: 3_000,
};

export async function listen(
  fetch: (req: Request) => Response | Promise<Response>,
  host: string,
  port: number,
  limits: ListenLimits = DEFAULT_LIMITS,
): Promise<Listening> {
  let inFlight = 0;
  const idle: Array<() => void> = [];
  const server = serve({
    fetch,
    hostname: host,
    port,
    serverOptions: {
      headersTimeout: limits.headersTimeoutMs,
      requestTimeout: limits.requestTimeoutMs,
      keepAliveTimeout: limits.keepAliveTimeoutMs,
      // How often Node checks the headers and request deadlines (its default is 30 s).
      connectionsCheckingInterval: Math.max(100, Math.min(1_000, limits.headersTimeoutMs / 4)),
    },
  }) as http.Server;
  const connections = limitConnections(server, limits);
  const bodies = watchBodies(server, limits.bodyIdleTimeoutMs);
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
        bodies.stop();
        connections.stop();
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

interface Connection {
  peer: string;
  /** Requests being served on it now (a response may outlive its request). */
  serving: number;
  acceptedAt: number;
}

/**
 * The connection caps and the first-byte deadline. Connections are kept in accept order; at a
 * cap, the new connection closes the oldest connection (of that peer, for the per-peer cap) that
 * serves no request: one still sending its headers, or idle between keep-alive requests. Only
 * when every such connection is serving a request is the new one closed instead.
 */
function limitConnections(server: http.Server, limits: ListenLimits): { stop(): void } {
  const open = new Map<Socket, Connection>();
  const perPeer = new Map<string, number>();
  const evict = (from: string | undefined): boolean => {
    for (const [socket, c] of open) {
      if (c.serving === 0 && (from === undefined || c.peer === from)) {
        socket.destroy();
        return true;
      }
    }
    return false;
  };
  server.on("connection", (socket: Socket) => {
    const peer = socket.remoteAddress ?? "";
    if ((perPeer.get(peer) ?? 0) >= limits.maxConnectionsPerPeer && !evict(peer)) return socket.destroy();
    if (open.size >= limits.maxConnections && !evict(undefined)) return socket.destroy();
    open.set(socket, { peer, serving: 0, acceptedAt: performance.now() });
    perPeer.set(peer, (perPeer.get(peer) ?? 0) + 1);
    socket.once("close", () => {
      if (!open.delete(socket)) return;
      const left = perPeer.get(peer)! - 1;
      if (left > 0) perPeer.set(peer, left);
      else perPeer.delete(peer);
    });
  });
  server.on("request", (req: http.IncomingMessage, res: http.ServerResponse) => {
    const c = open.get(req.socket);
    if (!c) return;
    c.serving++;
    res.once("close", () => c.serving--);
  });
  // Connections that sent nothing within the first-byte deadline (accept order: the oldest first).
  const sweep = setInterval(
    () => {
      const now = performance.now();
      for (const [socket, c] of open) {
        if (now - c.acceptedAt < limits.firstByteTimeoutMs) break;
        if (socket.bytesRead === 0 && c.serving === 0) socket.destroy();
      }
    },
    Math.max(50, Math.min(1_000, limits.firstByteTimeoutMs / 4)),
  );
  sweep.unref();
  return { stop: () => clearInterval(sweep) };
}

/**
 * The body idle timeout: every request whose body is still arriving is checked a few times per
 * timeout; one whose connection read nothing for the whole timeout is answered 408 and closed.
 */
function watchBodies(server: http.Server, idleMs: number): { stop(): void } {
  const arriving = new Map<http.IncomingMessage, { res: http.ServerResponse; bytes: number; at: number }>();
  server.on("request", (req: http.IncomingMessage, res: http.ServerResponse) => {
    if (req.complete) return;
    arriving.set(req, { res, bytes: req.socket.bytesRead, at: performance.now() });
    res.once("close", () => arriving.delete(req));
  });
  const sweep = setInterval(
    () => {
      const now = performance.now();
      for (const [req, w] of arriving) {
        if (req.complete || req.socket.destroyed) {
          arriving.delete(req);
          continue;
        }
        const bytes = req.socket.bytesRead;
        if (bytes !== w.bytes) {
          w.bytes = bytes;
          w.at = now;
          continue;
        }
        if (now - w.at < idleMs) continue;
        arriving.delete(req);
        requestTimedOut(req, w.res, idleMs);
      }
    },
    Math.max(50, Math.min(1_000, idleMs / 4)),
  );
  sweep.unref();
  return { stop: () => clearInterval(sweep) };
}

/**
 * A request whose body stalled. When a handler is reading the body, the read fails and the app
 * answers 408 itself (app.ts maps a marked request's error to it), so the handler ends and logs
 * like any other; otherwise, or if nothing is answered within a second, the 408 is written here.
 * Either way the connection is closed.
 */
function requestTimedOut(req: http.IncomingMessage, res: http.ServerResponse, idleMs: number): void {
  const message = `no request body byte arrived for ${idleMs} ms; the connection is closed`;
  (req as TimedOut)[BODY_TIMED_OUT] = message;
  res.shouldKeepAlive = false;
  res.once("finish", () => req.socket.end());
  if (req.listenerCount("error") > 0) req.emit("error", Object.assign(new Error(message), { code: "ERR_BODY_IDLE_TIMEOUT" }));
  setTimeout(() => {
    if (!res.headersSent) {
      const body = JSON.stringify(errorBody(408, "request_timeout", message));
      res.writeHead(408, { "content-type": "application/json", "content-length": Buffer.byteLength(body), connection: "close" });
      res.end(body);
    }
    setTimeout(() => req.socket.destroy(), 1_000).unref(); // a client that does not read its answer is not waited for
  }, 1_000).unref();
}
