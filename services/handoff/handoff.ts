// The KV handoff's interface, after vLLM's KV connector: one interface in two halves, each service
// using its own. The owner half (the prefill's; vLLM's scheduler side) keeps a prompt's KV where a
// decode can have it while the prompt is computed; the reader half (the decode's; vLLM's worker
// side) turns a prefilled prompt into a sequence holding its KV. Two implementations: the shard
// handoff (owner.ts writes layer-packed chunks into the prefill's host-memory shard,
// shard-handoff.ts has the decode lease and read them over shm, HTTP or UCX) and the in-process
// handoff of `serve` (in-process.ts: the prefill's sequence itself passes to the decode, nothing is
// written or read; its owner half is the prefill service, InProcessPrefill).
import type { Logger } from "pino";
import type { NativeSequence } from "../../shared/inference/engine/engine.ts";
import type { ResolvedPolicy } from "../../shared/inference/policy/request.ts";
import type { PrefillRequest } from "../../shared/platform/http/wire.ts";
import type { FairQueue } from "../../shared/platform/queue/fair-queue.ts";
import type { RequestPlan } from "../request-plan.ts";
import type { InPlaceChunkSource } from "./chunk-route.ts";
import type { Handle, KvSummary, PromptHandle } from "./handle.ts";
import type { HandleProgress } from "./handle-stream.ts";
import type { KvLoader } from "./reader.ts";
import type { RoundsLayout } from "./round-chunks.ts";

/** Computes prompt tokens into `seq` (a micro-batch, or a whole prompt); the next-token logits. */
export type PromptCompute = (seq: NativeSequence, tokens: ArrayLike<number>, signal: AbortSignal) => Promise<Float32Array>;

// ---- The owner half: the prefill's ----

export interface HandoffOwner {
  /** Starts the first epoch of the shard and the periodic reaping and sweeping. */
  start(): Promise<void>;
  /** A new epoch (the registry declared this instance dead and it registered again): the old one's chunks are gone. */
  newEpoch(): Promise<void>;
  /**
   * Opens the handoff of a prompt about to be computed: room for every chunk is reserved now, so
   * a full shard (or the tenant over its share) is a 429 before any compute. With `progress`, each
   * chunk is announced as it commits (the streamed handle).
   */
  open(prompt: OwnedPrompt, progress?: HandleProgress): Promise<PromptHandoff>;
  /** For the chunk route: the shard with this id, if it is this owner's. */
  chunkSource(shardId: string): InPlaceChunkSource | undefined;
  status(): OwnerStatus;
  /** Waits (until `deadline`) for the decodes reading the shard. */
  drain(deadline: number): Promise<void>;
  /** Retires the shard (its chunks fail: the bytes die with it) and deletes it. */
  stop(): Promise<void>;
}

/** A prompt whose KV is handed over, as the prefill knows it. */
export interface OwnedPrompt {
  requestId: string;
  /** Its API key's id: its share of the shard, and its chunk keys' salt. */
  tenant: string;
  tokens: number[];
  /** The layer groups the chunks are packed by (the policy's). */
  layerGroups: number[][];
  /** Under Round Attention, the rounds: no chunk spans two (round-chunks.ts). */
  rounds?: RoundsLayout | undefined;
  /** Recorded on the chunk rows. */
  sessionId: string | null;
  roundId: number | null;
  /** What the streamed handle's start says of the prompt besides where its KV is: the plan's policy, as handed on and as resolved. */
  policy: Handle["policy"];
  resolvedPolicy: Handle["resolved_policy"];
  sampling: Handle["sampling"];
}

/** One prompt's KV on its way to the owner's shard. */
export interface PromptHandoff {
  /** After each micro-batch: writes every block `seq` has computed whole (causal attention: final). */
  computed(seq: NativeSequence): Promise<void>;
  /**
   * The prompt is computed: waits for its chunks and keeps them for the decode from now (unless
   * `signal` was aborted meanwhile: nobody to keep them for). Where they are, for the handle.
   */
  finish(signal: AbortSignal): Promise<PlacedKv>;
  /** The prefill failed: waits for the writes in flight and frees the room nothing was written to. */
  abandon(): Promise<void>;
}

/** The handle's fields that say where a prompt's KV is. */
export type PlacedKv = Pick<Handle, "chunk_ids" | "shard_id" | "shard_epoch" | "layer_groups" | "block_tokens" | "expires_at">;

