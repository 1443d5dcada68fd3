// Command-line options of `npm run bench:loadgen`, validated before anything is sent.
import { parseArgs } from "node:util";
import { UsageError } from "../../shared/inference/errors.ts";
import type { ArrivalSpec } from "./arrivals.ts";
import type { Endpoint } from "./client.ts";
import { parseLengthDist, type WorkloadSpec } from "./workloads.ts";
import type { Slo } from "./types.ts";

export const HELP = `Usage: npm run bench:loadgen -- [options]        (tsx tools/loadgen/cli.ts)
       npm run bench:loadgen -- --suite [suite options]  (the committed suite; --suite --help)

Target (any OpenAI-compatible server):
  --base-url URL        API base (default http://127.0.0.1:8080/v1)
  --model ID            model to ask for (default: the first id of GET {base}/models)
  --api-key KEY         Bearer token (default $OPENAI_API_KEY; none if unset)
  --allow-host HOST     allow this non-loopback host (repeatable); otherwise only loopback is loaded
  --endpoint E          chat | completions (default chat)
  --policy NAME         ctxbank extension: the request's attention policy (checked in /openapi.json)
  --ignore-eos          send ignore_eos: true and min_tokens = max_tokens (vLLM's extensions);
                        output lengths are reported as the server counted them either way
  --extra-body JSON     more fields for every request
  --timeout S           per-request limit, send to end of stream (default 600)

Workload:
  --workload W          fixed | random | longdoc | multiturn (default fixed)
  --input LEN           prompt tokens: 256, 100-400 (uniform) or 256~64 (normal) (default 256;
                        random: 64-1024; longdoc: 4096; multiturn: new tokens per user turn, 128)
  --output LEN          max_tokens, same forms (default 128)
  --prompt-format F     completions only: text | ids (token ids: exact lengths; ctxbank, vLLM)
  --rounds N            multiturn: rounds per session (default 4)
  --think S             multiturn: mean think time between rounds, exponential (default 2)
  --session-ids on|off  multiturn: name each conversation with x-session-id (unique per run and
                        session) so a server keeping KV between turns can reuse it (default on)
  --tokenizer GGUF      sizes prompts (default: ctxbank's default model)

Arrivals (one of; default --rate 1):
  --rate R              Poisson arrivals at R req/s (sessions/s for multiturn)
  --burst N --every S   N requests every S seconds
  --concurrency C       closed loop: C requests (sessions) in flight
  --requests N          request cap (default 100)
  --duration S          stop starting requests after S seconds (default 300)
  --drain S             then wait up to S seconds for requests in flight (default 120)
  --warmup N            unrecorded requests first (default 2)
  --seed N              arrival, length and document draws (default 1)

SLOs (both needed for attainment and goodput):
  --slo-ttft MS --slo-tpot MS

Sweep (needs SLOs): the highest Poisson rate with >= --target attainment
  --sweep               bracket (x2 / ÷2) from --start-rate, then bisect
  --start-rate R        (default 1)   --target F (default 0.9)   --rel-tol F (default 0.1)
  --per-point N         requests per rate (default 40)   --max-points N (default 10)
  --budget S            stop the sweep after S seconds (default 1800)

Output:
  --out DIR             write loadgen.json, loadgen.md and charts there (default: print only)
  --itl                 keep every ITL gap per request in the JSON
  --no-progress         no progress bar
  -h, --help
`;

export interface CliOptions {
  baseUrl: string;
  model?: string;
  apiKey?: string;
  allowHosts: string[];
  policy?: string;
  ignoreEos: boolean;
  extraBody: Record<string, unknown>;
  timeoutS: number;
  workload: WorkloadSpec;
  tokenizer?: string;
  arrivals: ArrivalSpec;
  requests: number;
  durationS: number;
  drainS: number;
  warmup: number;
  seed: number;
  slo?: Slo;
  sweep?: { startRate: number; target: number; relTol: number; perPoint: number; maxPoints: number; budgetS: number };
  out?: string;
  itl: boolean;
  progress: boolean;
}

