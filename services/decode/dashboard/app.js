// The dashboard: polls /metrics (same origin) every POLL_MS, keeps the scrapes of the last
// WINDOW_MS, and redraws the tiles and charts from them.
import { Chart, CHARTS } from "./charts.js";
import { span } from "./format.js";
import { labelValues } from "./prom-math.js";
import { parsePrometheus } from "./prom-parse.js";
import { chartData, M, tiles, WINDOW_MS } from "./stats.js";
import { mountTiles } from "./tiles.js";

const POLL_MS = 2000;
const METRICS_URL = new URL("metrics", document.baseURI); // /metrics beside /dashboard

const scrapes = [];
const showTiles = mountTiles(document.getElementById("tiles"));
const charts = CHARTS.map((def) => new Chart(def, document.getElementById("charts")));
const status = document.getElementById("status");
const model = document.getElementById("model");

function setStatus(state, text) {
  status.dataset.state = state;
  status.textContent = text;
}

function render(parseErrors) {
  showTiles(tiles(scrapes));
  const { t, series } = chartData(scrapes);
  for (const chart of charts) chart.update(t, series);
  const last = scrapes[scrapes.length - 1];
  const models = labelValues(last.parsed, M.success, "model");
  model.textContent = models.length ? `model ${models.join(", ")}` : "";
  const windowS = (last.t - scrapes[0].t) / 1000;
  const warn = parseErrors.length ? ` · ${parseErrors.length} unreadable line(s) skipped` : "";
  const ctxbank = [...last.parsed.families.keys()].some((n) => n.startsWith("ctxbank:"));
  setStatus(
    ctxbank ? "ok" : "empty",
    `${ctxbank ? "live" : "no ctxbank metrics in /metrics"} · every ${POLL_MS / 1000} s · window ${span(windowS)} · ${new Date(last.t).toLocaleTimeString()}${warn}`,
  );
}

async function poll() {
  try {
    const res = await fetch(METRICS_URL, { cache: "no-store", headers: { accept: "text/plain" } });
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    const { families, errors } = parsePrometheus(await res.text());
    const t = Date.now();
    scrapes.push({ t, parsed: { families, errors } });
    while (scrapes.length > 2 && scrapes[0].t < t - WINDOW_MS) scrapes.shift();
    render(errors);
  } catch (err) {
    setStatus("error", `cannot read /metrics (${err instanceof Error ? err.message : String(err)}); retrying`);
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

showTiles(null);
setStatus("waiting", "reading /metrics…");
void poll();
