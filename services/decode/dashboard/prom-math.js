// PromQL-like arithmetic over parsed scrapes (see prom-parse.js): sums of series matching a label
// filter, counter increases between two scrapes (with counter resets), histogram bucket deltas
// and histogram_quantile with Prometheus's semantics. Plain JavaScript for browser and tests.

/** True when every label in `filter` has that value in `labels`. */
export function matches(labels, filter = {}) {
  for (const [k, v] of Object.entries(filter)) if (labels[k] !== v) return false;
  return true;
}

// A sample's series identity (name and sorted labels), computed once per sample: a window of
// scrapes compares the same samples again at every redraw.
const keys = new WeakMap();
function seriesKey(sample) {
  let key = keys.get(sample);
  if (key === undefined) {
    const labels = sample.labels;
    key = `${sample.name}{${Object.keys(labels)
      .sort()
      .map((k) => `${k}=${JSON.stringify(labels[k])}`)
      .join(",")}}`;
    keys.set(sample, key);
  }
  return key;
}

/** The family of `name`; a counter `x_total` is also found where its TYPE line names `x`. */
export function family(parsed, name) {
  return parsed.families.get(name) ?? (name.endsWith("_total") ? parsed.families.get(name.slice(0, -6)) : undefined);
}

function samples(parsed, name, pick, filter) {
  const f = family(parsed, name);
  if (!f) return undefined;
  return f.samples.filter((s) => pick(f, s) && matches(s.labels, filter));
}

/** A counter's or gauge's own samples (prom-client names a counter family `x_total`; OpenMetrics `x`). */
function isValue(f, s) {
  return s.name === f.name || s.name === `${f.name}_total`;
}

/** Sum of the matching series of a gauge or counter now; null when no series matches. */
export function sum(parsed, name, filter) {
  const f = family(parsed, name);
  const ss = f ? f.samples.filter((s) => isValue(f, s) && matches(s.labels, filter)) : [];
  return ss.length === 0 ? null : ss.reduce((a, s) => a + s.value, 0);
}

/** Distinct values of `label` among the family's series. */
export function labelValues(parsed, name, label) {
  const f = family(parsed, name);
  if (!f) return [];
  return [...new Set(f.samples.map((s) => s.labels[label]).filter((v) => v !== undefined))].sort();
}

/**
 * Per-series increase from scrape `a` to scrape `b`: a series missing in `a` counts from 0 (prom-client
 * writes a labelled series only once it has been touched); a value lower than before is a counter
 * reset, so its increase is the new value. Calls `add(labels, delta)` for each series of `b`.
 */
function increases(a, b, name, pick, filter, add) {
  const sb = samples(b, name, pick, filter);
  const sa = samples(a, name, pick, filter);
  if (!sb || !sa) return false;
  const before = new Map(sa.map((s) => [seriesKey(s), s.value]));
  for (const s of sb) {
    const prev = before.get(seriesKey(s)) ?? 0;
    add(s.labels, s.value >= prev ? s.value - prev : s.value);
  }
  return true;
}

/** Increase of a counter's matching series from `a` to `b`; null when either scrape lacks the family. */
export function increase(a, b, name, filter) {
  let total = 0;
  return increases(a, b, name, isValue, filter, (_, d) => (total += d)) ? total : null;
}

/**
 * Bucket counts of a histogram's matching series observed between `a` and `b`, summed by `le`
 * (like `sum by (le) (increase(x_bucket[...]))`), sorted by upper bound; null when absent.
 */
export function bucketIncrease(a, b, name, filter) {
  const byLe = new Map();
  const ok = increases(
    a,
    b,
    name,
    (f, s) => s.name === `${f.name}_bucket`,
    filter,
    (labels, d) => {
      const le = labels.le === undefined ? NaN : Number(labels.le === "+Inf" ? Infinity : labels.le);
      if (Number.isNaN(le)) return;
      byLe.set(le, (byLe.get(le) ?? 0) + d);
    },
  );
  if (!ok) return null;
  return [...byLe.entries()].sort((x, y) => x[0] - y[0]).map(([le, count]) => ({ le, count }));
}

/**
 * histogram_quantile(q, buckets) as Prometheus computes it (promql/quantile.go): cumulative counts
 * are made monotonic, the rank q * total falls into a bucket and is interpolated linearly between
 * its lower and upper bound (the first bucket's lower bound is 0 unless its upper bound is <= 0);
 * a rank in the +Inf bucket answers the highest finite bound. NaN without a +Inf bucket, with fewer
 * than two buckets or with no observations; -Inf/+Inf for q < 0 / q > 1.
 */
export function histogramQuantile(q, buckets) {
  if (Number.isNaN(q)) return NaN;
  if (q < 0) return -Infinity;
  if (q > 1) return Infinity;
  const byLe = new Map();
  for (const b of buckets) byLe.set(b.le, (byLe.get(b.le) ?? 0) + b.count);
  const bs = [...byLe.entries()].map(([le, count]) => ({ le, count })).sort((x, y) => x.le - y.le);
  if (bs.length < 2 || bs[bs.length - 1].le !== Infinity) return NaN;
  let max = 0;
  const counts = bs.map((b) => (max = Math.max(max, b.count)));
  const total = counts[counts.length - 1];
  if (!(total > 0)) return NaN;
  let rank = q * total;
  const i = counts.findIndex((c) => c >= rank);
  if (i === bs.length - 1) return bs[bs.length - 2].le;
  if (i === 0 && bs[0].le <= 0) return bs[0].le;
  const start = i === 0 ? 0 : bs[i - 1].le;
  const below = i === 0 ? 0 : counts[i - 1];
  const inBucket = counts[i] - below;
  rank -= below;
  // inBucket > 0 whenever q > 0 (the rank lies above the previous bucket's count); at q = 0 an empty
  // first bucket gives its lower bound rather than Prometheus's 0/0.
  return start + (bs[i].le - start) * (inBucket > 0 ? rank / inBucket : 0);
}
