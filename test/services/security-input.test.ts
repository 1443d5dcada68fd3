// Bounded work before validation: prompts are size-checked before tokenizing, tokenized off the
// event loop and only up to the context; every policy field is bounded before any work; a
// handle's token ids are checked like any other input (400 naming the field, never a 500).
import { monitorEventLoopDelay } from "node:perf_hooks";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Handle } from "../../shared/platform/http/wire.ts";
import { maxPromptChars } from "../../services/runtime.ts";
import { getJson } from "../../tools/lib/services.ts";
import { postJson } from "../harness/http.ts";
import { type Serve, startServe } from "../harness/serve.ts";

/** POSTs a body already serialised (the client's own JSON work stays outside the measurements). */
async function postRaw(url: string, json: string): Promise<{ status: number; body: any }> {
  const res = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: json });
  return { status: res.status, body: await res.json() };
}

/** Runs `fn` and reports how long it took and the event loop's longest stall meanwhile. */
async function watchedOnce<T>(fn: () => Promise<T>): Promise<{ result: T; ms: number; maxStallMs: number }> {
  const h = monitorEventLoopDelay({ resolution: 10 });
  h.enable();
  const t = performance.now();
  const result = await fn();
  const ms = performance.now() - t;
  h.disable();
  return { result, ms, maxStallMs: h.max / 1e6 };
}

/**
 * The calmest of up to three runs of `fn`: on a shared, busy machine the OS alone can pause the
 * process for 100 ms now and then, while a stall the request causes shows in every run.
 */
async function watched<T>(fn: () => Promise<T>): Promise<{ result: T; ms: number; maxStallMs: number }> {
  let best = await watchedOnce(fn);
  for (let i = 1; i < 3 && best.maxStallMs >= 100; i++) {
    const next = await watchedOnce(fn);
    if (next.maxStallMs < best.maxStallMs) best = next;
  }
  return best;
}

