// The OpenAI Responses API, text in and text out: POST /v1/responses (with `store` and
// `previous_response_id`), GET and DELETE /v1/responses/{id}. A stored response is a turn of a
// conversation: its input and output are kept in the registry, chained by previous_response_id, so
// the next turn sends only its new input and the server rebuilds the rest; the chain is one session
// (services/sessions/), so the next turn also reuses the KV of everything before it and computes
// only its new tokens (`usage.input_tokens_details.cached_tokens` says how many were reused).
// Ids are bound to their API key: another key's response is answered as unknown.
import { createRoute, z } from "@hono/zod-openapi";
import { newApp, type ServiceApp } from "../../shared/platform/http/app.ts";
import { ApiError, errorResponses } from "../../shared/platform/http/errors.ts";
import { requestTenant } from "../../shared/platform/http/tenant.ts";
import { MAX_WIRE_MESSAGES } from "../../shared/platform/http/wire.ts";
import type { ChatMessage } from "../../shared/inference/tokenizer/chat-template.ts";
import { MAX_TOKENS_DEFAULTS, SAMPLING_DEFAULTS } from "../../shared/inference/defaults.ts";
import type { ResponseRow } from "../../shared/platform/registry/registry.ts";
import { checkPromptSize, type Runtime } from "../runtime.ts";
import type { DecodeEvent, DecodeService } from "./service.ts";
import { clientSignal, collect } from "./stream.ts";

/** How long a stored response (and so its chain) can be continued. */
export const RESPONSE_RETENTION_MS = 24 * 3600 * 1000;

const InputText = z.object({ type: z.enum(["input_text", "output_text"]), text: z.string() });
const InputMessage = z.object({
  type: z.literal("message").optional(),
  role: z.enum(["system", "developer", "user", "assistant"]),
  content: z.union([z.string(), z.array(InputText).max(1024)]),
});
const unsupported = (what: string) => ({ description: `not supported: ${what}` });

const ResponseRequest = z
  .object({
    model: z.string().min(1).max(256),
    input: z.union([z.string(), z.array(InputMessage).min(1).max(MAX_WIRE_MESSAGES)]),
    instructions: z.string().nullish().openapi({ description: "A system message for this turn (not carried to the next, as OpenAI's)" }),
    previous_response_id: z.string().min(1).max(128).nullish(),
    store: z
      .boolean()
      .nullish()
      .openapi({ description: "Keep this turn (and its KV, as the chain's session) for a next turn; default true" }),
    max_output_tokens: z.number().int().min(1).nullish(),
    temperature: z.number().min(0).max(2).nullish(),
    top_p: z.number().gt(0).max(1).nullish(),
    stream: z.literal(false).nullish().openapi(unsupported("streaming: only false or absent")),
    tools: z.array(z.unknown()).max(0).nullish().openapi(unsupported("only [] or null")),
    tool_choice: z.literal("none").nullish().openapi(unsupported('only "none" or null')),
    text: z
      .object({ format: z.object({ type: z.literal("text") }) })
      .nullish()
      .openapi(unsupported('only { format: { type: "text" } }')),
    reasoning: z.null().optional(),
    metadata: z.record(z.string(), z.string().max(512)).nullish(),
    user: z.string().optional(),
  })
  .openapi("ResponseRequest");

const ResponseObject = z
  .object({
    id: z.string(),
    object: z.literal("response"),
    created_at: z.number(),
    status: z.enum(["completed", "incomplete"]),
    incomplete_details: z.object({ reason: z.string() }).nullable(),
    model: z.string(),
    previous_response_id: z.string().nullable(),
    instructions: z.string().nullable(),
    output: z.array(
      z.object({
        type: z.literal("message"),
        id: z.string(),
        status: z.literal("completed"),
        role: z.literal("assistant"),
        content: z.array(
          z.object({
            type: z.literal("output_text"),
            text: z.string(),
            annotations: z.array(z.string()).max(0).openapi({ description: "always empty" }),
          }),
        ),
      }),
    ),
    output_text: z.string(),
    usage: z.object({
      input_tokens: z.number(),
      input_tokens_details: z.object({ cached_tokens: z.number() }),
      output_tokens: z.number(),
      output_tokens_details: z.object({ reasoning_tokens: z.number() }),
      total_tokens: z.number(),
    }),
    store: z.boolean(),
    error: z.null(),
  })
  .openapi("Response");

