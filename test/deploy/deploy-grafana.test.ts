// Offline checks of deploy/grafana: the committed dashboard is what dashboard.ts builds, takes its
// datasource from a variable, queries only metrics ctxbank exports (covering all of them) and
// lays its panels out without overlaps.
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { dashboardText } from "../../deploy/grafana/build.ts";
import { type buildDashboard, SCHEMA_VERSION, type Panel } from "../../deploy/grafana/dashboard.ts";
import { expandGrafana } from "../harness/deploy/promql.ts";
import { at, exportedMetricsOnce } from "../harness/deploy/setup.ts";

const exported = exportedMetricsOnce();

describe("Grafana dashboard", () => {
  const file = readFileSync(at("deploy/grafana/ctxbank.json"), "utf8");
  const dashboard = JSON.parse(file) as ReturnType<typeof buildDashboard> & {
    panels: Panel[];
    templating: { list: { name: string; type: string; query: unknown }[] };
  };
  const panels = dashboard.panels.filter((p) => p.type !== "row");

  it("is what deploy/grafana/dashboard.ts builds (run `npx tsx deploy/grafana/build.ts`)", () => {
    expect(file).toBe(dashboardText());
  });

  it("takes the Prometheus datasource from a template variable, on the current schema", () => {
    expect(dashboard.schemaVersion).toBe(SCHEMA_VERSION);
    const ds = dashboard.templating.list.find((v) => v.type === "datasource");
    expect(ds?.query).toBe("prometheus");
    const ref = { type: "prometheus", uid: `\${${ds!.name}}` };
    for (const p of panels) {
      expect(p.datasource, p.title as string).toEqual(ref);
      for (const t of p.targets as { datasource: unknown }[]) expect(t.datasource).toEqual(ref);
    }
  });

  it("queries parse and select only exported metrics, covering every ctxbank metric", () => {
    const used = new Set<string>();
    for (const p of panels) {
      for (const t of p.targets as { expr: string; refId: string }[]) {
        for (const m of exported.query(expandGrafana(t.expr), `${p.title as string}/${t.refId}`))
          used.add(m.replace(/_(bucket|sum|count)$/, ""));
      }
    }
    for (const v of dashboard.templating.list.filter((v) => v.type === "query")) {
      const q = (v.query as { query: string }).query;
      const inner = /^label_values\((.+),\s*\w+\)$/.exec(q);
      expect(inner, q).not.toBeNull();
      exported.query(inner![1]!, `variable ${v.name}`);
    }
    const missing = exported
      .list()
      .filter((m) => m.name.startsWith("ctxbank:") && !used.has(m.name))
      .map((m) => m.name);
    expect(missing, "ctxbank metrics with no panel").toEqual([]);
  });

  it("lays panels out on the 24-column grid without overlaps, with unique ids", () => {
    const ids = dashboard.panels.map((p) => p.id);
    expect(new Set(ids).size).toBe(ids.length);
    const cells = new Set<string>();
    for (const p of dashboard.panels) {
      const g = p.gridPos;
      expect(g.x + g.w, p.title as string).toBeLessThanOrEqual(24);
      for (let x = g.x; x < g.x + g.w; x++) {
        for (let y = g.y; y < g.y + g.h; y++) {
          expect(cells.has(`${x},${y}`), `${p.title as string} overlaps at ${x},${y}`).toBe(false);
          cells.add(`${x},${y}`);
        }
      }
    }
  });
});
