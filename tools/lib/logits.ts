// Comparisons of next-token distributions.

// The engine's own greedy choice (the first of equal maxima), so tests and tools pick as it does.
export { argmax } from "../../shared/inference/engine/sampler.ts";

/** The k largest entries, best first. */
export function topK(x: ArrayLike<number>, k: number): number[] {
  return Array.from({ length: x.length }, (_, i) => i)
    .sort((a, b) => x[b]! - x[a]!)
    .slice(0, k);
}

export function logSoftmax(x: ArrayLike<number>): Float64Array {
  let max = -Infinity;
  for (let i = 0; i < x.length; i++) max = Math.max(max, x[i]!);
  let sum = 0;
  for (let i = 0; i < x.length; i++) sum += Math.exp(x[i]! - max);
  const lse = max + Math.log(sum);
  return Float64Array.from({ length: x.length }, (_, i) => x[i]! - lse);
}

/** KL(p || q) in nats between the softmax distributions of two logit vectors. */
export function klDivergence(pLogits: ArrayLike<number>, qLogits: ArrayLike<number>): number {
  const lp = logSoftmax(pLogits),
    lq = logSoftmax(qLogits);
  let kl = 0;
  for (let i = 0; i < lp.length; i++) kl += Math.exp(lp[i]!) * (lp[i]! - lq[i]!);
  return kl;
}

export function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

export function meanAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += Math.abs(a[i]! - b[i]!);
  return s / a.length;
}

/**
 * The logits less their mean. Softmax is unchanged by adding one constant to a row, and two
 * engines' rows often differ mostly by such a constant (a shift of the final hidden state along
 * the output matrix's mean row): compare centred rows so the tolerances measure what sampling sees.
 */
export function centred(a: ArrayLike<number>): Float32Array {
  let mean = 0;
  for (let i = 0; i < a.length; i++) mean += a[i]!;
  mean /= a.length;
  return Float32Array.from(a as ArrayLike<number>, (x) => x - mean);
}

/** Gap between the best and second-best logit: how close a greedy choice is to a tie. */
export function top2Margin(x: ArrayLike<number>): number {
  const [a, b] = topK(x, 2);
  return x[a!]! - x[b!]!;
}
