// The owner half of the shard handoff: the prefill instance's shard and its life. Each start (and
// each return after the registry declared the instance dead) is a new epoch: a new tmpfs file,
// recorded in the registry and mapped for UCX readers where UCX is built. A prompt's chunks (one
// per layer group per token block) get their room reserved before any compute, within the
// tenant's share (shard/shard-quota.ts); each is written and committed two-phase as soon as its
// block is computed (writer.ts) and announced to a streaming reader. The reaper returns expired
// and released chunks' ranges, the sweeper clears what dead instances left (sweeper.ts); at the
// end the shard is retired (its chunks fail: the bytes die with it) and deleted.
import path from "node:path";
import type { NativeSequence } from "../../shared/inference/engine/engine.ts";
import { chunkKeySalt } from "../../shared/platform/auth/tenant.ts";
import { FailureLog } from "../../shared/platform/failure-log.ts";
import { ApiError } from "../../shared/platform/http/errors.ts";
import type { ServiceMetrics } from "../../shared/platform/metrics/metrics.ts";
import { RegistryError } from "../../shared/platform/registry/registry.ts";
import type { Runtime } from "../runtime.ts";
import { PrefixHasher } from "./format/chunk-key.ts";
import { kvShape, splitSlidingLayers, tokenBlocks, type BlockRange, type KvShape } from "./format/seq-io.ts";
import { roundBlocks } from "./round-chunks.ts";
import { announceWrites, type HandleProgress } from "./handle-stream.ts";
import type { HandoffOwner, OwnedPrompt, OwnerStatus, PlacedKv, PromptHandoff } from "./handoff.ts";
import { Shard, shardFileName } from "./shard/shard.ts";
import { ShardQuota } from "./shard/shard-quota.ts";
import { Sweeper } from "./sweeper.ts";
import { UcxShardExposure, loadUcx, ucxAvailable } from "./transport/ucx.ts";
import { ChunkWriter, planChunks, SHARD_ALIGN, type PlannedChunk, type WriteResult } from "./writer.ts";

export class ShardOwner implements HandoffOwner {
  private shard: Shard | undefined;
  /** The shard's pages mapped for UCX readers, with its endpoint in the registry. */
  private ucx: UcxShardExposure | undefined;
  private reaper: NodeJS.Timeout | undefined;
  private reaping: Promise<void> | undefined;
  private sweepTimer: NodeJS.Timeout | undefined;
  private sweeping: Promise<void> | undefined;
  private readonly sweepLog: FailureLog;
  private readonly sweeper: Sweeper;
  private readonly quota: ShardQuota;
  private readonly shape: KvShape;
  private readonly writer: ChunkWriter;
  private readonly totals = { chunks_written: 0, chunks_reused: 0, bytes_written: 0, ranges_reclaimed: 0 };

  constructor(
    private readonly rt: Runtime,
    /** The instance id: stable across restarts, so a restart starts its next epoch. */
    readonly shardId: string,
    private readonly metrics: ServiceMetrics,
  ) {
    const c = rt.config;
    this.sweepLog = new FailureLog(rt.log, "sweep failed");
    // Shares (and the default cap, half the shard) are for API keys; a keyless server has one
    // tenant, "local", with nobody to share the shard with. An explicit --max-shard-bytes-per-key
    // applies to all.
    this.quota = new ShardQuota(
      c.maxShardBytesPerKey ?? Math.floor(c.shardBytes / 2),
      new Set(c.maxShardBytesPerKey === undefined ? ["local"] : []),
      c.retainMs + c.heartbeatTimeoutMs,
    );
    metrics.watchKv("shard", () => ({ inUse: this.shard?.bytesUsed ?? 0, capacity: this.shard?.sizeBytes ?? 0 }));
    this.shape = kvShape(rt.model.config);
    this.writer = new ChunkWriter(rt, this.shape, this.totals);
    this.sweeper = new Sweeper(
      rt.registry,
      {
        hostId: c.hostId,
        shardDir: c.shardDir,
        // Twice the timeout: decodes first see the owner's chunks as failed (502, or a recompute).
        graceMs: 2 * c.heartbeatTimeoutMs,
        unclaimedMs: c.retainMs + c.heartbeatTimeoutMs,
        retentionMs: c.requestRetentionMs,
      },
      rt.log,
    );
  }

