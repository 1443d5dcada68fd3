// Headless Chromium for browser tests: Debian's /usr/bin/chromium driven by playwright-core (no
// browser download), in a fresh profile, with the background-networking features off (this
// network refuses Chromium's own connections, and a test must not depend on them).
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { chromium, type BrowserContext } from "playwright-core";

export const CHROMIUM = process.env.CTXBANK_CHROMIUM ?? "/usr/bin/chromium";

export interface Browser {
  context: BrowserContext;
  close(): Promise<void>;
}

export async function launchChromium(viewport = { width: 1400, height: 1000 }): Promise<Browser> {
  if (!existsSync(CHROMIUM))
    throw new Error(`no Chromium at ${CHROMIUM}: apt-get install -y chromium (.ci/run does), or set CTXBANK_CHROMIUM`);
  const profile = await mkdtemp(path.join(os.tmpdir(), "ctxbank-chromium-"));
  // launchPersistentContext passes --user-data-dir=<profile> itself (a fresh, empty profile).
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    viewport,
    timeout: 120_000,
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
  return {
    context,
    async close() {
      await context.close();
      await rm(profile, { recursive: true, force: true });
    },
  };
}
