// What one request measured, as the client saw it. Times are ms; offsets are from the run's start.

export type ErrorKind = "rate_limited" | "http_4xx" | "http_5xx" | "network" | "stream_error" | "timeout";

export interface RequestResult {
  /** Position in the run (0-based, warm-up excluded). */
  index: number;
  /** Session and round for multi-turn workloads. */
  session?: number;
  round?: number;
  /** The conversation's id as sent in `x-session-id` (multi-turn with session ids on). */
  sessionId?: string;
  /** When the arrival process wanted it sent, and when it was sent. */
  scheduledMs: number;
  sentMs: number;
  ok: boolean;
  status?: number;
  errorKind?: ErrorKind;
  error?: string;
  /** Prompt tokens as we sized them (our tokenizer), and as the server reported (usage). */
  promptTokensSent: number;
  promptTokens?: number;
  /** Generated tokens: the server's usage count when it sent one, else the token chunks seen. */
  outputTokens: number;
  /** Chunks that carried a token (non-empty text), what ITL gaps are measured between. */
  tokenChunks: number;
  finishReason?: string;
  /** Send → first chunk with text. */
  ttftMs?: number;
  /** (last token − first token) / (outputTokens − 1); undefined with fewer than 2 tokens. */
  tpotMs?: number;
  /** Every gap between consecutive token chunks. */
  itlMs: number[];
  /** Send → end of the stream. */
  e2eMs?: number;
  /** The server's own timings when it reports them (ctxbank's `ctxbank.timings` extension), ms. */
  server?: { ttftMs: number; tpotMs?: number; e2eMs: number; queueMs?: number };
  /** ctxbank's router: the decode it chose and why (the `x-ctxbank-route` response header). */
  route?: { decode: string; reason: string };
  /** ctxbank: prompt tokens a session's parked KV supplied (`ctxbank.session.reused_tokens`). */
  reusedTokens?: number;
  /** ctxbank: where the prompt was computed and why (`ctxbank.prefill.where` / `.cause`). */
  prefill?: { where: string; cause?: string };
  /** The generated text (kept only for multi-turn history and QA checks, not written out). */
  text?: string;
}

export interface Slo {
  ttftMs: number;
  tpotMs: number;
}
