// Stored answers of the Responses API: a turn's input and output, chained by previous_response_id,
// so the next turn rebuilds the conversation from an id alone. Rows expire; the chain's session
// (sessions.ts) holds the KV.
import { and, eq, lte } from "drizzle-orm";
import { z } from "zod";
import type { Clock } from "./clock.ts";
import type { Database } from "./db.ts";
import { identifier, int32, parseInput } from "./errors.ts";
import { responses, type ResponseRow } from "./schema.ts";

const ResponseInput = z.object({
  id: identifier,
  tenant: z.string().min(1).max(64),
  previousId: identifier.nullable(),
  sessionId: identifier,
  model: z.string().min(1).max(256),
  input: z
    .array(z.object({ role: z.enum(["system", "user", "assistant"]), content: z.string() }))
    .min(1)
    .max(65_536),
  outputText: z.string(),
  inputTokens: int32,
  outputTokens: int32,
  createdAt: z.date(),
  expiresAt: z.date(),
});

/** How far back a chain is followed: a longer one answers as if it started there. */
export const MAX_CHAIN = 1_000;

export class ResponseStore {
  constructor(
    private readonly db: Database,
    private readonly clock: Clock,
  ) {}

  async create(input: z.input<typeof ResponseInput>): Promise<void> {
    await this.db.insert(responses).values(parseInput(ResponseInput, input, "response"));
  }

  /** `tenant`'s live response `id`, or undefined (another key's is answered the same way). */
  async get(id: string, tenant: string): Promise<ResponseRow | undefined> {
    parseInput(identifier, id, "response id");
    const [row] = await this.db
      .select()
      .from(responses)
      .where(and(eq(responses.id, id), eq(responses.tenant, tenant)));
    return row && row.expiresAt > this.clock() ? row : undefined;
  }

  /**
   * The conversation ending with response `id`, oldest turn first; undefined when `id` is not a
   * live response of `tenant`. A link that expired ends the chain there.
   */
  async chain(id: string, tenant: string): Promise<ResponseRow[] | undefined> {
    const last = await this.get(id, tenant);
    if (!last) return undefined;
    const out = [last];
    for (let prev = last.previousId; prev && out.length < MAX_CHAIN; ) {
      const row = await this.get(prev, tenant);
      if (!row) break;
      out.push(row);
      prev = row.previousId;
    }
    return out.reverse();
  }

  async remove(id: string, tenant: string): Promise<boolean> {
    parseInput(identifier, id, "response id");
    return (
      (
        await this.db
          .delete(responses)
          .where(and(eq(responses.id, id), eq(responses.tenant, tenant)))
          .returning({ id: responses.id })
      ).length > 0
    );
  }

  async sweep(): Promise<number> {
    return (await this.db.delete(responses).where(lte(responses.expiresAt, this.clock())).returning({ id: responses.id })).length;
  }
}
