// API keys for the public API. A key is `ctxb_<id>_<secret>` (the secret: 32 random bytes,
// base64url); the service stores only `sha256:<hex>` of the whole key, one line per key:
//
//   # id      hash                                                                     limits (optional)
//   alice     sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08    rate=5 burst=10 concurrency=4
//
// The secret is 256 random bits, so a fast hash is enough: nothing can be guessed from it, and a
// slow one (scrypt) would cost tens of ms of CPU on every request. The id inside the key finds the
// entry; the hashes are compared in constant time (and a missing id is compared against a dummy,
// so an unknown id takes as long as a wrong secret).
import { CtxbankError } from "../../inference/errors.ts";
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import { readFileSync } from "node:fs";

/** Key ids name tenants: no ':' (it separates a tenant from its request ids), no '_' (it ends the id in a key), not "local". */
export const KEY_ID = /^[A-Za-z0-9][A-Za-z0-9-]{0,31}$/;
/** The tenant of a keyless server (loopback `serve` without keys). */
export const LOCAL_TENANT = "local";
const KEY = /^ctxb_([A-Za-z0-9][A-Za-z0-9-]{0,31})_([A-Za-z0-9_-]{43})$/;
const HASH = /^sha256:([0-9a-f]{64})$/;

export interface KeyLimits {
  /** Requests per second refilled into the key's bucket; 0 = unlimited. */
  rate: number;
  /** Bucket size: requests allowed at once after a quiet spell. */
  burst: number;
  /** Requests in flight at once; 0 = unlimited. */
  concurrency: number;
}

export interface ApiKeyEntry {
  id: string;
  hash: Buffer;
  limits: KeyLimits;
}

/** A malformed API key line or key id (the keys file, CTXBANK_API_KEYS, `ctxbank keys new`). */
export class ApiKeyError extends CtxbankError<"invalid_config"> {
  static override readonly codes = ["invalid_config"] as const;
  override readonly name = "ApiKeyError";
  constructor(message: string) {
    super("invalid_config", message);
  }
}

export function hashKey(key: string): Buffer {
  return createHash("sha256").update(key, "utf8").digest();
}

/** A new key for `id` and the line that registers it. */
export function newApiKey(id: string, limits: Partial<KeyLimits> = {}): { key: string; line: string } {
  if (!KEY_ID.test(id) || id === LOCAL_TENANT) {
    throw new ApiKeyError(`key id ${JSON.stringify(id)}: 1-32 letters, digits and - (not "${LOCAL_TENANT}")`);
  }
  const key = `ctxb_${id}_${randomBytes(32).toString("base64url")}`;
  const opts = Object.entries(limits)
    .filter(([, v]) => v !== undefined)
    .map(([k, v]) => `${k}=${v}`);
  return { key, line: [id, `sha256:${hashKey(key).toString("hex")}`, ...opts].join(" ") };
}

/** Parses key lines (a file's text, or CTXBANK_API_KEYS with entries separated by newlines or ';'). */
export function parseApiKeys(text: string, defaults: KeyLimits, where: string): ApiKeyEntry[] {
  const entries: ApiKeyEntry[] = [];
  const seen = new Set<string>();
  // Comments first (they may hold ';'), then entries.
  const lines = text.split("\n").flatMap((raw, n) =>
    raw
      .replace(/#.*$/, "")
      .split(";")
      .map((entry) => ({ entry, n })),
  );
  lines.forEach(({ entry, n }) => {
    const line = entry.trim();
    if (line === "") return;
    const at = `${where}, line ${n + 1}`;
    const [id, hash, ...opts] = line.split(/\s+/);
    if (!KEY_ID.test(id!) || id === LOCAL_TENANT) throw new ApiKeyError(`${at}: bad key id ${JSON.stringify(id)}`);
    if (seen.has(id!)) throw new ApiKeyError(`${at}: key id ${id} appears twice`);
    const m = HASH.exec(hash ?? "");
    if (!m) throw new ApiKeyError(`${at}: the hash must be sha256:<64 hex digits> (ctxbank keys new ${id} prints a line)`);
    const limits = { ...defaults };
    for (const opt of opts) {
      const [name, value] = opt.split("=");
      const n = Number(value);
      if (
        !(name === "rate" || name === "burst" || name === "concurrency") ||
        value === undefined ||
        !Number.isFinite(n) ||
        n < 0 ||
        n > 1e6
      ) {
        throw new ApiKeyError(`${at}: bad option ${JSON.stringify(opt)} (rate=N, burst=N, concurrency=N; N >= 0)`);
      }
      limits[name] = name === "rate" ? n : Math.floor(n);
    }
    if (limits.rate > 0 && limits.burst < 1) throw new ApiKeyError(`${at}: burst must be at least 1 when rate is limited`);
    seen.add(id!);
    entries.push({ id: id!, hash: Buffer.from(m[1]!, "hex"), limits });
  });
  return entries;
}

/** The keys a process accepts: from a file and/or an environment variable. */
export class ApiKeys {
  private readonly byId: Map<string, ApiKeyEntry>;
  private static readonly DUMMY = hashKey("ctxbank-no-such-key");

  constructor(entries: ApiKeyEntry[]) {
    this.byId = new Map(entries.map((e) => [e.id, e]));
  }

  static load(source: { file?: string | undefined; inline?: string | undefined }, defaults: KeyLimits): ApiKeys {
    const entries: ApiKeyEntry[] = [];
    if (source.file !== undefined) {
      let text: string;
      try {
        text = readFileSync(source.file, "utf8");
      } catch (e) {
        throw new ApiKeyError(`cannot read the API keys file ${source.file}: ${(e as Error).message}`);
      }
      entries.push(...parseApiKeys(text, defaults, source.file));
    }
    if (source.inline !== undefined) entries.push(...parseApiKeys(source.inline, defaults, "$CTXBANK_API_KEYS"));
    const ids = entries.map((e) => e.id);
    const twice = ids.find((id, i) => ids.indexOf(id) !== i);
    if (twice) throw new ApiKeyError(`key id ${twice} is given twice (file and environment)`);
    return new ApiKeys(entries);
  }

  get size(): number {
    return this.byId.size;
  }

  /** The entry of a presented key, or undefined; takes the same time for any wrong key. */
  verify(presented: string): ApiKeyEntry | undefined {
    const m = KEY.exec(presented);
    const entry = m ? this.byId.get(m[1]!) : undefined;
    const same = timingSafeEqual(hashKey(presented), entry?.hash ?? ApiKeys.DUMMY);
    return same && entry ? entry : undefined;
  }
}
