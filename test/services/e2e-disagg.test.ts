// Disaggregated equals colocated: `ctxbank prefill` and `ctxbank decode` as separate processes
// against a real PostgreSQL 15, the KV handed over HTTP (one decode), shm (another) and UCX (a
// third, where the UCX addon is built), must give exactly the greedy tokens the engine gives in one
// process — under SCOPE's prompt pool and the OmniKV exp selector too, whose prompt state comes
// with the handle. Then the prefill process is killed
// after it answered and before decode pulled: decode fails fast, or recomputes when asked.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Engine, loadModel, type LoadedModel } from "../../shared/inference/engine/engine.ts";
import type { AttentionPolicy } from "../../shared/inference/engine/native.ts";
import { argmax } from "../../shared/inference/engine/sampler.ts";
import { policyDefaultsFor } from "../../shared/inference/policy/defaults.ts";
import { resolvePolicy, type PolicySpec } from "../../shared/inference/policy/request.ts";
import { generate } from "../../shared/inference/generate.ts";
import type { Handle } from "../../shared/platform/http/wire.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { ChatTemplate } from "../../shared/inference/tokenizer/chat-template.ts";
import { GgufTokenizer } from "../../shared/inference/tokenizer/tokenizer.ts";
import { startPostgres, type TestPostgres } from "../../tools/lib/postgres.ts";
import { startService, tempShardDir, type ServiceProcess } from "../../tools/lib/services.ts";
import { ucxAvailable } from "../../services/handoff/transport/ucx.ts";
import { postJson } from "../harness/http.ts";
import { clusterArgs } from "../harness/serve.ts";

const UCX = ucxAvailable();
if (!UCX) console.warn("[e2e-disagg] the UCX decode is skipped: the UCX transport addon is not built");

let pg: TestPostgres;
let shards: Awaited<ReturnType<typeof tempShardDir>>;
let prefill: ServiceProcess;
let viaHttp: ServiceProcess;
let viaShm: ServiceProcess;
let viaUcx: ServiceProcess | undefined;
let engine: Engine;
let model: LoadedModel;
let tok: GgufTokenizer;
let tmpl: ChatTemplate;

const common = () => clusterArgs({ databaseUrl: pg.url, shardDir: shards.dir, heartbeat: { everyMs: 500, timeoutMs: 3000 } });
// A long prompt spans several 64-token blocks, so several chunks are handed over.
const LONG = "In a quiet village by the sea, the fishermen rose before dawn to mend their nets. ".repeat(4);
const PROMPTS = ["Once upon a time", "The capital of Italy is", LONG, "1, 2, 3, 4,"];

/** Greedy tokens of the engine in one process, the policy set before the prompt. */
async function withPolicy(ids: number[], policy: AttentionPolicy, n: number): Promise<number[]> {
  const seq = engine.createSequence(ids.length + n);
  try {
    seq.setPolicy(policy);
    const out = [argmax(await engine.prefill(seq, ids))];
    while (out.length < n && !tok.isEog(out.at(-1)!)) out.push(argmax((await engine.decode([seq], [out.at(-1)!]))[0]!));
    return out;
  } finally {
    seq.release();
  }
}

async function colocated(ids: number[], maxTokens: number): Promise<number[]> {
  const out: number[] = [];
  for await (const ev of generate(engine, tok, ids, { maxTokens, temperature: 0 })) if (ev.type === "token") out.push(ev.id);
  return out;
}

beforeAll(async () => {
  [pg, shards] = await Promise.all([startPostgres(), tempShardDir()]);
  prefill = await startService("prefill", [...common(), "--block-tokens", "64", "--instance-id", "prefill-a"]);
  [viaHttp, viaShm, viaUcx] = await Promise.all([
    startService("decode", [...common(), "--transport", "http", "--instance-id", "decode-http"]),
    startService("decode", [...common(), "--transport", "shm", "--instance-id", "decode-shm"]),
    UCX ? startService("decode", [...common(), "--transport", "ucx", "--instance-id", "decode-ucx"]) : undefined,
  ]);
  const path = await resolveModel();
  model = await loadModel(path);
  engine = new Engine(model, { threads: 1 });
  tok = GgufTokenizer.fromGguf(path);
  tmpl = ChatTemplate.fromGguf(path, tok);
});

afterAll(async () => {
  const codes = await Promise.all([viaHttp?.stop(), viaShm?.stop(), viaUcx?.stop(), prefill?.stop()]);
  await pg?.stop();
  await shards?.remove();
  expect(codes.slice(0, 3)).toEqual([0, 0, UCX ? 0 : undefined]);
});

