// Continuous batching in decode: concurrent requests share engine steps (one engine.decode over
// every running sequence) and still get exactly the tokens they get one at a time; a short request
// that joins a long one's batch finishes first.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Handle } from "../../shared/platform/http/wire.ts";
import { parseSse, postJson } from "../harness/http.ts";
import { type Serve, startServe } from "../harness/serve.ts";

let s: Serve;

const LONG_PROMPT = "Once upon a time, in a land far away, there lived";
const PROMPTS = ["Once upon a time", "The best way to cook rice is", "My name is", "Dogs are", "The year 1969 was", "Rain falls when"];

beforeAll(async () => {
  s = await startServe({ maxBatch: 4, maxQueue: 8, maxPrefills: 2 });
});

afterAll(() => s?.stop());

async function run(prompt: string, opts: object): Promise<number[]> {
  const { body: handle } = await postJson(`${s.url}/v1/prefill`, { prompt, ...opts });
  const res = await postJson(`${s.url}/v1/decode`, { handle, ...opts });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  return res.body.token_ids;
}

describe("continuous batching", () => {
  it("concurrent requests get the tokens they get alone, in shared steps", async () => {
    for (const opts of [
      { max_tokens: 14, temperature: 0 },
      { max_tokens: 14, temperature: 0.8, seed: 7 },
    ]) {
      const alone: number[][] = [];
      for (const p of PROMPTS) alone.push(await run(p, opts));
      const before = s.services.decode!.status();
      const together = await Promise.all(PROMPTS.map((p) => run(p, opts)));
      const after = s.services.decode!.status();
      expect(together).toEqual(alone);
      const tokens = after.tokens - before.tokens;
      const steps = after.steps - before.steps;
      expect(after.max_batch_seen).toBeGreaterThan(1);
      expect(after.max_batch_seen).toBeLessThanOrEqual(4);
      expect(steps).toBeLessThan(tokens); // several sequences per step
    }
    // serve computes its prompts in the decode scheduler's steps (chunked prefill).
    expect(s.services.decode!.status().prefill_tokens).toBeGreaterThan(0);
    expect(s.services.decode!.status()).toMatchObject({
      running: 0,
      waiting: 0,
      admitted: 0,
      kv_reserved_bytes: 0,
      live_sequences: 0,
      prefills: 0,
    });
  });

  it("a short request joining a long one's batch finishes first, and neither changes", async () => {
    const prefill = async (prompt: string) => (await postJson(`${s.url}/v1/prefill`, { prompt })).body as Handle;
    const [long, short] = [await prefill(LONG_PROMPT), await prefill("Say yes.")];
    const expectLong = (await run(LONG_PROMPT, { max_tokens: 40, temperature: 0 })).slice();
    const expectShort = await run("Say yes.", { max_tokens: 5, temperature: 0 });
    expect(expectLong).toHaveLength(40); // long enough to still run when the short one is done

    const finished: string[] = [];
    const stream = fetch(`${s.url}/v1/decode`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ handle: long, max_tokens: 40, temperature: 0, stream: true }),
    });
    const longRes = await stream;
    const reader = longRes.body!.getReader();
    let text = "";
    // Wait until the long one is a few tokens in, then start the short one.
    while ((text.match(/event: token/g) ?? []).length < 5) {
      const { value, done } = await reader.read();
      if (done) throw new Error(`the long stream ended early: ${text}`);
      text += new TextDecoder().decode(value);
    }
    const shortDone = postJson(`${s.url}/v1/decode`, { handle: short, max_tokens: 5, temperature: 0 }).then(
      (r) => (finished.push("short"), r),
    );
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += new TextDecoder().decode(value);
    }
    finished.push("long");
    const shortRes = await shortDone;
    expect(finished).toEqual(["short", "long"]);
    expect(shortRes.body.token_ids).toEqual(expectShort);
    const done = parseSse(text).find((e) => e.event === "done")!;
    expect(JSON.parse(done.data).token_ids).toEqual(expectLong);
  });
});
