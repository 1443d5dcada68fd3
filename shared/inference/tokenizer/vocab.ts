/**
 * The vocabulary as a GGUF stores it (`tokenizer.ggml.*`): read and validated, with the errors a
 * model we cannot tokenize raises.
 */
import { CtxbankError } from "../errors.ts";
import { preTokenizerFamily, SUPPORTED_PRE_TOKENIZERS, type PreTokenizerSplit } from "./pre-tokenize.ts";

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

interface VocabCommon {
  pre: string;
  /** Token texts; an empty one is named `[EMPTY_<id>]`, as llama.cpp names it. */
  tokens: string[];
  /** One TokenType per token (NORMAL when the file has no token_type array; UNDEFINED for values outside 0..6). */
  types: Uint8Array;
  /** Add BOS / EOS when asked to add special tokens: the tokenizer's default, then the file's flag. */
  addBos: boolean;
  addEos: boolean;
  /** SentencePiece's leading "▁" before text; decoding drops one leading space (llama.cpp `add_space_prefix`). */
  addSpacePrefix: boolean;
  /** llama.cpp's `clean_spaces` decode flag */
  cleanSpaces: boolean;
}

/** GPT-2 style byte-level BPE (`tokenizer.ggml.model` = "gpt2"). */
export interface BpeVocab extends VocabCommon {
  model: "gpt2";
  merges: string[];
  split: PreTokenizerSplit;
  ignoreMerges: boolean;
}

/** SentencePiece (`tokenizer.ggml.model` = "llama"): merges by token score, byte fallback. */
export interface SpmVocab extends VocabCommon {
  model: "llama";
  /** One score per token (0 when the file has none). */
  scores: Float64Array;
}

export type Vocab = BpeVocab | SpmVocab;

const OTHER_TOKENIZER_KINDS: Record<string, string> = {
  bert: "WordPiece",
  t5: "Unigram (T5)",
  rwkv: "RWKV",
  plamo2: "PLaMo-2",
  gemma4: "Gemma 4 BPE",
  no_vocab: "no vocabulary",
};

