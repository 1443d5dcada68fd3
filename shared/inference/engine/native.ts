// Typed access to the native addon (native/build/Release/ctxbank_native.node, or the file
// CTXBANK_ADDON names). Everything heavy returns a promise and runs on the engine's own thread;
// nothing here blocks the event loop.
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

import { completePolicy, type AttentionPolicy, type PolicyPart, type ResolvedPolicy } from "../policy/schema.ts";

export type { AttentionPolicy, ResolvedPolicy } from "../policy/schema.ts";

export interface ModelConfig {
  architecture: string;
  name: string;
  nLayer: number;
  nEmbd: number;
  nHead: number;
  nHeadKv: number;
  headDim: number;
  nFf: number;
  nVocab: number;
  nCtxTrain: number;
  ropeBase: number;
  rmsEps: number;
  tiedOutput: boolean;
  /** KV bytes of one token in every layer (a sliding layer's ring aside: Engine.kvBytes). */
  kvBytesPerToken: number;
  /** Keys a sliding-window layer's query sees (0: no layer slides), and those layers. */
  slidingWindow: number;
  slidingLayers: number[];
}

export interface GgufTensorInfo {
  name: string;
  type: string;
  shape: number[];
  offset: number;
  nBytes: number;
}

export interface GgufInfo {
  version: number;
  fileSize: number;
  headerBytes: number;
  alignment: number;
  tensors: GgufTensorInfo[];
}

export interface NativeModel {
  readonly config: ModelConfig;
  /** CRC-32C of the GGUF's whole tensor data, taken at load (part of the model fingerprint). */
  readonly weightsCrc32c: number;
}

export interface PolicyStats {
  kind: AttentionPolicy["kind"];
  promptLength: number;
  selections: number;
  lazyReuses: number;
  selectedSizes: number[];
  /** OmniKV: each filter layer's current selection (prompt positions, ascending). */
  selected: Int32Array[];
  /** SCOPE (generated tokens) or H2O (all tokens): tokens kept, summed over layers and KV heads. */
  decodePoolTokens: number;
  decodeTokens: number;
  /** Decode steps since the policy was set: KV bytes their attention read (every layer, K and V). */
  decodeKvBytesRead: number;
  /** SCOPE prompt compression: prompt tokens kept, summed over the (layer, KV head) pools. */
  promptPoolTokens: number;
  /** OmniKV: each layer's role; empty under other policies. */
  layerRoles: Array<"dense" | "filter" | "guard" | "sparse">;
  /** OmniKV: per layer, the index into filterLayers of the selection a sparse layer uses, else -1. */
  layerGroups: number[];
}

