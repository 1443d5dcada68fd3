// The Grafana dashboard over ctxbank's Prometheus metrics (shared/platform/metrics), as code: `npx tsx
// deploy/grafana/build.ts` writes deploy/grafana/ctxbank.json from it, and test/deploy/deploy-grafana.test.ts
// checks that the file is current, that every query parses as PromQL and names only metrics the
// services export, and that the layout has no overlaps. Classic dashboard JSON; the Prometheus
// datasource is a template variable, so the file imports into any Grafana without editing.

/** Grafana's classic dashboard schema version this file is written for (Grafana 12.2+ reads it as-is; older ones migrate it). */
export const SCHEMA_VERSION = 42;

const DS = { type: "prometheus", uid: "${datasource}" } as const;
/** Every ctxbank series carries the scrape's namespace and the model label. */
const SEL = 'namespace=~"$namespace", model=~"$model"';
/** prom-client's process metrics have no model label. */
const PROC = 'namespace=~"$namespace"';
const RATE = "[$__rate_interval]";

interface Target {
  expr: string;
  legend: string;
}

interface PanelSpec {
  title: string;
  description: string;
  kind: "timeseries" | "stat";
  unit: string;
  width: number;
  height: number;
  targets: Target[];
  /** Fixed axis minimum (0 for amounts that cannot be negative). */
  min?: number;
  max?: number;
  /** Series drawn as dashed lines (SLO targets, capacities). */
  dashed?: string[];
}

export type Panel = Record<string, unknown> & { id: number; type: string; gridPos: { x: number; y: number; w: number; h: number } };

const rate = (metric: string, extra = "") => `rate(${metric}{${SEL}${extra}}${RATE})`;

/** p50/p90/p99 of a histogram (optionally per label), plus an SLO target line. */
function quantiles(metric: string, by = "", slo?: string): Target[] {
  const group = by ? `le, ${by}` : "le";
  const suffix = by ? ` {{${by}}}` : "";
  const lines = [0.5, 0.9, 0.99].map((q) => ({
    expr: `histogram_quantile(${q}, sum by (${group}) (${rate(`${metric}_bucket`)}))`,
    legend: `p${q * 100}${suffix}`,
  }));
  if (slo) lines.push({ expr: `max(ctxbank:slo_target_seconds{${SEL}, slo="${slo}"})`, legend: "SLO target" });
  return lines;
}

/** The share of finished requests that met each SLO (all = every configured one: goodput's share). */
const attainment = (window: string, by = "slo", extra = "") => {
  const met = `sum by (${by}) (increase(ctxbank:slo_met_total{${SEL}${extra}}[${window}]))`;
  const missed = `sum by (${by}) (increase(ctxbank:slo_missed_total{${SEL}${extra}}[${window}]))`;
  return `${met} / (${met} + ${missed})`;
};

const finished = `sum(${rate("ctxbank:request_success_total")})`;
const failed = `(sum(${rate("ctxbank:request_failure_total")}) or vector(0))`;

interface Section {
  row: string;
  panels: PanelSpec[];
}

