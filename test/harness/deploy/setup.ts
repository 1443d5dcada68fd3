// What the deploy/ tests share: the repository's paths, the Dockerfile's final (runtime) stage
// and its ENV, and the metrics the services export (for checking PromQL against them).
import { readFileSync } from "node:fs";
import path from "node:path";
import { beforeAll, expect } from "vitest";
import { parseDockerfile, type Stage } from "./dockerfile.ts";
import { exportedMetrics, seriesNames, type MetricInfo } from "./metric-names.ts";
import { parsePromql } from "./promql.ts";

export const root = path.resolve(import.meta.dirname, "../../..");
export const at = (...p: string[]) => path.join(root, ...p);

export const dockerfile = parseDockerfile(readFileSync(at("deploy/docker/Dockerfile"), "utf8"));
/** The final stage: what the containers run. */
export const runtime = dockerfile.stages.at(-1)!;

/** The image's ENV (final stage), which every container starts from. */
export function imageEnv(stage: Stage): Record<string, string> {
  const env: Record<string, string> = {};
  for (const ins of stage.instructions.filter((i) => i.keyword === "ENV")) {
    for (const m of ins.rest.matchAll(/([A-Za-z_][A-Za-z0-9_]*)=("[^"]*"|\S*)/g)) env[m[1]!] = m[2]!.replace(/^"|"$/g, "");
  }
  return env;
}

/**
 * The metrics the services export, read in a beforeAll of the calling test file: `list()` them,
 * or check that a PromQL query parses and selects only exported series (`query()`, which returns
 * the metric names it selects).
 */
export function exportedMetricsOnce(): { list(): MetricInfo[]; query(promql: string, where: string): string[] } {
  let metrics: MetricInfo[] | undefined;
  let series: Set<string> | undefined;
  beforeAll(async () => {
    metrics = await exportedMetrics();
    series = seriesNames(metrics);
  });
  const loaded = () => {
    if (!metrics || !series) throw new Error("exported metrics are read in beforeAll; use them inside a test");
    return { metrics, series };
  };
  return {
    list: () => loaded().metrics,
    query(promql, where) {
      const { series } = loaded();
      const parsed = parsePromql(promql);
      expect(parsed.errors, `${where}: ${promql}`).toEqual([]);
      expect(parsed.metrics.length, `${where}: selects no metric`).toBeGreaterThan(0);
      for (const m of parsed.metrics) expect(series.has(m), `${where}: ${m} is not a metric ctxbank exports`).toBe(true);
      return parsed.metrics;
    },
  };
}
