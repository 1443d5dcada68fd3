// Fuzz: 10,000 generated malformed requests (test/harness/fuzz-requests.ts) against every route of
// a running `serve` process, on its public and its internal listener. The server must answer each
// with a status below 500, stay up, keep its event loop responsive (the max delay prom-client's
// monitorEventLoopDelay reports on /metrics stays under 100 ms beyond what the same server shows
// idle on this machine just before: a busy shared box delays every thread, and that is not a
// stall a request caused) and retain no memory: measured after a full garbage collection the
// test asks for (test/harness/gc-on-signal.mjs), the second half of the requests must not grow
// the heap or the resident memory the way a leak would. The registry is a PostgreSQL server, so
// the memory measured is the service's own (an in-process PGlite's heap only grows with the rows
// the valid requests write).
import { fileURLToPath, pathToFileURL } from "node:url";
import { request } from "undici";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { fuzzRequests, type FuzzRequest, type RouteExample } from "../harness/fuzz-requests.ts";
import { InternalAuth } from "../../shared/platform/auth/capability.ts";
import { startPostgres, type TestPostgres } from "../../tools/lib/postgres.ts";
import { TEST_INTERNAL_SECRET } from "../../tools/lib/services.ts";
import { postJson } from "../harness/http.ts";
import { type ServeProcess, startServeProcess } from "../harness/serve.ts";

const REQUESTS = Number(process.env.CTXBANK_FUZZ_REQUESTS ?? 10_000);
/** Unmeasured requests first: JIT, pools, caches and the tokenizer thread's heap settle. */
const WARMUP = 3_000;
const CONCURRENCY = 16;
const SEED = 20261123;

/** One sample of a Prometheus text exposition: the first of that name, or the one with that label. */
function metric(text: string, name: string, label?: string): number {
  const labels = label ? `\\{[^}]*${label}[^}]*\\}` : "(?:\\{[^}]*\\})?";
  const m = new RegExp(`^${name}${labels} ([0-9.e+-]+)$`, "m").exec(text);
  if (!m) throw new Error(`no ${name}${label ? `{${label}}` : ""} on /metrics`);
  return Number(m[1]);
}

/**
 * Resident memory less what the KV pool keeps for reuse: the pool holds the freed KV of the
 * busiest moment so far (bounded by --kv-pool-mib), so a burst of valid prefills in the second
 * half steps the RSS up on purpose. That is held, not leaked.
 */
function rssLessPool(text: string): number {
  return metric(text, "process_resident_memory_bytes") - metric(text, "ctxbank:kv_bytes_in_use", 'tier="pool"');
}

