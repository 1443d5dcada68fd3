// Chunk rows: two-phase writes keyed by content, read leases, request release, and reclaiming
// space. Every state change is one UPDATE … WHERE state IN (…) so that concurrent readers, the
// reaper and releases serialise on the row lock instead of racing between a read and a write.
import { and, count, eq, getTableColumns, getTableName, gt, inArray, lte, sql } from "drizzle-orm";
import type { AnyPgColumn } from "drizzle-orm/pg-core";
import { z } from "zod";
import { addMs, type Clock } from "./clock.ts";
import type { Database, Transaction } from "./db.ts";
import { RegistryError, chunkId, chunkIds, int32, identifier, parseInput, positiveMs } from "./errors.ts";
import { chunkRefs, chunks, instances, requests, shards, type ChunkRow } from "./schema.ts";

const LIVE = ["writing", "ready", "reading"] as const;
const hex64 = z.string().regex(/^[0-9a-f]{64}$/, "64 lowercase hex digits");

const BeginChunkInput = z
  .object({
    key: hex64,
    requestId: identifier,
    sessionId: identifier.nullish(),
    roundId: int32.nullish(),
    layerGroup: int32,
    layerIds: z
      .array(z.number().int().min(0).max(65_535))
      .min(1)
      .refine((ids) => ids.every((id, i) => i === 0 || id > ids[i - 1]!), "layer ids must be strictly increasing"),
    tokenStart: int32,
    tokenEnd: int32,
    shardId: identifier,
    shardEpoch: z
      .number()
      .int()
      .min(1)
      .max(2 ** 31 - 1),
    offset: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER),
    length: z.number().int().min(1).max(Number.MAX_SAFE_INTEGER),
    dtype: z.enum(["f16", "f32"]),
    layoutVersion: z.number().int().min(1).max(32_767),
    modelFingerprint: hex64,
    /** How long the writer may take before the reaper may reclaim the chunk; on reuse, how long the live chunk is held at least. */
    writeLeaseMs: positiveMs,
  })
  .refine((c) => c.tokenEnd > c.tokenStart, { message: "tokenEnd must be greater than tokenStart", path: ["tokenEnd"] });
export type BeginChunkInput = z.input<typeof BeginChunkInput>;

const CommitInput = z.object({
  checksum: z.number().int().min(0).max(0xffff_ffff),
  /** How long a ready chunk is kept for readers (and prefix reuse) without an active lease. */
  retainMs: positiveMs,
});

/**
 * `write`: the caller owns the new row and writes the bytes at its offset, then commits.
 * `reuse`: a ready chunk with the same key exists; the caller's request now holds it, and the
 *   caller frees the range it had allocated.
 * `in_progress`: another writer is writing this key right now; wait for it (or its lease).
 */
export type BeginChunkResult =
  | { status: "write"; chunk: ChunkRow }
  | { status: "reuse"; chunk: ChunkRow }
  | { status: "in_progress"; chunk: ChunkRow };

/** Where a leased chunk's bytes are; structurally a transport ChunkLocation. */
export interface LeasedChunk {
  chunk: ChunkRow;
  location: {
    shardId: string;
    epoch: number;
    shardPath: string;
    ownerBaseUrl: string;
    ownerHostId: string;
    /** "device:inode" of the owner's shard file (null for a shard registered before it was recorded). */
    fileId: string | null;
    /** The owner's UCX endpoint for the shard's epoch (base64), null when it serves no UCX. */
    ucxEndpoint: string | null;
    offset: number;
    length: number;
    /** Set by the reader: the capability the owner's chunk route wants. */
    capability?: string | undefined;
  };
}

/** A shard range the owner may now free (its row is gone from the registry). */
export interface FreedRange {
  id: string;
  key: string;
  offset: number;
  length: number;
  state: "released" | "failed";
}

export class ChunkStore {
  constructor(
    private readonly db: Database,
    private readonly clock: Clock,
  ) {}

