// PromQL checks with Prometheus' own grammar (@prometheus-io/lezer-promql, the parser of the
// Prometheus web UI): syntax errors, and the metric names a query selects. Template syntax that
// is not PromQL (Grafana variables, prometheus-adapter's <<.Series>>) is replaced by plain values
// first.
import { parser } from "@prometheus-io/lezer-promql";

export interface ParsedQuery {
  errors: string[];
  metrics: string[];
}

export function parsePromql(query: string): ParsedQuery {
  const tree = parser.parse(query);
  const errors: string[] = [];
  const metrics = new Set<string>();
  tree.iterate({
    enter(node) {
      if (node.type.isError) errors.push(`syntax error at ${node.from}: …${query.slice(Math.max(0, node.from - 30), node.from + 10)}…`);
      // A metric name is the Identifier directly inside a VectorSelector.
      if (node.name === "Identifier" && node.node.parent?.name === "VectorSelector") metrics.add(query.slice(node.from, node.to));
    },
  });
  return { errors, metrics: [...metrics] };
}

/** Grafana's variables, as the values a query would see. */
export function expandGrafana(query: string): string {
  return query.replace(/\$__rate_interval|\$__interval|\$__range/g, "5m").replace(/\$\{?(\w+)\}?/g, "x");
}

/** prometheus-adapter's metricsQuery template for one series name. */
export function expandAdapter(query: string, series: string): string {
  return query
    .replace(/<<\.Series>>/g, series)
    .replace(/<<\.LabelMatchers>>/g, 'namespace="ctxbank"')
    .replace(/<<\.GroupBy>>/g, "namespace");
}

/** The base name of a series name: histogram and summary suffixes removed. */
export function metricFamily(series: string, histograms: ReadonlySet<string>): string {
  const m = /^(.*)_(bucket|sum|count)$/.exec(series);
  return m && histograms.has(m[1]!) ? m[1]! : series;
}
