// Registry tables: which services are alive, which shards they own, and where every KV chunk lives.
// Migrations in ./migrations are generated from this file (`npm run db:generate`); they must stay
// PostgreSQL-15 compatible because production runs on PG 15 while PGlite is PG 18.
import { sql } from "drizzle-orm";
import {
  bigint,
  check,
  foreignKey,
  index,
  integer,
  jsonb,
  pgEnum,
  pgTable,
  primaryKey,
  smallint,
  text,
  timestamp,
  uniqueIndex,
  uuid,
} from "drizzle-orm/pg-core";

const timestamptz = (name: string) => timestamp(name, { withTimezone: true, mode: "date" });

export const instanceRole = pgEnum("instance_role", ["prefill", "decode", "router"]);
export const instanceState = pgEnum("instance_state", ["alive", "draining", "dead"]);
export const shardState = pgEnum("shard_state", ["active", "retired"]);
export const chunkState = pgEnum("chunk_state", ["writing", "ready", "reading", "released", "failed"]);
export const kvDtype = pgEnum("kv_dtype", ["f32", "f16"]);
export const requestState = pgEnum("request_state", ["queued", "prefilling", "decoding", "done", "failed", "cancelled"]);

export const instances = pgTable(
  "instances",
  {
    id: text("id").primaryKey(),
    role: instanceRole("role").notNull(),
    baseUrl: text("base_url").notNull(),
    /** Where clients (and the router) reach a decode's public API; null for prefills and older rows. */
    publicUrl: text("public_url"),
    hostId: text("host_id").notNull(),
    startedAt: timestamptz("started_at").notNull(),
    lastHeartbeatAt: timestamptz("last_heartbeat_at").notNull(),
    state: instanceState("state").notNull().default("alive"),
  },
  (t) => [index("instances_role_state_idx").on(t.role, t.state, t.lastHeartbeatAt)],
);

// One row per incarnation: a shard keeps its id across restarts of its owner, and every
// restart creates the next epoch. Chunks name the epoch they were written in, so a reader
// holding a chunk from an older epoch gets a clear "stale epoch" instead of foreign bytes.
export const shards = pgTable(
  "shards",
  {
    id: text("id").notNull(),
    epoch: integer("epoch").notNull(),
    instanceId: text("instance_id")
      .notNull()
      .references(() => instances.id),
    path: text("path").notNull(),
    // "device:inode" of the file the owner created at `path`: a reader maps only that file (a
    // file planted at the path is refused), and a sweeper deletes only that file.
    fileId: text("file_id"),
    // The owner's UCX endpoint for this epoch (worker address, packed rkeys, mapped range; base64
    // of services/handoff/transport/ucx-endpoint.ts's envelope); null when it does not serve UCX.
    ucxEndpoint: text("ucx_endpoint"),
    sizeBytes: bigint("size_bytes", { mode: "number" }).notNull(),
    state: shardState("state").notNull().default("active"),
    createdAt: timestamptz("created_at").notNull(),
  },
  (t) => [
    primaryKey({ columns: [t.id, t.epoch] }),
    index("shards_instance_idx").on(t.instanceId),
    check("shards_epoch_positive", sql`${t.epoch} > 0`),
    check("shards_size_positive", sql`${t.sizeBytes} > 0`),
  ],
);

// `key` is the deterministic content key (model fingerprint + token prefix + layers). Only one
// live (writing/ready/reading) chunk may hold a key; released/failed rows keep theirs until the
// owner has reclaimed their shard range, so `id` is a surrogate.
export const chunks = pgTable(
  "chunks",
  {
    id: uuid("id").primaryKey().defaultRandom(),
    key: text("key").notNull(),
    requestId: text("request_id").notNull(),
    sessionId: text("session_id"),
    roundId: integer("round_id"),
    layerGroup: integer("layer_group").notNull(),
    layerIds: integer("layer_ids").array().notNull(),
    tokenStart: integer("token_start").notNull(),
    tokenEnd: integer("token_end").notNull(),
    shardId: text("shard_id").notNull(),
    shardEpoch: integer("shard_epoch").notNull(),
    offset: bigint("offset", { mode: "number" }).notNull(),
    length: bigint("length", { mode: "number" }).notNull(),
    dtype: kvDtype("dtype").notNull(),
    layoutVersion: smallint("layout_version").notNull(),
    modelFingerprint: text("model_fingerprint").notNull(),
    checksum: bigint("checksum", { mode: "number" }),
    state: chunkState("state").notNull().default("writing"),
    leaseExpiresAt: timestamptz("lease_expires_at").notNull(),
    readerCount: integer("reader_count").notNull().default(0),
    // Requests holding this chunk (rows in chunk_refs); released when it drops to 0.
    refCount: integer("ref_count").notNull().default(0),
    createdAt: timestamptz("created_at").notNull(),
    updatedAt: timestamptz("updated_at").notNull(),
  },
  (t) => [
    foreignKey({ columns: [t.shardId, t.shardEpoch], foreignColumns: [shards.id, shards.epoch] }).onDelete("cascade"),
    uniqueIndex("chunks_live_key_idx").on(t.key).where(sql`${t.state} in ('writing', 'ready', 'reading')`),
    index("chunks_request_idx").on(t.requestId),
    index("chunks_shard_state_idx").on(t.shardId, t.shardEpoch, t.state),
    check("chunks_token_range", sql`${t.tokenStart} >= 0 and ${t.tokenEnd} > ${t.tokenStart}`),
    check("chunks_range", sql`${t.offset} >= 0 and ${t.length} > 0`),
    check("chunks_fingerprint_hex", sql`${t.modelFingerprint} ~ '^[0-9a-f]{64}$'`),
    check("chunks_ref_count", sql`${t.refCount} >= 0`),
    // Nobody reads or holds a chunk that is only writing/ready: it must have been released.
    check("chunks_held_while_live", sql`${t.state} not in ('writing', 'ready') or ${t.refCount} > 0`),
    // A chunk is "reading" exactly while someone holds a read lease on it.
    check("chunks_readers_match_state", sql`(${t.state} = 'reading') = (${t.readerCount} > 0)`),
  ],
);

