// Service configuration: one validated object built from command-line flags, then environment
// variables (CTXBANK_*, plus DATABASE_URL, PORT and HOST), then defaults. Every value is checked
// before anything is loaded, and a bad one is reported with the flag and variable that set it.
import { availableParallelism, hostname } from "node:os";
import { z } from "zod";
import { DEVICE_PATTERN, type EngineDevice } from "./engine/native.ts";
import { defaultShardDir } from "./kv/shard.ts";
import { POLICY_KINDS } from "./policy/request.ts";

export type ServiceRole = "serve" | "prefill" | "decode";

const ID = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;
const MiB = 1 << 20;

const int = (min: number, max: number) => z.coerce.number().int().min(min).max(max);
const ms = int(1, 7 * 24 * 3600 * 1000);
const bytes = int(1, Number.MAX_SAFE_INTEGER);
const sloMs = z.coerce.number().positive().max(24 * 3600 * 1000);

export const ConfigSchema = z.object({
  host: z.string().min(1).default("127.0.0.1"),
  port: int(0, 65_535).default(8080),
  /** The URL other services reach this one at (default http://host:port, the bound port). */
  publicUrl: z.url({ protocol: /^https?$/ }).optional(),
  databaseUrl: z.string().min(1).default("pglite://memory"),
  /** GGUF path; default: $CTXBANK_MODEL, else the default model (downloaded once). */
  model: z.string().min(1).optional(),
  threads: int(1, 256).default(Math.max(1, Math.min(availableParallelism(), 2))),
  /** Where the engine computes: cpu | cuda | cuda:N | auto (CUDA when a GPU is usable, else the CPU). */
  device: z
    .string()
    .regex(DEVICE_PATTERN, "cpu, cuda, cuda:N or auto")
    .default("cpu")
    .transform((d) => d as EngineDevice),
  /** Stable across restarts: the shard id is derived from it. Default role-host-port. */
  instanceId: z.string().regex(ID, "1-128 chars of letters, digits and . _ : -").optional(),
  hostId: z.string().regex(ID).default(sanitizeId(hostname()) || "localhost"),
  shardDir: z.string().min(1).optional(),
  shardBytes: bytes.default(1024 * MiB),
  /** Tokens per KV chunk (per layer group). */
  blockTokens: int(1, 1 << 20).default(512),
  /** Attention policy for requests that name none (their chunks' layer groups, and how decode attends). */
  policy: z.enum(POLICY_KINDS).default("full"),
  writeLeaseMs: ms.default(60_000),
  /** How long a written chunk waits for its decode before the reaper may reclaim it. */
  retainMs: ms.default(120_000),
  readLeaseMs: ms.default(60_000),
  heartbeatMs: ms.default(2_000),
  heartbeatTimeoutMs: ms.default(10_000),
  reapMs: ms.default(1_000),
  /** Prefills computed at once / waiting; beyond that a prefill gets 429. */
  maxPrefills: int(1, 64).default(1),
  maxPrefillQueue: int(0, 10_000).default(16),
  /** Sequences decoded together in one step (continuous batching) / waiting for a slot. */
  maxBatch: int(1, 256).default(8),
  maxQueue: int(0, 10_000).default(32),
  /**
   * `serve` only: slo = prompts are computed in the decode steps, in chunks sized so the running
   * decodes keep 0.8 × sloTpotMs per token; off = each 512-token micro-batch runs whole, and the
   * decodes wait for it.
   */
  prefillChunking: z.enum(["slo", "off"]).default("slo"),
  /** KV memory decode may hold for its sequences (reserved at admission); 429 beyond it. */
  kvBudgetBytes: bytes.default(2048 * MiB),
  maxBodyBytes: bytes.default(4 * MiB),
  /** How decode reads chunks: auto = shm on the owner's host, http elsewhere. */
  transport: z.enum(["auto", "http", "shm"]).default("auto"),
  /** Deadline for loading one request's KV. */
  kvTimeoutMs: ms.default(30_000),
  /** Chunks read at once per request. */
  kvConcurrency: int(1, 64).default(4),
  /** Graceful shutdown: how long in-flight requests may take to finish. */
  drainMs: ms.default(30_000),
  logLevel: z.enum(["fatal", "error", "warn", "info", "debug", "trace", "silent"]).default("info"),
  /**
   * SLOs every finished request is judged on (ms; fractions allowed). Defaults for a 2-core CPU
   * box: a 1K-token prompt prefills in ~1.4 s, and decode runs ~6 ms/token alone, tens of ms in a
   * full batch on shared cores.
   */
  sloTtftMs: sloMs.default(2_000),
  sloTpotMs: sloMs.default(100),
  /** Optional end-to-end objective; unset = not an objective. */
  sloE2eMs: sloMs.optional(),
  /** slo: the prefill refuses (429 slo_unattainable) a prompt whose predicted TTFT exceeds sloTtftMs × (1 + margin). */
  admission: z.enum(["off", "slo"]).default("off"),
  admissionMargin: z.coerce.number().min(0).max(100).default(0.5),
});

