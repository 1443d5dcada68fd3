// Request accounting: one row per generation request with the timestamps TTFT/TPOT come from.
import { and, eq, inArray, isNull } from "drizzle-orm";
import { z } from "zod";
import type { Clock } from "./clock.ts";
import type { Database } from "./db.ts";
import { RegistryError, int32, identifier, parseInput } from "./errors.ts";
import { requests, type RequestRow } from "./schema.ts";

const CreateRequestInput = z.object({
  id: identifier,
  sessionId: identifier.nullish(),
  roundId: int32.nullish(),
  promptTokens: int32.nullish(),
  arrivalAt: z.date().optional(),
  /** The prefill instance that created the row: if it dies before the handle is taken, the sweep ends the row. */
  prefillInstanceId: identifier.nullish(),
});

/** Milestones in a request's life; each sets its timestamp once and moves the state forward. */
const MILESTONES = {
  prefill_start: { column: "prefillStartAt", state: "prefilling" },
  prefill_end: { column: "prefillEndAt", state: "decoding" },
  first_token: { column: "firstTokenAt", state: "decoding" },
  last_token: { column: "lastTokenAt", state: "decoding" },
} as const;
export type RequestMilestone = keyof typeof MILESTONES;

const MilestoneInput = z.object({
  event: z.enum(Object.keys(MILESTONES) as [RequestMilestone, ...RequestMilestone[]]),
  at: z.date().optional(),
  outputTokens: int32.optional(),
});

const FinishInput = z.object({
  state: z.enum(["done", "failed", "cancelled"]),
  error: z.string().max(4000).nullish(),
  outputTokens: int32.optional(),
});

const OPEN = ["queued", "prefilling", "decoding"] as const;

export class RequestStore {
  constructor(
    private readonly db: Database,
    private readonly clock: Clock,
  ) {}

  async create(input: z.input<typeof CreateRequestInput>): Promise<RequestRow> {
    const { arrivalAt = this.clock(), ...rest } = parseInput(CreateRequestInput, input, "request");
    const [row] = await this.db
      .insert(requests)
      .values({ ...rest, arrivalAt, state: "queued" })
      .onConflictDoNothing()
      .returning();
    if (!row) throw new RegistryError("conflict", `request ${rest.id} already exists`);
    return row;
  }

  /** Records a milestone of an open request; `outputTokens` updates the running count. */
  async mark(id: string, input: z.input<typeof MilestoneInput>): Promise<RequestRow> {
    parseInput(identifier, id, "request id");
    const { event, at = this.clock(), outputTokens } = parseInput(MilestoneInput, input, "milestone");
    const { column, state } = MILESTONES[event];
    const [row] = await this.db
      .update(requests)
      .set({ [column]: at, state, ...(outputTokens === undefined ? {} : { outputTokens }) })
      .where(and(eq(requests.id, id), inArray(requests.state, OPEN)))
      .returning();
    if (row) return row;
    throw await this.notOpen(id, event);
  }

  async finish(id: string, input: z.input<typeof FinishInput>): Promise<RequestRow> {
    parseInput(identifier, id, "request id");
    const { state, error, outputTokens } = parseInput(FinishInput, input, "request outcome");
    const [row] = await this.db
      .update(requests)
      .set({ state, error: error ?? null, endedAt: this.clock(), ...(outputTokens === undefined ? {} : { outputTokens }) })
      .where(and(eq(requests.id, id), inArray(requests.state, OPEN)))
      .returning();
    if (row) return row;
    throw await this.notOpen(id, `finish as ${state}`);
  }

  /**
   * Takes a request for a decode: only one decode may consume a request, so this succeeds once,
   * on an open request nobody decoded yet. False means taken, ended or unknown (see get()).
   */
  async claimDecode(id: string, decodeInstanceId: string): Promise<boolean> {
    parseInput(identifier, decodeInstanceId, "decode instance id");
    const rows = await this.db
      .update(requests)
      .set({ firstTokenAt: this.clock(), state: "decoding", decodeInstanceId })
      .where(and(eq(requests.id, id), isNull(requests.firstTokenAt), inArray(requests.state, OPEN)))
      .returning({ id: requests.id });
    return rows.length > 0;
  }

  /**
   * Records the decode on a request it started itself (no handoff to claim), so the sweep knows
   * whom it belongs to. False when the request is no longer open.
   */
  async recordDecoder(id: string, decodeInstanceId: string): Promise<boolean> {
    parseInput(identifier, decodeInstanceId, "decode instance id");
    const rows = await this.db
      .update(requests)
      .set({ firstTokenAt: this.clock(), decodeInstanceId })
      .where(and(eq(requests.id, id), inArray(requests.state, OPEN)))
      .returning({ id: requests.id });
    return rows.length > 0;
  }

  async get(id: string): Promise<RequestRow | undefined> {
    const [row] = await this.db.select().from(requests).where(eq(requests.id, id));
    return row;
  }

  private async notOpen(id: string, what: string): Promise<RegistryError> {
    const row = await this.get(id);
    return row
      ? new RegistryError("wrong_state", `cannot record ${what} for request ${id}: it is already ${row.state}`)
      : new RegistryError("not_found", `request ${id} does not exist`);
  }
}