export const chunkRefs = pgTable(
  "chunk_refs",
  {
    chunkId: uuid("chunk_id")
      .notNull()
      .references(() => chunks.id, { onDelete: "cascade" }),
    requestId: text("request_id").notNull(),
  },
  (t) => [primaryKey({ columns: [t.chunkId, t.requestId] }), index("chunk_refs_request_idx").on(t.requestId)],
);

export const requests = pgTable(
  "requests",
  {
    id: text("id").primaryKey(),
    sessionId: text("session_id"),
    roundId: integer("round_id"),
    state: requestState("state").notNull().default("queued"),
    arrivalAt: timestamptz("arrival_at").notNull(),
    prefillStartAt: timestamptz("prefill_start_at"),
    prefillEndAt: timestamptz("prefill_end_at"),
    firstTokenAt: timestamptz("first_token_at"),
    lastTokenAt: timestamptz("last_token_at"),
    promptTokens: integer("prompt_tokens"),
    outputTokens: integer("output_tokens").notNull().default(0),
    error: text("error"),
    // The instances working on the request: the prefill that created the row, the decode that
    // claimed it. When one dies the sweep finalises the row (no FK: instance rows are pruned).
    prefillInstanceId: text("prefill_instance_id"),
    decodeInstanceId: text("decode_instance_id"),
    /** When the row reached done/failed/cancelled; rows are pruned a retention after it. */
    endedAt: timestamptz("ended_at"),
  },
  (t) => [
    index("requests_session_idx").on(t.sessionId),
    index("requests_state_idx").on(t.state),
    index("requests_ended_idx").on(t.endedAt),
  ],
);

export const sessionTier = pgEnum("session_tier", ["memory", "disk"]);

/**
 * Conversations whose KV a decode instance keeps between turns (services/sessions/): which instance
 * holds each (the router sends the next turn there), in which tier, and the hash of every round's
 * tokens (a request whose rounds start the same way shares that prefix). The id is the key's
 * namespaced one (`<key id>:<session id>`, like request ids), so keys never see each other's.
 */
export const sessions = pgTable(
  "sessions",
  {
    id: text("id").primaryKey(),
    tenant: text("tenant").notNull(),
    holderInstanceId: text("holder_instance_id").notNull(),
    tier: sessionTier("tier").notNull(),
    tokens: integer("tokens").notNull(),
    bytes: bigint("bytes", { mode: "number" }).notNull(),
    roundHashes: jsonb("round_hashes").$type<string[]>().notNull(),
    /**
     * Chained hashes of the conversation's messages (services/sessions/message-hashes.ts): entry i
     * names messages 0..i, so the router finds the session holding a request's longest message
     * prefix with one indexed `?|` lookup, without a tokenizer.
     */
    messageHashes: jsonb("message_hashes").$type<string[]>().notNull().default(sql`'[]'::jsonb`),
    turns: integer("turns").notNull(),
    createdAt: timestamptz("created_at").notNull(),
    lastUsedAt: timestamptz("last_used_at").notNull(),
    expiresAt: timestamptz("expires_at").notNull(),
  },
  (t) => [
    index("sessions_holder_idx").on(t.holderInstanceId),
    index("sessions_tenant_idx").on(t.tenant),
    index("sessions_expires_idx").on(t.expiresAt),
    index("sessions_message_hashes_idx").using("gin", t.messageHashes),
    check("sessions_sizes", sql`${t.tokens} >= 0 and ${t.bytes} >= 0 and ${t.turns} >= 1`),
  ],
);

/**
 * Stored answers of the Responses API (POST /v1/responses with store): a turn's input messages and
 * its output text, chained by previous_response_id, so a later turn rebuilds the conversation from
 * the id alone; the chain's session holds its KV. Ids are namespaced by key like sessions'.
 */
export const responses = pgTable(
  "responses",
  {
    id: text("id").primaryKey(),
    tenant: text("tenant").notNull(),
    previousId: text("previous_id"),
    sessionId: text("session_id").notNull(),
    model: text("model").notNull(),
    /** This turn's input as chat messages ({ role, content }), the instructions first when given. */
    input: jsonb("input").$type<{ role: string; content: string }[]>().notNull(),
    outputText: text("output_text").notNull(),
    inputTokens: integer("input_tokens").notNull(),
    outputTokens: integer("output_tokens").notNull(),
    createdAt: timestamptz("created_at").notNull(),
    expiresAt: timestamptz("expires_at").notNull(),
  },
  (t) => [index("responses_tenant_idx").on(t.tenant), index("responses_expires_idx").on(t.expiresAt)],
);

export type InstanceRow = typeof instances.$inferSelect;
export type ShardRow = typeof shards.$inferSelect;
export type ChunkRow = typeof chunks.$inferSelect;
export type RequestRow = typeof requests.$inferSelect;
export type SessionRow = typeof sessions.$inferSelect;
export type ResponseRow = typeof responses.$inferSelect;
export type ChunkState = ChunkRow["state"];
