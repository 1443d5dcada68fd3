// Streams one OpenAI-compatible request (POST {base}/completions or {base}/chat/completions with
// stream: true and usage requested) over an undici keep-alive pool and times it as the client
// sees it: TTFT = send → first chunk carrying text; every gap between text chunks (ITL); TPOT =
// (last token − first token) / (tokens − 1) with the token count from the server's usage chunk
// when it sends one (a server may put several tokens in a chunk), else the text chunks; E2E =
// send → end of stream; the server's own timings are kept when it sends ctxbank's extension.
// 429 and other failures are classified, never thrown.
import { Pool } from "undici";
import { SseParser } from "./sse.ts";
import type { ErrorKind, RequestResult } from "./types.ts";

export type Endpoint = "chat" | "completions";

export interface RequestSpec {
  endpoint: Endpoint;
  /** Body fields besides model/stream/stream_options: prompt or messages, max_tokens, ... */
  body: Record<string, unknown>;
  /** Prompt tokens as sized by our tokenizer. */
  promptTokensSent: number;
  /** Extra request headers (a multi-turn session's `x-session-id`). */
  headers?: Record<string, string>;
}

export interface ClientOptions {
  baseUrl: string;
  model: string;
  apiKey?: string;
  /** Per-request limit (ms), send to end of stream. */
  timeoutMs: number;
  /** Extra body fields sent with every request (e.g. policy, ignore_eos). */
  extraBody?: Record<string, unknown>;
}

type Timed = Omit<RequestResult, "index" | "scheduledMs" | "sentMs" | "session" | "round" | "sessionId">;

/** ctxbank's router header `x-ctxbank-route: <decode id>; reason=<reason>`, when the answer has one. */
export function parseRoute(header: string | string[] | undefined): { decode: string; reason: string } | undefined {
  const v = Array.isArray(header) ? header[0] : header;
  if (!v) return undefined;
  const m = /^\s*([^;]*?)\s*;\s*reason=([\w-]+)/.exec(v);
  return m ? { decode: m[1]!, reason: m[2]! } : { decode: v.trim(), reason: "unknown" };
}

export class StreamingClient {
  private readonly pool: Pool;
  private readonly prefix: string;

  constructor(private readonly opts: ClientOptions) {
    const url = new URL(opts.baseUrl);
    this.prefix = url.pathname.replace(/\/+$/, "");
    // Unlimited connections (one per in-flight request; SSE bodies are long-lived), no pipelining,
    // no body timeout of undici's own: the per-request timeout covers the whole stream.
    this.pool = new Pool(url.origin, { connections: null, pipelining: 1, keepAliveTimeout: 60_000, headersTimeout: 0, bodyTimeout: 0 });
  }

  async close(): Promise<void> {
    await this.pool.close();
  }

