// npm run plan -- [options]   (tsx tools/planner/cli.ts; --help lists the options)
//
// Capacity planner: Fu's four costs of long context for the model and hardware (given by flags,
// or probed on this machine), and a DistServe-style prefill:decode replica plan for a workload
// at a rate under its SLOs. --measure measures the same quantities with the engine and the
// services for the load suite's two workloads and writes a prediction-vs-measurement table.
import { resolve } from "node:path";
import { parseArgs } from "node:util";
import { UsageError } from "../../shared/inference/errors.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { resultsDir } from "../lib/bench-runner.ts";
import { setProcessNice } from "../lib/machine.ts";
import { fmtNum } from "../../shared/platform/table.ts";
import { decodeComputeSeconds, decodeMemorySeconds, fourCosts, replicaPlan, type Hardware, type Workload } from "./costs.ts";
import { runMeasurement } from "./compare.ts";
import { modelFacts, type ModelFacts } from "./model.ts";
import { hardwareFrom } from "./hardware.ts";
import { probeAll, type ProbeResult } from "./probe.ts";

const HELP = `Usage: npm run plan -- [options]

Workload (default: the load suite's long document):
  --prompt N          prompt tokens (default 4096)
  --output N          generated tokens (default 128)
  --rate R            requests/s to plan for (default 0.05)
  --slo-ttft MS       (default 45000)   --slo-tpot MS (default 150)
  --attainment F      share of requests meeting the TTFT SLO (default 0.9)
  --max-batch N       decode places per instance (ctxbank --max-batch, default 8)

Hardware (numbers may end in k, M, G, T; any figure not given is probed on this machine):
  --flops F           prefill FLOP/s
  --decode-flops F    FLOP/s of small decode steps (one thread in ctxbank: batches up to 4)
  --mem-bw B          memory read bandwidth, bytes/s
  --mem BYTES         memory for weights + KV (default: this machine's RAM)
  --link-bw B         host link bandwidth for KV moves, bytes/s
  --link shm|tcp      which probe stands for the link (default shm: same-host handoff)
  --threads N         engine threads for the FLOP/s probe (default 2)

  --model GGUF        (default: ctxbank's default model)
  --measure           measure prefill, decode, memory fit and KV handoff with the engine and the
                      services for 256/128 and 4096/128 and write the comparison (results/planner)
  --budget BYTES      memory budget of the concurrency measurement (default 1G)
  --out DIR           where --measure writes (default results/planner)
  --nice N            nice of this process and the services for --measure (default -10)
  --json              print the plan as JSON
  -h, --help
`;

