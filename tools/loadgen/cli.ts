// npm run bench:loadgen -- [options]   (tsx tools/loadgen/cli.ts; --help lists the options)
//
// Load generator for any OpenAI-compatible streaming endpoint: arrival processes (Poisson,
// bursts, closed loop), workloads (fixed or random lengths, long-document QA, multi-turn
// sessions), client-side TTFT/TPOT/ITL/E2E, SLO attainment and goodput, and a sweep for the
// highest rate meeting the SLOs. `--suite` runs the committed ctxbank suite (run-suite.ts).
import { join, resolve } from "node:path";
import os from "node:os";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { REPO_ROOT, Results, runRecord } from "../lib/bench-runner.ts";
import { describeArrivals } from "./arrivals.ts";
import { StreamingClient } from "./client.ts";
import { loadCorpus } from "./corpus.ts";
import { checkTarget } from "./host-guard.ts";
import { UsageError } from "../../shared/inference/errors.ts";
import { HELP, parseCli, type CliOptions } from "./options.ts";
import { PromptSource } from "./prompts.ts";
import { attainmentPanel, cdfPanel, chart, compactResult, roundsTable, serverCountsLine, statsTable } from "./report.ts";
import { runLoad, type RunResult } from "./runner.ts";
import { runSweep } from "./sweep-run.ts";
import { firstModel, policyValues } from "./target.ts";
import { describeWorkload, WorkloadFactory, type LengthDist } from "./workloads.ts";

const log = (m: string) => process.stderr.write(`[loadgen] ${m}\n`);

export const maxOf = (d: LengthDist) => (d.kind === "fixed" ? d.value : d.max);

/** The policy field value: a name, or a JSON object when the flag's value looks like one. */
export function policyField(p: string): unknown {
  if (!p.trim().startsWith("{")) return p;
  try {
    return JSON.parse(p);
  } catch (e) {
    throw new UsageError(`--policy looks like JSON but is not: ${(e as Error).message}`);
  }
}