const SECTIONS: Section[] = [
  {
    row: "Service level",
    panels: [
      {
        kind: "stat",
        title: "Request rate",
        description: "Generation requests ending per second, finished or failed.",
        unit: "reqps",
        width: 6,
        height: 4,
        targets: [{ expr: `${finished} + ${failed}`, legend: "requests/s" }],
      },
      {
        kind: "stat",
        title: "Goodput",
        description: "Finished requests per second that met every configured SLO (DistServe's goodput).",
        unit: "reqps",
        width: 6,
        height: 4,
        targets: [{ expr: `sum(${rate("ctxbank:slo_met_total", ', slo="all"')})`, legend: "goodput" }],
      },
      {
        kind: "stat",
        title: "SLO attainment (all SLOs, time range)",
        description: "Share of finished requests in the selected time range that met every configured SLO.",
        unit: "percentunit",
        width: 6,
        height: 4,
        min: 0,
        max: 1,
        targets: [{ expr: attainment("$__range", "slo", ', slo="all"'), legend: "attainment" }],
      },
      {
        kind: "stat",
        title: "Failure ratio",
        description: "Share of generation requests that did not finish (any error code, cancellations included).",
        unit: "percentunit",
        width: 6,
        height: 4,
        min: 0,
        max: 1,
        targets: [{ expr: `${failed} / (${finished} + ${failed})`, legend: "failed" }],
      },
      {
        kind: "timeseries",
        title: "Throughput and goodput",
        description: "Finished requests/s, those that met every SLO (goodput), and failed requests/s.",
        unit: "reqps",
        width: 12,
        height: 8,
        min: 0,
        targets: [
          { expr: finished, legend: "finished" },
          { expr: `sum(${rate("ctxbank:slo_met_total", ', slo="all"')})`, legend: "goodput" },
          { expr: failed, legend: "failed" },
        ],
      },
      {
        kind: "timeseries",
        title: "SLO attainment per SLO",
        description: "Share of finished requests that met each SLO (ttft, tpot, e2e when configured; all = every one).",
        unit: "percentunit",
        width: 12,
        height: 8,
        min: 0,
        max: 1,
        targets: [{ expr: attainment("$__rate_interval"), legend: "{{slo}}" }],
      },
    ],
  },
  {
    row: "Latency",
    panels: [
      {
        kind: "timeseries",
        title: "Time to first token",
        description: "From arrival at decode to the first token (prefill queue + prefill + handle round trip). Prefill capacity drives it.",
        unit: "s",
        width: 12,
        height: 8,
        min: 0,
        dashed: ["SLO target"],
        targets: quantiles("ctxbank:time_to_first_token_seconds", "", "ttft"),
      },
      {
        kind: "timeseries",
        title: "Time per output token",
        description: "Mean time per token after the first, per request. Decode capacity and batch size drive it.",
        unit: "s",
        width: 12,
        height: 8,
        min: 0,
        dashed: ["SLO target"],
        targets: quantiles("ctxbank:time_per_output_token_seconds", "", "tpot"),
      },
      {
        kind: "timeseries",
        title: "Inter-token latency",
        description: "Every gap between consecutive tokens (the second token also waits for the KV load).",
        unit: "s",
        width: 12,
        height: 8,
        min: 0,
        targets: quantiles("ctxbank:inter_token_latency_seconds"),
      },
      {
        kind: "timeseries",
        title: "End-to-end latency",
        description: "From arrival to the last token.",
        unit: "s",
        width: 12,
        height: 8,
        min: 0,
        dashed: ["SLO target"],
        targets: quantiles("ctxbank:e2e_request_latency_seconds", "", "e2e"),
      },
      {
        kind: "timeseries",
        title: "Queue time",
        description: "Time waiting for a place: the prefill queue plus the decode batch queue.",
        unit: "s",
        width: 12,
        height: 8,
        min: 0,
        targets: quantiles("ctxbank:request_queue_time_seconds"),
      },
      {
        kind: "timeseries",
        title: "Tokens per second",
        description: "Prompt tokens admitted to decode, tokens generated, and prompt tokens the prefill service computed.",
        unit: "short",
        width: 12,
        height: 8,
        min: 0,
        targets: [
          { expr: `sum(${rate("ctxbank:prompt_tokens_total")})`, legend: "prompt" },
          { expr: `sum(${rate("ctxbank:generation_tokens_total")})`, legend: "generated" },
          { expr: `sum(${rate("ctxbank:prefill_tokens_total")})`, legend: "prefilled" },
        ],
      },
    ],
  },
  {
    row: "Load and KV memory",
    panels: [
      {
        kind: "timeseries",
        title: "Requests running and waiting",
        description:
          "Prefills computing / queued, and decode sequences in the batch / admitted but waiting (the autoscalers' queue signals).",
        unit: "short",
        width: 12,
        height: 8,
        min: 0,
        targets: [
          { expr: `sum by (service) (ctxbank:num_requests_running{${SEL}})`, legend: "{{service}} running" },
          { expr: `sum by (service) (ctxbank:num_requests_waiting{${SEL}})`, legend: "{{service}} waiting" },
        ],
      },
      {
        kind: "timeseries",
        title: "KV bytes per tier vs capacity",
        description:
          "device: decode KV reserved for live sequences vs the KV budget; shard: prefill shard bytes vs shard size; host: the offload context bank.",
        unit: "bytes",
        width: 12,
        height: 8,
        min: 0,
        dashed: ["device capacity", "host capacity", "shard capacity"],
        targets: [
          { expr: `sum by (tier) (ctxbank:kv_bytes_in_use{${SEL}})`, legend: "{{tier}} in use" },
          { expr: `sum by (tier) (ctxbank:kv_bytes_capacity{${SEL}})`, legend: "{{tier}} capacity" },
        ],
      },
      {
        kind: "timeseries",
        title: "KV utilisation per pod",
        description: "In use over capacity, per pod and tier (tiers with no capacity are left out).",
        unit: "percentunit",
        width: 12,
        height: 8,
        min: 0,
        max: 1,
        targets: [{ expr: `ctxbank:kv_bytes_in_use{${SEL}} / (ctxbank:kv_bytes_capacity{${SEL}} > 0)`, legend: "{{pod}} {{tier}}" }],
      },
      {
        kind: "timeseries",
        title: "Prefill throughput estimate",
        description: "The prompt tokens/s each prefill pod predicts TTFT with for SLO admission (a moving average of measured prefills).",
        unit: "short",
        width: 12,
        height: 8,
        min: 0,
        targets: [{ expr: `max by (pod) (ctxbank:prefill_tokens_per_second{${SEL}})`, legend: "{{pod}}" }],
      },
    ],
  },
  {
    row: "KV transfer",
    panels: [
      {
        kind: "timeseries",
        title: "KV bytes moved per transport",
        description: "Chunk bytes decode read from prefill shards, per second.",
        unit: "Bps",
        width: 8,
        height: 8,
        min: 0,
        targets: [{ expr: `sum by (transport) (${rate("ctxbank:kv_transfer_bytes_total")})`, legend: "{{transport}}" }],
      },
      {
        kind: "timeseries",
        title: "KV load latency per transport",
        description: "A request's whole KV load: lease, read, verify and import of every chunk.",
        unit: "s",
        width: 8,
        height: 8,
        min: 0,
        targets: quantiles("ctxbank:kv_transfer_seconds", "transport"),
      },
      {
        kind: "timeseries",
        title: "KV load failures",
        description: "Failed KV loads per second by transport and reason (transport, corrupt, unavailable, failed_owner, expired).",
        unit: "short",
        width: 8,
        height: 8,
        min: 0,
        targets: [
          { expr: `sum by (transport, reason) (${rate("ctxbank:kv_transfer_failures_total")})`, legend: "{{transport}} {{reason}}" },
        ],
      },
    ],
  },
  {
    row: "Sessions and routing",
    panels: [
      {
        kind: "timeseries",
        title: "Prompt placement",
        description:
          "Where decodes had prompts computed, per second: local (in the decode's own steps), remote (a prefill instance) or in_process (serve), and why (short, fraction, pool_full, long, session, colocated, off).",
        unit: "reqps",
        width: 8,
        height: 8,
        min: 0,
        targets: [{ expr: `sum by (where, cause) (${rate("ctxbank:prefill_placements_total")})`, legend: "{{where}} {{cause}}" }],
      },
      {
        kind: "timeseries",
        title: "Prompt tokens reused from sessions",
        description: "Prompt tokens per second whose KV came from a parked session, beside all prompt tokens admitted to decode.",
        unit: "short",
        width: 8,
        height: 8,
        min: 0,
        targets: [
          { expr: `sum(${rate("ctxbank:session_reused_tokens_total")})`, legend: "reused" },
          { expr: `sum(${rate("ctxbank:prompt_tokens_total")})`, legend: "all prompt tokens" },
        ],
      },
      {
        kind: "timeseries",
        title: "Sessions kept",
        description:
          "Conversations the decodes keep between turns, by tier, and what happens to them per second (resumed, spilled to disk, dropped, expired).",
        unit: "short",
        width: 8,
        height: 8,
        min: 0,
        targets: [
          { expr: `sum by (tier) (ctxbank:sessions{${SEL}})`, legend: "{{tier}}" },
          { expr: `sum by (event) (${rate("ctxbank:session_events_total")})`, legend: "{{event}}/s" },
        ],
      },
      {
        kind: "timeseries",
        title: "Router: why each request went where it did",
        description:
          "Requests the routers forwarded per second, by reason: session / prefix (to the decode holding the conversation's KV), load, holder_busy, holder_gone, round_robin; retries on the next decode and requests no decode could take.",
        unit: "reqps",
        width: 12,
        height: 8,
        min: 0,
        targets: [
          { expr: `sum by (reason) (rate(ctxbank:router_requests_total{${PROC}}${RATE}))`, legend: "{{reason}}" },
          { expr: `sum by (kind) (rate(ctxbank:router_retries_total{${PROC}}${RATE}))`, legend: "retry {{kind}}" },
          { expr: `sum(rate(ctxbank:router_unrouted_total{${PROC}}${RATE}))`, legend: "unrouted" },
        ],
      },
      {
        kind: "timeseries",
        title: "Router: decodes and their load",
        description: "Requests in flight per decode as each router estimates them, and how many decodes the routers can reach.",
        unit: "short",
        width: 12,
        height: 8,
        min: 0,
        targets: [
          { expr: `max by (decode) (ctxbank:router_decode_load{${PROC}})`, legend: "{{decode}}" },
          { expr: `min(ctxbank:router_decodes{${PROC}})`, legend: "decodes reachable" },
        ],
      },
    ],
  },
  {
    row: "Failures",
    panels: [
      {
        kind: "timeseries",
        title: "Request failures by code",
        description:
          "Generation requests that did not finish, per second, by error code (429s: queue_full, kv_memory_full, shard_full, slo_unattainable).",
        unit: "reqps",
        width: 12,
        height: 8,
        min: 0,
        targets: [{ expr: `sum by (code) (${rate("ctxbank:request_failure_total")})`, legend: "{{code}}" }],
      },
      {
        kind: "timeseries",
        title: "Lease expiries",
        description: "Chunks whose write, retention or read lease ran out and were reclaimed, per second (unread handles, dead decodes).",
        unit: "short",
        width: 12,
        height: 8,
        min: 0,
        targets: [{ expr: `sum by (pod) (${rate("ctxbank:lease_expiries_total")})`, legend: "{{pod}}" }],
      },
    ],
  },
  {
    row: "Queues and devices",
    panels: [
      {
        kind: "timeseries",
        title: "Queue depth per stage",
        description:
          "Requests waiting in each stage's bounded queue (prefill places, decode's calls to prefill, decode batch places); past the bound the answer is 429 queue_full.",
        unit: "short",
        width: 8,
        height: 8,
        min: 0,
        targets: [{ expr: `sum by (stage) (ctxbank:queue_depth{${SEL}})`, legend: "{{stage}}" }],
      },
      {
        kind: "timeseries",
        title: "Queue rejections per stage",
        description: "Requests refused with 429 queue_full per second, by stage.",
        unit: "reqps",
        width: 8,
        height: 8,
        min: 0,
        targets: [{ expr: `sum by (stage) (${rate("ctxbank:queue_rejections_total")})`, legend: "{{stage}}" }],
      },
      {
        kind: "stat",
        title: "Pods per device",
        description: "How many pods run the model's forward passes on each device (cpu, cuda:N).",
        unit: "short",
        width: 8,
        height: 8,
        targets: [{ expr: `sum by (device) (ctxbank:engine_device_info{${SEL}})`, legend: "{{device}}" }],
      },
    ],
  },
  {
    row: "Processes",
    panels: [
      {
        kind: "timeseries",
        title: "CPU per pod",
        description: "CPU seconds per second (the engine threads included).",
        unit: "short",
        width: 8,
        height: 8,
        min: 0,
        targets: [{ expr: `sum by (pod) (rate(process_cpu_seconds_total{${PROC}}${RATE}))`, legend: "{{pod}}" }],
      },
      {
        kind: "timeseries",
        title: "Resident memory per pod",
        description: "Process RSS (weights, KV caches, Node heap; tmpfs shard pages are not in it).",
        unit: "bytes",
        width: 8,
        height: 8,
        min: 0,
        targets: [{ expr: `sum by (pod) (process_resident_memory_bytes{${PROC}})`, legend: "{{pod}}" }],
      },
      {
        kind: "timeseries",
        title: "Event loop lag p99 per pod",
        description: "A slow event loop delays every stream on the pod.",
        unit: "s",
        width: 8,
        height: 8,
        min: 0,
        targets: [{ expr: `max by (pod) (nodejs_eventloop_lag_p99_seconds{${PROC}})`, legend: "{{pod}}" }],
      },
    ],
  },
];

