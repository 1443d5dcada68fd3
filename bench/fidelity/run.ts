// Fidelity of the sparse decode policies against full attention on the evaluation tasks of docs/algorithms.md: passkey,
// 2StageRetr and LongGenBench-style long generation. Each prompt is prefilled once (full
// attention, 1 thread); then for each policy the cache is rolled back to the prompt and the policy
// decodes N greedy tokens free-running (task score, token agreement, first divergence), and, if
// it diverged from full, once more teacher-forced with full's tokens (KL(full || policy) at every
// step; before the first divergence the free run is already teacher-forced, so it is reused).
// Results are written after every prompt, so an interrupted run leaves its partial JSON behind.
//
//   npm run bench:fidelity [-- --quick] [--tasks passkey,multikey,2stage,longgen] [--out DIR] [--replot]
//     [--policies "scope 256+256,omnikv k=1024+scope 256+256"] [--longgen-tokens 2048] [--longgen-questions 60]
//     [--model gemma-3-270m --lengths 8192,16384,30720 --filter-layers 5 --guard off --threads 2]
// A model without a chat template (a base model) reads the task's text as it is, the answer
// prefix after a blank line.
import { createHash } from "node:crypto";
import { readFileSync, statSync } from "node:fs";
import { fileURLToPath } from "node:url";

import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import type { NativeSequence } from "../../shared/inference/engine/native.ts";
import { argmax } from "../../shared/inference/engine/sampler.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { policyDefaultsFor } from "../../shared/inference/policy/defaults.ts";
import { ChatTemplate } from "../../shared/inference/tokenizer/chat-template.ts";
import { readGgufMetadata } from "../../shared/inference/engine/native.ts";
import { GgufTokenizer } from "../../shared/inference/tokenizer/tokenizer.ts";
import { benchCli } from "../../tools/lib/bench-runner.ts";
import { firstDivergence, klDivergence, logSoftmax, mean, tokenAgreement } from "./metrics.ts";
import { fidelityPolicies } from "./policies.ts";
import { writeReport, type FidelityResult, type PolicyRun, type PromptResult } from "./report.ts";
import {
  firstColour,
  longGenTask,
  multikeyTask,
  passkeyTask,
  scoreLongGen,
  scorePasskey,
  scoreTwoStage,
  twoStageTask,
  type Measure,
  type TaskPrompt,
} from "./tasks.ts";

const bench = benchCli({
  name: "fidelity",
  script: "npm run bench:fidelity --",
  options: {
    tasks: { type: "string", default: "passkey,2stage,longgen" },
    policies: { type: "string" },
    "longgen-tokens": { type: "string" },
    "longgen-questions": { type: "string" },
    model: { type: "string" },
    lengths: { type: "string" },
    depths: { type: "string" },
    needles: { type: "string", default: "3" },
    gen: { type: "string" },
    budgets: { type: "string" },
    "filter-layers": { type: "string" },
    guard: { type: "string" },
    threads: { type: "string", default: "1" },
  },
  help: `  --tasks LIST             passkey,multikey,2stage,longgen (default passkey,2stage,longgen)
  --policies LIST          only these policy ids ("full" always runs first, as the reference)
  --longgen-tokens N       tokens generated on the long-generation prompt (default 1024)
  --longgen-questions N    questions in the long-generation prompt (default 40)
  --model NAME|PATH        the model (default: the default model)
  --lengths LIST           passkey and multikey prompt tokens (default 2048,4096,7680)
  --depths LIST            passkey needle depths, 0..1 (default 0,0.5,1)
  --needles N              multikey: needles per prompt (default 3)
  --gen N                  tokens generated per policy on passkey and multikey prompts
                           (default 48, 128 from 7K tokens)
  --budgets LIST           the sparse policies' budgets (default 256,1024)
  --filter-layers LIST     OmniKV's filter layers (default: the model's calibrated ones)
  --guard on|off           OmniKV's guard layer (default on)
  --threads N              engine threads (default 1)`,
  quick: "3 small prompts",
  replot: true,
});
if (bench.replot) {
  await writeReport(await bench.results.readJson<FidelityResult>("fidelity"), bench.results);
  process.exit(0);
}
const args = bench.values;
const QUICK = bench.quick;
const TASKS = new Set(args.tasks!.split(","));
const list = (v: string | undefined) => v?.split(",").map(Number);

interface GridItem {
  label: string;
  build: (measure: Measure) => TaskPrompt & { questions?: Array<{ answer: number }> };
  /** Tokens generated per policy. */
  gen: number;
  /** The prompt's size target, where the task is sized to one. */
  targetTokens?: number;
}

