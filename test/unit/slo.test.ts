// The SLO evaluator, the per-request clock, the TTFT predictor behind SLO admission and the SLO
// settings, on pure inputs.
import { describe, expect, it } from "vitest";
import { ConfigError, loadConfig } from "../../shared/platform/config.ts";
import { decideAdmission, PrefillThroughput, predictTtftMs } from "../../shared/platform/metrics/admission.ts";
import { ctxbankExtension } from "../../shared/platform/metrics/extension.ts";
import { configuredSlos, evaluateSlo } from "../../shared/platform/metrics/slo.ts";
import { quantile, RequestClock } from "../../shared/platform/metrics/timings.ts";

describe("evaluateSlo", () => {
  const t = { ttftMs: 200, tpotMs: 30, e2eMs: 500 };

  it("judges each configured SLO as value <= target, and all as every one of them", () => {
    expect(evaluateSlo({ ttftMs: 200, tpotMs: 30 }, t)).toEqual({ ttft: true, tpot: true, all: true });
    expect(evaluateSlo({ ttftMs: 199.9, tpotMs: 30 }, t)).toEqual({ ttft: false, tpot: true, all: false });
    expect(evaluateSlo({ ttftMs: 1000, tpotMs: 0.001 }, t)).toEqual({ ttft: true, tpot: false, all: false });
    expect(evaluateSlo({ ttftMs: 1000, tpotMs: 100, e2eMs: 499 }, t)).toEqual({ ttft: true, tpot: true, e2e: false, all: false });
  });

  it("judges only what is configured; nothing configured is all met", () => {
    expect(evaluateSlo({ e2eMs: 600 }, t)).toEqual({ e2e: true, all: true });
    expect(evaluateSlo({}, t)).toEqual({ all: true });
    expect(configuredSlos({ ttftMs: 1, e2eMs: 2 })).toEqual(["ttft", "e2e"]);
  });

  it("a one-token answer has no TPOT and cannot miss it", () => {
    expect(evaluateSlo({ ttftMs: 1000, tpotMs: 0.001 }, { ...t, tpotMs: null })).toEqual({ ttft: true, tpot: true, all: true });
  });
});

describe("RequestClock", () => {
  it("TTFT from arrival, every gap, TPOT = (e2e - ttft) / (n - 1)", () => {
    const clock = new RequestClock(1000);
    for (const at of [1100, 1130, 1190, 1200]) clock.token(at);
    const t = clock.finish(1210, 12);
    expect(t).toEqual({ ttftMs: 100, tpotMs: (210 - 100) / 3, e2eMs: 210, queueMs: 12, itlMs: [30, 60, 10], outputTokens: 4 });
  });

  it("one token: no gaps, no TPOT; a finish before the last stamp still ends at the last token", () => {
    const clock = new RequestClock(0);
    clock.token(50);
    expect(clock.finish(40, -1)).toEqual({ ttftMs: 50, tpotMs: null, e2eMs: 50, queueMs: 0, itlMs: [], outputTokens: 1 });
    expect(() => new RequestClock(0).finish(1, 0)).toThrow(/at least one token/);
  });

  it("quantile is nearest-rank", () => {
    expect(quantile([], 0.5)).toBeNull();
    expect(quantile([5, 1, 3], 0.5)).toBe(3);
    expect(quantile([1, 2, 3, 4], 0.5)).toBe(2);
    expect(quantile([1, 2, 3, 4], 0.9)).toBe(4);
    expect(quantile([7], 0)).toBe(7);
  });

  it("the response extension carries the same figures, rounded to the microsecond", () => {
    const clock = new RequestClock(0);
    for (const at of [10.12345, 20, 50]) clock.token(at);
    const ext = ctxbankExtension(clock.finish(50, 1), { ttft: true, tpot: false, all: false });
    expect(ext).toEqual({
      timings: {
        ttft_ms: 10.123,
        tpot_ms: 19.938,
        e2e_ms: 50,
        queue_ms: 1,
        itl_ms_mean: 19.938,
        itl_ms_p50: 9.877,
        itl_ms_p90: 30,
        itl_ms_max: 30,
        output_tokens: 3,
      },
      slo: { ttft: true, tpot: false, all: false },
    });
  });

  it("copes with more inter-token gaps than a function call takes arguments (a long generation)", () => {
    const clock = new RequestClock(0);
    for (let i = 1; i <= 200_000; i++) clock.token(i === 100_000 ? i + 0.5 : i);
    const ext = ctxbankExtension(clock.finish(200_000, 0), { all: true });
    expect(ext.timings.itl_ms_max).toBe(1.5);
    expect(ext.timings.output_tokens).toBe(200_000);
  });
});

