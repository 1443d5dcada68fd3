// The router in front of a deployment on loopback: PostgreSQL 15, two prefill and two decode
// processes, and `ctxbank router`. A conversation's turns go to the decode holding its session and
// reuse its stored KV; when that decode is killed the next turn is recomputed on the other (no
// error) and the turns after reuse again there; a session pushed to the disk tier comes back with
// the same greedy answer as computing the whole prompt; after DELETE a turn is recomputed. Another
// key can neither see, continue nor delete it. A conversation sent without its session id is found
// by its messages. The official client chains Responses through the router.
import OpenAI from "openai";
import { mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { newApiKey } from "../../shared/platform/auth/api-keys.ts";
import { startPostgres, type TestPostgres } from "../../tools/lib/postgres.ts";
import { getJson, startService, tempShardDir, until, type ServiceProcess } from "../../tools/lib/services.ts";
import { clusterArgs } from "../harness/serve.ts";
import { chainThreeResponses } from "../harness/responses.ts";

const alice = newApiKey("alice", { rate: 0, concurrency: 0 });
const bob = newApiKey("bob", { rate: 0, concurrency: 0 });
// Two requests in flight for the whole deployment.
const carol = newApiKey("carol", { rate: 0, concurrency: 2 });
const as = (k: { key: string }) => ({ authorization: `Bearer ${k.key}` });

let pg: TestPostgres;
let shards: Awaited<ReturnType<typeof tempShardDir>>;
let sessionDirs: string[];
const prefills: ServiceProcess[] = [];
const decodes = new Map<string, ServiceProcess>();
let router: ServiceProcess;

// 16 MiB of session memory per decode: ~700 tokens of this model's KV (23 KiB a token), so the
// conversation (a few hundred tokens) fits, and a 500-token prompt beside it pushes it to disk.
const SESSION_BYTES = 16 << 20;

beforeAll(async () => {
  [pg, shards] = await Promise.all([startPostgres(), tempShardDir()]);
  sessionDirs = await Promise.all([0, 1].map(() => mkdtemp(path.join(tmpdir(), "ctxbank-sessions-"))));
  const env = { CTXBANK_API_KEYS: [alice.line, bob.line, carol.line].join("\n") };
  const common = clusterArgs({ databaseUrl: pg.url, shardDir: shards.dir, heartbeat: { everyMs: 300, timeoutMs: 2000 } });
  prefills.push(
    ...(await Promise.all(["prefill-a", "prefill-b"].map((id) => startService("prefill", [...common, "--instance-id", id], env)))),
  );
  const ds = await Promise.all(
    ["decode-1", "decode-2"].map((id, i) =>
      startService(
        "decode",
        [...common, "--instance-id", id, "--session-bytes", String(SESSION_BYTES), "--session-dir", sessionDirs[i]!],
        env,
      ),
    ),
  );
  decodes.set("decode-1", ds[0]!).set("decode-2", ds[1]!);
  router = await startService(
    "router",
    ["--database-url", pg.url, "--heartbeat-ms", "300", "--heartbeat-timeout-ms", "2000", "--router-poll-ms", "200"],
    env,
  );
  await until("the router sees both decodes", async () => (await getJson(`${router.url}/ready`)).body.decodes === 2, 10_000);
}, 240_000);

afterAll(async () => {
  await router?.stop();
  await Promise.all([...decodes.values(), ...prefills].map((p) => p.stop()));
  await pg?.stop();
  await shards?.remove();
  await Promise.all((sessionDirs ?? []).map((d) => rm(d, { recursive: true, force: true })));
});

type Message = { role: "user" | "assistant" | "system"; content: string };
interface Answer {
  text: string;
  route: { decode: string; reason: string };
  session?: { id: string; reused_tokens: number; turns: number };
  promptTokens: number;
}

async function chat(url: string, key: { key: string }, messages: Message[], session?: string): Promise<Answer> {
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", ...as(key), ...(session ? { "x-session-id": session } : {}) },
    body: JSON.stringify({ model: "default", messages, max_tokens: 16, temperature: 0 }),
  });
  const body = (await res.json()) as any;
  expect(res.status, JSON.stringify(body)).toBe(200);
  const [decode, reason] = (res.headers.get("x-ctxbank-route") ?? "; reason=none").split("; reason=");
  return {
    text: body.choices[0].message.content,
    route: { decode: decode!, reason: reason! },
    session: body.ctxbank.session,
    promptTokens: body.usage.prompt_tokens,
  };
}