describe("bounded input", () => {
  let s: Serve;
  let maxContext: number;

  beforeAll(async () => {
    s = await startServe({ blockTokens: 64 });
    maxContext = s.rt.engine.maxContext;
    // The first requests compile the routes' and the body parser's code (a one-off stall of its
    // own): measure after them.
    await postJson(`${s.url}/v1/prefill`, { prompt: "warm up", max_tokens: 1 });
    await postJson(`${s.url}/v1/prefill`, { prompt: "x".repeat(100_000) });
    await postRaw(`${s.url}/v1/prefill`, JSON.stringify({ prompt: "0".repeat(4_000_000) }));
  });
  afterAll(() => s?.stop());

  const prefills = () => s.services.prefill!.status().totals.prefills;

  it("a 4 MB prompt of digits is refused at once, without stalling the event loop", async () => {
    const digits = "7".repeat(4_000_000);
    for (const [route, body] of [
      ["/v1/prefill", { prompt: digits }],
      ["/v1/completions", { model: "default", prompt: digits, max_tokens: 1 }],
    ] as const) {
      const json = JSON.stringify(body);
      const { result, ms, maxStallMs } = await watched(() => postRaw(`${s.url}${route}`, json));
      expect(result.status, JSON.stringify(result.body)).toBe(400);
      expect(result.body.error).toMatchObject({ code: "context_length_exceeded", param: "prompt" });
      expect(result.body.error.message).toMatch(/characters/);
      expect(ms).toBeLessThan(2000); // was ~7 s of tokenizing
      expect(maxStallMs).toBeLessThan(100);
    }
  });

  it("a prompt under the character cap but past the context is tokenized off the loop, only up to the context", async () => {
    const digits = "7".repeat(maxPromptChars(s.rt) - 10); // ~660k characters, one token each
    const health = (async () => {
      // Health checks keep answering while it is tokenized.
      const answers: number[] = [];
      for (let i = 0; i < 5; i++) answers.push((await getJson(`${s.url}/health`)).status);
      return answers;
    })();
    const json = JSON.stringify({ prompt: digits });
    const { result, ms, maxStallMs } = await watched(() => postRaw(`${s.url}/v1/prefill`, json));
    expect(result.status, JSON.stringify(result.body)).toBe(400);
    expect(result.body.error.message).toMatch(new RegExp(`more than ${maxContext} tokens`));
    expect(ms).toBeLessThan(3000);
    expect(maxStallMs).toBeLessThan(100);
    expect(await health).toEqual([200, 200, 200, 200, 200]);
  });

  it("a body full of token ids or messages is refused without validating each element", async () => {
    // Past the wire caps (131,072 ids, 65,536 messages), small enough that parsing the JSON
    // itself stays well inside the budget on a busy machine.
    const ids = new Array(600_000).fill(0);
    const messages = new Array(70_000).fill({ role: "user", content: "" });
    for (const [route, body, param] of [
      ["/v1/prefill", { prompt_token_ids: ids }, "prompt_token_ids"],
      ["/v1/completions", { model: "default", prompt: ids }, "prompt"],
      ["/v1/prefill", { messages }, "messages"],
      ["/v1/chat/completions", { model: "default", messages }, "messages"],
    ] as const) {
      const json = JSON.stringify(body);
      const { result, maxStallMs } = await watched(() => postRaw(`${s.url}${route}`, json));
      expect(maxStallMs, route).toBeLessThan(100);
      expect(result.status, `${route} ${JSON.stringify(result.body).slice(0, 300)}`).toBe(400);
      expect(result.body.error.param, route).toBe(param);
    }
  });

  it("too many messages, message characters or token ids are refused before tokenizing", async () => {
    const many = Array.from({ length: maxContext + 1 }, () => ({ role: "user", content: "" }));
    const tooMany = await postJson(`${s.url}/v1/prefill`, { messages: many });
    expect(tooMany.status).toBe(400);
    expect(tooMany.body.error).toMatchObject({ code: "context_length_exceeded", param: "messages" });
    const long = await postJson(`${s.url}/v1/prefill`, { messages: [{ role: "user", content: "x".repeat(maxPromptChars(s.rt) + 1) }] });
    expect(long.status).toBe(400);
    expect(long.body.error).toMatchObject({ code: "context_length_exceeded", param: "messages" });
    const ids = await postJson(`${s.url}/v1/prefill`, { prompt_token_ids: new Array(maxContext).fill(1) });
    expect(ids.status).toBe(400);
    expect(ids.body.error).toMatchObject({ code: "context_length_exceeded", param: "prompt_token_ids" });
  });

  it("absurd policy budgets, unknown kinds and layers the model lacks answer invalid_policy naming the field, before any work", async () => {
    const before = prefills();
    const huge = 4_000_000;
    const bad: [unknown, string, RegExp][] = [
      [{ kind: "omnikv", omnikv: { budget: huge } }, "policy.omnikv.budget", /context/],
      [{ kind: "scope", scope: { max_output: huge } }, "policy.scope.max_output", /context/],
      [{ kind: "scope", scope: { beta1: huge } }, "policy.scope.beta1", /context/],
      [{ kind: "streaming", streaming: { window: huge } }, "policy.streaming.window", /context/],
      [{ kind: "h2o", h2o: { budget: huge, recent: 8 } }, "policy.h2o.budget", /context/],
      [{ kind: "rounds", rounds: { watershed_layer: 12, starts: [0, huge] } }, "policy.rounds.starts", /context/],
      [{ kind: "rounds", rounds: { watershed_layer: 40 } }, "policy.rounds.watershed_layer", /watershed layer 40/],
      [{ kind: "h2o", h2o: { recent: 0 } }, "policy.h2o.recent", /recent/],
      [{ kind: "h2o", h2o: { budget: 100, recent: 200 } }, "policy.h2o.budget", /budget larger than recent/], // the schema refuses it now, naming the field
      [{ kind: "omnikv", omnikv: { lazy_iou: 1 } }, "policy.omnikv.lazy_iou", /lazy_iou/],
      ["sparse", "policy", /unknown policy/],
      [{ kind: "sparse" }, "policy", /unknown policy/],
    ];
    for (const [policy, param, message] of bad) {
      const res = await postJson(`${s.url}/v1/prefill`, { prompt: "hi", policy });
      expect(res.status, JSON.stringify(policy)).toBe(400);
      expect(res.body.error, JSON.stringify(policy)).toMatchObject({ code: "invalid_policy", param });
      expect(res.body.error.message, JSON.stringify(policy)).toMatch(message);
    }
    const chat = await postJson(`${s.url}/v1/chat/completions`, {
      model: "default",
      messages: [{ role: "user", content: "hi" }],
      policy: { kind: "omnikv", omnikv: { budget: huge } },
    });
    expect(chat.status).toBe(400);
    expect(chat.body.error).toMatchObject({ code: "invalid_policy", param: "policy.omnikv.budget" });
    expect(prefills()).toBe(before);
  });

  it("a long chat's policy is validated before its prompt is tokenized and its rounds found", async () => {
    // 1,300 one-letter user messages (~7,800 tokens, within the context): finding their rounds took
    // ~11 s before the policy was checked.
    const messages = Array.from({ length: 1300 }, () => ({ role: "user", content: "q" }));
    const { result, ms } = await watched(() =>
      postJson(`${s.url}/v1/prefill`, { messages, policy: { kind: "rounds", rounds: { watershed_layer: 29 } } }),
    );
    expect(result.status).toBe(400);
    expect(result.body.error).toMatchObject({ code: "invalid_policy" });
    expect(result.body.error.message).toMatch(/watershed layer 29/);
    expect(ms).toBeLessThan(1000);
  });

  it("a handle whose first_token or prompt_token_ids are outside the vocabulary is a 400, and the real handle still decodes", async () => {
    const res = await postJson(`${s.url}/v1/prefill`, { prompt: "The lighthouse keeper counted ships.", max_tokens: 2, temperature: 0 });
    expect(res.status).toBe(200);
    const handle = res.body as Handle;
    const nVocab = s.rt.model.config.nVocab;
    const ids = [...handle.prompt_token_ids];
    ids[2] = nVocab + 5;
    for (const [forged, param] of [
      [{ ...handle, first_token: nVocab }, "handle.first_token"],
      [{ ...handle, prompt_token_ids: ids }, "handle.prompt_token_ids"],
    ] as const) {
      const out = await postJson(`${s.url}/v1/decode`, { handle: forged, max_tokens: 2 });
      expect(out.status, JSON.stringify(out.body)).toBe(400);
      expect(out.body.error).toMatchObject({ code: "invalid_request", param });
    }
    const absurd = await postJson(`${s.url}/v1/decode`, {
      handle,
      max_tokens: 2,
      policy: { kind: "omnikv", omnikv: { budget: 4_000_000 } },
    });
    expect(absurd.status).toBe(400);
    expect(absurd.body.error).toMatchObject({ code: "invalid_policy", param: "policy.omnikv.budget" });
    const ok = await postJson(`${s.url}/v1/decode`, { handle, max_tokens: 2 });
    expect(ok.status, JSON.stringify(ok.body)).toBe(200);
  });
  it("encoding stops just past maxTokens, with the whole encoding's first ids", () => {
    const tok = s.rt.tokenizer;
    const text = "The keeper counted 1234 ships, then 56 more.\n".repeat(400);
    const all = tok.encode(text);
    expect(all.length).toBeGreaterThan(1000);
    for (const limit of [0, 1, 7, 100, 999]) expect(tok.encode(text, { maxTokens: limit })).toEqual(all.slice(0, limit + 1));
    expect(tok.encode(text, { maxTokens: all.length })).toEqual(all);
    expect(tok.maxTokenBytes).toBe(81); // SmolLM2: "\n" + 80 spaces
  });
});