function grid(): GridItem[] {
  const items: GridItem[] = [];
  const passLens = list(args.lengths) ?? (QUICK ? [1024] : [2048, 4096, 7680]);
  const depths = list(args.depths) ?? (QUICK ? [0.5] : [0, 0.5, 1]);
  const genAt = (len: number) => (args.gen ? Number(args.gen) : QUICK ? 24 : len >= 7000 ? 128 : 48);
  let seed = 1;
  if (TASKS.has("passkey"))
    for (const len of passLens)
      for (const depth of depths) {
        const s = seed++;
        items.push({
          label: `passkey ${len} d=${depth * 100}%`,
          targetTokens: len,
          build: (measure) => passkeyTask({ targetTokens: len, depth, seed: s, measure }),
          gen: genAt(len),
        });
      }
  if (TASKS.has("multikey"))
    for (const len of passLens) {
      const s = 500 + seed++;
      const needles = Number(args.needles);
      items.push({
        label: `multikey ${len} x${needles}`,
        targetTokens: len,
        build: (measure) => multikeyTask({ targetTokens: len, needles, seed: s, measure }),
        gen: genAt(len),
      });
    }
  const twoLens = QUICK ? [512] : [1024, 4096];
  const samples = QUICK ? 1 : 2;
  if (TASKS.has("2stage"))
    for (const len of twoLens)
      for (let i = 0; i < samples; i++) {
        const s = 100 + seed++;
        items.push({
          label: `2stage ${len} #${i + 1}`,
          targetTokens: len,
          build: (measure) => twoStageTaskSized(len, s, measure),
          gen: QUICK ? 24 : 32,
        });
      }
  if (TASKS.has("longgen")) {
    const s = 1000 + seed++;
    const K = args["longgen-questions"] ? Number(args["longgen-questions"]) : QUICK ? 4 : 40;
    const gen = args["longgen-tokens"] ? Number(args["longgen-tokens"]) : QUICK ? 96 : 1024;
    items.push({ label: `longgen K=${K}`, build: (measure) => longGenTask({ questions: K, seed: s, measure }), gen });
  }
  return items;
}

const twoStageTaskSized = (len: number, seed: number, measure: Measure) => twoStageTask({ targetTokens: len, seed, measure });

const CHUNK = 512;

/** Which native build ran (the working tree's native/ may be mid-edit by others). */
function addonInfo(): { sha256: string; mtime: string } {
  const path = fileURLToPath(new URL("../../native/build/Release/ctxbank_native.node", import.meta.url));
  return { sha256: createHash("sha256").update(readFileSync(path)).digest("hex"), mtime: statSync(path).mtime.toISOString() };
}
const t00 = performance.now();
const elapsed = () => `${((performance.now() - t00) / 1000).toFixed(0)}s`;
const log = (msg: string) => console.error(`[fidelity ${elapsed()}] ${msg}`);

const modelPath = await resolveModel(args.model ? { path: args.model } : {});
const model = await loadModel(modelPath);
const tok = GgufTokenizer.fromGguf(modelPath);
const template = ChatTemplate.fromMetadataIfAny(readGgufMetadata(modelPath), tok);
const filterLayers = list(args["filter-layers"]) ?? policyDefaultsFor(model.fingerprint)?.filterLayers ?? [3, 17, 23];
if (args.guard !== undefined && args.guard !== "on" && args.guard !== "off") throw new Error("--guard: on or off");
const guard = args.guard === undefined ? undefined : args.guard === "on";
const only = args.policies?.split(",").map((x) => x.trim());
const policies = fidelityPolicies(filterLayers, list(args.budgets), guard).filter((p) => !only || p.id === "full" || only.includes(p.id));
if (only && policies.length !== new Set([...only, "full"]).size) throw new Error(`--policies: unknown id in ${args.policies}`);
const items = grid();
const longest = Math.max(...items.map((i) => (i.targetTokens ?? 0) + i.gen));
const threads = Number(args.threads);
const engine = new Engine(model, { threads, maxContext: Math.max(8192, longest + 256) });
const { nLayer, nHeadKv } = model.config;

function promptTokens(user: string, answerPrefix: string): number[] {
  const text = template ? template.render([{ role: "user", content: user }]) + answerPrefix : `${user}\n\n${answerPrefix}`;
  const bos = tok.special.bos;
  const add = tok.addBos && bos !== undefined && !text.startsWith(tok.tokenText(bos));
  return [...(add ? [bos!] : []), ...tok.encode(text, { parseSpecial: true })];
}

