// Next-token sampling: greedy, or temperature with top-k and top-p (nucleus) filtering, from a
// seeded generator so a request with a seed is reproducible. Sampling runs on the event loop once
// per generated token, so its work is bounded by the vocabulary, never by vocabulary x k: the
// candidates are found by selection (O(vocab)) and only they are sorted.
import { SAMPLING_DEFAULTS } from "../defaults.ts";

import { CtxbankError } from "../errors.ts";

export interface SamplingOptions {
  /** 0 = greedy (argmax). */
  temperature?: number;
  /** Keep the k most likely tokens; 0 = no limit. */
  topK?: number;
  /** Keep the smallest set of tokens whose probability reaches p. */
  topP?: number;
  seed?: number;
}

/** Sampling options out of range: a client's mistake (code invalid_request, param the option). */
export class SamplingError extends CtxbankError<"invalid_request"> {
  static override readonly codes = ["invalid_request"] as const;
  override readonly name = "SamplingError";
  constructor(message: string, param: string) {
    super("invalid_request", message, { param });
  }
}

/** The largest top_k accepted: sampling sorts at most this many candidates per token. 0 = no limit. */
export const MAX_TOP_K = 1000;

export function validateSampling(o: SamplingOptions): Required<SamplingOptions> {
  const temperature = o.temperature ?? SAMPLING_DEFAULTS.api.temperature;
  const topK = o.topK ?? SAMPLING_DEFAULTS.api.topK;
  const topP = o.topP ?? SAMPLING_DEFAULTS.api.topP;
  const seed = o.seed ?? Math.floor(Math.random() * 2 ** 32);
  if (!Number.isFinite(temperature) || temperature < 0 || temperature > 10)
    throw new SamplingError("temperature must be a number in [0, 10]", "temperature");
  if (!Number.isInteger(topK) || topK < 0 || topK > MAX_TOP_K)
    throw new SamplingError(`top_k must be an integer in [0, ${MAX_TOP_K}] (0 = no limit)`, "top_k");
  if (!Number.isFinite(topP) || topP <= 0 || topP > 1) throw new SamplingError("top_p must be in (0, 1]", "top_p");
  if (!Number.isInteger(seed) || seed < 0 || seed >= 2 ** 32) throw new SamplingError("seed must be an integer in [0, 2^32)", "seed");
  return { temperature, topK, topP, seed };
}

/** xoshiro128** (Blackman and Vigna): small, fast, good statistical quality. */
export class Rng {
  private s = new Uint32Array(4);
  constructor(seed: number) {
    // splitmix32 expands the seed into the four state words.
    let z = seed >>> 0;
    for (let i = 0; i < 4; i++) {
      z = (z + 0x9e3779b9) >>> 0;
      let t = z;
      t = Math.imul(t ^ (t >>> 16), 0x85ebca6b);
      t = Math.imul(t ^ (t >>> 13), 0xc2b2ae35);
      this.s[i] = (t ^ (t >>> 16)) >>> 0;
    }
  }
  /** Uniform in [0, 1). */
  next(): number {
    const s = this.s;
    const result = Math.imul(rotl(Math.imul(s[1]!, 5), 7), 9) >>> 0;
    const t = (s[1]! << 9) >>> 0;
    s[2]! ^= s[0]!;
    s[3]! ^= s[1]!;
    s[1]! ^= s[2]!;
    s[0]! ^= s[3]!;
    s[2]! ^= t;
    s[3] = rotl(s[3]!, 11);
    return result / 2 ** 32;
  }
}

function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}

export function argmax(logits: ArrayLike<number>): number {
  let best = 0;
  for (let i = 1; i < logits.length; i++) if (logits[i]! > logits[best]!) best = i;
  return best;
}

/** Whether token a ranks before token b: the larger logit, then the lower id (a strict total order, so a seed's choice is reproducible). */
function ranksBefore(logits: ArrayLike<number>, a: number, b: number): boolean {
  const x = logits[a]!,
    y = logits[b]!;
  return x > y || (x === y && a < b);
}

