// Writes deploy/grafana/ctxbank.json from dashboard.ts: `npx tsx deploy/grafana/build.ts`.
// test/deploy/deploy-grafana.test.ts fails while the committed file differs from what this writes.
import { writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { buildDashboard } from "./dashboard.ts";

export const DASHBOARD_PATH = fileURLToPath(new URL("./ctxbank.json", import.meta.url));

/** The file's exact text: two-space JSON and a final newline. */
export function dashboardText(): string {
  return JSON.stringify(buildDashboard(), null, 2) + "\n";
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  writeFileSync(DASHBOARD_PATH, dashboardText());
  process.stdout.write(`wrote ${DASHBOARD_PATH}\n`);
}
