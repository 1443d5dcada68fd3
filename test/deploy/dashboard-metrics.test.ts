// The dashboard's browser modules in Node: the Prometheus text parser, counter/histogram
// arithmetic (histogram_quantile as Prometheus computes it) and the dashboard figures, on a
// recorded /metrics sample and on real prom-client output with known observations.
import { readFileSync } from "node:fs";
import client from "prom-client";
import { describe, expect, it } from "vitest";
import { bucketIncrease, histogramQuantile, increase, sum } from "../../services/decode/dashboard/prom-math.js";
import { parsePrometheus } from "../../services/decode/dashboard/prom-parse.js";
import { chartData, M, tiles, type Scrape } from "../../services/decode/dashboard/stats.js";

const sample = readFileSync(new URL("fixtures/metrics-sample.prom", import.meta.url), "utf8");

describe("parsePrometheus", () => {
  const { families, errors } = parsePrometheus(sample);

  it("groups histogram samples under their family, with labels unescaped", () => {
    const ttft = families.get("ctxbank:time_to_first_token_seconds")!;
    expect(ttft.type).toBe("histogram");
    expect(ttft.help).toBe("Time to first token \\ with a\nnewline");
    expect(ttft.samples.map((s) => s.name)).toEqual([
      ...Array(3).fill("ctxbank:time_to_first_token_seconds_bucket"),
      "ctxbank:time_to_first_token_seconds_sum",
      "ctxbank:time_to_first_token_seconds_count",
    ]);
    expect(ttft.samples[2]).toEqual({ name: "ctxbank:time_to_first_token_seconds_bucket", labels: { le: "+Inf", model: 'm"x' }, value: 1 });
  });

  it("reads counters, gauges, exponents, Inf, NaN, timestamps, trailing commas and spaced labels", () => {
    expect(families.get("ctxbank:request_success_total")!.samples.map((s) => [s.labels.finished_reason, s.value])).toEqual([
      ["stop", 3],
      ["length", 4],
    ]);
    const kv = families.get("ctxbank:kv_bytes_in_use")!;
    expect(kv.type).toBe("gauge");
    expect(kv.samples.map((s) => s.value)).toEqual([1.5e6, 0, Infinity]);
    expect(kv.samples[2]!.labels).toEqual({ tier: "weird\\path\nx" });
    expect(families.get("ctxbank:nan_gauge")!.samples[0]!.value).toBeNaN();
    expect(families.get("untyped_metric")).toMatchObject({ type: "untyped", samples: [{ value: -0.0025 }] });
    expect(families.get("process_cpu_user_seconds_total")!.samples[0]!.value).toBe(1.234);
  });

  it("skips malformed lines and says which", () => {
    expect(errors).toHaveLength(3);
    expect(errors[0]).toMatch(/^line 25: expected a value/);
    expect(errors[1]).toMatch(/^line 26: unterminated value for label tier/);
    expect(errors[2]).toMatch(/^line 27: bad value "12abc"/);
    expect(families.has("this")).toBe(false);
  });

  it("answers nothing for an empty body", () => {
    expect(parsePrometheus("")).toEqual({ families: new Map(), errors: [] });
  });
});