export interface NativeSequence {
  readonly nPast: number;
  readonly capacity: number;
  readonly kvBytesUsed: number;
  /** The device arena: device-tier KV of the stored tokens plus OmniKV's packed buffers at full budget. */
  readonly deviceBytesUsed: number;
  /** The host bank: the offloaded sparse layers' KV (0 without offload). */
  readonly hostBytesUsed: number;
  /**
   * A reclaiming policy (its `reclaim`) reused evicted tokens' rows: tokens no longer sit by
   * position, so truncate, setLength, exportRows, importRows, importChunk and setPolicy throw
   * (RangeError, code "rows_moved") and a prompt is refused.
   */
  readonly rowsMoved: boolean;
  truncate(n: number): void;
  /** Declares that the first n tokens' K/V were written into kvBuffer() (KV import). */
  setLength(n: number): void;
  /**
   * How decode steps attend (prefill is always full). The binding writes in the schema's defaults
   * (completePolicy) and the addon takes only that complete object. TypeError on a malformed or
   * incomplete policy, RangeError on a setting the model or the algorithm cannot take.
   */
  setPolicy(policy: AttentionPolicy): void;
  readonly policyStats: PolicyStats;
  /** After setPolicy, before the prompt: the policy derives its prompt state as the prompt is cached (SCOPE's kept lists), for exportPromptState. */
  preparePromptStateExport(): void;
  /**
   * Round Attention: the earlier rounds decode steps attend above the watershed, as a prefill
   * picked them (NativeEngine.pickRounds), after the KV import. RangeError unless the policy is
   * rounds and they are ascending indices of the rounds before the current one.
   */
  setRoundPick(rounds: number[]): void;
  /**
   * What the policy derived from the prompt for its decode steps (SCOPE's prompt pool as kept
   * lists, or the queries it is computed from; the OmniKV window selectors' and Round Attention's
   * last queries; native/src/prompt_state.h), for a decode in another process; null when none.
   */
  exportPromptState(): Uint8Array | null;
  /**
   * Loads an exportPromptState() blob after the KV import (setLength). False when it was made for a
   * policy that derives other state (nothing loaded); RangeError when it is malformed.
   */
  importPromptState(bytes: Uint8Array): boolean;
  /**
   * Writes a token-major chunk payload ([token][layer][K|V][kvDim] f16, docs/kv-format.md) into the cache
   * rows it covers; setLength() then declares the length. RangeError when the rows or the payload
   * size do not fit the cache.
   */
  importRows(payload: Uint8Array, layerIds: readonly number[], tokenStart: number, tokenCount: number): void;
  /**
   * importRows of a whole KV chunk (header + payload; its header parsed by the caller), computing
   * the chunk's CRC-32C in the same pass over its bytes; returns that checksum. The rows count only
   * when it equals the header's (a GPU sequence uploads them only then; declare no length otherwise).
   */
  importChunk(chunk: Uint8Array, headerSize: number, layerIds: readonly number[], tokenStart: number, tokenCount: number): number;
  /** The reverse of importRows: cache rows into a token-major payload of exactly the right size. */
  exportRows(into: Uint8Array, layerIds: readonly number[], tokenStart: number, tokenCount: number): void;
  /** Frees the cache's memory now (the sequence is empty afterwards). */
  release(): void;
  /**
   * Commits, on a worker thread, the memory rows [nPast, tokens) will use, without writing them, so
   * an import that follows (importChunk on this thread) does not stop to fault pages in. A hint:
   * resolves false where it did nothing (a GPU sequence, a kernel before Linux 5.14), stops early
   * when the sequence is released meanwhile. RangeError unless 0 <= tokens <= capacity.
   */
  prefault(tokens: number): Promise<boolean>;
  /**
   * The whole f16 cache, zero-copy: layer l's K at element l*2*capacity*kvDim, V after it. Under
   * omnikv offload the sparse layers live in the host bank instead (their range here reads as
   * zeros): use exportRows/importRows, which address either tier. A GPU engine's sequences keep
   * their KV in GPU memory: kvBuffer() throws there; exportRows/importRows work (staged via the host).
   */
  kvBuffer(): ArrayBuffer;
}

export interface ForwardItem {
  seq: NativeSequence;
  tokens: Int32Array;
  /** Receives the next-token logits after the last token (length nVocab). */
  logits?: Float32Array;
  /** One-token items under full attention: per layer, the token's attention over its
   *  nPast + 1 keys averaged over heads, [nLayer][nPast + 1] (calibration). */
  probe?: Float32Array;
  /** Receives the greedy next token (lowest index of the largest logit); on a GPU engine computed
   *  there, so a step that passes no `logits` copies one number per sequence back, not nVocab. */
  argmax?: Int32Array;
}

export interface EngineOptions {
  /** Threads for prefill and large batches. */
  threads?: number;
  /** 1 (default) or `threads`: threads for decode steps of up to 4 tokens. */
  decodeThreads?: number;
  ubatch?: number;
  maxContext?: number;
  /** The device arena one sequence may use (its deviceBytesUsed); 0 = no limit. */
  deviceBudgetBytes?: number;
  /**
   * Where the engine computes: cpu (default), cuda / cuda:N (the CUDA backend; throws an Error
   * with code no_gpu, cuda_driver_too_old or cuda_unavailable_in_build when it cannot), or auto
   * (CUDA when a GPU is usable, else the CPU).
   */
  device?: EngineDevice;
  /** CUDA only: replay each batch shape's layers as a CUDA graph (default false until measured). */
  cudaGraphs?: boolean;
  /**
   * CUDA only: which kernels run: "simple" (default: the reference kernels) or a comma list of
   * fast (every faster variant that has passed on a GPU), fused, matvec, attention,
   * prefill-attention, gemm, fused-decode, pdl (these two not yet run on a GPU). An unknown name throws an Error
   * with code invalid_cuda_kernels.
   */
  cudaKernels?: string;
}