export type Config = z.output<typeof ConfigSchema> & { role: ServiceRole; instanceId: string; shardDir: string };
type Key = keyof z.input<typeof ConfigSchema>;

/** The flag and the environment variable for each setting. */
export const SETTINGS: Record<Key, { flag: string; env: string[]; help: string }> = {
  host: { flag: "host", env: ["CTXBANK_HOST", "HOST"], help: "interface to listen on (default 127.0.0.1)" },
  port: { flag: "port", env: ["CTXBANK_PORT", "PORT"], help: "port (default 8080; 0 = any free port)" },
  publicUrl: { flag: "public-url", env: ["CTXBANK_PUBLIC_URL"], help: "URL other services reach this one at" },
  databaseUrl: { flag: "database-url", env: ["DATABASE_URL"], help: "postgres://… or pglite://memory | pglite:///dir" },
  model: { flag: "model", env: ["CTXBANK_MODEL"], help: "GGUF file (default: the default model)" },
  threads: { flag: "threads", env: ["CTXBANK_THREADS"], help: "engine threads" },
  device: { flag: "device", env: ["CTXBANK_DEVICE"], help: "cpu | cuda | cuda:N | auto: where the engine computes (default cpu)" },
  instanceId: { flag: "instance-id", env: ["CTXBANK_INSTANCE_ID"], help: "registry id (stable across restarts)" },
  hostId: { flag: "host-id", env: ["CTXBANK_HOST_ID"], help: "host identity for shm locality (default hostname)" },
  shardDir: { flag: "shard-dir", env: ["CTXBANK_SHARD_DIR"], help: "tmpfs directory for KV shards" },
  shardBytes: { flag: "shard-bytes", env: ["CTXBANK_SHARD_BYTES"], help: "KV shard size in bytes (default 1 GiB)" },
  blockTokens: { flag: "block-tokens", env: ["CTXBANK_BLOCK_TOKENS"], help: "tokens per KV chunk (default 512)" },
  policy: { flag: "policy", env: ["CTXBANK_POLICY"], help: `default attention policy of requests that name none (${POLICY_KINDS.join(", ")}; with the model's calibrated defaults)` },
  writeLeaseMs: { flag: "write-lease-ms", env: ["CTXBANK_WRITE_LEASE_MS"], help: "chunk write lease" },
  retainMs: { flag: "retain-ms", env: ["CTXBANK_RETAIN_MS"], help: "how long an unread chunk is kept" },
  readLeaseMs: { flag: "read-lease-ms", env: ["CTXBANK_READ_LEASE_MS"], help: "chunk read lease" },
  heartbeatMs: { flag: "heartbeat-ms", env: ["CTXBANK_HEARTBEAT_MS"], help: "heartbeat period" },
  heartbeatTimeoutMs: { flag: "heartbeat-timeout-ms", env: ["CTXBANK_HEARTBEAT_TIMEOUT_MS"], help: "silence before an instance is dead" },
  reapMs: { flag: "reap-ms", env: ["CTXBANK_REAP_MS"], help: "expired-chunk reaper period" },
  maxPrefills: { flag: "max-prefills", env: ["CTXBANK_MAX_PREFILLS"], help: "prefills computed at once" },
  maxPrefillQueue: { flag: "max-prefill-queue", env: ["CTXBANK_MAX_PREFILL_QUEUE"], help: "prefills waiting (then 429)" },
  maxBatch: { flag: "max-batch", env: ["CTXBANK_MAX_BATCH"], help: "sequences per decode step" },
  maxQueue: { flag: "max-queue", env: ["CTXBANK_MAX_QUEUE"], help: "decode requests waiting (then 429)" },
  prefillChunking: { flag: "prefill-chunking", env: ["CTXBANK_PREFILL_CHUNKING"], help: "serve: slo | off: prompts share the decode steps in chunks that keep the TPOT pace (default slo)" },
  kvBudgetBytes: { flag: "kv-budget-bytes", env: ["CTXBANK_KV_BUDGET_BYTES"], help: "decode KV memory budget (then 429)" },
  maxBodyBytes: { flag: "max-body-bytes", env: ["CTXBANK_MAX_BODY_BYTES"], help: "largest request body (then 413)" },
  transport: { flag: "transport", env: ["CTXBANK_TRANSPORT"], help: "auto | http | shm" },
  kvTimeoutMs: { flag: "kv-timeout-ms", env: ["CTXBANK_KV_TIMEOUT_MS"], help: "deadline for loading a request's KV" },
  kvConcurrency: { flag: "kv-concurrency", env: ["CTXBANK_KV_CONCURRENCY"], help: "chunk reads in flight per request" },
  drainMs: { flag: "drain-ms", env: ["CTXBANK_DRAIN_MS"], help: "graceful shutdown drain time" },
  logLevel: { flag: "log-level", env: ["CTXBANK_LOG_LEVEL", "LOG_LEVEL"], help: "pino level (info)" },
  sloTtftMs: { flag: "slo-ttft-ms", env: ["CTXBANK_SLO_TTFT_MS"], help: "TTFT objective in ms (default 2000)" },
  sloTpotMs: { flag: "slo-tpot-ms", env: ["CTXBANK_SLO_TPOT_MS"], help: "time-per-output-token objective in ms (default 100)" },
  sloE2eMs: { flag: "slo-e2e-ms", env: ["CTXBANK_SLO_E2E_MS"], help: "end-to-end objective in ms (default: none)" },
  admission: { flag: "admission", env: ["CTXBANK_ADMISSION"], help: "off | slo: refuse prompts whose predicted TTFT misses the SLO (default off)" },
  admissionMargin: { flag: "admission-margin", env: ["CTXBANK_ADMISSION_MARGIN"], help: "slo admission refuses above slo-ttft × (1 + margin) (default 0.5)" },
};

