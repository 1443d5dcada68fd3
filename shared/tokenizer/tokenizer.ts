/**
 * GPT-2 style byte-level BPE tokenizer built from GGUF metadata, matching llama.cpp's tokenizer
 * (`llama-vocab.cpp`) id for id.
 *
 * Pipeline (the same as llama.cpp's `tokenize(text, add_special, parse_special)`):
 *   1. split the text on special tokens (control/unknown tokens only when `parseSpecial`,
 *      user-defined tokens always), longest token first — llama.cpp's `tokenizer_st_partition`;
 *   2. pre-tokenize each raw fragment: for the `smollm`/`starcoder`/… family every `\p{N}` code point
 *      is isolated first, then the GPT-2 split ('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
 *      ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+), implemented like llama.cpp's hand-written
 *      `unicode_regex_split_custom_gpt2` (its whitespace set is Unicode White_Space, not JS `\s`);
 *   3. byte-level encode each piece (GPT-2 bytes→unicode table) and apply BPE merges by rank
 *      (`bpe.ts`, llama.cpp's merge order and tie-breaking).
 *
 * Why not `@huggingface/tokenizers` end to end: its `Digits` pre-tokenizer matches only ASCII `\d`
 * while llama.cpp isolates every Unicode number (`²`, `١`, `５`…), its `\s` is JS whitespace rather
 * than Unicode White_Space (U+0085, U+FEFF differ), duplicate merges keep the last rank where
 * llama.cpp keeps the first, and its BPE builds a JSON string per candidate pair, which makes long
 * pre-tokens (200k spaces) take seconds. The tests compare every path with llama.cpp itself.
 *
 * Decoding mirrors llama.cpp's `token_to_piece`/`detokenize`: normal tokens are byte-level decoded,
 * control/unknown tokens render only when `special` is set, user-defined tokens render as text.
 */
import { readGgufMetadata } from "../engine/native.ts";
import { BytePairEncoder } from "./bpe.ts";

export type GgufMetadata = Readonly<Record<string, unknown>>;

export type TokenizerErrorCode = "UNSUPPORTED_MODEL" | "UNSUPPORTED_PRE" | "BAD_METADATA" | "BAD_TOKEN_ID";

export class TokenizerError extends Error {
  readonly code: TokenizerErrorCode;
  constructor(code: TokenizerErrorCode, message: string) {
    super(message);
    this.name = "TokenizerError";
    this.code = code;
  }
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

export interface EncodeOptions {
  /**
   * Recognise control tokens written in the text (e.g. `<|im_start|>` → id 1). Default false:
   * user text containing `<|im_end|>` is tokenized as plain characters, so it cannot forge turns.
   * Rendered chat templates need `true`. User-defined tokens (type 4) are always recognised.
   */
  parseSpecial?: boolean;
  /** Add BOS/EOS as the model asks (`tokenizer.ggml.add_bos_token` / `add_eos_token`). Default false. */
  addSpecial?: boolean;
}

export interface DecodeOptions {
  /** Render control tokens as their text (llama.cpp `special`/`unparse_special`). Default false. */
  special?: boolean;
  /**
   * Apply llama.cpp's `clean_spaces` post-processing (" ." → ".", " 's" → "'s", …). Defaults to the
   * model's setting (off for `smollm`). The streaming detokenizer never applies it.
   */
  cleanSpaces?: boolean;
}

// Pre-tokenizer families (llama.cpp `llama_vocab::impl::load`). Both share the GPT-2 split; the
// first isolates every \p{N} first. `cleanSpaces` is llama.cpp's per-pre `clean_spaces` flag.
const DIGITS_THEN_GPT2: Record<string, { cleanSpaces: boolean }> = {
  smollm: { cleanSpaces: false },
  starcoder: { cleanSpaces: true },
  refact: { cleanSpaces: true },
  "command-r": { cleanSpaces: false },
  codeshell: { cleanSpaces: true },
  exaone: { cleanSpaces: true },
  "minerva-7b": { cleanSpaces: true },
};
const GPT2_ONLY: Record<string, { cleanSpaces: boolean }> = {
  "gpt-2": { cleanSpaces: true },
  "phi-2": { cleanSpaces: true },
  "jina-es": { cleanSpaces: true },
  "jina-de": { cleanSpaces: true },
  gigachat: { cleanSpaces: true },
  "jina-v2-es": { cleanSpaces: true },
  "jina-v2-de": { cleanSpaces: true },
  "a.x-4.0": { cleanSpaces: true },
  mellum: { cleanSpaces: true },
  "modern-bert": { cleanSpaces: true },
  exaone4: { cleanSpaces: true },
  mpt: { cleanSpaces: true },
  olmo: { cleanSpaces: true },
  jais: { cleanSpaces: true },
  trillion: { cleanSpaces: false },
  "granite-docling": { cleanSpaces: false },
};

export const SUPPORTED_PRE_TOKENIZERS: readonly string[] = [
  ...Object.keys(DIGITS_THEN_GPT2),
  ...Object.keys(GPT2_ONLY),
];

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
  "<｜end▁of▁sentence｜>",
  "<end_of_utterance>",
];
const EOM_NAMES = ["<|eom_id|>"];
const FIM_PRE_NAMES = ["<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>"];
const FIM_SUF_NAMES = ["<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>"];
const FIM_MID_NAMES = ["<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>"];
const FIM_PAD_NAMES = ["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"];
const FIM_REP_NAMES = ["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
const FIM_SEP_NAMES = ["<|file_sep|>"];
const EOG_NAMES = [
  "<|eot_id|>",
  "<|im_end|>",
  "<|end|>",
  "<|return|>",
  "<|call|>",
  "<end_of_turn>",
  "<|endoftext|>",
  "<|eom_id|>",
  "<EOT>",
  "_<EOT>",
  "<|end_of_text|>",
  "<end_of_utterance>",
];

// ---------------------------------------------------------------------------------------------
// GPT-2 byte-level table

const BYTE_TO_CHAR: string[] = (() => {
  const bs: number[] = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const table = new Array<string>(256);
  for (const b of bs) table[b] = String.fromCodePoint(b);
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (table[b] === undefined) table[b] = String.fromCodePoint(256 + n++);
  }
  return table;
})();
const CHAR_TO_BYTE = new Map<number, number>(BYTE_TO_CHAR.map((c, b) => [c.codePointAt(0)!, b]));

