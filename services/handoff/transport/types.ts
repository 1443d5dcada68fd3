// The one interface every KV transport implements, and the wire path of the HTTP one.

/** Where a chunk's bytes are. Structurally what Registry.chunks.acquireRead returns. */
export interface ChunkLocation {
  shardId: string;
  epoch: number;
  shardPath: string; // the shard file, for a reader on the owner's host
  ownerBaseUrl: string; // the owner's HTTP base URL, for a reader elsewhere
  /** "device:inode" of the owner's shard file as the registry recorded it: shm reads only that file. */
  fileId?: string | null;
  offset: number;
  length: number;
  /** The capability the owner's chunk route wants (shared/platform/auth/capability.ts), sent as a bearer token; HTTP only. */
  capability?: string | undefined;
}

/** A capability is base64url "." base64url: safe in a header line as it is. */
export const CAPABILITY_TOKEN = /^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$/;

export interface ReadChunkOptions {
  /** Absolute wall-clock deadline in ms since the epoch (Date.now() + budget), shared by a batch of reads. */
  deadlineMs: number;
  signal?: AbortSignal;
}

export interface KvTransport {
  readonly name: string;
  /**
   * Reads exactly `loc.length` bytes into the start of `into`; resolves with that count. Rejects
   * with a TransportError. Once the promise settles, nothing writes into `into` any more.
   */
  readChunk(loc: ChunkLocation, into: Uint8Array, opts: ReadChunkOptions): Promise<number>;
  /**
   * The chunk's bytes in place, without copying, where the transport can map the shard (shm).
   * Absent where it cannot. The caller must release() the view when done with it.
   */
  viewChunk?(loc: ChunkLocation): Promise<ChunkView>;
  close(): Promise<void>;
}

export interface ChunkView {
  readonly bytes: Uint8Array;
  /** The caller is done with the bytes (shm: they are unmapped, and every view of them emptied, once no view of the shard file is out). */
  release(): void;
}

export const CHUNK_ROUTE = "/v1/chunks/:shardId/:epoch";

export function chunkRequestPath(loc: Pick<ChunkLocation, "shardId" | "epoch" | "offset" | "length">): string {
  return `/v1/chunks/${encodeURIComponent(loc.shardId)}/${loc.epoch}?offset=${loc.offset}&length=${loc.length}`;
}