/** The greedy answer computed from the whole prompt: an unnamed request straight to a decode (no session, no router). */
async function whole(messages: Message[]): Promise<string> {
  return (await chat([...decodes.values()].find((d) => d.child.exitCode === null && d.child.signalCode === null)!.url, alice, messages))
    .text;
}

const QUESTIONS = [
  "Name a fruit that is yellow.",
  "What colour is its inside?",
  "Is it sweet?",
  "Name another yellow fruit.",
  "Which of the two is bigger?",
  "Say goodbye.",
  "One more word?",
  "Thanks.",
];

describe("the router sends each turn where its KV is", () => {
  const conv: Message[] = [];
  let holder = "";
  const turn = async (q: string, session = "fruit") => {
    conv.push({ role: "user", content: q });
    const a = await chat(router.url, alice, conv, session);
    conv.push({ role: "assistant", content: a.text });
    return a;
  };

  it("a conversation's turns go to the decode holding its session and reuse everything before them", async () => {
    const first = await turn(QUESTIONS[0]!);
    expect(first.route.reason).toBe("load");
    expect(first.session).toMatchObject({ id: "fruit", reused_tokens: 0, turns: 1 });
    holder = first.route.decode;
    let previousPrompt = first.promptTokens;
    for (const q of QUESTIONS.slice(1, 3)) {
      const a = await turn(q);
      expect(a.route).toEqual({ decode: holder, reason: "session" });
      // The previous prompt and its answer came from the session; only the new turn was computed.
      expect(a.session!.reused_tokens).toBeGreaterThan(previousPrompt);
      expect(a.session!.reused_tokens).toBeLessThan(a.promptTokens);
      previousPrompt = a.promptTokens;
    }
    const got = await getJson(`${router.url}/v1/sessions/fruit`, as(alice));
    expect(got.status).toBe(200);
    expect(got.body).toMatchObject({ id: "fruit", turns: 3, tier: "memory" });
  });

  it("another key can neither see, continue nor delete it", async () => {
    expect((await getJson(`${router.url}/v1/sessions/fruit`, as(bob))).status).toBe(404);
    const del = await fetch(`${router.url}/v1/sessions/fruit`, { method: "DELETE", headers: as(bob) });
    expect(del.status).toBe(404);
    // Bob naming alice's session id starts a session of his own: nothing of hers is reused.
    const his = await chat(router.url, bob, [...conv, { role: "user", content: "And now?" }], "fruit");
    expect(his.session).toMatchObject({ reused_tokens: 0, turns: 1 });
    expect((await getJson(`${router.url}/v1/sessions/fruit`, as(alice))).body).toMatchObject({ turns: 3 });
  });

  it("the same conversation sent without its session id is found by its messages and continues it", async () => {
    conv.push({ role: "user", content: QUESTIONS[3]! });
    const res = await fetch(`${router.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", ...as(alice) },
      body: JSON.stringify({ model: "default", messages: conv, max_tokens: 16, temperature: 0 }),
    });
    const body = (await res.json()) as any;
    expect(res.status, JSON.stringify(body)).toBe(200);
    expect(res.headers.get("x-ctxbank-route")).toBe(`${holder}; reason=prefix`);
    expect(body.ctxbank.session).toMatchObject({ id: "fruit", turns: 4 });
    expect(body.ctxbank.session.reused_tokens).toBeGreaterThan(body.usage.prompt_tokens - 30);
    conv.push({ role: "assistant", content: body.choices[0].message.content });
  });

  it("when the holder is killed, the next turn is recomputed on the other decode without an error, and the turns after reuse it there", async () => {
    await decodes.get(holder)!.kill();
    const other = holder === "decode-1" ? "decode-2" : "decode-1";
    const recomputed = await turn(QUESTIONS[4]!);
    expect(recomputed.route).toEqual({ decode: other, reason: "holder_gone" });
    expect(recomputed.session).toMatchObject({ id: "fruit", reused_tokens: 0, turns: 1 });
    holder = other;
    const next = await turn(QUESTIONS[5]!);
    expect(next.route).toEqual({ decode: holder, reason: "session" });
    expect(next.session!.reused_tokens).toBeGreaterThan(recomputed.promptTokens);
    const metrics = await (await fetch(`${router.url}/metrics`)).text();
    expect(metrics).toMatch(/ctxbank:router_retries_total\{kind="connect"\} [1-9]/);
    expect(metrics).toMatch(/ctxbank:router_requests_total\{reason="holder_gone"\} [1-9]/);
  });

  it("a session pushed to the disk tier comes back: the same greedy answer as computing the whole prompt", async () => {
    // Another conversation on the holder, long enough that this one's KV moves to disk to make room.
    const long = "Here is a long note about gardens and what grows in them through the seasons. ".repeat(30);
    const other = await chat(decodes.get(holder)!.url, alice, [{ role: "user", content: long }], "other");
    expect(other.promptTokens).toBeGreaterThan(400);
    const stored = await getJson(`${router.url}/v1/sessions/fruit`, as(alice));
    expect(stored.body).toMatchObject({ tier: "disk" });
    expect((await readdir(sessionDirs[holder === "decode-1" ? 0 : 1]!)).length).toBeGreaterThan(0);
    const a = await turn(QUESTIONS[6]!);
    expect(a.route).toEqual({ decode: holder, reason: "session" });
    expect(a.session!.reused_tokens).toBeGreaterThan(a.promptTokens - 30);
    expect(a.text).toBe(await whole(conv.slice(0, -1)));
  });

  it("after DELETE the next turn is recomputed", async () => {
    const del = await fetch(`${router.url}/v1/sessions/fruit`, { method: "DELETE", headers: as(alice) });
    expect(del.status).toBe(200);
    expect((await getJson(`${router.url}/v1/sessions/fruit`, as(alice))).status).toBe(404);
    const a = await turn(QUESTIONS[7]!);
    expect(a.session).toMatchObject({ reused_tokens: 0, turns: 1 });
    expect(a.text).toBe(await whole(conv.slice(0, -1)));
  });

  it("the official client chains three Responses through the router, each turn reusing the stored KV on its holder", async () => {
    const client = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: alice.key, maxRetries: 0 });
    const [r1, r2, r3] = await chainThreeResponses(client);
    expect(r1.usage?.input_tokens_details.cached_tokens).toBe(0);
    for (const [prev, r] of [
      [r1, r2],
      [r2, r3],
    ] as const) {
      expect(r.usage!.input_tokens_details.cached_tokens).toBeGreaterThan(prev.usage!.input_tokens);
    }
    const raw = await client.responses
      .create({ model: "default", input: "Bye.", previous_response_id: r3.id, max_output_tokens: 4, temperature: 0 })
      .asResponse();
    expect(raw.headers.get("x-ctxbank-route")).toMatch(/; reason=session$/);
  });

  it("the router answers for what it knows: keys, unknown routes, readiness", async () => {
    expect((await getJson(`${router.url}/v1/models`)).status).toBe(401);
    expect((await getJson(`${router.url}/v1/models`, as(alice))).status).toBe(200);
    expect((await getJson(`${router.url}/v1/nothing`, as(alice))).status).toBe(404);
    expect((await getJson(`${router.url}/ready`)).body).toMatchObject({ status: "ready", database: "reachable", decodes: 1, routers: 1 });
  });

  it("a key's concurrency holds for the whole deployment: two routers each hold half of it", async () => {
    const second = await startService(
      "router",
      ["--database-url", pg.url, "--heartbeat-ms", "300", "--heartbeat-timeout-ms", "2000", "--router-poll-ms", "200"],
      { CTXBANK_API_KEYS: carol.line },
    );
    try {
      await until(
        "both routers count each other",
        async () => (await getJson(`${router.url}/ready`)).body.routers === 2 && (await getJson(`${second.url}/ready`)).body.routers === 2,
        10_000,
      );
      const long = (url: string) =>
        fetch(`${url}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json", ...as(carol) },
          body: JSON.stringify({
            model: "default",
            messages: [{ role: "user", content: "Count to one hundred." }],
            max_tokens: 200,
            temperature: 0,
            stream: true,
          }),
        });
      const held = await long(router.url); // streaming: in flight until its last byte
      expect(held.status).toBe(200);
      const refused = await long(router.url);
      expect(refused.status).toBe(429);
      expect(((await refused.json()) as any).error.code).toBe("concurrency_limited");
      expect(refused.headers.get("x-ctxbank-route")).toBeNull(); // the router refused it; no decode saw it
      const other = await long(second.url); // the other router's half
      expect(other.status).toBe(200);
      await Promise.all([held.text(), other.text()]);
    } finally {
      await second.stop();
    }
    await until("one router again", async () => (await getJson(`${router.url}/ready`)).body.routers === 1, 10_000);
  });
});
