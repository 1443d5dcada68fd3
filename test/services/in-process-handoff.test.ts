// `serve` hands the prefill's sequence to the decode in process: no chunk written to the shard,
// no KV bytes read back, no HTTP call to its own prefill — and the same greedy tokens as the
// shard path (/v1/prefill, then /v1/decode with the handle: what separate processes do). What
// needs the prompt's queries (SCOPE's prompt pool, the OmniKV window selectors) comes with the
// handle on the shard path; a handle without it is decoded with a warning in the answer.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { argmax } from "../../shared/inference/engine/sampler.ts";
import type { AttentionPolicy } from "../../shared/inference/engine/native.ts";
import { policyDefaultsFor } from "../../shared/inference/policy/defaults.ts";
import type { Handle } from "../../shared/platform/http/wire.ts";
import type { DecodeEvent } from "../../services/decode/service.ts";
import { postJson } from "../harness/http.ts";
import { type Serve, startServe } from "../harness/serve.ts";

let s: Serve;
// ~170 tokens: several 64-token blocks on the shard path.
const PROMPT = "Once upon a time there was a lighthouse keeper who counted ships. ".repeat(12);

beforeAll(async () => {
  s = await startServe({ blockTokens: 64 });
});
afterAll(() => s?.stop());

async function transferBytes(): Promise<number> {
  const text = await s.metrics.text();
  let sum = 0;
  for (const line of text.split("\n")) if (line.startsWith("ctxbank:kv_transfer_bytes_total{")) sum += Number(line.split(" ").at(-1));
  return sum;
}

/** The decode service's own path (what the OpenAI routes call), collected. */
async function complete(prompt: string, maxTokens: number, policy?: unknown): Promise<Extract<DecodeEvent, { type: "done" }>> {
  const log = s.rt.log;
  const events = s.services.decode!.complete(
    { prompt },
    { maxTokens, temperature: 0, ...(policy ? { policy: policy as never } : {}) },
    new AbortController().signal,
    log,
  );
  let done: Extract<DecodeEvent, { type: "done" }> | undefined;
  for await (const ev of events) if (ev.type === "done") done = ev;
  return done!;
}

/** Greedy tokens of the engine alone, the policy set before the prompt (as in one process). */
async function engineGreedy(ids: number[], policy: AttentionPolicy, n: number): Promise<number[]> {
  const { engine } = s.rt;
  const seq = engine.createSequence(ids.length + n);
  seq.setPolicy(policy);
  const out = [argmax(await engine.prefill(seq, ids))];
  while (out.length < n && !s.rt.tokenizer.isEog(out.at(-1)!)) out.push(argmax((await engine.decode([seq], [out.at(-1)!]))[0]!));
  seq.release();
  return out;
}

