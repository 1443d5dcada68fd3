// Shards: one row per incarnation (id, epoch) of an owner's host-memory region.
import path from "node:path";
import { and, desc, eq, inArray, lt } from "drizzle-orm";
import { z } from "zod";
import type { Clock } from "./clock.ts";
import type { Database } from "./db.ts";
import { RegistryError, identifier, parseInput } from "./errors.ts";
import { chunks, instances, shards, type ShardRow } from "./schema.ts";

const CreateShardInput = z.object({
  id: identifier,
  instanceId: identifier,
  sizeBytes: z.number().int().positive().max(Number.MAX_SAFE_INTEGER),
  /** The file path of the shard in a given epoch (the file name carries the epoch). */
  pathFor: z.custom<(epoch: number) => string>((v) => typeof v === "function", "a function (epoch) => path"),
});
/** "device:inode" in decimal, as services/handoff/shard/shard-dir.ts's fileIdentity gives. */
export const FileId = z.string().regex(/^[0-9]{1,20}:[0-9]{1,20}$/, "device:inode in decimal");

/** Base64 of a UCX endpoint envelope; its contents are checked by the reader. */
const UcxEndpointText = z
  .string()
  .min(8)
  .max(64 << 10)
  .regex(/^[A-Za-z0-9+/]+={0,2}$/, "base64");

export type CreateShardInput = z.input<typeof CreateShardInput>;

export class ShardStore {
  constructor(
    private readonly db: Database,
    private readonly clock: Clock,
  ) {}

  /**
   * Starts the next epoch of shard `id` for a (re)started owner: older epochs are retired and
   * their chunk rows deleted, because their bytes died with the previous process.
   */
  async create(input: CreateShardInput): Promise<ShardRow> {
    const { id, instanceId, sizeBytes, pathFor } = parseInput(CreateShardInput, input, "shard");
    return this.db.transaction(async (tx) => {
      const [owner] = await tx.select().from(instances).where(eq(instances.id, instanceId)).for("share");
      if (!owner) throw new RegistryError("not_found", `instance ${instanceId} is not registered`);
      if (owner.state === "dead") {
        throw new RegistryError("instance_dead", `instance ${instanceId} was declared dead; register it again`);
      }
      const [latest] = await tx
        .select({ epoch: shards.epoch })
        .from(shards)
        .where(eq(shards.id, id))
        .orderBy(desc(shards.epoch))
        .limit(1)
        .for("update");
      const epoch = (latest?.epoch ?? 0) + 1;
      const filePath = pathFor(epoch);
      if (!path.isAbsolute(filePath)) {
        throw new RegistryError("invalid_input", `shard path must be absolute, got "${filePath}"`);
      }
      await tx
        .update(shards)
        .set({ state: "retired" })
        .where(and(eq(shards.id, id), eq(shards.state, "active")));
      await tx.delete(chunks).where(and(eq(chunks.shardId, id), lt(chunks.shardEpoch, epoch)));
      const [row] = await tx
        .insert(shards)
        .values({ id, epoch, instanceId, path: filePath, sizeBytes, state: "active", createdAt: this.clock() })
        .returning();
      return row!;
    });
  }

  /**
   * Records the "device:inode" of the file the owner created for its active epoch: readers map
   * only that file and sweepers delete only that file.
   */
  async recordFile(id: string, epoch: number, fileId: string): Promise<ShardRow> {
    parseInput(identifier, id, "shard id");
    parseInput(FileId, fileId, "shard file id");
    const [row] = await this.db
      .update(shards)
      .set({ fileId })
      .where(and(eq(shards.id, id), eq(shards.epoch, epoch), eq(shards.state, "active")))
      .returning();
    if (!row) throw new RegistryError("stale_epoch", `shard ${id} epoch ${epoch} is not active`);
    return row;
  }

  /**
   * Retires one epoch of a shard whose owner is stopping, and fails its live chunks: their bytes
   * die with the owner's memory. Freed ranges are then handed back by ChunkStore.reapExpired.
   */
  async retire(id: string, epoch: number): Promise<void> {
    parseInput(identifier, id, "shard id");
    parseInput(z.number().int().min(1), epoch, "shard epoch");
    await this.db.transaction(async (tx) => {
      await tx
        .update(shards)
        .set({ state: "retired" })
        .where(and(eq(shards.id, id), eq(shards.epoch, epoch)));
      await tx
        .update(chunks)
        .set({ state: "failed", readerCount: 0, updatedAt: this.clock() })
        .where(and(eq(chunks.shardId, id), eq(chunks.shardEpoch, epoch), inArray(chunks.state, ["writing", "ready", "reading"])));
    });
  }

  /** Publishes the owner's UCX endpoint for its active epoch (readers validate it; see ucx-endpoint.ts). */
  async recordUcxEndpoint(id: string, epoch: number, endpoint: string): Promise<ShardRow> {
    parseInput(identifier, id, "shard id");
    parseInput(UcxEndpointText, endpoint, "UCX endpoint");
    const [row] = await this.db
      .update(shards)
      .set({ ucxEndpoint: endpoint })
      .where(and(eq(shards.id, id), eq(shards.epoch, epoch), eq(shards.state, "active")))
      .returning();
    if (!row) throw new RegistryError("stale_epoch", `shard ${id} epoch ${epoch} is not active`);
    return row;
  }

  async get(id: string, epoch: number): Promise<ShardRow | undefined> {
    const [row] = await this.db
      .select()
      .from(shards)
      .where(and(eq(shards.id, id), eq(shards.epoch, epoch)));
    return row;
  }

  async active(id: string): Promise<ShardRow | undefined> {
    const [row] = await this.db
      .select()
      .from(shards)
      .where(and(eq(shards.id, id), eq(shards.state, "active")));
    return row;
  }
}
