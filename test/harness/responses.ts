// A conversation through the OpenAI Responses API as the official client sends it: three turns
// chained by previous_response_id (greedy, 16 output tokens each), for the session tests.
import type OpenAI from "openai";

export async function chainThreeResponses(client: OpenAI) {
  const create = (input: string, previous?: string) =>
    client.responses.create({
      model: "default",
      input,
      ...(previous ? { previous_response_id: previous } : {}),
      max_output_tokens: 16,
      temperature: 0,
    });
  const r1 = await create("Name a large animal.");
  const r2 = await create("Where does it live?", r1.id);
  const r3 = await create("What does it eat?", r2.id);
  return [r1, r2, r3] as const;
}