async function main(argv: string[]): Promise<void> {
  if (argv.includes("--suite")) {
    const { suiteMain } = await import("./run-suite.ts");
    await suiteMain(argv.filter((a) => a !== "--suite"));
    return;
  }
  const parsed = parseCli(argv);
  if (parsed === "help") {
    process.stdout.write(HELP);
    return;
  }
  const o: CliOptions = parsed;
  checkTarget(o.baseUrl, o.allowHosts);
  const model = o.model ?? (await firstModel(o.baseUrl, o.apiKey));
  const endpoint = o.workload.kind === "multiturn" ? "chat" : o.workload.endpoint;
  const extraBody: Record<string, unknown> = { ...o.extraBody };
  if (o.policy !== undefined) {
    const path = `${new URL(o.baseUrl).pathname.replace(/\/+$/, "")}/${endpoint === "chat" ? "chat/completions" : "completions"}`;
    const allowed = await policyValues(o.baseUrl, path, o.apiKey);
    const field = policyField(o.policy);
    if (allowed === undefined) log(`the server publishes no /openapi.json: sending policy ${JSON.stringify(field)} unchecked`);
    else if (allowed.length === 0) throw new UsageError(`the server's ${path} has no "policy" field: it would ignore --policy`);
    else if (typeof field === "string" && !allowed.includes("*") && !allowed.includes(field))
      throw new UsageError(`policy ${JSON.stringify(field)} is not one of ${allowed.join(", ")}`);
    extraBody.policy = field;
  }
  if (o.ignoreEos) {
    extraBody.ignore_eos = true;
    if (o.workload.output.kind === "fixed") extraBody.min_tokens = o.workload.output.value;
  }
  const tokenizer = o.tokenizer ?? (await resolveModel());
  log(`corpus and tokenizer (${tokenizer})`);
  const corpus = loadCorpus(join(REPO_ROOT, "node_modules"));
  const prompts = PromptSource.fromGguf(tokenizer, corpus.text);
  const factory = new WorkloadFactory(o.workload, prompts);
  const client = new StreamingClient({ baseUrl: o.baseUrl, model, apiKey: o.apiKey, timeoutMs: o.timeoutS * 1000, extraBody });
  const record = runRecord(`npm run bench:loadgen -- ${argv.join(" ")}`.trim());
  log(`${o.baseUrl} model ${model}: ${describeWorkload(o.workload)}; ${o.sweep ? "sweep" : describeArrivals(o.arrivals)}`);
  try {
    const common = {
      ...record,
      target: { baseUrl: o.baseUrl, model, extraBody },
      workload: {
        spec: o.workload,
        description: describeWorkload(o.workload),
        corpusFiles: corpus.files.length,
        corpusTokens: prompts.ids.length,
      },
      slo: o.slo,
    };
    if (o.sweep && o.slo) {
      if (o.warmup > 0)
        await runLoad(client, factory, {
          arrivals: { kind: "concurrency", concurrency: 1 },
          maxRequests: o.warmup,
          durationS: 1e6,
          drainS: 0,
          warmup: 0,
          seed: o.seed + 1,
          progress: false,
        });
      const sw = await runSweep(client, factory, {
        ...o.sweep,
        slo: o.slo,
        maxOutputTokens: maxOf(o.workload.output),
        seed: o.seed,
        progress: o.progress,
      });
      const rows = sw.runs.map((r) => ({ label: `${r.rate.toPrecision(3)} req/s`, stats: r.run.stats }));
      process.stdout.write(
        `${statsTable(rows)}\n\nmax rate with >= ${100 * o.sweep.target}% SLO attainment: ${sw.result.maxRate?.toPrecision(3) ?? "none passed"} req/s (lowest failing: ${sw.result.failRate?.toPrecision(3) ?? "none failed"}; stopped: ${sw.result.stoppedBy})\n`,
      );
      if (o.out) {
        const results = new Results(resolve(o.out));
        await results.json("loadgen", {
          benchmark: "loadgen-sweep",
          ...common,
          finished: new Date().toISOString(),
          loadAvgAfter: os.loadavg(),
          sweep: { options: o.sweep, drainS: sw.drainS, ...sw.result },
          points: sw.runs.map((r) => ({
            rate: r.rate,
            stats: r.run.stats,
            warmup: r.run.warmup,
            qa: r.run.qa,
            requests: r.run.results.map((x) => compactResult(x, o.itl)),
          })),
        });
        await results.markdown("loadgen", statsTable(rows) + "\n");
        await results.chart(
          "loadgen",
          chart(
            [
              attainmentPanel(
                "SLO attainment vs rate",
                [{ label: "attainment", points: sw.runs.map((r) => ({ rate: r.rate, attainment: r.run.stats.slo?.attainment ?? 0 })) }],
                o.sweep.target,
              ),
              cdfPanel(
                "TTFT CDF per rate",
                sw.runs.map((r) => ({ label: `${r.rate.toPrecision(3)} req/s`, values: okValues(r.run, "ttftMs") })),
                "TTFT (s)",
                true,
              ),
            ],
            `loadgen sweep: ${describeWorkload(o.workload)}`,
            `${o.baseUrl} · SLO TTFT ${o.slo.ttftMs} ms, TPOT ${o.slo.tpotMs} ms`,
          ),
        );
        log(`wrote ${results}/loadgen.json, loadgen.md, loadgen.svg`);
      }
      return;
    }
    const label =
      describeArrivals(o.arrivals) + (o.workload.kind === "multiturn" && o.arrivals.kind !== "concurrency" ? " (sessions)" : "");
    const run = await runLoad(client, factory, {
      arrivals: o.arrivals,
      maxRequests: o.requests,
      durationS: o.durationS,
      drainS: o.drainS,
      warmup: o.warmup,
      seed: o.seed,
      slo: o.slo,
      label,
      progress: o.progress,
    });
    const extra = [
      ...(run.rounds ? ["", roundsTable([{ label, rounds: run.rounds }])] : []),
      ...(run.server || run.sessions ? ["", serverCountsLine(run.server)] : []),
    ].join("\n");
    process.stdout.write(statsTable([{ label, stats: run.stats }]) + "\n" + (extra ? `${extra}\n` : ""));
    if (run.sessions)
      process.stdout.write(
        `sessions: ${run.sessions.completed}/${run.sessions.started} completed, ${run.sessions.roundsPerS.toFixed(3)} rounds/s, session ids ${run.sessions.sessionIds ? "sent" : "not sent"}\n`,
      );
    if (run.qa) process.stdout.write(`long-document QA: ${run.qa.correct}/${run.qa.checked} answers contain the reference code\n`);
    if (o.out) {
      const results = new Results(resolve(o.out));
      await results.json("loadgen", {
        benchmark: "loadgen",
        ...common,
        finished: new Date().toISOString(),
        loadAvgAfter: os.loadavg(),
        arrivals: o.arrivals,
        caps: { requests: o.requests, durationS: o.durationS, drainS: o.drainS, warmup: o.warmup, seed: o.seed },
        stats: run.stats,
        sessions: run.sessions,
        rounds: run.rounds,
        server: run.server,
        qa: run.qa,
        warmup: run.warmup,
        requests: run.results.map((x) => compactResult(x, o.itl)),
      });
      await results.markdown("loadgen", statsTable([{ label, stats: run.stats }]) + "\n" + (extra ? `${extra}\n` : ""));
      await results.chart(
        "loadgen",
        chart(
          [
            cdfPanel("TTFT", [{ label: "TTFT", values: okValues(run, "ttftMs") }], "s", true),
            cdfPanel(
              "TPOT and ITL",
              [
                { label: "TPOT", values: okValues(run, "tpotMs") },
                { label: "ITL (every gap)", values: run.results.flatMap((r) => r.itlMs) },
              ],
              "ms",
            ),
            cdfPanel("E2E", [{ label: "E2E", values: okValues(run, "e2eMs") }], "s", true),
          ],
          `loadgen: ${describeWorkload(o.workload)}`,
          `${o.baseUrl} · ${label}`,
          3,
        ),
      );
      log(`wrote ${results}/loadgen.json, loadgen.md, loadgen.svg`);
    }
  } finally {
    await client.close();
  }
}

export function okValues(run: RunResult, key: "ttftMs" | "tpotMs" | "e2eMs"): number[] {
  return run.results.filter((r) => r.ok && r[key] !== undefined).map((r) => r[key]!);
}

if (import.meta.url === `file://${process.argv[1]}` || process.argv[1]?.endsWith("tools/loadgen/cli.ts")) {
  main(process.argv.slice(2)).catch((e: unknown) => {
    const usage = e instanceof UsageError;
    process.stderr.write(`loadgen: ${(e as Error).message}${usage ? " (see --help)" : ""}\n`);
    if (!usage && process.env.LOADGEN_DEBUG) process.stderr.write(`${(e as Error).stack}\n`);
    process.exit(usage ? 2 : 1);
  });
}