  async start(): Promise<void> {
    await this.newEpoch();
    const reaping = new FailureLog(this.rt.log, "reaper failed");
    this.reaper = setInterval(
      () =>
        void this.reap().then(
          () => reaping.succeeded(),
          (err: unknown) => reaping.failed(err),
        ),
      this.rt.config.reapMs,
    );
    this.reaper.unref();
    this.sweepTimer = setInterval(() => void this.sweep(), this.rt.config.sweepMs);
    this.sweepTimer.unref();
    this.rt.log.info(
      { shard: this.shardId, epoch: this.shard!.epoch, bytes: this.shard!.sizeBytes, path: this.shard!.path },
      "shard ready",
    );
  }

  async newEpoch(): Promise<void> {
    const { shardDir } = this.rt.config;
    const sizeBytes = Math.ceil(this.rt.config.shardBytes / SHARD_ALIGN) * SHARD_ALIGN;
    const row = await this.rt.registry.shards.create({
      id: this.shardId,
      instanceId: this.shardId,
      sizeBytes,
      pathFor: (epoch) => path.join(shardDir, shardFileName(this.shardId, epoch)),
    });
    const shard = await Shard.create({ shardId: this.shardId, epoch: row.epoch, sizeBytes, dir: shardDir, alignment: SHARD_ALIGN });
    let ucx: UcxShardExposure | undefined;
    try {
      await this.rt.registry.shards.recordFile(this.shardId, row.epoch, shard.fileId);
      ucx = await this.publishUcx(shard);
    } catch (err) {
      ucx?.close();
      await shard.destroy();
      throw err;
    }
    const old = this.shard;
    const oldUcx = this.ucx;
    this.shard = shard;
    this.ucx = ucx;
    oldUcx?.close(); // before the pages go: UCX readers of the old epoch then see it gone
    await old?.destroy();
  }

  /**
   * Maps the shard for UCX readers and publishes the endpoint, where the UCX transport is built and
   * the mode allows it (the first publication loads the UCX addon). Under auto a UCX that cannot be
   * loaded is logged and left out; under ucx it is an error.
   */
  private async publishUcx(shard: Shard): Promise<UcxShardExposure | undefined> {
    const mode = this.rt.config.transport;
    if (mode === "ucx" && !ucxAvailable())
      throw new Error(
        '--transport ucx: the UCX transport is not built (install libucx-dev and run "npm run build:native" with CTXBANK_UCX=AUTO or ON)',
      );
    if ((mode !== "ucx" && mode !== "auto") || !ucxAvailable()) return undefined;
    if (mode === "auto") {
      try {
        loadUcx();
      } catch (err) {
        this.rt.log.warn({ err }, "--transport auto: the UCX transport cannot be used; publishing no UCX endpoint");
        return undefined;
      }
    }
    const exposure = UcxShardExposure.create(shard);
    try {
      await this.rt.registry.shards.recordUcxEndpoint(shard.shardId, shard.epoch, exposure.endpoint);
    } catch (err) {
      exposure.close();
      throw err;
    }
    return exposure;
  }