export class ConfigError extends Error {
  override readonly name = "ConfigError";
}

/** parseArgs option descriptors for every setting (all strings). */
export function configFlags(): Record<string, { type: "string" }> {
  return Object.fromEntries(Object.values(SETTINGS).map((s) => [s.flag, { type: "string" as const }]));
}

export function configHelp(): string {
  return Object.values(SETTINGS)
    .map((s) => `  --${s.flag.padEnd(22)} ${s.help} [${s.env.join(", ")}]`)
    .join("\n");
}

/**
 * Builds the configuration for `role` from flags (as parsed by parseArgs, by flag name), the
 * environment and the defaults. Throws ConfigError naming the offending flag/variable.
 */
export function loadConfig(
  role: ServiceRole,
  flags: Readonly<Record<string, string | boolean | undefined | string[] | boolean[]>> = {},
  env: Readonly<Record<string, string | undefined>> = process.env,
  overrides: Partial<z.input<typeof ConfigSchema>> = {},
): Config {
  const raw: Record<string, unknown> = {};
  const source: Record<string, string> = {};
  for (const [key, s] of Object.entries(SETTINGS) as [Key, (typeof SETTINGS)[Key]][]) {
    const flag = flags[s.flag];
    if (typeof flag === "string") {
      raw[key] = flag;
      source[key] = `--${s.flag}`;
      continue;
    }
    const name = s.env.find((n) => env[n] !== undefined && env[n] !== "");
    if (name) {
      raw[key] = env[name];
      source[key] = `$${name}`;
    }
  }
  Object.assign(raw, overrides);
  const parsed = ConfigSchema.safeParse(raw);
  if (!parsed.success) {
    const msgs = parsed.error.issues.map((i) => {
      const key = String(i.path[0] ?? "");
      const where = source[key] ?? (key ? `--${SETTINGS[key as Key]?.flag ?? key}` : "config");
      return `${where}: ${i.message}`;
    });
    throw new ConfigError(`invalid configuration: ${msgs.join("; ")}`);
  }
  const c = parsed.data;
  if ((role === "prefill" || role === "decode") && !/^postgres(ql)?:\/\//.test(c.databaseUrl)) {
    throw new ConfigError(
      `ctxbank ${role} runs as a separate process and needs a shared PostgreSQL: set DATABASE_URL (or --database-url) to postgres://…` +
        ` (got ${c.databaseUrl.startsWith("pglite") ? c.databaseUrl : "a non-postgres URL"}); use \`ctxbank serve\` for one process with PGlite`,
    );
  }
  if (c.heartbeatTimeoutMs <= c.heartbeatMs) {
    throw new ConfigError(`heartbeat timeout (${c.heartbeatTimeoutMs} ms) must be longer than the heartbeat period (${c.heartbeatMs} ms)`);
  }
  return {
    ...c,
    role,
    instanceId: c.instanceId ?? sanitizeId(`${role === "serve" ? "local" : role}-${c.hostId}-${c.port || process.pid}`),
    shardDir: c.shardDir ?? defaultShardDir(),
  };
}

function sanitizeId(s: string): string {
  return s
    .replace(/[^A-Za-z0-9._:-]/g, "-")
    .replace(/^[^A-Za-z0-9]+/, "")
    .slice(0, 128);
}
