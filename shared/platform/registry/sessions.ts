// Where conversations' KV lives between turns (services/sessions/): one row per session naming the
// decode instance that holds it, so the router can send the next turn there, the hashes of its
// token rounds, and the chained hashes of its messages, so a request that starts with the same
// messages finds the instance holding that prefix.
import { and, desc, eq, gt, lte, sql } from "drizzle-orm";
import { z } from "zod";
import type { Clock } from "./clock.ts";
import type { Database } from "./db.ts";
import { identifier, int32, parseInput } from "./errors.ts";
import { sessions, type SessionRow } from "./schema.ts";

const Hex = z.string().regex(/^[0-9a-f]{64}$/);
const SessionInput = z.object({
  id: identifier,
  tenant: z.string().min(1).max(64),
  holderInstanceId: identifier,
  tier: z.enum(["memory", "disk"]),
  tokens: int32,
  bytes: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER),
  roundHashes: z.array(Hex).max(65_536),
  messageHashes: z.array(Hex).max(65_536).default([]),
  turns: int32.min(1),
  createdAt: z.date(),
  lastUsedAt: z.date(),
  expiresAt: z.date(),
});

/** The live session holding the longest run of a request's leading messages, and how many. */
export interface PrefixHolder {
  session: SessionRow;
  messages: number;
}

/** A text[] parameter (drizzle would spread a JS array into a row constructor). */
const toTextArray = (xs: readonly string[]) => sql`${`{${xs.join(",")}}`}::text[]`;

export class SessionRegistry {
  constructor(
    private readonly db: Database,
    private readonly clock: Clock,
  ) {}

  /** Records (or moves) a session: its holder, tier, size and rounds. */
  async upsert(input: z.input<typeof SessionInput>): Promise<void> {
    const row = parseInput(SessionInput, input, "session");
    const { id, ...rest } = row;
    await this.db.insert(sessions).values(row).onConflictDoUpdate({ target: sessions.id, set: rest });
  }

  /** The live session `id` (its namespaced id), or undefined. */
  async get(id: string): Promise<SessionRow | undefined> {
    parseInput(identifier, id, "session id");
    const [row] = await this.db
      .select()
      .from(sessions)
      .where(and(eq(sessions.id, id), gt(sessions.expiresAt, this.clock())));
    return row;
  }

  /** Removes session `id`'s row, only while `holder` holds it (a newer holder's row stays). */
  async remove(id: string, holder: string): Promise<boolean> {
    const gone = await this.db
      .delete(sessions)
      .where(and(eq(sessions.id, id), eq(sessions.holderInstanceId, holder)))
      .returning({ id: sessions.id });
    return gone.length > 0;
  }

  /**
   * Among `tenant`'s live sessions, the one holding the longest prefix of a request's messages,
   * given as their chained hashes (message-hashes.ts: hash i names messages 0..i, so one shared
   * hash means the whole prefix up to it is shared); undefined when none shares the first
   * message. The most recently used wins a tie. The GIN index answers `?|` without a scan.
   * `continued`: only sessions whose whole conversation the request repeats (all but its last
   * answer may differ: a client may have trimmed it), i.e. the request is that session's next turn.
   */
  async longestPrefix(
    tenant: string,
    hashes: readonly string[],
    { continued = false, limit = 100 } = {},
  ): Promise<PrefixHolder | undefined> {
    const wanted = parseInput(z.array(Hex).max(65_536), [...hashes], "message hashes");
    if (wanted.length === 0) return undefined;
    const rows = await this.db
      .select()
      .from(sessions)
      .where(
        and(eq(sessions.tenant, tenant), gt(sessions.expiresAt, this.clock()), sql`${sessions.messageHashes} ?| ${toTextArray(wanted)}`),
      )
      .orderBy(desc(sessions.lastUsedAt))
      .limit(limit);
    const position = new Map(wanted.map((h, i) => [h, i]));
    let best: PrefixHolder | undefined;
    for (const session of rows) {
      // The deepest of the request's hashes this session holds, at the same position.
      let n = 0;
      session.messageHashes.forEach((h, i) => {
        if (position.get(h) === i) n = Math.max(n, i + 1);
      });
      if (continued && n < session.messageHashes.length - 1) continue;
      if (n > 0 && (!best || n > best.messages)) best = { session, messages: n };
    }
    return best;
  }

  /** Deletes the rows past their expiry, and those of `deadHolders`; returns how many. */
  async sweep(deadHolders: readonly string[] = []): Promise<number> {
    let n = (await this.db.delete(sessions).where(lte(sessions.expiresAt, this.clock())).returning({ id: sessions.id })).length;
    for (const holder of deadHolders)
      n += (await this.db.delete(sessions).where(eq(sessions.holderInstanceId, holder)).returning({ id: sessions.id })).length;
    return n;
  }
}
