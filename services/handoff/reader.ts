// Loads a handle's KV into a fresh sequence: lease the chunks in the registry, read them over the
// transport the locality allows (shm on the owner's host, else HTTP), verify each (model
// fingerprint, the registry row's shape, then the checksum, computed natively in the same pass as
// the import into the cache) as it arrives, several chunks in flight at once; the sequence's
// length is declared only once every chunk has verified.
import path from "node:path";
import { CtxbankError } from "../../shared/inference/errors.ts";
import type { InternalAuth } from "../../shared/platform/auth/capability.ts";
import { tenantOf } from "../../shared/platform/auth/tenant.ts";
import type { NativeSequence } from "../../shared/inference/engine/engine.ts";
import { ApiError } from "../../shared/platform/http/errors.ts";
import type { Handle } from "../../shared/platform/http/wire.ts";
import { ChunkError } from "./format/chunk.ts";
import { coverageProblem, importVerifiedChunk, kvShape, type KvShape } from "./format/seq-io.ts";
import { RegistryError, type LeasedChunk } from "../../shared/platform/registry/registry.ts";
import { TransportError, chunkLabel } from "./transport/errors.ts";
import { HttpTransport } from "./transport/http.ts";
import { ShmTransport } from "./transport/shm.ts";
import type { ChunkLocation, ChunkView, KvTransport, ReadChunkOptions } from "./transport/types.ts";
import type { ServiceMetrics } from "../../shared/platform/metrics/metrics.ts";
import type { Runtime } from "../runtime.ts";
import { PeerDeadError, type PeerWatch } from "../decode/peer-watch.ts";
import { SocketHttpTransport } from "./transport/socket.ts";
import { UcxTransport, loadUcx, ucxAvailable } from "./transport/ucx.ts";
import { faultPoint } from "../fault-points.ts";
import type { ChunkFeed } from "./chunk-feed.ts";
import { ScratchPool, type Scratch } from "./scratch-pool.ts";

/** The KV could not be loaded (transport, checksum, fingerprint, chunks gone): 502, or a local recompute if asked. */
export class KvLoadError extends CtxbankError<"kv_load_failed"> {
  static override readonly codes = ["kv_load_failed"] as const;
  override readonly name = "KvLoadError";
  constructor(
    message: string,
    readonly reason: "unavailable" | "transport" | "corrupt" | "failed_owner",
    options?: ErrorOptions,
  ) {
    super("kv_load_failed", message, { ...options, details: { reason } });
  }
}

export interface KvLoadStats {
  /** shm when every chunk was mapped in place, else the transport that read them (what the metrics label). */
  transport: "http" | "shm" | "ucx";
  chunks: number;
  bytes: number;
  ms: number;
}

export class KvLoader {
  /** http:// owners: the socket transport (reads straight into the buffer); https:// owners: undici. */
  readonly http: SocketHttpTransport;
  readonly https: HttpTransport;
  readonly shm: ShmTransport;
  /** Present when the UCX addon is built and the transport mode allows it (its addon loads on first use). */
  readonly ucx: UcxTransport | undefined;
  private readonly shape: KvShape;
  /** HTTP and UCX reads' staging buffers, reused across loads. */
  private readonly scratch: ScratchPool;
  readonly totals = { loads: 0, chunks: 0, bytes: 0, failures: 0, ms: 0 };

  constructor(
    private readonly rt: Runtime,
    private readonly metrics?: ServiceMetrics,
    /** Signs the chunk-read capabilities HTTP owners want (without it, HTTP reads are refused). */
    private readonly auth?: InternalAuth,
    /** Aborts reads from an owner the registry declares dead (HTTP reads; shm reads cannot hang). */
    private readonly peers?: PeerWatch,
  ) {
    this.http = new SocketHttpTransport({ maxIdle: 8 });
    this.https = new HttpTransport({ connections: 8 });
    this.shm = new ShmTransport({ allowedDirs: [path.resolve(rt.config.shardDir)], requireFileId: true, log: rt.log });
    // The UCX addon is loaded on first use: at once under --transport ucx (a clear error now rather
    // than at the first read), under auto at the first chunk whose owner publishes an endpoint.
    this.ucx = (rt.config.transport === "ucx" || rt.config.transport === "auto") && ucxAvailable() ? new UcxTransport() : undefined;
    if (rt.config.transport === "ucx") {
      if (!this.ucx) throw new Error("--transport ucx: the UCX transport is not built (install libucx-dev and run \"npm run build:native\" with CTXBANK_UCX=AUTO or ON)");
      loadUcx();
    }
    this.shape = kvShape(rt.model.config);
    this.scratch = new ScratchPool(rt.config.kvConcurrency);
  }