const utf8 = new TextEncoder();

function byteLevelEncode(piece: string): string {
  const bytes = utf8.encode(piece);
  let s = "";
  for (const b of bytes) s += BYTE_TO_CHAR[b]!;
  return s;
}

// ---------------------------------------------------------------------------------------------
// Code point classes (llama.cpp unicode_cpt_flags): letter = \p{L}, number = \p{N},
// whitespace = Unicode White_Space property.

const WHITESPACE = new Set<number>([
  0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x20, 0x85, 0xa0, 0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005,
  0x2006, 0x2007, 0x2008, 0x2009, 0x200a, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000,
]);
const RE_LETTER = /^\p{L}$/u;
const RE_NUMBER = /^\p{N}$/u;

const F_LETTER = 1;
const F_NUMBER = 2;
const F_WHITESPACE = 4;
const F_OTHER = 8; // any other assigned or unassigned code point (flags != 0 in llama.cpp)

const ASCII_FLAGS: Uint8Array = (() => {
  const t = new Uint8Array(128);
  for (let c = 0; c < 128; c++) t[c] = classify(c);
  return t;
})();

function classify(cp: number): number {
  if (WHITESPACE.has(cp)) return F_WHITESPACE;
  const ch = String.fromCodePoint(cp);
  if (RE_LETTER.test(ch)) return F_LETTER;
  if (RE_NUMBER.test(ch)) return F_NUMBER;
  return F_OTHER;
}

const flagCache = new Map<number, number>();
function flagsOf(cp: number): number {
  if (cp < 128) return ASCII_FLAGS[cp]!;
  let f = flagCache.get(cp);
  if (f === undefined) {
    f = classify(cp);
    if (flagCache.size < 65536) flagCache.set(cp, f);
  }
  return f;
}

/** Split on every \p{N} code point (llama.cpp regex "\\p{N}"): numbers isolated, the rest kept. */
function splitDigits(cps: number[]): number[][] {
  const out: number[][] = [];
  let run: number[] = [];
  for (const cp of cps) {
    if (flagsOf(cp) === F_NUMBER) {
      if (run.length > 0) out.push(run);
      run = [];
      out.push([cp]);
    } else {
      run.push(cp);
    }
  }
  if (run.length > 0) out.push(run);
  return out;
}

const APOS = 0x27;
const SPACE = 0x20;
const c_s = 0x73, c_t = 0x74, c_m = 0x6d, c_d = 0x64, c_r = 0x72, c_e = 0x65, c_v = 0x76, c_l = 0x6c;

