/**
 * The vocabulary as a GGUF stores it (`tokenizer.ggml.*`): read and validated, with the errors a
 * model we cannot tokenize raises.
 */
import { CtxbankError } from "../errors.ts";
import { preTokenizerFamily, SUPPORTED_PRE_TOKENIZERS } from "./pre-tokenize.ts";

export type GgufMetadata = Readonly<Record<string, unknown>>;

export const TOKENIZER_ERROR_CODES = [
  "tokenizer_unsupported_model", // the GGUF's tokenizer model is not one this tokenizer implements
  "tokenizer_unsupported_pre", // nor its pre-tokenizer
  "tokenizer_bad_metadata", // the GGUF's tokenizer metadata is missing or inconsistent
  "invalid_token_id", // a token id outside the vocabulary
] as const;
export type TokenizerErrorCode = (typeof TOKENIZER_ERROR_CODES)[number];

export class TokenizerError extends CtxbankError<TokenizerErrorCode> {
  static override readonly codes = TOKENIZER_ERROR_CODES;
  override readonly name = "TokenizerError";
}

/** GGUF `tokenizer.ggml.token_type` values (llama.cpp `llama_token_type`). */
export const TokenType = {
  UNDEFINED: 0,
  NORMAL: 1,
  UNKNOWN: 2,
  CONTROL: 3,
  USER_DEFINED: 4,
  UNUSED: 5,
  BYTE: 6,
} as const;

export interface Vocab {
  model: string;
  pre: string;
  digitsFirst: boolean;
  cleanSpaces: boolean;
  tokens: string[];
  merges: string[];
  /** one TokenType per token (NORMAL when the file has no token_type array) */
  types: Uint8Array;
}

const OTHER_TOKENIZER_KINDS: Record<string, string> = {
  llama: "SentencePiece (SPM)",
  bert: "WordPiece",
  t5: "Unigram (T5)",
  rwkv: "RWKV",
  plamo2: "PLaMo-2",
  no_vocab: "no vocabulary",
};

/** Read the vocabulary; throws TokenizerError unless it is a supported GPT-2 byte-level BPE. */
export function readVocab(meta: GgufMetadata): Vocab {
  const model = meta["tokenizer.ggml.model"];
  if (typeof model !== "string") {
    throw new TokenizerError("tokenizer_bad_metadata", "the GGUF has no tokenizer (missing tokenizer.ggml.model)");
  }
  if (model !== "gpt2") {
    const kind = OTHER_TOKENIZER_KINDS[model];
    throw new TokenizerError(
      "tokenizer_unsupported_model",
      `unsupported tokenizer model "${model}"${kind ? ` (${kind})` : ""}: ctxbank supports GPT-2 style ` +
        `byte-level BPE (tokenizer.ggml.model = "gpt2") only`,
    );
  }
  const pre = meta["tokenizer.ggml.pre"];
  if (typeof pre !== "string" || pre === "") {
    throw new TokenizerError(
      "tokenizer_unsupported_pre",
      `the GGUF has no tokenizer.ggml.pre (pre-tokenizer type); llama.cpp would fall back to a degraded default — ` +
        `re-convert the model with a current convert_hf_to_gguf.py`,
    );
  }
  const fam = preTokenizerFamily(pre);
  if (fam === undefined) {
    throw new TokenizerError(
      "tokenizer_unsupported_pre",
      `unsupported pre-tokenizer "${pre}" (tokenizer.ggml.pre); supported: ${SUPPORTED_PRE_TOKENIZERS.join(", ")}`,
    );
  }

  const tokens = meta["tokenizer.ggml.tokens"];
  if (!Array.isArray(tokens) || tokens.length === 0 || !tokens.every((t) => typeof t === "string")) {
    throw new TokenizerError("tokenizer_bad_metadata", "tokenizer.ggml.tokens is missing or not an array of strings");
  }
  const merges = meta["tokenizer.ggml.merges"];
  if (!Array.isArray(merges) || !merges.every((m) => typeof m === "string")) {
    throw new TokenizerError("tokenizer_bad_metadata", "tokenizer.ggml.merges is missing or not an array of strings (required for BPE)");
  }
  const rawTypes = meta["tokenizer.ggml.token_type"];
  const types = new Uint8Array(tokens.length).fill(TokenType.NORMAL);
  if (rawTypes !== undefined) {
    if (!Array.isArray(rawTypes) || rawTypes.length !== tokens.length) {
      throw new TokenizerError(
        "tokenizer_bad_metadata",
        `tokenizer.ggml.token_type has ${Array.isArray(rawTypes) ? rawTypes.length : "no"} entries, expected ${tokens.length}`,
      );
    }
    for (let i = 0; i < rawTypes.length; i++) types[i] = Number(rawTypes[i]);
  }
  return { model, pre, ...fam, tokens: tokens as string[], merges: merges as string[], types };
}
