// Decode's side of the prefill call: pick a live prefill instance from the registry (this host's
// first, then round robin), POST /v1/prefill over a keep-alive undici pool, and turn its answer
// into a validated handle. A refused or broken connection moves on to the next instance; an
// instance's 4xx is the client's error and is passed on as it is.
import { Pool } from "undici";
import { LOCAL_TENANT } from "../../shared/auth/api-keys.ts";
import type { InternalAuth } from "../../shared/auth/capability.ts";
import { ApiError, type ApiErrorCode, type ApiStatus } from "../../shared/http/errors.ts";
import { HandleSchema, type Handle, type PrefillRequest } from "../../shared/http/wire.ts";
import type { InstanceRow } from "../../shared/registry/registry.ts";
import type { Runtime } from "../runtime.ts";

const PASS_THROUGH = new Set([400, 404, 409, 413, 429]);
/** How long a prefill capability is valid: it only has to reach the instance. */
const CAPABILITY_MS = 60_000;

export class PrefillClient {
  private readonly pools = new Map<string, Pool>();
  private turn = 0;

  constructor(
    private readonly rt: Runtime,
    private readonly auth?: InternalAuth,
  ) {}

  /** Prefills on an instance's internal listener, for `tenant` (a signed capability says so). */
  async prefill(body: PrefillRequest, signal: AbortSignal, tenant: string = LOCAL_TENANT): Promise<Handle> {
    const alive = await this.rt.registry.instances.findAlive("prefill", this.rt.config.heartbeatTimeoutMs);
    if (alive.length === 0) {
      throw new ApiError(503, "no_prefill_instance", "no prefill instance is alive in the registry; start one (ctxbank prefill) or retry");
    }
    const failures: string[] = [];
    for (const inst of this.order(alive).slice(0, 3)) {
      signal.throwIfAborted();
      let res;
      try {
        res = await this.poolFor(inst.baseUrl).request({
          method: "POST",
          path: new URL(inst.baseUrl).pathname.replace(/\/+$/, "") + "/v1/prefill",
          headers: {
            "content-type": "application/json",
            ...(this.auth ? { authorization: `Bearer ${this.auth.sign({ route: "prefill", tenant, exp: Date.now() + CAPABILITY_MS })}` } : {}),
          },
          body: JSON.stringify(body),
          signal,
        });
      } catch (e) {
        if (signal.aborted) throw signal.reason;
        failures.push(`${inst.id} (${inst.baseUrl}): ${(e as { code?: string }).code ?? (e as Error).message}`);
        continue;
      }
      const text = await res.body.text();
      if (res.statusCode === 200) {
        const parsed = HandleSchema.safeParse(JSON.parse(text));
        if (!parsed.success) throw new ApiError(502, "prefill_failed", `prefill instance ${inst.id} answered a malformed handle`);
        return parsed.data;
      }
      const err = parseError(text);
      if (PASS_THROUGH.has(res.statusCode)) {
        throw new ApiError(res.statusCode as ApiStatus, (err?.code ?? "invalid_request") as ApiErrorCode, err?.message ?? text.slice(0, 300), err?.param ?? null);
      }
      failures.push(`${inst.id}: ${res.statusCode} ${err?.message ?? text.slice(0, 200)}`);
      if (res.statusCode !== 503) break; // a 500 from the instance is not a reason to redo the work elsewhere
    }
    const serverError = failures.some((f) => /: 5\d\d /.test(f) && !/: 503 /.test(f));
    throw new ApiError(
      serverError ? 502 : 503,
      serverError ? "prefill_failed" : "no_prefill_instance",
      `no prefill instance could take the request: ${failures.join("; ")}`,
    );
  }

  private order(alive: InstanceRow[]): InstanceRow[] {
    const start = this.turn++ % alive.length;
    const rotated = [...alive.slice(start), ...alive.slice(0, start)];
    const local = rotated.filter((i) => i.hostId === this.rt.config.hostId);
    return [...local, ...rotated.filter((i) => i.hostId !== this.rt.config.hostId)];
  }

  private poolFor(baseUrl: string): Pool {
    const origin = new URL(baseUrl).origin;
    let pool = this.pools.get(origin);
    if (!pool) {
      // A long prompt takes long to prefill: no header/body timeouts; the client's signal bounds it.
      pool = new Pool(origin, { connections: 16, pipelining: 1, headersTimeout: 0, bodyTimeout: 0, keepAliveTimeout: 30_000 });
      this.pools.set(origin, pool);
    }
    return pool;
  }

  async close(): Promise<void> {
    const pools = [...this.pools.values()];
    this.pools.clear();
    await Promise.all(pools.map((p) => p.close()));
  }
}

function parseError(text: string): { code?: string; message?: string; param?: string | null } | undefined {
  try {
    return (JSON.parse(text) as { error?: { code?: string; message?: string; param?: string | null } }).error;
  } catch {
    return undefined;
  }
}