describe("histogramQuantile (Prometheus semantics)", () => {
  const b = (pairs: [number, number][]) => pairs.map(([le, count]) => ({ le, count }));
  const buckets = b([
    [0.1, 2],
    [0.5, 6],
    [1, 8],
    [Infinity, 10],
  ]);

  it("interpolates linearly inside the bucket the rank falls into", () => {
    expect(histogramQuantile(0.5, buckets)).toBeCloseTo(0.4, 12); // rank 5: 0.1 + 0.4 * 3/4
    expect(histogramQuantile(0.75, buckets)).toBeCloseTo(0.875, 12); // rank 7.5: 0.5 + 0.5 * 1.5/2
    expect(histogramQuantile(0.1, buckets)).toBeCloseTo(0.05, 12); // first bucket from 0
  });

  it("answers the highest finite bound for a rank in +Inf, and orders buckets itself", () => {
    expect(histogramQuantile(0.9, buckets)).toBe(1);
    expect(histogramQuantile(0.5, [...buckets].reverse())).toBeCloseTo(0.4, 12);
  });

  it("makes counts monotonic, and handles a non-positive first bound", () => {
    expect(
      histogramQuantile(
        0.5,
        b([
          [0.1, 3],
          [0.5, 2],
          [Infinity, 4],
        ]),
      ),
    ).toBeCloseTo(0.1 * (2 / 3), 12);
    expect(
      histogramQuantile(
        0.25,
        b([
          [-1, 1],
          [0, 2],
          [Infinity, 2],
        ]),
      ),
    ).toBe(-1);
  });

  it("is NaN without +Inf, observations or two buckets; ±Inf outside [0, 1]", () => {
    expect(
      histogramQuantile(
        0.5,
        b([
          [0.1, 1],
          [1, 2],
        ]),
      ),
    ).toBeNaN();
    expect(
      histogramQuantile(
        0.5,
        b([
          [0.1, 0],
          [Infinity, 0],
        ]),
      ),
    ).toBeNaN();
    expect(histogramQuantile(0.5, b([[Infinity, 3]]))).toBeNaN();
    expect(histogramQuantile(-0.1, buckets)).toBe(-Infinity);
    expect(histogramQuantile(1.1, buckets)).toBe(Infinity);
  });
});

/** A registry shaped like the services' (same names, prom-client), to scrape at chosen moments. */
function metricsRegistry() {
  const r = new client.Registry();
  const buckets = [0.1, 0.25, 0.5, 1, 2.5];
  const m = {
    ttft: new client.Histogram({ name: M.ttft!, help: "h", labelNames: ["model"], buckets, registers: [r] }),
    tpot: new client.Histogram({ name: M.tpot!, help: "h", labelNames: ["model"], buckets: [0.01, 0.05, 0.1], registers: [r] }),
    success: new client.Counter({ name: M.success!, help: "h", labelNames: ["model", "finished_reason"], registers: [r] }),
    failure: new client.Counter({ name: M.failure!, help: "h", labelNames: ["model", "code"], registers: [r] }),
    met: new client.Counter({ name: M.sloMet!, help: "h", labelNames: ["model", "slo"], registers: [r] }),
    missed: new client.Counter({ name: M.sloMissed!, help: "h", labelNames: ["model", "slo"], registers: [r] }),
    target: new client.Gauge({ name: M.sloTarget!, help: "h", labelNames: ["slo"], registers: [r] }),
    running: new client.Gauge({ name: M.running!, help: "h", labelNames: ["service"], registers: [r] }),
    kv: new client.Gauge({ name: M.kvInUse!, help: "h", labelNames: ["tier"], registers: [r] }),
    kvCap: new client.Gauge({ name: M.kvCapacity!, help: "h", labelNames: ["tier"], registers: [r] }),
    bytes: new client.Counter({ name: M.kvBytes!, help: "h", labelNames: ["transport"], registers: [r] }),
  };
  return { r, m, scrape: async (t: number): Promise<Scrape> => ({ t, parsed: parsePrometheus(await r.metrics()) }) };
}

