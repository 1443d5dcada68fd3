// Loads a request's KV into a fresh sequence. One path: the chunks come from a feed (a client's
// handle names them all at once, a streamed handle announces each as the prefill commits it); all
// the feed holds are leased in the registry together, checked, read over the transport the
// locality allows (shm on the owner's host, else UCX when both ends have it, else HTTP) and
// verified as they arrive (model fingerprint, the registry row's shape, then the checksum,
// computed natively in the same pass as the import into the cache), several chunks in flight at
// once; the sequence's length is declared only once every chunk has verified.
import path from "node:path";
import { CtxbankError } from "../../shared/inference/errors.ts";
import type { InternalAuth } from "../../shared/platform/auth/capability.ts";
import { tenantOf } from "../../shared/platform/auth/tenant.ts";
import type { NativeSequence } from "../../shared/inference/engine/engine.ts";
import { ApiError } from "../../shared/platform/http/errors.ts";
import type { Handle } from "./handle.ts";
import { ChunkError } from "./format/chunk.ts";
import { coverageProblem, importVerifiedChunk, kvShape, type KvShape } from "./format/seq-io.ts";
import { chunkNeeded, leftOutOf, type LeftOut, type RoundsLoad } from "./round-chunks.ts";
import { RegistryError, type LeasedChunk } from "../../shared/platform/registry/registry.ts";
import { TransportError, chunkLabel } from "./transport/errors.ts";
import { HttpTransport } from "./transport/http.ts";
import { ShmTransport } from "./transport/shm.ts";
import type { ChunkLocation, ChunkView, KvTransport, ReadChunkOptions } from "./transport/types.ts";
import type { ServiceMetrics } from "../../shared/platform/metrics/metrics.ts";
import type { Runtime } from "../runtime.ts";
import { PeerDeadError, type PeerWatch } from "./peer-watch.ts";
import { SocketHttpTransport } from "./transport/socket.ts";
import { UcxTransport, loadUcx, ucxAvailable } from "./transport/ucx.ts";
import { ChunkFeed } from "./chunk-feed.ts";
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
  /** The transport that read the chunks (what the metrics label): shm when every chunk was mapped in place, else ucx or http. */
  transport: "http" | "shm" | "ucx";
  chunks: number;
  bytes: number;
  ms: number;
}

/** What a load fills: the request whose chunks they are, and the prompt tokens they cover. */
export interface LoadTarget {
  request_id: string;
  prompt_tokens: number;
  /** Round Attention: what the decode's policy may leave behind (round-chunks.ts). */
  rounds?: RoundsLoad | undefined;
}

/** Read leases taken in one statement, released together once their last chunk is in. */
interface LeaseBatch {
  leased: LeasedChunk[];
  unread: number;
  /** Its reads end by then: --kv-timeout-ms from when they start. */
  deadlineMs: number;
  released?: Promise<void>;
}

/**
 * Whose word the chunk ids are, and so what a list that is not the request's own is: a client's
 * handle is the client's error (400); a prefill's announcements fail the load (kv_load_failed, or
 * a recompute when the request asked for one).
 */
interface ListFaults {
  foreign(id: string): Error;
  otherModel(chunk: LeasedChunk["chunk"], fingerprint: string): Error;
  uncovered(problem: string): Error;
}

const HANDLE_FAULTS: ListFaults = {
  foreign: () => new ApiError(400, "invalid_request", "the handle names chunks its request does not hold", "handle.chunk_ids"),
  otherModel: (chunk, fingerprint) =>
    new ApiError(
      400,
      "model_mismatch",
      `chunk ${chunk.id} was made by model ${chunk.modelFingerprint.slice(0, 12)}…, this decode runs ${fingerprint.slice(0, 12)}…`,
      "handle",
    ),
  uncovered: (problem) =>
    new ApiError(400, "invalid_request", `the handle's chunks do not cover the prompt: ${problem}`, "handle.chunk_ids"),
};

