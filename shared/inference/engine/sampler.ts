// Next-token sampling: greedy, or temperature with top-k and top-p (nucleus) filtering, from a
// seeded generator so a request with a seed is reproducible.
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

export function validateSampling(o: SamplingOptions): Required<SamplingOptions> {
  const temperature = o.temperature ?? SAMPLING_DEFAULTS.api.temperature;
  const topK = o.topK ?? SAMPLING_DEFAULTS.api.topK;
  const topP = o.topP ?? SAMPLING_DEFAULTS.api.topP;
  const seed = o.seed ?? Math.floor(Math.random() * 2 ** 32);
  if (!Number.isFinite(temperature) || temperature < 0 || temperature > 10)
    throw new SamplingError("temperature must be a number in [0, 10]", "temperature");
  if (!Number.isInteger(topK) || topK < 0) throw new SamplingError("top_k must be a non-negative integer", "top_k");
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

/** Indices of the k largest logits, best first (k <= length). */
function topIndices(logits: ArrayLike<number>, k: number): number[] {
  if (k >= logits.length) return Array.from({ length: logits.length }, (_, i) => i).sort((a, b) => logits[b]! - logits[a]!);
  // Keep a sorted window of the k best seen so far; cheap for the small k sampling uses.
  const best: number[] = [];
  for (let i = 0; i < logits.length; i++) {
    const v = logits[i]!;
    if (best.length === k && v <= logits[best[k - 1]!]!) continue;
    let pos = best.length === k ? k - 1 : best.length;
    while (pos > 0 && logits[best[pos - 1]!]! < v) pos--;
    best.splice(pos, 0, i);
    if (best.length > k) best.pop();
  }
  return best;
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
    const ids = topIndices(logits, topK === 0 ? logits.length : Math.min(topK, logits.length));
    const max = logits[ids[0]!]!;
    const probs = ids.map((id) => Math.exp((logits[id]! - max) / temperature));
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
}
