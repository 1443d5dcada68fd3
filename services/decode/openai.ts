// OpenAI-compatible routes: POST /v1/completions, POST /v1/chat/completions (streaming and not)
// and GET /v1/models. Each request is prefilled on a prefill instance picked from the registry
// and decoded here. Supported: n = 1, max_tokens, temperature, top_p, top_k (extension), seed,
// stop, stream, stream_options.include_usage, and the extensions on_kv_failure and policy. Their
// defaults (OpenAI's where it has one) are in shared/inference/defaults.ts.
import { createRoute, z } from "@hono/zod-openapi";
import type { Context } from "hono";
import { newApp, type ServiceApp } from "../../shared/platform/http/app.ts";
import { ApiError, errorResponses } from "../../shared/platform/http/errors.ts";
import { requestTenant } from "../../shared/platform/http/tenant.ts";
import { isJsonMediaType } from "../../shared/platform/http/json-depth.ts";
import {
  CtxbankExtensionSchema,
  MAX_WIRE_MESSAGES,
  policyField,
  SamplingFields,
  SessionId,
  StopSchema,
  TokenIds,
} from "../../shared/platform/http/wire.ts";
import { MAX_TOKENS_DEFAULTS, SAMPLING_DEFAULTS } from "../../shared/inference/defaults.ts";
import { MAX_TOP_K } from "../../shared/inference/engine/sampler.ts";
import type { FinishReason } from "../../shared/inference/generate.ts";
import type { ChatMessage } from "../../shared/inference/tokenizer/chat-template.ts";
import { checkPromptSize, type Runtime } from "../runtime.ts";
import type { DecodeEvent, DecodeOptions, DecodeService } from "./service.ts";
import { clientSignal, collect, sse } from "./stream.ts";
import { errorJson } from "./routes.ts";

/** Fields that change what the answer means, which ctxbank does not implement: accepted only when empty or null, refused otherwise (not ignored). */
const unsupported = (what: string) => ({ description: `not supported: ${what}` });
const Common = {
  model: z.string().min(1).max(256).openapi({ example: "SmolLM2-135M-Instruct.Q4_1" }),
  max_tokens: z
    .number()
    .int()
    .min(1)
    .nullish()
    .openapi({
      description: `Default ${MAX_TOKENS_DEFAULTS.completions} for completions, ${MAX_TOKENS_DEFAULTS.generate} for chat (less if the context is short)`,
    }),
  ...SamplingFields,
  temperature: z.number().min(0).max(2).nullish().openapi({ default: SAMPLING_DEFAULTS.openai.temperature }),
  top_p: z.number().gt(0).max(1).nullish().openapi({ default: SAMPLING_DEFAULTS.openai.topP }),
  top_k: z
    .number()
    .int()
    .min(0)
    .max(MAX_TOP_K)
    .nullish()
    .openapi({ description: "extension; 0 = no limit", default: SAMPLING_DEFAULTS.openai.topK }),
  seed: z
    .number()
    .int()
    .min(0)
    .max(2 ** 32 - 1)
    .nullish(),
  stop: StopSchema.nullable(),
  stream: z.boolean().nullish(),
  stream_options: z.object({ include_usage: z.boolean().optional() }).nullish(),
  n: z.literal(1).nullish().openapi({ description: "only 1 is supported" }),
  user: z.string().optional(),
  presence_penalty: z.literal(0).nullish().openapi({ description: "only 0 (not supported)" }),
  frequency_penalty: z.literal(0).nullish().openapi({ description: "only 0 (not supported)" }),
  logit_bias: z.strictObject({}).nullish().openapi(unsupported("only {} or null")),
  tools: z.array(z.unknown()).max(0).nullish().openapi(unsupported("only [] or null")),
  tool_choice: z.literal("none").nullish().openapi(unsupported('only "none" or null')),
  functions: z.array(z.unknown()).max(0).nullish().openapi(unsupported("only [] or null")),
  function_call: z.literal("none").nullish().openapi(unsupported('only "none" or null')),
  response_format: z
    .strictObject({ type: z.literal("text") })
    .nullish()
    .openapi(unsupported('only { type: "text" } or null')),
  on_kv_failure: z.enum(["fail", "recompute"]).optional().openapi({ description: "extension: what to do when the KV cannot be loaded" }),
  session_id: SessionId.optional().openapi({
    description:
      "extension: the conversation this request is a turn of (or the x-session-id header): its KV is kept, and the next turn computes only its new tokens",
  }),
  policy: policyField("extension: how decode attends (full, omnikv, scope, ...); default: the server's --policy"),
};