describe("fuzzing every route", () => {
  let svc: ServeProcess;
  let internalUrl: string;
  let db: TestPostgres;

  beforeAll(async () => {
    db = await startPostgres();
    const gcOnSignal = fileURLToPath(new URL("../harness/gc-on-signal.mjs", import.meta.url));
    svc = await startServeProcess(["--max-body-bytes", String(256 << 10)], {
      DATABASE_URL: db.url,
      NODE_OPTIONS: `--expose-gc --import ${pathToFileURL(gcOnSignal).href}`,
    });
    internalUrl = svc.internalUrl;
  }, 180_000);

  afterAll(async () => {
    await svc?.stop();
    await db?.stop();
  });

  async function scrape(): Promise<string> {
    const r = await request(`${svc.url}/metrics`);
    return r.body.text();
  }

  async function routes(): Promise<RouteExample[]> {
    const model = ((await (await fetch(`${svc.url}/v1/models`)).json()) as { data: { id: string }[] }).data[0]!.id;
    const prefill = await postJson(`${svc.url}/v1/prefill`, { prompt: "Hello", max_tokens: 1 });
    expect(prefill.status).toBe(200);
    const handle = prefill.body as Record<string, unknown>;
    return [
      { method: "POST", path: "/v1/chat/completions", body: { model, messages: [{ role: "user", content: "Hi" }], max_tokens: 1 } },
      { method: "POST", path: "/v1/completions", body: { model, prompt: "Hi", max_tokens: 1 } },
      { method: "POST", path: "/v1/prefill", body: { prompt: "Hi", max_tokens: 1, policy: { kind: "omnikv" } } },
      { method: "POST", path: "/v1/decode", body: { handle, max_tokens: 1, stream: false } },
      { method: "POST", path: "/v1/responses", body: { model, input: "Hi", max_output_tokens: 1 } },
      // GET routes are also sent with DELETE (and other methods) by the generator.
      { method: "GET", path: "/v1/responses/{id}" },
      { method: "GET", path: "/v1/sessions/{id}" },
      ...["/v1/models", "/health", "/ready", "/metrics", "/openapi.json", "/docs", "/dashboard", "/"].map(
        (path) => ({ method: "GET", path }) as RouteExample,
      ),
      // The internal listener: capabilities and the shared secret guard all of it.
      { listener: "internal", method: "POST", path: "/v1/prefill", body: { prompt: "Hi", max_tokens: 1 } },
      { listener: "internal", method: "GET", path: "/v1/chunks/{shardId}/{epoch}", query: { offset: "0", length: "4096" } },
      ...["/v1/prefill/status", "/v1/decode/status", "/health", "/ready", "/metrics"].map(
        (path) => ({ listener: "internal", method: "GET", path }) as RouteExample,
      ),
    ];
  }

  it(`answers ${REQUESTS} malformed requests without a 5xx, a crash, a stall or a leak`, async () => {
    const table = await routes();
    // Every documented route is fuzzed: a new route must be added to the table above.
    const documented = Object.keys(((await (await fetch(`${svc.url}/openapi.json`)).json()) as { paths: Record<string, unknown> }).paths);
    const covered = new Set(table.filter((r) => r.listener !== "internal").map((r) => r.path));
    expect(documented.filter((p) => !covered.has(p))).toEqual([]);

    const requests = fuzzRequests(table, WARMUP + REQUESTS, SEED);
    const warm = requests.splice(0, WARMUP);
    const statuses = new Map<number, number>();
    const serverErrors: string[] = [];
    let clientErrors = 0;
    // Half the internal requests carry valid credentials, so their bodies and queries reach the
    // routes' own validation: a prefill capability, or the shared secret (status routes).
    const internal = new InternalAuth(TEST_INTERNAL_SECRET);
    let turn = 0;
    const credentials = (r: FuzzRequest): Record<string, string> => {
      if (r.listener !== "internal" || turn++ % 2 === 0) return r.headers;
      const token =
        r.path.startsWith("/v1/prefill?") || r.path === "/v1/prefill"
          ? internal.sign({ route: "prefill", tenant: "local", exp: Date.now() + 60_000, nonce: InternalAuth.nonce() })
          : TEST_INTERNAL_SECRET;
      return { ...r.headers, authorization: `Bearer ${token}` };
    };
    const send = async (r: FuzzRequest) => {
      try {
        const res = await request(`${r.listener === "internal" ? internalUrl : svc.url}${r.path}`, {
          method: r.method as "GET",
          headers: credentials(r),
          body: r.body,
          headersTimeout: 30_000,
          bodyTimeout: 30_000,
        });
        await res.body.text();
        statuses.set(res.statusCode, (statuses.get(res.statusCode) ?? 0) + 1);
        if (res.statusCode >= 500)
          serverErrors.push(`${res.statusCode} ${r.method} ${r.path.slice(0, 120)} ${(r.body ?? "").slice(0, 200)}`);
      } catch {
        clientErrors++; // e.g. the server closed the connection after an early 413: not a server failure
      }
    };
    const run = async (list: FuzzRequest[]) => {
      let next = 0;
      await Promise.all(
        Array.from({ length: CONCURRENCY }, async () => {
          while (next < list.length) await send(list[next++]!);
        }),
      );
    };

    // Memory after a full collection in the server (SIGUSR2, test/harness/gc-on-signal.mjs), with
    // a moment for the native side (freed sequences, closed sockets) to settle.
    const collected = async () => {
      svc.child.kill("SIGUSR2");
      await new Promise((r) => setTimeout(r, 2000));
      return scrape();
    };

    await run(warm);
    // The machine's own noise: the largest delay the idle server shows over 3 s.
    await scrape();
    await new Promise((r) => setTimeout(r, 3000));
    const before = await collected();
    const idleLag = metric(before, "nodejs_eventloop_lag_max_seconds");
    const rssBefore = rssLessPool(before);

    let maxLag = 0;
    const lagTimer = setInterval(() => {
      void scrape().then(
        (t) => (maxLag = Math.max(maxLag, metric(t, "nodejs_eventloop_lag_max_seconds"))),
        () => {},
      );
    }, 1000);
    // Memory is read after each half: the first half may still fill caches and pools (allocator
    // arenas, connection pools, JIT code); a leak keeps growing through the second half too.
    let mid: string;
    try {
      await run(requests.slice(0, REQUESTS / 2));
      mid = await collected();
      await run(requests.slice(REQUESTS / 2));
    } finally {
      clearInterval(lagTimer);
    }
    const after = await collected();
    maxLag = Math.max(maxLag, metric(mid, "nodejs_eventloop_lag_max_seconds"), metric(after, "nodejs_eventloop_lag_max_seconds"));
    const rssMid = rssLessPool(mid);
    const rssAfter = rssLessPool(after);

    const summary = {
      statuses: Object.fromEntries(statuses),
      clientErrors,
      maxLagMs: Math.round(maxLag * 1000),
      idleLagMs: Math.round(idleLag * 1000),
      rssLessPoolBeforeMiB: rssBefore / 2 ** 20,
      rssLessPoolMidMiB: rssMid / 2 ** 20,
      rssLessPoolAfterMiB: rssAfter / 2 ** 20,
      kvPoolBeforeMiB: metric(before, "ctxbank:kv_bytes_in_use", 'tier="pool"') / 2 ** 20,
      kvPoolAfterMiB: metric(after, "ctxbank:kv_bytes_in_use", 'tier="pool"') / 2 ** 20,
      heapBeforeMiB: metric(before, "nodejs_heap_size_used_bytes") / 2 ** 20,
      heapMidMiB: metric(mid, "nodejs_heap_size_used_bytes") / 2 ** 20,
      heapAfterMiB: metric(after, "nodejs_heap_size_used_bytes") / 2 ** 20,
      externalBeforeMiB: metric(before, "nodejs_external_memory_bytes") / 2 ** 20,
      externalAfterMiB: metric(after, "nodejs_external_memory_bytes") / 2 ** 20,
    };
    console.log("fuzz summary", JSON.stringify(summary));
    expect(serverErrors.slice(0, 20)).toEqual([]);
    expect(svc.child.exitCode).toBeNull();
    expect((await fetch(`${svc.url}/health`)).status).toBe(200);
    expect(clientErrors).toBeLessThan(REQUESTS / 100);
    expect((maxLag - idleLag) * 1000).toBeLessThan(100);
    // After a collection the heap holds what is retained: a leak of 2 KB a request (one request
    // body, an error object with its stack) adds 10 MB over the second half's 5,000 requests.
    const heapMid = metric(mid, "nodejs_heap_size_used_bytes");
    const heapAfter = metric(after, "nodejs_heap_size_used_bytes");
    expect(heapAfter - heapMid).toBeLessThan(10 * 2 ** 20);
    // Resident memory also counts native allocations (KV, sockets, buffers); freed memory the
    // allocator keeps makes it noisier than the heap, hence the wider bound: 8% of the start is
    // ~40 MB, a leak of 8 KB a request.
    expect(rssAfter - rssMid).toBeLessThan(rssBefore * 0.08);
    expect(rssAfter).toBeLessThan(rssBefore * 1.25);
  }, 600_000);

  // What once stalled the event loop for seconds: top_k just under the vocabulary (a sorted
  // window kept with splice), a body of a million nested brackets (JSON.parse), and single words
  // too long for the context (merged whole). Each at its bounds, several at once.
  it("the stall cases: every sampling field at its bounds, deep nesting, the worst words of every script", async () => {
    const model = ((await (await fetch(`${svc.url}/v1/models`)).json()) as { data: { id: string }[] }).data[0]!.id;
    const chat = (extra: Record<string, unknown>, content = "Tell me a story.") => ({
      path: "/v1/chat/completions",
      body: { model, messages: [{ role: "user", content }], max_tokens: 12, ...extra },
    });
    const cases: { path: string; body: unknown; raw?: string; want: number[] }[] = [];
    for (const top_k of [0, 1, 40, 999, 1000])
      for (const top_p of [1, 0.999, 0.5, 1e-9]) cases.push({ ...chat({ temperature: 2, top_k, top_p, seed: top_k }), want: [200] });
    cases.push({
      path: "/v1/completions",
      body: { model, prompt: "Hi", max_tokens: 12, temperature: 10, top_k: 0, top_p: 1 },
      want: [400],
    }); // OpenAI's temperature is at most 2
    cases.push({ path: "/v1/prefill", body: { prompt: "Hi", max_tokens: 12, temperature: 10, top_k: 1000, top_p: 1e-9 }, want: [200] });
    for (const top_k of [1001, 49_151, 1_000_000]) cases.push({ ...chat({ temperature: 1, top_k }), want: [400] });
    // Nesting: 120,000 brackets at the top, and inside a field the schema reads.
    cases.push({ path: "/v1/completions", body: undefined, raw: "[".repeat(120_000) + "]".repeat(120_000), want: [400] });
    cases.push({
      path: "/v1/chat/completions",
      body: undefined,
      raw: `{"model":"${model}","messages":${"[".repeat(100_000)}${"]".repeat(100_000)}}`,
      want: [400],
    });
    // One word per script, as long as the body limit lets it be (256 KiB here).
    const words = ["a", "é", "ж", "ع", "क", "中", "ア", "한", "€", "😀", "1", "\u00a0", "\u200b"];
    for (const w of words) {
      const bytes = Buffer.byteLength(w);
      cases.push({ ...chat({ temperature: 0 }, w.repeat(Math.floor((240 << 10) / bytes))), want: [200, 400] });
    }
    const idle = async () => {
      await new Promise((r) => setTimeout(r, 2000));
      return metric(await scrape(), "nodejs_eventloop_lag_max_seconds");
    };
    const idleLag = await idle();
    let maxLag = 0;
    const lagTimer = setInterval(() => {
      void scrape().then(
        (t) => (maxLag = Math.max(maxLag, metric(t, "nodejs_eventloop_lag_max_seconds"))),
        () => {},
      );
    }, 500);
    const wrong: string[] = [];
    try {
      let next = 0;
      await Promise.all(
        Array.from({ length: 4 }, async () => {
          while (next < cases.length) {
            const c = cases[next++]!;
            const body = c.raw ?? JSON.stringify(c.body);
            const res = await request(`${svc.url}${c.path}`, {
              method: "POST",
              headers: { "content-type": "application/json" },
              body,
              headersTimeout: 120_000,
              bodyTimeout: 120_000,
            });
            const text = await res.body.text();
            if (!c.want.includes(res.statusCode)) wrong.push(`${res.statusCode} ${c.path} ${body.slice(0, 120)}: ${text.slice(0, 200)}`);
          }
        }),
      );
    } finally {
      clearInterval(lagTimer);
    }
    maxLag = Math.max(maxLag, await idle());
    console.log(
      "stall cases",
      JSON.stringify({ cases: cases.length, maxLagMs: Math.round(maxLag * 1000), idleLagMs: Math.round(idleLag * 1000) }),
    );
    expect(wrong).toEqual([]);
    expect((maxLag - idleLag) * 1000).toBeLessThan(100);
  }, 600_000);
});
