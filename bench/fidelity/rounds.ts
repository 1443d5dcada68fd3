// Round Attention on multi-round recall (docs/algorithms.md, docs/sessions.md): conversations of
// n earlier rounds, one of which states a locker code, then the question. Per conversation the
// prompt is prefilled once under `rounds` (full attention; the watershed layer's last queries
// remembered, as a prefill that hands its KV over does) and its prompt state exported; then each
// policy decodes N greedy tokens from the same cache: `full`, and `rounds` at each top_k, which
// imports the prompt state and takes the pick made where the prompt ended (engine.pickRounds), as
// a decode does across the handoff. Per run: the score (the code in the answer), whether the pick
// holds the fact's round, agreement with full, and the KV bytes the decode reads over the handoff
// (the chunks services/handoff/round-chunks.ts says it needs, as the prefill cuts them) against
// the whole prompt's.
//
//   npm run bench:rounds [-- --quick] [--watershed 12] [--rounds 4,8] [--top-k 1,2,0] [--out DIR] [--replot]
import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import type { AttentionPolicy, NativeSequence } from "../../shared/inference/engine/native.ts";
import { argmax } from "../../shared/inference/engine/sampler.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { encodeChat } from "../../shared/inference/tokenizer/chat-encode.ts";
import { ChatTemplate } from "../../shared/inference/tokenizer/chat-template.ts";
import { GgufTokenizer } from "../../shared/inference/tokenizer/tokenizer.ts";
import { chunkByteLength } from "../../services/handoff/format/chunk.ts";
import { chunkNeeded, roundBlocks, type RoundsLayout } from "../../services/handoff/round-chunks.ts";
import { benchCli, type Results, type RunRecord } from "../../tools/lib/bench-runner.ts";
import { renderChart } from "../../tools/lib/svg-chart.ts";
import { mean, tokenAgreement } from "./metrics.ts";
import { multiRoundTask, scorePasskey } from "./tasks.ts";

const bench = benchCli({
  name: "rounds",
  script: "npm run bench:rounds --",
  options: {
    watershed: { type: "string", default: "12" },
    rounds: { type: "string", default: "4,8" },
    "top-k": { type: "string", default: "1,2,0" },
    seeds: { type: "string", default: "2" },
  },
  help: `  --watershed L       the watershed layer (SmolLM2-135M has no calibrated one; default 12)
  --rounds LIST       earlier rounds per conversation (default 4,8)
  --top-k LIST        rounds policies' top_k; 0 = adaptive, mean + std (default 1,2,0)
  --seeds N           conversations per (rounds, fact position) (default 2)`,
  quick: "one 4-round conversation",
  replot: true,
});

interface Run {
  policy: string;
  topK: number | null;
  score: number;
  agreement: number;
  /** Whether the pick kept the fact's round (rounds only). */
  hit: boolean | null;
  picked: number[] | null;
  /** KV bytes a decode reads over the handoff, and the whole prompt's (the chunks of every layer and round). */
  bytes: number;
  promptBytes: number;
  output: string;
}

interface Conversation {
  label: string;
  rounds: number;
  factRound: number;
  promptTokens: number;
  roundStarts: number[];
  answer: string;
  prefillMs: number;
  runs: Run[];
}

interface RoundsResult extends RunRecord {
  what: string;
  quick: boolean;
  complete: boolean;
  model: { name: string; fingerprint: string };
  watershedLayer: number;
  blockTokens: number;
  gen: number;
  conversations: Conversation[];
}

const GEN = 16;
const BLOCK_TOKENS = 512; // the services' default --block-tokens
const CHUNK = 512;

if (bench.replot) {
  await writeReport(await bench.results.readJson<RoundsResult>("rounds"), bench.results);
  process.exit(0);
}

const args = bench.values;
const watershed = Number(args.watershed);
const topKs = args["top-k"]!.split(",").map(Number);
const roundCounts = bench.quick ? [4] : args.rounds!.split(",").map(Number);
const seeds = bench.quick ? 1 : Number(args.seeds);

const modelPath = await resolveModel();
const model = await loadModel(modelPath);
const tok = GgufTokenizer.fromGguf(modelPath);
const template = ChatTemplate.fromGguf(modelPath, tok);
const engine = new Engine(model, { threads: 2, maxContext: 8192 });
const { nLayer, nHeadKv, headDim } = model.config;

