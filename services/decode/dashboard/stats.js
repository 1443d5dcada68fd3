// The dashboard's figures from a rolling window of scrapes ({t: ms, parsed}), oldest first: the
// headline tiles (over the whole window, plus totals since the server started) and one point per
// scrape for each chart (rates over the last RATE_MS, quantiles and attainment over the last
// QUANTILE_MS). Every figure is a finite number or null ("no data"); nothing here touches the DOM.
import { bucketIncrease, family, histogramQuantile, increase, labelValues, sum } from "./prom-math.js";

export const WINDOW_MS = 5 * 60_000;
export const RATE_MS = 10_000;
export const QUANTILE_MS = 30_000;
export const QUANTILES = [0.5, 0.9, 0.99];

export const M = {
  ttft: "ctxbank:time_to_first_token_seconds",
  tpot: "ctxbank:time_per_output_token_seconds",
  e2e: "ctxbank:e2e_request_latency_seconds",
  success: "ctxbank:request_success_total",
  failure: "ctxbank:request_failure_total",
  promptTokens: "ctxbank:prompt_tokens_total",
  generationTokens: "ctxbank:generation_tokens_total",
  sloMet: "ctxbank:slo_met_total",
  sloMissed: "ctxbank:slo_missed_total",
  sloTarget: "ctxbank:slo_target_seconds",
  running: "ctxbank:num_requests_running",
  waiting: "ctxbank:num_requests_waiting",
  kvInUse: "ctxbank:kv_bytes_in_use",
  kvCapacity: "ctxbank:kv_bytes_capacity",
  kvBytes: "ctxbank:kv_transfer_bytes_total",
};
export const SLOS = ["all", "ttft", "tpot", "e2e"];
export const TIERS = ["device", "host", "shard"];

const finite = (x) => (typeof x === "number" && Number.isFinite(x) ? x : null);
const div = (a, b) => (a === null || b === null || !(b > 0) ? null : finite(a / b));
const add = (...xs) => (xs.every((x) => x === null) ? null : xs.reduce((s, x) => s + (x ?? 0), 0));

/** The index of the earliest scrape at or after `t - span` that is before `i` (at least one step back). */
function startIndex(scrapes, i, span) {
  let j = i - 1;
  while (j > 0 && scrapes[j - 1].t >= scrapes[i].t - span) j--;
  return j;
}

// Figures are memoised per scrape (and pair of scrapes): a redraw computes only the new point's.
const betweenMemo = new WeakMap();
const nowMemo = new WeakMap();
function between(a, b) {
  let byStart = betweenMemo.get(b);
  if (!byStart) betweenMemo.set(b, (byStart = new Map()));
  if (!byStart.has(a)) byStart.set(a, computeBetween(a, b));
  return byStart.get(a);
}
function now(parsed) {
  if (!nowMemo.has(parsed)) nowMemo.set(parsed, computeNow(parsed));
  return nowMemo.get(parsed);
}

/** Figures between two scrapes `a` (earlier) and `b`. */
function computeBetween(a, b) {
  const dt = (b.t - a.t) / 1000;
  const inc = (name, filter) => increase(a.parsed, b.parsed, name, filter);
  const requests = add(inc(M.success), inc(M.failure));
  const quantiles = (name) => {
    const buckets = bucketIncrease(a.parsed, b.parsed, name);
    return QUANTILES.map((q) => (buckets ? finite(histogramQuantile(q, buckets)) : null));
  };
  const attainment = Object.fromEntries(
    SLOS.map((slo) => {
      const met = inc(M.sloMet, { slo });
      return [slo, div(met, add(met, inc(M.sloMissed, { slo })))];
    }),
  );
  const transports = labelValues(b.parsed, M.kvBytes, "transport");
  return {
    seconds: dt,
    requests,
    requestRate: div(requests, dt),
    failureRate: div(inc(M.failure), dt),
    goodput: div(inc(M.sloMet, { slo: "all" }), dt),
    attainment,
    ttft: quantiles(M.ttft),
    tpot: quantiles(M.tpot),
    promptTokenRate: div(inc(M.promptTokens), dt),
    generationTokenRate: div(inc(M.generationTokens), dt),
    kvTransferRate: Object.fromEntries(transports.map((transport) => [transport, div(inc(M.kvBytes, { transport }), dt)])),
  };
}