  /** Phase one of a write: registers the chunk as `writing`, or hands back a live chunk with that key. */
  async begin(input: BeginChunkInput): Promise<BeginChunkResult> {
    const c = parseInput(BeginChunkInput, input, "chunk");
    // A conflicting row may stop being live between our INSERT and SELECT; then simply try again.
    for (let attempt = 0; attempt < 3; attempt++) {
      const result = await this.db.transaction((tx) => this.tryBegin(tx, c));
      if (result) return result;
    }
    throw new RegistryError("conflict", `chunk key ${c.key} keeps changing state; try again`);
  }

  private async tryBegin(tx: Transaction, c: z.output<typeof BeginChunkInput>): Promise<BeginChunkResult | null> {
    // FOR SHARE holds off a concurrent new epoch (ShardStore.create) until this row is in.
    const [shard] = await tx
      .select()
      .from(shards)
      .where(and(eq(shards.id, c.shardId), eq(shards.epoch, c.shardEpoch)))
      .for("share");
    if (!shard) throw new RegistryError("not_found", `shard ${c.shardId} epoch ${c.shardEpoch} does not exist`);
    if (shard.state !== "active") {
      throw new RegistryError("stale_epoch", `shard ${c.shardId} epoch ${c.shardEpoch} is retired`);
    }
    if (c.offset + c.length > shard.sizeBytes) {
      throw new RegistryError(
        "invalid_input",
        `chunk range [${c.offset}, ${c.offset + c.length}) exceeds shard ${c.shardId} size ${shard.sizeBytes}`,
      );
    }
    const now = this.clock();
    const { writeLeaseMs, ...row } = c;
    const [created] = await tx
      .insert(chunks)
      .values({
        ...row,
        state: "writing",
        refCount: 1,
        leaseExpiresAt: addMs(now, writeLeaseMs),
        createdAt: now,
        updatedAt: now,
      })
      .onConflictDoNothing({ target: chunks.key, where: sql`${chunks.state} in ('writing', 'ready', 'reading')` })
      .returning();
    if (created) {
      await tx.insert(chunkRefs).values({ chunkId: created.id, requestId: c.requestId });
      return { status: "write", chunk: created };
    }

    const [live] = await tx
      .select()
      .from(chunks)
      .where(and(eq(chunks.key, c.key), inArray(chunks.state, LIVE)))
      .for("update");
    if (!live) return null;
    if (live.leaseExpiresAt <= now) {
      // Expired but not reaped yet: as good as gone. Release it so the next attempt writes anew.
      await tx.update(chunks).set({ state: "released", readerCount: 0, updatedAt: now }).where(eq(chunks.id, live.id));
      return null;
    }
    if (live.state === "writing") return { status: "in_progress", chunk: live };
    assertSameContent(live, c);
    const [ref] = await tx.insert(chunkRefs).values({ chunkId: live.id, requestId: c.requestId }).onConflictDoNothing().returning();
    const [held] = await tx
      .update(chunks)
      .set({
        refCount: sql`${chunks.refCount} + ${ref ? 1 : 0}`,
        leaseExpiresAt: laterOf(addMs(now, c.writeLeaseMs)),
        updatedAt: now,
      })
      .where(eq(chunks.id, live.id))
      .returning();
    return { status: "reuse", chunk: held! };
  }

  /** Phase two: the bytes are in place; the chunk becomes `ready` and is retained for `retainMs`. */
  async commit(id: string, input: z.input<typeof CommitInput>): Promise<ChunkRow> {
    parseInput(chunkId, id, "chunk id");
    const { checksum, retainMs } = parseInput(CommitInput, input, "commit");
    const now = this.clock();
    const [row] = await this.db
      .update(chunks)
      .set({ state: "ready", checksum, leaseExpiresAt: addMs(now, retainMs), updatedAt: now })
      .where(and(eq(chunks.id, id), eq(chunks.state, "writing")))
      .returning();
    if (row) return row;
    throw await this.wrongState(id, "commit", "writing");
  }