describe("serve: the KV handoff in process", () => {
  it("writes no shard bytes, reads none, calls no prefill over HTTP, and gives the shard path's greedy tokens", async () => {
    const decode = s.services.decode!;
    const prefill = s.services.prefill!;
    const before = {
      prefill: prefill.status().totals,
      calls: decode.status().prefill_calls,
      bytes: await transferBytes(),
      inProcess: decode.status().totals.in_process,
    };
    const local = await complete(PROMPT, 16);
    expect(local.kv).toEqual({ transport: "in_process", chunks: 0, bytes: 0, ms: 0, recomputed: false });
    expect(local.ctxbank.handoff).toEqual({ path: "in_process" });
    const after = prefill.status();
    expect(after.totals.prefills).toBe(before.prefill.prefills + 1);
    expect(after.totals.chunks_written).toBe(before.prefill.chunks_written);
    expect(after.totals.bytes_written).toBe(before.prefill.bytes_written);
    expect(after.shard!.bytes_used).toBe(0);
    expect(decode.status().prefill_calls).toBe(before.calls);
    expect(await transferBytes()).toBe(before.bytes);
    expect(decode.status().totals.in_process).toBe(before.inProcess + 1);
    expect(decode.status()).toMatchObject({ live_sequences: 0, admitted: 0, kv_reserved_bytes: 0 });
    const row = await s.rt.registry.requests.get(local.requestId);
    expect(row).toMatchObject({ state: "done", prefillInstanceId: prefill.instanceId, decodeInstanceId: decode.instanceId });

    // The shard path in the same server: chunks written, read back over a transport.
    const p = await postJson(`${s.url}/v1/prefill`, { prompt: PROMPT });
    expect(p.status).toBe(200);
    const handle = p.body as Handle;
    const d = await postJson(`${s.url}/v1/decode`, { handle, max_tokens: 16, temperature: 0 });
    expect(d.status, JSON.stringify(d.body)).toBe(200);
    expect(d.body.kv.transport).not.toBe("in_process");
    expect(d.body.kv.bytes).toBeGreaterThan(0);
    expect(d.body.ctxbank.handoff).toEqual({ path: "shard", bytes: expect.any(Number) });
    expect(prefill.status().totals.bytes_written).toBeGreaterThan(before.prefill.bytes_written);
    expect(await transferBytes()).toBeGreaterThan(before.bytes);
    expect(handle.prompt_token_ids).toHaveLength(local.promptTokens);
    expect(local.tokenIds).toEqual(d.body.token_ids);
    expect(local.tokenIds).toEqual(await engineGreedy(handle.prompt_token_ids, { kind: "full" }, 16));
  });

  it("the OpenAI route goes in process too", async () => {
    const calls = s.services.decode!.status().prefill_calls;
    const res = await postJson(`${s.url}/v1/completions`, { model: s.rt.modelId, prompt: PROMPT, max_tokens: 8, temperature: 0 });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.ctxbank.handoff).toEqual({ path: "in_process" });
    expect(s.services.decode!.status().prefill_calls).toBe(calls);
    const ids = s.rt.tokenizer.encode(PROMPT);
    expect(res.body.choices[0].text).toBe(s.rt.tokenizer.decode(await engineGreedy(ids, { kind: "full" }, 8)));
  });

  it("SCOPE's prompt pool runs in process and over the shard path alike: the handle carries the prompt state", async () => {
    const n = 24;
    const spec = { kind: "scope", scope: { beta1: 64, beta2: 64, alpha1: 16, alpha2: 8 } };
    const ids = s.rt.tokenizer.encode(PROMPT);
    const pooled: AttentionPolicy = { kind: "scope", scope: { mode: "slide", beta1: 64, beta2: 64, maxOutput: n, alpha1: 16, alpha2: 8 } };
    const whole: AttentionPolicy = { kind: "scope", scope: { mode: "slide", beta1: 64, beta2: 64, maxOutput: n } };
    const withPool = await engineGreedy(ids, pooled, n);
    const withoutPool = await engineGreedy(ids, whole, n);
    // 24 of ~170 prompt tokens per layer and head: the pool changes what decode attends to.
    expect(withPool).not.toEqual(withoutPool);

    const local = await complete(PROMPT, n, spec);
    expect(local.ctxbank.handoff).toEqual({ path: "in_process" });
    expect(local.tokenIds).toEqual(withPool);

    const p = await postJson(`${s.url}/v1/prefill`, { prompt: PROMPT, policy: spec, max_tokens: n });
    expect(p.status).toBe(200);
    const handle = p.body as Handle;
    // The kept lists (kind 2, native/src/prompt_state.h), not the queries they are computed from.
    const state = Buffer.from(handle.prompt_state!, "base64");
    const { nLayer, nHeadKv } = s.rt.model.config;
    expect(state.readUInt32LE(16)).toBe(2);
    expect(state.length).toBe(32 + nLayer * nHeadKv * (1 + 16 + 8) * 4);
    const d = await postJson(`${s.url}/v1/decode`, { handle, max_tokens: n, temperature: 0 });
    expect(d.status, JSON.stringify(d.body)).toBe(200);
    expect(d.body.ctxbank.handoff).toEqual({ path: "shard", bytes: expect.any(Number) });
    expect(d.body.token_ids).toEqual(withPool);

    // A handle without its prompt state: the whole prompt, and the answer says why.
    const bare = await postJson(`${s.url}/v1/prefill`, { prompt: PROMPT, policy: spec, max_tokens: n });
    const { prompt_state: _, ...stripped } = bare.body as Handle;
    const b = await postJson(`${s.url}/v1/decode`, { handle: stripped, max_tokens: n, temperature: 0 });
    expect(b.status, JSON.stringify(b.body)).toBe(200);
    expect(b.body.ctxbank.handoff.warnings).toEqual([expect.stringMatching(/^scope\.alpha1: .*kept the whole prompt/)]);
    expect(b.body.token_ids).toEqual(withoutPool);

    // Decoded under a policy that remembers another window: not loaded, and said so.
    const other = await postJson(`${s.url}/v1/prefill`, { prompt: PROMPT, policy: spec, max_tokens: n });
    const o = await postJson(`${s.url}/v1/decode`, {
      handle: other.body,
      max_tokens: n,
      temperature: 0,
      policy: { kind: "scope", scope: { beta1: 64, beta2: 64, alpha1: 16, alpha2: 4 } },
    });
    expect(o.status, JSON.stringify(o.body)).toBe(200);
    expect(o.body.ctxbank.handoff.warnings).toEqual([
      expect.stringMatching(/^scope\.alpha1: .*made under a policy that derives other state/),
    ]);
  });

  it("a malformed prompt state in a client's handle is a 400, never a crash", async () => {
    const spec = { kind: "scope", scope: { beta1: 64, beta2: 64, alpha1: 16, alpha2: 8 } };
    // SCOPE's state: the kept lists (native/src/prompt_state.h): 5 header words, alpha1, alpha2,
    // n_lists, then each list's count and positions.
    const tamper: ((b: Buffer) => Buffer)[] = [
      (b) => b.subarray(0, b.length - 1), // truncated
      (b) => Buffer.concat([b, Buffer.alloc(4)]), // trailing bytes
      (b) => Buffer.concat([Buffer.from("XXXX"), b.subarray(4)]), // magic
      (b) => withU32(b, 4, 99), // version
      (b) => withU32(b, 12, 5), // another prompt length
      (b) => withU32(b, 16, 7), // an unknown kind
      (b) => withU32(b, 28, 1000), // lists for another model
      (b) => withU32(b, 32, 0xffff_ffff), // a list longer than alpha1 + alpha2
      (b) => withU32(b, 36, 0x7fff_ffff), // a position past the prompt
    ];
    for (const [i, change] of tamper.entries()) {
      const p = await postJson(`${s.url}/v1/prefill`, { prompt: PROMPT, policy: spec, max_tokens: 8 });
      const handle = p.body as Handle;
      const bad = change(Buffer.from(handle.prompt_state!, "base64")).toString("base64");
      const d = await postJson(`${s.url}/v1/decode`, { handle: { ...handle, prompt_state: bad }, max_tokens: 8, temperature: 0 });
      expect(d.status, `tamper ${i}: ${JSON.stringify(d.body)}`).toBe(400);
      expect(d.body.error).toMatchObject({ code: "invalid_request", param: "handle.prompt_state" });
    }
    const p = await postJson(`${s.url}/v1/prefill`, { prompt: PROMPT, policy: spec, max_tokens: 8 });
    const notBase64 = await postJson(`${s.url}/v1/decode`, { handle: { ...p.body, prompt_state: "not base64!" }, max_tokens: 8 });
    expect(notBase64.status).toBe(400);
    expect(s.services.decode!.status()).toMatchObject({ live_sequences: 0, admitted: 0, kv_reserved_bytes: 0 });
  });

  it.each(["exp", "uniform"] as const)(
    "the OmniKV %s selector sees the prompt's last queries in process and over the shard path alike",
    async (selector) => {
      const n = 12;
      const filterLayers = policyDefaultsFor(s.rt.model.fingerprint)!.filterLayers;
      const spec = { kind: "omnikv", omnikv: { budget: 16, selector, window: 16 } };
      const ids = s.rt.tokenizer.encode(PROMPT);
      const expected = await engineGreedy(ids, { kind: "omnikv", omnikv: { filterLayers, budget: 16, selector, window: 16 } }, n);
      const local = await complete(PROMPT, n, spec);
      expect(local.ctxbank.handoff).toEqual({ path: "in_process" });
      expect(local.tokenIds).toEqual(expected);

      const p = await postJson(`${s.url}/v1/prefill`, { prompt: PROMPT, policy: spec, max_tokens: n });
      expect(p.status).toBe(200);
      expect((p.body as Handle).prompt_state).toBeDefined();
      const d = await postJson(`${s.url}/v1/decode`, { handle: p.body, max_tokens: n, temperature: 0 });
      expect(d.status, JSON.stringify(d.body)).toBe(200);
      expect(d.body.ctxbank.handoff).toEqual({ path: "shard", bytes: expect.any(Number) });
      expect(d.body.token_ids).toEqual(expected);

      const { prompt_state: _, ...stripped } = (await postJson(`${s.url}/v1/prefill`, { prompt: PROMPT, policy: spec, max_tokens: n }))
        .body as Handle;
      // (On this repetitive prompt the greedy tokens come out the same without the prompt's queries;
      // native/tests/prompt_state_test.cc shows the logits differ without them, and match with them.)
      const b = await postJson(`${s.url}/v1/decode`, { handle: stripped, max_tokens: n, temperature: 0 });
      expect(b.body.ctxbank.handoff.warnings).toEqual([expect.stringMatching(new RegExp(`^omnikv\\.selector ${selector}: `))]);
    },
  );

  it("policies that remember no prompt queries put no state in the handle", async () => {
    for (const policy of [undefined, { kind: "scope", scope: { beta1: 64, beta2: 64 } }, { kind: "omnikv", omnikv: { budget: 16 } }]) {
      const p = await postJson(`${s.url}/v1/prefill`, { prompt: PROMPT, max_tokens: 4, ...(policy ? { policy } : {}) });
      expect(p.status, JSON.stringify(p.body)).toBe(200);
      expect((p.body as Handle).prompt_state, JSON.stringify(policy)).toBeUndefined();
      const d = await postJson(`${s.url}/v1/decode`, { handle: p.body, max_tokens: 4, temperature: 0 });
      expect(d.status).toBe(200);
      expect(d.body.ctxbank.handoff).toEqual({ path: "shard", bytes: expect.any(Number) });
    }
  });

  it("a bad policy is refused before any work, in process as over HTTP", async () => {
    const prefills = s.services.prefill!.status().totals.prefills;
    for (const policy of [
      { kind: "scope", scope: { beta1: 0 } },
      { kind: "omnikv", omnikv: { filter_layers: [40] } },
    ]) {
      const res = await postJson(`${s.url}/v1/completions`, { model: s.rt.modelId, prompt: PROMPT, max_tokens: 4, policy });
      expect(res.status, JSON.stringify(policy)).toBe(400);
      expect(res.body.error.code).toBe("invalid_policy");
    }
    expect(s.services.prefill!.status().totals.prefills).toBe(prefills);
    expect(s.services.decode!.status()).toMatchObject({ live_sequences: 0, admitted: 0 });
  });

  it("a client gone during the in-process prefill frees the sequence", async () => {
    const ac = new AbortController();
    const events = s.services.decode!.complete({ prompt: PROMPT.repeat(4) }, { maxTokens: 8, temperature: 0 }, ac.signal, s.rt.log);
    setTimeout(() => ac.abort(new Error("gone")), 20);
    await expect(
      (async () => {
        for await (const _ of events) void _;
      })(),
    ).rejects.toThrow();
    expect(s.services.decode!.status()).toMatchObject({ live_sequences: 0, admitted: 0, kv_reserved_bytes: 0, prefills: 0 });
    expect(s.services.prefill!.status()).toMatchObject({ prefills_running: 0, prefills_queued: 0 });
  });
});

function withU32(b: Buffer, at: number, v: number): Buffer {
  const out = Buffer.from(b);
  out.writeUInt32LE(v, at);
  return out;
}