const errors = errorResponses(400, 404, 413, 429, 499, 500, 502, 503);
const IdParam = z.object({ id: z.string().min(1).max(128) });

const createRouteDef = createRoute({
  method: "post",
  path: "/v1/responses",
  tags: ["openai"],
  summary: "A turn of a conversation (OpenAI Responses API, text only); chained turns reuse the earlier turns' KV",
  request: { body: { content: { "application/json": { schema: ResponseRequest } }, required: true } },
  responses: { 200: { description: "The response", content: { "application/json": { schema: ResponseObject } } }, ...errors },
});
const getRouteDef = createRoute({
  method: "get",
  path: "/v1/responses/{id}",
  tags: ["openai"],
  summary: "A stored response",
  request: { params: IdParam },
  responses: { 200: { description: "The response", content: { "application/json": { schema: ResponseObject } } }, ...errorResponses(404) },
});
const deleteRouteDef = createRoute({
  method: "delete",
  path: "/v1/responses/{id}",
  tags: ["openai"],
  summary: "Deletes a stored response (and ends its chain's session when it was the last turn)",
  request: { params: IdParam },
  responses: {
    200: {
      description: "Deleted",
      content: {
        "application/json": { schema: z.object({ id: z.string(), object: z.literal("response.deleted"), deleted: z.boolean() }) },
      },
    },
    ...errorResponses(404),
  },
});

/** The text of a message's content (parts joined). */
const textOf = (content: z.infer<typeof InputMessage>["content"]) =>
  typeof content === "string" ? content : content.map((p) => p.text).join("");
const roleOf = (role: z.infer<typeof InputMessage>["role"]): ChatMessage["role"] => (role === "developer" ? "system" : role);

/** A key's ids are namespaced in the registry (`<key>:<id>`), as request ids are; the client sees the id alone. */
const stored = (tenant: string, id: string) => `${tenant}:${id}`;
const unknownResponse = (id: string) =>
  new ApiError(404, "unknown_response", `no stored response ${JSON.stringify(id.slice(0, 128))}`, "previous_response_id");

function responseObject(
  row: Pick<ResponseRow, "outputText" | "inputTokens" | "outputTokens" | "model" | "createdAt">,
  o: { id: string; previousId: string | null; instructions: string | null; cached: number; incomplete: boolean; store: boolean },
) {
  return {
    id: o.id,
    object: "response" as const,
    created_at: Math.floor(row.createdAt.getTime() / 1000),
    status: o.incomplete ? ("incomplete" as const) : ("completed" as const),
    incomplete_details: o.incomplete ? { reason: "max_output_tokens" } : null,
    model: row.model,
    previous_response_id: o.previousId,
    instructions: o.instructions,
    output: [
      {
        type: "message" as const,
        id: `msg_${o.id.slice(5)}`,
        status: "completed" as const,
        role: "assistant" as const,
        content: [{ type: "output_text" as const, text: row.outputText, annotations: [] as string[] }],
      },
    ],
    output_text: row.outputText,
    usage: {
      input_tokens: row.inputTokens,
      input_tokens_details: { cached_tokens: o.cached },
      output_tokens: row.outputTokens,
      output_tokens_details: { reasoning_tokens: 0 },
      total_tokens: row.inputTokens + row.outputTokens,
    },
    store: o.store,
    error: null,
  };
}

