// Shared by the transport tests: wait for a server's port, and catch a TransportError.
import type http from "node:http";
import type { AddressInfo } from "node:net";
import { expect } from "vitest";

import { TransportError } from "../../shared/transport/errors.ts";

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
