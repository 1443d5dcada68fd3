// Cleaning up after instances that died (crashed, killed, or restarted under another id): their
// chunk rows (and, by cascade, refs), the requests they left open, and, much later, their own
// rows; plus pruning ended requests. Any live instance may run these, several at once: each is
// one idempotent statement that only touches rows of instances dead for longer than `graceMs`.
import { and, eq, inArray, isNotNull, isNull, lte, notInArray, or, sql } from "drizzle-orm";
import { z } from "zod";
import { addMs, type Clock } from "./clock.ts";
import type { Database } from "./db.ts";
import { identifier, parseInput, positiveMs } from "./errors.ts";
import { chunks, instances, requests, shards } from "./schema.ts";

const OPEN = ["queued", "prefilling", "decoding"] as const;
const ENDED = ["done", "failed", "cancelled"] as const;

/** A dead instance's shard epoch whose file may still lie in a host's shard directory. */
export interface DeadShard {
  shardId: string;
  epoch: number;
  path: string;
  fileId: string | null;
  hostId: string;
}

const FinaliseInput = z.object({
  /** How long an instance must have been dead (past its last heartbeat) before its work is swept. */
  graceMs: positiveMs,
  /** A handle nobody took this long after its prefill ended is abandoned (its chunks are long reclaimed). */
  unclaimedMs: positiveMs,
});

export class SweepStore {
  constructor(
    private readonly db: Database,
    private readonly clock: Clock,
  ) {}

  /** Instances dead (declared, or left) whose last heartbeat is older than `graceMs`. */
  private deadIds(graceMs: number) {
    const cutoff = addMs(this.clock(), -graceMs);
    return this.db
      .select({ id: instances.id })
      .from(instances)
      .where(and(eq(instances.state, "dead"), lte(instances.lastHeartbeatAt, cutoff)));
  }

  /** Instances that still count: alive, draining, or dead for less than `graceMs`. */
  private liveIds(graceMs: number) {
    const cutoff = addMs(this.clock(), -graceMs);
    return this.db
      .select({ id: instances.id })
      .from(instances)
      .where(sql`not (${instances.state} = 'dead' and ${instances.lastHeartbeatAt} <= ${cutoff.toISOString()}::timestamptz)`);
  }

  /** Shard epochs of dead instances on `hostId`: their files, if still there, are litter. */
  async deadShards(hostId: string, graceMs: number): Promise<DeadShard[]> {
    parseInput(identifier, hostId, "host id");
    parseInput(positiveMs, graceMs, "grace");
    return this.db
      .select({ shardId: shards.id, epoch: shards.epoch, path: shards.path, fileId: shards.fileId, hostId: instances.hostId })
      .from(shards)
      .innerJoin(instances, eq(shards.instanceId, instances.id))
      .where(and(eq(instances.hostId, hostId), inArray(shards.instanceId, this.deadIds(graceMs))));
  }

  /**
   * Deletes every chunk row on a dead instance's shards (their refs go with them): the bytes died
   * with the process, and no owner is left to reap them. Returns how many.
   */
  async deleteDeadChunks(graceMs: number): Promise<number> {
    parseInput(positiveMs, graceMs, "grace");
    const deadShards = this.db
      .select({ id: shards.id, epoch: shards.epoch })
      .from(shards)
      .where(inArray(shards.instanceId, this.deadIds(graceMs)));
    const gone = await this.db
      .delete(chunks)
      .where(inArray(sql`(${chunks.shardId}, ${chunks.shardEpoch})`, deadShards))
      .returning({ id: chunks.id });
    return gone.length;
  }