/** Gap between the best and second-best logit (how close greedy is to a tie). */
function top2Gap(logits: ArrayLike<number>): number {
  let a = -Infinity,
    b = -Infinity;
  for (let i = 0; i < logits.length; i++) {
    const v = logits[i]!;
    if (v > a) {
      b = a;
      a = v;
    } else if (v > b) b = v;
  }
  return a - b;
}

/** Output text up to (not including) the first end-of-generation token. */
function outputText(ids: number[]): { text: string; eogAt: number | null } {
  const eogAt = ids.findIndex((id) => tok.isEog(id));
  const kept = eogAt < 0 ? ids : ids.slice(0, eogAt);
  return { text: new TextDecoder().decode(tok.decodeBytes(kept)), eogAt: eogAt < 0 ? null : eogAt };
}

interface Decoded {
  tokens: number[];
  /** log-softmax per generated position 1..N-1 (position 0 comes from the prefill, same for all). */
  logps?: Float32Array[];
  /** top-1/top-2 logit gap per position 1..N-1 (full only). */
  gaps?: number[];
  /** KL(full || this) per position 1..d computed on the fly (teacher-forced prefix). */
  klPrefix: number[];
  tfTop1Prefix: number[];
}

/** N greedy tokens from the prompt's end; keeps log-probs (full) or compares them on the fly. */
async function freeRun(seq: NativeSequence, first: number, n: number, ref?: { tokens: number[]; logps: Float32Array[] }): Promise<Decoded> {
  const tokens = [first];
  const logps: Float32Array[] = [];
  const gaps: number[] = [];
  const klPrefix: number[] = [];
  const tfTop1Prefix: number[] = [];
  let diverged = false;
  for (let i = 1; i < n; i++) {
    const logits = (await engine.decode([seq], [tokens[i - 1]!]))[0]!;
    const next = argmax(logits);
    if (!ref) {
      logps.push(logSoftmax(logits));
      gaps.push(top2Gap(logits));
    } else if (!diverged) {
      // Inputs so far equal full's tokens: this step is a teacher-forced step too.
      klPrefix.push(klDivergence(ref.logps[i - 1]!, logSoftmax(logits)));
      tfTop1Prefix.push(next === ref.tokens[i] ? 1 : 0);
    }
    tokens.push(next);
    if (ref && next !== ref.tokens[i]) diverged = true;
  }
  return ref ? { tokens, klPrefix, tfTop1Prefix } : { tokens, logps, gaps, klPrefix, tfTop1Prefix };
}

/** Teacher-forced: feed full's tokens, KL(full || policy) and top-1 match at every position. */
async function teacherForced(
  seq: NativeSequence,
  ref: { tokens: number[]; logps: Float32Array[] },
): Promise<{ kl: number[]; top1: number[] }> {
  const kl: number[] = [];
  const top1: number[] = [];
  for (let i = 1; i < ref.tokens.length; i++) {
    const logits = (await engine.decode([seq], [ref.tokens[i - 1]!]))[0]!;
    kl.push(klDivergence(ref.logps[i - 1]!, logSoftmax(logits)));
    top1.push(argmax(logits) === ref.tokens[i] ? 1 : 0);
  }
  return { kl, top1 };
}

function score(
  p: TaskPrompt & { questions?: Array<{ answer: number }> },
  text: string,
): { score: number; extra?: Record<string, unknown> } {
  if (p.task === "passkey" || p.task === "multikey") return { score: scorePasskey(text, p.answer) };
  if (p.task === "2stage") return { score: scoreTwoStage(text, p.answer), extra: { firstColour: firstColour(text) ?? null } };
  const r = scoreLongGen(
    text,
    p.questions!.map((q) => q.answer),
  );
  return { score: r.score, extra: { answered: r.answered } };
}

const result: FidelityResult = {
  what: "fidelity of sparse decode policies vs full attention: task score, greedy agreement and first divergence (free-running), mean KL(full||policy) per step (teacher-forced with full's tokens)",
  ...bench.record(),
  quick: QUICK,
  complete: false,
  model: { name: model.config.name, fingerprint: model.fingerprint, nLayer, nHeadKv },
  filterLayers,
  policies: policies.map(({ id, family, budget, policy }) => ({ id, family, budget, policy })),
  engine: { threads, kernels: engine.native.info.kernels, addon: addonInfo() },
  omnikvGuard: guard ?? "default",
  plannedPrompts: items.map((i) => i.label),
  prompts: [],
};