describe("prefill and decode in separate processes over PostgreSQL 15", () => {
  it.each([["http", () => viaHttp], ["shm", () => viaShm], ...(UCX ? ([["ucx", () => viaUcx!]] as const) : [])] as const)(
    "over %s: the greedy tokens equal one process's, for several prompts",
    async (transport, decode) => {
      for (const prompt of PROMPTS) {
        const p = await postJson(`${prefill.url}/v1/prefill`, { prompt });
        expect(p.status).toBe(200);
        const handle = p.body as Handle;
        const d = await postJson(`${decode().url}/v1/decode`, { handle, max_tokens: 12, temperature: 0 });
        expect(d.status, JSON.stringify(d.body)).toBe(200);
        expect(d.body.kv).toMatchObject({ transport, chunks: Math.ceil(handle.prompt_tokens / 64), recomputed: false });
        expect(d.body.token_ids, prompt).toEqual(await colocated(handle.prompt_token_ids, 12));
      }
    },
  );

  it("the OpenAI route on a decode process finds the prefill process in the registry", async () => {
    const messages = [{ role: "user" as const, content: "Give me a color." }];
    const res = await postJson(`${viaHttp.url}/v1/chat/completions`, { model: "default", messages, max_tokens: 10, temperature: 0 });
    expect(res.status).toBe(200);
    const ids = await colocated(tok.encode(tmpl.render(messages), { parseSpecial: true }), 10);
    expect(res.body.choices[0].message.content).toBe(tok.decode(ids.filter((id) => !tok.isEog(id))));
  });

  it("SCOPE's prompt pool and the OmniKV exp selector cross processes: one process's greedy tokens, no warning", async () => {
    const n = 12;
    const scope = { kind: "scope", scope: { beta1: 64, beta2: 64, alpha1: 16, alpha2: 8 } } as const;
    const exp = { kind: "omnikv", omnikv: { budget: 16, selector: "exp", window: 16 } } as const;
    const ids = tok.encode(LONG);
    const defaults = policyDefaultsFor(model.fingerprint);
    const resolved = (spec: PolicySpec) =>
      resolvePolicy(spec, { ...(defaults ? { filterLayers: defaults.filterLayers } : {}), promptTokens: ids.length, maxTokens: n });
    const pooled = await withPolicy(ids, resolved(scope), n);
    // The pool changes what the decode attends to: without the prompt state it would differ.
    expect(pooled).not.toEqual(await withPolicy(ids, resolved({ kind: "scope", scope: { beta1: 64, beta2: 64 } }), n));

    const res = await postJson(`${viaShm.url}/v1/completions`, {
      model: "default",
      prompt: LONG,
      max_tokens: n,
      temperature: 0,
      policy: scope,
    });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    expect(res.body.ctxbank.handoff).toEqual({ path: "shard", bytes: expect.any(Number) });
    expect(res.body.choices[0].text).toBe(tok.decode(pooled.filter((id) => !tok.isEog(id))));

    const p = await postJson(`${prefill.url}/v1/prefill`, { prompt: LONG, policy: exp, max_tokens: n });
    expect(p.status, JSON.stringify(p.body)).toBe(200);
    expect((p.body as Handle).prompt_state).toBeDefined();
    const d = await postJson(`${viaHttp.url}/v1/decode`, { handle: p.body, max_tokens: n, temperature: 0 });
    expect(d.status, JSON.stringify(d.body)).toBe(200);
    expect(d.body.ctxbank.handoff).toEqual({ path: "shard", bytes: expect.any(Number) });
    expect(d.body.token_ids).toEqual(await withPolicy(ids, resolved(exp), n));
  });

  it("a prefill killed after answering: decode fails fast with a clear error, or recomputes when asked", async () => {
    const handles: Handle[] = [];
    for (const prompt of ["The sun is a", "Water boils at", "Snow is"])
      handles.push((await postJson(`${prefill.url}/v1/prefill`, { prompt })).body);
    await prefill.kill();

    const t0 = performance.now();
    const failed = await postJson(`${viaHttp.url}/v1/decode`, { handle: handles[0], max_tokens: 8, temperature: 0 });
    const ms = performance.now() - t0;
    expect(failed.status).toBe(502);
    expect(failed.body.error.code).toBe("kv_load_failed");
    expect(failed.body.error.message).toMatch(/cannot read the KV \(unreachable\).*ECONNREFUSED.*on_kv_failure/);
    expect(ms).toBeLessThan(3_000);

    if (viaUcx) {
      const overUcx = await postJson(`${viaUcx.url}/v1/decode`, { handle: handles[2], max_tokens: 8, temperature: 0 });
      expect(overUcx.status).toBe(502);
      expect(overUcx.body.error.message).toMatch(/cannot read the KV \(unreachable\).*UCX/);
    }

    const recomputed = await postJson(`${viaHttp.url}/v1/decode`, {
      handle: handles[1],
      max_tokens: 8,
      temperature: 0,
      on_kv_failure: "recompute",
    });
    expect(recomputed.status).toBe(200);
    expect(recomputed.body.kv).toMatchObject({ transport: "recompute", recomputed: true });
    expect(recomputed.body.kv.error).toMatch(/unreachable/);
    expect(recomputed.body.token_ids).toEqual(await colocated(handles[1]!.prompt_token_ids, 8));

    // Once the registry has declared the silent prefill dead, no prefill instance is left.
    await new Promise((r) => setTimeout(r, 4_000));
    const none = await postJson(`${viaHttp.url}/v1/completions`, { model: "default", prompt: "hi", max_tokens: 2 });
    expect(none.status).toBe(503);
    expect(none.body.error.code).toBe("no_prefill_instance");
  });
});