const ANNOUNCED_FAULTS: ListFaults = {
  foreign: (id) => new KvLoadError(`the prefill announced chunk ${id}, which its request does not hold`, "corrupt"),
  otherModel: (chunk) => new KvLoadError(`chunk ${chunk.id} was made by model ${chunk.modelFingerprint.slice(0, 12)}…`, "corrupt"),
  uncovered: (problem) => new KvLoadError(`the streamed chunks do not cover the prompt: ${problem}`, "corrupt"),
};

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
      if (!this.ucx)
        throw new Error(
          '--transport ucx: the UCX transport is not built (install libucx-dev and run "npm run build:native" with CTXBANK_UCX=AUTO or ON)',
        );
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
        throw new KvLoadError(
          `chunk ${chunk.id} (tokens ${chunk.tokenStart}..${chunk.tokenEnd}) failed verification: ${e.code}: ${e.message}`,
          "corrupt",
          { cause: e },
        );
      }
      throw e;
    }
  }

  /**
   * Reads every chunk of `handle` into `seq` (capacity >= prompt tokens) and sets its length: the
   * streamed load over a feed that holds the handle's ids. The client named them, so they are
   * checked whole before any byte is read, and a list that is not its request's is a 400.
   * Throws ApiError for a bad or expired handle, KvLoadError when the bytes cannot be had.
   */
  load(handle: Handle, seq: NativeSequence, signal: AbortSignal, rounds?: RoundsLoad): Promise<KvLoadStats> {
    return this.loadFeed(ChunkFeed.of(handle.chunk_ids), { ...handle, rounds }, seq, signal, HANDLE_FAULTS);
  }

  /**
   * Streaming load: reads the chunks of a handle still being prefilled as `feed` announces them,
   * so block i moves while block i+1 computes. Ends when the feed does (the handle came) and every
   * chunk is in. Throws what the feed fails with (the prefill's error), KvLoadError (a chunk the
   * prefill announced that is not its request's fails the load), or ApiError.
   */
  loadStream(feed: ChunkFeed, start: LoadTarget, seq: NativeSequence, signal: AbortSignal): Promise<KvLoadStats> {
    return this.loadFeed(feed, start, seq, signal, ANNOUNCED_FAULTS);
  }

  /**
   * The one load path. The chunks the feed holds are leased together (one statement; while the
   * request's chunk list is looked up beside it when it may not know them yet), checked (the
   * request's own, this model's; once the feed has ended, covering the prompt), then read,
   * verified and imported, kvConcurrency at once; a batch's leases are released as its last chunk
   * is in (whatever is still leased, at the end). The length is set once every chunk verified.
   * Under Round Attention (target.rounds) the chunks above the watershed of earlier rounds are
   * held back until the list ends, then only the picked rounds' are read.
   */
  private async loadFeed(
    feed: ChunkFeed,
    target: LoadTarget,
    seq: NativeSequence,
    signal: AbortSignal,
    faults: ListFaults,
  ): Promise<KvLoadStats> {
    const { registry, config, model } = this.rt;
    const t0 = performance.now();
    prefaultFor(seq, target.prompt_tokens);
    // Stops every read: the caller's abort, the first failure, or an owner declared dead.
    const stop = new AbortController();
    const onAbort = () => stop.abort(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    const ownerDead = new AbortController();
    ownerDead.signal.addEventListener("abort", () => stop.abort(ownerDead.signal.reason), { once: true });
    const reads = new ChunkFeed<{ leased: LeasedChunk; batch: LeaseBatch }>();
    const batches: LeaseBatch[] = [];
    const transports = new Set<string>();
    const watched = new Set<string>();
    const watching: Promise<() => void>[] = [];
    let held = new Set<string>();
    let bytes = 0;
    let promptBytes = 0;
    const n = target.prompt_tokens;
    const rounds = target.rounds;
    // Chunks that wait for the pick (round-chunks.ts), and those read.
    const waiting: { leased: LeasedChunk; batch: LeaseBatch }[] = [];
    const queued: LeasedChunk["chunk"][] = [];

    const lease = async (ids: string[]): Promise<LeaseBatch> => {
      // Looked up beside the lease (one round trip less); a lease failure is reported first.
      const ofRequest = ids.every((id) => held.has(id)) ? undefined : registry.chunks.ofRequest(target.request_id);
      ofRequest?.catch(() => {}); // awaited below, once the leases are held
      let leased: LeasedChunk[];
      try {
        leased = await registry.chunks.acquireRead(ids, config.readLeaseMs);
      } catch (e) {
        throw leaseError(e);
      }
      const batch: LeaseBatch = { leased, unread: leased.length, deadlineMs: Infinity };
      batches.push(batch);
      if (ofRequest) held = new Set((await ofRequest).map((c) => c.id));
      const foreign = leased.find((l) => !held.has(l.chunk.id));
      if (foreign) throw faults.foreign(foreign.chunk.id);
      const otherModel = leased.find((l) => l.chunk.modelFingerprint !== model.fingerprint);
      if (otherModel) throw faults.otherModel(otherModel.chunk, model.fingerprint);
      for (const l of leased) l.location = { ...l.location, capability: this.capability(l, target.request_id) };
      // Looked up while the chunks move: a dead owner is noticed a round trip later at worst.
      watching.push(this.watchOwners(leased, ownerDead, watched));
      return batch;
    };

    const pump = async () => {
      for (let last = false; !last; ) {
        const ids = await feed.take(stop.signal);
        last = ids === undefined || feed.done;
        const batch = ids ? await lease(ids) : undefined;
        const now: { leased: LeasedChunk; batch: LeaseBatch }[] = [];
        for (const leased of batch?.leased ?? []) {
          promptBytes += leased.location.length;
          const c = leased.chunk;
          if (rounds && !chunkNeeded(rounds.layout, n, c.layerIds, c)) waiting.push({ leased, batch: batch! });
          else now.push({ leased, batch: batch! });
        }
        // Every chunk is leased and the pick is known: the waiting chunks of picked rounds are read,
        // the others left in the shard.
        let leftOut: LeftOut | undefined;
        if (last) {
          const picked = rounds?.picked();
          try {
            leftOut = rounds && picked ? leftOutOf(rounds.layout, n, picked) : undefined;
          } catch (e) {
            throw faults.uncovered((e as Error).message);
          }
          for (const w of waiting.splice(0)) {
            const c = w.leased.chunk;
            if (!picked || chunkNeeded(rounds!.layout, n, c.layerIds, c, picked)) now.push(w);
            else if (--w.batch.unread === 0) w.batch.released = this.release(w.batch.leased);
          }
        }
        queued.push(...now.map((r) => r.leased.chunk));
        // The chunks read must cover the prompt but for the rounds left out (a handle's, before any is read).
        const problem = last ? coverageProblem(queued, this.shape, n, leftOut) : null;
        if (problem) throw faults.uncovered(problem);
        if (now.length === 0) continue;
        if (batches.length === 1) await this.rt.config.faults?.pause("decode.load", this.rt.log); // the first leases are held
        const deadline = Date.now() + config.kvTimeoutMs; // their reads start now
        for (const r of now) {
          r.batch.deadlineMs = deadline;
          reads.push(r);
        }
      }
      reads.end();
    };

    const worker = async () => {
      let scratch: Scratch | undefined; // taken with the first chunk: an idle worker keeps no buffer from the others
      try {
        for (;;) {
          const read = await reads.next(stop.signal);
          if (read === undefined || stop.signal.aborted) return;
          const {
            leased: { chunk, location },
            batch,
          } = read;
          const transport = this.pick(location);
          transports.add(transport.name);
          scratch ??= this.scratch.take();
          await this.readAndImport(transport, location, chunk, seq, scratch, {
            deadlineMs: batch.deadlineMs,
            stop: stop.signal,
            ownerDead: ownerDead.signal,
            caller: signal,
          });
          bytes += location.length;
          this.metrics?.transferBytes(transport.name, location.length);
          if (--batch.unread === 0) batch.released = this.release(batch.leased);
        }
      } finally {
        if (scratch) this.scratch.put(scratch);
      }
    };

    try {
      const stopOthers = (run: Promise<void>) =>
        run.catch((e: unknown) => {
          stop.abort(e);
          throw e;
        });
      const settled = await Promise.allSettled([pump(), ...Array.from({ length: config.kvConcurrency }, worker)].map(stopOthers));
      const failure = settled.find((s): s is PromiseRejectedResult => s.status === "rejected");
      if (failure) throw firstCause(settled, failure.reason);
      signal.throwIfAborted();
      seq.setLength(target.prompt_tokens);
      const ms = performance.now() - t0;
      this.totals.loads++;
      this.totals.chunks += queued.length;
      this.totals.bytes += bytes;
      this.totals.ms += ms;
      const transport = usedTransport(transports)!; // the prompt's chunks cover it: at least one was read
      this.metrics?.transferDone(transport, ms / 1000);
      return { transport, chunks: queued.length, bytes, ms, ...(rounds ? { prompt_bytes: promptBytes } : {}) };
    } catch (e) {
      this.totals.failures++;
      if (!signal.aborted) this.countFailure(usedTransport(transports) ?? "none", e);
      throw e;
    } finally {
      signal.removeEventListener("abort", onAbort);
      const unreleased = batches.filter((b) => b.released === undefined).flatMap((b) => b.leased);
      await Promise.all([...batches.map((b) => b.released), unreleased.length > 0 ? this.release(unreleased) : undefined]);
      for (const untrack of await Promise.all(watching)) untrack();
    }
  }

  /** Drops read leases; a failure only leaves them to expire (logged). */
  private release(leased: LeasedChunk[]): Promise<void> {
    return this.rt.registry.chunks.releaseRead(leased.map((l) => l.chunk.id)).then(
      () => undefined,
      (err: unknown) => this.rt.log.warn({ err }, "could not release read leases"),
    );
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

  /**
   * Watches the owners of the chunks not mapped in place (shm reads cannot hang) whose shards are
   * not in `watched` yet (added); returns the function that stops watching them.
   */
  private async watchOwners(leased: LeasedChunk[], ac: AbortController, watched: Set<string>): Promise<() => void> {
    const peers = this.peers;
    if (!peers) return () => {};
    const shardsRead = new Map<string, { shardId: string; epoch: number }>();
    for (const { location: loc } of leased) {
      const key = `${loc.shardId}/${loc.epoch}`;
      if (this.pick(loc) !== this.shm && !watched.has(key)) shardsRead.set(key, { shardId: loc.shardId, epoch: loc.epoch });
    }
    for (const key of shardsRead.keys()) watched.add(key);
    const untracks: Array<() => void> = [];
    for (const { shardId, epoch } of shardsRead.values()) {
      // Unwatched if the registry cannot say: the read's own deadline still bounds it.
      const row = await this.rt.registry.shards
        .get(shardId, epoch)
        .catch((err: unknown) => void this.rt.log.warn({ err, shardId }, "could not look up a shard's owner to watch"));
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

/** The transport a load reports: http when any chunk came over HTTP, else ucx when any came over UCX, else shm; undefined before any read. */
function usedTransport(used: ReadonlySet<string>): KvLoadStats["transport"] | undefined {
  return (["http", "ucx", "shm"] as const).find((t) => used.has(t));
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
