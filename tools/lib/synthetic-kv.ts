// A synthetic KV cache for speed-only runs past what a real prompt can cheaply fill: random f16
// values in [-1, 1) (exponent bits kept small so nothing overflows) imported as the rows a
// sequence of `length` tokens holds (every position of the global layers, the last window of a
// sliding-window layer's ring: heldChunks), then declared with setLength. Through importRows, so
// rings and either memory tier take it as they take a handoff.
import { heldChunks, kvShape } from "../../services/handoff/index.ts";
import type { ModelConfig, NativeSequence } from "../../shared/inference/engine/native.ts";

export function fillSyntheticKv(
  seq: NativeSequence,
  config: Pick<ModelConfig, "nLayer" | "nHeadKv" | "headDim" | "slidingLayers" | "slidingWindow">,
  length: number,
  seed = 12345,
): void {
  const rowElems = config.nHeadKv * config.headDim;
  let x = seed;
  for (const ch of heldChunks(kvShape(config), length, 512)) {
    const values = new Uint16Array(ch.tokenCount * ch.layerIds.length * 2 * rowElems);
    for (let i = 0; i < values.length; i++) {
      x = (Math.imul(x, 1103515245) + 12345) >>> 0;
      values[i] = 0x3000 | (x >>> 22) | ((x & 1) << 15);
    }
    seq.importRows(new Uint8Array(values.buffer), ch.layerIds, ch.tokenStart, ch.tokenCount);
  }
  seq.setLength(length);
}