/** Port of llama.cpp `unicode_regex_split_custom_gpt2` over one fragment's code points. */
function splitGpt2(cps: number[], out: number[][]): void {
  const end = cps.length;
  const cpt = (p: number): number => (p < end ? cps[p]! : -1);
  const flags = (p: number): number => (p < end ? flagsOf(cps[p]!) : 0);
  let prev = 0;
  const add = (p: number): number => {
    const len = p - prev;
    if (len > 0) out.push(cps.slice(prev, p));
    prev = p;
    return len;
  };
  for (let pos = 0; pos < end; ) {
    const c = cps[pos]!;
    const f = flagsOf(c);
    // 's|'t|'re|'ve|'m|'ll|'d
    if (c === APOS && pos + 1 < end) {
      const n1 = cps[pos + 1]!;
      if (n1 === c_s || n1 === c_t || n1 === c_m || n1 === c_d) {
        pos += add(pos + 2);
        continue;
      }
      if (pos + 2 < end) {
        const n2 = cps[pos + 2]!;
        if ((n1 === c_r && n2 === c_e) || (n1 === c_v && n2 === c_e) || (n1 === c_l && n2 === c_l)) {
          pos += add(pos + 3);
          continue;
        }
      }
    }
    let f2 = c === SPACE ? flags(pos + 1) : f;
    // <space>?\p{L}+
    if (f2 === F_LETTER) {
      pos += c === SPACE ? 1 : 0;
      while (flags(pos) === F_LETTER) pos++;
      add(pos);
      continue;
    }
    // <space>?\p{N}+
    if (f2 === F_NUMBER) {
      pos += c === SPACE ? 1 : 0;
      while (flags(pos) === F_NUMBER) pos++;
      add(pos);
      continue;
    }
    // <space>?[^\s\p{L}\p{N}]+
    if (f2 === F_OTHER) {
      pos += c === SPACE ? 1 : 0;
      while (f2 === F_OTHER) f2 = flags(++pos);
      add(pos);
      continue;
    }
    let nws = 0;
    while (flags(pos + nws) === F_WHITESPACE) nws++;
    // \s+(?!\S)
    if (nws > 1 && cpt(pos + nws) !== -1) {
      pos += nws - 1;
      add(pos);
      continue;
    }
    // \s+
    if (nws > 0) {
      pos += nws;
      add(pos);
      continue;
    }
    add(++pos); // no match (unreachable with the classes above, kept for parity)
  }
}

/** String.fromCodePoint without spreading huge arrays onto the stack. */
function fromCodePoints(cps: readonly number[]): string {
  if (cps.length <= 4096) return String.fromCodePoint(...cps);
  let s = "";
  for (let i = 0; i < cps.length; i += 4096) s += String.fromCodePoint(...cps.slice(i, i + 4096));
  return s;
}

function codePoints(s: string): number[] {
  const out: number[] = [];
  for (const ch of s) out.push(ch.codePointAt(0)!);
  return out;
}

/** Replace lone surrogates with U+FFFD (what UTF-8 conversion does on the llama.cpp side). */
function wellFormed(s: string): string {
  return s.replace(/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g, "\uFFFD");
}

// ---------------------------------------------------------------------------------------------

interface Fragment {
  text?: string;
  id?: number;
}

export class GgufTokenizer {
  readonly model: string;
  readonly pre: string;
  readonly vocabSize: number;
  readonly addBos: boolean;
  readonly addEos: boolean;
  readonly cleanSpaces: boolean;
  readonly special: Readonly<SpecialTokenIds>;
  /** End-of-generation ids, computed like llama.cpp's `special_eog_ids`. */
  readonly eog: ReadonlySet<number>;

  private readonly tokens: readonly string[];
  private readonly types: Uint8Array;
  private readonly digitsFirst: boolean;
  private readonly bpe: BytePairEncoder;
  private readonly tokenToId: Map<string, number>;
  private readonly specialAll: number[]; // control | user-defined | unknown, longest first
  private readonly specialUser: number[]; // user-defined only, longest first
  private readonly pieceCache: (Uint8Array | undefined)[];