describe("dashboard figures from prom-client output", () => {
  it("rates, goodput, attainment, quantiles, gauges and transfer rates over the window", async () => {
    const { m, scrape } = metricsRegistry();
    m.target.set({ slo: "ttft" }, 1);
    m.kv.set({ tier: "device" }, 0);
    m.kvCap.set({ tier: "device" }, 2 ** 31);
    m.kv.set({ tier: "host" }, 0);
    const s0 = await scrape(0); // labelled counters and histograms have no series yet
    for (const [i, ttft] of [0.05, 0.2, 0.3, 2].entries()) {
      m.ttft.observe({ model: "x" }, ttft);
      m.tpot.observe({ model: "x" }, 0.02);
      m.success.inc({ model: "x", finished_reason: i ? "stop" : "length" });
      (ttft <= 1 ? m.met : m.missed).inc({ model: "x", slo: "all" });
    }
    m.failure.inc({ model: "x", code: "queue_full" });
    m.bytes.inc({ transport: "http" }, 1e9);
    m.running.set({ service: "decode" }, 2);
    m.kv.set({ tier: "device" }, 5e6);
    const s1 = await scrape(10_000);

    const t = tiles([s0, s1])!;
    const w = t.window!;
    expect(w.seconds).toBe(10);
    expect(w.requests).toBe(5);
    expect(w.requestRate).toBeCloseTo(0.5, 12);
    expect(w.failureRate).toBeCloseTo(0.1, 12);
    expect(w.goodput).toBeCloseTo(0.3, 12);
    expect(w.attainment.all).toBeCloseTo(0.75, 12);
    expect(w.attainment.ttft).toBeNull(); // no ttft-only SLO counted
    // cumulative 0.1:1 0.25:2 0.5:3 1:3 2.5:4: p50 rank 2 -> 0.25; p90 rank 3.6 -> 1 + 1.5*0.6; p99 -> 1 + 1.5*0.96
    expect(w.ttft[0]).toBeCloseTo(0.25, 12);
    expect(w.ttft[1]).toBeCloseTo(1.9, 12);
    expect(w.ttft[2]).toBeCloseTo(2.44, 12);
    expect(w.tpot[0]).toBeCloseTo(0.01 + 0.04 * 0.5, 12);
    expect(w.kvTransferRate).toEqual({ http: 1e8 });
    expect(t.now).toEqual({
      attainmentSinceStart: 0.75,
      requestsSinceStart: 5,
      queues: { decode: { running: 2, waiting: null } },
      kv: { device: { inUse: 5e6, capacity: 2 ** 31 }, host: { inUse: 0, capacity: null } },
      targets: { ttft: 1 },
    });

    // A restarted server: counters start again; the increase is the new value, not negative.
    const restarted = metricsRegistry();
    restarted.m.success.inc({ model: "x", finished_reason: "stop" });
    const s2 = await restarted.scrape(12_000);
    expect(increase(s1.parsed, s2.parsed, M.success!)).toBe(1);
    expect(bucketIncrease(s1.parsed, s2.parsed, M.ttft!)).toEqual([]);
    expect(sum(s2.parsed, M.success!)).toBe(1);
  });

  it("answers null, never NaN, without data; chart series have one value per scrape", async () => {
    const { m, scrape } = metricsRegistry();
    expect(tiles([])).toBeNull();
    const s0 = await scrape(0);
    expect(tiles([s0])!.window).toBeNull();
    const s1 = await scrape(2_000);
    const idle = tiles([s0, s1])!.window!;
    expect([idle.requestRate, idle.goodput, idle.attainment.all, ...idle.ttft, ...idle.tpot]).toEqual([
      0,
      0,
      null,
      null,
      null,
      null,
      null,
      null,
      null,
    ]);
    m.ttft.observe({ model: "x" }, 0.3);
    m.success.inc({ model: "x", finished_reason: "stop" });
    const s2 = await scrape(4_000);
    const s3 = await scrape(40_000); // 36 s after s2: its rate and quantile ranges start at s2
    const { t, series } = chartData([s0, s1, s2, s3]);
    expect(t).toEqual([0, 2, 4, 40]);
    for (const [key, values] of series) {
      expect(values, key).toHaveLength(4);
      for (const v of values) expect(v === null || Number.isFinite(v), key).toBe(true);
    }
    expect(series.get("requestRate")).toEqual([null, 0, 0.25, 0]); // s2: one request over s0..s2 (4 s, inside 10 s)
    expect(series.get("ttft.p50")).toEqual([null, null, 0.25 + 0.25 * 0.5, null]);
    expect(series.get("kv.device")).toBeUndefined(); // the process reports no tier: no series
  });
});
