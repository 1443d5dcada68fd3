// Separate prefill and decode services must share the internal secret: with another one, the
// decode's prefill call and its chunk reads are refused by the prefill's internal listener, and
// with the same one both work. (In one process over one runtime, as `ctxbank prefill` and
// `ctxbank decode` would run in two.)
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Handle } from "../../shared/platform/http/wire.ts";
import { startServices, type RunningServices } from "../../services/process.ts";
import { openRuntime, type Runtime } from "../../services/runtime.ts";
import { tempShardDir } from "../../tools/lib/services.ts";
import { postJson } from "../harness/http.ts";
import { testConfig } from "../harness/serve.ts";

const SECRET = "the-secret-every-service-of-this-cluster-holds";

describe("the shared internal secret between separate services", () => {
  let shards: Awaited<ReturnType<typeof tempShardDir>>;
  let rt: Runtime;
  let prefill: RunningServices;
  let good: RunningServices;
  let stranger: RunningServices;

  beforeAll(async () => {
    shards = await tempShardDir();
    const base = testConfig({ shardDir: shards.dir, shardBytes: 32 << 20, transport: "http" });
    rt = await openRuntime(base);
    prefill = await startServices({ ...base, role: "prefill", instanceId: "secret-prefill", internalSecret: SECRET }, rt);
    good = await startServices({ ...base, role: "decode", instanceId: "secret-decode", internalSecret: SECRET }, rt);
    stranger = await startServices(
      { ...base, role: "decode", instanceId: "stranger-decode", internalSecret: "another-secret-that-nobody-shares-000000" },
      rt,
    );
  });
  afterAll(async () => {
    await stranger?.stop();
    await good?.stop();
    await prefill?.stop();
    await rt?.close();
    await shards?.remove();
  });

  const chat = (s: RunningServices) =>
    postJson(`${s.url}/v1/chat/completions`, {
      model: "default",
      messages: [{ role: "user", content: "Hi" }],
      max_tokens: 2,
      temperature: 0,
    });

  it("a decode with another secret: its prefill call is refused (401 at the prefill, 502 prefill_failed to the client)", async () => {
    const res = await chat(stranger);
    expect(res.status).toBe(502);
    expect(res.body.error.code).toBe("prefill_failed");
    expect(res.body.error.message).toMatch(/401/);
  });

  it("a decode with another secret cannot read a handle's chunks either (the owner refuses its capability)", async () => {
    const handle = (await postJson(`${prefill.url}/v1/prefill`, { prompt: "Nobody else may read this", temperature: 0 })).body as Handle;
    const res = await postJson(`${stranger.url}/v1/decode`, { handle, max_tokens: 2, temperature: 0 });
    expect(res.status).toBe(502);
    expect(res.body.error.code).toBe("kv_load_failed");
    expect(res.body.error.message).toMatch(/unauthorized/);
  });

  it("with the shared secret both work", async () => {
    expect((await chat(good)).status).toBe(200);
    const handle = (await postJson(`${prefill.url}/v1/prefill`, { prompt: "The owner's decode reads this", temperature: 0 }))
      .body as Handle;
    const res = await postJson(`${good.url}/v1/decode`, { handle, max_tokens: 2, temperature: 0 });
    expect(res.status).toBe(200);
    expect(res.body.kv).toMatchObject({ transport: "http", recomputed: false });
  });
});