function panelJson(spec: PanelSpec, id: number, gridPos: Panel["gridPos"]): Panel {
  const defaults: Record<string, unknown> = {
    unit: spec.unit,
    ...(spec.min !== undefined ? { min: spec.min } : {}),
    ...(spec.max !== undefined ? { max: spec.max } : {}),
  };
  const overrides = (spec.dashed ?? []).map((name) => ({
    matcher: { id: "byName", options: name },
    properties: [{ id: "custom.lineStyle", value: { fill: "dash", dash: [10, 10] } }],
  }));
  const common = {
    id,
    type: spec.kind,
    title: spec.title,
    description: spec.description,
    datasource: DS,
    gridPos,
    targets: spec.targets.map((t, i) => ({
      refId: String.fromCharCode(65 + i),
      datasource: DS,
      editorMode: "code",
      expr: t.expr,
      legendFormat: t.legend,
      range: true,
    })),
  };
  if (spec.kind === "stat") {
    return {
      ...common,
      fieldConfig: {
        defaults: { ...defaults, color: { mode: "thresholds" }, thresholds: { mode: "absolute", steps: [{ color: "text", value: null }] } },
        overrides: [],
      },
      options: {
        reduceOptions: { calcs: ["lastNotNull"], fields: "", values: false },
        colorMode: "value",
        graphMode: "area",
        textMode: "value",
        justifyMode: "auto",
        orientation: "auto",
      },
    };
  }
  return {
    ...common,
    fieldConfig: {
      defaults: {
        ...defaults,
        color: { mode: "palette-classic" },
        custom: { drawStyle: "line", lineWidth: 1, fillOpacity: 10, showPoints: "never", spanNulls: false },
      },
      overrides,
    },
    options: { legend: { displayMode: "list", placement: "bottom", showLegend: true }, tooltip: { mode: "multi", sort: "desc" } },
  };
}