  /** When set, every chunk is read over this transport (bench/handoff compares them this way). */
  override: KvTransport | undefined;

  /** shm when the chunk's owner runs on this host (and it is allowed), else UCX when both ends have it, else HTTP. */
  pick(loc: LeasedChunk["location"]): KvTransport {
    if (this.override) return this.override;
    const mode = this.rt.config.transport;
    if (mode === "shm") return this.shm;
    if (mode === "ucx") return this.ucx!;
    const http = loc.ownerBaseUrl.startsWith("https:") ? this.https : this.http;
    if (mode === "http") return http;
    const sameHost = loc.ownerHostId === this.rt.config.hostId;
    const allowed = path.dirname(path.resolve(loc.shardPath)) === path.resolve(this.rt.config.shardDir);
    if (sameHost && allowed) return this.shm;
    return loc.ucxEndpoint && this.ucx && this.canLoadUcx() ? this.ucx : http;
  }

  /** Set when the UCX addon failed to load: auto then reads over HTTP (the failure is logged once). */
  private ucxLoadFailed = false;

  /** Under auto, for an owner that publishes an endpoint: loads the UCX addon the first time. */
  private canLoadUcx(): boolean {
    if (this.ucxLoadFailed) return false;
    try {
      loadUcx();
      return true;
    } catch (err) {
      this.ucxLoadFailed = true;
      this.rt.log.warn({ err }, "--transport auto: the UCX transport cannot be loaded; reading over HTTP instead");
      return false;
    }
  }

  /**
   * Reads one leased chunk over `transport` and imports it into `seq`. A read that fails because
   * the owner was declared dead says so; any other failure is the transport's (KvLoadError).
   */
  private async readAndImport(
    transport: KvTransport,
    location: ChunkLocation,
    chunk: LeasedChunk["chunk"],
    seq: NativeSequence,
    scratch: Scratch,
    at: { deadlineMs: number; stop: AbortSignal; ownerDead: AbortSignal; caller: AbortSignal },
  ): Promise<void> {
    let view: ChunkView;
    try {
      view = await fetchChunk(transport, location, scratch, { deadlineMs: at.deadlineMs, signal: at.stop });
    } catch (e) {
      if (at.ownerDead.aborted && !at.caller.aborted) throw ownerGone(at.ownerDead.reason);
      throw transportError(e, at.caller);
    }
    try {
      this.importVerified(view.bytes, chunk, seq);
    } finally {
      view.release();
    }
  }

  /** Imports a chunk into `seq` if it is the registry row's and intact (fingerprint, shape, checksum); else KvLoadError. */
  private importVerified(bytes: Uint8Array, chunk: LeasedChunk["chunk"], seq: NativeSequence): void {
    try {
      importVerifiedChunk(
        bytes,
        {
          fingerprint: this.rt.model.fingerprint,
          ...(chunk.checksum === null ? {} : { checksum: chunk.checksum }),
          tokenStart: chunk.tokenStart,
          tokenCount: chunk.tokenEnd - chunk.tokenStart,
          layerIds: chunk.layerIds,
          dtype: chunk.dtype,
        },
        seq,
        this.shape,
      );
    } catch (e) {
      if (e instanceof ChunkError) {
        throw new KvLoadError(`chunk ${chunk.id} (tokens ${chunk.tokenStart}..${chunk.tokenEnd}) failed verification: ${e.code}: ${e.message}`, "corrupt", { cause: e });
      }
      throw e;
    }
  }

