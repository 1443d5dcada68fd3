// The Host allow-list against DNS rebinding: a page on evil.example that rebinds its name to
// 127.0.0.1 reaches a loopback server with `Host: evil.example`, which is refused (421). Allowed:
// loopback names, the hosts of the public and internal URLs, the bind addresses, and
// --allowed-hosts (`*` turns the check off, for a gateway that checks Host itself).
import { isIP } from "node:net";

export class AllowedHosts {
  private readonly names: Set<string>;
  private readonly any: boolean;

  constructor(hosts: Iterable<string>) {
    const list = [...hosts].map(normalise).filter((h) => h !== "");
    this.any = list.includes("*");
    this.names = new Set(list);
  }

  /** From the configuration: bind hosts, public/internal URLs and the extra names. */
  static fromConfig(
    c: { host: string; internalHost: string; publicUrl?: string | undefined; internalUrl?: string | undefined; allowedHosts: string[] },
    boundUrls: string[] = [],
  ): AllowedHosts {
    const urls = [c.publicUrl, c.internalUrl, ...boundUrls].filter((u): u is string => u !== undefined).map((u) => new URL(u).hostname);
    const binds = [c.host, c.internalHost].filter((h) => !isWildcard(h));
    return new AllowedHosts([...urls, ...binds, ...c.allowedHosts]);
  }

  allows(hostHeader: string | undefined): boolean {
    if (this.any) return true;
    if (hostHeader === undefined) return false;
    const name = normalise(stripPort(hostHeader));
    return isLoopbackName(name) || this.names.has(name);
  }
}

export function isWildcard(host: string): boolean {
  return host === "0.0.0.0" || host === "::" || host === "[::]";
}

/** 127.0.0.0/8, ::1, localhost and *.localhost. */
export function isLoopbackName(host: string): boolean {
  const h = normalise(host);
  if (h === "localhost" || h.endsWith(".localhost") || h === "::1") return true;
  return isIP(h) === 4 && h.startsWith("127.");
}

function stripPort(host: string): string {
  if (host.startsWith("[")) return host.slice(0, host.indexOf("]") + 1 || undefined);
  const colon = host.indexOf(":");
  return colon >= 0 && host.indexOf(":", colon + 1) < 0 ? host.slice(0, colon) : host;
}

function normalise(host: string): string {
  return host
    .trim()
    .toLowerCase()
    .replace(/^\[(.*)\]$/, "$1")
    .replace(/\.$/, "");
}