/**
 * Indices of the k best-ranked tokens, best first (1 <= k <= length): quickselect moves them to
 * the front of an index array in O(length), then only those k are sorted.
 */
export function topIndices(logits: ArrayLike<number>, k: number): Int32Array {
  const n = logits.length;
  const idx = new Int32Array(n);
  for (let i = 0; i < n; i++) idx[i] = i;
  let lo = 0,
    hi = n - 1;
  while (lo < hi) {
    // Median of three as the pivot; Hoare partition around it.
    const mid = (lo + hi) >>> 1;
    const [a, b, c] = [idx[lo]!, idx[mid]!, idx[hi]!];
    const pivot = ranksBefore(logits, a, b)
      ? ranksBefore(logits, b, c)
        ? b
        : ranksBefore(logits, a, c)
          ? c
          : a
      : ranksBefore(logits, a, c)
        ? a
        : ranksBefore(logits, b, c)
          ? c
          : b;
    let i = lo,
      j = hi;
    while (i <= j) {
      while (ranksBefore(logits, idx[i]!, pivot)) i++;
      while (ranksBefore(logits, pivot, idx[j]!)) j--;
      if (i <= j) {
        const t = idx[i]!;
        idx[i++] = idx[j]!;
        idx[j--] = t;
      }
    }
    if (k - 1 <= j) hi = j;
    else if (k - 1 >= i) lo = i;
    else break;
  }
  return idx.subarray(0, k).sort((a, b) => (ranksBefore(logits, a, b) ? -1 : 1));
}

export class Sampler {
  readonly options: Required<SamplingOptions>;
  private rng: Rng;

  constructor(options: SamplingOptions = {}) {
    this.options = validateSampling(options);
    this.rng = new Rng(this.options.seed);
  }

  sample(logits: ArrayLike<number>): number {
    const { temperature, topK, topP } = this.options;
    if (temperature === 0) return argmax(logits);
    if (topK === 0 && topP === 1) return this.sampleAll(logits);
    // Candidates best first: top_k of them, or (no top_k, a nucleus) a window that doubles until
    // it holds top_p of the mass — a few dozen tokens for a peaked distribution.
    let ids = topIndices(logits, topK === 0 ? Math.min(64, logits.length) : Math.min(topK, logits.length));
    const max = logits[ids[0]!]!;
    const weight = (id: number) => Math.exp((logits[id]! - max) / temperature);
    if (topK === 0) {
      let total = 0;
      for (let i = 0; i < logits.length; i++) total += weight(i);
      for (;;) {
        let mass = 0;
        for (const id of ids) mass += weight(id);
        if (mass >= topP * total || ids.length === logits.length) break;
        ids = topIndices(logits, Math.min(2 * ids.length, logits.length));
      }
    }
    const probs = Array.from(ids, weight);
    const total = probs.reduce((a, b) => a + b, 0);
    // Nucleus: the shortest prefix (already sorted) whose mass reaches topP.
    let keep = ids.length;
    if (topP < 1) {
      let mass = 0;
      for (let i = 0; i < ids.length; i++) {
        mass += probs[i]! / total;
        if (mass >= topP) {
          keep = i + 1;
          break;
        }
      }
    }
    const kept = probs.slice(0, keep).reduce((a, b) => a + b, 0);
    let r = this.rng.next() * kept;
    for (let i = 0; i < keep; i++) {
      r -= probs[i]!;
      if (r < 0) return ids[i]!;
    }
    return ids[keep - 1]!;
  }

  /** No top-k, no nucleus: one pass over softmax(logits / T), nothing sorted. */
  private sampleAll(logits: ArrayLike<number>): number {
    const { temperature } = this.options;
    const max = logits[argmax(logits)]!;
    let total = 0;
    for (let i = 0; i < logits.length; i++) total += Math.exp((logits[i]! - max) / temperature);
    let r = this.rng.next() * total;
    let last = 0;
    for (let i = 0; i < logits.length; i++) {
      const w = Math.exp((logits[i]! - max) / temperature);
      if (w === 0) continue;
      last = i;
      r -= w;
      if (r < 0) return i;
    }
    return last;
  }
}
