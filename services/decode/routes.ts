// POST /v1/decode (a handle plus sampling options; SSE or one JSON answer) and GET /v1/decode/status.
import { createRoute, z } from "@hono/zod-openapi";
import { newApp, type ServiceApp } from "../../shared/platform/http/app.ts";
import { ApiError, errorAnswer, errorResponses } from "../../shared/platform/http/errors.ts";
import { requestTenant } from "../../shared/platform/http/tenant.ts";
import { DecodeRequestSchema, DecodeResultSchema, type DecodeRequest, type DecodeResult } from "../../shared/platform/http/wire.ts";
import type { DecodeOptions, DecodeService } from "./service.ts";
import { clientSignal, collect, sse } from "./stream.ts";

const decodeRoute = createRoute({
  method: "post",
  path: "/v1/decode",
  tags: ["decode"],
  summary: "Decode a prefill handle: load its KV (verified) and generate; SSE when stream is true",
  description:
    "SSE events: `token` {index, id, text} (the first comes from the handle, before the KV is read, and adds `policy`: the attention policy that runs, every default and budget written in), `done` (the DecodeResult without text), `error` (the error body).",
  request: { body: { content: { "application/json": { schema: DecodeRequestSchema } }, required: true } },
  responses: {
    200: {
      description: "The generation (JSON), or an event stream",
      content: { "application/json": { schema: DecodeResultSchema }, "text/event-stream": { schema: z.string() } },
    },
    ...errorResponses(400, 404, 409, 413, 429, 499, 500, 502, 503),
  },
});

const statusRoute = createRoute({
  method: "get",
  path: "/v1/decode/status",
  tags: ["decode"],
  summary: "Batch, queue, KV memory accounting, parked sessions and totals",
  responses: { 200: { content: { "application/json": { schema: z.record(z.string(), z.unknown()) } }, description: "Status" } },
});

export function decodeOptions(b: Omit<DecodeRequest, "handle" | "stream">): DecodeOptions {
  return {
    maxTokens: b.max_tokens,
    temperature: b.temperature,
    top_p: b.top_p,
    top_k: b.top_k,
    seed: b.seed,
    stop: b.stop === undefined ? [] : typeof b.stop === "string" ? [b.stop] : b.stop,
    onKvFailure: b.on_kv_failure,
    policy: b.policy,
  };
}

export function decodeRoutes(svc: DecodeService): ServiceApp {
  const app = newApp();
  app.openapi(decodeRoute, async (c) => {
    const body = c.req.valid("json");
    const ac = clientSignal(c);
    const events = svc.decode(
      body.handle,
      { ...decodeOptions(body), arrivedAt: c.get("arrivedAt"), tenant: requestTenant(c) },
      ac.signal,
      c.get("log"),
    );
    if (body.stream) {
      return sse(c, ac, events, {
        event: (s, ev) =>
          ev.type === "token"
            ? s.writeSSE({
                event: "token",
                id: String(ev.index),
                data: JSON.stringify({ index: ev.index, id: ev.id, text: ev.text, ...(ev.policy ? { policy: ev.policy } : {}) }),
              })
            : s.writeSSE({ event: "done", data: JSON.stringify(result(ev, "")) }),
        error: (s, e) => s.writeSSE({ event: "error", data: JSON.stringify(errorJson(e)) }),
      }) as never;
    }
    const all = await collect(events);
    const done = all.at(-1);
    if (done?.type !== "done") throw new ApiError(500, "internal_error", "the generation ended without a result");
    const text = all.map((e) => (e.type === "token" ? e.text : "")).join("");
    return c.json(result(done, text), 200);
  });
  return app;
}

/**
 * GET /v1/decode/status: on the internal listener only (it names batch and KV internals). `sessions`:
 * the conversations parked here and their KV bytes (services/router/decode-pool.ts reads it).
 */
export function decodeStatusRoutes(svc: DecodeService): ServiceApp {
  const app = newApp();
  app.openapi(statusRoute, (c) =>
    c.json({ ...svc.status(), sessions: svc.sessions?.held() ?? { count: 0, bytes: 0 } } as unknown as Record<string, unknown>, 200),
  );
  return app;
}

function result(ev: Extract<Awaited<ReturnType<typeof collect>>[number], { type: "done" }>, text: string): DecodeResult {
  return {
    request_id: ev.requestId,
    text,
    token_ids: ev.tokenIds,
    finish_reason: ev.finish,
    usage: { prompt_tokens: ev.promptTokens, completion_tokens: ev.completionTokens, total_tokens: ev.promptTokens + ev.completionTokens },
    kv: ev.kv,
    ttft_ms: ev.ttftMs,
    total_ms: ev.totalMs,
    ctxbank: ev.ctxbank,
  };
}

/** The error body for a failure inside a stream: the one the error handler would answer (shared/platform/http/errors.ts). */
export function errorJson(e: unknown) {
  return errorAnswer(e).body;
}
