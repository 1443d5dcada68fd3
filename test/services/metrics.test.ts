// /metrics against what the requests themselves report: a known sequence of requests (OpenAI
// client, streamed and not, a bad one, a cancelled one, /v1/decode), then exact values from the
// scrape — counts per finish reason and error code, token counters equal to the answers' usage,
// histogram counts and sums equal to the answers' own timings, SLO counters equal to the answers'
// own verdicts, the KV back to 0, transfer bytes equal to what the prefill wrote. Then the same
// split over a prefill and a decode service (HTTP transport), each with its own registry.
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { CtxbankExtension } from "../../shared/platform/http/wire.ts";
import { startServices, type RunningServices } from "../../services/process.ts";
import { openRuntime, type Runtime } from "../../services/runtime.ts";
import { parseProm, scrape, type Scrape } from "../harness/prom.ts";
import { TEST_INTERNAL_SECRET, getJson, tempShardDir, until } from "../../tools/lib/services.ts";
import { parseSse, postJson } from "../harness/http.ts";
import { type Serve, startServe, testConfig } from "../harness/serve.ts";

const FAMILIES: Record<string, string> = {
  "ctxbank:time_to_first_token_seconds": "histogram",
  "ctxbank:time_per_output_token_seconds": "histogram",
  "ctxbank:inter_token_latency_seconds": "histogram",
  "ctxbank:e2e_request_latency_seconds": "histogram",
  "ctxbank:request_queue_time_seconds": "histogram",
  "ctxbank:kv_transfer_seconds": "histogram",
  "ctxbank:prompt_tokens_total": "counter",
  "ctxbank:generation_tokens_total": "counter",
  "ctxbank:prefill_tokens_total": "counter",
  "ctxbank:request_success_total": "counter",
  "ctxbank:request_failure_total": "counter",
  "ctxbank:kv_transfer_bytes_total": "counter",
  "ctxbank:kv_transfer_failures_total": "counter",
  "ctxbank:lease_expiries_total": "counter",
  "ctxbank:slo_met_total": "counter",
  "ctxbank:slo_missed_total": "counter",
  "ctxbank:num_requests_running": "gauge",
  "ctxbank:num_requests_waiting": "gauge",
  "ctxbank:kv_bytes_in_use": "gauge",
  "ctxbank:kv_bytes_capacity": "gauge",
  "ctxbank:slo_target_seconds": "gauge",
  "ctxbank:engine_device_info": "gauge",
};

const SHARD_BYTES = 64 << 20;
const KV_BUDGET = 512 << 20;
const MiB = 1 << 20;

/** What one finished request told its client. */
interface Answer {
  finish: string;
  usage: { prompt_tokens: number; completion_tokens: number };
  ctxbank: CtxbankExtension;
}

const sumOf = (answers: Answer[], f: (a: Answer) => number) => answers.reduce((s, a) => s + f(a), 0);
const countOf = (answers: Answer[], f: (a: Answer) => boolean) => answers.filter(f).length;

