// The load generator only sends to this machine unless a host is named explicitly: a mistyped
// --base-url must not load someone else's server.
import { isIP } from "node:net";

export function isLoopback(hostname: string): boolean {
  const h = hostname.replace(/^\[|\]$/g, "").toLowerCase();
  if (h === "localhost" || h.endsWith(".localhost")) return true;
  if (isIP(h) === 4) return h.startsWith("127.");
  if (isIP(h) === 6) return h === "::1" || h === "0:0:0:0:0:0:0:1" || /^::ffff:127\./.test(h);
  return false;
}

/** Throws unless `baseUrl` is http(s) on a loopback host or on a host listed in `allowHosts`. */
export function checkTarget(baseUrl: string, allowHosts: readonly string[]): URL {
  let url: URL;
  try {
    url = new URL(baseUrl);
  } catch {
    throw new Error(`--base-url ${JSON.stringify(baseUrl)} is not a URL`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:")
    throw new Error(`--base-url must be http:// or https:// (got ${url.protocol})`);
  const host = url.hostname.replace(/^\[|\]$/g, "").toLowerCase();
  if (isLoopback(host)) return url;
  if (allowHosts.map((h) => h.toLowerCase()).includes(host)) return url;
  throw new Error(`refusing to load ${host}: only loopback hosts unless named with --allow-host ${host}`);
}