log(
  `${items.length} prompts x ${policies.length} policies; filter layers ${filterLayers.join(",")}; writing ${bench.results}/fidelity.json`,
);
for (const [idx, item] of items.entries()) {
  const prompt = item.build((user) => promptTokens(user, "").length);
  const ids = promptTokens(prompt.user, prompt.answerPrefix);
  const seq = engine.createSequence(ids.length + item.gen + 1);
  const tp = performance.now();
  let logits: Float32Array = new Float32Array(0);
  for (let i = 0; i < ids.length; i += CHUNK) logits = await engine.prefill(seq, ids.slice(i, i + CHUNK));
  const prefillMs = performance.now() - tp;
  const first = argmax(logits);
  log(
    `[${idx + 1}/${items.length}] ${item.label}: ${ids.length} prompt tokens, prefill ${(prefillMs / 1000).toFixed(1)}s, ${item.gen} tokens per policy`,
  );

  let ref: { tokens: number[]; logps: Float32Array[]; gaps: number[]; eogAt: number | null } | undefined;
  const runs: PolicyRun[] = [];
  for (const p of policies) {
    const t0 = performance.now();
    seq.truncate(ids.length);
    seq.setPolicy(p.policy);
    const free = await freeRun(seq, first, item.gen, ref);
    const stats = seq.policyStats;
    const decodeMs = performance.now() - t0;
    const { text, eogAt } = outputText(free.tokens);
    const sc = score(prompt, text);
    let run: PolicyRun;
    if (!ref) {
      ref = { tokens: free.tokens, logps: free.logps!, gaps: [top2Gap(logits), ...free.gaps!], eogAt };
      run = {
        policy: p.id,
        family: p.family,
        budget: p.budget,
        score: sc.score,
        agreement: 1,
        firstDivergence: null,
        meanKl: 0,
        maxKl: 0,
        tfTop1: 1,
      };
    } else {
      const div = firstDivergence(ref.tokens, free.tokens);
      let kl = free.klPrefix;
      let top1 = free.tfTop1Prefix;
      if (div !== null) {
        seq.truncate(ids.length);
        seq.setPolicy(p.policy);
        const tf = await teacherForced(seq, ref);
        kl = tf.kl;
        top1 = tf.top1;
      }
      run = {
        policy: p.id,
        family: p.family,
        budget: p.budget,
        score: sc.score,
        agreement: tokenAgreement(ref.tokens, free.tokens),
        firstDivergence: div,
        meanKl: mean(kl),
        maxKl: kl.length ? Math.max(...kl) : 0,
        tfTop1: mean(top1),
      };
      if (div !== null) run.fullGapAtDivergence = ref.gaps[div]!;
    }
    // The answer span: full's tokens up to and including its first end-of-generation token.
    const span = Math.min(item.gen, (ref.eogAt ?? item.gen - 1) + 1);
    run.answerSpan = span;
    run.answerAgreement = tokenAgreement(ref.tokens.slice(0, span), free.tokens.slice(0, span));
    run.answerIdentical = run.firstDivergence === null || run.firstDivergence >= span;
    run.tokens = free.tokens;
    const generated = stats.decodeTokens;
    run.decodeKv = {
      decodePoolTokens: stats.decodePoolTokens,
      fullDecodeTokens: generated * nLayer * nHeadKv,
      share:
        generated > 0 && (p.family === "scope" || p.family === "omnikv+scope")
          ? stats.decodePoolTokens / (generated * nLayer * nHeadKv)
          : null,
      decodeTokens: generated,
    };
    // The free run's decode steps (its first token came from the prefill's logits).
    run.kvBytesReadPerToken = item.gen > 1 ? stats.decodeKvBytesRead / (item.gen - 1) : null;
    run.eogAt = eogAt;
    run.output = text.slice(0, 400);
    if (sc.extra) run.extra = sc.extra;
    run.ms = performance.now() - t0;
    runs.push(run);
    log(
      `  ${p.id.padEnd(30)} score ${run.score.toFixed(2)} agree ${(run.agreement * 100).toFixed(1)}% div ${run.firstDivergence ?? "-"} ` +
        `KL ${run.meanKl.toFixed(4)} (${(decodeMs / 1000).toFixed(1)}s free, ${((run.ms - decodeMs) / 1000).toFixed(1)}s tf) ${JSON.stringify(text.slice(0, 60))}`,
    );
  }
  seq.release();
  const row: PromptResult = {
    label: item.label,
    task: prompt.task,
    targetTokens: prompt.tokens,
    promptTokens: ids.length,
    gen: item.gen,
    answer: prompt.task === "longgen" ? prompt.answer.slice(0, 200) : prompt.answer,
    meta: prompt.meta,
    prefillMs,
    runs,
  };
  result.prompts.push(row);
  result.complete = idx === items.length - 1;
  await bench.results.json("fidelity", result);
  await writeReport(result, bench.results);
}
log(`done: ${bench.results}`);
