// `ctxbank keys new <id> [--rate N] [--burst N] [--concurrency N]`: makes an API key. The key
// goes to stdout (give it to the client; it is shown once), the line to add to the keys file
// (--api-keys-file / CTXBANK_API_KEYS) to stderr: the service stores only the key's sha256.
import { parseArgs } from "node:util";
import { UsageError } from "../shared/inference/errors.ts";
import { ApiKeyError, newApiKey, type KeyLimits } from "../shared/platform/auth/api-keys.ts";

export const KEYS_USAGE = `Usage: ctxbank keys new <id> [--rate N] [--burst N] [--concurrency N]

Prints a new API key on stdout and, on stderr, the line that registers it in the keys file
(--api-keys-file, or CTXBANK_API_KEYS). The id (1-32 letters, digits and -) names the tenant.
  --rate N          requests per second (0 = unlimited; default: the server's --key-rate)
  --burst N         requests at once after a quiet spell (default: --key-burst)
  --concurrency N   requests in flight (0 = unlimited; default: --key-concurrency)
`;

export function keysCommand(
  argv: string[],
  out: (s: string) => void = (s) => process.stdout.write(s),
  err: (s: string) => void = (s) => process.stderr.write(s),
): number {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      options: {
        rate: { type: "string" },
        burst: { type: "string" },
        concurrency: { type: "string" },
        help: { type: "boolean", short: "h" },
      },
      allowPositionals: true,
      strict: true,
    });
  } catch (e) {
    throw new UsageError((e as Error).message.split(/\.\s/)[0]!);
  }
  const { values, positionals } = parsed;
  if (values.help) {
    out(KEYS_USAGE);
    return 0;
  }
  const [sub, id, ...extra] = positionals;
  if (sub !== "new" || id === undefined || extra.length > 0) throw new UsageError("expected: ctxbank keys new <id>");
  const limits: Partial<KeyLimits> = {};
  for (const name of ["rate", "burst", "concurrency"] as const) {
    const v = values[name];
    if (v === undefined) continue;
    const n = Number(v);
    if (v.trim() === "" || !Number.isFinite(n) || n < 0 || (name !== "rate" && !Number.isInteger(n)))
      throw new UsageError(`--${name} must be a number >= 0`);
    limits[name] = n;
  }
  try {
    const { key, line } = newApiKey(id, limits);
    out(`${key}\n`);
    err(`# add this line to the API keys file (only the hash is stored; the key above is not shown again):\n${line}\n`);
  } catch (e) {
    if (e instanceof ApiKeyError) throw new UsageError(e.message);
    throw e;
  }
  return 0;
}
