// Service configuration: one validated object built from command-line flags, then environment
// variables (CTXBANK_*, plus DATABASE_URL, PORT and HOST), then defaults. Every value is checked
// before anything is loaded, and a bad one is reported with the flag and variable that set it.
import { CtxbankError } from "../inference/errors.ts";
import { availableParallelism, hostname } from "node:os";
import { z } from "zod";
import { DEVICE_PATTERN, type EngineDevice } from "../inference/engine/native.ts";
import type { Faults } from "./faults.ts";
import { defaultShardDir } from "./shard-root.ts";
import { SLO_DEFAULTS } from "../inference/defaults.ts";
import { POLICY_KINDS } from "../inference/policy/schema.ts";
import { MODEL_CATALOGUE } from "../inference/model/catalogue.ts";

export type ServiceRole = "serve" | "prefill" | "decode" | "router";

const ID = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$/;
const MiB = 1 << 20;

const int = (min: number, max: number) => z.coerce.number().int().min(min).max(max);
const ms = int(1, 7 * 24 * 3600 * 1000);
const bytes = int(1, Number.MAX_SAFE_INTEGER);
const sloMs = z.coerce
  .number()
  .positive()
  .max(24 * 3600 * 1000);

export const ConfigSchema = z.object({
  host: z.string().min(1).default("127.0.0.1"),
  port: int(0, 65_535).default(8080),
  /** The URL other services reach this one at (default http://host:port, the bound port). */
  publicUrl: z.url({ protocol: /^https?$/ }).optional(),
  databaseUrl: z.string().min(1).default("pglite://memory"),
  /** A model name (`ctxbank models`) or a GGUF path; default: $CTXBANK_MODEL, else the default model (downloaded once). */
  model: z.string().min(1).optional(),
  threads: int(1, 256).default(Math.max(1, Math.min(availableParallelism(), 2))),
  /**
   * Tokens one sequence may hold (prompt and generated). Default: the model's trained context.
   * Past it the engine computes (RoPE positions go on) but the model never saw such positions:
   * for measuring long-context cost, not for answers; the runtime warns.
   */
  maxContext: int(1, 1 << 22).optional(),
  /** Where the engine computes: cpu | cuda | cuda:N | auto (CUDA when a GPU is usable, else the CPU). */
  device: z
    .string()
    .regex(DEVICE_PATTERN, "cpu, cuda, cuda:N or auto")
    .default("cpu")
    .transform((d) => d as EngineDevice),
  /** Stable across restarts: the shard id is derived from it. Default role-host-port. */
  instanceId: z.string().regex(ID, "1-128 chars of letters, digits and . _ : -").optional(),
  hostId: z
    .string()
    .regex(ID)
    .default(sanitizeId(hostname()) || "localhost"),
  shardDir: z.string().min(1).optional(),
  shardBytes: bytes.default(1024 * MiB),
  /** Tokens per KV chunk (per layer group). */
  blockTokens: int(1, 1 << 20).default(512),
  /** Attention policy for requests that name none (their chunks' layer groups, and how decode attends). */
  policy: z.enum(POLICY_KINDS).default("full"),
  writeLeaseMs: ms.default(60_000),
  /**
   * How long a written chunk waits for its decode before the reaper may reclaim it. The decode
   * that asked for a prefill reads it within milliseconds; 30 s leaves a client's own
   * /v1/prefill → /v1/decode handoff a slow round trip and a few retries after a 429, while an
   * abandoned handle holds shard bytes for half a minute, not two.
   */
  retainMs: ms.default(30_000),
  /**
   * Shard bytes one key (tenant) may hold at once (then 429 shard_full). Default: half of
   * shardBytes for each API key, no cap for the keyless "local" tenant (it has nobody to share with).
   */
  maxShardBytesPerKey: bytes.optional(),
  readLeaseMs: ms.default(60_000),
  heartbeatMs: ms.default(2_000),
  heartbeatTimeoutMs: ms.default(10_000),
  reapMs: ms.default(1_000),
  /** How often a prefill sweeps dead instances' shard files, chunks and open requests. */
  sweepMs: ms.default(10_000),
  /** Ended request rows (and instances dead this long) are deleted after this. */
  requestRetentionMs: ms.default(24 * 3600 * 1000),
  /** Prefills computed at once / waiting; beyond that a prefill gets 429. */
  maxPrefills: int(1, 64).default(1),
  maxPrefillQueue: int(0, 10_000).default(16),
  /**
   * Decode: calls to prefill instances in flight at once / waiting (fair across keys); beyond that
   * 429. In flight: enough to keep a few prefill instances busy with a short queue each (raise it
   * with more instances); waiting: about what one prefill's own queue holds.
   */
  maxPrefillCalls: int(1, 1024).default(4),
  maxPrefillCallQueue: int(0, 10_000).default(16),
  /** Decode: deadline of one prefill call, queue wait included; default 60 s + 20 ms per context token. */
  prefillTimeoutMs: ms.optional(),
  /** Registry (PostgreSQL) deadline per query and per connection attempt. */
  dbTimeoutMs: ms.default(15_000),
  /** Every listener: time to receive a request's headers / gap allowed between body bytes (then 408, closed). */
  headersTimeoutMs: ms.default(10_000),
  requestTimeoutMs: ms.default(120_000),
  bodyIdleTimeoutMs: ms.default(10_000),
  /**
   * Every listener: an idle keep-alive connection is closed after this. Longer than the usual
   * load balancer idle timeout (60 s), so a balancer never reuses a connection being closed.
   */
  keepAliveTimeoutMs: ms.default(65_000),
  /**
   * Every listener: open connections at most, in all and from one peer address. At a cap, a new
   * connection closes the oldest one serving no request; when all serve one, it is refused.
   */
  maxConnections: int(1, 1_000_000).default(1024),
  maxConnectionsPerPeer: int(1, 1_000_000).default(256),
  /** Every listener: a connection that sends no byte for this long after it is accepted is closed. */
  firstByteTimeoutMs: ms.default(3_000),
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
  /**
   * Sessions (services/sessions/): KV memory the decode keeps for conversations between turns (0 =
   * no sessions), one key's share of it, and how long an unused one is kept. Beyond the memory,
   * the least recently used go to --session-dir when it is set (up to --session-disk-bytes), else
   * are dropped. The disk holds prompts' KV in clear: a directory only the service reads.
   */
  sessionBytes: int(0, Number.MAX_SAFE_INTEGER).default(512 * MiB),
  sessionBytesPerKey: bytes.default(128 * MiB),
  sessionTtlMs: ms.default(10 * 60_000),
  sessionDir: z.string().min(1).optional(),
  sessionDiskBytes: bytes.default(4096 * MiB),
  /**
   * Conditional disaggregation (decode with prefill instances): the decode computes a prompt itself
   * when the part no session holds is at most this many tokens, or at most this fraction of the
   * prompt, or when every call to the prefill instances is taken; else a prefill instance does.
   * 0 tokens (the default): only a session's turn may be computed here (by the fraction).
   */
  localPrefillTokens: int(0, 1 << 22).default(0),
  localPrefillFraction: z.coerce.number().min(0).max(1).default(0.3),
  /**
   * Router: how often it reads the live decodes from the registry and their load from each one's
   * status, and how many more requests than the least loaded decode a session's holder may have
   * before a turn goes to the least loaded one instead (recomputing its history there).
   */
  routerPollMs: ms.default(1_000),
  /** Router: kv = by where each request's KV is, then load; round_robin = one decode after another (a baseline). */
  routerPolicy: z.enum(["kv", "round_robin"]).default("kv"),
  routerImbalance: int(0, 1_000_000).default(8),
  /**
   * Router: how long a decode may take to start its answer (a non-streamed one comes whole, after
   * the queue, the prefill and every token) and then between body bytes; past it the client gets
   * 504 deadline_exceeded. Not --request-timeout-ms, which bounds receiving the client's request.
   */
  routerTimeoutMs: ms.default(30 * 60_000),
  maxBodyBytes: bytes.default(4 * MiB),
  /**
   * How decode reads chunks: auto = shm on the owner's host, else UCX when the owner publishes a
   * UCX endpoint and the UCX addon is built here, else http. ucx: UCX only (prefill publishes its endpoint).
   */
  transport: z.enum(["auto", "http", "shm", "ucx"]).default("auto"),
  /** Deadline for loading one request's KV. */
  kvTimeoutMs: ms.default(30_000),
  /** Chunks read at once per request. */
  kvConcurrency: int(1, 64).default(4),
  /**
   * Resident MiB of released sequences' KV memory kept, zeroed, for new sequences (they then
   * skip page faults and the kernel's zeroing); 0 turns it off.
   */
  kvPoolMib: int(0, 1 << 24).default(1024),
  /** Decode loads a prompt's KV while its prefill still runs (the streamed handle); off: after the handle. */
  kvStreaming: z.stringbool().default(true),
  /** Graceful shutdown: how long in-flight requests may take to finish. */
  drainMs: ms.default(30_000),
  logLevel: z.enum(["fatal", "error", "warn", "info", "debug", "trace", "silent"]).default("info"),
  /**
   * SLOs every finished request is judged on (ms; fractions allowed). Defaults for a 2-core CPU
   * box: a 1K-token prompt prefills in ~1.4 s, and decode runs ~6 ms/token alone, tens of ms in a
   * full batch on shared cores.
   */
  sloTtftMs: sloMs.default(SLO_DEFAULTS.ttftMs),
  sloTpotMs: sloMs.default(SLO_DEFAULTS.tpotMs),
  /** Optional end-to-end objective; unset = not an objective. */
  sloE2eMs: sloMs.optional(),
  /** slo: the prefill refuses (429 slo_unattainable) a prompt whose predicted TTFT exceeds sloTtftMs × (1 + margin). */
  admission: z.enum(["off", "slo"]).default("off"),
  admissionMargin: z.coerce.number().min(0).max(100).default(SLO_DEFAULTS.admissionMargin),
  // Security (docs/security.md).
  /** API keys: a file of `<id> sha256:<hex> [rate=N burst=N concurrency=N]` lines, and/or the same lines inline. */
  apiKeysFile: z.string().min(1).optional(),
  apiKeys: z.string().min(1).optional(),
  /** Per-key defaults: requests/s (0 = unlimited), bucket size, requests in flight (0 = unlimited). */
  keyRate: z.coerce.number().min(0).max(1e6).default(10),
  keyBurst: int(1, 1_000_000).default(20),
  keyConcurrency: int(0, 1_000_000).default(8),
  /** Run without API keys on a non-loopback bind. */
  insecure: z.stringbool().default(false),
  /** The internal listener (chunks, the decode's prefill calls, status): host, port (0 = any free one), and the URL peers use. */
  internalHost: z.string().min(1).default("127.0.0.1"),
  internalPort: int(0, 65_535).default(0),
  internalUrl: z.url({ protocol: /^https?$/ }).optional(),
  /** Shared secret of the services' capabilities (>= 32 chars), or a file holding it. */
  internalSecret: z.string().min(32, "at least 32 characters").optional(),
  internalSecretFile: z.string().min(1).optional(),
  /** Extra Host names the listeners answer for (comma-separated; * = any). */
  allowedHosts: z
    .string()
    .default("")
    .transform((v) =>
      v
        .split(",")
        .map((h) => h.trim())
        .filter((h) => h !== ""),
    ),
});