describe("PrefillThroughput", () => {
  it("has no estimate before a measurement and ignores nonsense", () => {
    const p = new PrefillThroughput(0.5);
    expect(p.tokensPerSecond).toBeUndefined();
    p.observe(0, 1);
    p.observe(10, 0);
    p.observe(10, 2, 1); // total shorter than compute
    p.observe(10, NaN);
    expect(p.count).toBe(0);
    expect(() => new PrefillThroughput(0)).toThrow(RangeError);
  });

  it("decays tokens and compute seconds alike; overhead is an EWMA of total - compute", () => {
    const p = new PrefillThroughput(0.5);
    p.observe(1000, 1, 1.1);
    expect(p.tokensPerSecond).toBeCloseTo(1000);
    expect(p.overheadSeconds).toBeCloseTo(0.1);
    p.observe(100, 1, 1.3); // a slow one: (1000·0.5 + 100) / (1·0.5 + 1)
    expect(p.tokensPerSecond).toBeCloseTo(600 / 1.5);
    expect(p.overheadSeconds).toBeCloseTo(0.2);
    for (let i = 0; i < 40; i++) p.observe(500, 1, 1);
    expect(p.tokensPerSecond).toBeCloseTo(500, 3); // old measurements fade away
    expect(p.overheadSeconds).toBeCloseTo(0, 6);
  });
});

describe("TTFT prediction and admission", () => {
  const est = { tokensPerSecond: 500, overheadSeconds: 0.05 };

  it("predicts the work ahead plus this prompt at the throughput, plus each prefill's fixed cost", () => {
    expect(predictTtftMs({ prefillsAhead: 0, tokensAhead: 0, promptTokens: 500, ...est })).toBeCloseTo(1050);
    expect(predictTtftMs({ prefillsAhead: 2, tokensAhead: 1500, promptTokens: 500, ...est })).toBeCloseTo(4000 + 150);
    expect(predictTtftMs({ prefillsAhead: 0, tokensAhead: 0, promptTokens: 500, tokensPerSecond: undefined })).toBeUndefined();
  });

  it("refuses above target × (1 + margin), admits at or below it, and always without an estimate or when off", () => {
    const p = { prefillsAhead: 1, tokensAhead: 975, promptTokens: 500, ...est }; // 2950 + 100 = 3050 ms
    expect(decideAdmission("slo", 2000, 0.5, p)).toEqual({ admit: false, predictedMs: expect.closeTo(3050, 6), limitMs: 3000 });
    expect(decideAdmission("slo", 2000, 0.53, p)).toMatchObject({ admit: true, limitMs: 3060 });
    expect(decideAdmission("slo", 3051, 0, p).admit).toBe(true);
    expect(decideAdmission("slo", 3049, 0, p).admit).toBe(false);
    expect(decideAdmission("off", 1, 0, p)).toEqual({ admit: true });
    expect(decideAdmission("slo", 1, 0, { ...p, tokensPerSecond: undefined })).toEqual({ admit: true });
  });
});

describe("SLO settings", () => {
  it("defaults: TTFT 2 s, TPOT 100 ms, no e2e objective, admission off with margin 0.5", () => {
    const c = loadConfig("serve", {}, {});
    expect(c).toMatchObject({ sloTtftMs: 2000, sloTpotMs: 100, admission: "off", admissionMargin: 0.5 });
    expect(c.sloE2eMs).toBeUndefined();
  });

  it("flags over environment; fractions of a millisecond allowed", () => {
    const env = {
      CTXBANK_SLO_TTFT_MS: "750",
      CTXBANK_SLO_TPOT_MS: "0.001",
      CTXBANK_SLO_E2E_MS: "9000",
      CTXBANK_ADMISSION: "slo",
      CTXBANK_ADMISSION_MARGIN: "0",
    };
    expect(loadConfig("serve", {}, env)).toMatchObject({
      sloTtftMs: 750,
      sloTpotMs: 0.001,
      sloE2eMs: 9000,
      admission: "slo",
      admissionMargin: 0,
    });
    expect(loadConfig("serve", { "slo-ttft-ms": "300", admission: "off" }, env)).toMatchObject({ sloTtftMs: 300, admission: "off" });
  });

  it("refuses bad values naming the flag or variable", () => {
    expect(() => loadConfig("serve", { "slo-ttft-ms": "0" }, {})).toThrow(ConfigError);
    expect(() => loadConfig("serve", { "slo-ttft-ms": "0" }, {})).toThrow(/--slo-ttft-ms/);
    expect(() => loadConfig("serve", {}, { CTXBANK_SLO_TPOT_MS: "fast" })).toThrow(/\$CTXBANK_SLO_TPOT_MS/);
    expect(() => loadConfig("serve", { admission: "maybe" }, {})).toThrow(/--admission/);
    expect(() => loadConfig("serve", { "admission-margin": "-1" }, {})).toThrow(/--admission-margin/);
  });
});