  async open(prompt: OwnedPrompt, progress?: HandleProgress): Promise<PromptHandoff> {
    const shard = this.shard!; // the prompt's chunks stay in the epoch it started in
    const n = prompt.tokens.length;
    const blocks = prompt.rounds ? roundBlocks(n, this.rt.config.blockTokens, prompt.rounds) : tokenBlocks(n, this.rt.config.blockTokens);
    const groups = splitSlidingLayers(prompt.layerGroups, this.shape);
    const plan = planChunks(blocks, groups, this.rt.model.fingerprint, this.shape);
    await this.writer.reserve(plan.flat(), shard, () => this.reap(), prompt.tenant, this.quota);
    const layerGroups = groups.map((g) => g.layerIds);
    return new ShardPromptHandoff(this.rt, this.writer, shard, { ...prompt, layerGroups }, blocks, plan, progress);
  }

  chunkSource(shardId: string): Shard | undefined {
    return shardId === this.shardId ? this.shard : undefined;
  }

  /** Returns expired and released chunks' ranges to the shard's allocator. */
  private reap(): Promise<void> {
    this.reaping ??= (async () => {
      const shard = this.shard;
      if (!shard) return;
      const { expired, freed } = await this.rt.registry.chunks.reapExpired({ shardId: shard.shardId, epoch: shard.epoch });
      this.metrics.leaseExpiries(expired);
      for (const f of freed) {
        try {
          shard.free(f.offset);
          this.totals.ranges_reclaimed++;
        } catch (err) {
          this.rt.log.error({ err, offset: f.offset }, "reaper freed a range the shard does not hold");
        }
      }
      if (expired > 0 || freed.length > 0) this.rt.log.debug({ expired, freed: freed.length }, "reaped chunks");
    })().finally(() => (this.reaping = undefined));
    return this.reaping;
  }

  /** Sweeps dead instances' shard files, chunks and open requests, and prunes old rows (see sweeper.ts). */
  private sweep(): Promise<void> {
    this.sweeping ??= this.sweeper
      .sweep()
      .then(
        () => this.sweepLog.succeeded(),
        (err: unknown) => this.sweepLog.failed(err),
      )
      .finally(() => (this.sweeping = undefined));
    return this.sweeping;
  }

  status(): OwnerStatus {
    const s = this.shard;
    return {
      shard: s
        ? {
            id: s.shardId,
            epoch: s.epoch,
            bytes: s.sizeBytes,
            bytes_used: s.bytesUsed,
            bytes_free: s.bytesFree,
            largest_free: s.largestFree,
          }
        : null,
      totals: { ...this.totals },
    };
  }

  async drain(deadline: number): Promise<void> {
    // An unreachable registry cannot tell: stop waiting rather than fail the shutdown.
    while (Date.now() < deadline && (await this.readersOnShard().catch(() => 0)) > 0) await new Promise((r) => setTimeout(r, 100));
  }

  private async readersOnShard(): Promise<number> {
    const shard = this.shard;
    if (!shard) return 0;
    return this.rt.registry.chunks.countReading({ shardId: shard.shardId, epoch: shard.epoch });
  }

  async stop(): Promise<void> {
    clearInterval(this.reaper);
    clearInterval(this.sweepTimer);
    await this.reaping?.catch(() => undefined); // its failure is the reaper's to log (start())
    await this.sweeping;
    const shard = this.shard;
    if (!shard) return;
    await this.rt.registry.shards
      .retire(shard.shardId, shard.epoch)
      .catch((err: unknown) => this.rt.log.warn({ err }, "could not retire the shard"));
    await this.rt.registry.chunks
      .reapExpired({ shardId: shard.shardId, epoch: shard.epoch })
      .catch((err: unknown) => this.rt.log.warn({ err }, "could not reap the shard's expired chunks"));
    this.ucx?.close();
    this.ucx = undefined;
    await shard.destroy();
    this.shard = undefined;
  }
}

/** One prompt's chunks: written block by block as the prompt is computed, kept for its decode at the end. */
class ShardPromptHandoff implements PromptHandoff {
  /** Each planned chunk's write, with its group (the handle lists chunks group-major). */
  private readonly writes: { group: number; result: Promise<WriteResult> }[] = [];
  /** The next block to write. */
  private next = 0;
  private readonly hasher: PrefixHasher;
  private readonly announce: (r: WriteResult) => WriteResult;