/** "2.5e11", "24G", "1.5T", "512M" → number. */
export function parseQuantity(flag: string, v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  const m = /^\s*([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([kKMGT]?)\s*$/.exec(v);
  const mult = { "": 1, k: 1e3, K: 1e3, M: 1e6, G: 1e9, T: 1e12 } as const;
  const n = m ? Number(m[1]) * mult[m[2] as keyof typeof mult] : NaN;
  if (!Number.isFinite(n) || n <= 0)
    throw new UsageError(`--${flag} must be a positive number, optionally with k/M/G/T (got ${JSON.stringify(v)})`);
  return n;
}

const int = (flag: string, v: string | undefined, def: number) => {
  const n = v === undefined ? def : Number(v);
  if (!Number.isInteger(n) || n < 1) throw new UsageError(`--${flag} must be a positive integer (got ${JSON.stringify(v)})`);
  return n;
};

export function formatPlan(m: ModelFacts, hw: Hardware, w: Workload, maxBatch: number, attainment: number): string {
  const c = fourCosts(m, hw, w.promptTokens, w.outputTokens);
  const plan = replicaPlan(m, hw, w, { maxBatch, handoffS: c.contextSwitchS, attainment });
  const g = (x: number) => `${fmtNum(x / 1e9)} G`;
  const mem = decodeMemorySeconds(m, hw, w.promptTokens) * 1000;
  const cmp = decodeComputeSeconds(m, hw, w.promptTokens) * 1000;
  return [
    `model ${m.name}: ${m.nLayer} layers, ${m.nHead}/${m.nHeadKv} heads of ${m.headDim}; weights ${fmtNum(m.weightBytes / 2 ** 20)} MiB; KV ${m.kvBytesPerToken} B/token`,
    `hardware: ${g(hw.flops)}FLOP/s prefill${hw.decodeFlops ? `, ${g(hw.decodeFlops.rate)}FLOP/s decode steps <= ${hw.decodeFlops.upToBatch}` : ""}, memory ${g(hw.memBw)}B/s, ${fmtNum(hw.memBytes / 2 ** 30)} GiB, link ${g(hw.linkBw)}B/s`,
    `workload: ${w.promptTokens} in / ${w.outputTokens} out at ${w.rate} req/s; SLO TTFT ${w.sloTtftMs} ms, TPOT ${w.sloTpotMs} ms (${100 * attainment}% of requests)`,
    "",
    "Four costs (Fu; docs/algorithms.md):",
    `  concurrency (memory):    floor((${fmtNum(hw.memBytes / 2 ** 20)} MiB − ${fmtNum(m.weightBytes / 2 ** 20)} MiB) / KV(${w.promptTokens + w.outputTokens}) = ${fmtNum(((w.promptTokens + w.outputTokens) * m.kvBytesPerToken) / 2 ** 20)} MiB) = ${c.concurrency} sequences`,
    `  prefill (FLOP/s):        ${fmtNum(c.prefillS * 1000)} ms for ${w.promptTokens} tokens`,
    `  decode (bandwidth):      ${fmtNum(mem, 2)} ms/token at batch 1 (compute side ${fmtNum(cmp, 2)} ms; step = the larger)`,
    `  context switch (link):   ${fmtNum(c.contextSwitchS * 1000)} ms to move ${fmtNum(c.kvBytes / 2 ** 20)} MiB of KV`,
    "",
    "Replica plan (DistServe-style, disaggregated):",
    `  one prefill instance:    up to ${plan.prefillMaxRate.toPrecision(3)} req/s with p${100 * attainment} TTFT <= SLO (M/D/1)`,
    `  one decode instance:     up to ${plan.decode.maxRate.toPrecision(3)} req/s: batch ${plan.decode.batch} (limited by ${plan.decode.limitedBy}), TPOT ${fmtNum(plan.decode.tpotS * 1000)} ms incl. the handoff`,
    `  at ${w.rate} req/s:        ${plan.prefillReplicas} prefill : ${plan.decodeReplicas} decode (one pair serves ${plan.onePairMaxRate.toPrecision(3)} req/s)`,
    "",
  ].join("\n");
}

async function main(argv: string[]): Promise<void> {
  let values: Record<string, string | boolean | undefined>;
  try {
    ({ values } = parseArgs({
      args: argv,
      strict: true,
      options: {
        prompt: { type: "string" },
        output: { type: "string" },
        rate: { type: "string" },
        "slo-ttft": { type: "string" },
        "slo-tpot": { type: "string" },
        attainment: { type: "string" },
        "max-batch": { type: "string" },
        flops: { type: "string" },
        "decode-flops": { type: "string" },
        "mem-bw": { type: "string" },
        mem: { type: "string" },
        "link-bw": { type: "string" },
        link: { type: "string" },
        threads: { type: "string" },
        model: { type: "string" },
        measure: { type: "boolean" },
        budget: { type: "string" },
        out: { type: "string" },
        nice: { type: "string" },
        json: { type: "boolean" },
        help: { type: "boolean", short: "h" },
      },
    }));
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
  if (values.help) {
    process.stdout.write(HELP);
    return;
  }
  const s = (k: string) => values[k] as string | undefined;
  const link = (s("link") ?? "shm") as "shm" | "tcp";
  if (link !== "shm" && link !== "tcp") throw new UsageError("--link must be shm or tcp");
  const threads = int("threads", s("threads"), 2);
  const attainment = Number(s("attainment") ?? 0.9);
  if (!(attainment > 0 && attainment < 1)) throw new UsageError("--attainment must be in (0, 1)");
  const workload: Workload = {
    promptTokens: int("prompt", s("prompt"), 4096),
    outputTokens: int("output", s("output"), 128),
    rate: parseQuantity("rate", s("rate")) ?? 0.05,
    sloTtftMs: parseQuantity("slo-ttft", s("slo-ttft")) ?? 45_000,
    sloTpotMs: parseQuantity("slo-tpot", s("slo-tpot")) ?? 150,
  };
  const maxBatch = int("max-batch", s("max-batch"), 8);
  const given = {
    flops: parseQuantity("flops", s("flops")),
    decodeFlops: parseQuantity("decode-flops", s("decode-flops")),
    memBw: parseQuantity("mem-bw", s("mem-bw")),
    mem: parseQuantity("mem", s("mem")),
    linkBw: parseQuantity("link-bw", s("link-bw")),
  };
  const modelPath = s("model") ? resolve(s("model")!) : await resolveModel();
  const facts = modelFacts(modelPath);
  if (values.measure) {
    const nice = Number(s("nice") ?? -10);
    const err = setProcessNice(nice);
    if (err) process.stderr.write(`[plan] could not set nice ${nice}: ${err}\n`);
    await runMeasurement({
      modelPath,
      facts,
      threads,
      nice,
      budgetBytes: parseQuantity("budget", s("budget")) ?? 2 ** 30,
      out: s("out") ? resolve(s("out")!) : resultsDir("planner"),
      maxBatch,
      attainment,
      argv,
    });
    return;
  }
  const missing = given.flops === undefined || given.memBw === undefined || given.linkBw === undefined;
  let probe: ProbeResult | undefined;
  if (missing) {
    process.stderr.write("[plan] probing this machine for the figures not given (a few seconds)\n");
    probe = await probeAll(modelPath, facts, threads);
  }
  const hw = hardwareFrom(probe, given, link);
  if (values.json) {
    const c = fourCosts(facts, hw, workload.promptTokens, workload.outputTokens);
    process.stdout.write(
      JSON.stringify(
        {
          model: facts,
          hardware: hw,
          probe,
          workload,
          costs: c,
          plan: replicaPlan(facts, hw, workload, { maxBatch, handoffS: c.contextSwitchS, attainment }),
        },
        null,
        2,
      ) + "\n",
    );
  } else process.stdout.write(formatPlan(facts, hw, workload, maxBatch, attainment));
}

if (process.argv[1]?.endsWith("planner/cli.ts")) {
  main(process.argv.slice(2)).then(
    () => process.exit(0),
    (e: unknown) => {
      const usage = e instanceof UsageError;
      process.stderr.write(`plan: ${(e as Error).message}${usage ? " (see --help)" : ""}\n`);
      process.exit(usage ? 2 : 1);
    },
  );
}
