// A prefill's KV chunks: one per layer group per token block (planChunks), a sliding-window group's
// only for its last window; every shard range
// reserved before any compute, so a full shard is a 429 up front; each chunk registered, written
// and committed two-phase in the registry as soon as its block is computed (ChunkWriter.write).
import { LAYOUT_VERSION, chunkByteLength, type ChunkMeta } from "./format/chunk.ts";
import { exportChunk, windowStart, type BlockRange, type KvShape, type RowMover } from "./format/seq-io.ts";
import type { Shard } from "./shard/shard.ts";
import type { Runtime } from "../runtime.ts";
import type { ShardQuota } from "./shard/shard-quota.ts";

/** Shard ranges (and the shard's size) are multiples of a page. */
export const SHARD_ALIGN = 4096;

export interface PlannedChunk {
  meta: ChunkMeta;
  group: number;
  length: number;
  offset: number;
  /** reserved: our range, not in the registry; registered: the registry (reaper) owns it; freed. */
  state: "reserved" | "registered" | "freed";
}

export type WriteResult = { id: string; reused: boolean } | { error: unknown };

export interface ChunkTotals {
  chunks_written: number;
  chunks_reused: number;
  bytes_written: number;
}

/**
 * The chunks of a prompt, block-major: plan[block] holds each group's chunk of that block, written
 * once the block is computed. A sliding-window group (its layers keep their last window only:
 * seq-io.ts splitSlidingLayers) has one chunk, of that window, in the last block's plan.
 */
export function planChunks(
  blocks: BlockRange[],
  groups: readonly { layerIds: readonly number[]; sliding: boolean }[],
  fingerprint: string,
  shape: KvShape,
): PlannedChunk[][] {
  const n = blocks.at(-1)?.tokenEnd ?? 0;
  const chunk = (group: number, tokenStart: number, tokenEnd: number): PlannedChunk => {
    const meta: ChunkMeta = {
      fingerprint,
      dtype: "f16",
      layerIds: groups[group]!.layerIds,
      hkv: shape.hkv,
      headDim: shape.headDim,
      tokenStart,
      tokenCount: tokenEnd - tokenStart,
    };
    return { meta, group, length: chunkByteLength(meta), offset: -1, state: "freed" as const };
  };
  return blocks.map((b, i) =>
    groups.flatMap(({ sliding }, group) => {
      if (!sliding) return [chunk(group, b.tokenStart, b.tokenEnd)];
      return i === blocks.length - 1 ? [chunk(group, windowStart(shape, n), n)] : [];
    }),
  );
}

export class ChunkWriter {
  constructor(
    private readonly rt: Runtime,
    private readonly shape: KvShape,
    private readonly totals: ChunkTotals,
  ) {}

  /**
   * Reserves every chunk's shard range before computing, so a full shard (or `tenant` over its
   * share) is a 429 up front; `reap` may free expired ones.
   */
  async reserve(all: PlannedChunk[], shard: Shard, reap: () => Promise<void>, tenant: string, quota: ShardQuota): Promise<void> {
    const need = all.reduce((s, p) => s + Math.ceil(p.length / SHARD_ALIGN) * SHARD_ALIGN, 0);
    for (let attempt = 0; attempt < 2; attempt++) {
      try {
        quota.check(tenant, need, shard);
      } catch (e) {
        if (attempt > 0) throw e;
        await reap(); // the tenant's expired chunks may bring it under its cap
        continue;
      }
      const got: PlannedChunk[] = [];
      for (const p of all) {
        const offset = shard.alloc(p.length);
        if (offset === null) break;
        p.offset = offset;
        p.state = "reserved";
        got.push(p);
      }
      if (got.length === all.length) {
        quota.charge(
          tenant,
          shard,
          all.map((p) => ({ offset: p.offset, length: Math.ceil(p.length / SHARD_ALIGN) * SHARD_ALIGN })),
        );
        return;
      }
      for (const p of got) {
        shard.free(p.offset);
        p.state = "freed";
      }
      if (attempt === 0) await reap(); // expired chunks may free enough
    }
    throw quota.full(
      `the KV shard has ${shard.bytesFree} of ${shard.sizeBytes} bytes free (largest range ${shard.largestFree}); this prompt needs ${need}. Retry when earlier requests have been decoded`,
      tenant,
    );
  }

  /** Registers, writes and commits one chunk (its row names the prompt's session and round), or takes a live chunk with the same key. Never rejects. */
  async write(
    p: PlannedChunk,
    key: string,
    requestId: string,
    prompt: { sessionId: string | null; roundId: number | null },
    seq: RowMover,
    shard: Shard,
  ): Promise<WriteResult> {
    const { registry, model, config } = this.rt;
    const deadline = Date.now() + config.writeLeaseMs;
    try {
      for (;;) {
        const res = await registry.chunks.begin({
          key,
          requestId,
          sessionId: prompt.sessionId,
          roundId: prompt.roundId,
          layerGroup: p.group,
          layerIds: [...p.meta.layerIds],
          tokenStart: p.meta.tokenStart,
          tokenEnd: p.meta.tokenStart + p.meta.tokenCount,
          shardId: shard.shardId,
          shardEpoch: shard.epoch,
          offset: p.offset,
          length: p.length,
          dtype: "f16",
          layoutVersion: LAYOUT_VERSION,
          modelFingerprint: model.fingerprint,
          writeLeaseMs: config.writeLeaseMs,
        });
        if (res.status === "reuse") {
          shard.free(p.offset);
          p.state = "freed";
          this.totals.chunks_reused++;
          return { id: res.chunk.id, reused: true };
        }
        if (res.status === "in_progress") {
          // Another request is writing the same prefix right now: wait for it, then share it.
          if (Date.now() > deadline) throw new Error(`chunk ${key.slice(0, 12)}… stayed in writing for ${config.writeLeaseMs} ms`);
          await new Promise((r) => setTimeout(r, 20));
          continue;
        }
        p.state = "registered";
        await this.rt.config.faults?.pause("prefill.write", this.rt.log);
        const bytes = Buffer.allocUnsafe(p.length);
        try {
          exportChunk(bytes, p.meta, seq, this.shape);
          await shard.write(p.offset, bytes);
          await registry.chunks.commit(res.chunk.id, { checksum: bytes.readUInt32LE(8), retainMs: config.retainMs });
        } catch (err) {
          // The row stays pending otherwise, until the sweep ends this instance's leftovers.
          await registry.chunks
            .fail(res.chunk.id)
            .catch((failErr: unknown) => this.rt.log.warn({ err: failErr, chunkId: res.chunk.id }, "could not mark a chunk failed"));
          throw err;
        }
        this.totals.chunks_written++;
        this.totals.bytes_written += p.length;
        return { id: res.chunk.id, reused: false };
      }
    } catch (error) {
      return { error };
    }
  }
}
