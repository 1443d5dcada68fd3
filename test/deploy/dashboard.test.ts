// GET /dashboard in real headless Chromium against the services in this process: the page loads
// with no console errors and no failed requests, shows "no data" (never NaN) while idle, and after
// real completions shows the request count, rates and TTFT/TPOT quantiles that /metrics implies.
// Set CTXBANK_DASHBOARD_SCREENSHOT=docs/dashboard.png to keep the screenshot somewhere else.
import os from "node:os";
import path from "node:path";
import type { Page } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { histogramQuantile } from "../../services/decode/dashboard/prom-math.js";
import { parsePrometheus } from "../../services/decode/dashboard/prom-parse.js";
import { M } from "../../services/decode/dashboard/stats.js";
import { launchChromium, type Browser } from "../harness/chromium.ts";
import { postJson } from "../harness/http.ts";
import { type Serve, startServe } from "../harness/serve.ts";

const SCREENSHOT = process.env.CTXBANK_DASHBOARD_SCREENSHOT ?? path.join(os.tmpdir(), "ctxbank-dashboard.png");
const WAIT_MS = 120_000; // a 2-core box running other work: scrapes every 2 s can lag
const POLL = { timeout: WAIT_MS, interval: 250 };
const WAVES = Number(process.env.CTXBANK_DASHBOARD_WAVES ?? 3); // more make a fuller screenshot

/** The status line's state and text. */
async function status(page: Page): Promise<string> {
  const el = page.locator("#status");
  return `${await el.getAttribute("data-state")} ${await el.innerText()}`;
}

/** A tile's raw figure (null when it shows "no data") and its texts. */
async function tile(page: Page, id: string) {
  const el = page.locator(`[data-tile="${id}"]`);
  const raw = await el.locator(".value").getAttribute("data-value");
  return {
    value: raw === "" || raw === null ? null : Number(raw),
    text: await el.locator(".value").innerText(),
    sub: await el.locator(".sub").innerText(),
  };
}

