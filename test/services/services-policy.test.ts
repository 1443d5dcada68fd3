// Attention policies through the services: a request's policy is resolved with the model's
// calibrated defaults, validated by the engine (400 invalid_policy), groups the prefill's chunks
// by OmniKV's layer roles, travels in the handle, and is what the decode's sequence attends with
// (its greedy tokens equal the engine's under the same policy).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { argmax } from "../../shared/inference/engine/sampler.ts";
import type { AttentionPolicy } from "../../shared/inference/engine/native.ts";
import type { Handle } from "../../shared/platform/http/wire.ts";
import { policyDefaultsFor } from "../../shared/inference/policy/defaults.ts";
import {
  checkPolicySpec,
  layerGroupsFromRoles,
  PolicyError,
  policyFromWire,
  PolicySpecSchema,
  resolvedSpec,
  resolvePolicy,
} from "../../shared/inference/policy/request.ts";
import { postJson } from "../harness/http.ts";
import { type Serve, startServe } from "../harness/serve.ts";

describe("policy specs", () => {
  it("resolve with the model's filter layers, fractional budgets and SCOPE's planned length", () => {
    const ctx = { filterLayers: [2, 7, 17], promptTokens: 1000, maxTokens: 64 };
    expect(resolvePolicy(undefined, ctx)).toEqual({ kind: "full" });
    // Complete: every field the request left out has its default (shared/inference/defaults.ts).
    const omnikvDefaults = { budget: 1024, selector: "last", window: 16, guard: true, lazyIou: 0, offload: false };
    expect(resolvePolicy("omnikv", ctx)).toEqual({ kind: "omnikv", omnikv: { ...omnikvDefaults, filterLayers: [2, 7, 17] } });
    expect(resolvePolicy({ kind: "omnikv", omnikv: { budget: 0.25, selector: "last_softmax", guard: false } }, ctx)).toEqual({
      kind: "omnikv",
      omnikv: { ...omnikvDefaults, filterLayers: [2, 7, 17], budget: 250, selector: "last_softmax", guard: false },
    });
    expect(resolvePolicy({ kind: "omnikv+scope", omnikv: { filter_layers: [4] }, scope: { beta1: 100 } }, ctx)).toEqual({
      kind: "omnikv+scope",
      omnikv: { ...omnikvDefaults, filterLayers: [4] },
      scope: { mode: "slide", beta1: 100, beta2: 256, maxOutput: 64, alpha1: 0, alpha2: 8, reclaim: false },
    });
    expect(resolvePolicy("streaming", ctx)).toEqual({ kind: "streaming", streaming: { sinks: 4, window: 1020, reclaim: false } });
    expect(resolvePolicy({ kind: "h2o", h2o: { recent: 100 } }, ctx)).toEqual({
      kind: "h2o",
      h2o: { budget: 1024, recent: 100, reclaim: false },
    });
    expect(() => resolvePolicy("omnikv", { promptTokens: 10, maxTokens: 1 })).toThrow(PolicyError);
  });

  it("read back from the wire shape a handle carries them in, and are checked before any work without resolving", () => {
    const ctx = { filterLayers: [2, 7, 17], roundStarts: [0, 40], promptTokens: 1000, maxTokens: 64 };
    for (const spec of [
      "full",
      "omnikv",
      "streaming",
      { kind: "omnikv+scope", omnikv: { budget: 0.25 }, scope: { mode: "adaptive" } },
      { kind: "rounds", rounds: { watershed_layer: 12 } },
    ] as const) {
      const policy = resolvePolicy(spec, { ...ctx, watershedLayer: null });
      expect(policyFromWire(resolvedSpec(policy)), JSON.stringify(spec)).toEqual(policy);
    }
    const model = { maxContext: 8192, nLayer: 30 };
    expect(() => checkPolicySpec("omnikv", model, { chat: false })).toThrow(/no calibrated OmniKV filter layers/);
    expect(() => checkPolicySpec({ kind: "rounds", rounds: { watershed_layer: 12 } }, model, { chat: false })).toThrow(
      /needs rounds.starts/,
    );
    expect(() => checkPolicySpec({ kind: "rounds", rounds: { watershed_layer: 12 } }, model, { chat: true })).not.toThrow();
    expect(() => checkPolicySpec({ kind: "h2o", h2o: { budget: 9000 } }, model, { chat: false })).toThrow(/beyond the model's context/);
  });

  it("group layers as the roles say: the dense ones, then each filter layer's sparse run", () => {
    const roles = ["dense", "dense", "filter", "guard", "sparse", "sparse", "filter", "guard", "sparse"];
    const groups = [-1, -1, -1, -1, 0, 0, -1, -1, 1];
    expect(layerGroupsFromRoles(roles, groups, 9)).toEqual([[0, 1, 2, 3, 6, 7], [4, 5], [8]]);
    expect(layerGroupsFromRoles([], [], 3)).toEqual([[0, 1, 2]]);
  });
});

describe("policies through the services", () => {
  let s: Serve;
  const prompt = "Once upon a time there was a lighthouse keeper who counted ships. ".repeat(12);

  beforeAll(async () => {
    s = await startServe({ blockTokens: 64 });
  });
  afterAll(() => s?.stop());

  async function engineGreedy(ids: number[], policy: AttentionPolicy, n: number): Promise<number[]> {
    const { engine } = s.rt;
    const seq = engine.createSequence(ids.length + n);
    seq.setPolicy(policy);
    const out = [argmax(await engine.prefill(seq, ids))];
    // Like the service: stop after an end-of-generation token.
    while (out.length < n && !s.rt.tokenizer.isEog(out.at(-1)!)) out.push(argmax((await engine.decode([seq], [out.at(-1)!]))[0]!));
    seq.release();
    return out;
  }

  it("omnikv: chunks grouped by layer role, the handle carries the policy, decode attends with it", async () => {
    const filterLayers = policyDefaultsFor(s.rt.model.fingerprint)!.filterLayers;
    const spec = { kind: "omnikv" as const, omnikv: { budget: 16 } };
    const res = await postJson(`${s.url}/v1/prefill`, { prompt, policy: spec });
    expect(res.status).toBe(200);
    const handle = res.body as Handle;
    const probe = s.rt.engine.createSequence(1);
    probe.setPolicy({ kind: "omnikv", omnikv: { filterLayers, budget: 16 } });
    const roles = probe.policyStats;
    probe.release();
    const groups = layerGroupsFromRoles(roles.layerRoles, roles.layerGroups, 30);
    expect(groups).toHaveLength(filterLayers.length + 1);
    expect(handle.layer_groups).toEqual(groups);
    // The handle carries the request's spec as the schema parsed it (defaults written in) and what it resolved to.
    expect(handle.policy).toEqual(PolicySpecSchema.parse(spec));
    expect(handle.resolved_policy).toEqual({
      kind: "omnikv",
      omnikv: { budget: 16, selector: "last", window: 16, guard: true, lazy_iou: 0, offload: false, filter_layers: filterLayers },
    });
    const blocks = Math.ceil(handle.prompt_tokens / 64);
    expect(handle.chunk_ids).toHaveLength(blocks * groups.length);
    const rows = await s.rt.registry.chunks.ofRequest(handle.request_id);
    expect(new Set(rows.map((r) => r.layerIds.join(",")))).toEqual(new Set(groups.map((g) => g.join(","))));

    const out = await postJson(`${s.url}/v1/decode`, { handle, max_tokens: 24, temperature: 0 });
    expect(out.status).toBe(200);
    const sparse = await engineGreedy(handle.prompt_token_ids, { kind: "omnikv", omnikv: { filterLayers, budget: 16 } }, 24);
    const full = await engineGreedy(handle.prompt_token_ids, { kind: "full" }, 24);
    expect(out.body.token_ids).toEqual(sparse);
    expect(sparse).not.toEqual(full); // 16 of ~170 prompt tokens: the policy really changed the attention
  });

  it("the OpenAI routes take the policy as an extension field", async () => {
    const res = await postJson(`${s.url}/v1/completions`, {
      model: s.rt.modelId,
      prompt,
      max_tokens: 8,
      temperature: 0,
      policy: { kind: "scope", scope: { beta1: 2, beta2: 2 } },
    });
    expect(res.status).toBe(200);
    const ids = s.rt.tokenizer.encode(prompt);
    const expected = await engineGreedy(ids, { kind: "scope", scope: { mode: "slide", beta1: 2, beta2: 2, maxOutput: 8 } }, 8);
    expect(res.body.choices[0].text).toBe(s.rt.tokenizer.decode(expected));
  });

  it("a prefill without max_tokens checks the policy against the decode's default length, not 1 token", async () => {
    // adaptive SCOPE needs T (max_output = max_tokens) > beta2: true of the default 256, not of 1.
    const policy = { kind: "scope", scope: { mode: "adaptive", beta1: 8, beta2: 8 } };
    const res = await postJson(`${s.url}/v1/prefill`, { prompt: "hi", policy });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const out = await postJson(`${s.url}/v1/decode`, { handle: res.body, max_tokens: 12, temperature: 0 });
    expect(out.status, JSON.stringify(out.body)).toBe(200);
    const short = await postJson(`${s.url}/v1/prefill`, { prompt: "hi", policy, max_tokens: 8 });
    expect(short.status).toBe(400);
    expect(short.body.error).toMatchObject({ code: "invalid_policy", param: "policy" });
  });

  it("omnikv with offload decodes the same tokens as without it", async () => {
    const filterLayers = policyDefaultsFor(s.rt.model.fingerprint)!.filterLayers;
    const res = await postJson(`${s.url}/v1/completions`, {
      model: s.rt.modelId,
      prompt,
      max_tokens: 8,
      temperature: 0,
      policy: { kind: "omnikv", omnikv: { budget: 16, offload: true } },
    });
    expect(res.status).toBe(200);
    const ids = s.rt.tokenizer.encode(prompt);
    const expected = await engineGreedy(ids, { kind: "omnikv", omnikv: { filterLayers, budget: 16 } }, 8);
    expect(res.body.choices[0].text).toBe(s.rt.tokenizer.decode(expected));
  });

  it("rounds: a chat's user messages start the rounds; the handle carries them to the decode", async () => {
    const messages = [
      { role: "user", content: "My locker code is 4711. Please remember it." },
      { role: "assistant", content: "I will remember that your locker code is 4711." },
      { role: "user", content: "Tell me a fact about lighthouses." },
      { role: "assistant", content: "Lighthouses guide ships with a bright lamp." },
      { role: "user", content: "What is my locker code?" },
    ];
    const spec = { kind: "rounds", rounds: { watershed_layer: 12, top_k: 1 } };
    const res = await postJson(`${s.url}/v1/prefill`, { messages, policy: spec });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const handle = res.body as Handle;
    const starts = (handle.policy as { rounds: { starts: number[] } }).rounds.starts;
    expect(starts).toHaveLength(4);
    expect(starts[0]).toBe(0);
    // Round 0 is the template's system part: the first user turn starts round 1.
    expect(s.rt.tokenizer.decode(handle.prompt_token_ids.slice(starts[1]!, starts[1]! + 2), { special: true })).toBe("<|im_start|>user");
    // Each later round starts where the conversation up to that user message ends.
    const upTo = (i: number) =>
      s.rt.tokenizer.encode(s.rt.chat!.render(messages.slice(0, i), { addGenerationPrompt: false }), { parseSpecial: true }).length;
    expect(starts.slice(2)).toEqual([upTo(2), upTo(4)]);
    const out = await postJson(`${s.url}/v1/decode`, { handle, max_tokens: 8, temperature: 0 });
    expect(out.status).toBe(200);
    const expected = await engineGreedy(handle.prompt_token_ids, { kind: "rounds", rounds: { watershedLayer: 12, starts, topK: 1 } }, 8);
    expect(out.body.token_ids).toEqual(expected);
    const chat = await postJson(`${s.url}/v1/chat/completions`, {
      model: s.rt.modelId,
      messages,
      max_tokens: 4,
      temperature: 0,
      policy: spec,
    });
    expect(chat.status, JSON.stringify(chat.body)).toBe(200);
    expect(chat.body.choices[0].message.content).toBe(s.rt.tokenizer.decode(expected.slice(0, 4)));
    for (const [policy, message] of [
      [{ kind: "rounds", rounds: { top_k: 1 } }, /no calibrated watershed layer/],
      [{ kind: "rounds", rounds: { watershed_layer: 12 } }, /needs rounds.starts/],
    ] as const) {
      const bad = await postJson(`${s.url}/v1/prefill`, { prompt: "hi there", policy });
      expect(bad.status).toBe(400);
      expect(bad.body.error.code).toBe("invalid_policy");
      expect(bad.body.error.message).toMatch(message);
    }
  });

  it("rounds across the handoff: chunks never span rounds, the decode reads only the picked rounds above the watershed", async () => {
    const filler = "The harbour was quiet and the boats rocked gently on the grey water while gulls circled overhead. ";
    const messages = [
      { role: "user", content: `My locker code is 4711. ${filler.repeat(3)}` },
      { role: "assistant", content: "Noted: your locker code is 4711." },
      { role: "user", content: `Tell me about lighthouses. ${filler.repeat(3)}` },
      { role: "assistant", content: "Lighthouses guide ships with a bright lamp." },
      { role: "user", content: `And about tides? ${filler.repeat(3)}` },
      { role: "assistant", content: "Tides follow the moon." },
      { role: "user", content: "What is my locker code?" },
    ];
    const decodeOf = async (topK: number) => {
      const res = await postJson(`${s.url}/v1/prefill`, {
        messages,
        policy: { kind: "rounds", rounds: { watershed_layer: 12, top_k: topK } },
      });
      expect(res.status, JSON.stringify(res.body)).toBe(200);
      const handle = res.body as Handle;
      const starts = (handle.policy as { rounds: { starts: number[] } }).rounds.starts;
      expect(starts).toHaveLength(5); // the system part, three earlier exchanges, the question
      // Every chunk lies within one round.
      const rows = await s.rt.registry.chunks.ofRequest(handle.request_id);
      for (const r of rows) expect(starts.filter((b) => b > r.tokenStart && b < r.tokenEnd)).toEqual([]);
      // Round 0 (the template's system part) and topK of the later earlier rounds.
      expect(handle.rounds_picked![0]).toBe(0);
      expect(handle.rounds_picked).toHaveLength(1 + topK);
      const out = await postJson(`${s.url}/v1/decode`, { handle, max_tokens: 8, temperature: 0 });
      expect(out.status, JSON.stringify(out.body)).toBe(200);
      const expected = await engineGreedy(handle.prompt_token_ids, { kind: "rounds", rounds: { watershedLayer: 12, starts, topK } }, 8);
      expect(out.body.token_ids).toEqual(expected);
      // What the decode read: every chunk of layers 0..12, above them the picked and the current rounds'.
      const upper = (r: (typeof rows)[number]) => r.layerIds[0]! > 12;
      const roundOf = (start: number) => starts.findLastIndex((b) => b <= start);
      const wanted = rows.filter(
        (r) => !upper(r) || roundOf(r.tokenStart) === starts.length - 1 || handle.rounds_picked!.includes(roundOf(r.tokenStart)),
      );
      const chunkBytes = (list: typeof rows) => list.reduce((sum, r) => sum + r.length, 0);
      expect(out.body.kv.chunks).toBe(wanted.length);
      expect(out.body.kv.bytes).toBe(chunkBytes(wanted));
      expect(out.body.kv.prompt_bytes).toBe(chunkBytes(rows));
      expect(out.body.ctxbank.handoff).toMatchObject({ path: "shard", bytes: chunkBytes(wanted), prompt_bytes: chunkBytes(rows) });
      return out.body as { kv: { bytes: number; prompt_bytes: number }; token_ids: number[] };
    };
    const one = await decodeOf(1);
    expect(one.kv.bytes).toBeLessThan(one.kv.prompt_bytes);
    // Every earlier round picked: every chunk read, and the tokens are full attention's.
    const all = await decodeOf(3);
    expect(all.kv.bytes).toBe(all.kv.prompt_bytes);
    const res = await postJson(`${s.url}/v1/prefill`, { messages });
    const full = await engineGreedy((res.body as Handle).prompt_token_ids, { kind: "full" }, 8);
    expect(all.token_ids).toEqual(full);
  });

  it("refuses policies the model cannot run, before any work", async () => {
    const bad = [
      [{ kind: "omnikv", omnikv: { filter_layers: [40] } }, "invalid_policy", /filter layer 40/],
      [{ kind: "scope", scope: { beta1: 0 } }, "invalid_policy", /beta1/],
      [{ kind: "omnikv", omnikv: { budget: 1.5 } }, "invalid_policy", /whole number/],
      [{ kind: "omnikv", omnikv: { selector: "window" } }, "invalid_policy", /selector/],
      [{ kind: "omnikv", omnikv: { selector: "exp", window: 65 } }, "invalid_policy", /window/],
      ["sparse", "invalid_policy", /unknown policy/],
      [{ kind: "full", extra: 1 }, "invalid_policy", /extra|policy/],
    ] as const;
    for (const [policy, code, message] of bad) {
      const res = await postJson(`${s.url}/v1/prefill`, { prompt: "hi", policy });
      expect(res.status, JSON.stringify(policy)).toBe(400);
      expect(res.body.error.code, JSON.stringify(policy)).toBe(code);
      expect(JSON.stringify(res.body.error), JSON.stringify(policy)).toMatch(message);
    }
    const viaOpenAi = await postJson(`${s.url}/v1/chat/completions`, {
      model: s.rt.modelId,
      messages: [{ role: "user", content: "hi" }],
      policy: { kind: "omnikv", omnikv: { filter_layers: [29, 3] } },
    });
    expect(viaOpenAi.status).toBe(400);
    expect(viaOpenAi.body.error).toMatchObject({ code: "invalid_policy", param: "policy" });
    expect(s.services.prefill!.status().totals.prefills).toBe(9); // only the tests above prefilled
  });

  it("say what they did: the resolved policy in the response and the first streamed chunk, ignored fields named", async () => {
    const messages = [{ role: "user", content: "Say hello." }];
    const chat = await fetch(`${s.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        model: s.rt.modelId,
        messages,
        max_tokens: 2,
        temperature: 0,
        polcy: "h2o",
        policy: { kind: "h2o", h2o: { recent: 64 } },
      }),
    });
    expect(chat.status).toBe(200);
    // OpenAI clients send extras: accepted, and named.
    expect(chat.headers.get("ctxbank-ignored-fields")).toBe("polcy");
    const body = (await chat.json()) as { ctxbank: { policy: unknown } };
    expect(body.ctxbank.policy).toEqual({ kind: "h2o", h2o: { budget: 1024, recent: 64, reclaim: false } });

    const stream = await fetch(`${s.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: s.rt.modelId, messages, max_tokens: 2, temperature: 0, stream: true, policy: "streaming" }),
    });
    const firstData = (await stream.text()).split("\n").find((l) => l.startsWith("data: "))!;
    expect(JSON.parse(firstData.slice(6)).ctxbank.policy).toEqual({
      kind: "streaming",
      streaming: { sinks: 4, window: 1020, reclaim: false },
    });

    // ctxbank's own routes refuse what they do not know, naming it.
    const typo = await postJson(`${s.url}/v1/prefill`, { prompt: "hi", polcy: "omnikv" });
    expect(typo.status).toBe(400);
    expect(typo.body.error).toMatchObject({ code: "unknown_field", param: "polcy" });
    const handle = await postJson(`${s.url}/v1/prefill`, { prompt: "hi there", policy: "h2o" });
    expect(handle.status, JSON.stringify(handle.body)).toBe(200);
    expect(handle.body.resolved_policy).toEqual({ kind: "h2o", h2o: { budget: 1024, recent: 256, reclaim: false } });
    const decoded = await postJson(`${s.url}/v1/decode`, { handle: handle.body, max_tokens: 2 });
    expect(decoded.status, JSON.stringify(decoded.body)).toBe(200);
    expect(decoded.body.ctxbank.policy).toEqual({ kind: "h2o", h2o: { budget: 1024, recent: 256, reclaim: false } });

    // Reclamation from the API: the decode runs it (reserving its bound, not prompt + max_tokens)
    // on the KV the handoff imported, and answers what masking answers.
    const streaming = (reclaim: boolean) =>
      postJson(`${s.url}/v1/completions`, {
        model: s.rt.modelId,
        prompt: "Count: one two three four five six seven eight nine ten",
        max_tokens: 24,
        temperature: 0,
        policy: { kind: "streaming", streaming: { sinks: 2, window: 8, reclaim } },
      });
    const reclaiming = await streaming(true);
    const masking = await streaming(false);
    expect(reclaiming.status, JSON.stringify(reclaiming.body)).toBe(200);
    expect(reclaiming.body.ctxbank.policy).toEqual({ kind: "streaming", streaming: { sinks: 2, window: 8, reclaim: true } });
    expect(reclaiming.body.usage.completion_tokens).toBe(24);
    expect(reclaiming.body.choices[0].text).toBe(masking.body.choices[0].text);
  });

  it("refuse, as invalid_policy naming the field, what the engine would refuse or ignore", async () => {
    for (const [policy, param, message] of [
      [{ kind: "h2o", h2o: { recent: 0 } }, "policy.h2o.recent", /recent/],
      [{ kind: "h2o", h2o: { budget: 64, recent: 64 } }, "policy.h2o.budget", /budget larger than recent/],
      [{ kind: "full", omnikv: { budget: 64 } }, "policy.omnikv", /does not apply to kind full/],
      [{ kind: "snapkv" }, "policy", /unknown policy/],
      [{ kind: "omnikv", omnikv: { budgte: 64 } }, "policy.omnikv.budgte", /budgte/],
      [{ kind: "omnikv+scope", scope: { reclaim: true } }, "policy.scope.reclaim", /scope\.reclaim is for kind scope/],
    ] as const) {
      const res = await postJson(`${s.url}/v1/chat/completions`, {
        model: s.rt.modelId,
        messages: [{ role: "user", content: "hi" }],
        policy,
      });
      expect(res.status, JSON.stringify(policy)).toBe(400);
      expect(res.body.error, JSON.stringify(policy)).toMatchObject({ code: "invalid_policy", param });
      expect(res.body.error.message).toMatch(message);
    }
  });

  it("a client's handle naming rounds the prefill did not pick, or that are not earlier rounds, is a 400 before any byte is read", async () => {
    const messages = [
      { role: "user", content: "My locker code is 4711." },
      { role: "assistant", content: "Noted." },
      { role: "user", content: "Tell me about tides." },
      { role: "assistant", content: "They follow the moon." },
      { role: "user", content: "What is my locker code?" },
    ];
    const res = await postJson(`${s.url}/v1/prefill`, { messages, policy: { kind: "rounds", rounds: { watershed_layer: 12, top_k: 1 } } });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const handle = res.body as Handle;
    for (const rounds_picked of [[99], [2, 1]]) {
      const out = await postJson(`${s.url}/v1/decode`, { handle: { ...handle, rounds_picked }, max_tokens: 4, temperature: 0 });
      expect(out.status, JSON.stringify(rounds_picked)).toBe(400);
      expect(out.body.error.code).toBe("invalid_request");
      expect(out.body.error.message).toMatch(/handle.rounds_picked must be ascending indices of the 3 rounds before the current one/);
    }
    const ok = await postJson(`${s.url}/v1/decode`, { handle, max_tokens: 4, temperature: 0 });
    expect(ok.status, JSON.stringify(ok.body)).toBe(200); // the handle itself was never consumed
  });
});
