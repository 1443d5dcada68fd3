// Tiny random-weight GGUFs of every architecture the engine runs (llama with Llama 3's rope_freqs,
// qwen2, qwen3, gemma3), with the metadata keys and tensors llama.cpp's converter writes for each
// (llama.cpp: src/models/<arch>.cpp) and a small SentencePiece vocabulary, so that llama.cpp loads
// them too. F32 weights from a fixed-seed generator.
import { f32, str, u32, writeGguf, GgmlType, type GgufTensor, type GgufValue } from "./gguf-writer.ts";
import { TINY_SPM_VOCAB, tinySpmKv } from "./spm-vocab.ts";

export type Arch = "llama" | "qwen2" | "qwen3" | "gemma3";

export interface TinyArchOptions {
  arch: Arch;
  nEmbd?: number;
  nHead?: number;
  nHeadKv?: number;
  /** attention.key_length / value_length; omitted: nEmbd / nHead, no key. */
  headDim?: number;
  nFf?: number;
  nLayer?: number;
  nCtx?: number;
  ropeBase?: number;
  /** llama: a rope_freqs.weight of factors in [1, 8] (Llama 3's per-frequency scaling). */
  ropeFreqs?: boolean;
  /** rope.scaling.type "linear" with this factor. */
  ropeLinearFactor?: number;
  tiedOutput?: boolean;
  /** gemma3: attention.sliding_window. */
  slidingWindow?: number;
  /** gemma3: attention.sliding_window_pattern as a period (every n-th layer global). */
  swaPeriod?: number;
  /** gemma3: rope.freq_base_swa. */
  ropeBaseSwa?: number;
  /** gemma3: final_logit_softcapping. */
  softcap?: number;
  seed?: number;
}

/** The vocabulary size of every tiny architecture model (tinySpmKv's). */
export const TINY_ARCH_VOCAB = TINY_SPM_VOCAB.length;

export function tinyArchModel(o: TinyArchOptions): Buffer {
  const E = o.nEmbd ?? 64,
    H = o.nHead ?? 4,
    HKV = o.nHeadKv ?? 2,
    F = o.nFf ?? 128,
    L = o.nLayer ?? 2;
  const D = o.headDim ?? E / H,
    Q = D * H,
    KV = D * HKV,
    V = TINY_ARCH_VOCAB;
  let seed = o.seed ?? 4242;
  const rand = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32) * 2 - 1; // [-1, 1)
  const f32s = (n: number, scale: number, offset = 0) => {
    const a = new Float32Array(n);
    for (let i = 0; i < n; i++) a[i] = offset + rand() * scale;
    return new Uint8Array(a.buffer);
  };
  const tensors: GgufTensor[] = [];
  const vec = (name: string, n: number, lo: number, hi: number) =>
    tensors.push({ name, dims: [n], type: GgmlType.F32, data: f32s(n, (hi - lo) / 2, (hi + lo) / 2) });
  // Scales chosen so activations stay O(1) through the layers.
  const mat = (name: string, cols: number, rows: number) =>
    tensors.push({ name, dims: [cols, rows], type: GgmlType.F32, data: f32s(cols * rows, 1 / Math.sqrt(cols)) });
  tensors.push({ name: "token_embd.weight", dims: [E, V], type: GgmlType.F32, data: f32s(E * V, 1) });
  if (o.tiedOutput === false) mat("output.weight", E, V);
  vec("output_norm.weight", E, 0.5, 1.5);
  if (o.ropeFreqs) vec("rope_freqs.weight", D / 2, 1, 8);
  for (let l = 0; l < L; l++) {
    const p = `blk.${l}.`;
    vec(`${p}attn_norm.weight`, E, 0.5, 1.5);
    mat(`${p}attn_q.weight`, E, Q);
    mat(`${p}attn_k.weight`, E, KV);
    mat(`${p}attn_v.weight`, E, KV);
    if (o.arch === "qwen2") {
      vec(`${p}attn_q.bias`, Q, -0.5, 0.5);
      vec(`${p}attn_k.bias`, KV, -0.5, 0.5);
      vec(`${p}attn_v.bias`, KV, -0.5, 0.5);
    }
    if (o.arch === "qwen3" || o.arch === "gemma3") {
      vec(`${p}attn_q_norm.weight`, D, 0.5, 1.5);
      vec(`${p}attn_k_norm.weight`, D, 0.5, 1.5);
    }
    mat(`${p}attn_output.weight`, Q, E);
    if (o.arch === "gemma3") vec(`${p}post_attention_norm.weight`, E, 0.5, 1.5);
    vec(`${p}ffn_norm.weight`, E, 0.5, 1.5);
    mat(`${p}ffn_gate.weight`, E, F);
    mat(`${p}ffn_up.weight`, E, F);
    mat(`${p}ffn_down.weight`, F, E);
    if (o.arch === "gemma3") vec(`${p}post_ffw_norm.weight`, E, 0.5, 1.5);
  }
  const a = `${o.arch}.`;
  const kv: Record<string, GgufValue> = {
    "general.architecture": str(o.arch),
    "general.name": str(`tiny ${o.arch}`),
    [`${a}context_length`]: u32(o.nCtx ?? 512),
    [`${a}embedding_length`]: u32(E),
    [`${a}block_count`]: u32(L),
    [`${a}feed_forward_length`]: u32(F),
    [`${a}attention.head_count`]: u32(H),
    [`${a}attention.head_count_kv`]: u32(HKV),
    [`${a}attention.layer_norm_rms_epsilon`]: f32(1e-6),
    [`${a}rope.freq_base`]: f32(o.ropeBase ?? 10000),
    ...(o.headDim !== undefined ? { [`${a}attention.key_length`]: u32(D), [`${a}attention.value_length`]: u32(D) } : {}),
    ...(o.ropeLinearFactor !== undefined
      ? { [`${a}rope.scaling.type`]: str("linear"), [`${a}rope.scaling.factor`]: f32(o.ropeLinearFactor) }
      : {}),
    ...(o.slidingWindow !== undefined ? { [`${a}attention.sliding_window`]: u32(o.slidingWindow) } : {}),
    ...(o.swaPeriod !== undefined ? { [`${a}attention.sliding_window_pattern`]: u32(o.swaPeriod) } : {}),
    ...(o.ropeBaseSwa !== undefined ? { [`${a}rope.freq_base_swa`]: f32(o.ropeBaseSwa) } : {}),
    ...(o.softcap !== undefined ? { [`${a}final_logit_softcapping`]: f32(o.softcap) } : {}),
    ...tinySpmKv(false),
  };
  return writeGguf(kv, tensors);
}