const CompletionRequest = z
  .object({
    ...Common,
    prompt: z.union([z.string().min(1), z.array(z.string().min(1)).length(1), TokenIds, z.array(TokenIds).length(1)]),
    echo: z.literal(false).nullish(),
    logprobs: z.null().optional(),
    suffix: z.null().optional(),
  })
  .openapi("CompletionRequest");

const ContentPart = z.object({ type: z.literal("text"), text: z.string() });
const ChatRequest = z
  .object({
    ...Common,
    max_completion_tokens: z.number().int().min(1).nullish(),
    messages: z
      .array(
        z.object({
          role: z.enum(["system", "developer", "user", "assistant"]),
          content: z.union([z.string(), z.array(ContentPart).max(1024)]),
        }),
      )
      .min(1)
      .max(MAX_WIRE_MESSAGES),
    logprobs: z.literal(false).nullish(),
  })
  .openapi("ChatCompletionRequest");

const Usage = z.object({ prompt_tokens: z.number(), completion_tokens: z.number(), total_tokens: z.number() });
const CompletionResponse = z
  .object({
    id: z.string(),
    object: z.literal("text_completion"),
    created: z.number(),
    model: z.string(),
    choices: z.array(z.object({ index: z.number(), text: z.string(), finish_reason: z.string().nullable(), logprobs: z.null() })),
    usage: Usage,
    ctxbank: CtxbankExtensionSchema.openapi({ description: "extension: this request's timings and SLO verdicts" }),
  })
  .openapi("Completion");
const ChatResponse = z
  .object({
    id: z.string(),
    object: z.literal("chat.completion"),
    created: z.number(),
    model: z.string(),
    choices: z.array(
      z.object({
        index: z.number(),
        message: z.object({ role: z.literal("assistant"), content: z.string() }),
        finish_reason: z.string().nullable(),
        logprobs: z.null(),
      }),
    ),
    usage: Usage,
    ctxbank: CtxbankExtensionSchema.openapi({ description: "extension: this request's timings and SLO verdicts" }),
  })
  .openapi("ChatCompletion");
const ModelList = z
  .object({
    object: z.literal("list"),
    data: z.array(
      z.object({
        id: z.string(),
        object: z.literal("model"),
        created: z.number(),
        owned_by: z.string(),
        /** ctxbank extension: where the engine runs the model (cpu or cuda:N). */
        device: z.string(),
        /** ctxbank extension: the kernels it chose (the CPU's instruction set: scalar, avx2, avx512; on a GPU the CUDA kernel set). */
        kernels: z.string(),
      }),
    ),
  })
  .openapi("ModelList");

const stream = {
  "text/event-stream": {
    schema: z.string().openapi({
      description: "data: <chunk JSON> lines, then data: [DONE]; the last chunk before [DONE] carries `ctxbank` (CtxbankExtension)",
    }),
  },
};
const errors = errorResponses(400, 404, 409, 413, 429, 499, 500, 502, 503);

const completionsRoute = createRoute({
  method: "post",
  path: "/v1/completions",
  tags: ["openai"],
  summary: "Text completion (OpenAI-compatible), disaggregated: prefill elsewhere, decode here",
  request: { body: { content: { "application/json": { schema: CompletionRequest } }, required: true } },
  responses: {
    200: { description: "Completion, or a stream of chunks", content: { "application/json": { schema: CompletionResponse }, ...stream } },
    ...errors,
  },
});
const chatRoute = createRoute({
  method: "post",
  path: "/v1/chat/completions",
  tags: ["openai"],
  summary: "Chat completion (OpenAI-compatible) with the model's chat template",
  request: { body: { content: { "application/json": { schema: ChatRequest } }, required: true } },
  responses: {
    200: { description: "Chat completion, or a stream of chunks", content: { "application/json": { schema: ChatResponse }, ...stream } },
    ...errors,
  },
});
const modelsRoute = createRoute({
  method: "get",
  path: "/v1/models",
  tags: ["openai"],
  summary: "The served model",
  responses: { 200: { content: { "application/json": { schema: ModelList } }, description: "Models" } },
});

type Common = { [K in keyof typeof Common]?: z.infer<(typeof Common)[K]> };

