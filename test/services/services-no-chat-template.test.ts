// A model without a chat template (like Gemma 3 270M base) through the services: /v1/completions
// answers, /v1/chat/completions is refused with a clear 400 before any work. The model is a tiny
// random-weight Llama with a SentencePiece vocabulary, so the SentencePiece tokenizer runs in the
// services' tokenizer threads too.
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { getJson } from "../../tools/lib/services.ts";
import { tinyLlama } from "../harness/gguf-writer.ts";
import { TINY_SPM_VOCAB, tinySpmKv } from "../harness/spm-vocab.ts";
import { postJson } from "../harness/http.ts";
import { type Serve, startServe } from "../harness/serve.ts";

describe("a model without a chat template", () => {
  let dir: string;
  let s: Serve;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "ctxbank-nochat-"));
    const model = join(dir, "tiny-spm.gguf");
    await writeFile(model, tinyLlama({ nVocab: TINY_SPM_VOCAB.length, kv: tinySpmKv() }));
    s = await startServe({ model, shardBytes: 8 << 20 });
  });

  afterAll(async () => {
    await s?.stop();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it("serves /v1/completions, the prompt tokenized by SentencePiece with the model's BOS", async () => {
    expect(s.rt.chat).toBeUndefined();
    expect(s.rt.tokenizer.model).toBe("llama");
    const res = await postJson(`${s.url}/v1/completions`, { model: "default", prompt: "abc", max_tokens: 3, temperature: 0 });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(typeof res.body.choices[0].text).toBe("string");
    // BOS, then "▁abc" as ▁ | ab | c (the space prefix, the leftmost of two equal-score pairs).
    expect(s.rt.tokenizer.encode("abc", { addSpecial: true }).map((id) => s.rt.tokenizer.tokenText(id))).toEqual(["<s>", "▁", "ab", "c"]);
    expect(res.body.usage.prompt_tokens).toBe(4);
  });

  it("answers /v1/chat/completions with 400 no_chat_template naming /v1/completions, streaming or not", async () => {
    for (const stream of [false, true]) {
      const res = await postJson(`${s.url}/v1/chat/completions`, {
        model: "default",
        messages: [{ role: "user", content: "hi" }],
        max_tokens: 3,
        stream,
      });
      expect(res.status, JSON.stringify(res.body)).toBe(400);
      expect(res.body.error).toMatchObject({ code: "no_chat_template", param: "messages", type: "invalid_request_error" });
      expect(res.body.error.message).toMatch(/no chat template.*\/v1\/completions/);
    }
    // Still healthy and serving completions afterwards.
    expect((await getJson(`${s.url}/health`)).status).toBe(200);
    expect((await postJson(`${s.url}/v1/completions`, { model: "default", prompt: "a", max_tokens: 1 })).status).toBe(200);
  });
});