/** Gauges and totals in one scrape. */
function computeNow(parsed) {
  const gauge = (name, filter) => finite(sum(parsed, name, filter));
  // A counter family without series yet (prom-client writes a labelled series once touched) is 0.
  const total = (name, filter) => (family(parsed, name) ? (gauge(name, filter) ?? 0) : null);
  const services = [...new Set([...labelValues(parsed, M.running, "service"), ...labelValues(parsed, M.waiting, "service")])];
  const tiers = TIERS.filter(
    (tier) => labelValues(parsed, M.kvInUse, "tier").includes(tier) || labelValues(parsed, M.kvCapacity, "tier").includes(tier),
  );
  const met = total(M.sloMet, { slo: "all" });
  return {
    attainmentSinceStart: div(met, add(met, total(M.sloMissed, { slo: "all" }))),
    requestsSinceStart: add(total(M.success), total(M.failure)),
    queues: Object.fromEntries(
      services.map((service) => [service, { running: gauge(M.running, { service }), waiting: gauge(M.waiting, { service }) }]),
    ),
    kv: Object.fromEntries(tiers.map((tier) => [tier, { inUse: gauge(M.kvInUse, { tier }), capacity: gauge(M.kvCapacity, { tier }) }])),
    targets: Object.fromEntries(labelValues(parsed, M.sloTarget, "slo").map((slo) => [slo, gauge(M.sloTarget, { slo })])),
  };
}

/** Headline figures: `window` over the first to the last scrape (null with fewer than two), `now` from the last. */
export function tiles(scrapes) {
  if (scrapes.length === 0) return null;
  const last = scrapes[scrapes.length - 1];
  return { window: scrapes.length > 1 ? between(scrapes[0], last) : null, now: now(last.parsed) };
}

/**
 * Chart data: `t` (seconds since the epoch, one per scrape) and named series of equal length,
 * each with a null where it has no value. Series keys that appear only in some scrapes (a
 * transport not used yet, a tier the process lacks) are present with nulls elsewhere.
 */
export function chartData(scrapes) {
  const t = scrapes.map((s) => s.t / 1000);
  const series = new Map();
  const put = (key, i, v) => {
    if (!series.has(key)) series.set(key, new Array(scrapes.length).fill(null));
    series.get(key)[i] = finite(v);
  };
  scrapes.forEach((s, i) => {
    const n = now(s.parsed);
    for (const [service, q] of Object.entries(n.queues)) {
      put(`running.${service}`, i, q.running);
      put(`waiting.${service}`, i, q.waiting);
    }
    for (const [tier, kv] of Object.entries(n.kv)) {
      put(`kv.${tier}`, i, kv.inUse);
      put(`kvcap.${tier}`, i, kv.capacity);
    }
    for (const [slo, target] of Object.entries(n.targets)) put(`target.${slo}`, i, target);
    if (i === 0) return;
    const r = between(scrapes[startIndex(scrapes, i, RATE_MS)], s);
    put("requestRate", i, r.requestRate);
    put("failureRate", i, r.failureRate);
    put("goodput", i, r.goodput);
    put("promptTokenRate", i, r.promptTokenRate);
    put("generationTokenRate", i, r.generationTokenRate);
    for (const [transport, rate] of Object.entries(r.kvTransferRate)) put(`transfer.${transport}`, i, rate);
    const w = between(scrapes[startIndex(scrapes, i, QUANTILE_MS)], s);
    const slos = new Set(["all", ...labelValues(s.parsed, M.sloMet, "slo"), ...labelValues(s.parsed, M.sloMissed, "slo")]);
    for (const slo of SLOS) if (slos.has(slo)) put(`attainment.${slo}`, i, w.attainment[slo]);
    QUANTILES.forEach((q, k) => {
      put(`ttft.p${q * 100}`, i, w.ttft[k]);
      put(`tpot.p${q * 100}`, i, w.tpot[k]);
    });
  });
  return { t, series };
}
