// A synthetic KV cache for speed-only runs past what a real prompt can cheaply fill: random f16
// values in [-1, 1) (exponent bits kept small so nothing overflows) written straight into the
// first `length` rows of every layer of a sequence's cache, then declared with setLength.
import type { ModelConfig, NativeSequence } from "../../shared/inference/engine/native.ts";

export function fillSyntheticKv(
  seq: NativeSequence,
  config: Pick<ModelConfig, "nLayer" | "nHeadKv" | "headDim">,
  length: number,
  seed = 12345,
): void {
  const kv = new Uint16Array(seq.kvBuffer());
  const rowElems = config.nHeadKv * config.headDim;
  const cap = seq.capacity;
  let x = seed;
  for (let l = 0; l < config.nLayer; l++)
    for (let part = 0; part < 2; part++) {
      const base = (l * 2 + part) * cap * rowElems;
      for (let i = 0; i < length * rowElems; i++) {
        x = (Math.imul(x, 1103515245) + 12345) >>> 0;
        kv[base + i] = 0x3000 | (x >>> 22) | ((x & 1) << 15);
      }
    }
  seq.setLength(length);
}