  private constructor(meta: GgufMetadata) {
    const model = meta["tokenizer.ggml.model"];
    if (typeof model !== "string") {
      throw new TokenizerError("BAD_METADATA", "the GGUF has no tokenizer (missing tokenizer.ggml.model)");
    }
    if (model !== "gpt2") {
      const kind: Record<string, string> = {
        llama: "SentencePiece (SPM)",
        bert: "WordPiece",
        t5: "Unigram (T5)",
        rwkv: "RWKV",
        plamo2: "PLaMo-2",
        no_vocab: "no vocabulary",
      };
      throw new TokenizerError(
        "UNSUPPORTED_MODEL",
        `unsupported tokenizer model "${model}"${kind[model] ? ` (${kind[model]})` : ""}: ctxbank supports GPT-2 style ` +
          `byte-level BPE (tokenizer.ggml.model = "gpt2") only`,
      );
    }
    const pre = meta["tokenizer.ggml.pre"];
    if (typeof pre !== "string" || pre === "") {
      throw new TokenizerError(
        "UNSUPPORTED_PRE",
        `the GGUF has no tokenizer.ggml.pre (pre-tokenizer type); llama.cpp would fall back to a degraded default — ` +
          `re-convert the model with a current convert_hf_to_gguf.py`,
      );
    }
    const fam = DIGITS_THEN_GPT2[pre] ?? GPT2_ONLY[pre];
    if (fam === undefined) {
      throw new TokenizerError(
        "UNSUPPORTED_PRE",
        `unsupported pre-tokenizer "${pre}" (tokenizer.ggml.pre); supported: ${SUPPORTED_PRE_TOKENIZERS.join(", ")}`,
      );
    }
    this.model = model;
    this.pre = pre;
    this.digitsFirst = DIGITS_THEN_GPT2[pre] !== undefined;
    this.cleanSpaces = fam.cleanSpaces;

    const tokens = meta["tokenizer.ggml.tokens"];
    if (!Array.isArray(tokens) || tokens.length === 0 || !tokens.every((t) => typeof t === "string")) {
      throw new TokenizerError("BAD_METADATA", "tokenizer.ggml.tokens is missing or not an array of strings");
    }
    const merges = meta["tokenizer.ggml.merges"];
    if (!Array.isArray(merges) || !merges.every((m) => typeof m === "string")) {
      throw new TokenizerError("BAD_METADATA", "tokenizer.ggml.merges is missing or not an array of strings (required for BPE)");
    }
    const rawTypes = meta["tokenizer.ggml.token_type"];
    const types = new Uint8Array(tokens.length).fill(TokenType.NORMAL);
    if (rawTypes !== undefined) {
      if (!Array.isArray(rawTypes) || rawTypes.length !== tokens.length) {
        throw new TokenizerError(
          "BAD_METADATA",
          `tokenizer.ggml.token_type has ${Array.isArray(rawTypes) ? rawTypes.length : "no"} entries, expected ${tokens.length}`,
        );
      }
      for (let i = 0; i < rawTypes.length; i++) types[i] = Number(rawTypes[i]);
    }
    this.tokens = tokens as string[];
    this.vocabSize = tokens.length;

    // text → id (later duplicates win, like llama.cpp's token_to_id map)
    this.tokenToId = new Map();
    for (let i = 0; i < tokens.length; i++) this.tokenToId.set(tokens[i] as string, i);

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
    set("bos", idKey("tokenizer.ggml.bos_token_id"));
    set("eos", idKey("tokenizer.ggml.eos_token_id"));
    set("eot", idKey("tokenizer.ggml.eot_token_id"));
    set("eom", idKey("tokenizer.ggml.eom_token_id"));
    set("unk", idKey("tokenizer.ggml.unknown_token_id"));
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
        const id = this.tokenToId.get(n);
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
      if (eogNames.has(tokens[i] as string)) {
        eog.add(i);
        types[i] = TokenType.CONTROL;
      }
    }
    for (const k of ["eos", "eot", "eom"] as const) if (sp[k] !== undefined) eog.add(sp[k]);
    // o200k_harmony workaround in llama.cpp: with <|return|> and <|call|>, <|end|> is not EOG.
    const textIn = (t: string): number | undefined => [...eog].find((id) => tokens[id] === t);
    const endId = textIn("<|end|>");
    if (endId !== undefined && textIn("<|return|>") !== undefined && textIn("<|call|>") !== undefined) {
      eog.delete(endId);
      types[endId] = TokenType.USER_DEFINED;
    }
    this.eog = eog;
    this.types = types;

    const addBos = meta["tokenizer.ggml.add_bos_token"];
    const addEos = meta["tokenizer.ggml.add_eos_token"];
    this.addBos = typeof addBos === "boolean" ? addBos : false;
    this.addEos = typeof addEos === "boolean" ? addEos : false;