  /** Sends the request; `t0` (performance.now() at send) is returned so callers can place it on the run's clock. */
  async send(spec: RequestSpec, signal?: AbortSignal): Promise<Timed & { t0: number }> {
    const path = `${this.prefix}/${spec.endpoint === "chat" ? "chat/completions" : "completions"}`;
    const body = JSON.stringify({
      model: this.opts.model,
      ...spec.body,
      ...this.opts.extraBody,
      stream: true,
      stream_options: { include_usage: true },
    });
    const headers: Record<string, string> = { ...spec.headers, "content-type": "application/json", accept: "text/event-stream" };
    if (this.opts.apiKey) headers.authorization = `Bearer ${this.opts.apiKey}`;
    const timeout = AbortSignal.timeout(this.opts.timeoutMs);
    const sig = signal ? AbortSignal.any([signal, timeout]) : timeout;
    const r: Timed & { t0: number } = {
      t0: performance.now(),
      ok: false,
      promptTokensSent: spec.promptTokensSent,
      outputTokens: 0,
      tokenChunks: 0,
      itlMs: [],
    };
    const fail = (kind: ErrorKind, error: string) => Object.assign(r, { ok: false, errorKind: kind, error: error.slice(0, 300) });
    r.t0 = performance.now();
    try {
      const res = await this.pool.request({ path, method: "POST", headers, body, signal: sig });
      r.status = res.statusCode;
      const route = parseRoute(res.headers["x-ctxbank-route"]);
      if (route) r.route = route;
      if (res.statusCode !== 200) {
        const text = await res.body.text().catch(() => "");
        const kind: ErrorKind = res.statusCode === 429 ? "rate_limited" : res.statusCode < 500 ? "http_4xx" : "http_5xx";
        return fail(kind, `${res.statusCode} ${text}`);
      }
      const parser = new SseParser();
      const decoder = new TextDecoder();
      let first: number | undefined;
      let last: number | undefined;
      let usageTokens: number | undefined;
      let text = "";
      let done = false;
      const onEvent = (data: string, at: number): string | undefined => {
        if (data === "[DONE]") {
          done = true;
          return undefined;
        }
        let msg: any;
        try {
          msg = JSON.parse(data);
        } catch {
          return `unparseable chunk: ${data.slice(0, 100)}`;
        }
        if (msg.error) return `stream error: ${JSON.stringify(msg.error)}`;
        if (msg.usage) {
          if (typeof msg.usage.completion_tokens === "number") usageTokens = msg.usage.completion_tokens;
          if (typeof msg.usage.prompt_tokens === "number") r.promptTokens = msg.usage.prompt_tokens;
        }
        const t = msg.ctxbank?.timings;
        if (t && typeof t.ttft_ms === "number" && typeof t.e2e_ms === "number") {
          r.server = { ttftMs: t.ttft_ms, e2eMs: t.e2e_ms };
          if (typeof t.tpot_ms === "number") r.server.tpotMs = t.tpot_ms;
          if (typeof t.queue_ms === "number") r.server.queueMs = t.queue_ms;
        }
        const session = msg.ctxbank?.session;
        if (session && typeof session.reused_tokens === "number") r.reusedTokens = session.reused_tokens;
        const prefill = msg.ctxbank?.prefill;
        if (prefill && typeof prefill.where === "string")
          r.prefill = typeof prefill.cause === "string" ? { where: prefill.where, cause: prefill.cause } : { where: prefill.where };
        const choice = msg.choices?.[0];
        if (!choice) return undefined;
        const piece: unknown = spec.endpoint === "chat" ? choice.delta?.content : choice.text;
        if (typeof piece === "string" && piece !== "") {
          if (first === undefined) first = at;
          else r.itlMs.push(at - last!);
          last = at;
          r.tokenChunks++;
          text += piece;
        }
        if (choice.finish_reason) r.finishReason = choice.finish_reason;
        return undefined;
      };
      for await (const chunk of res.body) {
        const at = performance.now();
        for (const ev of parser.feed(decoder.decode(chunk as Buffer, { stream: true }))) {
          const err = onEvent(ev.data, at);
          if (err) {
            res.body.destroy();
            return fail("stream_error", err);
          }
        }
      }
      const end = performance.now();
      for (const ev of parser.end()) onEvent(ev.data, end);
      if (!done && r.finishReason === undefined) return fail("stream_error", "stream ended without a finish_reason or [DONE]");
      r.ok = true;
      r.text = text;
      r.e2eMs = end - r.t0;
      r.outputTokens = usageTokens ?? r.tokenChunks;
      if (first !== undefined) {
        r.ttftMs = first - r.t0;
        if (r.outputTokens > 1 && last! > first) r.tpotMs = (last! - first) / (r.outputTokens - 1);
      } else {
        // No text at all (e.g. an immediate end of sequence): nothing to time a first token by.
        r.ok = false;
        r.errorKind = "stream_error";
        r.error = "no token in the stream";
      }
      return r;
    } catch (err) {
      const e = err as Error & { code?: string };
      if (timeout.aborted) return fail("timeout", `no end of stream after ${this.opts.timeoutMs} ms`);
      if (signal?.aborted) return fail("timeout", "run stopped (duration cap)");
      return fail("network", `${e.code ?? e.name}: ${e.message}`);
    }
  }
}
