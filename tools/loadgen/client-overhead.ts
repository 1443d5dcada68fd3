// npx tsx tools/loadgen/client-overhead.ts [requests] [tokens]
//
// What the client costs the machine it shares with the server: CPU time of this process per
// streamed chunk and per request, for our undici + SSE parser client and for the official
// `openai` SDK's streaming iterator, against the scripted fake server in a child process (so its
// CPU is not counted) sending chunks as fast as it can. Prints a JSON line.
import { fork } from "node:child_process";
import OpenAI from "openai";
import { StreamingClient } from "./client.ts";

if (process.argv[2] === "--serve") {
  const { startFakeServer } = await import("./fake-server.ts");
  const tokens = Number(process.argv[3]);
  const s = await startFakeServer(() => ({ tokens, ttftMs: 0, itlMs: 0 }));
  process.send!(s.url);
} else {
  const requests = Number(process.argv[2] ?? 200);
  const tokens = Number(process.argv[3] ?? 128);
  const child = fork(new URL(import.meta.url).pathname, ["--serve", String(tokens)], { execArgv: ["--import", "tsx"] });
  const url = await new Promise<string>((r) => child.once("message", (m) => r(String(m))));
  const concurrency = 4;
  const measure = async (name: string, one: () => Promise<number>) => {
    for (let i = 0; i < 20; i++) await one(); // warm up (JIT, connections)
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    let chunks = 0;
    let next = 0;
    await Promise.all(
      Array.from({ length: concurrency }, async () => {
        while (next++ < requests) {
          const n = await one(); // not `chunks += await one()`: that reads chunks before awaiting
          chunks += n;
        }
      }),
    );
    const cpu = process.cpuUsage(c0);
    const cpuMs = (cpu.user + cpu.system) / 1000;
    return {
      client: name,
      requests,
      chunks,
      wallMs: performance.now() - t0,
      cpuMs,
      cpuUsPerChunk: (1000 * cpuMs) / chunks,
      cpuMsPerRequest: cpuMs / requests,
    };
  };
  const ours = new StreamingClient({ baseUrl: url, model: "m", timeoutMs: 30_000 });
  const sdk = new OpenAI({ baseURL: url, apiKey: "unused", maxRetries: 0 });
  const results = [
    await measure(
      "undici + SseParser (tools/loadgen/client.ts)",
      async () =>
        (
          await ours.send({
            endpoint: "chat",
            body: { messages: [{ role: "user", content: "x" }], max_tokens: tokens },
            promptTokensSent: 1,
          })
        ).tokenChunks,
    ),
    await measure("openai SDK 6 stream", async () => {
      let n = 0;
      const stream = await sdk.chat.completions.create({
        model: "m",
        messages: [{ role: "user", content: "x" }],
        max_tokens: tokens,
        stream: true,
        stream_options: { include_usage: true },
      });
      for await (const chunk of stream) {
        const t = performance.now(); // what a timing client does per chunk
        if (chunk.choices[0]?.delta?.content) n += t > 0 ? 1 : 0;
      }
      return n;
    }),
  ];
  await ours.close();
  child.kill();
  process.stdout.write(JSON.stringify({ tokensPerRequest: tokens, concurrency, results }, null, 1) + "\n");
}