  /**
   * A handle is answered: its chunks are kept `retainMs` from now (a decode has that long to take
   * them), however long ago each was committed. Returns how many of `ids` are still live.
   */
  async retainFromHandle(ids: string[], retainMs: number): Promise<number> {
    parseInput(chunkIds, ids, "chunk ids");
    parseInput(positiveMs, retainMs, "retention");
    const now = this.clock();
    const until = addMs(now, retainMs);
    const rows = await this.db
      .update(chunks)
      .set({ leaseExpiresAt: sql`greatest(${chunks.leaseExpiresAt}, ${until.toISOString()}::timestamptz)`, updatedAt: now })
      .where(and(inArray(chunks.id, ids), inArray(chunks.state, LIVE)))
      .returning({ id: chunks.id });
    return rows.length;
  }

  /** The write failed; the reaper hands the range back to the owner. */
  async fail(id: string): Promise<ChunkRow> {
    parseInput(chunkId, id, "chunk id");
    const [row] = await this.db
      .update(chunks)
      .set({ state: "failed", updatedAt: this.clock() })
      .where(and(eq(chunks.id, id), eq(chunks.state, "writing")))
      .returning();
    if (row) return row;
    throw await this.wrongState(id, "fail", "writing");
  }

  private leaseStatement: ReturnType<ChunkStore["prepareLease"]> | undefined;

  /**
   * The read lease as one prepared statement: one round trip, parsed and planned once per
   * connection (a decode pays it before its first byte moves; the explicit transaction it
   * replaced took four round trips, a third of a 4K-token load on the 2-core box by a temporary
   * trace of bench/handoff). All or none: `locked` locks the chunks that can be leased now (and
   * whose shard epoch and owner are registered), and the update runs only when that is every one
   * of them; a locked row cannot change before the statement ends, so the count cannot go stale.
   * The owner's address comes from the same snapshot as the lock's check of the shard row.
   */
  private prepareLease() {
    const now = sql`${sql.placeholder("now")}::timestamptz`;
    const locked = this.db.$with("locked").as(
      this.db
        .select({ id: chunks.id })
        .from(chunks)
        .where(
          and(
            sql`${chunks.id} = any(${sql.placeholder("ids")}::uuid[])`,
            inArray(chunks.state, ["ready", "reading"]),
            sql`${chunks.leaseExpiresAt} > ${now}`,
            ownerRegistered,
          ),
        )
        .for("update"),
    );
    return this.db
      .with(locked)
      .update(chunks)
      .set({
        state: "reading",
        readerCount: sql`${chunks.readerCount} + 1`,
        leaseExpiresAt: sql`greatest(${chunks.leaseExpiresAt}, ${sql.placeholder("until")}::timestamptz)`,
        updatedAt: now,
      })
      .where(
        and(
          inArray(chunks.id, this.db.select({ id: locked.id }).from(locked)),
          sql`(select count(*) from ${locked}) = ${sql.placeholder("count")}`,
        ),
      )
      .returning({ ...getTableColumns(chunks), owner: ownerOfChunk })
      .prepare("ctxbank_acquire_read");
  }

  /**
   * Takes a read lease on every chunk or on none: each must be ready/reading with an unexpired
   * lease. The lease is extended to at least now + leaseMs and blocks reclaiming until then.
   * Returns the chunks in the order asked, with where to read them from.
   */
  async acquireRead(ids: string[], leaseMs: number): Promise<LeasedChunk[]> {
    parseInput(chunkIds, ids, "chunk ids");
    parseInput(positiveMs, leaseMs, "lease");
    const now = this.clock();
    this.leaseStatement ??= this.prepareLease();
    const rows = await this.leaseStatement.execute({
      ids,
      count: ids.length,
      now: now.toISOString(),
      until: addMs(now, leaseMs).toISOString(),
    });
    if (rows.length < ids.length) throw await unavailable(this.db, ids, [], now, "lease");
    const byId = new Map(rows.map((r) => [r.id, r]));
    return ids.map((id) => {
      const { owner, ...chunk } = byId.get(id)!;
      return {
        chunk,
        location: {
          shardId: chunk.shardId,
          epoch: chunk.shardEpoch,
          shardPath: owner.shardPath,
          ownerBaseUrl: owner.baseUrl,
          ownerHostId: owner.hostId,
          fileId: owner.fileId,
          ucxEndpoint: owner.ucxEndpoint,
          offset: chunk.offset,
          length: chunk.length,
        },
      };
    });
  }