  constructor(
    private readonly rt: Runtime,
    private readonly writer: ChunkWriter,
    private readonly shard: Shard,
    private readonly prompt: OwnedPrompt,
    private readonly blocks: BlockRange[],
    /** plan[block]: each group's chunk of the block (planChunks), every range reserved. */
    private readonly plan: PlannedChunk[][],
    progress: HandleProgress | undefined,
  ) {
    const { model, config } = rt;
    this.hasher = new PrefixHasher(model.fingerprint, { salt: chunkKeySalt(prompt.tenant) });
    // Streaming (handle-stream.ts): each chunk is announced as it commits.
    this.announce = announceWrites(progress, () => ({
      request_id: prompt.requestId,
      shard_id: shard.shardId,
      shard_epoch: shard.epoch,
      model_fingerprint: model.fingerprint,
      prompt_tokens: prompt.tokens.length,
      prompt_token_ids: prompt.tokens,
      layer_groups: prompt.layerGroups,
      policy: prompt.policy,
      resolved_policy: prompt.resolvedPolicy,
      block_tokens: config.blockTokens,
      sampling: prompt.sampling,
      total_chunks: plan.flat().length,
    }));
  }

  async computed(seq: NativeSequence): Promise<void> {
    const { blocks, plan, prompt } = this;
    while (this.next < blocks.length && blocks[this.next]!.tokenEnd <= seq.nPast) {
      const b = blocks[this.next]!;
      if (this.next > 0 && this.next === blocks.length - 1) await this.rt.config.faults?.pause("prefill.last", this.rt.log);
      this.hasher.push(prompt.tokens.slice(b.tokenStart, b.tokenEnd));
      for (const p of plan[this.next]!)
        this.writes.push({
          group: p.group,
          result: this.writer
            .write(p, this.hasher.keyFor(p.meta.tokenStart, p.meta.layerIds), prompt.requestId, prompt, seq, this.shard)
            .then(this.announce),
        });
      this.next++;
    }
  }

  async finish(signal: AbortSignal): Promise<PlacedKv> {
    const { registry, config } = this.rt;
    try {
      const results = await Promise.all(this.writes.map((w) => w.result));
      const failed = results.find((r): r is { error: unknown } => "error" in r);
      if (failed) throw failed.error;
      signal.throwIfAborted(); // nobody to keep them for
      // Chunk ids group-major (layer group, then token block): the order decode imports them in.
      const ids = results as { id: string }[];
      const groups = this.prompt.layerGroups;
      const chunkIds = groups.flatMap((_, g) => this.writes.flatMap((w, i) => (w.group === g ? [ids[i]!.id] : [])));
      const unique = [...new Set(chunkIds)];
      // The retention runs from the handle (the reaper kept them while the prompt was computed).
      const live = await registry.chunks.retainFromHandle(unique, config.retainMs);
      if (live !== unique.length) throw new Error(`${unique.length - live} of the request's chunks were reclaimed during its prefill`);
      return {
        chunk_ids: chunkIds,
        shard_id: this.shard.shardId,
        shard_epoch: this.shard.epoch,
        layer_groups: groups,
        block_tokens: config.blockTokens,
        expires_at: new Date(Date.now() + config.retainMs).toISOString(),
      };
    } catch (err) {
      if (err instanceof RegistryError && err.code === "stale_epoch") {
        throw new ApiError(503, "not_ready", "the prefill instance restarted its shard during the request; retry", null, undefined, {
          cause: err,
        });
      }
      throw err;
    }
  }

  async abandon(): Promise<void> {
    await Promise.allSettled(this.writes);
    for (const p of this.plan.flat()) {
      if (p.state === "reserved") {
        this.shard.free(p.offset);
        p.state = "freed";
      }
    }
  }
}
