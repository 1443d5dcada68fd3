// `ctxbank router`: the deployment's front door. It loads no model: it reads the registry (which
// decodes live, which holds each session) and each decode's status, and forwards requests. Its
// API keys and limits are the deployment's: a key's rate and concurrency hold across all decodes,
// and with several routers (registered like the services) each enforces an equal share of them.
import type { Logger } from "pino";
import type { Config } from "../../shared/platform/config.ts";
import { openSecurity } from "../../shared/platform/auth/security.ts";
import { listen, type Listening } from "../../shared/platform/http/server.ts";
import { DbProbe } from "../../shared/platform/registry/db-probe.ts";
import { openDatabase } from "../../shared/platform/registry/db.ts";
import { Registry } from "../../shared/platform/registry/registry.ts";
import { KeyLimiter } from "../../shared/platform/auth/rate-limit.ts";
import { Membership } from "../membership.ts";
import { createLogger } from "../runtime.ts";
import { buildRouterApp } from "./app.ts";
import { DecodePool } from "./decode-pool.ts";
import { Router } from "./router.ts";

export interface RunningRouter {
  log: Logger;
  router: Router;
  pool: DecodePool;
  http: Listening;
  url: string;
  /** Graceful: stops taking requests, lets those in flight finish (up to drainMs). */
  stop(): Promise<void>;
}

export async function startRouter(config: Config): Promise<RunningRouter> {
  const log = createLogger(config);
  const keys = openSecurity(config);
  const db = await openDatabase(config.databaseUrl, { timeoutMs: config.dbTimeoutMs });
  const registry = new Registry(db.db);
  const pool = new DecodePool({
    registry,
    internalSecret: keys.internalSecret,
    heartbeatTimeoutMs: config.heartbeatTimeoutMs,
    pollMs: config.routerPollMs,
    log,
  });
  // Routers alive (this one included): each holds 1/n of every key's limits.
  let routers = 1;
  const countRouters = async () => {
    routers = Math.max(1, (await registry.instances.findAlive("router", config.heartbeatTimeoutMs).catch(() => [])).length);
  };
  const peers = setInterval(() => void countRouters(), config.routerPollMs);
  peers.unref();
  const security = { ...keys, limiter: new KeyLimiter(undefined, () => routers) };
  let http: Listening | undefined;
  let draining = false;
  try {
    await pool.start();
    const router = new Router({
      pool,
      registry,
      policy: config.routerPolicy,
      imbalance: config.routerImbalance,
      timeoutMs: config.routerTimeoutMs,
      log,
    });
    const app = buildRouterApp({
      router,
      security,
      dbProbe: new DbProbe(db),
      log,
      maxBodyBytes: config.maxBodyBytes,
      routers: () => routers,
      draining: () => draining,
    });
    http = await listen(app.fetch, config.host, config.port, config);
    const url = (config.publicUrl ?? http.url).replace(/\/+$/, "");
    // Registered like the services (its URL: the public one; nothing calls a router internally).
    const membership = new Membership({ registry, config, log }, "router", config.instanceId, url, undefined);
    await membership.start();
    await countRouters();
    log.info({ url, decodes: pool.targets().map((t) => t.id) }, "router listening");
    let stopping: Promise<void> | undefined;
    const listening = http;
    return {
      log,
      router,
      pool,
      http: listening,
      url,
      stop() {
        stopping ??= (async () => {
          draining = true;
          pool.stop();
          clearInterval(peers);
          await membership.leave();
          await listening.close(config.drainMs);
          await db.close();
          log.info("router stopped");
        })();
        return stopping;
      },
    };
  } catch (err) {
    pool.stop();
    clearInterval(peers);
    await http?.close(0);
    await db.close();
    throw err;
  }
}
