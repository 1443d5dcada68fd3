// SLO-aware admission (DESIGN "Serving behaviour"): before a prefill is queued, predict its TTFT
// from the prompt tokens already waiting or running ahead of it and a running estimate of prefill
// throughput, and refuse it (429 slo_unattainable) when the prediction misses the TTFT objective
// by more than the configured margin. Refusing early is kinder than answering late: the client can
// go elsewhere at once, and the work already admitted keeps its objective.

/**
 * Running estimates of prefill cost from measured prefills, each an exponentially weighted moving
 * average (the newest measurement weighs `alpha`): throughput as decayed tokens over decayed
 * compute seconds (so a long prompt weighs by its time, and tiny prompts' per-call cost does not
 * drag the rate down), and the fixed cost per prefill outside the forward passes (registry rows,
 * the last chunk's write) in seconds.
 */
export class PrefillThroughput {
  private tokens = 0;
  private seconds = 0;
  private overhead: number | undefined;
  private samples = 0;

  /** alpha: the weight of the newest measurement (0 < alpha <= 1). */
  constructor(readonly alpha = 0.3) {
    if (!(alpha > 0 && alpha <= 1)) throw new RangeError(`alpha must be in (0, 1], got ${alpha}`);
  }

  /** One measured prefill: `tokens` computed in `computeSeconds` of forward passes, `totalSeconds` in all (ignored unless positive and consistent). */
  observe(tokens: number, computeSeconds: number, totalSeconds: number = computeSeconds): void {
    if (!(tokens > 0 && computeSeconds > 0 && totalSeconds >= computeSeconds && Number.isFinite(totalSeconds))) return;
    const keep = 1 - this.alpha;
    this.tokens = this.tokens * keep + tokens;
    this.seconds = this.seconds * keep + computeSeconds;
    const overhead = totalSeconds - computeSeconds;
    this.overhead = this.overhead === undefined ? overhead : this.alpha * overhead + keep * this.overhead;
    this.samples++;
  }

  /** Prompt tokens per second of forward passes; undefined until the first measurement. */
  get tokensPerSecond(): number | undefined {
    return this.samples > 0 ? this.tokens / this.seconds : undefined;
  }

  /** Seconds per prefill outside the forward passes; undefined until the first measurement. */
  get overheadSeconds(): number | undefined {
    return this.overhead;
  }

  get count(): number {
    return this.samples;
  }
}

export interface TtftPredictionInput {
  /** Prefills running or queued ahead of this one. */
  prefillsAhead: number;
  /** Prompt tokens still to compute for them. */
  tokensAhead: number;
  promptTokens: number;
  /** The estimates; undefined when nothing has been measured yet. */
  tokensPerSecond: number | undefined;
  overheadSeconds?: number | undefined;
}

/**
 * Predicted TTFT in ms: the prefill work ahead plus this prompt at the estimated throughput, plus
 * the fixed cost of each of those prefills, as if prefills ran one after another (what
 * --max-prefills 1 does). Undefined without an estimate.
 */
export function predictTtftMs(p: TtftPredictionInput): number | undefined {
  if (p.tokensPerSecond === undefined || !(p.tokensPerSecond > 0)) return undefined;
  const compute = (Math.max(0, p.tokensAhead) + p.promptTokens) / p.tokensPerSecond;
  const overhead = (Math.max(0, p.prefillsAhead) + 1) * (p.overheadSeconds ?? 0);
  return (compute + overhead) * 1000;
}

export type AdmissionMode = "off" | "slo";

export interface AdmissionDecision {
  admit: boolean;
  predictedMs?: number;
  /** The prediction a request may have and still be admitted: target × (1 + margin). */
  limitMs?: number;
}

/**
 * Admit unless admission is on, there is a prediction, and it exceeds target × (1 + margin).
 * Without a measurement yet every request is admitted (the first prefill makes the estimate).
 */
export function decideAdmission(
  mode: AdmissionMode,
  ttftTargetMs: number | undefined,
  margin: number,
  p: TtftPredictionInput,
): AdmissionDecision {
  if (mode === "off" || ttftTargetMs === undefined) return { admit: true };
  const predictedMs = predictTtftMs(p);
  if (predictedMs === undefined) return { admit: true };
  const limitMs = ttftTargetMs * (1 + margin);
  return { admit: predictedMs <= limitMs, predictedMs, limitMs };
}