  /**
   * Ends (as failed) the open requests nobody will finish: claimed by a decode that is gone,
   * still queued/prefilling on a prefill that is gone, or a handle nobody took within
   * `unclaimedMs` of its prefill. Returns how many.
   */
  async finaliseOrphans(input: z.input<typeof FinaliseInput>): Promise<number> {
    const { graceMs, unclaimedMs } = parseInput(FinaliseInput, input, "sweep");
    const now = this.clock();
    const live = this.liveIds(graceMs);
    const unclaimedBefore = addMs(now, -unclaimedMs);
    const ended = await this.db
      .update(requests)
      .set({
        state: "failed",
        endedAt: now,
        error: sql`case when ${requests.decodeInstanceId} is not null
                        then 'the decode instance ' || ${requests.decodeInstanceId} || ' died during the request'
                        when ${requests.state} in ('queued', 'prefilling') and ${requests.prefillInstanceId} is not null
                        then 'the prefill instance ' || ${requests.prefillInstanceId} || ' died during the request'
                        else 'abandoned: the handle was not decoded before its chunks were reclaimed' end`,
      })
      .where(
        and(
          inArray(requests.state, OPEN),
          or(
            and(isNotNull(requests.decodeInstanceId), notInArray(requests.decodeInstanceId, live)),
            and(
              isNull(requests.decodeInstanceId),
              or(
                and(
                  inArray(requests.state, ["queued", "prefilling"]),
                  isNotNull(requests.prefillInstanceId),
                  notInArray(requests.prefillInstanceId, live),
                ),
                // Prefilled (a handle exists) but never claimed: only rows past their prefill, so a
                // long-running prefill on a live instance is never touched.
                and(eq(requests.state, "decoding"), isNull(requests.firstTokenAt), lte(requests.prefillEndAt, unclaimedBefore)),
              ),
            ),
          ),
        ),
      )
      .returning({ id: requests.id });
    return ended.length;
  }

  /**
   * Ends the open requests an earlier life of `instanceId` left (a restart under the same id: the
   * sweep never sees that instance dead): every open row it was working on that arrived before
   * `startedAt`, when this life began. Returns how many.
   */
  async endPreviousLife(instanceId: string, startedAt: Date): Promise<number> {
    parseInput(identifier, instanceId, "instance id");
    const ended = await this.db
      .update(requests)
      .set({ state: "failed", endedAt: this.clock(), error: `the instance ${instanceId} restarted during the request` })
      .where(
        and(
          inArray(requests.state, OPEN),
          lte(requests.arrivalAt, startedAt),
          or(
            eq(requests.decodeInstanceId, instanceId),
            and(
              isNull(requests.decodeInstanceId),
              inArray(requests.state, ["queued", "prefilling"]),
              eq(requests.prefillInstanceId, instanceId),
            ),
          ),
        ),
      )
      .returning({ id: requests.id });
    return ended.length;
  }

  /**
   * Deletes ended requests older than `retentionMs`, and instances dead for longer than
   * `instanceRetentionMs` (default: the same) with their shard rows (their chunks went long ago).
   * Returns the counts.
   */
  async prune(retentionMs: number, instanceRetentionMs: number = retentionMs): Promise<{ requests: number; instances: number }> {
    parseInput(positiveMs, retentionMs, "retention");
    parseInput(positiveMs, instanceRetentionMs, "instance retention");
    const before = addMs(this.clock(), -retentionMs);
    const instancesBefore = addMs(this.clock(), -instanceRetentionMs);
    const oldRequests = await this.db
      .delete(requests)
      .where(
        and(
          inArray(requests.state, ENDED),
          lte(sql`coalesce(${requests.endedAt}, ${requests.arrivalAt})`, sql`${before.toISOString()}::timestamptz`),
        ),
      )
      .returning({ id: requests.id });
    const gone = await this.db.transaction(async (tx) => {
      const ids = (
        await tx
          .select({ id: instances.id })
          .from(instances)
          .where(and(eq(instances.state, "dead"), lte(instances.lastHeartbeatAt, instancesBefore)))
          .for("update", { skipLocked: true })
      ).map((r) => r.id);
      if (ids.length === 0) return 0;
      await tx.delete(shards).where(inArray(shards.instanceId, ids)); // chunks cascade
      const rows = await tx.delete(instances).where(inArray(instances.id, ids)).returning({ id: instances.id });
      return rows.length;
    });
    return { requests: oldRequests.length, instances: gone };
  }
}
