// GET /dashboard: a live page over this process's /metrics, served whole from the app (page,
// scripts, styles and uPlot from node_modules; no CDN). Files are read once, when the routes are
// built; the Content-Security-Policy keeps the page to its own origin.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import { newApp, type ServiceApp } from "../../../shared/platform/http/app.ts";
import { ApiError } from "../../../shared/platform/http/errors.ts";

const here = (name: string) => fileURLToPath(new URL(name, import.meta.url));
const uplot = (name: string) => createRequire(import.meta.url).resolve(`uplot/dist/${name}`);

const JS = "text/javascript; charset=utf-8";
/** Asset name under /dashboard/ → file and content type. Only these are served. */
const ASSETS: Record<string, { file: string; type: string }> = {
  "app.js": { file: here("app.js"), type: JS },
  "charts.js": { file: here("charts.js"), type: JS },
  "format.js": { file: here("format.js"), type: JS },
  "prom-math.js": { file: here("prom-math.js"), type: JS },
  "prom-parse.js": { file: here("prom-parse.js"), type: JS },
  "stats.js": { file: here("stats.js"), type: JS },
  "tiles.js": { file: here("tiles.js"), type: JS },
  "style.css": { file: here("style.css"), type: "text/css; charset=utf-8" },
  "favicon.svg": { file: here("favicon.svg"), type: "image/svg+xml" },
  "uplot.esm.js": { file: uplot("uPlot.esm.js"), type: JS },
  "uplot.min.css": { file: uplot("uPlot.min.css"), type: "text/css; charset=utf-8" },
};

const HEADERS = {
  "cache-control": "no-cache",
  "x-content-type-options": "nosniff",
  // uPlot sets element styles from script (allowed); no inline <style>/<script> in the page.
  "content-security-policy": "default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
};

export function dashboardRoutes(): ServiceApp {
  const page = readFileSync(here("page.html"));
  const assets = new Map(Object.entries(ASSETS).map(([name, a]) => [name, { body: readFileSync(a.file), type: a.type }]));
  const app = newApp();
  app.get("/dashboard", (c) => c.body(page, 200, { ...HEADERS, "content-type": "text/html; charset=utf-8" }));
  app.get("/dashboard/:asset", (c) => {
    const asset = assets.get(c.req.param("asset"));
    if (!asset) throw new ApiError(404, "not_found", `no dashboard file ${JSON.stringify(c.req.param("asset"))}`);
    return c.body(asset.body, 200, { ...HEADERS, "content-type": asset.type });
  });
  return app;
}
