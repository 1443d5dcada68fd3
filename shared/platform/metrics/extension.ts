// The `ctxbank` object each finished generation carries in its answer: the request's own timings
// and SLO verdicts, the same figures the metrics recorded for it.
import type { CtxbankExtension } from "../http/wire.ts";
import type { SloVerdict } from "./slo.ts";
import { quantile, type RequestTimings } from "./timings.ts";

const round = (ms: number) => Math.round(ms * 1000) / 1000;
const maybe = (ms: number | null) => (ms === null ? null : round(ms));

export function ctxbankExtension(t: RequestTimings, slo: SloVerdict): CtxbankExtension {
  const gaps = t.itlMs;
  return {
    timings: {
      ttft_ms: round(t.ttftMs),
      tpot_ms: maybe(t.tpotMs),
      e2e_ms: round(t.e2eMs),
      queue_ms: round(t.queueMs),
      itl_ms_mean: gaps.length ? round(gaps.reduce((a, b) => a + b, 0) / gaps.length) : null,
      itl_ms_p50: maybe(quantile(gaps, 0.5)),
      itl_ms_p90: maybe(quantile(gaps, 0.9)),
      // reduce, not Math.max(...gaps): a long generation has more gaps than a call may take arguments.
      itl_ms_max: gaps.length ? round(gaps.reduce((a, b) => Math.max(a, b))) : null,
      output_tokens: t.outputTokens,
    },
    slo: { ...slo },
  };
}
