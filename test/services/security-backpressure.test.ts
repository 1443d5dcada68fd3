// Back-pressure and fairness through the real HTTP surface of `ctxbank serve` (the real model):
// the prefill gate and decode's calls to the prefill are bounded queues that answer 429
// queue_full with Retry-After and show their depth on /metrics; the prefill gate serves keys in
// turn, so one key's burst of long prompts does not hold another key's 2-token prompt behind
// all of it; and one key's unclaimed handles cannot take the whole shard (429 shard_full for it,
// room for the others). Each tenant is an API key of its own.
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from "vitest";
import { newApiKey } from "../../shared/platform/auth/api-keys.ts";
import { loadConfig } from "../../shared/platform/config.ts";
import type { Handle } from "../../shared/platform/http/wire.ts";
import { scrape } from "../harness/prom.ts";
import { until } from "../../tools/lib/services.ts";
import { postJson } from "../harness/http.ts";
import { type Serve, startDecodeBeside, startServe } from "../harness/serve.ts";

interface Answer {
  status: number;
  retryAfter: string | null;
  body: any;
  at: number;
}

/** One API key per tenant the tests use (generous limits: the queues are what is tested). */
const KEYS = Object.fromEntries(
  ["burst", "chat", "caller", "hog", "other"].map((id) => [id, newApiKey(id, { rate: 1000, burst: 1000, concurrency: 100 })]),
);
const KEY_LINES = Object.values(KEYS)
  .map((k) => k.line)
  .join("\n");