  /** Pushes the read lease of chunks being read to at least now + leaseMs; all or none. */
  async extendLease(ids: string[], leaseMs: number): Promise<ChunkRow[]> {
    parseInput(chunkIds, ids, "chunk ids");
    parseInput(positiveMs, leaseMs, "lease");
    const now = this.clock();
    return this.db.transaction(async (tx) => {
      const rows = await tx
        .update(chunks)
        .set({ leaseExpiresAt: laterOf(addMs(now, leaseMs)), updatedAt: now })
        .where(and(inArray(chunks.id, ids), eq(chunks.state, "reading"), gt(chunks.leaseExpiresAt, now)))
        .returning();
      if (rows.length < ids.length) throw await unavailable(tx, ids, rows, now, "extend");
      return rows;
    });
  }

  /**
   * Drops one read lease per chunk. The last reader returns a chunk to `ready`, or to `released`
   * when no request holds it any more. Chunks not being read (reaped meanwhile) are reported,
   * not thrown, so this is safe in cleanup paths.
   */
  async releaseRead(ids: string[]): Promise<{ released: string[]; notReading: string[] }> {
    parseInput(chunkIds, ids, "chunk ids");
    const rows = await this.db
      .update(chunks)
      .set({
        readerCount: sql`${chunks.readerCount} - 1`,
        state: sql`(case when ${chunks.readerCount} > 1 then 'reading'
                         when ${chunks.refCount} = 0 then 'released'
                         else 'ready' end)::chunk_state`,
        updatedAt: this.clock(),
      })
      .where(and(inArray(chunks.id, ids), eq(chunks.state, "reading")))
      .returning({ id: chunks.id });
    const released = new Set(rows.map((r) => r.id));
    return { released: [...released], notReading: ids.filter((id) => !released.has(id)) };
  }

  /**
   * The request is finished or cancelled: drop its hold on every chunk it wrote or reused. A
   * chunk no request holds is released at once, or when its last reader lets go.
   */
  async releaseRequest(requestId: string): Promise<{ dropped: number; released: number }> {
    parseInput(identifier, requestId, "request id");
    return this.db.transaction(async (tx) => {
      const refs = await tx.delete(chunkRefs).where(eq(chunkRefs.requestId, requestId)).returning({ chunkId: chunkRefs.chunkId });
      if (refs.length === 0) return { dropped: 0, released: 0 };
      const rows = await tx
        .update(chunks)
        .set({
          refCount: sql`${chunks.refCount} - 1`,
          state: sql`(case when ${chunks.refCount} = 1 and ${chunks.state} in ('writing', 'ready') then 'released'
                           else ${chunks.state}::text end)::chunk_state`,
          updatedAt: this.clock(),
        })
        .where(
          inArray(
            chunks.id,
            refs.map((r) => r.chunkId),
          ),
        )
        .returning({ state: chunks.state });
      return { dropped: refs.length, released: rows.filter((r) => r.state === "released").length };
    });
  }

  /**
   * For the shard's owner: releases chunks of this shard epoch whose lease ran out, then removes
   * every released or failed row and returns their ranges, which the owner now frees. This is the
   * only path that hands ranges back, so a range is never freed twice.
   */
  async reapExpired(
    shard: { shardId: string; epoch: number },
    now: Date = this.clock(),
  ): Promise<{ expired: number; freed: FreedRange[] }> {
    parseInput(identifier, shard.shardId, "shard id");
    parseInput(z.number().int().min(1), shard.epoch, "shard epoch");
    const onShard = and(eq(chunks.shardId, shard.shardId), eq(chunks.shardEpoch, shard.epoch));
    return this.db.transaction(async (tx) => {
      const expired = await tx
        .update(chunks)
        .set({ state: "released", readerCount: 0, updatedAt: now })
        .where(
          and(
            onShard,
            inArray(chunks.state, LIVE),
            lte(chunks.leaseExpiresAt, now),
            // A ready chunk a request still prefilling holds is kept: its retention starts at the
            // handle (retainFromHandle), not at its commit, or a prompt that prefills for longer
            // than the retention would lose its first chunks before its handle is even answered.
            // (Write leases still expire: a writer that hangs loses its chunk.)
            sql`not (${chunks.state} = 'ready' and exists (select 1 from ${chunkRefs} cr join ${requests} r on r.id = cr.request_id
                     where cr.chunk_id = ${chunks.id} and r.state in ('queued', 'prefilling')))`,
          ),
        )
        .returning({ id: chunks.id });
      const freed = await tx
        .delete(chunks)
        .where(and(onShard, inArray(chunks.state, ["released", "failed"])))
        .returning({ id: chunks.id, key: chunks.key, offset: chunks.offset, length: chunks.length, state: chunks.state });
      return { expired: expired.length, freed: freed as FreedRange[] };
    });
  }

