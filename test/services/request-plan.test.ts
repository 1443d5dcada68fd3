// One request, planned once: a chat completion's attention policy is resolved once (the prefill's
// plan) and validated by the engine once per sequence that attends with it — in `serve` (one
// sequence, handed over in process), for a disaggregated decode (the prefill's sequence and the
// decode's, the decode taking the policy resolved in the handle), for a session's turn, and for a
// client's own /v1/prefill + /v1/decode (the decode resolves for its own length). Counted by
// wrapping the resolver and the engine's setPolicy.
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { addon } from "../../shared/inference/engine/native.ts";
import type { RunningServices } from "../../services/process.ts";
import { type Serve, startDecodeBeside, startServe } from "../harness/serve.ts";
import { postJson } from "../harness/http.ts";

const resolutions = vi.hoisted(() => ({ count: 0 }));
vi.mock("../../shared/inference/policy/request.ts", async (importOriginal) => {
  const original = await importOriginal<typeof import("../../shared/inference/policy/request.ts")>();
  return {
    ...original,
    resolvePolicy: (...args: Parameters<typeof original.resolvePolicy>) => {
      resolutions.count++;
      return original.resolvePolicy(...args);
    },
  };
});

let serve: Serve;
let decodeOnly: RunningServices;
let validations = 0;

beforeAll(async () => {
  serve = await startServe({ blockTokens: 64 });
  decodeOnly = await startDecodeBeside(serve);
  // Every engine validation is a setPolicy on a sequence (the binding's, over setCompletePolicy).
  const proto = addon().NativeSequence.prototype as { setPolicy(p: unknown): void };
  const setPolicy = proto.setPolicy;
  vi.spyOn(proto, "setPolicy").mockImplementation(function (this: unknown, p: unknown) {
    validations++;
    return setPolicy.call(this, p);
  });
});
afterAll(async () => {
  vi.restoreAllMocks();
  await decodeOnly?.stop();
  await serve?.stop();
});

const messages = [{ role: "user", content: "Name three colours of the sea." }];
const policy = { kind: "omnikv", omnikv: { budget: 8 } };

/** Resolutions and engine validations one call makes. */
async function counted(call: () => Promise<void>): Promise<{ resolutions: number; validations: number }> {
  const before = { resolutions: resolutions.count, validations };
  await call();
  return { resolutions: resolutions.count - before.resolutions, validations: validations - before.validations };
}

async function chat(url: string, headers: Record<string, string> = {}): Promise<void> {
  const res = await postJson(`${url}/v1/chat/completions`, { model: "default", messages, max_tokens: 4, temperature: 0, policy }, headers);
  expect(res.status, JSON.stringify(res.body)).toBe(200);
}

describe("one chat completion", () => {
  it("in serve: one resolution, one validation (the one sequence)", async () => {
    expect(await counted(() => chat(serve.url))).toEqual({ resolutions: 1, validations: 1 });
  });

  it("disaggregated: one resolution (the prefill's plan, carried in the handle), one validation per sequence", async () => {
    expect(await counted(() => chat(decodeOnly.url))).toEqual({ resolutions: 1, validations: 2 });
  });

  it("a session's turn in serve: one resolution, one validation", async () => {
    const res = await postJson(
      `${serve.url}/v1/chat/completions`,
      { model: "default", messages, max_tokens: 4, temperature: 0 },
      { "x-session-id": "counted" },
    );
    expect(res.status).toBe(200);
    expect(await counted(() => chat(serve.url, { "x-session-id": "counted" }))).toEqual({ resolutions: 1, validations: 1 });
  });

  it("a session's turn on a disaggregated decode: one resolution, one validation per sequence", async () => {
    expect(await counted(() => chat(decodeOnly.url, { "x-session-id": "counted-disaggregated" }))).toEqual({
      resolutions: 1,
      validations: 2,
    });
  });

  it("a client's /v1/prefill + /v1/decode: each sequence's policy resolved and validated once", async () => {
    const counts = await counted(async () => {
      const p = await postJson(`${serve.url}/v1/prefill`, { messages, policy });
      expect(p.status).toBe(200);
      const d = await postJson(`${decodeOnly.url}/v1/decode`, { handle: p.body, max_tokens: 4, temperature: 0 });
      expect(d.status, JSON.stringify(d.body)).toBe(200);
    });
    expect(counts).toEqual({ resolutions: 2, validations: 2 });
  });
});