async function post(url: string, body: unknown, tenant = "caller"): Promise<Answer> {
  const res = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${KEYS[tenant]!.key}` },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, retryAfter: res.headers.get("retry-after"), body: JSON.parse(text), at: performance.now() };
}

/** A prompt of `n` token ids, distinct per `seed` (no chunk reuse between prompts). */
const ids = (n: number, seed: number) => Array.from({ length: n }, (_, i) => 200 + ((seed * 7919 + i * 13) % 40_000));

describe("bounded fair queues (serve, PGlite)", () => {
  let s: Serve;

  beforeAll(async () => {
    s = await startServe({
      shardBytes: 256 << 20,
      maxPrefills: 1,
      maxPrefillQueue: 4,
      maxPrefillCalls: 1,
      maxPrefillCallQueue: 2,
      apiKeys: KEY_LINES,
    });
  });
  afterAll(() => s?.stop());

  it("the prefill gate: a key's burst over the queue gets 429 queue_full with Retry-After, and another key's short prompt is served next, not last", async () => {
    const url = `${s.url}/v1/prefill`;
    const burst = Array.from({ length: 6 }, (_, i) => post(url, { prompt_token_ids: ids(384, i) }, "burst"));
    await until("the burst fills the prefill queue", () => s.services.prefill!.status().prefills_queued === 4, 20_000);
    const depth = (await scrape(s.url)).get("ctxbank:queue_depth", { stage: "prefill" });
    expect(depth).toBe(4);
    const chat = await post(url, { prompt_token_ids: [1, 2] }, "chat");
    const answers = await Promise.all(burst);

    expect(chat.status, JSON.stringify(chat.body)).toBe(200);
    const refused = answers.filter((a) => a.status === 429);
    const served = answers.filter((a) => a.status === 200);
    // 1 running + 4 waiting of 6; then the chat took the place of the burst's newest waiter.
    expect(refused).toHaveLength(2);
    expect(served).toHaveLength(4);
    for (const r of refused) {
      expect(r.body.error).toMatchObject({ code: "queue_full", type: "rate_limit_error" });
      expect(Number(r.retryAfter)).toBeGreaterThanOrEqual(1);
    }
    // Round robin: the chat waited for the prefill that was running and at most one more, not all of them.
    const servedBefore = served.filter((a) => a.at < chat.at).length;
    expect(servedBefore).toBeLessThanOrEqual(2);
    const m = await scrape(s.url);
    expect(m.get("ctxbank:queue_rejections_total", { stage: "prefill" })).toBe(2);
    expect(m.get("ctxbank:queue_depth", { stage: "prefill" })).toBe(0);
  });

  it("decode's prefill calls: a bounded, visible queue answering 429 queue_full with Retry-After beyond it", async () => {
    // `serve` prefills its own requests in process; the calls to prefill instances are what a decode-only process makes.
    const d = await startDecodeBeside(s);
    onTestFinished(() => d.stop());
    const url = `${d.url}/v1/completions`;
    const calls = Array.from({ length: 6 }, (_, i) =>
      post(url, { model: "default", prompt: ids(384, 100 + i), max_tokens: 2, temperature: 0 }),
    );
    await until("decode queues its prefill calls", () => d.services.decode!.handoff.prefillCalls.queued === 2, 20_000);
    const m = await scrape(d.url);
    expect(m.get("ctxbank:queue_depth", { stage: "prefill_calls" })).toBe(2);
    expect(m.get("ctxbank:num_requests_waiting", { service: "decode" })).toBeGreaterThanOrEqual(2);
    const answers = await Promise.all(calls);
    const refused = answers.filter((a) => a.status === 429);
    expect(answers.filter((a) => a.status === 200)).toHaveLength(3); // 1 in flight + 2 waiting
    expect(refused).toHaveLength(3);
    for (const r of refused) {
      expect(r.body.error.code).toBe("queue_full");
      expect(r.body.error.message).toMatch(/prefill_calls/);
      expect(Number(r.retryAfter)).toBeGreaterThanOrEqual(1);
    }
    const after = await scrape(d.url);
    expect(after.get("ctxbank:queue_rejections_total", { stage: "prefill_calls" })).toBe(3);
    expect(after.get("ctxbank:request_failure_total", { code: "queue_full" })).toBe(3);
  });
});

describe("per-key shard cap (serve, PGlite)", () => {
  let s: Serve;
  const perKey = 6 << 20;

  beforeAll(async () => {
    s = await startServe({ shardBytes: 16 << 20, blockTokens: 32, maxShardBytesPerKey: perKey, reapMs: 50, apiKeys: KEY_LINES });
  });
  afterAll(() => s?.stop());

  it("unclaimed handles of one key stop at its cap (429 shard_full with Retry-After); other keys still fit; a decoded handle frees its share", async () => {
    const url = `${s.url}/v1/prefill`;
    const held: Handle[] = [];
    let refused: Answer | undefined;
    for (let i = 0; i < 6 && !refused; i++) {
      const a = await post(url, { prompt_token_ids: ids(100, 300 + i) }, "hog");
      if (a.status === 200) held.push(a.body as Handle);
      else refused = a;
    }
    expect(held.length).toBeGreaterThanOrEqual(1);
    expect(refused?.status).toBe(429);
    expect(refused?.body.error.code).toBe("shard_full");
    expect(refused?.body.error.message).toMatch(/max-shard-bytes-per-key/);
    expect(Number(refused?.retryAfter)).toBeGreaterThanOrEqual(1);
    const shard = s.services.prefill!.status().shard!;
    expect(shard.bytes_used).toBeLessThanOrEqual(perKey);

    const other = await post(url, { prompt_token_ids: ids(100, 400) }, "other");
    expect(other.status, JSON.stringify(other.body)).toBe(200);

    // The hog decodes one of its handles: its chunks are released and reclaimed, and it fits again.
    const decoded = await postJson(`${s.url}/v1/decode`, { handle: held[0], max_tokens: 1 }, { authorization: `Bearer ${KEYS.hog!.key}` });
    expect(decoded.status, JSON.stringify(decoded.body)).toBe(200);
    await until(
      "the decoded handle's ranges are reclaimed",
      async () => (await post(url, { prompt_token_ids: ids(100, 500) }, "hog")).status === 200,
      10_000,
    );
  });

  it("the default retention of an unclaimed handle is 30 s and the default per-key cap half the shard", () => {
    const c = loadConfig("serve", {}, {});
    expect(c.retainMs).toBe(30_000);
    expect(c.maxShardBytesPerKey).toBeUndefined();
  });
});
