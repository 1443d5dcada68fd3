// How many prompt tokens a decode step may carry (chunked prefill, as in Sarathi-Serve). A step
// that runs a whole 512-token micro-batch of a long prompt takes over a second, and every running
// decode waits for it: in a colocated server that alone broke the TPOT objective. So when decodes
// are running, each step carries a prefill chunk sized to what the decodes can spare: every running
// sequence is paced to `tpotTargetMs` per token from its first token, the time until the most
// urgent one's next token is due is the step's time budget, and a linear cost model learned from
// the steps themselves turns that budget into tokens. A sequence ahead of its pace banks the
// difference, so prefill gets big efficient chunks whenever the decodes can afford them, and small
// ones (never below `minChunk`, so a prompt always progresses) when they cannot.

/** Running-average costs of a step: a decode-only step, and each prompt token a step carries. */
export class StepCosts {
  decodeMs: number | undefined;
  prefillMsPerToken: number | undefined;
  constructor(private readonly weight = 0.3) {}

  /** Records one step: `decodes` one-token items and `prefillTokens` prompt tokens in `ms`. */
  observe(decodes: number, prefillTokens: number, ms: number): void {
    if (prefillTokens === 0) {
      if (decodes > 0) this.decodeMs = this.mix(this.decodeMs, ms);
      return;
    }
    // A mixed step's prompt tokens cost what the decodes did not; while none ran, the whole step.
    const spent = decodes > 0 ? ms - (this.decodeMs ?? 0) : ms;
    this.prefillMsPerToken = this.mix(this.prefillMsPerToken, Math.max(spent, 0.01 * prefillTokens) / prefillTokens);
  }

  private mix(old: number | undefined, sample: number): number {
    return old === undefined ? sample : old + this.weight * (sample - old);
  }
}

export interface ChunkInputs {
  /** Milliseconds until each running decode's next token is due (negative: it is late). */
  slackMs: number[];
  costs: StepCosts;
  /** Prompt tokens one step may carry at most (the engine's micro-batch, less the decode tokens). */
  maxTokens: number;
  minChunk: number;
}

/** Prompt tokens the next step may carry so that no running decode falls behind its pace. */
export function prefillChunkTokens({ slackMs, costs, maxTokens, minChunk }: ChunkInputs): number {
  const floor = Math.min(minChunk, maxTokens);
  if (slackMs.length === 0) return maxTokens;
  if (costs.prefillMsPerToken === undefined) return floor; // nothing measured yet: the smallest step
  const budgetMs = Math.min(...slackMs) - (costs.decodeMs ?? 0);
  const tokens = Math.floor(budgetMs / costs.prefillMsPerToken);
  return Math.max(floor, Math.min(maxTokens, tokens));
}