/** Lays the sections out on Grafana's 24-column grid: a row header, then panels flowing left to right. */
function layout(): Panel[] {
  const panels: Panel[] = [];
  let id = 1;
  let y = 0;
  for (const section of SECTIONS) {
    panels.push({ id: id++, type: "row", title: section.row, collapsed: false, panels: [], gridPos: { x: 0, y, w: 24, h: 1 } });
    y += 1;
    let x = 0;
    let rowHeight = 0;
    for (const spec of section.panels) {
      if (x + spec.width > 24) {
        y += rowHeight;
        x = 0;
        rowHeight = 0;
      }
      panels.push(panelJson(spec, id++, { x, y, w: spec.width, h: spec.height }));
      x += spec.width;
      rowHeight = Math.max(rowHeight, spec.height);
    }
    y += rowHeight;
  }
  return panels;
}

const labelVariable = (name: string, label: string, query: string) => ({
  name,
  label,
  type: "query",
  datasource: DS,
  definition: query,
  query: { qryType: 1, query, refId: "PrometheusVariableQueryEditor-VariableQuery" },
  refresh: 2,
  includeAll: true,
  allValue: ".*",
  multi: true,
  current: { selected: true, text: ["All"], value: ["$__all"] },
  sort: 1,
});

export function buildDashboard(): Record<string, unknown> {
  return {
    uid: "ctxbank",
    title: "ctxbank",
    description: "Disaggregated prefill/decode: SLOs and goodput, latency quantiles, load, KV memory and transfer, failures.",
    tags: ["ctxbank", "llm", "serving"],
    editable: true,
    graphTooltip: 1,
    fiscalYearStartMonth: 0,
    liveNow: false,
    links: [],
    refresh: "30s",
    schemaVersion: SCHEMA_VERSION,
    version: 1,
    time: { from: "now-1h", to: "now" },
    timepicker: {},
    timezone: "browser",
    annotations: {
      list: [
        {
          builtIn: 1,
          datasource: { type: "grafana", uid: "-- Grafana --" },
          enable: true,
          hide: true,
          iconColor: "rgba(0, 211, 255, 1)",
          name: "Annotations & Alerts",
          type: "dashboard",
        },
      ],
    },
    templating: {
      list: [
        {
          name: "datasource",
          label: "Prometheus",
          type: "datasource",
          query: "prometheus",
          refresh: 1,
          current: {},
          hide: 0,
          includeAll: false,
          multi: false,
          regex: "",
        },
        labelVariable("namespace", "Namespace", "label_values(ctxbank:num_requests_running, namespace)"),
        labelVariable("model", "Model", "label_values(ctxbank:num_requests_running, model)"),
      ],
    },
    panels: layout(),
  };
}
