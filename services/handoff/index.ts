// The KV handoff's face: the one module of services/handoff/ the rest of services/ imports
// (test/unit/architecture.test.ts holds them to it). The interface, in its owner and reader halves, is
// handoff.ts; docs/architecture.md maps the folder.
import type { Runtime } from "../runtime.ts";
import type { ServiceMetrics } from "../../shared/platform/metrics/metrics.ts";
import type { HandoffOwner, HandoffReader, InProcessPrefill } from "./handoff.ts";
import { InProcessHandoff } from "./in-process.ts";
import { ShardOwner } from "./owner.ts";
import { ShardHandoff, type ShardReaderOptions } from "./shard-handoff.ts";

export type * from "./handoff.ts";
export type { Handle, KvSummary, PromptHandle } from "./handle.ts";
export { handleStreamResponse, type HandleProgress } from "./handle-stream.ts";
export { fastChunkRoutes } from "./chunk-route.ts";
export { chunkReadAuth } from "./chunk-auth.ts";
export { KvLoadError } from "./reader.ts";
export { checkPickedRounds, roundsLayoutOf } from "./round-chunks.ts";
// The chunk format (docs/kv-format.md), for KV kept elsewhere than in a shard (a session's on disk).
export { chunkByteLength, chunkHeaderSize, decodeChunkHeader, type ChunkMeta } from "./format/chunk.ts";
export {
  exportChunk,
  heldChunks,
  heldParts,
  importVerifiedChunk,
  kvShape,
  tokenBlocks,
  type KvShape,
} from "./format/seq-io.ts";

/** The prefill's half: its shard in host memory, named `shardId` (the instance id). */
export function openOwner(rt: Runtime, shardId: string, metrics: ServiceMetrics): HandoffOwner {
  return new ShardOwner(rt, shardId, metrics);
}

/**
 * The decode's half: its own requests handed over in process when a prefill runs in this process
 * (`inProcess`, under `serve`), else through the prefill instances' shards, as clients' handles
 * always are.
 */
export function openReader(rt: Runtime, opts: ShardReaderOptions & { inProcess?: InProcessPrefill | undefined }): HandoffReader {
  const shard = new ShardHandoff(rt, opts);
  return opts.inProcess ? new InProcessHandoff(opts.inProcess, shard) : shard;
}
