// Conversations that come back, in `serve` with two API keys: a chat's next turn named by the same
// session (x-session-id or session_id) reuses the KV of everything before it and computes only its
// new tokens, with the same greedy answer as computing the whole prompt; GET and DELETE
// /v1/sessions/{id}; another key can neither see, reuse nor delete it; and the OpenAI Responses
// API chains turns by previous_response_id with the official client, each reusing the stored KV.
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { newApiKey } from "../../shared/platform/auth/api-keys.ts";
import { getJson } from "../../tools/lib/services.ts";
import { scrape } from "../harness/prom.ts";
import { postJson } from "../harness/http.ts";
import { type ServeProcess, startServeProcess } from "../harness/serve.ts";
import { chainThreeResponses } from "../harness/responses.ts";

const alice = newApiKey("alice", { rate: 0, concurrency: 0 });
const bob = newApiKey("bob", { rate: 0, concurrency: 0 });
const as = (k: { key: string }) => ({ authorization: `Bearer ${k.key}` });

let svc: ServeProcess;

beforeAll(async () => {
  svc = await startServeProcess(["--threads", "2"], { CTXBANK_API_KEYS: [alice.line, bob.line].join("\n") });
}, 180_000);
afterAll(() => svc?.stop());

interface Answer {
  text: string;
  ctxbank: { session?: { id: string; reused_tokens: number; turns: number }; prefill?: { where: string; cause: string; reason: string } };
  usage: { prompt_tokens: number };
}

type Message = { role: "user" | "assistant" | "system"; content: string };
async function chat(key: { key: string }, messages: Message[], session?: string): Promise<Answer> {
  const r = await postJson(
    `${svc.url}/v1/chat/completions`,
    { model: "default", messages, max_tokens: 24, temperature: 0 },
    { ...as(key), ...(session ? { "x-session-id": session } : {}) },
  );
  expect(r.status, JSON.stringify(r.body)).toBe(200);
  return { text: r.body.choices[0].message.content, ctxbank: r.body.ctxbank, usage: r.body.usage };
}

