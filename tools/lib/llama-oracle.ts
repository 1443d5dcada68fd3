// node-llama-cpp as the independent oracle: the same GGUF run by llama.cpp's prebuilt CPU build.
import { getLlama, LlamaLogLevel, type Llama, type LlamaModel } from "node-llama-cpp";

let llama: Promise<Llama> | undefined;

export async function loadOracle(modelPath: string): Promise<LlamaModel> {
  llama ??= getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
  return (await llama).loadModel({ modelPath });
}

export interface OracleContextOptions {
  contextSize: number;
  /** "F32" for exact comparison (the default), "F16" for llama.cpp's serving default. */
  kvType?: "F32" | "F16";
  /** Threads (default 1). */
  threads?: number;
}

export async function oracleContext(model: LlamaModel, opts: OracleContextOptions) {
  const kv = opts.kvType ?? "F32";
  return model.createContext({
    contextSize: opts.contextSize,
    batchSize: 512,
    threads: { ideal: opts.threads ?? 1, min: opts.threads ?? 1 },
    flashAttention: false,
    experimentalKvCacheKeyType: kv,
    experimentalKvCacheValueType: kv,
  });
}

export function logitsArray(map: Map<number, number>, nVocab: number): Float32Array {
  const out = new Float32Array(nVocab).fill(-Infinity);
  for (const [id, v] of map) out[id] = v;
  return out;
}
