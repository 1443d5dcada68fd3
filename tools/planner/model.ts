// What the capacity planner needs to know about a model, read from its GGUF without loading the
// weights: shapes from the metadata (the same keys the engine reads), and weight bytes and
// parameter counts from the tensor table.
import { ggufInfo, readGgufMetadata, type GgufTensorInfo } from "../../shared/inference/engine/native.ts";

export interface ModelFacts {
  name: string;
  nLayer: number;
  nHead: number;
  nHeadKv: number;
  headDim: number;
  nEmbd: number;
  nVocab: number;
  /** Bytes of every tensor as stored (quantized): what a decode step reads at batch 1, less the unused embedding rows. */
  weightBytes: number;
  /** Parameters every prompt token multiplies: the transformer blocks' matrices. */
  blockParams: number;
  /** Parameters of the output head (the tied embedding, or output.weight): run once per logits row. */
  outputParams: number;
  /** f16 K and V of one token, all layers: 2 · L · Hkv · d · 2. */
  kvBytesPerToken: number;
}

const numOf = (meta: Record<string, unknown>, key: string): number => {
  const v = meta[key];
  const n = typeof v === "bigint" ? Number(v) : v;
  if (typeof n !== "number" || !Number.isFinite(n)) throw new Error(`GGUF metadata has no number ${key}`);
  return n;
};

/** Pure: facts from the metadata and tensor table (tests give made-up ones). */
export function factsFromGguf(meta: Record<string, unknown>, tensors: readonly GgufTensorInfo[]): ModelFacts {
  const arch = String(meta["general.architecture"] ?? "llama");
  const nLayer = numOf(meta, `${arch}.block_count`);
  const nHead = numOf(meta, `${arch}.attention.head_count`);
  const nHeadKv = meta[`${arch}.attention.head_count_kv`] === undefined ? nHead : numOf(meta, `${arch}.attention.head_count_kv`);
  const nEmbd = numOf(meta, `${arch}.embedding_length`);
  const headDim = meta[`${arch}.attention.key_length`] === undefined ? nEmbd / nHead : numOf(meta, `${arch}.attention.key_length`);
  const elements = (t: GgufTensorInfo) => t.shape.reduce((p, x) => p * x, 1);
  const embd = tensors.find((t) => t.name === "token_embd.weight");
  const out = tensors.find((t) => t.name === "output.weight") ?? embd;
  if (!out) throw new Error("no output.weight or token_embd.weight tensor");
  // Matrices only (norm vectors are 1-D and negligible).
  const blockParams = tensors.filter((t) => t.name.startsWith("blk.") && t.shape.length === 2).reduce((s, t) => s + elements(t), 0);
  return {
    name: String(meta["general.name"] ?? "model"),
    nLayer,
    nHead,
    nHeadKv,
    headDim,
    nEmbd,
    nVocab: out.shape[1] ?? numOf(meta, `${arch}.vocab_size`),
    weightBytes: tensors.reduce((s, t) => s + t.nBytes, 0),
    blockParams,
    outputParams: elements(out),
    kvBytesPerToken: 2 * nLayer * nHeadKv * headDim * 2,
  };
}

export function modelFacts(path: string): ModelFacts {
  return factsFromGguf(readGgufMetadata(path), ggufInfo(path).tensors);
}
