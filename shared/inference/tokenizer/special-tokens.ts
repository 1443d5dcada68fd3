/**
 * Special tokens, as llama.cpp finds and uses them (`llama-vocab.cpp`): ids from the metadata, ids
 * auto-detected by their text, the end-of-generation set, and splitting text on special tokens.
 */
import { TokenType, type GgufMetadata } from "./vocab.ts";

/** Special token ids read from the file (undefined when the model has none). */
export interface SpecialTokenIds {
  bos?: number;
  eos?: number;
  /** end of turn (e.g. `<|im_end|>`, `<|eot_id|>`, `<|endoftext|>`) */
  eot?: number;
  /** end of message (`<|eom_id|>`) */
  eom?: number;
  unk?: number;
  pad?: number;
  sep?: number;
  mask?: number;
  /** newline token (first id of encode("\n")) */
  nl?: number;
  fimPre?: number;
  fimSuf?: number;
  fimMid?: number;
  fimPad?: number;
  fimRep?: number;
  fimSep?: number;
}

// Token texts llama.cpp recognises by name (llama-vocab.cpp, "auto-detect special tokens by text").
const EOT_NAMES = [
  "<|eot_id|>",
  "<|im_end|>",
  "<|end|>",
  "<end_of_turn>",
  "<|endoftext|>",
  "<|end_of_text|>",
  "<EOT>",
  "_<EOT>",
  "[EOT]",
  "<｜end▁of▁sentence｜>",
  "<end_of_utterance>",
];
const EOM_NAMES = ["<|eom_id|>"];
const FIM_PRE_NAMES = [
  "<|fim_prefix|>",
  "<fim-prefix>",
  "<fim_prefix>",
  "<｜fim▁begin｜>",
  "<PRE>",
  "▁<PRE>",
  "<|code_prefix|>",
  "<|prefix|>",
];
const FIM_SUF_NAMES = [
  "<|fim_suffix|>",
  "<fim-suffix>",
  "<fim_suffix>",
  "<｜fim▁hole｜>",
  "<SUF>",
  "▁<SUF>",
  "<|code_suffix|>",
  "<|suffix|>",
];
const FIM_MID_NAMES = [
  "<|fim_middle|>",
  "<fim-middle>",
  "<fim_middle>",
  "<｜fim▁end｜>",
  "<MID>",
  "▁<MID>",
  "<|code_middle|>",
  "<|middle|>",
];
const FIM_PAD_NAMES = ["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_NAMES = ["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP_NAMES = ["<|file_sep|>"];
const EOG_NAMES = [
  "<|eot_id|>",
  "<|im_end|>",
  "<|end|>",
  "<|return|>",
  "<|call|>",
  "<|flush|>",
  "<|calls|>",
  "<end_of_turn>",
  "<|endoftext|>",
  "</s>",
  "<|eom_id|>",
  "<EOT>",
  "_<EOT>",
  "[EOT]",
  "[EOS]",
  "<|end_of_text|>",
  "<end_of_utterance>",
  "<eos>",
  "<turn|>",
  "<|tool_response>",
  "<｜end▁of▁sentence｜>",
  "[e~[",
];
// gpt-oss: llama.cpp always renders these, as user-defined tokens.
const ALWAYS_USER_DEFINED = ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

/**
 * Special ids (all but `nl`, which needs a working encoder) and the end-of-generation set, computed
 * like llama.cpp's `special_eog_ids`. `defaults` are the tokenizer model's ids, used where the file
 * names none (llama.cpp's: bos 1, eos 2, unk 0 for SentencePiece; bos = eos = 11 for GPT-2 BPE).
 * Tokens detected by name are forced to CONTROL in `types`, as llama.cpp does; `types` is updated
 * in place.
 */
export function findSpecialTokens(
  meta: GgufMetadata,
  tokens: readonly string[],
  types: Uint8Array,
  tokenToId: ReadonlyMap<string, number>,
  defaults: Pick<SpecialTokenIds, "bos" | "eos" | "unk">,
): { special: SpecialTokenIds; eog: Set<number> } {
  // Special ids from metadata (out-of-range ids are ignored, as llama.cpp does).
  const idKey = (key: string): number | undefined => {
    const v = meta[key];
    const n = typeof v === "bigint" ? Number(v) : v;
    return typeof n === "number" && Number.isInteger(n) && n >= 0 && n < tokens.length ? n : undefined;
  };
  const sp: SpecialTokenIds = {};
  const set = (k: keyof SpecialTokenIds, v: number | undefined): void => {
    if (v !== undefined) sp[k] = v;
  };
  const inVocab = (id: number | undefined): number | undefined => (id !== undefined && id < tokens.length ? id : undefined);
  set("bos", idKey("tokenizer.ggml.bos_token_id") ?? inVocab(defaults.bos));
  set("eos", idKey("tokenizer.ggml.eos_token_id") ?? inVocab(defaults.eos));
  set("eot", idKey("tokenizer.ggml.eot_token_id"));
  set("eom", idKey("tokenizer.ggml.eom_token_id"));
  set("unk", idKey("tokenizer.ggml.unknown_token_id") ?? inVocab(defaults.unk));
  set("sep", idKey("tokenizer.ggml.seperator_token_id") ?? idKey("tokenizer.ggml.separator_token_id"));
  set("pad", idKey("tokenizer.ggml.padding_token_id"));
  set("mask", idKey("tokenizer.ggml.mask_token_id"));
  set("fimPre", idKey("tokenizer.ggml.fim_pre_token_id") ?? idKey("tokenizer.ggml.prefix_token_id"));
  set("fimSuf", idKey("tokenizer.ggml.fim_suf_token_id") ?? idKey("tokenizer.ggml.suffix_token_id"));
  set("fimMid", idKey("tokenizer.ggml.fim_mid_token_id") ?? idKey("tokenizer.ggml.middle_token_id"));
  set("fimPad", idKey("tokenizer.ggml.fim_pad_token_id"));
  set("fimRep", idKey("tokenizer.ggml.fim_rep_token_id"));
  set("fimSep", idKey("tokenizer.ggml.fim_sep_token_id"));

  // Auto-detect by text; such tokens are forced to CONTROL (llama.cpp does the same).
  const byName = (names: readonly string[]): number | undefined => {
    let best: number | undefined;
    for (const n of names) {
      const id = tokenToId.get(n);
      if (id !== undefined && (best === undefined || id < best)) best = id;
    }
    return best;
  };
  const detect = (k: keyof SpecialTokenIds, names: readonly string[]): void => {
    if (sp[k] !== undefined) return;
    const id = byName(names);
    if (id !== undefined) {
      sp[k] = id;
      types[id] = TokenType.CONTROL;
    }
  };
  detect("eot", EOT_NAMES);
  detect("eom", EOM_NAMES);
  detect("fimPre", FIM_PRE_NAMES);
  detect("fimSuf", FIM_SUF_NAMES);
  detect("fimMid", FIM_MID_NAMES);
  detect("fimPad", FIM_PAD_NAMES);
  detect("fimRep", FIM_REP_NAMES);
  detect("fimSep", FIM_SEP_NAMES);

  const eog = new Set<number>();
  for (const k of ["fimPad", "fimRep", "fimSep"] as const) if (sp[k] !== undefined) eog.add(sp[k]);
  const eogNames = new Set(EOG_NAMES);
  for (let i = 0; i < tokens.length; i++) {
    // By text, so of a duplicated text only the id llama.cpp's text → id map keeps (the last).
    if (eogNames.has(tokens[i]!) && tokenToId.get(tokens[i]!) === i) {
      eog.add(i);
      types[i] = TokenType.CONTROL;
    }
  }
  for (const name of ALWAYS_USER_DEFINED) {
    const id = tokenToId.get(name);
    if (id !== undefined) types[id] = TokenType.USER_DEFINED;
  }
  for (const k of ["eos", "eot", "eom"] as const) if (sp[k] !== undefined) eog.add(sp[k]);
  // o200k_harmony and solar-open workaround in llama.cpp: with <|return|> and <|call|> (or <|calls|>
  // and <|flush|>), <|end|> is not EOG.
  const textIn = (t: string): number | undefined => [...eog].find((id) => tokens[id] === t);
  const endId = textIn("<|end|>");
  const call = textIn("<|call|>") !== undefined || textIn("<|calls|>") !== undefined;
  if (endId !== undefined && call && (textIn("<|return|>") !== undefined || textIn("<|flush|>") !== undefined)) {
    eog.delete(endId);
    types[endId] = TokenType.USER_DEFINED;
  }
  // Gemma 4 and PaddleOCR workaround in llama.cpp: with <|tool_response>, </s> is a normal token.
  const closeS = textIn("</s>");
  if (closeS !== undefined && textIn("<|tool_response>") !== undefined) {
    eog.delete(closeS);
    types[closeS] = TokenType.NORMAL;
  }
  return { special: sp, eog };
}

const utf8 = new TextEncoder();

/**
 * The ids text is split on: `all` (control, unknown and user-defined, for `parseSpecial`) and `user`
 * (user-defined only, always recognised). Longest (in UTF-8 bytes) first; ties by id for determinism.
 */
export function specialPartitionLists(tokens: readonly string[], types: Uint8Array): { all: number[]; user: number[] } {
  const byLen = (a: number, b: number): number => utf8.encode(tokens[b]!).length - utf8.encode(tokens[a]!).length || a - b;
  const all: number[] = [];
  const user: number[] = [];
  for (let i = 0; i < tokens.length; i++) {
    if (tokens[i]!.length === 0) continue;
    const t = types[i];
    if (t === TokenType.CONTROL || t === TokenType.UNKNOWN || t === TokenType.USER_DEFINED) all.push(i);
    if (t === TokenType.USER_DEFINED) user.push(i);
  }
  return { all: all.sort(byLen), user: user.sort(byLen) };
}

/** A piece of the input: raw text still to be tokenized, or an already recognised special token. */
export interface Fragment {
  text?: string;
  id?: number;
}

/** llama.cpp `tokenizer_st_partition`: split raw fragments on each special token, longest first. */
export function partitionOnSpecials(text: string, specials: readonly number[], tokens: readonly string[]): Fragment[] {
  let frags: Fragment[] = [{ text }];
  for (const id of specials) {
    const tok = tokens[id]!;
    // Fragments are pieces of `text`: a token it does not hold is in none of them. One search of the
    // text instead of a walk over every fragment keeps a text cut into many pieces cheap for a
    // vocabulary with thousands of special tokens (Gemma 3: 6,400).
    if (frags.length > 1 && !text.includes(tok)) continue;
    let changed = false;
    const next: Fragment[] = [];
    for (const f of frags) {
      if (f.text === undefined || f.text.length < tok.length) {
        next.push(f);
        continue;
      }
      let at = f.text.indexOf(tok);
      if (at < 0) {
        next.push(f);
        continue;
      }
      changed = true;
      let from = 0;
      while (at >= 0) {
        if (at > from) next.push({ text: f.text.slice(from, at) });
        next.push({ id });
        from = at + tok.length;
        at = f.text.indexOf(tok, from);
      }
      if (from < f.text.length) next.push({ text: f.text.slice(from) });
    }
    if (changed) frags = next;
  }
  return frags;
}
