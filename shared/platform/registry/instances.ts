// Service instances: registration, heartbeats, draining, and declaring silent ones dead.
import { randomUUID } from "node:crypto";
import { and, eq, gt, inArray, lte, ne, sql } from "drizzle-orm";
import { z } from "zod";
import type { Clock } from "./clock.ts";
import type { Database, Transaction } from "./db.ts";
import { RegistryError, identifier, parseInput, positiveMs } from "./errors.ts";
import { chunks, instanceRole, instances, shards, type InstanceRow } from "./schema.ts";

const RegisterInput = z.object({
  id: identifier.optional(),
  role: z.enum(instanceRole.enumValues),
  baseUrl: z.url({ protocol: /^https?$/ }),
  /** A decode's public API (the router forwards clients' requests there). */
  publicUrl: z.url({ protocol: /^https?$/ }).optional(),
  hostId: identifier,
});
export type RegisterInstanceInput = z.input<typeof RegisterInput>;

export class InstanceStore {
  constructor(
    private readonly db: Database,
    private readonly clock: Clock,
  ) {}

  /** Registers (or re-registers after a restart) an instance; it starts alive with a fresh heartbeat. */
  async register(input: RegisterInstanceInput): Promise<InstanceRow> {
    const { id = randomUUID(), role, baseUrl, publicUrl, hostId } = parseInput(RegisterInput, input, "instance");
    const now = this.clock();
    const trim = (url: string) => url.replace(/\/+$/, "");
    const row = {
      role,
      baseUrl: trim(baseUrl),
      publicUrl: publicUrl === undefined ? null : trim(publicUrl),
      hostId,
      startedAt: now,
      lastHeartbeatAt: now,
    };
    const [saved] = await this.db
      .insert(instances)
      .values({ id, ...row, state: "alive" })
      .onConflictDoUpdate({ target: instances.id, set: { ...row, state: "alive" } })
      .returning();
    return saved!;
  }

  /** Refreshes the heartbeat. A dead instance is refused: its shards were retired, it must register again. */
  async heartbeat(id: string): Promise<InstanceRow> {
    parseInput(identifier, id, "instance id");
    const [row] = await this.db
      .update(instances)
      .set({ lastHeartbeatAt: this.clock() })
      .where(and(eq(instances.id, id), ne(instances.state, "dead")))
      .returning();
    if (row) return row;
    throw await this.missingOrDead(id);
  }

  /** Stops new work from being routed to the instance; it keeps heartbeating while it finishes. */
  async markDraining(id: string): Promise<InstanceRow> {
    parseInput(identifier, id, "instance id");
    const [row] = await this.db
      .update(instances)
      .set({ state: "draining" })
      .where(and(eq(instances.id, id), ne(instances.state, "dead")))
      .returning();
    if (row) return row;
    throw await this.missingOrDead(id);
  }

  /** Alive (not draining) instances of a role whose last heartbeat is newer than `timeoutMs`. */
  async findAlive(role: InstanceRow["role"], timeoutMs: number): Promise<InstanceRow[]> {
    parseInput(z.enum(instanceRole.enumValues), role, "role");
    parseInput(positiveMs, timeoutMs, "heartbeat timeout");
    const since = new Date(this.clock().getTime() - timeoutMs);
    return this.db
      .select()
      .from(instances)
      .where(and(eq(instances.role, role), eq(instances.state, "alive"), gt(instances.lastHeartbeatAt, since)))
      .orderBy(instances.id);
  }

  /**
   * Declares dead every instance silent for `timeoutMs` or longer, retires its shards and fails the
   * chunks on them (their bytes lived in the dead process's memory). Returns the dead instance ids.
   */
  async markDead(timeoutMs: number): Promise<string[]> {
    parseInput(positiveMs, timeoutMs, "heartbeat timeout");
    const cutoff = new Date(this.clock().getTime() - timeoutMs);
    return this.db.transaction(async (tx) => {
      const dead = await tx
        .update(instances)
        .set({ state: "dead" })
        .where(and(ne(instances.state, "dead"), lte(instances.lastHeartbeatAt, cutoff)))
        .returning({ id: instances.id });
      const ids = dead.map((d) => d.id);
      if (ids.length === 0) return ids;
      await tx
        .update(shards)
        .set({ state: "retired" })
        .where(and(inArray(shards.instanceId, ids), eq(shards.state, "active")));
      await tx
        .update(chunks)
        .set({ state: "failed", readerCount: 0, updatedAt: this.clock() })
        .where(
          and(
            inArray(sql`(${chunks.shardId}, ${chunks.shardEpoch})`, shardsOf(tx, ids)),
            inArray(chunks.state, ["writing", "ready", "reading"]),
          ),
        );
      return ids;
    });
  }

  /**
   * A graceful exit: the instance is dead at once, whatever its state, so nothing is routed to it
   * while the heartbeat timeout runs out. Its shard is retired by its owner (ShardStore.retire).
   */
  async leave(id: string): Promise<void> {
    parseInput(identifier, id, "instance id");
    await this.db.update(instances).set({ state: "dead" }).where(eq(instances.id, id));
  }

  async get(id: string): Promise<InstanceRow | undefined> {
    const [row] = await this.db.select().from(instances).where(eq(instances.id, id));
    return row;
  }

  private async missingOrDead(id: string): Promise<RegistryError> {
    const row = await this.get(id);
    return row
      ? new RegistryError("instance_dead", `instance ${id} was declared dead; register it again`)
      : new RegistryError("not_found", `instance ${id} is not registered`);
  }
}

function shardsOf(tx: Transaction, instanceIds: string[]) {
  return tx.select({ id: shards.id, epoch: shards.epoch }).from(shards).where(inArray(shards.instanceId, instanceIds));
}
