// The metrics a ctxbank process exports, for checking the names that dashboards and autoscalers
// query: ctxbank's own from their definitions (shared/platform/metrics/definitions.ts, the same code the
// services register), prom-client's process metrics from prom-client itself.
import { collectDefaultMetrics, Registry } from "prom-client";
import { defineMetrics, defineRouterMetrics } from "../../../shared/platform/metrics/definitions.ts";

export interface MetricInfo {
  name: string;
  type: "counter" | "gauge" | "histogram" | "summary";
  labels: string[];
}

/** Every metric family a ctxbank process exports (the services' and the router's) and prom-client's process metrics. */
export async function exportedMetrics(): Promise<MetricInfo[]> {
  const own = new Registry();
  const defined = {
    ...defineMetrics([own], "model", { requests: new Map(), kv: new Map() }),
    ...defineRouterMetrics([own], { decodes: () => [] }),
  };
  // prom-client keeps each metric's label names on the instance (not in its typings).
  const labelsOf = new Map(
    Object.values(defined).map((m) => [(m as unknown as { name: string }).name, (m as unknown as { labelNames: string[] }).labelNames]),
  );
  const defaults = new Registry();
  collectDefaultMetrics({ register: defaults });
  const describe = async (r: Registry) =>
    (await r.getMetricsAsJSON()).map((m) => ({
      name: m.name,
      type: String(m.type) as MetricInfo["type"],
      labels: labelsOf.get(m.name) ?? [],
    }));
  return [...(await describe(own)), ...(await describe(defaults))];
}

/** Every series name a query may select: counters and gauges as named, histograms with their suffixes. */
export function seriesNames(metrics: MetricInfo[]): Set<string> {
  const names = new Set<string>();
  for (const m of metrics) {
    names.add(m.name);
    if (m.type === "histogram") for (const s of ["_bucket", "_sum", "_count"]) names.add(m.name + s);
    if (m.type === "summary") for (const s of ["_sum", "_count"]) names.add(m.name + s);
  }
  return names;
}