  /**
   * Reads every chunk of `handle` into `seq` (capacity >= prompt tokens) and sets its length.
   * Throws ApiError for a bad or expired handle, KvLoadError when the bytes cannot be had.
   */
  async load(handle: Handle, seq: NativeSequence, signal: AbortSignal): Promise<KvLoadStats> {
    const { registry, config, model } = this.rt;
    const t0 = performance.now();
    prefaultFor(seq, handle.prompt_tokens);
    // The request's chunks are looked up while the leases are taken (one round trip less); a
    // lease failure is reported first, as when the two ran one after the other.
    const ofRequest = registry.chunks.ofRequest(handle.request_id);
    ofRequest.catch(() => {}); // awaited below, once the leases are held
    let leased: LeasedChunk[];
    try {
      leased = await registry.chunks.acquireRead(handle.chunk_ids, config.readLeaseMs);
    } catch (e) {
      const err = leaseError(e);
      this.countFailure("none", err);
      throw err;
    }
    const ids = leased.map((l) => l.chunk.id);
    try {
      // A handle is the client's to send: every chunk it names must be one its own request holds.
      const held = new Set((await ofRequest).map((c) => c.id));
      if (ids.some((id) => !held.has(id))) {
        throw new ApiError(400, "invalid_request", "the handle names chunks its request does not hold", "handle.chunk_ids");
      }
      for (const l of leased) l.location = { ...l.location, capability: this.capability(l, handle.request_id) };
      for (const { chunk } of leased) {
        if (chunk.modelFingerprint !== model.fingerprint) {
          throw new ApiError(400, "model_mismatch", `chunk ${chunk.id} was made by model ${chunk.modelFingerprint.slice(0, 12)}…, this decode runs ${model.fingerprint.slice(0, 12)}…`, "handle");
        }
      }
      const problem = coverageProblem(
        leased.map((l) => l.chunk),
        this.shape.nLayer,
        handle.prompt_tokens,
      );
      if (problem) throw new ApiError(400, "invalid_request", `the handle's chunks do not cover the prompt: ${problem}`, "handle.chunk_ids");

      await faultPoint("decode.load", this.rt.log);
      const deadlineMs = Date.now() + config.kvTimeoutMs;
      const transports = new Set<string>();
      let bytes = 0;
      let nextIndex = 0;
      const stop = new AbortController();
      const onAbort = () => stop.abort(signal.reason);
      signal.addEventListener("abort", onAbort, { once: true });
      const ownerDead = new AbortController();
      ownerDead.signal.addEventListener("abort", () => stop.abort(ownerDead.signal.reason), { once: true });
      // Looked up while the first chunks move: a dead owner is noticed a round trip later at worst.
      const watching = this.watchOwners(leased, ownerDead);
      const worker = async () => {
        const scratch = this.scratch.take();
        try {
          while (nextIndex < leased.length && !stop.signal.aborted) {
            const { chunk, location } = leased[nextIndex++]!;
            const transport = this.pick(location);
            transports.add(transport.name);
            await this.readAndImport(transport, location, chunk, seq, scratch, { deadlineMs, stop: stop.signal, ownerDead: ownerDead.signal, caller: signal });
            bytes += location.length;
            this.metrics?.transferBytes(transport.name, location.length);
          }
        } finally {
          this.scratch.put(scratch);
        }
      };
      const workers = Array.from({ length: Math.min(config.kvConcurrency, leased.length) }, () =>
        worker().catch((e: unknown) => {
          stop.abort(e);
          throw e;
        }),
      );
      const settled = await Promise.allSettled(workers);
      signal.removeEventListener("abort", onAbort);
      (await watching)();
      const failure = settled.find((s): s is PromiseRejectedResult => s.status === "rejected");
      if (failure) throw firstCause(settled, failure.reason);
      signal.throwIfAborted();
      seq.setLength(handle.prompt_tokens);
      const ms = performance.now() - t0;
      this.totals.loads++;
      this.totals.chunks += leased.length;
      this.totals.bytes += bytes;
      this.totals.ms += ms;
      const transport = transports.has("http") ? "http" : transports.has("ucx") ? "ucx" : "shm";
      this.metrics?.transferDone(transport, ms / 1000);
      return { transport, chunks: leased.length, bytes, ms };
    } catch (e) {
      this.totals.failures++;
      if (!signal.aborted) this.countFailure(leased.length > 0 ? this.pick(leased[0]!.location).name : "none", e);
      throw e;
    } finally {
      await registry.chunks.releaseRead(ids).catch((err) => this.rt.log.warn({ err }, "could not release read leases"));
    }
  }