const SPEC = {
  "base-url": { type: "string" },
  model: { type: "string" },
  "api-key": { type: "string" },
  "allow-host": { type: "string", multiple: true },
  endpoint: { type: "string" },
  policy: { type: "string" },
  "ignore-eos": { type: "boolean" },
  "extra-body": { type: "string" },
  timeout: { type: "string" },
  workload: { type: "string" },
  input: { type: "string" },
  output: { type: "string" },
  "prompt-format": { type: "string" },
  rounds: { type: "string" },
  think: { type: "string" },
  "session-ids": { type: "string" },
  tokenizer: { type: "string" },
  rate: { type: "string" },
  burst: { type: "string" },
  every: { type: "string" },
  concurrency: { type: "string" },
  requests: { type: "string" },
  duration: { type: "string" },
  drain: { type: "string" },
  warmup: { type: "string" },
  seed: { type: "string" },
  "slo-ttft": { type: "string" },
  "slo-tpot": { type: "string" },
  sweep: { type: "boolean" },
  "start-rate": { type: "string" },
  target: { type: "string" },
  "rel-tol": { type: "string" },
  "per-point": { type: "string" },
  "max-points": { type: "string" },
  budget: { type: "string" },
  out: { type: "string" },
  itl: { type: "boolean" },
  "no-progress": { type: "boolean" },
  help: { type: "boolean", short: "h" },
} as const;

function num(flag: string, v: string | undefined, def: number, o: { int?: boolean; min?: number; max?: number; gt?: number } = {}): number {
  if (v === undefined) return def;
  const n = v.trim() === "" ? NaN : Number(v);
  const bad =
    !Number.isFinite(n) ||
    (o.int && !Number.isInteger(n)) ||
    (o.min !== undefined && n < o.min) ||
    (o.max !== undefined && n > o.max) ||
    (o.gt !== undefined && !(n > o.gt));
  if (bad) {
    const range = o.gt !== undefined ? `> ${o.gt}` : `in [${o.min ?? "-∞"}, ${o.max ?? "∞"}]`;
    throw new UsageError(`--${flag} must be ${o.int ? "an integer" : "a number"} ${range} (got ${JSON.stringify(v)})`);
  }
  return n;
}

