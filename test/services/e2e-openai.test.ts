// End to end with the official `openai` client against `ctxbank serve` (what `npm start` runs
// after its setup step): completions and chat, streaming and not, checked against the generation
// loop run in this process on the same model (greedy, so the text must be identical).
import { readdir } from "node:fs/promises";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import { generate } from "../../shared/inference/generate.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { ChatTemplate, type ChatMessage } from "../../shared/inference/tokenizer/chat-template.ts";
import { GgufTokenizer } from "../../shared/inference/tokenizer/tokenizer.ts";
import { getJson, tempShardDir, type ServiceProcess } from "../../tools/lib/services.ts";
import { startServeProcess } from "../harness/serve.ts";

let svc: ServiceProcess;
let client: OpenAI;
let shards: Awaited<ReturnType<typeof tempShardDir>>;
let engine: Engine;
let tok: GgufTokenizer;
let tmpl: ChatTemplate;
let modelId: string;

async function reference(ids: number[], maxTokens: number, stop: string[] = []): Promise<{ text: string; tokens: number; finish: string }> {
  let text = "";
  let tokens = 0;
  let finish = "";
  for await (const ev of generate(engine, tok, ids, { maxTokens, temperature: 0, stop })) {
    if (ev.type === "token") {
      text += ev.text;
      tokens++;
    } else finish = ev.finishReason === "length" ? "length" : "stop";
  }
  return { text, tokens, finish };
}
const plain = (text: string) => tok.encode(text, { parseSpecial: true });
const chat = (messages: ChatMessage[]) => tok.encode(tmpl.render(messages), { parseSpecial: true });

beforeAll(async () => {
  shards = await tempShardDir();
  const started = startServeProcess(["--shard-dir", shards.dir]); // its own: the files left after the stop are checked
  const path = await resolveModel();
  engine = new Engine(await loadModel(path), { threads: 1 });
  tok = GgufTokenizer.fromGguf(path);
  tmpl = ChatTemplate.fromGguf(path, tok);
  svc = await started;
  client = new OpenAI({ baseURL: `${svc.url}/v1`, apiKey: "not-needed", maxRetries: 0 });
  modelId = (await client.models.list()).data[0]!.id;
});

afterAll(async () => {
  const code = await svc?.stop();
  const left = shards ? await readdir(shards.dir) : [];
  await shards?.remove();
  // A graceful shutdown: drained, the shard retired and its file removed, exit code 0.
  expect(code).toBe(0);
  expect(left).toEqual([]);
});