/** The request's session: the session_id field, else the x-session-id header (OpenAI clients add headers more easily than fields). */
function sessionOf(c: Context, b: Common): string | undefined {
  if (b.session_id !== undefined) return b.session_id;
  const header = c.req.header("x-session-id");
  if (header === undefined) return undefined;
  const parsed = SessionId.safeParse(header);
  if (!parsed.success)
    throw new ApiError(400, "invalid_request", `x-session-id: ${parsed.error.issues[0]?.message ?? "invalid"}`, "x-session-id");
  return parsed.data;
}

function options(b: Common, maxTokens: number | null | undefined, defaultMax: number): DecodeOptions {
  return {
    maxTokens: maxTokens ?? defaultMax,
    temperature: b.temperature ?? SAMPLING_DEFAULTS.openai.temperature,
    top_p: b.top_p ?? SAMPLING_DEFAULTS.openai.topP,
    top_k: b.top_k ?? SAMPLING_DEFAULTS.openai.topK,
    seed: b.seed ?? undefined,
    stop: b.stop == null ? [] : typeof b.stop === "string" ? [b.stop] : b.stop,
    onKvFailure: b.on_kv_failure,
    policy: b.policy,
  };
}

const openaiFinish = (f: FinishReason) => (f === "length" ? "length" : "stop");

export function openaiRoutes(rt: Runtime, svc: DecodeService): ServiceApp {
  const app = newApp();
  const created = Math.floor(Date.now() / 1000);
  const checkModel = (model: string) => {
    if (![rt.modelId, `${rt.modelId}.gguf`, "default", "ctxbank"].includes(model)) {
      throw new ApiError(
        404,
        "unknown_model",
        `model ${JSON.stringify(model)} is not served here; GET /v1/models lists ${JSON.stringify(rt.modelId)}`,
        "model",
      );
    }
  };
  /** Default max tokens, capped so a short context still works when the client says nothing. */
  const room = (want: number) => Math.max(1, Math.min(want, rt.engine.maxContext - 1));

  const { info } = rt.engine.native;
  const kernels = info.device === "cpu" ? info.kernels : `cuda ${info.cudaKernels}`;
  app.openapi(modelsRoute, (c) =>
    c.json(
      {
        object: "list" as const,
        data: [{ id: rt.modelId, object: "model" as const, created, owned_by: "ctxbank", device: rt.engine.device, kernels }],
      },
      200,
    ),
  );

  app.openapi(completionsRoute, async (c) => {
    const b = c.req.valid("json");
    await reportIgnored(c, CompletionRequest.shape);
    checkModel(b.model);
    const p = b.prompt;
    const prompt =
      typeof p === "string"
        ? { prompt: p }
        : typeof p[0] === "string"
          ? { prompt: p[0] }
          : Array.isArray(p[0])
            ? { prompt_token_ids: p[0] }
            : { prompt_token_ids: p as number[] };
    checkPromptSize(rt, prompt); // here too, so an oversized prompt is not sent on to a prefill
    const ac = clientSignal(c);
    const events = svc.complete(
      prompt,
      {
        ...options(b, b.max_tokens, room(MAX_TOKENS_DEFAULTS.completions)),
        arrivedAt: c.get("arrivedAt"),
        tenant: requestTenant(c),
        session: sessionOf(c, b),
      },
      ac.signal,
      c.get("log"),
    );
    const id = `cmpl-${crypto.randomUUID()}`;
    const base = { id, object: "text_completion" as const, created: now(), model: rt.modelId };
    if (b.stream) {
      return respondStream(c, ac, events, b.stream_options?.include_usage === true, {
        chunk: (text, finish) => ({ ...base, choices: [{ index: 0, text, finish_reason: finish, logprobs: null }] }),
        usage: (u) => ({ ...base, choices: [], usage: u }),
      });
    }
    const { text, done } = await gather(events);
    return c.json(
      {
        ...base,
        choices: [{ index: 0, text, finish_reason: openaiFinish(done.finish), logprobs: null }],
        usage: usage(done),
        ctxbank: done.ctxbank,
      },
      200,
    );
  });

  app.openapi(chatRoute, async (c) => {
    const b = c.req.valid("json");
    await reportIgnored(c, ChatRequest.shape);
    checkModel(b.model);
    const messages: ChatMessage[] = b.messages.map((m) => ({
      role: m.role === "developer" ? "system" : m.role,
      content: typeof m.content === "string" ? m.content : m.content.map((part) => part.text).join(""),
    }));
    checkPromptSize(rt, { messages });
    const ac = clientSignal(c);
    const events = svc.complete(
      { messages },
      {
        ...options(b, b.max_completion_tokens ?? b.max_tokens, room(MAX_TOKENS_DEFAULTS.generate)),
        arrivedAt: c.get("arrivedAt"),
        tenant: requestTenant(c),
        session: sessionOf(c, b),
      },
      ac.signal,
      c.get("log"),
    );
    const id = `chatcmpl-${crypto.randomUUID()}`;
    const base = { id, object: "chat.completion.chunk" as const, created: now(), model: rt.modelId };
    if (b.stream) {
      let first = true;
      return respondStream(c, ac, events, b.stream_options?.include_usage === true, {
        chunk: (text, finish) => {
          const delta = first ? { role: "assistant" as const, content: text } : finish ? {} : { content: text };
          first = false;
          return { ...base, choices: [{ index: 0, delta, finish_reason: finish, logprobs: null }] };
        },
        usage: (u) => ({ ...base, choices: [], usage: u }),
      });
    }
    const { text, done } = await gather(events);
    return c.json(
      {
        ...base,
        object: "chat.completion" as const,
        choices: [
          { index: 0, message: { role: "assistant" as const, content: text }, finish_reason: openaiFinish(done.finish), logprobs: null },
        ],
        usage: usage(done),
        ctxbank: done.ctxbank,
      },
      200,
    );
  });
  return app;
}

