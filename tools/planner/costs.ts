// Fu's four costs of long context (docs/algorithms.md, serving figures) for a model on given hardware, and a DistServe-style
// replica plan: how many prefill and decode instances a workload needs at a rate under its SLOs.
// Pure functions; every input is explicit.
import { exponential, seededRng } from "../lib/random.ts";
import type { ModelFacts } from "./model.ts";

export interface Hardware {
  /** Sustained FLOP/s of a prefill (the engine's threads). */
  flops: number;
  /** Memory read bandwidth a decode step sees, bytes/s. */
  memBw: number;
  /** Memory for weights + KV ("device" memory), bytes. */
  memBytes: number;
  /** Host link bandwidth for moving KV (context switch / prefill → decode handoff), bytes/s. */
  linkBw: number;
  /**
   * Compute rate of small decode batches when they run on fewer threads than a prefill (ctxbank
   * runs steps of up to 4 tokens on one thread): the compute side of the decode roofline. Absent:
   * decode is bandwidth-bound only (Fu's formula); larger batches compute at `flops`.
   */
  decodeFlops?: { rate: number; upToBatch: number };
}

export interface Workload {
  promptTokens: number;
  outputTokens: number;
  /** Requests per second. */
  rate: number;
  sloTtftMs: number;
  sloTpotMs: number;
}

export const kvBytes = (m: ModelFacts, tokens: number) => tokens * m.kvBytesPerToken;

/** Concurrency bound by memory: floor((M − weights) / KV(N)), N = the tokens a sequence holds. */
export function maxConcurrency(m: ModelFacts, hw: Hardware, tokens: number): number {
  return Math.max(0, Math.floor((hw.memBytes - m.weightBytes) / kvBytes(m, tokens)));
}

/**
 * Prefill FLOPs of an n-token prompt: 2·P·n for the block matrices, 2·L·n²·H·d for causal
 * attention (QKᵀ and AV over the lower triangle), and the output head once (the last token's
 * logits; the embedding is a lookup, not a product).
 */
export function prefillFlops(m: ModelFacts, n: number): number {
  return 2 * m.blockParams * n + 2 * m.nLayer * n * n * m.nHead * m.headDim + 2 * m.outputParams;
}

export const prefillSeconds = (m: ModelFacts, hw: Hardware, n: number) => prefillFlops(m, n) / hw.flops;

/** FLOPs of one decode token at context n (for the compute side of the roofline at large batches). */
export function decodeFlops(m: ModelFacts, n: number): number {
  return 2 * m.blockParams + 2 * m.outputParams + 4 * m.nLayer * n * m.nHead * m.headDim;
}

/** Fu's decode cost: a step reads the weights once and each sequence's KV once, (W + B·KV(n)) / BW. */
export function decodeMemorySeconds(m: ModelFacts, hw: Hardware, n: number, batch = 1): number {
  return (m.weightBytes + batch * kvBytes(m, n)) / hw.memBw;
}

/** The step's FLOPs at the rate its threads compute. */
export function decodeComputeSeconds(m: ModelFacts, hw: Hardware, n: number, batch = 1): number {
  const rate = hw.decodeFlops && batch <= hw.decodeFlops.upToBatch ? hw.decodeFlops.rate : hw.flops;
  return (batch * decodeFlops(m, n)) / rate;
}

/**
 * Time of one decode step for `batch` sequences at context n: a roofline, the larger of the
 * memory time (at batch 1 Fu's (weight_bytes + KV_bytes(N)) / BW) and the compute time.
 */
export function decodeStepSeconds(m: ModelFacts, hw: Hardware, n: number, batch = 1): number {
  return Math.max(decodeMemorySeconds(m, hw, n, batch), decodeComputeSeconds(m, hw, n, batch));
}

/** Context switch: moving one sequence's KV over the host link. */
export const contextSwitchSeconds = (m: ModelFacts, hw: Hardware, n: number) => kvBytes(m, n) / hw.linkBw;

export interface FourCosts {
  kvBytes: number;
  concurrency: number;
  prefillS: number;
  decodeStepS: number;
  contextSwitchS: number;
}

/** The four costs for a prompt of n tokens (KV held for n + out tokens). */
export function fourCosts(m: ModelFacts, hw: Hardware, n: number, out = 0): FourCosts {
  return {
    kvBytes: kvBytes(m, n),
    concurrency: maxConcurrency(m, hw, n + out),
    prefillS: prefillSeconds(m, hw, n),
    decodeStepS: decodeStepSeconds(m, hw, n),
    contextSwitchS: contextSwitchSeconds(m, hw, n),
  };
}

// --- Queueing: the highest rate one instance of each phase serves within its SLO ---------------