export type EngineDevice = "cpu" | "cuda" | "auto" | `cuda:${number}`;
/** The device strings the engine accepts. */
export const DEVICE_PATTERN = /^(cpu|cuda|auto|cuda:(0|[1-9][0-9]{0,2}))$/;

/** Whether this addon has the CUDA backend, and whether CUDA device 0 can be used here. */
export interface CudaStatus {
  compiled: boolean;
  usable: boolean;
  /** Why not (when not usable): a DeviceErrorCode and its message. */
  code?: DeviceErrorCode;
  message?: string;
}

/** Codes of the Error a device problem throws (err.code). */
export const DEVICE_ERROR_CODES = [
  "invalid_device",
  "invalid_cuda_kernels",
  "cuda_unavailable_in_build",
  "no_gpu",
  "cuda_driver_too_old",
  "cuda_unsupported_gpu",
  "cuda_unsupported_model",
  "cuda_out_of_memory",
  "cuda_error",
] as const;
export type DeviceErrorCode = (typeof DEVICE_ERROR_CODES)[number];

export interface EngineInfo {
  kernels: string;
  threads: number;
  decodeThreads: number;
  ubatch: number;
  maxContext: number;
  deviceBudgetBytes: number;
  /** "cpu" or "cuda:N": where the forward passes run. */
  device: string;
  /** e.g. "CPU, avx512 kernels" or "NVIDIA H100 80GB HBM3, 79.2 GiB, sm_90". */
  deviceDescription: string;
  /** GPU memory the weights take (0 on the CPU). */
  deviceWeightBytes: number;
  /** Whether decode steps replay CUDA graphs (false on the CPU). */
  cudaGraphs: boolean;
  /** The CUDA kernel set in use ("simple", "fast" or a list); "" on the CPU. */
  cudaKernels: string;
  /** Rows of each sliding-window layer's ring in this engine's sequences; 0 when none. */
  ringRows: number;
  /** Bytes of weights a one-token step reads (every layer's matrices and the output matrix): a decode step's memory floor. */
  weightBytesPerToken: number;
}

export interface NativeEngine {
  readonly info: EngineInfo;
  createSequence(capacity?: number, ringBatch?: number): NativeSequence;
  forward(items: ForwardItem[]): Promise<void>;
  /** Round Attention's pick over the prompt `seq` holds (ascending indices of earlier rounds), on the engine's thread; RangeError unless its policy is rounds. */
  pickRounds(seq: NativeSequence): Promise<number[]>;
  /** KV bytes a sequence of this engine holds with n tokens (each sliding layer's ring at most; each global layer's globalRows at most, when given). */
  kvBytes(nTokens: number, ringBatch?: number, globalRows?: number): number;
}

interface Addon {
  readGgufMetadata(path: string): Record<string, unknown>;
  ggufInfo(path: string): GgufInfo;
  loadModel(path: string): Promise<NativeModel>;
  mapFile(path: string, offset: number, length: number, expectId?: string, populate?: boolean): ArrayBuffer;
  populateMapped(buffer: ArrayBuffer, offset: number, length: number): Promise<void>;
  punchHole(fd: number, offset: number, length: number): boolean;
  unmapFile(buffer: ArrayBuffer): void;
  crc32c(bytes: Uint8Array, prev?: number): number;
  cudaStatus(): CudaStatus;
  kvPool(limitBytes?: number): KvPoolStats;
  /** Memory read bandwidth of `threads` threads streaming `mib` MiB, fastest of `passes` passes (native/src/membw.h). */
  measureReadBandwidth(threads: number, mib: number, passes: number): Promise<ReadBandwidth>;
  /** The policy fields the addon parses, per sub-object (camelCase): the schema's, see test/engine/policy-schema.test.ts. */
  policyFields(): Record<PolicyPart, string[]>;
  /** setCompletePolicy takes complete policies only; this module gives every sequence setPolicy over it. */
  NativeSequence: { prototype: { setCompletePolicy(policy: ResolvedPolicy): void; setPolicy?(policy: AttentionPolicy): void } };
  NativeEngine: new (model: NativeModel, options?: EngineOptions) => NativeEngine;
}