export type Config = z.output<typeof ConfigSchema> & {
  role: ServiceRole;
  instanceId: string;
  shardDir: string;
  /** Fault points a test arms (faults.ts); never set by a flag or the environment, absent in production. */
  faults?: Faults | undefined;
};
type Key = keyof z.input<typeof ConfigSchema>;

/** The flag and the environment variable for each setting. */
export const SETTINGS: Record<Key, { flag: string; env: string[]; help: string }> = {
  host: { flag: "host", env: ["CTXBANK_HOST", "HOST"], help: "interface to listen on (default 127.0.0.1)" },
  port: { flag: "port", env: ["CTXBANK_PORT", "PORT"], help: "port (default 8080; 0 = any free port)" },
  publicUrl: { flag: "public-url", env: ["CTXBANK_PUBLIC_URL"], help: "URL other services reach this one at" },
  databaseUrl: { flag: "database-url", env: ["DATABASE_URL"], help: "postgres://… or pglite://memory | pglite:///dir" },
  model: {
    flag: "model",
    env: ["CTXBANK_MODEL"],
    help: `a model name (ctxbank models lists them; downloaded once) or a GGUF file (default: ${MODEL_CATALOGUE.defaultModel})`,
  },
  threads: { flag: "threads", env: ["CTXBANK_THREADS"], help: "engine threads" },
  maxContext: {
    flag: "max-context",
    env: ["CTXBANK_MAX_CONTEXT"],
    help: "tokens one sequence may hold (default: the model's trained context; past it a warning: for measuring, not for answers)",
  },
  device: { flag: "device", env: ["CTXBANK_DEVICE"], help: "cpu | cuda | cuda:N | auto: where the engine computes (default cpu)" },
  instanceId: { flag: "instance-id", env: ["CTXBANK_INSTANCE_ID"], help: "registry id (stable across restarts)" },
  hostId: { flag: "host-id", env: ["CTXBANK_HOST_ID"], help: "host identity for shm locality (default hostname)" },
  shardDir: { flag: "shard-dir", env: ["CTXBANK_SHARD_DIR"], help: "tmpfs directory for KV shards" },
  shardBytes: { flag: "shard-bytes", env: ["CTXBANK_SHARD_BYTES"], help: "KV shard size in bytes (default 1 GiB)" },
  blockTokens: { flag: "block-tokens", env: ["CTXBANK_BLOCK_TOKENS"], help: "tokens per KV chunk (default 512)" },
  policy: {
    flag: "policy",
    env: ["CTXBANK_POLICY"],
    help: `default attention policy of requests that name none (${POLICY_KINDS.join(", ")}; with the model's calibrated defaults)`,
  },
  writeLeaseMs: { flag: "write-lease-ms", env: ["CTXBANK_WRITE_LEASE_MS"], help: "chunk write lease" },
  retainMs: { flag: "retain-ms", env: ["CTXBANK_RETAIN_MS"], help: "how long an unread chunk is kept (default 30 000)" },
  maxShardBytesPerKey: {
    flag: "max-shard-bytes-per-key",
    env: ["CTXBANK_MAX_SHARD_BYTES_PER_KEY"],
    help: "shard bytes one API key may hold (then 429; default half the shard, keyless: none)",
  },
  readLeaseMs: { flag: "read-lease-ms", env: ["CTXBANK_READ_LEASE_MS"], help: "chunk read lease" },
  heartbeatMs: { flag: "heartbeat-ms", env: ["CTXBANK_HEARTBEAT_MS"], help: "heartbeat period" },
  heartbeatTimeoutMs: { flag: "heartbeat-timeout-ms", env: ["CTXBANK_HEARTBEAT_TIMEOUT_MS"], help: "silence before an instance is dead" },
  reapMs: { flag: "reap-ms", env: ["CTXBANK_REAP_MS"], help: "expired-chunk reaper period" },
  sweepMs: {
    flag: "sweep-ms",
    env: ["CTXBANK_SWEEP_MS"],
    help: "how often a prefill sweeps dead instances' shard files, chunks and requests (default 10000)",
  },
  requestRetentionMs: {
    flag: "request-retention-ms",
    env: ["CTXBANK_REQUEST_RETENTION_MS"],
    help: "ended request rows are deleted after this (default 86400000 = 24 h)",
  },
  maxPrefills: { flag: "max-prefills", env: ["CTXBANK_MAX_PREFILLS"], help: "prefills computed at once" },
  maxPrefillQueue: { flag: "max-prefill-queue", env: ["CTXBANK_MAX_PREFILL_QUEUE"], help: "prefills waiting (then 429)" },
  maxPrefillCalls: {
    flag: "max-prefill-calls",
    env: ["CTXBANK_MAX_PREFILL_CALLS"],
    help: "decode: prefill calls in flight (default 4; raise with more prefill instances)",
  },
  maxPrefillCallQueue: {
    flag: "max-prefill-call-queue",
    env: ["CTXBANK_MAX_PREFILL_CALL_QUEUE"],
    help: "decode: prefill calls waiting (then 429; default 16)",
  },
  prefillTimeoutMs: {
    flag: "prefill-timeout-ms",
    env: ["CTXBANK_PREFILL_TIMEOUT_MS"],
    help: "decode: deadline of a prefill call (default 60 s + 20 ms per context token)",
  },
  dbTimeoutMs: { flag: "db-timeout-ms", env: ["CTXBANK_DB_TIMEOUT_MS"], help: "PostgreSQL query and connect deadline (default 15 000)" },
  headersTimeoutMs: {
    flag: "headers-timeout-ms",
    env: ["CTXBANK_HEADERS_TIMEOUT_MS"],
    help: "time to send a request's headers (default 10 000)",
  },
  requestTimeoutMs: {
    flag: "request-timeout-ms",
    env: ["CTXBANK_REQUEST_TIMEOUT_MS"],
    help: "time to receive a whole request, headers and body, then 408 (default 120 000; responses are not limited)",
  },
  bodyIdleTimeoutMs: {
    flag: "body-idle-timeout-ms",
    env: ["CTXBANK_BODY_IDLE_TIMEOUT_MS"],
    help: "longest pause inside a request body, then 408 (default 10 000)",
  },
  keepAliveTimeoutMs: {
    flag: "keep-alive-timeout-ms",
    env: ["CTXBANK_KEEP_ALIVE_TIMEOUT_MS"],
    help: "idle keep-alive connection lifetime (default 65 000)",
  },
  maxConnections: {
    flag: "max-connections",
    env: ["CTXBANK_MAX_CONNECTIONS"],
    help: "open connections per listener (default 1024; at the cap a new one closes the oldest idle one)",
  },
  maxConnectionsPerPeer: {
    flag: "max-connections-per-peer",
    env: ["CTXBANK_MAX_CONNECTIONS_PER_PEER"],
    help: "open connections per listener from one address (default 256)",
  },
  firstByteTimeoutMs: {
    flag: "first-byte-timeout-ms",
    env: ["CTXBANK_FIRST_BYTE_TIMEOUT_MS"],
    help: "time from accepting a connection to its first byte (default 3 000)",
  },
  maxBatch: { flag: "max-batch", env: ["CTXBANK_MAX_BATCH"], help: "sequences per decode step" },
  maxQueue: { flag: "max-queue", env: ["CTXBANK_MAX_QUEUE"], help: "decode requests waiting (then 429)" },
  prefillChunking: {
    flag: "prefill-chunking",
    env: ["CTXBANK_PREFILL_CHUNKING"],
    help: "serve: slo | off: prompts share the decode steps in chunks that keep the TPOT pace (default slo)",
  },
  kvBudgetBytes: { flag: "kv-budget-bytes", env: ["CTXBANK_KV_BUDGET_BYTES"], help: "decode KV memory budget (then 429)" },
  sessionBytes: {
    flag: "session-bytes",
    env: ["CTXBANK_SESSION_BYTES"],
    help: "KV memory kept for conversations between turns (default 512 MiB; 0 = no sessions)",
  },
  sessionBytesPerKey: {
    flag: "session-bytes-per-key",
    env: ["CTXBANK_SESSION_BYTES_PER_KEY"],
    help: "one API key's share of session KV, memory and disk (default 128 MiB)",
  },
  sessionTtlMs: {
    flag: "session-ttl-ms",
    env: ["CTXBANK_SESSION_TTL_MS"],
    help: "an unused session is dropped after this (default 10 min)",
  },
  sessionDir: {
    flag: "session-dir",
    env: ["CTXBANK_SESSION_DIR"],
    help: "disk tier for sessions under memory pressure (KV in clear: a private directory; default none)",
  },
  sessionDiskBytes: {
    flag: "session-disk-bytes",
    env: ["CTXBANK_SESSION_DISK_BYTES"],
    help: "bytes the session disk tier may take (default 4 GiB)",
  },
  localPrefillTokens: {
    flag: "local-prefill-tokens",
    env: ["CTXBANK_LOCAL_PREFILL_TOKENS"],
    help: "decode: prefill here when the uncached part is at most this many tokens (default 0: sessions' turns only)",
  },
  localPrefillFraction: {
    flag: "local-prefill-fraction",
    env: ["CTXBANK_LOCAL_PREFILL_FRACTION"],
    help: "decode: or at most this fraction of the prompt (default 0.3)",
  },
  routerPollMs: {
    flag: "router-poll-ms",
    env: ["CTXBANK_ROUTER_POLL_MS"],
    help: "router: how often it reads the decodes and their load (default 1000)",
  },
  routerPolicy: {
    flag: "router-policy",
    env: ["CTXBANK_ROUTER_POLICY"],
    help: "router: kv (where the KV is, then load) or round_robin (default kv)",
  },
  routerImbalance: {
    flag: "router-imbalance",
    env: ["CTXBANK_ROUTER_IMBALANCE"],
    help: "router: requests a session's holder may have beyond the least loaded decode (default 8)",
  },
  routerTimeoutMs: {
    flag: "router-timeout-ms",
    env: ["CTXBANK_ROUTER_TIMEOUT_MS"],
    help: "router: how long a decode may take to start its answer, and then between bytes, before a 504 (default 1 800 000)",
  },
  maxBodyBytes: { flag: "max-body-bytes", env: ["CTXBANK_MAX_BODY_BYTES"], help: "largest request body (then 413)" },
  transport: {
    flag: "transport",
    env: ["CTXBANK_TRANSPORT"],
    help: "auto | http | shm | ucx (auto: in process under serve, else shm on the owner's host, then UCX where both ends have it, then http; a named transport makes serve use the shard path too)",
  },
  kvTimeoutMs: { flag: "kv-timeout-ms", env: ["CTXBANK_KV_TIMEOUT_MS"], help: "deadline for loading a request's KV" },
  kvConcurrency: { flag: "kv-concurrency", env: ["CTXBANK_KV_CONCURRENCY"], help: "chunk reads in flight per request" },
  kvPoolMib: {
    flag: "kv-pool-mib",
    env: ["CTXBANK_KV_POOL_MIB"],
    help: "MiB of released KV memory kept zeroed for new sequences (default 1024; 0 = off)",
  },
  kvStreaming: {
    flag: "kv-streaming",
    env: ["CTXBANK_KV_STREAMING"],
    help: "true | false: decode loads the KV while the prefill runs (default true)",
  },
  drainMs: { flag: "drain-ms", env: ["CTXBANK_DRAIN_MS"], help: "graceful shutdown drain time" },
  logLevel: { flag: "log-level", env: ["CTXBANK_LOG_LEVEL", "LOG_LEVEL"], help: "pino level (info)" },
  sloTtftMs: { flag: "slo-ttft-ms", env: ["CTXBANK_SLO_TTFT_MS"], help: `TTFT objective in ms (default ${SLO_DEFAULTS.ttftMs})` },
  sloTpotMs: {
    flag: "slo-tpot-ms",
    env: ["CTXBANK_SLO_TPOT_MS"],
    help: `time-per-output-token objective in ms (default ${SLO_DEFAULTS.tpotMs})`,
  },
  sloE2eMs: { flag: "slo-e2e-ms", env: ["CTXBANK_SLO_E2E_MS"], help: "end-to-end objective in ms (default: none)" },
  admission: {
    flag: "admission",
    env: ["CTXBANK_ADMISSION"],
    help: "off | slo: refuse prompts whose predicted TTFT misses the SLO (default off)",
  },
  admissionMargin: {
    flag: "admission-margin",
    env: ["CTXBANK_ADMISSION_MARGIN"],
    help: `slo admission refuses above slo-ttft × (1 + margin) (default ${SLO_DEFAULTS.admissionMargin})`,
  },
  apiKeysFile: {
    flag: "api-keys-file",
    env: ["CTXBANK_API_KEYS_FILE"],
    help: "API keys file: `<id> sha256:<hex> [rate=N burst=N concurrency=N]` lines (ctxbank keys new <id>)",
  },
  apiKeys: { flag: "api-keys", env: ["CTXBANK_API_KEYS"], help: "API key lines inline (as in the file; separated by newlines or ;)" },
  keyRate: { flag: "key-rate", env: ["CTXBANK_KEY_RATE"], help: "default requests/s per API key (default 10; 0 = unlimited)" },
  keyBurst: { flag: "key-burst", env: ["CTXBANK_KEY_BURST"], help: "default burst per API key (default 20)" },
  keyConcurrency: {
    flag: "key-concurrency",
    env: ["CTXBANK_KEY_CONCURRENCY"],
    help: "default requests in flight per API key (default 8; 0 = unlimited)",
  },
  insecure: { flag: "insecure", env: ["CTXBANK_INSECURE"], help: "allow a non-loopback bind without API keys" },
  internalHost: { flag: "internal-host", env: ["CTXBANK_INTERNAL_HOST"], help: "interface of the internal listener (default 127.0.0.1)" },
  internalPort: {
    flag: "internal-port",
    env: ["CTXBANK_INTERNAL_PORT"],
    help: "port of the internal listener (default 0 = any free port)",
  },
  internalUrl: { flag: "internal-url", env: ["CTXBANK_INTERNAL_URL"], help: "URL other services reach the internal listener at" },
  internalSecret: {
    flag: "internal-secret",
    env: ["CTXBANK_INTERNAL_SECRET"],
    help: "shared secret between services, >= 32 chars (prefer the env or the file)",
  },
  internalSecretFile: { flag: "internal-secret-file", env: ["CTXBANK_INTERNAL_SECRET_FILE"], help: "file holding the shared secret" },
  allowedHosts: {
    flag: "allowed-hosts",
    env: ["CTXBANK_ALLOWED_HOSTS"],
    help: "extra Host names to answer for, comma-separated (* = any)",
  },
};