/**
 * p-quantile of the time in system of an M/D/1 queue (Poisson arrivals at `rate`, service time
 * `service` s, one at a time, FIFO): Lindley's recursion over `samples` seeded arrivals. Infinity
 * at or above saturation. Deterministic for a given seed, and monotone in the rate (common
 * random numbers).
 */
export function md1Quantile(rate: number, service: number, q: number, samples = 40_000, seed = 12345): number {
  if (rate * service >= 1) return Infinity;
  const rng = seededRng(seed);
  const times = new Float64Array(samples);
  let wait = 0;
  for (let i = 0; i < samples; i++) {
    const gap = exponential(rng, rate);
    wait = i === 0 ? 0 : Math.max(0, wait + service - gap);
    times[i] = wait + service;
  }
  times.sort();
  return times[Math.min(samples - 1, Math.floor(q * samples))]!;
}

/**
 * Highest Poisson rate one prefill instance serves with the q-quantile of TTFT within the SLO
 * (DistServe: attainment q). TTFT = queueing + the prefill; 0 when even an idle instance misses.
 */
export function prefillMaxRate(prefillS: number, sloTtftS: number, q = 0.9): number {
  if (prefillS > sloTtftS) return 0;
  let lo = 0;
  let hi = 1 / prefillS;
  for (let i = 0; i < 50; i++) {
    const mid = (lo + hi) / 2;
    if (md1Quantile(mid, prefillS, q) <= sloTtftS) lo = mid;
    else hi = mid;
  }
  return lo;
}

export interface DecodePlan {
  /** Largest batch the TPOT SLO, memory and maxBatch allow. */
  batch: number;
  /** TPOT at that batch (step time + the KV handoff spread over the tokens), s. */
  tpotS: number;
  /** Highest rate one decode instance sustains: batch / (out · step time) (Little's law). */
  maxRate: number;
  limitedBy: "tpot" | "memory" | "max-batch";
}

/**
 * One decode instance under continuous batching: each request holds a slot for its `out` steps;
 * step time t(B) at average context n + out/2. By Little's law B = rate · out · t(B), so the
 * highest rate is Bm / (out · t(Bm)) at the largest batch Bm with t(B*) + handoff/(out−1) within
 * the TPOT SLO, memory (concurrency) and maxBatch.
 */
export function decodeMaxRate(m: ModelFacts, hw: Hardware, w: Workload, o: { maxBatch: number; handoffS?: number }): DecodePlan {
  const ctx = w.promptTokens + w.outputTokens / 2;
  const handoff = (o.handoffS ?? 0) / Math.max(1, w.outputTokens - 1);
  const memCap = maxConcurrency(m, hw, w.promptTokens + w.outputTokens);
  const cap = Math.min(o.maxBatch, memCap);
  let batch = 0;
  for (let b = 1; b <= cap; b++) {
    if (decodeStepSeconds(m, hw, ctx, b) + handoff <= w.sloTpotMs / 1000) batch = b;
    else break;
  }
  if (batch === 0)
    return { batch: 0, tpotS: decodeStepSeconds(m, hw, ctx, 1) + handoff, maxRate: 0, limitedBy: cap === 0 ? "memory" : "tpot" };
  const step = decodeStepSeconds(m, hw, ctx, batch);
  const limitedBy = batch < cap ? "tpot" : cap === o.maxBatch && o.maxBatch <= memCap ? "max-batch" : "memory";
  return { batch, tpotS: step + handoff, maxRate: batch / (w.outputTokens * step), limitedBy };
}

export interface ReplicaPlan {
  prefillMaxRate: number;
  decode: DecodePlan;
  prefillReplicas: number;
  decodeReplicas: number;
  /** "P:D" */
  ratio: string;
  /** Highest rate one prefill + one decode instance serve (the lower of the two). */
  onePairMaxRate: number;
}

/** DistServe-style: instances of each phase needed for the workload's rate under its SLOs. */
export function replicaPlan(
  m: ModelFacts,
  hw: Hardware,
  w: Workload,
  o: { maxBatch: number; handoffS?: number; attainment?: number },
): ReplicaPlan {
  const pRate = prefillMaxRate(prefillSeconds(m, hw, w.promptTokens), w.sloTtftMs / 1000, o.attainment ?? 0.9);
  const decode = decodeMaxRate(m, hw, w, o);
  const replicas = (cap: number) => (cap > 0 ? Math.ceil(w.rate / cap) : Infinity);
  const p = replicas(pRate);
  const d = replicas(decode.maxRate);
  return {
    prefillMaxRate: pRate,
    decode,
    prefillReplicas: p,
    decodeReplicas: d,
    ratio: `${p}:${d}`,
    onePairMaxRate: Math.min(pRate, decode.maxRate),
  };
}