describe("metrics on `serve` (both services, one registry)", () => {
  let s: Serve;
  let url: string;
  let client: OpenAI;
  const answers: Answer[] = [];

  beforeAll(async () => {
    // A generous TTFT objective (all meet it) and an impossible TPOT one (all with 2+ tokens miss it).
    s = await startServe({ shardBytes: SHARD_BYTES, kvBudgetBytes: KV_BUDGET, sloTtftMs: 60_000, sloTpotMs: 0.001 });
    url = s.url;
    client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused", maxRetries: 0 });
  });

  afterAll(() => s?.stop());

  it("exports every fixed family once, typed, with process metrics and the Prometheus content type", async () => {
    const res = await fetch(`${url}/metrics`);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toMatch(/^text\/plain; version=0\.0\.4/);
    const m = parseProm(await res.text());
    for (const [name, type] of Object.entries(FAMILIES)) expect([name, m.families.get(name)?.type]).toEqual([name, type]);
    expect(m.families.get("ctxbank:kv_bytes_in_use")?.help).toMatch(/host: the host-memory context bank of OmniKV offload/);
    expect(m.count("process_cpu_user_seconds_total")).toBe(1);
    expect(m.count("nodejs_eventloop_lag_seconds")).toBe(1);
    // Both services' gauges, every series labelled with the model.
    expect(
      m.samples
        .filter((x) => x.name === "ctxbank:num_requests_running")
        .map((x) => x.labels.service)
        .sort(),
    ).toEqual(["decode", "prefill"]);
    expect(m.samples.filter((x) => x.name === "ctxbank:kv_bytes_capacity").map((x) => [x.labels.tier, x.value])).toEqual(
      expect.arrayContaining([
        ["device", KV_BUDGET],
        ["host", 0],
        ["shard", SHARD_BYTES],
      ]),
    );
    expect(m.samples.filter((x) => x.name.startsWith("ctxbank:")).every((x) => x.labels.model === s.rt.modelId)).toBe(true);
    expect(m.get("ctxbank:slo_target_seconds", { slo: "ttft" })).toBe(60);
    expect(m.get("ctxbank:slo_target_seconds", { slo: "tpot" })).toBe(0.000001);
    expect(m.count("ctxbank:slo_target_seconds", { slo: "e2e" })).toBe(0);
    expect(m.sum("ctxbank:request_success_total")).toBe(0);
    expect((await getJson(`${url}/openapi.json`)).body.paths["/metrics"].get).toBeDefined();
  });

  it("counts a known sequence exactly as the answers report it", async () => {
    for (const [i, prompt] of ["The capital of France is", "Once upon a time, a fox", "Water boils at a temperature of"].entries()) {
      const r = await client.completions.create({ model: "default", prompt, max_tokens: 5, temperature: 0, seed: i });
      answers.push({
        finish: r.choices[0]!.finish_reason!,
        usage: r.usage!,
        ctxbank: (r as unknown as { ctxbank: CtxbankExtension }).ctxbank,
      });
    }
    const stream = await client.chat.completions.create({
      model: "default",
      messages: [{ role: "user", content: "Name a color." }],
      max_tokens: 5,
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk as typeof chunk & { ctxbank?: CtxbankExtension });
    // The extension rides on the last chunk before [DONE] (here the usage chunk); before it, only
    // the first token's chunk carries a part of it: the policy that runs.
    expect(chunks.map((c) => c.ctxbank !== undefined)).toEqual([true, ...Array(chunks.length - 2).fill(false), true]);
    expect(Object.keys(chunks[0]!.ctxbank!)).toEqual(["policy"]);
    const finishChunk = chunks.find((c) => c.choices[0]?.finish_reason);
    answers.push({ finish: finishChunk!.choices[0]!.finish_reason!, usage: chunks.at(-1)!.usage!, ctxbank: chunks.at(-1)!.ctxbank! });
    await expect(client.completions.create({ model: "default", prompt: "x", temperature: 5 })).rejects.toMatchObject({
      status: 400,
      code: "invalid_request",
    });

    for (const a of answers) {
      const t = a.ctxbank.timings;
      expect(t.output_tokens).toBe(a.usage.completion_tokens);
      expect(t.ttft_ms).toBeGreaterThan(0);
      expect(t.ttft_ms).toBeLessThanOrEqual(t.e2e_ms);
      if (t.output_tokens > 1) expect(t.tpot_ms!).toBeCloseTo((t.e2e_ms - t.ttft_ms) / (t.output_tokens - 1), 2);
      expect(a.ctxbank.slo).toEqual({ ttft: true, tpot: t.output_tokens < 2, all: t.output_tokens < 2 });
    }

    const m = await scrape(url);
    const internal = (f: string) => (f === "length" ? "length" : "stop"); // no stop strings were asked for
    for (const reason of ["stop", "length"]) {
      expect([reason, m.get("ctxbank:request_success_total", { finished_reason: reason })]).toEqual([
        reason,
        countOf(answers, (a) => internal(a.finish) === reason),
      ]);
    }
    expect(m.get("ctxbank:request_success_total", { finished_reason: "stop_string" })).toBe(0);
    expect(m.samples.filter((x) => x.name === "ctxbank:request_failure_total").map((x) => [x.labels.code, x.value])).toEqual([
      ["invalid_request", 1],
    ]);

    const completion = sumOf(answers, (a) => a.usage.completion_tokens);
    const prompt = sumOf(answers, (a) => a.usage.prompt_tokens);
    expect(m.get("ctxbank:generation_tokens_total")).toBe(completion);
    expect(m.get("ctxbank:prompt_tokens_total")).toBe(prompt);
    expect(m.get("ctxbank:prefill_tokens_total")).toBe(prompt);

    const n = answers.length;
    for (const h of ["time_to_first_token", "e2e_request_latency", "request_queue_time"])
      expect([h, m.get(`ctxbank:${h}_seconds_count`)]).toEqual([h, n]);
    expect(m.get("ctxbank:time_to_first_token_seconds_bucket", { le: "+Inf" })).toBe(n);
    expect(m.get("ctxbank:time_per_output_token_seconds_count")).toBe(countOf(answers, (a) => a.usage.completion_tokens > 1));
    expect(m.get("ctxbank:inter_token_latency_seconds_count")).toBe(completion - n);
    // The histograms hold the very figures each answer reported (rounded there to the microsecond).
    expect(m.get("ctxbank:time_to_first_token_seconds_sum")).toBeCloseTo(sumOf(answers, (a) => a.ctxbank.timings.ttft_ms) / 1000, 4);
    expect(m.get("ctxbank:e2e_request_latency_seconds_sum")).toBeCloseTo(sumOf(answers, (a) => a.ctxbank.timings.e2e_ms) / 1000, 4);

    for (const slo of ["ttft", "tpot", "all"] as const) {
      const met = countOf(answers, (a) => a.ctxbank.slo[slo] === true);
      expect([slo, m.get("ctxbank:slo_met_total", { slo }), m.get("ctxbank:slo_missed_total", { slo })]).toEqual([slo, met, n - met]);
    }
    expect(m.get("ctxbank:slo_missed_total", { slo: "tpot" })).toBeGreaterThan(0);

    // One process: every prefill handed its sequence to the decode, so no KV was written or moved.
    const written = (await getJson(`${s.internalUrl}/v1/prefill/status`, { authorization: `Bearer ${s.security.internalSecret}` })).body
      .totals.bytes_written as number;
    expect(written).toBe(0);
    expect(answers.every((a) => a.ctxbank.handoff?.path === "in_process")).toBe(true);
    expect(m.get("ctxbank:kv_transfer_bytes_total", { transport: "shm" })).toBe(0);
    expect(m.get("ctxbank:kv_transfer_bytes_total", { transport: "http" })).toBe(0);
    expect(m.count("ctxbank:kv_transfer_seconds_count")).toBe(0);
    expect(m.count("ctxbank:kv_transfer_failures_total")).toBe(0);

    expect(m.get("ctxbank:kv_bytes_in_use", { tier: "device" })).toBe(0);
    expect(m.get("ctxbank:kv_bytes_in_use", { tier: "host" })).toBe(0);
    for (const service of ["prefill", "decode"]) {
      expect(m.get("ctxbank:num_requests_running", { service })).toBe(0);
      expect(m.get("ctxbank:num_requests_waiting", { service })).toBe(0);
    }
    expect(m.get("ctxbank:prefill_tokens_per_second")).toBeGreaterThan(0);
  });

  it("a cancelled stream is one client_closed failure; its KV is freed and nothing else is recorded for it", async () => {
    const before = await scrape(url);
    const ac = new AbortController();
    const res = await fetch(`${url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: "default",
        prompt: "Count from one to a thousand: one, two,",
        max_tokens: 400,
        temperature: 0,
        stream: true,
      }),
      signal: ac.signal,
    });
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    await reader.read();
    // While it runs, it holds its KV reservation on the device tier.
    const during = await scrape(url);
    expect(during.get("ctxbank:kv_bytes_in_use", { tier: "device" })).toBeGreaterThan(0);
    ac.abort();
    await until("the cancel is counted", () => s.services.decode!.status().totals.cancelled === 1, 20_000);
    // The sequence leaves the batch at the end of the step in flight when the cancel came.
    await until("the cancelled sequence leaves the batch", () => s.services.decode!.status().running === 0);

    const m = await scrape(url);
    const delta = (name: string, match?: Record<string, string>) => m.sum(name, match) - before.sum(name, match);
    expect(delta("ctxbank:request_failure_total", { code: "client_closed" })).toBe(1);
    expect(delta("ctxbank:request_failure_total")).toBe(1);
    expect(delta("ctxbank:request_success_total")).toBe(0);
    expect(delta("ctxbank:time_to_first_token_seconds_count")).toBe(0);
    expect(delta("ctxbank:slo_met_total") + delta("ctxbank:slo_missed_total")).toBe(0);
    // Its tokens still count as work done: the whole prompt, and what was generated before the cancel.
    expect(delta("ctxbank:prompt_tokens_total")).toBe(delta("ctxbank:prefill_tokens_total"));
    expect(delta("ctxbank:prompt_tokens_total")).toBeGreaterThan(5);
    expect(delta("ctxbank:generation_tokens_total")).toBeGreaterThanOrEqual(1);
    expect(delta("ctxbank:generation_tokens_total")).toBeLessThan(400);
    expect(m.get("ctxbank:kv_bytes_in_use", { tier: "device" })).toBe(0);
    expect(m.get("ctxbank:num_requests_running", { service: "decode" })).toBe(0);
  });

  it("/v1/decode answers (JSON and SSE) carry the extension; an error thrown in decode is counted once", async () => {
    const before = await scrape(url);
    const handle = (await postJson(`${url}/v1/prefill`, { prompt: "Metrics are", temperature: 0 })).body;
    const out = await postJson(`${url}/v1/decode`, { handle, max_tokens: 3 });
    expect(out.status).toBe(200);
    expect(out.body.ctxbank.timings.output_tokens).toBe(out.body.usage.completion_tokens);
    expect(out.body.ctxbank.timings.ttft_ms).toBeCloseTo(out.body.ttft_ms, 2);
    expect(out.body.ctxbank.slo.ttft).toBe(true);
    // The spent handle: 409 from inside the decode service (counted there, not again by the HTTP layer).
    expect((await postJson(`${url}/v1/decode`, { handle, max_tokens: 3 })).body.error.code).toBe("handle_released");

    const handle2 = (await postJson(`${url}/v1/prefill`, { prompt: "Streams are", temperature: 0 })).body;
    const res = await fetch(`${url}/v1/decode`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ handle: handle2, max_tokens: 3, stream: true }),
    });
    const done = parseSse(await res.text()).find((e) => e.event === "done")!;
    const result = JSON.parse(done.data);
    expect(result.ctxbank.timings.output_tokens).toBe(result.usage.completion_tokens);

    const m = await scrape(url);
    const delta = (name: string, match?: Record<string, string>) => m.sum(name, match) - before.sum(name, match);
    expect(delta("ctxbank:request_success_total")).toBe(2);
    expect(delta("ctxbank:request_failure_total", { code: "handle_released" })).toBe(1);
    expect(delta("ctxbank:request_failure_total")).toBe(1);
    expect(delta("ctxbank:generation_tokens_total")).toBe(out.body.usage.completion_tokens + result.usage.completion_tokens);
  });
});

describe("metrics split over a prefill and a decode service (HTTP transport)", () => {
  let shards: Awaited<ReturnType<typeof tempShardDir>>;
  let rt: Runtime;
  let prefill: RunningServices;
  let decode: RunningServices;

  beforeAll(async () => {
    shards = await tempShardDir();
    // Two services in this process over one engine and registry (what `ctxbank prefill` and
    // `ctxbank decode` do in two), each with its own app and metrics registry.
    const base = testConfig({
      shardDir: shards.dir,
      shardBytes: SHARD_BYTES,
      transport: "http",
      retainMs: 1_500,
      reapMs: 100,
      internalSecret: TEST_INTERNAL_SECRET, // two services: one shared secret
    });
    rt = await openRuntime(base);
    prefill = await startServices({ ...base, role: "prefill", instanceId: "metrics-prefill" }, rt);
    decode = await startServices({ ...base, role: "decode", instanceId: "metrics-decode" }, rt);
  });

  afterAll(async () => {
    await decode?.stop();
    await prefill?.stop();
    await rt?.close();
    await shards?.remove();
  });

  it("each process exports its own service's series; bytes read over HTTP equal the bytes the prefill wrote", async () => {
    const usages = [];
    for (const prompt of ["Separate processes, one", "Separate processes, two"]) {
      const r = await postJson(`${decode.url}/v1/completions`, { model: "default", prompt, max_tokens: 4, temperature: 0 });
      expect(r.status).toBe(200);
      usages.push(r.body.usage as { prompt_tokens: number; completion_tokens: number });
    }
    const [p, d] = await Promise.all([scrape(prefill.url), scrape(decode.url)]);
    const prompt = usages.reduce((a, u) => a + u.prompt_tokens, 0);

    expect(p.get("ctxbank:prefill_tokens_total")).toBe(prompt);
    expect(p.samples.filter((x) => x.name === "ctxbank:num_requests_running").map((x) => x.labels.service)).toEqual(["prefill"]);
    expect(p.samples.filter((x) => x.name === "ctxbank:kv_bytes_capacity").map((x) => [x.labels.tier, x.value])).toEqual([
      ["shard", SHARD_BYTES],
    ]);
    expect(p.sum("ctxbank:request_success_total")).toBe(0);
    expect(p.sum("ctxbank:kv_transfer_bytes_total")).toBe(0);

    expect(d.get("ctxbank:prefill_tokens_total")).toBe(0);
    expect(d.get("ctxbank:prompt_tokens_total")).toBe(prompt);
    expect(
      d.get("ctxbank:request_success_total", { finished_reason: "length" }) +
        d.get("ctxbank:request_success_total", { finished_reason: "stop" }),
    ).toBe(2);
    expect(d.samples.filter((x) => x.name === "ctxbank:num_requests_running").map((x) => x.labels.service)).toEqual(["decode"]);
    expect(
      d.samples
        .filter((x) => x.name === "ctxbank:kv_bytes_in_use")
        .map((x) => x.labels.tier)
        .sort(),
    ).toEqual(["device", "host", "pool"]);
    // The pool of freed KV memory: what it keeps never exceeds its limit (--kv-pool-mib, 1 GiB by default).
    const pool = (name: string) => d.samples.find((x) => x.name === name && x.labels.tier === "pool")!.value;
    expect(pool("ctxbank:kv_bytes_capacity")).toBe(2 ** 30);
    expect(pool("ctxbank:kv_bytes_in_use")).toBeLessThanOrEqual(pool("ctxbank:kv_bytes_capacity"));
    const written = (await getJson(`${prefill.internalUrl}/v1/prefill/status`, { authorization: `Bearer ${TEST_INTERNAL_SECRET}` })).body
      .totals.bytes_written as number;
    expect(written).toBeGreaterThan(0);
    expect(d.get("ctxbank:kv_transfer_bytes_total", { transport: "http" })).toBe(written);
    expect(d.get("ctxbank:kv_transfer_bytes_total", { transport: "shm" })).toBe(0);
    expect(d.get("ctxbank:kv_transfer_seconds_count", { transport: "http" })).toBe(usages.filter((u) => u.completion_tokens > 1).length);
  });

  it("the prefill's reaper counts the leases that ran out; decode counts the expired handle as a transfer failure", async () => {
    const before = await scrape(prefill.url);
    const handle = (await postJson(`${prefill.url}/v1/prefill`, { prompt: "Nobody reads this in time", temperature: 0 })).body;
    expect(handle.chunk_ids).toHaveLength(1);
    const shardUsed = (await scrape(prefill.url)).get("ctxbank:kv_bytes_in_use", { tier: "shard" });
    expect(shardUsed).toBeGreaterThan(0);
    await until(
      "the lease expiry is counted",
      async () => (await scrape(prefill.url)).get("ctxbank:lease_expiries_total") > before.get("ctxbank:lease_expiries_total"),
      20_000,
    );
    const after = await scrape(prefill.url);
    expect(after.get("ctxbank:lease_expiries_total") - before.get("ctxbank:lease_expiries_total")).toBe(1);
    expect(after.get("ctxbank:kv_bytes_in_use", { tier: "shard" })).toBeLessThan(shardUsed);

    const res = await postJson(`${decode.url}/v1/decode`, { handle, max_tokens: 3 });
    expect(res.body.error.code).toBe("handle_expired");
    const d: Scrape = await scrape(decode.url);
    expect(d.get("ctxbank:kv_transfer_failures_total", { transport: "none", reason: "expired" })).toBe(1);
    expect(d.get("ctxbank:request_failure_total", { code: "handle_expired" })).toBe(1);
  });
});

describe("SLO admission (--admission slo)", () => {
  let s: Serve;

  beforeAll(async () => {
    // An objective no prefill can meet: once the first prefill has measured the throughput, every
    // prompt's predicted TTFT misses it.
    s = await startServe({ shardBytes: 16 * MiB, sloTtftMs: 0.5, admission: "slo", admissionMargin: 1 });
  });

  afterAll(() => s?.stop());

  it("admits while there is no estimate, then refuses with 429 slo_unattainable, counted as a failure", async () => {
    const body = { model: "default", prompt: "Admission control decides", max_tokens: 2, temperature: 0 };
    const first = await postJson(`${s.url}/v1/completions`, body);
    expect(first.status).toBe(200);
    expect(first.body.ctxbank.slo).toMatchObject({ ttft: false, all: false });
    const refused = await postJson(`${s.url}/v1/completions`, body);
    expect(refused.status).toBe(429);
    expect(refused.body.error).toMatchObject({ code: "slo_unattainable", type: "rate_limit_error" });
    expect(refused.body.error.message).toMatch(/predicted time to first token \d+ ms .* exceeds the 0.5 ms objective by more than 100%/);
    const m = await scrape(s.url);
    expect(m.get("ctxbank:request_failure_total", { code: "slo_unattainable" })).toBe(1);
    expect(m.get("ctxbank:slo_missed_total", { slo: "ttft" })).toBe(1);
    expect(m.get("ctxbank:prefill_tokens_total")).toBe(first.body.usage.prompt_tokens);
  });
});
