// A local OpenAI-style streaming server with scripted timing, for the load generator's tests and
// its client-overhead measurement: answers /v1/completions and /v1/chat/completions with
// `tokens` chunks, the first after `ttftMs`, then one every `itlMs`, a finish chunk, a usage
// chunk and [DONE]. Scripts can answer 429/500, break the stream, or split events across writes,
// add response headers, and put a `ctxbank` extension in the usage chunk.
import http from "node:http";
import type { AddressInfo } from "node:net";

export interface FakeScript {
  status?: number;
  ttftMs?: number;
  itlMs?: number;
  tokens?: number;
  /** Text of token i (default "tok{i} "). */
  text?: (i: number) => string;
  /** Send an error chunk after this many tokens. */
  errorAfter?: number;
  /** Write each event in two pieces (the first ends mid-line), to exercise the parser. */
  splitWrites?: boolean;
  /** Use \r\n line ends. */
  crlf?: boolean;
  /** Report this completion_tokens in usage (default: tokens). */
  usageTokens?: number;
  /** Response headers (e.g. x-ctxbank-route). */
  headers?: Record<string, string>;
  /** A `ctxbank` field for the usage chunk (ctxbank's extension: session, prefill, timings). */
  ctxbank?: Record<string, unknown>;
}

export interface FakeServer {
  url: string;
  /** Bodies received, parsed. */
  received: any[];
  /** Their request headers (lower-case names), in the same order. */
  receivedHeaders: http.IncomingHttpHeaders[];
  /** Most requests open at once (request received → response closed) since the last reset. */
  maxInFlight(): number;
  resetInFlight(): void;
  close(): Promise<void>;
}

export async function startFakeServer(
  script: (body: any, n: number, headers: http.IncomingHttpHeaders) => FakeScript,
): Promise<FakeServer> {
  const received: any[] = [];
  const receivedHeaders: http.IncomingHttpHeaders[] = [];
  let open = 0;
  let most = 0;
  const server = http.createServer((req, res) => {
    open++;
    most = Math.max(most, open);
    res.once("close", () => open--);
    let raw = "";
    req.setEncoding("utf8");
    req.on("data", (d: string) => (raw += d));
    req.on("end", () => {
      const body = JSON.parse(raw || "{}");
      received.push(body);
      receivedHeaders.push(req.headers);
      void serve(script(body, received.length - 1, req.headers), body, req.url ?? "", res);
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/v1`,
    received,
    receivedHeaders,
    maxInFlight: () => most,
    resetInFlight: () => (most = open),
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

const wait = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function serve(s: FakeScript, body: any, url: string, res: http.ServerResponse): Promise<void> {
  if (s.status && s.status !== 200) {
    res.writeHead(s.status, { "content-type": "application/json" });
    res.end(JSON.stringify({ error: { message: "scripted", code: s.status === 429 ? "queue_full" : "internal" } }));
    return;
  }
  const chat = url.includes("chat");
  const nl = s.crlf ? "\r\n" : "\n";
  const tokens = s.tokens ?? 4;
  res.writeHead(200, { ...s.headers, "content-type": "text/event-stream", "cache-control": "no-cache" });
  const send = async (data: string) => {
    const ev = `data: ${data}${nl}${nl}`;
    if (s.splitWrites) {
      const cut = Math.max(1, Math.floor(ev.length / 2));
      res.write(ev.slice(0, cut));
      await wait(1);
      res.write(ev.slice(cut));
    } else res.write(ev);
  };
  const chunk = (text: string, finish: string | null) =>
    JSON.stringify(
      chat
        ? { choices: [{ index: 0, delta: { content: text }, finish_reason: finish }] }
        : { choices: [{ index: 0, text, finish_reason: finish }] },
    );
  res.write(`: comment lines are ignored${nl}${nl}`);
  await wait(s.ttftMs ?? 0);
  for (let i = 0; i < tokens; i++) {
    if (i > 0) await wait(s.itlMs ?? 0);
    if (s.errorAfter !== undefined && i === s.errorAfter) {
      await send(JSON.stringify({ error: { message: "scripted failure", code: "internal" } }));
      res.end();
      return;
    }
    await send(chunk(s.text?.(i) ?? `tok${i} `, null));
  }
  await send(chunk("", "length"));
  if (body.stream_options?.include_usage) {
    await send(
      JSON.stringify({
        choices: [],
        usage: { prompt_tokens: 7, completion_tokens: s.usageTokens ?? tokens, total_tokens: 7 + (s.usageTokens ?? tokens) },
        ...(s.ctxbank ? { ctxbank: s.ctxbank } : {}),
      }),
    );
  }
  await send("[DONE]");
  res.end();
}
