// Everything a process needs to authenticate, built once from the configuration: the API keys
// (or none: keyless), their limiter, the internal secret (read from its file, or made up for a
// `serve` that talks only to itself) and the Host allow-list.
import { CtxbankError } from "../../inference/errors.ts";
import { readFileSync } from "node:fs";
import type { Config } from "../config.ts";
import { ApiKeys } from "./api-keys.ts";
import { InternalAuth, MIN_SECRET_LENGTH } from "./capability.ts";
import { AllowedHosts } from "./hosts.ts";
import { KeyLimiter } from "./rate-limit.ts";

export interface Security {
  /** undefined: keyless (every request is the tenant "local"). */
  keys: ApiKeys | undefined;
  limiter: KeyLimiter;
  internal: InternalAuth;
  /** The secret, for tools and tests that read internal status. */
  internalSecret: string;
  hosts: AllowedHosts;
}

/** The keys or the internal secret cannot be used (an empty keys file, a short secret). */
export class SecurityConfigError extends CtxbankError<"invalid_config"> {
  static override readonly codes = ["invalid_config"] as const;
  override readonly name = "SecurityConfigError";
  constructor(message: string) {
    super("invalid_config", message);
  }
}

export function openSecurity(config: Config): Security {
  const defaults = { rate: config.keyRate, burst: config.keyBurst, concurrency: config.keyConcurrency };
  const keyed = config.apiKeysFile !== undefined || config.apiKeys !== undefined;
  const keys = keyed ? ApiKeys.load({ file: config.apiKeysFile, inline: config.apiKeys }, defaults) : undefined;
  if (keys && keys.size === 0)
    throw new SecurityConfigError("the API keys file/variable holds no key: add one (ctxbank keys new <id>) or leave it unset");
  const secret = internalSecretOf(config);
  return {
    keys,
    limiter: new KeyLimiter(),
    internal: new InternalAuth(secret),
    internalSecret: secret,
    hosts: AllowedHosts.fromConfig(config),
  };
}

function internalSecretOf(config: Config): string {
  if (config.internalSecret !== undefined) return config.internalSecret;
  if (config.internalSecretFile !== undefined) {
    let text: string;
    try {
      text = readFileSync(config.internalSecretFile, "utf8").trim();
    } catch (e) {
      throw new SecurityConfigError(`cannot read the internal secret file ${config.internalSecretFile}: ${(e as Error).message}`);
    }
    if (text.length < MIN_SECRET_LENGTH)
      throw new SecurityConfigError(`the internal secret in ${config.internalSecretFile} must be at least ${MIN_SECRET_LENGTH} characters`);
    return text;
  }
  // Only `serve` on a loopback internal listener gets here (shared/platform/config.ts refuses the rest).
  return InternalAuth.randomSecret();
}
