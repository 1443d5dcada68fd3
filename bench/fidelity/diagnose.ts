// Diagnostic sweep for one passkey prompt: teacher-forced KL(full || policy) and top-1 match of
// OmniKV across budgets, selectors and the guard option, next to the baselines at the same budget.
// Answers "is OmniKV's selection doing its job on this model" without the noise of free-running.
//
//   npx tsx bench/fidelity/diagnose.ts [--len 7680] [--depth 0] [--gen 32] [--seed 7] [--out DIR]
// writes results/fidelity/diagnose-<len>-d<depth>-filters-<layers>.json (the earlier files without
// the filters suffix were made with the defaults of that time, 3, 17, 23)

import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import type { AttentionPolicy } from "../../shared/inference/engine/native.ts";
import { argmax } from "../../shared/inference/engine/sampler.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { policyDefaultsFor } from "../../shared/inference/policy/defaults.ts";
import { ChatTemplate } from "../../shared/inference/tokenizer/chat-template.ts";
import { GgufTokenizer } from "../../shared/inference/tokenizer/tokenizer.ts";
import { benchCli } from "../../tools/lib/bench-runner.ts";
import { klDivergence, logSoftmax, mean } from "./metrics.ts";
import { passkeyTask } from "./tasks.ts";

const bench = benchCli({
  name: "fidelity",
  script: "npx tsx bench/fidelity/diagnose.ts",
  options: {
    len: { type: "string", default: "7680" },
    depth: { type: "string", default: "0" },
    gen: { type: "string", default: "32" },
    seed: { type: "string", default: "7" },
  },
  help: `  --len N          passkey prompt tokens (default 7680)
  --depth F        needle depth, 0 to 1 (default 0)
  --gen N          teacher-forced tokens (default 32)
  --seed N         passkey seed (default 7)`,
});
const args = bench.values;
const LEN = Number(args.len),
  DEPTH = Number(args.depth),
  GEN = Number(args.gen);

const modelPath = await resolveModel();
const model = await loadModel(modelPath);
const tok = GgufTokenizer.fromGguf(modelPath);
const template = ChatTemplate.fromGguf(modelPath, tok);
const filterLayers = policyDefaultsFor(model.fingerprint)?.filterLayers ?? [3, 17, 23];
const engine = new Engine(model, { threads: 1, maxContext: 8192 });
const encode = (text: string) => tok.encode(text, { parseSpecial: true });
const render = (user: string) => template.render([{ role: "user", content: user }]);
const task = passkeyTask({ targetTokens: LEN, depth: DEPTH, seed: Number(args.seed), measure: (u) => encode(render(u)).length });
const ids = encode(render(task.user) + task.answerPrefix);

const seq = engine.createSequence(ids.length + GEN + 1);
let logits: Float32Array = new Float32Array(0);
for (let i = 0; i < ids.length; i += 512) logits = await engine.prefill(seq, ids.slice(i, i + 512));
const first = argmax(logits);
console.error(`prompt ${ids.length} tokens`);

const ref: number[] = [first];
const refLogp: Float32Array[] = [];
seq.setPolicy({ kind: "full" });
for (let i = 1; i < GEN; i++) {
  const l = (await engine.decode([seq], [ref[i - 1]!]))[0]!;
  refLogp.push(logSoftmax(l));
  ref.push(argmax(l));
}

const omni = (
  budget: number,
  extra: Partial<{ selector: "last" | "last_softmax" | "uniform" | "exp"; window: number; guard: boolean }> = {},
): AttentionPolicy => ({
  kind: "omnikv",
  omnikv: { filterLayers, budget, ...extra },
});
const configs: Array<[string, AttentionPolicy]> = [
  ...[128, 256, 512, 1024, 2048, 4096, 8192].map((k) => [`omnikv k=${k}`, omni(k)] as [string, AttentionPolicy]),
  ["omnikv k=256 last_softmax", omni(256, { selector: "last_softmax" })],
  ["omnikv k=1024 last_softmax", omni(1024, { selector: "last_softmax" })],
  ["omnikv k=256 guard off", omni(256, { guard: false })],
  ["omnikv k=256 filter layers 2,8,18", { kind: "omnikv", omnikv: { filterLayers: [2, 8, 18], budget: 256 } }],
  ["omnikv k=1024 filter layers 2,8,18", { kind: "omnikv", omnikv: { filterLayers: [2, 8, 18], budget: 1024 } }],
  // Window selectors need the prompt's own queries, which only a prefill under the policy keeps:
  // these configs prefill again (the others reuse the full-attention prefill).
  ["omnikv k=256 uniform w=16", omni(256, { selector: "uniform", window: 16 })],
  ["omnikv k=256 exp w=16", omni(256, { selector: "exp", window: 16 })],
  ["omnikv k=1024 uniform w=16", omni(1024, { selector: "uniform", window: 16 })],
  ["omnikv k=1024 exp w=16", omni(1024, { selector: "exp", window: 16 })],
  ["streaming k=256", { kind: "streaming", streaming: { sinks: 4, window: 252 } }],
  ["h2o k=256", { kind: "h2o", h2o: { budget: 256, recent: 64 } }],
  ["streaming k=1024", { kind: "streaming", streaming: { sinks: 4, window: 1020 } }],
  ["h2o k=1024", { kind: "h2o", h2o: { budget: 1024, recent: 256 } }],
];
const rows: Array<{ config: string; meanKl: number; firstStepKl: number; tfTop1: number }> = [];
const windowed = (p: AttentionPolicy) => p.kind === "omnikv" && (p.omnikv.selector === "uniform" || p.omnikv.selector === "exp");
for (const [name, policy] of configs) {
  seq.truncate(ids.length);
  seq.setPolicy(policy);
  if (windowed(policy)) {
    seq.truncate(0);
    for (let i = 0; i < ids.length; i += 512) await engine.prefill(seq, ids.slice(i, i + 512));
  }
  const kl: number[] = [];
  let top1 = 0;
  for (let i = 1; i < GEN; i++) {
    const l = (await engine.decode([seq], [ref[i - 1]!]))[0]!;
    kl.push(klDivergence(refLogp[i - 1]!, logSoftmax(l)));
    if (argmax(l) === ref[i]) top1++;
  }
  const row = { config: name, meanKl: mean(kl), firstStepKl: kl[0]!, tfTop1: top1 / (GEN - 1) };
  rows.push(row);
  console.log(
    `${name.padEnd(48)} mean KL ${row.meanKl.toFixed(4)}  first-step KL ${row.firstStepKl.toFixed(4)}  TF top-1 ${(row.tfTop1 * 100).toFixed(1)}%`,
  );
}
seq.release();
await bench.results.json(`diagnose-${LEN}-d${DEPTH}-filters-${filterLayers.join("-")}`, {
  what: "teacher-forced KL(full||policy) per config on one passkey prompt",
  ...bench.record(),
  promptTokens: ids.length,
  depth: DEPTH,
  gen: GEN,
  filterLayers,
  rows,
});
