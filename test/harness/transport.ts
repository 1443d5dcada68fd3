// Shared by the transport tests: wait for a server's port, catch a TransportError, and a chunk
// owner that misbehaves.
import http from "node:http";
import type { AddressInfo } from "node:net";
import { expect } from "vitest";

import { TransportError } from "../../services/handoff/transport/errors.ts";

export function listen(server: http.Server): Promise<number> {
  return new Promise((resolve) => {
    if (server.listening) resolve((server.address() as AddressInfo).port);
    else server.once("listening", () => resolve((server.address() as AddressInfo).port));
  });
}

export async function transportError(promise: Promise<unknown>): Promise<TransportError> {
  const err = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(TransportError);
  return err as TransportError;
}

/**
 * A chunk owner that misbehaves, by route, for a chunk of `length` bytes: /silent never answers;
 * /half sends half the body, then stalls; /cut drops the connection mid-body; /declared
 * announces one byte more than the chunk; /chunked sends the right bytes without a length;
 * /more and /fewer send a chunked body 10 bytes too long or short. Listens on loopback.
 */
export async function misbehavingOwner(length: number): Promise<{ url: string; close(): Promise<void> }> {
  const server = http.createServer((req, res) => {
    const route = req.url!.split("/")[1];
    if (route === "half") {
      res.writeHead(200, { "content-length": String(length) });
      res.write(Buffer.alloc(length >> 1, 1));
    } else if (route === "cut") {
      res.writeHead(200, { "content-length": String(length) });
      res.write(Buffer.alloc(length >> 1), () => res.socket?.destroy());
    } else if (route === "declared") {
      res.writeHead(200, { "content-length": String(length + 1) });
      res.end(Buffer.alloc(length + 1));
    } else if (route === "chunked" || route === "more" || route === "fewer") {
      res.writeHead(200);
      res.end(Buffer.alloc(length + (route === "more" ? 10 : route === "fewer" ? -10 : 0)));
    }
  });
  const url = `http://127.0.0.1:${await listen(server.listen(0, "127.0.0.1"))}`;
  return {
    url,
    close: async () => {
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    },
  };
}
