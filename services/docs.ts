// GET /docs: Swagger UI over /openapi.json, served from the pinned swagger-ui-dist package in
// node_modules (never a CDN), with a Content-Security-Policy that keeps the page to this origin.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { newApp, type ServiceApp } from "../shared/platform/http/app.ts";
import { ApiError } from "../shared/platform/http/errors.ts";

const dist = (name: string) => createRequire(import.meta.url).resolve(`swagger-ui-dist/${name}`);

/** Asset name under /docs/assets/ → file and content type. Only these are served. */
const ASSETS: Record<string, { file: string; type: string }> = {
  "swagger-ui.css": { file: dist("swagger-ui.css"), type: "text/css; charset=utf-8" },
  "swagger-ui-bundle.js": { file: dist("swagger-ui-bundle.js"), type: "text/javascript; charset=utf-8" },
  "init.js": { file: "", type: "text/javascript; charset=utf-8" },
};

// The page has no inline script (the CSP forbids it): init.js starts the UI.
const INIT = `window.onload = () => { window.ui = SwaggerUIBundle({ url: "/openapi.json", dom_id: "#swagger-ui" }); };\n`;
const PAGE = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8" />
<meta name="viewport" content="width=device-width, initial-scale=1" />
<title>ctxbank API</title>
<link rel="stylesheet" href="/docs/assets/swagger-ui.css" />
</head>
<body>
<div id="swagger-ui"></div>
<script src="/docs/assets/swagger-ui-bundle.js"></script>
<script src="/docs/assets/init.js"></script>
</body>
</html>
`;

const HEADERS = {
  "cache-control": "no-cache",
  "x-content-type-options": "nosniff",
  // Swagger UI sets inline styles and shows data: images; everything else is this origin's.
  "content-security-policy":
    "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
};

export function docsRoutes(): ServiceApp {
  const assets = new Map(
    Object.entries(ASSETS).map(([name, a]) => [name, { body: a.file === "" ? Buffer.from(INIT) : readFileSync(a.file), type: a.type }]),
  );
  const app = newApp();
  app.get("/docs", (c) => c.body(PAGE, 200, { ...HEADERS, "content-type": "text/html; charset=utf-8" }));
  app.get("/docs/assets/:asset", (c) => {
    const asset = assets.get(c.req.param("asset"));
    if (!asset) throw new ApiError(404, "not_found", `no docs file ${JSON.stringify(c.req.param("asset"))}`);
    return c.body(asset.body, 200, { ...HEADERS, "content-type": asset.type });
  });
  return app;
}