/** Bytes of the chunks a decode reads: every one without a pick, else those round-chunks.ts says it needs. */
function handoffBytes(layout: RoundsLayout, n: number, picked: number[] | null): number {
  const groups = [
    Array.from({ length: watershed + 1 }, (_, l) => l),
    Array.from({ length: nLayer - watershed - 1 }, (_, i) => watershed + 1 + i),
  ];
  let bytes = 0;
  for (const block of roundBlocks(n, BLOCK_TOKENS, layout))
    for (const layerIds of groups)
      if (!picked || chunkNeeded(layout, n, layerIds, block, picked))
        bytes += chunkByteLength({
          fingerprint: model.fingerprint,
          dtype: "f16",
          layerIds,
          hkv: nHeadKv,
          headDim,
          tokenStart: block.tokenStart,
          tokenCount: block.tokenEnd - block.tokenStart,
        });
  return bytes;
}

async function greedy(seq: NativeSequence, first: number): Promise<number[]> {
  const out = [first];
  while (out.length < GEN) out.push(argmax((await engine.decode([seq], [out.at(-1)!]))[0]!));
  return out;
}

function text(ids: number[]): string {
  const eog = ids.findIndex((id) => tok.isEog(id));
  return tok.decode(eog < 0 ? ids : ids.slice(0, eog));
}

const result: RoundsResult = {
  what: "Round Attention on multi-round recall: score, whether the pick holds the fact's round, agreement with full, and KV bytes read over the handoff",
  ...bench.record(["native", "services/handoff"]),
  quick: bench.quick,
  complete: false,
  model: { name: model.config.name, fingerprint: model.fingerprint },
  watershedLayer: watershed,
  blockTokens: BLOCK_TOKENS,
  gen: GEN,
  conversations: [],
};

const grid: Array<{ rounds: number; factRound: number; seed: number }> = [];
for (const rounds of roundCounts)
  for (const factRound of bench.quick ? [1] : [0, Math.floor(rounds / 2), rounds - 1])
    for (let s = 0; s < seeds; s++) grid.push({ rounds, factRound, seed: 1000 * rounds + 10 * factRound + s });

const t0 = performance.now();
for (const [i, g] of grid.entries()) {
  const task = multiRoundTask({ rounds: g.rounds, factRound: g.factRound, seed: g.seed, paragraphsPerReply: 3 });
  const enc = encodeChat(tok, template, task.messages, { rounds: true });
  if (!enc.roundStarts) throw new Error("the chat template does not give round starts");
  const ids = [...enc.ids, ...tok.encode(task.answerPrefix)];
  const starts = enc.roundStarts;
  const n = ids.length;
  // The exchanges are the earlier rounds just before the current one (a system part may come first).
  const factIndex = starts.length - 1 - g.rounds + g.factRound;
  const layout: RoundsLayout = { watershedLayer: watershed, starts };
  const rounds = (topK: number): AttentionPolicy => ({ kind: "rounds", rounds: { watershedLayer: watershed, starts, topK } });

  // The prefill: full attention, with the watershed layer's last queries remembered.
  const seq = engine.createSequence(n + GEN);
  seq.setPolicy(rounds(1));
  const tp = performance.now();
  let logits: Float32Array = new Float32Array(0);
  for (let at = 0; at < n; at += CHUNK) logits = await engine.prefill(seq, ids.slice(at, at + CHUNK));
  const prefillMs = performance.now() - tp;
  const state = seq.exportPromptState();
  const first = argmax(logits);
  const whole = handoffBytes(layout, n, null);

  const runs: Run[] = [];
  seq.truncate(n);
  seq.setPolicy({ kind: "full" });
  const full = await greedy(seq, first);
  const fullText = text(full);
  runs.push({
    policy: "full",
    topK: null,
    score: scorePasskey(fullText, task.answer),
    agreement: 1,
    hit: null,
    picked: null,
    bytes: whole,
    promptBytes: whole,
    output: fullText.slice(0, 120),
  });
  for (const topK of topKs) {
    seq.truncate(n);
    seq.setPolicy(rounds(topK));
    if (state) seq.importPromptState(state);
    const picked = await engine.pickRounds(seq); // what the prefill names in the handle
    seq.setRoundPick(picked);
    const out = await greedy(seq, first);
    const outText = text(out);
    runs.push({
      policy: `rounds k=${topK === 0 ? "adaptive" : topK}`,
      topK,
      score: scorePasskey(outText, task.answer),
      agreement: tokenAgreement(full, out),
      hit: picked.includes(factIndex),
      picked,
      bytes: handoffBytes(layout, n, picked),
      promptBytes: whole,
      output: outText.slice(0, 120),
    });
  }
  seq.release();
  const label = `${g.rounds} rounds, fact in ${g.factRound}, seed ${g.seed}`;
  result.conversations.push({
    label,
    rounds: g.rounds,
    factRound: g.factRound,
    promptTokens: n,
    roundStarts: starts,
    answer: task.answer,
    prefillMs,
    runs,
  });
  result.complete = i === grid.length - 1;
  console.error(
    `[rounds ${((performance.now() - t0) / 1000).toFixed(0)}s] ${i + 1}/${grid.length} ${label}: ${n} tokens; ` +
      runs
        .map(
          (r) =>
            `${r.policy} ${r.score}${r.hit === null ? "" : r.hit ? " hit" : " miss"} [${r.picked ?? ""}] ${(r.bytes / r.promptBytes).toFixed(2)}`,
        )
        .join(", "),
  );
  await bench.results.json("rounds", result);
  await writeReport(result, bench.results);
}