/** A setting (flag or environment variable) that is missing or malformed; the message names it. */
export class ConfigError extends CtxbankError<"invalid_config"> {
  static override readonly codes = ["invalid_config"] as const;
  override readonly name = "ConfigError";
  constructor(message: string) {
    super("invalid_config", message);
  }
}

/** parseArgs option descriptors for every setting (all strings). */
export function configFlags(): Record<string, { type: "string" | "boolean" }> {
  return Object.fromEntries(
    Object.values(SETTINGS).map((s) => [s.flag, { type: BOOLEAN_FLAGS.has(s.flag) ? ("boolean" as const) : ("string" as const) }]),
  );
}

/** Flags given without a value (`--insecure`). */
const BOOLEAN_FLAGS = new Set(["insecure"]);

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
    if (typeof flag === "string" || typeof flag === "boolean") {
      raw[key] = String(flag);
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
  if (role !== "serve" && !/^postgres(ql)?:\/\//.test(c.databaseUrl)) {
    throw new ConfigError(
      `ctxbank ${role} runs as a separate process and needs a shared PostgreSQL: set DATABASE_URL (or --database-url) to postgres://…` +
        ` (got ${c.databaseUrl.startsWith("pglite") ? c.databaseUrl : "a non-postgres URL"}); use \`ctxbank serve\` for one process with PGlite`,
    );
  }
  checkSecurity(role, c);
  if (c.headersTimeoutMs > c.requestTimeoutMs) {
    throw new ConfigError(
      `the headers timeout (${c.headersTimeoutMs} ms) must not be longer than the request timeout (${c.requestTimeoutMs} ms), which includes it`,
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

/** Refuses configurations that would expose the API or the internal routes without credentials. */
function checkSecurity(role: ServiceRole, c: z.output<typeof ConfigSchema>): void {
  const hasKeys = c.apiKeysFile !== undefined || c.apiKeys !== undefined;
  if (!hasKeys && !c.insecure && !isLoopbackHost(c.host)) {
    throw new ConfigError(
      `refusing to listen on ${c.host} without API keys: give --api-keys-file (or CTXBANK_API_KEYS; \`ctxbank keys new <id>\` makes one), ` +
        `bind to 127.0.0.1, or pass --insecure to serve anyone who can reach the port`,
    );
  }
  if (c.internalPort !== 0 && c.internalPort === c.port) {
    throw new ConfigError(`--internal-port ${c.internalPort} is also --port: the internal listener needs a port of its own`);
  }
  const hasSecret = c.internalSecret !== undefined || c.internalSecretFile !== undefined;
  if (!hasSecret && role !== "serve") {
    throw new ConfigError(
      `ctxbank ${role} talks to the other services over the internal listener and needs their shared secret: ` +
        `set CTXBANK_INTERNAL_SECRET (>= 32 chars, the same in every process) or --internal-secret-file`,
    );
  }
  if (!hasSecret && !isLoopbackHost(c.internalHost)) {
    throw new ConfigError(
      `refusing to open the internal listener on ${c.internalHost} without a shared secret: set CTXBANK_INTERNAL_SECRET (>= 32 chars, the same in every process) or --internal-secret-file`,
    );
  }
}

/** 127.0.0.0/8, ::1 and localhost: reachable only from this host. */
export function isLoopbackHost(host: string): boolean {
  const h = host.toLowerCase().replace(/^\[(.*)\]$/, "$1");
  return h === "localhost" || h === "::1" || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(h);
}

function sanitizeId(s: string): string {
  return s
    .replace(/[^A-Za-z0-9._:-]/g, "-")
    .replace(/^[^A-Za-z0-9]+/, "")
    .slice(0, 128);
}