  /**
   * Streaming load: reads the chunks of a handle still being prefilled as `feed` announces them,
   * each leased, read, verified and imported on its own (kvConcurrency at once) and released at
   * once, so block i moves while block i+1 computes. Ends when the feed does (the handle came)
   * and every chunk is in; then the chunks must cover the prompt and belong to its request.
   * Throws what the feed fails with (the prefill's error), KvLoadError, or ApiError.
   */
  async loadStream(feed: ChunkFeed, start: { request_id: string; prompt_tokens: number }, seq: NativeSequence, signal: AbortSignal): Promise<KvLoadStats> {
    const { registry, config, model } = this.rt;
    const t0 = performance.now();
    prefaultFor(seq, start.prompt_tokens);
    const stop = new AbortController();
    const onAbort = () => stop.abort(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    const ownerDead = new AbortController();
    ownerDead.signal.addEventListener("abort", () => stop.abort(ownerDead.signal.reason), { once: true });
    const watched = new Set<string>();
    const untracks: Array<() => void> = [];
    const rows: LeasedChunk["chunk"][] = [];
    const transports = new Set<string>();
    let bytes = 0;
    let firstLease = true;
    const readOne = async (id: string, scratch: Scratch) => {
      let leased: LeasedChunk;
      try {
        [leased] = (await registry.chunks.acquireRead([id], config.readLeaseMs)) as [LeasedChunk];
      } catch (e) {
        throw leaseError(e);
      }
      try {
        const { chunk } = leased;
        if (chunk.modelFingerprint !== model.fingerprint) throw new KvLoadError(`chunk ${chunk.id} was made by model ${chunk.modelFingerprint.slice(0, 12)}…`, "corrupt");
        const location = { ...leased.location, capability: this.capability(leased, start.request_id) };
        const transport = this.pick(location);
        const shardKey = `${location.shardId}/${location.epoch}`;
        if (transport !== this.shm && !watched.has(shardKey)) {
          watched.add(shardKey);
          untracks.push(await this.watchOwners([leased], ownerDead));
        }
        if (firstLease) {
          firstLease = false;
          await faultPoint("decode.load", this.rt.log);
        }
        transports.add(transport.name);
        const deadlineMs = Date.now() + config.kvTimeoutMs;
        await this.readAndImport(transport, location, chunk, seq, scratch, { deadlineMs, stop: stop.signal, ownerDead: ownerDead.signal, caller: signal });
        rows.push(chunk);
        bytes += location.length;
        this.metrics?.transferBytes(transport.name, location.length);
      } finally {
        await registry.chunks.releaseRead([id]).catch((err) => this.rt.log.warn({ err }, "could not release a read lease"));
      }
    };
    const worker = async () => {
      const scratch = this.scratch.take();
      try {
        for (;;) {
          const id = await feed.next(stop.signal);
          if (id === undefined || stop.signal.aborted) return;
          await readOne(id, scratch);
        }
      } finally {
        this.scratch.put(scratch);
      }
    };
    try {
      const workers = Array.from({ length: config.kvConcurrency }, () =>
        worker().catch((e: unknown) => {
          stop.abort(e);
          throw e;
        }),
      );
      const settled = await Promise.allSettled(workers);
      const failure = settled.find((s): s is PromiseRejectedResult => s.status === "rejected");
      if (failure) throw firstCause(settled, failure.reason);
      signal.throwIfAborted();
      const problem = coverageProblem(rows, this.shape.nLayer, start.prompt_tokens);
      if (problem) throw new KvLoadError(`the streamed chunks do not cover the prompt: ${problem}`, "corrupt");
      const held = new Set((await registry.chunks.ofRequest(start.request_id)).map((c) => c.id));
      const foreign = rows.find((c) => !held.has(c.id));
      if (foreign) throw new KvLoadError(`the prefill announced chunk ${foreign.id}, which its request does not hold`, "corrupt");
      seq.setLength(start.prompt_tokens);
      const ms = performance.now() - t0;
      this.totals.loads++;
      this.totals.chunks += rows.length;
      this.totals.bytes += bytes;
      this.totals.ms += ms;
      const transport = transports.has("http") ? "http" : "shm";
      this.metrics?.transferDone(transport, ms / 1000);
      return { transport, chunks: rows.length, bytes, ms };
    } catch (e) {
      this.totals.failures++;
      if (!signal.aborted) this.countFailure(transports.has("http") ? "http" : transports.size > 0 ? "shm" : "none", e);
      throw e;
    } finally {
      signal.removeEventListener("abort", onAbort);
      untracks.forEach((f) => f());
    }
  }

  /** The capability for reading exactly this leased chunk, valid while its lease is. */
  private capability({ chunk, location }: LeasedChunk, requestId: string): string | undefined {
    if (!this.auth) return undefined;
    return this.auth.sign({
      route: "chunk",
      tenant: tenantOf(requestId),
      request: requestId,
      chunk: chunk.id,
      shard: location.shardId,
      epoch: location.epoch,
      offset: location.offset,
      length: location.length,
      exp: Math.min(chunk.leaseExpiresAt.getTime(), Date.now() + this.rt.config.kvTimeoutMs),
    });
  }

  /** Watches the owners of the chunks read over HTTP; returns the function that stops watching. */
  private async watchOwners(leased: LeasedChunk[], ac: AbortController): Promise<() => void> {
    const peers = this.peers;
    if (!peers) return () => {};
    const shardsRead = new Map<string, { shardId: string; epoch: number }>();
    for (const { location: loc } of leased) {
      if (this.pick(loc) !== this.shm) shardsRead.set(`${loc.shardId}/${loc.epoch}`, { shardId: loc.shardId, epoch: loc.epoch });
    }
    const untracks: Array<() => void> = [];
    for (const { shardId, epoch } of shardsRead.values()) {
      // Unwatched if the registry cannot say: the read's own deadline still bounds it.
      const row = await this.rt.registry.shards.get(shardId, epoch).catch((err: unknown) => void this.rt.log.warn({ err, shardId }, "could not look up a shard's owner to watch"));
      if (row) untracks.push(peers.track(row.instanceId, ac));
    }
    return () => untracks.forEach((f) => f());
  }

  /** A load that failed for want of the bytes (not a bad handle, not a cancel): by transport and reason. */
  private countFailure(transport: string, err: unknown): void {
    if (err instanceof KvLoadError) this.metrics?.transferFailed(transport, err.reason);
    else if (err instanceof ApiError && err.code === "handle_expired") this.metrics?.transferFailed(transport, "expired");
  }

  async close(): Promise<void> {
    await Promise.all([this.http.close(), this.https.close(), this.shm.close(), this.ucx?.close()]);
  }
}

/** The chunk's bytes: mapped in place where the transport can (shm), else read into `scratch`. */
async function fetchChunk(transport: KvTransport, loc: ChunkLocation, scratch: Scratch, opts: ReadChunkOptions): Promise<ChunkView> {
  if (opts.signal?.aborted) throw new TransportError("aborted", `${chunkLabel(loc)}: aborted by the caller`);
  if (transport.viewChunk) return await transport.viewChunk(loc);
  if (scratch.buf.byteLength < loc.length) scratch.buf = Buffer.allocUnsafe(loc.length);
  const bytes = scratch.buf.subarray(0, loc.length);
  await transport.readChunk(loc, bytes, opts);
  return { bytes, release: () => {} };
}

/** Prefer the error that started the failure over the aborts it caused in the other workers. */
function firstCause(settled: PromiseSettledResult<void>[], fallback: unknown): unknown {
  for (const s of settled) {
    if (s.status === "rejected" && !(s.reason instanceof KvLoadError && /aborted/.test(s.reason.message))) return s.reason;
  }
  return fallback;
}

function leaseError(e: unknown): unknown {
  if (!(e instanceof RegistryError)) return e;
  if (e.code === "invalid_input") return new ApiError(400, "invalid_request", e.message, "handle.chunk_ids");
  if (e.code === "chunk_unavailable") {
    const details = (e.details ?? []) as { id: string; reason: string }[];
    if (details.some((d) => d.reason === "chunk is failed")) {
      return new KvLoadError(`the KV's owner is gone (its shard was retired): ${e.message}`, "failed_owner", { cause: e });
    }
    return new ApiError(409, "handle_expired", `the handle's KV is no longer available: ${e.message}`, "handle", details, { cause: e });
  }
  return e;
}

function ownerGone(reason: unknown): KvLoadError {
  const why = reason instanceof PeerDeadError ? reason.message : String(reason);
  return new KvLoadError(`the KV's owner is gone: ${why}`, "failed_owner", { cause: reason });
}

function transportError(e: unknown, signal: AbortSignal): unknown {
  if (signal.aborted) return signal.reason;
  if (e instanceof TransportError) {
    return new KvLoadError(`cannot read the KV (${e.code}): ${e.message}`, "transport", { cause: e });
  }
  return e;
}

/**
 * Starts committing the destination's memory for the prompt's rows on a worker thread while the
 * leases are taken and the first chunks read: a new sequence's pages would otherwise be faulted
 * in one by one inside the import (most of a first load's time, bench/handoff/shm-load.ts).
 * A hint: nothing waits for it, a failure only loses the head start.
 */
function prefaultFor(seq: NativeSequence, promptTokens: number): void {
  if (promptTokens > seq.nPast && promptTokens <= seq.capacity) seq.prefault(promptTokens).catch(() => {});
}