export function responsesRoutes(rt: Runtime, svc: DecodeService): ServiceApp {
  const app = newApp();
  const { registry } = rt;

  app.openapi(createRouteDef, async (c) => {
    const b = c.req.valid("json");
    if (![rt.modelId, `${rt.modelId}.gguf`, "default", "ctxbank"].includes(b.model)) {
      throw new ApiError(
        404,
        "unknown_model",
        `model ${JSON.stringify(b.model)} is not served here; GET /v1/models lists ${JSON.stringify(rt.modelId)}`,
        "model",
      );
    }
    const tenant = requestTenant(c);
    const turn: ChatMessage[] =
      typeof b.input === "string"
        ? [{ role: "user", content: b.input }]
        : b.input.map((m) => ({ role: roleOf(m.role), content: textOf(m.content) }));
    // The conversation so far: every stored turn's input and output, oldest first.
    let history: ChatMessage[] = [];
    let sessionId: string | undefined;
    const previousId = b.previous_response_id ?? null;
    if (previousId) {
      const chain = await registry.responses.chain(stored(tenant, previousId), tenant);
      if (!chain) throw unknownResponse(previousId);
      history = chain.flatMap((r) => [
        ...r.input.map((m) => ({ role: m.role as ChatMessage["role"], content: m.content })),
        { role: "assistant" as const, content: r.outputText },
      ]);
      sessionId = chain[0]!.sessionId.slice(tenant.length + 1);
    }
    const messages: ChatMessage[] = [
      ...(b.instructions ? [{ role: "system" as const, content: b.instructions }] : []),
      ...history,
      ...turn,
    ];
    checkPromptSize(rt, { messages });
    const id = `resp_${crypto.randomUUID().replaceAll("-", "")}`;
    const store = b.store ?? true;
    sessionId ??= id; // a chain's session is named after its first response
    const ac = clientSignal(c);
    const events = svc.complete(
      { messages },
      {
        maxTokens: b.max_output_tokens ?? Math.max(1, Math.min(MAX_TOKENS_DEFAULTS.generate, rt.engine.maxContext - 1)),
        temperature: b.temperature ?? SAMPLING_DEFAULTS.openai.temperature,
        top_p: b.top_p ?? SAMPLING_DEFAULTS.openai.topP,
        arrivedAt: c.get("arrivedAt"),
        tenant,
        ...(store ? { session: sessionId } : {}),
      },
      ac.signal,
      c.get("log"),
    );
    const all = await collect(events);
    const done = all.at(-1) as Extract<DecodeEvent, { type: "done" }> | undefined;
    if (done?.type !== "done") throw new ApiError(500, "internal_error", "the generation ended without a result");
    const outputText = all.map((e) => (e.type === "token" ? e.text : "")).join("");
    const row = {
      outputText,
      inputTokens: done.promptTokens,
      outputTokens: done.completionTokens,
      model: rt.modelId,
      createdAt: new Date(),
    };
    if (store) {
      await registry.responses.create({
        ...row,
        id: stored(tenant, id),
        tenant,
        previousId: previousId ? stored(tenant, previousId) : null,
        sessionId: stored(tenant, sessionId),
        input: turn,
        expiresAt: new Date(Date.now() + RESPONSE_RETENTION_MS),
      });
    }
    const cached = done.ctxbank.session?.reused_tokens ?? 0;
    return c.json(
      responseObject(row, { id, previousId, instructions: b.instructions ?? null, cached, incomplete: done.finish === "length", store }),
      200,
    );
  });

  app.openapi(getRouteDef, async (c) => {
    const { id } = c.req.valid("param");
    const tenant = requestTenant(c);
    const row = await registry.responses.get(stored(tenant, id), tenant);
    if (!row) throw unknownResponse(id);
    const previousId = row.previousId ? row.previousId.slice(tenant.length + 1) : null;
    return c.json(responseObject(row, { id, previousId, instructions: null, cached: 0, incomplete: false, store: true }), 200);
  });

  app.openapi(deleteRouteDef, async (c) => {
    const { id } = c.req.valid("param");
    const tenant = requestTenant(c);
    if (!(await registry.responses.remove(stored(tenant, id), tenant))) throw unknownResponse(id);
    return c.json({ id, object: "response.deleted" as const, deleted: true }, 200);
  });

  return app;
}
