// A hostile client at its full quota, in its own process so that its work (megabyte bodies, many
// streams) does not delay the test process's own measurements: `QUOTA` workers send one kind of
// request back to back until the process is killed. Used by test/services/fairness-two-keys.test.ts.
//
//   node --import tsx test/harness/hostile-load.ts <url> <api key> <attack>
import { request } from "undici";

export const ATTACKS = ["long-generations", "long-prompts", "worst-words", "deep-nesting", "huge-top-k"] as const;
export type Attack = (typeof ATTACKS)[number];

const QUOTA = 8; // the default --key-concurrency
export const LONG_PROMPT = "The history of the lighthouse keepers on the northern coast is long and full of storms. ".repeat(80); // ~1,400 tokens
const WORST_WORD = "€".repeat(80_000); // one pre-token word of 240 KB: merged whole (it could fit the context)

function body(attack: Attack): { path: string; body: string } {
  const chat = (content: string, extra: object) => ({
    path: "/v1/chat/completions",
    body: JSON.stringify({ model: "default", messages: [{ role: "user", content }], temperature: 1, top_k: 0, ...extra }),
  });
  switch (attack) {
    case "long-generations":
      return chat("Tell me a long story about the sea.", { max_tokens: 2_000 });
    case "long-prompts":
      return { path: "/v1/completions", body: JSON.stringify({ model: "default", prompt: LONG_PROMPT, max_tokens: 1 }) };
    case "worst-words":
      return chat(WORST_WORD, { max_tokens: 1 });
    case "deep-nesting":
      return { path: "/v1/chat/completions", body: "[".repeat(1_000_000) + "]".repeat(1_000_000) };
    case "huge-top-k":
      return chat("Tell me a story.", { top_k: 49_151, max_tokens: 64 });
  }
}

async function main(): Promise<void> {
  const [url, key, attack] = process.argv.slice(2) as [string, string, Attack];
  if (!url || !key || !ATTACKS.includes(attack)) throw new Error(`usage: hostile-load.ts <url> <key> <${ATTACKS.join("|")}>`);
  const { path, body: text } = body(attack);
  await Promise.all(
    Array.from({ length: QUOTA }, async () => {
      for (;;) {
        try {
          const res = await request(`${url}${path}`, {
            method: "POST",
            headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
            body: text,
            headersTimeout: 300_000,
            bodyTimeout: 300_000,
          });
          await res.body.text();
          if (res.statusCode === 429) await new Promise((r) => setTimeout(r, 100));
        } catch {
          await new Promise((r) => setTimeout(r, 50)); // refused or reset: try again, as an attacker would
        }
      }
    }),
  );
}

if (import.meta.url === `file://${process.argv[1]}`) await main();