/** The engine's addon file (the UCX transport's addon, ctxbank_ucx.node, lies beside it). */
export const nativeAddonPath =
  process.env.CTXBANK_ADDON ?? fileURLToPath(new URL("../../../native/build/Release/ctxbank_native.node", import.meta.url));

function loadAddon(): Addon {
  if (!existsSync(nativeAddonPath)) {
    throw new Error(`native engine not built (${nativeAddonPath} is missing): run "npm run build:native"`);
  }
  const a = createRequire(import.meta.url)(nativeAddonPath) as Addon;
  // The addon holds no defaults and refuses an incomplete policy: every sequence's setPolicy
  // goes through the schema first, which writes them in (shared/inference/defaults.ts).
  a.NativeSequence.prototype.setPolicy = function (policy: AttentionPolicy) {
    this.setCompletePolicy(completePolicy(policy));
  };
  return a;
}

let cached: Addon | undefined;
export function addon(): Addon {
  cached ??= loadAddon();
  return cached;
}

export function cudaStatus(): CudaStatus {
  return addon().cudaStatus();
}

/** A memory read bandwidth measurement (native/src/membw.h): GB/s of the fastest pass. */
export interface ReadBandwidth {
  gbPerS: number;
  /** Bytes read per pass. */
  bytes: number;
  passes: number;
  threads: number;
}

/** The process's pool of recycled KV cache memory (native/src/kv_pool.h). */
export interface KvPoolStats {
  /** Resident bytes the pool may hold; 0: off. */
  limitBytes: number;
  readyRegions: number;
  /** Zeroed, resident bytes waiting for a sequence. */
  readyBytes: number;
  /** New sequences that got pooled memory, and those that found none ready. */
  takes: number;
  misses: number;
}

/**
 * The KV memory pool's state; with `limitBytes`, sets its limit first (0 turns it off and
 * returns what it holds to the OS).
 */
export function kvPool(limitBytes?: number): KvPoolStats {
  return addon().kvPool(limitBytes);
}

/** Every metadata key of a GGUF file. Throws a clear "gguf: ..." error for a bad file. */
export function readGgufMetadata(path: string): Record<string, unknown> {
  return addon().readGgufMetadata(path);
}

export function ggufInfo(path: string): GgufInfo {
  return addon().ggufInfo(path);
}

/**
 * A zero-copy view of bytes [offset, offset + length) of a file (mmap; private, so writes never
 * reach the file). Throws an Error naming the file and the reason when it cannot be mapped. Hand
 * the buffer to unmapFile() when done: that detaches it (views become empty) and unmaps at once.
 * The pages are mapped in up front unless `populate` is false (then populateMapped() does it).
 */
export function mapFile(path: string, offset: number, length: number, expectId?: string, populate = true): ArrayBuffer {
  return addon().mapFile(path, offset, length, expectId, populate);
}

/**
 * Maps in the pages behind bytes [offset, offset + length) of a live mapFile() buffer on a worker
 * thread (best effort), so the reader's later pass takes no page faults. The buffer must stay
 * mapped until the promise settles.
 */
export function populateMapped(buffer: ArrayBuffer, offset: number, length: number): Promise<void> {
  return addon().populateMapped(buffer, offset, length);
}

/**
 * Returns the whole pages inside [offset, offset + length) of the open file `fd` to the system
 * (fallocate punch hole, size kept; the range then reads as zeros). false where the file system
 * cannot punch holes.
 */
export function punchHole(fd: number, offset: number, length: number): boolean {
  return addon().punchHole(fd, offset, length);
}

export function unmapFile(buffer: ArrayBuffer): void {
  addon().unmapFile(buffer);
}

/** CRC-32C (Castagnoli) of `bytes`, continuing `prev` (a previous result; 0 to start), like zlib.crc32. */
export function crc32c(bytes: Uint8Array, prev = 0): number {
  return addon().crc32c(bytes, prev);
}