  /**
   * Whether `read` is exactly a chunk's range that is being read right now (state `reading`, lease
   * not expired) and that `read.requestId` holds: what the chunk route checks before it serves a
   * byte, so nothing but a live, leased chunk of the caller's own request can be read.
   */
  async isLeasedRead(read: {
    chunkId: string;
    requestId: string;
    shardId: string;
    epoch: number;
    offset: number;
    length: number;
  }): Promise<boolean> {
    if (!chunkId.safeParse(read.chunkId).success || !identifier.safeParse(read.requestId).success) return false;
    const now = this.clock();
    const rows = await this.db
      .select({ id: chunks.id })
      .from(chunks)
      .innerJoin(chunkRefs, and(eq(chunkRefs.chunkId, chunks.id), eq(chunkRefs.requestId, read.requestId)))
      .where(
        and(
          eq(chunks.id, read.chunkId),
          eq(chunks.shardId, read.shardId),
          eq(chunks.shardEpoch, read.epoch),
          eq(chunks.offset, read.offset),
          eq(chunks.length, read.length),
          eq(chunks.state, "reading"),
          gt(chunks.leaseExpiresAt, now),
        ),
      );
    return rows.length === 1;
  }

  /** How many chunks of this shard epoch are being read: a draining owner waits for them to reach 0. */
  async countReading(shard: { shardId: string; epoch: number }): Promise<number> {
    parseInput(identifier, shard.shardId, "shard id");
    parseInput(z.number().int().min(1), shard.epoch, "shard epoch");
    const [row] = await this.db
      .select({ n: count() })
      .from(chunks)
      .where(and(eq(chunks.shardId, shard.shardId), eq(chunks.shardEpoch, shard.epoch), eq(chunks.state, "reading")));
    return row?.n ?? 0;
  }

  async get(id: string): Promise<ChunkRow | undefined> {
    parseInput(chunkId, id, "chunk id");
    const [row] = await this.db.select().from(chunks).where(eq(chunks.id, id));
    return row;
  }

  /** Chunks the request holds (wrote or reused), by layer group then token start. */
  async ofRequest(requestId: string): Promise<ChunkRow[]> {
    parseInput(identifier, requestId, "request id");
    this.ofRequestStatement ??= this.prepareOfRequest();
    const rows = await this.ofRequestStatement.execute({ requestId });
    return rows.map((r) => r.chunk);
  }

  private ofRequestStatement: ReturnType<ChunkStore["prepareOfRequest"]> | undefined;

  /** Prepared: every load asks it beside the lease (parsed and planned once per connection). */
  private prepareOfRequest() {
    return this.db
      .select({ chunk: chunks })
      .from(chunkRefs)
      .innerJoin(chunks, eq(chunkRefs.chunkId, chunks.id))
      .where(eq(chunkRefs.requestId, sql.placeholder("requestId")))
      .orderBy(chunks.layerGroup, chunks.tokenStart)
      .prepare("ctxbank_chunks_of_request");
  }

  private async wrongState(id: string, op: string, wanted: string): Promise<RegistryError> {
    const row = await this.get(id);
    return row
      ? new RegistryError("wrong_state", `cannot ${op} chunk ${id}: it is ${row.state}, not ${wanted}`)
      : new RegistryError("not_found", `cannot ${op} chunk ${id}: no such chunk (never written or already reclaimed)`);
  }
}

/** A column named with its table, as SQL: drizzle leaves the table out inside RETURNING. */
function qualified(column: AnyPgColumn) {
  return sql`${sql.identifier(getTableName(column.table))}.${sql.identifier(column.name)}`;
}