export function parseCli(argv: string[], env: NodeJS.ProcessEnv = process.env): CliOptions | "help" {
  let values: Record<string, string | boolean | string[] | undefined>;
  try {
    ({ values } = parseArgs({ args: argv, options: SPEC, strict: true, allowPositionals: false }));
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
  if (values.help) return "help";
  const str = (k: string) => values[k] as string | undefined;
  const endpoint = (str("endpoint") ?? "chat") as Endpoint;
  if (endpoint !== "chat" && endpoint !== "completions")
    throw new UsageError(`--endpoint must be chat or completions (got ${JSON.stringify(endpoint)})`);
  const kind = str("workload") ?? "fixed";
  const promptFormat = str("prompt-format") ?? "text";
  if (promptFormat !== "text" && promptFormat !== "ids") throw new UsageError("--prompt-format must be text or ids");
  if (promptFormat === "ids" && endpoint !== "completions") throw new UsageError("--prompt-format ids needs --endpoint completions");
  const len = (flag: string, def: string) => {
    try {
      return parseLengthDist(str(flag) ?? def, `--${flag}`);
    } catch (e) {
      throw new UsageError((e as Error).message);
    }
  };
  const output = len("output", "128");
  let workload: WorkloadSpec;
  if (kind === "fixed" || kind === "random") {
    const input = len("input", kind === "fixed" ? "256" : "64-1024");
    if (kind === "fixed" && (input.kind !== "fixed" || output.kind !== "fixed"))
      throw new UsageError("--workload fixed takes single numbers for --input/--output (use --workload random for ranges)");
    workload = {
      kind: "synthetic",
      endpoint,
      input,
      output: kind === "random" && str("output") === undefined ? { kind: "uniform", min: 32, max: 256 } : output,
      promptFormat,
    };
  } else if (kind === "longdoc") {
    workload = { kind: "longdoc", endpoint, input: len("input", "4096"), output };
  } else if (kind === "multiturn") {
    if (endpoint !== "chat") throw new UsageError("--workload multiturn needs --endpoint chat");
    const ids = str("session-ids") ?? "on";
    if (ids !== "on" && ids !== "off") throw new UsageError(`--session-ids must be on or off (got ${JSON.stringify(ids)})`);
    workload = {
      kind: "multiturn",
      rounds: num("rounds", str("rounds"), 4, { int: true, min: 1, max: 100 }),
      thinkS: num("think", str("think"), 2, { min: 0 }),
      input: len("input", "128"),
      output,
      sessionIds: ids === "on",
    };
  } else throw new UsageError(`--workload must be fixed, random, longdoc or multiturn (got ${JSON.stringify(kind)})`);

  if (kind !== "multiturn" && str("session-ids") !== undefined) throw new UsageError("--session-ids needs --workload multiturn");
  const modes = [
    str("rate") !== undefined,
    str("burst") !== undefined || str("every") !== undefined,
    str("concurrency") !== undefined,
  ].filter(Boolean).length;
  if (modes > 1) throw new UsageError("give one of --rate, --burst/--every, --concurrency");
  let arrivals: ArrivalSpec;
  if (str("burst") !== undefined || str("every") !== undefined) {
    if (str("burst") === undefined || str("every") === undefined) throw new UsageError("--burst needs --every (and the other way round)");
    arrivals = {
      kind: "burst",
      size: num("burst", str("burst"), 1, { int: true, min: 1 }),
      periodS: num("every", str("every"), 1, { gt: 0 }),
    };
  } else if (str("concurrency") !== undefined) {
    arrivals = { kind: "concurrency", concurrency: num("concurrency", str("concurrency"), 1, { int: true, min: 1, max: 10_000 }) };
  } else arrivals = { kind: "poisson", rate: num("rate", str("rate"), 1, { gt: 0 }) };

  let extraBody: Record<string, unknown> = {};
  if (str("extra-body") !== undefined) {
    try {
      extraBody = JSON.parse(str("extra-body")!);
    } catch (e) {
      throw new UsageError(`--extra-body is not JSON: ${(e as Error).message}`);
    }
    if (typeof extraBody !== "object" || extraBody === null || Array.isArray(extraBody))
      throw new UsageError("--extra-body must be a JSON object");
  }
  const sloT = str("slo-ttft");
  const sloP = str("slo-tpot");
  if ((sloT === undefined) !== (sloP === undefined)) throw new UsageError("give both --slo-ttft and --slo-tpot");
  const slo = sloT !== undefined ? { ttftMs: num("slo-ttft", sloT, 0, { gt: 0 }), tpotMs: num("slo-tpot", sloP, 0, { gt: 0 }) } : undefined;
  if (values.sweep && !slo) throw new UsageError("--sweep needs --slo-ttft and --slo-tpot");
  if (values.sweep && str("concurrency") !== undefined)
    throw new UsageError("--sweep varies a Poisson rate; it cannot be combined with --concurrency");

  const opts: CliOptions = {
    baseUrl: str("base-url") ?? "http://127.0.0.1:8080/v1",
    allowHosts: (values["allow-host"] as string[] | undefined) ?? [],
    ignoreEos: values["ignore-eos"] === true,
    extraBody,
    timeoutS: num("timeout", str("timeout"), 600, { gt: 0 }),
    workload,
    arrivals,
    requests: num("requests", str("requests"), 100, { int: true, min: 1 }),
    durationS: num("duration", str("duration"), 300, { gt: 0 }),
    drainS: num("drain", str("drain"), 120, { min: 0 }),
    warmup: num("warmup", str("warmup"), 2, { int: true, min: 0 }),
    seed: num("seed", str("seed"), 1, { int: true, min: 0, max: 2 ** 32 - 1 }),
    itl: values.itl === true,
    progress: values["no-progress"] !== true,
  };
  if (str("model") !== undefined) opts.model = str("model");
  const key = str("api-key") ?? env.OPENAI_API_KEY;
  if (key) opts.apiKey = key;
  if (str("policy") !== undefined) opts.policy = str("policy");
  if (str("tokenizer") !== undefined) opts.tokenizer = str("tokenizer");
  if (slo) opts.slo = slo;
  if (str("out") !== undefined) opts.out = str("out");
  if (values.sweep) {
    opts.sweep = {
      startRate: num("start-rate", str("start-rate"), 1, { gt: 0 }),
      target: num("target", str("target"), 0.9, { gt: 0, max: 1 }),
      relTol: num("rel-tol", str("rel-tol"), 0.1, { gt: 0 }),
      perPoint: num("per-point", str("per-point"), 40, { int: true, min: 1 }),
      maxPoints: num("max-points", str("max-points"), 10, { int: true, min: 1 }),
      budgetS: num("budget", str("budget"), 1800, { gt: 0 }),
    };
  }
  return opts;
}