/** table.md (per policy and conversation length) and rounds.svg (score and bytes read per policy). */
async function writeReport(r: RoundsResult, results: Results): Promise<void> {
  const policies = [...new Set(r.conversations.flatMap((c) => c.runs.map((x) => x.policy)))];
  const lengths = [...new Set(r.conversations.map((c) => c.rounds))];
  const lines = [
    `# Round Attention on multi-round recall (${r.model.name}, watershed layer ${r.watershedLayer})`,
    "",
    `\`${r.command}\`, ${r.date}${r.complete ? "" : " (partial)"}. ${r.conversations.length} conversations; ${r.gen} greedy tokens per policy; chunks of ${r.blockTokens} tokens cut at round starts.`,
    "",
    "| earlier rounds | policy | score | pick holds the fact | agreement with full | KV read over the handoff | of the prompt's |",
    "|---|---|---|---|---|---|---|",
  ];
  for (const rounds of lengths)
    for (const p of policies) {
      const runs = r.conversations.filter((c) => c.rounds === rounds).flatMap((c) => c.runs.filter((x) => x.policy === p));
      const hits = runs.filter((x) => x.hit !== null);
      const tokens = mean(r.conversations.filter((c) => c.rounds === rounds).map((c) => c.promptTokens));
      lines.push(
        `| ${rounds} (~${Math.round(tokens)} tokens) | ${p} | ${mean(runs.map((x) => x.score)).toFixed(2)} | ` +
          `${hits.length ? `${hits.filter((x) => x.hit).length}/${hits.length}` : "-"} | ${(mean(runs.map((x) => x.agreement)) * 100).toFixed(0)}% | ` +
          `${(mean(runs.map((x) => x.bytes)) / 2 ** 20).toFixed(1)} MiB | ${(mean(runs.map((x) => x.bytes / x.promptBytes)) * 100).toFixed(0)}% |`,
      );
    }
  await results.markdown("table", `${lines.join("\n")}\n`);
  const colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"];
  const series = (value: (runs: Run[]) => number) =>
    policies.map((p, i) => ({
      name: p,
      color: colours[i % colours.length]!,
      labels: true,
      points: lengths.map(
        (rounds) =>
          [rounds, value(r.conversations.filter((c) => c.rounds === rounds).flatMap((c) => c.runs.filter((x) => x.policy === p)))] as [
            number,
            number,
          ],
      ),
    }));
  await results.chart(
    "rounds",
    renderChart(
      [
        {
          title: "Recall score",
          xLabel: "earlier rounds",
          yLabel: "share answered",
          series: series((runs) => mean(runs.map((x) => x.score))),
        },
        {
          title: "KV read over the handoff",
          xLabel: "earlier rounds",
          yLabel: "share of the prompt's KV",
          series: series((runs) => mean(runs.map((x) => x.bytes / x.promptBytes))),
        },
      ],
      {
        title: `Round Attention vs full attention, multi-round recall (${r.model.name}, watershed ${r.watershedLayer})`,
        subtitle: r.command,
      },
    ),
  );
}
