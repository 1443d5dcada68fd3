// Starting and stopping services in this process: `serve` (both, sharing one engine; PGlite by
// default), `prefill` or `decode` (one each, against a shared PostgreSQL). Shutdown is graceful:
// refuse new work, let in-flight requests finish (up to drainMs), cancel what is left (freeing its
// KV and leases), retire the shard, leave the registry.
import type { Config } from "../shared/platform/config.ts";
import { listen, type Listening } from "../shared/platform/http/server.ts";
import { ServiceMetrics } from "../shared/platform/metrics/metrics.ts";
import { openSecurity, type Security } from "../shared/platform/auth/security.ts";
import { DbProbe } from "../shared/platform/registry/db-probe.ts";
import { buildApp, buildInternalApp, type Services } from "./app.ts";
import { DecodeService } from "./decode/service.ts";
import type { PromptCompute } from "./handoff/index.ts";
import { PrefillService } from "./prefill/service.ts";
import { openRuntime, sloTargets, type Runtime } from "./runtime.ts";

export interface RunningServices {
  rt: Runtime;
  services: Services;
  metrics: ServiceMetrics;
  http: Listening;
  url: string;
  /** The internal listener (chunks, prefill calls from decodes, status) and the URL peers use. */
  internal: Listening;
  internalUrl: string;
  security: Security;
  /** Graceful: drain, then release everything. Safe to call more than once. */
  stop(): Promise<void>;
}

export async function startServices(config: Config, rt?: Runtime): Promise<RunningServices> {
  const security = openSecurity(config); // before the model loads: a bad key file fails fast
  const runtime = rt ?? (await openRuntime(config));
  const base = config.instanceId;
  const services: Services = {};
  // One registry for the process: `serve` exports both services' metrics on one /metrics.
  const metrics = new ServiceMetrics({ model: runtime.modelId, slo: sloTargets(config), device: runtime.engine.device });
  const serve = config.role === "serve";
  if (config.role !== "decode") {
    // Colocated, prompts share the decode steps so a long prompt never stalls the running decodes
    // (the decode is made next; a prompt comes only once both serve).
    const compute: PromptCompute | undefined =
      serve && config.prefillChunking === "slo"
        ? (seq, tokens, signal) => services.decode!.scheduler.prefill(seq, tokens, signal)
        : undefined;
    services.prefill = new PrefillService(runtime, serve ? `${base}.prefill` : base, metrics, compute);
  }
  if (config.role !== "prefill") {
    // Under `serve` its own requests' prefills hand their sequences over in process, unless a
    // transport was named: then they take the shard path over it, as between processes.
    const inProcess = serve && config.transport === "auto" ? services.prefill : undefined;
    services.decode = new DecodeService(runtime, serve ? `${base}.decode` : base, metrics, security.internal, inProcess);
  }
  // One probe for both listeners' /ready: it caches the database's answer for both.
  const dbProbe = new DbProbe(runtime.db);
  const app = buildApp(runtime, services, metrics, security, dbProbe);
  const internalApp = buildInternalApp(runtime, services, metrics, security, dbProbe);
  const http = await listen(app.fetch, config.host, config.port, config);
  let internal: Listening;
  try {
    internal = await listen(internalApp.fetch, config.internalHost, config.internalPort, config);
  } catch (err) {
    await http.close(0);
    if (!rt) await runtime.close();
    throw err;
  }
  const url = (config.publicUrl ?? http.url).replace(/\/+$/, "");
  const internalUrl = (config.internalUrl ?? internal.url).replace(/\/+$/, "");
  try {
    // The registry names the internal URL: that is where peers call prefills and read chunks.
    await services.prefill?.start(internalUrl);
    await services.decode?.start(internalUrl, url);
  } catch (err) {
    await Promise.all([http.close(0), internal.close(0)]);
    if (!rt) await runtime.close();
    throw err;
  }
  runtime.log.info(
    { url, internalUrl, role: config.role, keys: security.keys ? security.keys.size : "none (keyless: tenant local)", docs: `${url}/docs` },
    "listening",
  );
  let stopping: Promise<void> | undefined;
  return {
    rt: runtime,
    services,
    metrics,
    http,
    url,
    internal,
    internalUrl,
    security,
    stop() {
      stopping ??= (async () => {
        const deadline = Date.now() + config.drainMs;
        runtime.log.info({ inFlight: http.inFlight }, "draining");
        await Promise.all([services.decode?.drain(deadline), services.prefill?.drain(deadline)]);
        await services.decode?.stop();
        await Promise.all([http.close(Math.max(0, deadline - Date.now())), internal.close(Math.max(0, deadline - Date.now()))]);
        await services.prefill?.stop();
        if (!rt) await runtime.close();
        runtime.log.info("stopped");
      })();
      return stopping;
    },
  };
}

/** Runs `ctxbank <role>` until SIGINT/SIGTERM, then stops gracefully; a second signal exits at once. */
export async function runUntilSignalled(config: Config): Promise<void> {
  if (config.role === "router") {
    const { startRouter } = await import("./router/process.ts");
    const running = await startRouter(config);
    return untilSignalled(running, (sig) => running.log.info({ signal: sig }, "shutting down"));
  }
  const running = await startServices(config);
  return untilSignalled(running, (sig) => running.rt.log.info({ signal: sig }, "shutting down"));
}

async function untilSignalled(running: { stop(): Promise<void> }, onSignal: (sig: NodeJS.Signals) => void): Promise<void> {
  await new Promise<void>((resolve) => {
    let signalled = false;
    const stop = (sig: NodeJS.Signals) => {
      if (signalled) process.exit(130);
      signalled = true;
      onSignal(sig);
      running.stop().then(resolve, (err: unknown) => {
        process.stderr.write(`shutdown failed: ${String(err)}\n`);
        resolve();
      });
    };
    process.on("SIGINT", stop);
    process.on("SIGTERM", stop);
  });
}