const chunkOwnerJoin = sql`from ${shards} join ${instances} on ${qualified(instances.id)} = ${qualified(shards.instanceId)}
  where ${qualified(shards.id)} = ${qualified(chunks.shardId)} and ${qualified(shards.epoch)} = ${qualified(chunks.shardEpoch)}`;

/** Whether a chunk's shard epoch and its owner are registered (a chunk can be read only then). */
const ownerRegistered = sql<boolean>`exists (select 1 ${chunkOwnerJoin})`;

/** A chunk's shard file and its owner, for the RETURNING of an update of `chunks`. */
const ownerOfChunk = sql<{ shardPath: string; fileId: string | null; ucxEndpoint: string | null; baseUrl: string; hostId: string }>`(
  select json_build_object('shardPath', ${qualified(shards.path)}, 'fileId', ${qualified(shards.fileId)},
                           'ucxEndpoint', ${qualified(shards.ucxEndpoint)}, 'baseUrl', ${qualified(instances.baseUrl)},
                           'hostId', ${qualified(instances.hostId)})
  ${chunkOwnerJoin})`;

/** SQL for "the later of the current lease and `at`": leases only ever grow. */
function laterOf(at: Date) {
  return sql`greatest(${chunks.leaseExpiresAt}, ${at.toISOString()}::timestamptz)`;
}

function assertSameContent(live: ChunkRow, c: z.output<typeof BeginChunkInput>): void {
  const same =
    live.tokenStart === c.tokenStart &&
    live.tokenEnd === c.tokenEnd &&
    live.layerIds.join(",") === c.layerIds.join(",") &&
    live.dtype === c.dtype &&
    live.layoutVersion === c.layoutVersion &&
    live.modelFingerprint === c.modelFingerprint &&
    live.length === c.length;
  if (!same) {
    throw new RegistryError(
      "key_mismatch",
      `chunk key ${c.key} is live as chunk ${live.id} with different tokens/layers/dtype/fingerprint/length`,
    );
  }
}

/** Explains, per chunk, why an all-or-none lease (or lease extension) could not take it. */
async function unavailable(
  db: Database | Transaction,
  ids: string[],
  done: { id: string }[],
  now: Date,
  op: "lease" | "extend",
): Promise<RegistryError> {
  const ok = new Set(done.map((d) => d.id));
  const missing = ids.filter((id) => !ok.has(id));
  const rows = await db
    .select({
      id: chunks.id,
      state: chunks.state,
      leaseExpiresAt: chunks.leaseExpiresAt,
      shardEpoch: chunks.shardEpoch,
      ownerKnown: ownerRegistered,
    })
    .from(chunks)
    .where(inArray(chunks.id, missing));
  const found = new Map(rows.map((r) => [r.id, r]));
  // A lease is all or none: the chunks that could have been leased are not the reason and are left out.
  const reasonOf = (id: string): string | undefined => {
    const row = found.get(id);
    if (!row) return "not found (never written or already reclaimed)";
    if (row.leaseExpiresAt <= now && LIVE.includes(row.state as (typeof LIVE)[number])) {
      return `lease expired at ${row.leaseExpiresAt.toISOString()}`;
    }
    if (op === "extend") return row.state === "ready" ? "not leased for reading" : `chunk is ${row.state}`;
    if (row.state !== "ready" && row.state !== "reading") return `chunk is ${row.state}`;
    if (!row.ownerKnown) return `its shard's epoch ${row.shardEpoch} or its owner is not registered`;
    return undefined;
  };
  let details = missing.flatMap((id) => {
    const reason = reasonOf(id);
    return reason === undefined ? [] : [{ id, reason }];
  });
  if (details.length === 0) details = missing.map((id) => ({ id, reason: "changed while being leased (try again)" }));
  const summary = details.map((d) => `${d.id}: ${d.reason}`).join("; ");
  return new RegistryError(
    "chunk_unavailable",
    `cannot ${op === "lease" ? "lease" : "extend the lease of"} ${details.length} of ${ids.length} chunks: ${summary}`,
    details,
  );
}
