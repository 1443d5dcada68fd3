// Per-model defaults for the sparse policies, measured by `npm run calibrate` and keyed by the
// model fingerprint (shared/inference/engine/engine.ts). A model that was never calibrated has none.
import { readFileSync } from "node:fs";

export interface ModelPolicyDefaults {
  model: string;
  /** OmniKV filter layers at the measured capability peaks. */
  filterLayers: number[];
  /** Round Attention's watershed layer L_w; null when the measurement found none. */
  watershedLayer: number | null;
  /** Where the numbers came from. */
  source: string;
}

const FILE = new URL("./model-defaults.json", import.meta.url);

/** The file as it is now (npm run calibrate rewrites it). */
export function loadPolicyDefaults(): Record<string, ModelPolicyDefaults> {
  return JSON.parse(readFileSync(FILE, "utf8")) as Record<string, ModelPolicyDefaults>;
}

let loaded: Record<string, ModelPolicyDefaults> | undefined;

/** A model's calibrated defaults; the file is read once per process (every request's policy resolves against it). */
export function policyDefaultsFor(fingerprint: string): ModelPolicyDefaults | undefined {
  loaded ??= loadPolicyDefaults();
  return loaded[fingerprint];
}

export const policyDefaultsFile = FILE;
