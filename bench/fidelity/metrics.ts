// Fidelity of a decode policy against full attention (docs/algorithms.md, evaluation tasks): greedy-token agreement, first
// divergence, and next-token KL(full || policy) under teacher forcing.

/** Share of positions where the two greedy sequences hold the same token (over `ref`'s length). */
export function tokenAgreement(ref: readonly number[], out: readonly number[]): number {
  if (ref.length === 0) return 1;
  let same = 0;
  for (let i = 0; i < ref.length; i++) if (out[i] === ref[i]) same++;
  return same / ref.length;
}

/** Index of the first position where they differ; null when `out` matches `ref` throughout. */
export function firstDivergence(ref: readonly number[], out: readonly number[]): number | null {
  for (let i = 0; i < ref.length; i++) if (out[i] !== ref[i]) return i;
  return null;
}

/** log-softmax of logits, in float64 accumulation, stored as float32. */
export function logSoftmax(logits: ArrayLike<number>): Float32Array {
  let max = -Infinity;
  for (let i = 0; i < logits.length; i++) if (logits[i]! > max) max = logits[i]!;
  let sum = 0;
  for (let i = 0; i < logits.length; i++) sum += Math.exp(logits[i]! - max);
  const lse = max + Math.log(sum);
  const out = new Float32Array(logits.length);
  for (let i = 0; i < logits.length; i++) out[i] = logits[i]! - lse;
  return out;
}

/** KL(p || q) in nats over the full vocabulary, from log-probabilities. */
export function klDivergence(logP: ArrayLike<number>, logQ: ArrayLike<number>): number {
  let kl = 0;
  for (let i = 0; i < logP.length; i++) {
    const lp = logP[i]!;
    if (lp < -80) continue; // p < 1e-35: no mass
    kl += Math.exp(lp) * (lp - logQ[i]!);
  }
  return Math.max(0, kl);
}

export function mean(xs: readonly number[]): number {
  return xs.length === 0 ? 0 : xs.reduce((a, b) => a + b, 0) / xs.length;
}