export interface OwnerStatus {
  shard: { id: string; epoch: number; bytes: number; bytes_used: number; bytes_free: number; largest_free: number } | null;
  totals: { chunks_written: number; chunks_reused: number; bytes_written: number; ranges_reclaimed: number };
}

// ---- The reader half: the decode's ----

export interface HandoffReader {
  /**
   * The decode's own request: `body` prefilled (in this process, or by a prefill instance) and
   * handed over as soon as its first token is known. Throws the prefill's error (ApiError), or
   * KvLoadError when the KV failed to load before the handle came.
   */
  prefill(body: PrefillRequest, own: OwnRequest, signal: AbortSignal, log: Logger): Promise<Handover>;
  /** A client's handle (POST /v1/decode): its KV always comes through the prefill's shard. */
  accept(handle: Handle, onKvFailure: KvFailureChoice): Handover;
  /** Calls to prefill instances, waiting and in flight (fair across keys). */
  readonly prefillCalls: FairQueue;
  status(): ReaderStatus;
  close(): Promise<void>;
}

/** When the KV cannot be loaded: fail the request (502 kv_load_failed), or prefill the prompt here. */
export type KvFailureChoice = "fail" | "recompute";

/** The decode's own request, as the reader half needs it. */
export interface OwnRequest {
  tenant: string;
  onKvFailure: KvFailureChoice;
  /** The request as the decode planned it (a session's turn): an in-process prefill computes it so; a prefill instance plans `body` itself. */
  plan?: RequestPlan | undefined;
  /** The decode's sequence for the prompt, once the prefill announced it (a streamed load asks at its start). */
  sequencePlan: PlanSequence;
}

/** The decode's sequence for a prefilled prompt: room for its answer, and the policy it attends with (the handle's, as the prefill resolved it). */
export type PlanSequence = (prompt: Pick<Handle, "prompt_tokens" | "policy" | "resolved_policy">) => SequencePlan;

export interface SequencePlan {
  capacity: number;
  policy: ResolvedPolicy;
}

/** A prompt handed to the decode: its handle (and first token) now, its KV in a sequence when `load` resolves. */
export interface Handover {
  /** local: the decode computed the prompt itself (services/decode/local-prefill.ts). */
  readonly path: "in_process" | "shard" | "local";
  readonly handle: PromptHandle;
  /** The policy the handover's sequence runs already (in process, streamed); undefined: the decode's to choose. */
  readonly policy: ResolvedPolicy | undefined;
  /** Its sequence's ring batch (SequenceOptions.ringBatch; undefined: the engine's micro-batch), for the KV the decode reserves. */
  readonly ringBatch: number | undefined;
  /**
   * The sequence the prompt's KV is (or goes) into, with the plan's room and policy: the
   * handover's own when it has one, else a new one (the engine's one validation of the policy:
   * PolicyError). The caller owns it from here.
   */
  sequence(plan: SequencePlan): NativeSequence;
  /**
   * The prompt's KV in the sequence: how it came, and what the decode goes without. Throws
   * KvLoadError when it cannot be had (and no recompute was asked), ApiError for a bad or expired handle.
   */
  load(signal: AbortSignal, log: Logger): Promise<LoadedKv>;
  /** Frees what the handover still holds (a load in flight, a sequence nobody took). */
  dispose(): Promise<void>;
}

export interface LoadedKv {
  kv: KvSummary;
  /** What the decode attends without (the prompt state the handle lacked), for the answer. */
  warnings: string[];
  /** Tokens from 0 that every layer holds, when fewer than the prompt's (Round Attention left rounds behind): a session parks no more. */
  wholeTokens?: number;
}

export interface ReaderStatus {
  kv_loads: KvLoader["totals"];
  prefill_calls: number;
  recomputed: number;
  in_process: number;
}

/**
 * The owner half of the in-process handoff: the prefill service computes the prompt into a
 * sequence with room for the answer and the decode policy set before the prompt, and hands it
 * over as it is (the caller owns it).
 */
export interface InProcessPrefill {
  prefillInProcess(
    req: PrefillRequest,
    plan: RequestPlan | undefined,
    signal: AbortSignal,
    log: Logger,
    tenant: string,
  ): Promise<{ handle: PromptHandle; seq: NativeSequence; policy: ResolvedPolicy }>;
}