/** The header that lists the top-level request fields these routes ignored (comma-separated). */
export const IGNORED_FIELDS_HEADER = "ctxbank-ignored-fields";

/**
 * OpenAI clients send fields ctxbank does not implement (and SDKs add new ones), so unknown
 * top-level fields are accepted, not refused as on ctxbank's own routes; this header names them,
 * so a misspelled one (`polcy`) is seen. Inside `policy` an unknown key is always refused.
 */
async function reportIgnored(c: Context, shape: Record<string, unknown>): Promise<void> {
  if (!isJsonMediaType(c.req.header("content-type"))) return; // the route read no body (createApp checked JSON ones)
  const body: unknown = await c.req.json();
  if (body === null || typeof body !== "object" || Array.isArray(body)) return;
  // Percent-encoded (a key may hold any character, a header value may not), at most 32 of them.
  const ignored = Object.keys(body).filter((k) => !Object.hasOwn(shape, k));
  if (ignored.length > 0) c.header(IGNORED_FIELDS_HEADER, ignored.slice(0, 32).map(encodeURIComponent).join(", "));
}

const now = () => Math.floor(Date.now() / 1000);
type Done = Extract<DecodeEvent, { type: "done" }>;
const usage = (d: Done) => ({
  prompt_tokens: d.promptTokens,
  completion_tokens: d.completionTokens,
  total_tokens: d.promptTokens + d.completionTokens,
});

async function gather(events: AsyncGenerator<DecodeEvent>): Promise<{ text: string; done: Done }> {
  const all = await collect(events);
  const done = all.at(-1);
  if (done?.type !== "done") throw new ApiError(500, "internal_error", "the generation ended without a result");
  return { text: all.map((e) => (e.type === "token" ? e.text : "")).join(""), done };
}

interface ChunkMaker {
  chunk(text: string, finish: string | null): object;
  usage(u: ReturnType<typeof usage>): object;
}

/**
 * OpenAI's stream: `data: <chunk>` per token as soon as it is sampled, then a chunk with empty
 * text and the finish_reason, an optional usage chunk, and `data: [DONE]`. The last chunk before
 * [DONE] carries the `ctxbank` extension, and the first its `policy` (clients ignore fields they do not know).
 */
function respondStream(c: Context, ac: AbortController, events: AsyncGenerator<DecodeEvent>, includeUsage: boolean, make: ChunkMaker) {
  return sse(c, ac, events, {
    async event(s, ev) {
      if (ev.type === "token") {
        // The first chunk says which policy runs (every default and budget written in).
        await s.writeSSE({
          data: JSON.stringify({ ...make.chunk(ev.text, null), ...(ev.policy ? { ctxbank: { policy: ev.policy } } : {}) }),
        });
        return;
      }
      const ext = { ctxbank: ev.ctxbank };
      await s.writeSSE({ data: JSON.stringify({ ...make.chunk("", openaiFinish(ev.finish)), ...(includeUsage ? {} : ext) }) });
      if (includeUsage) await s.writeSSE({ data: JSON.stringify({ ...make.usage(usage(ev)), ...ext }) });
    },
    error: (s, e) => s.writeSSE({ data: JSON.stringify(errorJson(e)) }),
    end: (s) => s.writeSSE({ data: "[DONE]" }),
  }) as never;
}