/** Read and validate the vocabulary; throws TokenizerError unless it is a supported BPE or SentencePiece one. */
export function readVocab(meta: GgufMetadata): Vocab {
  const model = meta["tokenizer.ggml.model"];
  if (typeof model !== "string") {
    throw new TokenizerError("tokenizer_bad_metadata", "the GGUF has no tokenizer (missing tokenizer.ggml.model)");
  }
  if (model !== "gpt2" && model !== "llama") {
    const kind = Object.hasOwn(OTHER_TOKENIZER_KINDS, model) ? OTHER_TOKENIZER_KINDS[model] : undefined;
    throw new TokenizerError(
      "tokenizer_unsupported_model",
      `unsupported tokenizer model "${model}"${kind ? ` (${kind})` : ""}: ctxbank supports GPT-2 style byte-level BPE ` +
        `(tokenizer.ggml.model = "gpt2") and SentencePiece (tokenizer.ggml.model = "llama")`,
    );
  }
  // llama.cpp strips whitespace beside special tokens for models it knows by name (Phi-3: after
  // every special token; ModernBERT, Jina v2/v3 and Nomic BERT-MoE: before the mask token); those
  // rules are not implemented here.
  const text = (key: string): string => (typeof meta[key] === "string" ? (meta[key] as string) : "");
  const name = text("general.name").toLowerCase();
  const stripping =
    ["phi-3", "phi3", "modern-bert"].find((n) => name.includes(n)) ??
    ["jina-v2-de", "jina-v2-es", "jina-v2-code"].find((n) => text("tokenizer.ggml.pre").includes(n)) ??
    ["nomic-bert-moe", "jina-bert-v3"].find((n) => text("general.architecture").includes(n));
  if (stripping !== undefined) {
    throw new TokenizerError(
      "tokenizer_unsupported_model",
      `unsupported tokenizer of "${text("general.name")}": llama.cpp strips whitespace beside special tokens ` +
        `for ${stripping} models, which ctxbank does not implement`,
    );
  }
  const tokens = readTokens(meta);
  const types = readTypes(meta, tokens.length);
  const flag = (key: string, fallback: boolean): boolean => {
    const v = meta[key];
    if (v === undefined) return fallback;
    if (typeof v !== "boolean") throw new TokenizerError("tokenizer_bad_metadata", `${key} is not a boolean`);
    return v;
  };
  // llama.cpp reads add_space_prefix from the file for every model (for BPE it only affects decoding).
  const flags = (addBos: boolean, addSpacePrefix: boolean) => ({
    addBos: flag("tokenizer.ggml.add_bos_token", addBos),
    addEos: flag("tokenizer.ggml.add_eos_token", false),
    addSpacePrefix: flag("tokenizer.ggml.add_space_prefix", addSpacePrefix),
  });

  if (model === "llama") {
    // The pre-tokenizer is not used by SentencePiece (llama.cpp ignores tokenizer.ggml.pre for it).
    const pre = typeof meta["tokenizer.ggml.pre"] === "string" ? (meta["tokenizer.ggml.pre"] as string) : "default";
    for (let i = 0; i < tokens.length; i++) {
      // llama.cpp reads a byte token's value from its text, "<0xNN>".
      if (types[i] === TokenType.BYTE && !/^<0x[0-9A-Fa-f]{2}>$/.test(tokens[i]!)) {
        throw new TokenizerError("tokenizer_bad_metadata", `byte token ${i} is ${JSON.stringify(tokens[i])}, not <0xNN>`);
      }
    }
    return { model, pre, tokens, types, scores: readScores(meta, tokens.length), cleanSpaces: false, ...flags(true, true) };
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
  const merges = meta["tokenizer.ggml.merges"];
  if (!Array.isArray(merges) || !merges.every((m) => typeof m === "string")) {
    throw new TokenizerError("tokenizer_bad_metadata", "tokenizer.ggml.merges is missing or not an array of strings (required for BPE)");
  }
  return {
    model,
    pre,
    tokens,
    types,
    merges: merges as string[],
    split: fam.split,
    ignoreMerges: fam.ignoreMerges,
    cleanSpaces: fam.cleanSpaces,
    ...flags(fam.addBos, false),
  };
}

function readTokens(meta: GgufMetadata): string[] {
  const tokens = meta["tokenizer.ggml.tokens"];
  if (!Array.isArray(tokens) || tokens.length === 0 || !tokens.every((t) => typeof t === "string")) {
    throw new TokenizerError("tokenizer_bad_metadata", "tokenizer.ggml.tokens is missing or not an array of strings");
  }
  const out = (tokens as string[]).map((t, i) => (t === "" ? `[EMPTY_${i}]` : t));
  // llama.cpp aborts on a vocabulary with a repeated text (its text → id map must hold every token).
  const seen = new Map<string, number>();
  for (let i = 0; i < out.length; i++) {
    const first = seen.get(out[i]!);
    if (first !== undefined) {
      throw new TokenizerError("tokenizer_bad_metadata", `tokenizer.ggml.tokens repeats ${JSON.stringify(out[i])} (ids ${first} and ${i})`);
    }
    seen.set(out[i]!, i);
  }
  return out;
}

function readTypes(meta: GgufMetadata, n: number): Uint8Array {
  const rawTypes = meta["tokenizer.ggml.token_type"];
  const types = new Uint8Array(n).fill(TokenType.NORMAL);
  if (rawTypes === undefined) return types;
  if (!Array.isArray(rawTypes) || rawTypes.length !== n) {
    throw new TokenizerError(
      "tokenizer_bad_metadata",
      `tokenizer.ggml.token_type has ${Array.isArray(rawTypes) ? rawTypes.length : "no"} entries, expected ${n}`,
    );
  }
  for (let i = 0; i < n; i++) {
    const t: unknown = rawTypes[i];
    if (typeof t !== "number" || !Number.isInteger(t)) {
      throw new TokenizerError("tokenizer_bad_metadata", `tokenizer.ggml.token_type[${i}] is not an integer`);
    }
    types[i] = t >= TokenType.UNDEFINED && t <= TokenType.BYTE ? t : TokenType.UNDEFINED; // as llama.cpp maps unknown types
  }
  return types;
}

function readScores(meta: GgufMetadata, n: number): Float64Array {
  const raw = meta["tokenizer.ggml.scores"];
  const scores = new Float64Array(n);
  if (raw === undefined) return scores;
  if (!Array.isArray(raw) || raw.length < n) {
    throw new TokenizerError(
      "tokenizer_bad_metadata",
      `tokenizer.ggml.scores has ${Array.isArray(raw) ? raw.length : "no"} entries, expected ${n}`,
    );
  }
  for (let i = 0; i < n; i++) {
    const v: unknown = raw[i];
    // NaN would make the merge order undefined (llama.cpp's priority queue compares scores).
    if (typeof v !== "number" || Number.isNaN(v)) {
      throw new TokenizerError("tokenizer_bad_metadata", `tokenizer.ggml.scores[${i}] is not a number`);
    }
    scores[i] = v;
  }
  return scores;
}