describe("OpenAI client against `ctxbank serve`", () => {
  it("lists the model, is ready, and documents its API", async () => {
    expect(modelId).toBe("SmolLM2-135M-Instruct.Q4_1");
    // The extension fields say where it runs and with which kernels: the table this CPU selects.
    const listed = (await getJson(`${svc.url}/v1/models`)).body.data[0];
    expect(listed).toMatchObject({ device: "cpu", kernels: engine.native.info.kernels });
    expect(["scalar", "avx2", "avx512"]).toContain(listed.kernels);
    expect((await getJson(`${svc.url}/ready`)).body).toMatchObject({ status: "ready", services: { prefill: "ready", decode: "ready" } });
    const spec = (await getJson(`${svc.url}/openapi.json`)).body;
    expect(Object.keys(spec.paths)).toEqual(
      expect.arrayContaining(["/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/decode", "/v1/prefill", "/health", "/ready"]),
    );
    const docs = await fetch(`${svc.url}/docs`);
    expect(docs.status).toBe(200);
    expect(await docs.text()).toMatch(/swagger/i);
  });

  it("documents every policy default and keeps AttentionPolicy's own description", async () => {
    const spec = (await getJson(`${svc.url}/openapi.json`)).body;
    const policy = spec.components.schemas.AttentionPolicy;
    expect(policy.description).toMatch(/^How decode steps attend/);
    const object = policy.anyOf.find((s: { type?: string }) => s.type === "object");
    expect(object.properties.streaming.properties.window.default).toBe(1020);
    expect(object.properties.h2o.properties.recent).toMatchObject({ default: 256, minimum: 1 });
    expect(object.properties.omnikv.properties.budget.default).toBe(1024);
  });

  it("takes the policy extension the way the README shows, and says which policy ran", async () => {
    const messages = [{ role: "user" as const, content: "Hi!" }];
    const res = await client.chat.completions.create({
      model: modelId,
      messages,
      max_tokens: 4,
      temperature: 0,
      // @ts-expect-error policy is a ctxbank extension; the client sends extra fields as they are
      policy: { kind: "omnikv", omnikv: { budget: 512 } },
    });
    const ran = (res as unknown as { ctxbank: { policy: { kind: string; omnikv: Record<string, unknown> } } }).ctxbank.policy;
    expect(ran.kind).toBe("omnikv");
    expect(ran.omnikv).toMatchObject({ budget: 512, selector: "last", window: 16, guard: true, lazy_iou: 0, offload: false });
    expect(ran.omnikv.filter_layers).toEqual([2, 7, 17]);
  });

  it("completions, not streamed: the text a single process generates", async () => {
    const prompt = "Once upon a time";
    const res = await client.completions.create({ model: modelId, prompt, max_tokens: 12, temperature: 0 });
    const ref = await reference(plain(prompt), 12);
    expect(res.object).toBe("text_completion");
    expect(res.choices[0]!.text).toBe(ref.text);
    expect(res.choices[0]!.finish_reason).toBe(ref.finish);
    expect(res.usage).toEqual({ prompt_tokens: plain(prompt).length, completion_tokens: 12, total_tokens: plain(prompt).length + 12 });
  });

  it("completions, streamed: chunks add up to the same text, the last carries finish_reason", async () => {
    const prompt = "The three primary colors are";
    const stream = await client.completions.create({ model: modelId, prompt, max_tokens: 10, temperature: 0, stream: true });
    const chunks: OpenAI.Completion[] = [];
    for await (const chunk of stream) chunks.push(chunk);
    const ref = await reference(plain(prompt), 10);
    expect(chunks.map((c) => c.choices[0]?.text ?? "").join("")).toBe(ref.text);
    expect(chunks.at(-1)!.choices[0]!.finish_reason).toBe("length");
    expect(chunks.slice(0, -1).every((c) => c.choices[0]!.finish_reason === null)).toBe(true);
  });

  it("chat, not streamed, with a stop string", async () => {
    const messages: ChatMessage[] = [{ role: "user", content: "Name a fruit." }];
    const res = await client.chat.completions.create({ model: modelId, messages, max_tokens: 16, temperature: 0 });
    const ref = await reference(chat(messages), 16);
    expect(res.choices[0]!.message).toMatchObject({ role: "assistant", content: ref.text });
    expect(res.usage?.completion_tokens).toBe(ref.tokens);

    const words = ref.text.split(" ");
    if (words.length > 2) {
      const stop = ` ${words[2]}`;
      const stopped = await client.chat.completions.create({ model: modelId, messages, max_tokens: 16, temperature: 0, stop });
      expect(stopped.choices[0]!.message.content).toBe(ref.text.slice(0, ref.text.indexOf(stop)));
      expect(stopped.choices[0]!.finish_reason).toBe("stop");
    }
  });

  it("chat, streamed, with usage: role first, deltas add up, then finish and usage", async () => {
    const messages: ChatMessage[] = [
      { role: "system", content: "You answer briefly." },
      { role: "user", content: "What is two plus two?" },
    ];
    const stream = await client.chat.completions.create({
      model: modelId,
      messages,
      max_tokens: 12,
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks: OpenAI.ChatCompletionChunk[] = [];
    for await (const chunk of stream) chunks.push(chunk);
    const ref = await reference(chat(messages), 12);
    expect(chunks[0]!.choices[0]!.delta.role).toBe("assistant");
    expect(chunks.map((c) => c.choices[0]?.delta.content ?? "").join("")).toBe(ref.text);
    const usage = chunks.at(-1)!;
    expect(usage.choices).toEqual([]);
    expect(usage.usage).toMatchObject({ prompt_tokens: chat(messages).length, completion_tokens: ref.tokens });
    expect(chunks.at(-2)!.choices[0]!.finish_reason).toBe(ref.finish);
  });

  it("seeded sampling is reproducible across the prefill/decode split", async () => {
    const ask = () =>
      client.completions.create({ model: modelId, prompt: "My favourite animal is", max_tokens: 8, temperature: 0.9, seed: 1234 });
    const [a, b] = [await ask(), await ask()];
    expect(a.choices[0]!.text).toBe(b.choices[0]!.text);
    let text = "";
    for await (const ev of generate(engine, tok, plain("My favourite animal is"), {
      maxTokens: 8,
      temperature: 0.9,
      topK: 40,
      topP: 1,
      seed: 1234,
    })) {
      if (ev.type === "token") text += ev.text;
    }
    expect(a.choices[0]!.text).toBe(text);
  });

  it("errors come back as OpenAI errors with a machine-readable code", async () => {
    const unknownModel = await client.completions.create({ model: "gpt-4", prompt: "hi", max_tokens: 2 }).catch((e: unknown) => e);
    expect(unknownModel).toBeInstanceOf(OpenAI.NotFoundError);
    expect((unknownModel as InstanceType<typeof OpenAI.APIError>).code).toBe("unknown_model");

    const bad = await client.chat.completions.create({ model: modelId, messages: [], max_tokens: 2 }).catch((e: unknown) => e);
    expect(bad).toBeInstanceOf(OpenAI.BadRequestError);
    expect((bad as InstanceType<typeof OpenAI.APIError>).code).toBe("invalid_request");

    const tooLong = await client.completions.create({ model: modelId, prompt: "hi", max_tokens: 100_000 }).catch((e: unknown) => e);
    expect(tooLong).toBeInstanceOf(OpenAI.BadRequestError);
    expect((tooLong as InstanceType<typeof OpenAI.APIError>).code).toBe("context_length_exceeded");
  });
});
