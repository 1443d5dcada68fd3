// UCX transport: the owner maps its shard and publishes its worker address, the mapping's id and
// its secret token in the registry (UcxShardExposure); the reader asks the owner's worker for each
// chunk's range, and the owner answers with a UCX rendezvous send that the reader pulls straight
// into the caller's buffer with a zero-copy get (UcxTransport; native/src/ucx/ucx_node.cc). On one
// host the bytes move by CMA, across hosts with RDMA NICs by RDMA READ: the same code; the owner's
// CPU never copies them. The owner checks the epoch, token and range of every ask; what binds a
// read to its lease is the registry: only a leased chunk's location (and the shard's endpoint)
// reaches the reader (docs/security.md).
import type { Shard } from "../shard/shard.ts";
import { TransportError, chunkLabel, type TransportErrorCode } from "./errors.ts";
import { checkReadArgs, withDeadline } from "./read-checks.ts";
import type { ChunkLocation, KvTransport, ReadChunkOptions } from "./types.ts";
import { ucxAddon, ucxAddonBuilt, type UcxAddon } from "./ucx-addon.ts";
import { decodeUcxEndpoint, encodeUcxEndpoint } from "./ucx-endpoint.ts";

/**
 * Whether this installation has the UCX transport (its addon is built, and has not failed to load
 * in this process). Loads nothing: the addon is loaded on first use (ucx-addon.ts).
 */
export function ucxAvailable(): boolean {
  return ucxAddonBuilt();
}

/** Loads the UCX addon now, if it is not loaded yet; throws an Error saying why it cannot. */
export function loadUcx(): void {
  ucxAddon();
}

/** A location as the registry gives it, with the owner's published UCX endpoint (base64), if any. */
export type UcxChunkLocation = ChunkLocation & { ucxEndpoint?: string | null };

/** Names each native read, so an abort cancels exactly its own. */
let nextReadId = 1;

const NATIVE_CODES: Record<string, TransportErrorCode> = {
  unreachable: "unreachable",
  aborted: "aborted",
  bad_endpoint: "bad_response",
  stale_epoch: "stale_epoch",
  out_of_range: "out_of_range",
  io_error: "io_error",
};

export class UcxTransport implements KvTransport {
  readonly name = "ucx";

  async readChunk(loc: UcxChunkLocation, into: Uint8Array, opts: ReadChunkOptions): Promise<number> {
    checkReadArgs(loc, into, opts);
    if (loc.ucxEndpoint === null || loc.ucxEndpoint === undefined) {
      throw new TransportError(
        "unreachable",
        `${chunkLabel(loc)}: the owner of shard ${loc.shardId} publishes no UCX endpoint (it runs without UCX, or with --transport http or shm)`,
      );
    }
    const ep = decodeUcxEndpoint(loc.ucxEndpoint);
    if (typeof ep === "string") {
      throw new TransportError(
        "bad_response",
        `${chunkLabel(loc)}: the registry's UCX endpoint of shard ${loc.shardId} is unusable: ${ep}`,
      );
    }
    if (ep.epoch !== loc.epoch) {
      throw new TransportError("stale_epoch", `${chunkLabel(loc)}: shard ${loc.shardId} publishes epoch ${ep.epoch}, not ${loc.epoch}`);
    }
    if (loc.offset + loc.length > ep.length) {
      throw new TransportError("out_of_range", `${chunkLabel(loc)} lies outside the ${ep.length}-byte shard`);
    }
    let native: UcxAddon;
    try {
      native = ucxAddon();
    } catch (err) {
      throw new TransportError("io_error", `${chunkLabel(loc)}: ${(err as Error).message}`, undefined, { cause: err });
    }
    const target = into.subarray(0, loc.length);
    return withDeadline(loc, opts, async (signal) => {
      // The native read settles only after UCX is done with `target`: cancelling closes the read's
      // own endpoint, which completes it, so nothing writes into `target` afterwards.
      const readId = nextReadId++;
      const onAbort = () => native.cancel(readId);
      signal.addEventListener("abort", onAbort, { once: true });
      try {
        await native.read(ep.address, ep.mapping, ep.token, ep.epoch, loc.offset, target, readId);
      } catch (err) {
        if (signal.aborted) throw signal.reason;
        const code = NATIVE_CODES[(err as { code?: string }).code ?? ""] ?? "io_error";
        const why = code === "stale_epoch" ? `the shard's epoch ${loc.epoch} is gone (its owner unmapped it)` : (err as Error).message;
        throw new TransportError(code, `${chunkLabel(loc)}: ${why}`, undefined, { cause: err });
      } finally {
        signal.removeEventListener("abort", onAbort);
      }
      return loc.length;
    });
  }

  async close(): Promise<void> {
    // Endpoints live in the process's one UCX worker, shared by every transport instance.
  }
}

/** The owner's side: a shard's pages mapped for remote reads, and the endpoint to publish for them. */
export class UcxShardExposure {
  private closed = false;
  private constructor(
    private readonly id: bigint,
    /** base64, for shards.ucx_endpoint. */
    readonly endpoint: string,
  ) {}

  static create(shard: Pick<Shard, "path" | "epoch" | "sizeBytes">): UcxShardExposure {
    const native = ucxAddon();
    const exposed = native.expose(shard.path, shard.sizeBytes, shard.epoch);
    try {
      const endpoint = encodeUcxEndpoint({
        epoch: shard.epoch,
        mapping: exposed.id,
        token: exposed.token,
        length: shard.sizeBytes,
        address: native.workerAddress(),
      });
      return new UcxShardExposure(exposed.id, endpoint);
    } catch (err) {
      native.unexpose(exposed.id);
      throw err;
    }
  }

  /** Stops answering reads of this epoch (later ones fail stale_epoch); the pages go once the answers in flight are done. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    ucxAddon().unexpose(this.id);
  }
}