describe("sessions", () => {
  it("each turn reuses the KV of the turns before it and answers as computing the whole prompt would", async () => {
    const conv: Message[] = [{ role: "user", content: "Name three things you find at the seaside." }];
    const first = await chat(alice, conv, "trip");
    expect(first.ctxbank.session).toMatchObject({ id: "trip", reused_tokens: 0, turns: 1 });
    let answer = first.text;
    for (const [i, q] of ["And three things in a forest?", "Which of them is the tallest?", "Say it in one word."].entries()) {
      conv.push({ role: "assistant", content: answer }, { role: "user", content: q });
      const turn = await chat(alice, conv, "trip");
      const whole = await chat(alice, conv); // no session: the whole prompt computed
      expect(turn.text).toBe(whole.text);
      expect(turn.ctxbank.session!.turns).toBe(i + 2);
      // Everything but the new user message (and the template around it) came from the session.
      expect(turn.ctxbank.session!.reused_tokens).toBeGreaterThan(turn.usage.prompt_tokens - 30);
      expect(turn.ctxbank.session!.reused_tokens).toBeLessThan(turn.usage.prompt_tokens);
      expect(turn.ctxbank.prefill).toMatchObject({ where: "local" });
      answer = turn.text;
    }
    const got = await getJson(`${svc.url}/v1/sessions/trip`, as(alice));
    expect(got.status).toBe(200);
    expect(got.body).toMatchObject({ id: "trip", object: "session", tier: "memory", turns: 4 });
    expect(got.body.round_starts.length).toBeGreaterThanOrEqual(4);
  }, 300_000);

  it("the metrics count every reused token, each turn's placement and the sessions kept", async () => {
    const before = await scrape(svc.url);
    const conv: Message[] = [{ role: "user", content: "Name a river." }];
    const first = await chat(alice, conv, "metered");
    conv.push({ role: "assistant", content: first.text }, { role: "user", content: "How long is it?" });
    const second = await chat(alice, conv, "metered");
    const after = await scrape(svc.url);
    const delta = (name: string, match?: Record<string, string>) => after.sum(name, match) - before.sum(name, match);
    expect(delta("ctxbank:session_reused_tokens_total")).toBe(second.ctxbank.session!.reused_tokens);
    expect(delta("ctxbank:prefill_placements_total", { where: "in_process", cause: "colocated" })).toBe(1);
    expect(delta("ctxbank:prefill_placements_total", { where: "local", cause: "session" })).toBe(1);
    expect(delta("ctxbank:session_events_total", { event: "resumed" })).toBe(1);
    expect(after.get("ctxbank:sessions", { tier: "memory" })).toBeGreaterThanOrEqual(1);
    expect(second.ctxbank.prefill).toMatchObject({ where: "local", cause: "session" });
  }, 300_000);

  it("another key cannot see, reuse or delete a session; DELETE ends it and the next turn computes everything", async () => {
    const conv: Message[] = [{ role: "user", content: "What is the capital of France?" }];
    const first = await chat(alice, conv, "shared-name");
    conv.push({ role: "assistant", content: first.text }, { role: "user", content: "And of Italy?" });
    expect((await getJson(`${svc.url}/v1/sessions/shared-name`, as(bob))).status).toBe(404);
    expect((await chat(bob, conv, "shared-name")).ctxbank.session!.reused_tokens).toBe(0); // bob's own, new session
    const del = await fetch(`${svc.url}/v1/sessions/shared-name`, { method: "DELETE", headers: as(bob) });
    expect(del.status).toBe(200); // bob's session (made just now) ends; alice's stays
    expect((await getJson(`${svc.url}/v1/sessions/shared-name`, as(alice))).status).toBe(200);
    const ended = await fetch(`${svc.url}/v1/sessions/shared-name`, { method: "DELETE", headers: as(alice) });
    expect(ended.status).toBe(200);
    expect((await getJson(`${svc.url}/v1/sessions/shared-name`, as(alice))).status).toBe(404);
    expect((await chat(alice, conv, "shared-name")).ctxbank.session!.reused_tokens).toBe(0);
    expect((await fetch(`${svc.url}/v1/sessions/nope`, { method: "DELETE", headers: as(alice) })).status).toBe(404);
    expect(
      (
        await postJson(
          `${svc.url}/v1/chat/completions`,
          { model: "default", messages: conv, max_tokens: 2 },
          { ...as(alice), "x-session-id": "bad id!" },
        )
      ).status,
    ).toBe(400);
  }, 300_000);

  it("the Responses API chains turns with the official client, each reusing the stored KV", async () => {
    const client = new OpenAI({ baseURL: `${svc.url}/v1`, apiKey: alice.key });
    const [r1, r2, r3] = await chainThreeResponses(client);
    expect(r1.output_text.length).toBeGreaterThan(0);
    expect(r1.usage?.input_tokens_details.cached_tokens).toBe(0);
    for (const r of [r2, r3]) {
      expect(r.usage!.input_tokens_details.cached_tokens).toBeGreaterThan(0);
      expect(r.usage!.input_tokens_details.cached_tokens).toBeLessThan(r.usage!.input_tokens);
    }
    // The same conversation as one chat, computed whole: the same answer.
    const whole = await chat(alice, [
      { role: "user", content: "Name a large animal." },
      { role: "assistant", content: r1.output_text },
      { role: "user", content: "Where does it live?" },
      { role: "assistant", content: r2.output_text },
      { role: "user", content: "What does it eat?" },
    ]);
    expect(r3.output_text).toBe(whole.text.slice(0, r3.output_text.length));
    expect((await client.responses.retrieve(r2.id)).output_text).toBe(r2.output_text);
    // Another key's response is unknown to bob.
    const bobClient = new OpenAI({ baseURL: `${svc.url}/v1`, apiKey: bob.key });
    await expect(bobClient.responses.create({ model: "default", input: "Hi", previous_response_id: r2.id })).rejects.toMatchObject({
      status: 404,
    });
    await client.responses.delete(r3.id);
    await expect(client.responses.retrieve(r3.id)).rejects.toMatchObject({ status: 404 });
  }, 300_000);
});
