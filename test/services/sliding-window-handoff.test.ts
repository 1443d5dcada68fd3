// A model with sliding-window layers (Gemma 3's shape, tiny and random) through the shard handoff:
// its sliding layers keep rings of rows (native/src/kv_cache.h), so the prefill ships them only
// for the prompt's last window, in a chunk of their own (writer.ts planChunks), the global layers
// in blocks from token 0; the decode reads both, finds every window whole, and answers with the
// tokens of one process.
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Handle } from "../../services/handoff/index.ts";
import { argmax } from "../../shared/inference/engine/sampler.ts";
import { tinyArchModel } from "../harness/arch-models.ts";
import { postJson } from "../harness/http.ts";
import { type Serve, startServe } from "../harness/serve.ts";

const WINDOW = 24;

describe("a model with sliding-window layers through the shard handoff", () => {
  let dir: string;
  let s: Serve;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "ctxbank-sliding-"));
    const model = join(dir, "tiny-gemma3.gguf");
    // Layers 0-4 slide (window 24), layer 5 is global.
    await writeFile(
      model,
      tinyArchModel({ arch: "gemma3", ropeBase: 500, nHeadKv: 1, headDim: 32, nLayer: 6, slidingWindow: WINDOW, nCtx: 4096 }),
    );
    s = await startServe({ model, blockTokens: 128, shardBytes: 64 << 20 });
  });

  afterAll(async () => {
    await s?.stop();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  async function engineGreedy(ids: number[], n: number): Promise<number[]> {
    const { engine } = s.rt;
    const seq = engine.createSequence(ids.length + n);
    const out = [argmax(await engine.prefill(seq, ids))];
    while (out.length < n && !s.rt.tokenizer.isEog(out.at(-1)!)) out.push(argmax((await engine.decode([seq], [out.at(-1)!]))[0]!));
    seq.release();
    return out;
  }

  it("ships the sliding layers' last window only, and decodes as one process does", async () => {
    const { engine, model } = s.rt;
    expect(model.config.slidingLayers).toEqual([0, 1, 2, 3, 4]);
    expect(engine.info.ringRows).toBe(576); // the window and a 512-token micro-batch, in 64-row blocks
    const prompt = "the lighthouse keeper counted ships and boats at dawn; ".repeat(40);
    const res = await postJson(`${s.url}/v1/prefill`, { prompt });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const handle = res.body as Handle;
    const n = handle.prompt_tokens;
    expect(n).toBeGreaterThan(2 * 576); // past the rings, twice
    expect(handle.layer_groups).toEqual([[5], [0, 1, 2, 3, 4]]);
    const rows = await s.rt.registry.chunks.ofRequest(handle.request_id);
    const sliding = rows.filter((r) => r.layerIds.join() === "0,1,2,3,4");
    expect(sliding.map((r) => [r.tokenStart, r.tokenEnd])).toEqual([[n - WINDOW, n]]);
    const global = rows.filter((r) => r.layerIds.join() === "5").sort((a, b) => a.tokenStart - b.tokenStart);
    expect(global).toHaveLength(Math.ceil(n / 128));
    expect(global[0]!.tokenStart).toBe(0);
    expect(global.at(-1)!.tokenEnd).toBe(n);
    expect(handle.chunk_ids).toHaveLength(global.length + 1);

    const out = await postJson(`${s.url}/v1/decode`, { handle, max_tokens: 16, temperature: 0 });
    expect(out.status, JSON.stringify(out.body)).toBe(200);
    expect(out.body.token_ids).toEqual(await engineGreedy(handle.prompt_token_ids, 16));
    // The KV read: every global row, and the sliding layers' window.
    const rowPair = 2 * 32 * 2;
    expect(out.body.ctxbank.handoff.bytes).toBeLessThan((n * 6 * rowPair) / 2);
  });

  it("serves completions in one process (no handoff) with the same tokens", async () => {
    const prompt = "boats and ships at dawn, counted by the keeper; ".repeat(30);
    const res = await postJson(`${s.url}/v1/completions`, { model: "default", prompt, max_tokens: 12, temperature: 0 });
    expect(res.status, JSON.stringify(res.body)).toBe(200);
    const ids = s.rt.tokenizer.encode(prompt, { addSpecial: true });
    expect(res.body.choices[0].text).toBe(s.rt.tokenizer.decode(await engineGreedy(ids, 12)));
  });
});