    // Special-token partition lists, longest (in UTF-8 bytes) first; ties by id for determinism.
    const byLen = (a: number, b: number): number =>
      utf8.encode(this.tokens[b]!).length - utf8.encode(this.tokens[a]!).length || a - b;
    const all: number[] = [];
    const user: number[] = [];
    for (let i = 0; i < tokens.length; i++) {
      if ((tokens[i] as string).length === 0) continue;
      const t = types[i];
      if (t === TokenType.CONTROL || t === TokenType.UNKNOWN || t === TokenType.USER_DEFINED) all.push(i);
      if (t === TokenType.USER_DEFINED) user.push(i);
    }
    this.specialAll = all.sort(byLen);
    this.specialUser = user.sort(byLen);

    this.bpe = new BytePairEncoder(tokens as string[], merges as string[]);
    this.pieceCache = new Array(tokens.length);

    const nl = this.encode("\n");
    if (nl.length > 0) sp.nl = nl[0]!;
    this.special = Object.freeze(sp);
  }

  /** Build from a GGUF metadata record (e.g. `readGgufMetadata(path)` from the native addon). */
  static fromMetadata(meta: GgufMetadata): GgufTokenizer {
    return new GgufTokenizer(meta);
  }

  /** Read the GGUF's metadata with the native addon and build the tokenizer. */
  static fromGguf(path: string): GgufTokenizer {
    return new GgufTokenizer(readGgufMetadata(path));
  }

  /** Token text as stored in the vocabulary (byte-level form for normal tokens). */
  tokenText(id: number): string {
    this.checkId(id);
    return this.tokens[id]!;
  }

  tokenType(id: number): number {
    this.checkId(id);
    return this.types[id]!;
  }

  /** Id of a token by its exact vocabulary text. */
  tokenId(text: string): number | undefined {
    return this.tokenToId.get(text);
  }

  isEog(id: number): boolean {
    return this.eog.has(id);
  }

  /** Control (and unknown-type) tokens: not rendered by default, never produced from plain text. */
  isControl(id: number): boolean {
    const t = this.types[id];
    return t === TokenType.CONTROL || t === TokenType.UNKNOWN;
  }

  encode(text: string, opts: EncodeOptions = {}): number[] {
    const out: number[] = [];
    if (opts.addSpecial && this.addBos && this.special.bos !== undefined) out.push(this.special.bos);
    if (text.length > 0) {
      const fragments = this.partition(wellFormed(text), opts.parseSpecial ? this.specialAll : this.specialUser);
      for (const f of fragments) {
        if (f.id !== undefined) out.push(f.id);
        else this.encodeRaw(f.text!, out);
      }
    }
    if (opts.addSpecial && this.addEos && this.special.eos !== undefined) out.push(this.special.eos);
    return out;
  }

  /** Bytes of one token as llama.cpp's `token_to_piece` produces them. */
  tokenBytes(id: number, special = false): Uint8Array {
    this.checkId(id);
    const t = this.types[id]!;
    if (t === TokenType.CONTROL || t === TokenType.UNKNOWN) return special ? utf8.encode(this.tokens[id]!) : EMPTY;
    let b = this.pieceCache[id];
    if (b === undefined) {
      const text = this.tokens[id]!;
      if (t === TokenType.USER_DEFINED) b = utf8.encode(text);
      else if (t === TokenType.NORMAL) b = byteLevelDecode(text);
      else b = EMPTY; // unused / byte / undefined types render nothing in llama.cpp's BPE path
      this.pieceCache[id] = b;
    }
    return b;
  }

  decodeBytes(ids: readonly number[], opts: DecodeOptions = {}): Uint8Array {
    const special = opts.special ?? false;
    const parts: Uint8Array[] = [];
    let n = 0;
    for (const id of ids) {
      const b = this.tokenBytes(id, special);
      parts.push(b);
      n += b.length;
    }
    let out: Uint8Array = new Uint8Array(n);
    let o = 0;
    for (const p of parts) {
      out.set(p, o);
      o += p.length;
    }
    if (opts.cleanSpaces ?? this.cleanSpaces) out = cleanSpacesBytes(out);
    return out;
  }

  decode(ids: readonly number[], opts: DecodeOptions = {}): string {
    return new TextDecoder("utf-8", { ignoreBOM: true }).decode(this.decodeBytes(ids, opts));
  }

  /** A detokenizer that emits only complete UTF-8 text as ids arrive. */
  createDetokenizer(opts: { special?: boolean } = {}): StreamingDetokenizer {
    return new StreamingDetokenizer(this, opts.special ?? false);
  }

  // -------------------------------------------------------------------------------------------

  private checkId(id: number): void {
    if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize) {
      throw new TokenizerError("BAD_TOKEN_ID", `token id ${id} is out of range (vocabulary has ${this.vocabSize} tokens)`);
    }
  }

  /** llama.cpp `tokenizer_st_partition`: split raw fragments on each special token, longest first. */
  private partition(text: string, specials: readonly number[]): Fragment[] {
    let frags: Fragment[] = [{ text }];
    for (const id of specials) {
      const tok = this.tokens[id]!;
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

  /** The pre-tokenizer's pieces of plain text (no special-token handling); for inspection and tests. */
  preTokenize(text: string): string[] {
    return this.pieces(wellFormed(text)).map(fromCodePoints);
  }

  private pieces(text: string): number[][] {
    const cps = codePoints(text);
    const pieces: number[][] = [];
    if (this.digitsFirst) for (const frag of splitDigits(cps)) splitGpt2(frag, pieces);
    else splitGpt2(cps, pieces);
    return pieces;
  }

  private encodeRaw(text: string, out: number[]): void {
    for (const p of this.pieces(text)) this.bpe.encodeWord(byteLevelEncode(fromCodePoints(p)), out);
  }
}

const EMPTY = new Uint8Array(0);

function byteLevelDecode(text: string): Uint8Array {
  const out: number[] = [];
  for (const ch of text) {
    const b = CHAR_TO_BYTE.get(ch.codePointAt(0)!);
    if (b !== undefined) out.push(b);
    else for (const x of utf8.encode(ch)) out.push(x); // not a byte-level char: keep its UTF-8
  }
  return Uint8Array.from(out);
}

/** llama.cpp `detokenize` clean_spaces passes (ASCII only, safe on UTF-8 bytes). */
function cleanSpacesBytes(t: Uint8Array): Uint8Array {
  const text = Array.from(t);
  const SP = 0x20, Q = 0x3f, EX = 0x21, DOT = 0x2e, COMMA = 0x2c, AP = 0x27;
  // pass 1: " ?", " !", " .", " ," → drop the space
  let total = text.length ? 1 : 0;
  for (let i = 1; i < text.length; i++) {
    const x = text[i]!;
    if (text[i - 1] === SP && (x === Q || x === EX || x === DOT || x === COMMA)) total--;
    text[total++] = x;
  }
  text.length = total;
  // pass 2: " ' " → "'"
  const t2 = total;
  total = t2 ? 1 : 0;
  for (let i = 1; i < t2; i++) {
    const x = text[i]!;
    if (x === AP && i + 1 < t2 && text[i - 1] === SP && text[i + 1] === SP) {
      total--;
      text[++i] = 0; // skip the next space (llama.cpp overwrites it with '\0', in place, as here)
    }
    text[total++] = x;
  }
  text.length = total;
  // pass 3: " 's", " 'm", " 're", " 've" → drop the space
  const t3 = total;
  total = t3 ? 1 : 0;
  for (let i = 1; i < t3; i++) {
    const x = text[i]!;
    if (text[i - 1] === SP && x === AP && i + 1 < t3) {
      const x1 = text[i + 1]!;
      if (x1 === c_s || x1 === c_m) total--;
      else if (i + 2 < t3) {
        const x2 = text[i + 2]!;
        if ((x1 === c_r && x2 === c_e) || (x1 === c_v && x2 === c_e)) total--;
      }
    }
    text[total++] = x;
  }
  text.length = total;
  return Uint8Array.from(text);
}

/**
 * Incremental detokenizer: `push(ids)` returns the newly completed text. Bytes of a character split
 * across tokens (emoji, CJK over byte tokens) are held until the character is complete, so no
 * replacement characters are printed mid-stream; `flush()` returns what is left (an incomplete
 * trailing sequence becomes U+FFFD, exactly as a whole `decode` would render it).
 */
export class StreamingDetokenizer {
  private readonly decoder = new TextDecoder("utf-8", { ignoreBOM: true });
  private ended = false;

  constructor(
    private readonly tok: GgufTokenizer,
    private readonly special: boolean,
  ) {}

  push(ids: number | readonly number[]): string {
    if (this.ended) throw new Error("StreamingDetokenizer: push() after flush()");
    const list = typeof ids === "number" ? [ids] : ids;
    let s = "";
    for (const id of list) s += this.decoder.decode(this.tok.tokenBytes(id, this.special), { stream: true });
    return s;
  }

  flush(): string {
    if (this.ended) return "";
    this.ended = true;
    return this.decoder.decode();
  }
}
