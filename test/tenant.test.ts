// Whose work a request is (shared/http/tenant.ts): the forwarded tenant header is honoured only
// for a caller without a key of its own, so a client with a key cannot charge another key's
// queue turn or shard share.
import { Hono } from "hono";
import { describe, expect, it } from "vitest";
import type { AppEnv } from "../shared/http/app.ts";
import { forwardedTenant, requestTenant, TENANT_HEADER } from "../shared/http/tenant.ts";

function app(key?: string) {
  const a = new Hono<AppEnv>();
  a.use("*", async (c, next) => {
    if (key !== undefined) c.set("tenant", key);
    await next();
  });
  a.get("/", (c) => c.json({ own: requestTenant(c), forwarded: forwardedTenant(c) }));
  return a;
}

const ask = async (a: Hono<AppEnv>, header?: string) =>
  (await (await a.request("/", { headers: header === undefined ? {} : { [TENANT_HEADER]: header } })).json()) as { own: string; forwarded: string };

describe("tenant", () => {
  it("is local when keyless; the forwarded header names the client a decode calls for", async () => {
    expect(await ask(app())).toEqual({ own: "local", forwarded: "local" });
    expect(await ask(app(), "key-a")).toEqual({ own: "local", forwarded: "key-a" });
    expect(await ask(app(), "bad tenant!")).toEqual({ own: "local", forwarded: "local" });
  });

  it("a caller with a key of its own cannot charge another key", async () => {
    expect(await ask(app("key-b"), "key-a")).toEqual({ own: "key-b", forwarded: "key-b" });
  });
});