describe("dashboard in headless Chromium", () => {
  let s: Serve;
  let browser: Browser;
  let page: Page;
  const problems: string[] = [];
  let opened = 0;

  beforeAll(async () => {
    s = await startServe();
    browser = await launchChromium();
    page = await browser.context.newPage();
    page.on("console", (m) => {
      if (m.type() === "error") problems.push(`console error: ${m.text()}`);
    });
    page.on("pageerror", (e) => problems.push(`page error: ${e.message}`));
    page.on("requestfailed", (r) => problems.push(`request failed: ${r.url()} ${r.failure()?.errorText}`));
    page.on("response", (r) => {
      if (r.status() >= 400) problems.push(`HTTP ${r.status()}: ${r.url()}`);
    });
  });

  /** The dashboard in a new page whose /metrics answers `body`; its page and console errors collect in `errors`. */
  async function dashboardOver(body: string): Promise<{ page: Page; errors: string[] }> {
    const other = await browser.context.newPage();
    await other.route("**/metrics", (route) => route.fulfill({ status: 200, contentType: "text/plain", body }));
    const errors: string[] = [];
    other.on("pageerror", (e) => errors.push(e.message));
    other.on("console", (m) => m.type() === "error" && errors.push(m.text()));
    await other.goto(`${s.url}/dashboard`);
    return { page: other, errors };
  }

  afterAll(async () => {
    await browser?.close();
    await s?.stop();
  });

  it("serves the page and its files from the app, same origin only", async () => {
    const res = await fetch(`${s.url}/dashboard`);
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toMatch(/^text\/html/);
    expect(res.headers.get("content-security-policy")).toContain("default-src 'self'");
    const html = await res.text();
    expect(html).not.toMatch(/https?:\/\//); // no CDN
    for (const [file, type] of [
      ["app.js", "text/javascript"],
      ["uplot.esm.js", "text/javascript"],
      ["uplot.min.css", "text/css"],
    ]) {
      const r = await fetch(`${s.url}/dashboard/${file}`);
      expect(r.status, file).toBe(200);
      expect(r.headers.get("content-type"), file).toContain(type);
    }
    for (const name of ["nope.js", "..%2Fpackage.json", "route.ts"]) {
      const r = await fetch(`${s.url}/dashboard/${name}`);
      expect(r.status, name).toBe(404);
      expect(((await r.json()) as { error: { code: string } }).error.code).toBe("not_found");
    }
  });

  it("renders while idle: live status, zero request rate, no quantiles, no NaN", async () => {
    opened = performance.now();
    await page.goto(`${s.url}/dashboard`);
    // Two scrapes make a window; the status then names its span and the request rate is known.
    await expect.poll(() => status(page), POLL).toMatch(/^ok live · every 2 s · window \d+ s/);
    await expect.poll(async () => (await tile(page, "requests")).value, POLL).not.toBeNull();
    expect((await tile(page, "requests")).value).toBe(0);
    expect(await tile(page, "ttft")).toMatchObject({ value: null, text: "—" });
    expect(await tile(page, "attainment")).toMatchObject({ value: null, text: "—" });
    expect(await page.locator("[data-chart]").count()).toBe(8);
    expect(await page.locator('[data-chart="ttft"]').getAttribute("class")).toContain("no-data");
    expect(await page.locator("body").innerText()).not.toMatch(/NaN|Infinity|undefined/);
    expect(problems).toEqual([]);
  });

  it("shows the completions it is sent: request count and rate, TTFT/TPOT quantiles, charts", async () => {
    const latencies: number[] = [];
    // Waves of two concurrent completions, a few seconds apart, so the charts show a shape.
    for (let wave = 0; wave < WAVES; wave++) {
      await Promise.all(
        [0, 1].map(async (i) => {
          const t0 = performance.now();
          const res = await postJson(`${s.url}/v1/completions`, {
            model: "default",
            prompt: `Count to ten, wave ${wave} #${i}:`,
            max_tokens: 24,
            temperature: 0,
          });
          expect(res.status, JSON.stringify(res.body)).toBe(200);
          latencies.push((performance.now() - t0) / 1000);
        }),
      );
      await new Promise((r) => setTimeout(r, 3_000));
    }
    const sent = 2 * WAVES;
    await expect.poll(async () => (await tile(page, "requests")).sub, POLL).toMatch(new RegExp(`^${sent} in `));
    await expect.poll(async () => (await tile(page, "ttft")).value, POLL).toBeGreaterThan(0);
    const requests = await tile(page, "requests");
    const ttft = await tile(page, "ttft");
    const tpot = await tile(page, "tpot");
    expect(requests.value).toBeGreaterThan(0);
    // The requests sent, over a window no longer than the page has been open.
    expect(requests.value!).toBeGreaterThanOrEqual(sent / ((performance.now() - opened) / 1000));
    expect(requests.sub).toMatch(new RegExp(`^${sent} in [\\d.]+ (s|min) · ${sent} since start$`));
    expect(requests.text).toMatch(/^\d+(\.\d+)?\/s$/);
    // The page's TTFT p50 is histogram_quantile over the same buckets /metrics has now (the page's
    // window starts before the first request), and lies within what the client measured.
    const ttftFamily = parsePrometheus(await (await fetch(`${s.url}/metrics`)).text()).families.get(M.ttft!)!;
    const buckets = ttftFamily.samples
      .filter((x) => x.name.endsWith("_bucket"))
      .map((b) => ({ le: b.labels.le === "+Inf" ? Infinity : Number(b.labels.le), count: b.value }));
    const expectedP50 = histogramQuantile(0.5, buckets); // sums the buckets of equal bound itself
    expect(ttft.value).toBeCloseTo(expectedP50, 9);
    expect(ttft.value!).toBeGreaterThan(0);
    expect(ttft.value!).toBeLessThan(Math.max(...latencies) * 2.5); // a bucket's upper bound may exceed the sample
    expect(ttft.text).toMatch(/^\d+(\.\d+)? (ms|s)$/);
    expect(ttft.sub).toMatch(/^p90 \d.* · p99 \d.* · target 2 s$/);
    expect(tpot.value!).toBeGreaterThan(0);
    expect(Number.isFinite(tpot.value)).toBe(true);
    expect((await tile(page, "tokens")).value!).toBeGreaterThan(0);
    expect((await tile(page, "kv")).sub).toMatch(/device .* of .*shard .* of /);
    const attainment = await tile(page, "attainment");
    expect(attainment.value!).toBeGreaterThanOrEqual(0);
    expect(attainment.value!).toBeLessThanOrEqual(1);
    for (const chart of ["throughput", "ttft", "tpot", "queues", "kv", "tokens"]) {
      const el = page.locator(`[data-chart="${chart}"]`);
      expect(await el.getAttribute("class"), chart).not.toContain("no-data");
      expect(Number(await el.getAttribute("data-points")), chart).toBeGreaterThan(0);
      expect(await el.locator("canvas").count(), chart).toBe(1);
    }
    expect(await page.locator("body").innerText()).not.toMatch(/NaN|Infinity|undefined/);
    await page.screenshot({ path: SCREENSHOT, fullPage: true });
    expect(problems).toEqual([]);
  });

  it("shows a decode-only process's /metrics (no shard tier, no prefill series) without gaps or NaN", async () => {
    // This process's real /metrics less what only a prefill reports, as a decode-only process has it.
    const full = await (await fetch(`${s.url}/metrics`)).text();
    const decodeOnly = full
      .split("\n")
      .filter((l) => !/tier="shard"|service="prefill"|ctxbank:prefill_tokens_total/.test(l))
      .join("\n");
    expect(decodeOnly).toMatch(/^ctxbank:kv_bytes_in_use\{[^}]*tier="device"/m);
    expect(full).toMatch(/^ctxbank:kv_bytes_in_use\{[^}]*tier="shard"/m);
    const { page: other, errors } = await dashboardOver(decodeOnly);
    await expect.poll(() => status(other), POLL).toMatch(/^ok live · every 2 s · window \d+ s/);
    await expect.poll(async () => (await tile(other, "requests")).value, POLL).not.toBeNull(); // two scrapes
    const kv = await tile(other, "kv");
    expect(kv.sub).toMatch(/^device .* of 2 GiB/);
    expect(kv.sub).not.toContain("shard");
    expect((await tile(other, "queues")).sub).toMatch(/^decode \d+\/\d+$/);
    expect(await other.locator('[data-chart="kv"] .u-legend').innerText()).not.toContain("shard");
    expect((await tile(other, "requests")).value).toBe(0); // the same text twice: nothing new
    expect(await other.locator("body").innerText()).not.toMatch(/NaN|Infinity|undefined/);
    expect(errors).toEqual([]);
    await other.close();
  });

  it("copes with a /metrics that has no ctxbank series at all", async () => {
    const { page: other, errors } = await dashboardOver("# TYPE up gauge\nup 1\n");
    await expect.poll(() => status(other), POLL).toMatch(/^empty no ctxbank metrics in \/metrics · every 2 s · window \d+ s/);
    expect(await tile(other, "requests")).toMatchObject({ value: null, text: "—" });
    expect(await tile(other, "kv")).toMatchObject({ value: null, sub: "no KV gauges" });
    expect(await other.locator(".chart.no-data").count()).toBe(8);
    expect(await other.locator("body").innerText()).not.toMatch(/NaN|Infinity|undefined/);
    expect(errors).toEqual([]);
    await other.close();
  });
});
