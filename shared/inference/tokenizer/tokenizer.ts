/**
 * The tokenizer of a GGUF, built from its metadata, matching llama.cpp's tokenizer
 * (`llama-vocab.cpp`) id for id: GPT-2 style byte-level BPE (`tokenizer.ggml.model` = "gpt2", with
 * the SmolLM/StarCoder, GPT-2, Llama 3 and Qwen 2 pre-tokenizers) and SentencePiece ("llama", e.g.
 * Gemma 3 and Llama 2).
 *
 * Pipeline (the same as llama.cpp's `tokenize(text, add_special, parse_special)`):
 *   1. split the text on special tokens (control/unknown tokens only when `parseSpecial`,
 *      user-defined tokens always), longest token first — llama.cpp's `tokenizer_st_partition`
 *      (`special-tokens.ts`);
 *   2. BPE: pre-tokenize each raw fragment with the file's pre-tokenizer, ported from llama.cpp
 *      (`pre-tokenize.ts`); byte-level encode each piece (GPT-2 bytes→unicode table,
 *      `byte-level.ts`) and apply BPE merges by rank (`bpe.ts`, llama.cpp's merge order and
 *      tie-breaking);
 *   3. SentencePiece: each raw fragment, with a space before it when the file asks for a space
 *      prefix and the fragment starts the text or follows a special token, spaces escaped as "▁",
 *      is merged by token score with byte fallback (`spm.ts`).
 *
 * Why not `@huggingface/tokenizers` end to end: its `Digits` pre-tokenizer matches only ASCII `\d`
 * while llama.cpp isolates every Unicode number (`²`, `١`, `５`…), its `\s` is JS whitespace rather
 * than Unicode White_Space (U+0085, U+FEFF differ), duplicate merges keep the last rank where
 * llama.cpp keeps the first, and its BPE builds a JSON string per candidate pair, which makes long
 * pre-tokens (200k spaces) take seconds. The tests compare every path with llama.cpp itself.
 *
 * Decoding mirrors llama.cpp's `token_to_piece`/`detokenize`: normal tokens are byte-level decoded,
 * control/unknown tokens render only when `special` is set, user-defined tokens render as text
 * (`detokenize.ts`).
 */
import { readGgufMetadata } from "../engine/native.ts";
import { BytePairEncoder } from "./bpe.ts";
import { byteLevelDecode, byteLevelEncode } from "./byte-level.ts";
import { cleanSpacesBytes, StreamingDetokenizer } from "./detokenize.ts";
import { eachPreToken, fromCodePoints, preTokenize, wellFormed, type PreTokenizerSplit } from "./pre-tokenize.ts";
import { findSpecialTokens, partitionOnSpecials, specialPartitionLists, type Fragment, type SpecialTokenIds } from "./special-tokens.ts";
import { escapeSpaces, SentencePieceEncoder } from "./spm.ts";
import { readVocab, TokenizerError, TokenType, type GgufMetadata } from "./vocab.ts";

export { StreamingDetokenizer } from "./detokenize.ts";
export { SUPPORTED_PRE_TOKENIZERS } from "./pre-tokenize.ts";
export type { SpecialTokenIds } from "./special-tokens.ts";
export { TokenizerError, TokenType, type GgufMetadata, type TokenizerErrorCode } from "./vocab.ts";

export interface EncodeOptions {
  /**
   * Recognise control tokens written in the text (e.g. `<|im_start|>` → id 1). Default false:
   * user text containing `<|im_end|>` is tokenized as plain characters, so it cannot forge turns.
   * Rendered chat templates need `true`. User-defined tokens (type 4) are always recognised.
   */
  parseSpecial?: boolean;
  /** Add BOS/EOS as the model asks (`tokenizer.ggml.add_bos_token` / `add_eos_token`). Default false. */
  addSpecial?: boolean;
  /**
   * Stop as soon as more than this many ids are made: the result is then cut to `maxTokens + 1`
   * ids, enough to tell the text is too long without tokenizing the rest of it.
   */
  maxTokens?: number;
}

/** A piece of a prompt, and whether control tokens written in it are recognised. */
export interface PromptPart {
  text: string;
  parseSpecial: boolean;
}

export interface PartsEncoding {
  ids: number[];
  /** For each of the `marks` asked for: the number of ids before that character offset, or -1 when no token boundary falls there. */
  marks: number[];
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

/** UTF-8 length of a well-formed string, without encoding it. */
function utf8Length(s: string): number {
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) n += 1;
    else if (c < 0x800) n += 2;
    else if (c >= 0xd800 && c <= 0xdbff) {
      n += 4; // a surrogate pair: one 4-byte character
      i++;
    } else n += 3;
  }
  return n;
}

const utf8 = new TextEncoder();
const EMPTY = new Uint8Array(0);

export class GgufTokenizer {
  /** `tokenizer.ggml.model`: "gpt2" (byte-level BPE) or "llama" (SentencePiece). */
  readonly model: "gpt2" | "llama";
  readonly pre: string;
  readonly vocabSize: number;
  readonly addBos: boolean;
  readonly addEos: boolean;
  /** SentencePiece's space before text (llama.cpp `add_space_prefix`); decoding drops it again. */
  readonly addSpacePrefix: boolean;
  readonly cleanSpaces: boolean;
  readonly special: Readonly<SpecialTokenIds>;
  /** End-of-generation ids, computed like llama.cpp's `special_eog_ids`. */
  readonly eog: ReadonlySet<number>;

  private readonly tokens: readonly string[];
  private readonly types: Uint8Array;
  /** BPE only: the pre-tokenizer, whether a whole piece that is a token skips merging, the merges. */
  private readonly split: PreTokenizerSplit | undefined;
  private readonly ignoreMerges: boolean;
  private readonly bpe: BytePairEncoder | undefined;
  /** SentencePiece only: the encoder, and the most UTF-8 bytes of escaped text one token covers. */
  private readonly spm: SentencePieceEncoder | undefined;
  private readonly spmMaxTokenBytes: number;
  private readonly tokenToId: Map<string, number>;
  private readonly specialAll: number[]; // control | user-defined | unknown, longest first
  private readonly specialUser: number[]; // user-defined only, longest first
  private readonly pieceCache: (Uint8Array | undefined)[];
  private longestToken: number | undefined;

  private constructor(meta: GgufMetadata) {
    const vocab = readVocab(meta);
    const { model, pre, tokens, types } = vocab;
    this.model = model;
    this.pre = pre;
    this.cleanSpaces = vocab.cleanSpaces;
    this.addBos = vocab.addBos;
    this.addEos = vocab.addEos;
    this.addSpacePrefix = vocab.addSpacePrefix;
    this.tokens = tokens;
    this.vocabSize = tokens.length;

    // text → id (texts are unique: readVocab refuses a repeated one, as llama.cpp does)
    this.tokenToId = new Map();
    for (let i = 0; i < tokens.length; i++) this.tokenToId.set(tokens[i]!, i);

    // llama.cpp's default special ids for the tokenizer model, used where the file names none.
    const defaults = vocab.model === "llama" ? { bos: 1, eos: 2, unk: 0 } : { bos: 11, eos: 11 };
    const { special, eog } = findSpecialTokens(meta, tokens, types, this.tokenToId, defaults); // may retype tokens
    this.eog = eog;
    this.types = types;

    const { all, user } = specialPartitionLists(tokens, types);
    this.specialAll = all;
    this.specialUser = user;
    this.pieceCache = new Array(tokens.length);

    if (vocab.model === "llama") {
      this.split = undefined;
      this.ignoreMerges = false;
      this.bpe = undefined;
      this.spm = new SentencePieceEncoder(this.tokenToId, vocab.scores);
      let max = 1;
      for (const t of tokens) max = Math.max(max, utf8Length(t));
      this.spmMaxTokenBytes = max;
      special.nl = this.spm.byteToken(0x0a); // llama.cpp: the newline byte's token
    } else {
      this.split = vocab.split;
      this.ignoreMerges = vocab.ignoreMerges;
      this.bpe = new BytePairEncoder(tokens, vocab.merges);
      this.spm = undefined;
      this.spmMaxTokenBytes = 0;
      const nl = this.encode("\n");
      if (nl.length > 0) special.nl = nl[0]!;
      else if (special.pad !== undefined) special.nl = special.pad; // llama.cpp's fallback
    }
    this.special = Object.freeze(special);
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

  /** The first control (or unknown-type) token's text found in `text`, if any. */
  controlTextIn(text: string): string | undefined {
    for (const id of this.specialAll) if (this.isControl(id) && text.includes(this.tokens[id]!)) return this.tokens[id]!;
    return undefined;
  }

  encode(text: string, opts: EncodeOptions = {}): number[] {
    return this.encodeParts([{ text, parseSpecial: opts.parseSpecial ?? false }], opts).ids;
  }

  /**
   * Encode the text `parts` make when joined, recognising control tokens only inside the parts that
   * allow them (user-defined tokens everywhere, as `encode` does). Plain text is joined across part
   * boundaries before it is pre-tokenized, so the ids equal `encode(joined, { parseSpecial: true })`
   * whenever the parts without `parseSpecial` hold no control-token text: a chat template's parts
   * parse specials, the users' message contents do not, and `<|im_end|>` typed by a user stays text.
   * `marks` are character offsets into the joined text (see PartsEncoding).
   */
  encodeParts(parts: readonly PromptPart[], opts: EncodeOptions & { marks?: readonly number[] } = {}): PartsEncoding {
    const limit = opts.maxTokens ?? Infinity;
    const marks = opts.marks ?? [];
    const markIds = marks.map(() => -1);
    const out: number[] = [];
    if (opts.addSpecial && this.addBos && this.special.bos !== undefined) out.push(this.special.bos);
    // Lone surrogates are replaced in the joined text (a pair split across two parts stays a pair);
    // the replacement keeps every offset.
    const joined = wellFormed(parts.map((p) => p.text).join(""));
    let at = 0;
    const frags: (Fragment & { start: number })[] = [];
    for (const part of parts) {
      const text = joined.slice(at, at + part.text.length);
      let start = at;
      for (const f of partitionOnSpecials(text, part.parseSpecial ? this.specialAll : this.specialUser, this.tokens)) {
        const prev = frags.at(-1);
        if (f.text !== undefined && prev?.text !== undefined)
          prev.text += f.text; // plain text runs on across parts
        else frags.push({ ...f, start });
        start += f.text?.length ?? this.tokens[f.id!]!.length;
      }
      at += part.text.length;
    }
    // Marks in offset order, walked once alongside the fragments.
    const order = marks.map((_, i) => i).sort((a, b) => marks[a]! - marks[b]!);
    let k = 0;
    let afterSpecial = true; // SentencePiece's space prefix goes before the first text and after each special token
    for (const f of frags) {
      if (out.length > limit) break;
      const end = f.start + (f.text?.length ?? this.tokens[f.id!]!.length);
      for (; k < order.length && marks[order[k]!]! <= f.start; k++) if (marks[order[k]!] === f.start) markIds[order[k]!] = out.length;
      if (f.id !== undefined) {
        out.push(f.id);
        afterSpecial = true;
        continue;
      }
      const inside: number[] = [];
      for (; k < order.length && marks[order[k]!]! < end; k++) inside.push(order[k]!);
      if (this.spm !== undefined) {
        // SentencePiece merges across the whole fragment, so no mark inside one is vouched for (they stay -1).
        this.encodeSentencePiece(f.text!, afterSpecial, out, limit);
        afterSpecial = false;
        continue;
      }
      if (inside.length === 0) {
        this.encodeRaw(f.text!, out, limit);
        continue;
      }
      const found = this.encodeRawMarked(
        f.text!,
        f.start,
        inside.map((i) => marks[i]!),
        out,
        limit,
      );
      for (const i of inside) markIds[i] = found.get(marks[i]!) ?? -1;
    }
    for (; k < order.length; k++) if (marks[order[k]!] === joined.length && out.length <= limit) markIds[order[k]!] = out.length;
    if (opts.addSpecial && this.addEos && this.special.eos !== undefined) out.push(this.special.eos);
    if (out.length > limit + 1) out.length = limit + 1;
    return { ids: out, marks: markIds };
  }

  /** Bytes of the longest token's text (control tokens as written): no text of n tokens is longer than n times this. */
  get maxTokenBytes(): number {
    if (this.longestToken === undefined) {
      let max = 1;
      for (let id = 0; id < this.vocabSize; id++) max = Math.max(max, this.tokenBytes(id, true).length);
      this.longestToken = max;
    }
    return this.longestToken;
  }

  /**
   * The pre-tokenizer's pieces of plain text (no special-token handling); for inspection and tests.
   * SentencePiece has no pre-tokenizer: the text is one piece.
   */
  preTokenize(text: string): string[] {
    if (this.split === undefined) return text === "" ? [] : [wellFormed(text)];
    return preTokenize(wellFormed(text), this.split).map(fromCodePoints);
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
      else if (t === TokenType.NORMAL) b = this.spm ? utf8.encode(text.replaceAll("\u2581", " ")) : byteLevelDecode(text);
      else if (t === TokenType.BYTE && this.spm)
        b = Uint8Array.of(parseInt(text.slice(3, 5), 16)); // "<0xNN>", checked on load
      else b = EMPTY; // unused / undefined types render nothing (and byte types in llama.cpp's BPE path)
      this.pieceCache[id] = b;
    }
    return b;
  }

  /**
   * llama.cpp's `detokenize` (without removing special tokens): the pieces joined; with a space
   * prefix, one leading space of the first token's piece dropped; then `clean_spaces` if asked.
   */
  decodeBytes(ids: readonly number[], opts: DecodeOptions = {}): Uint8Array {
    const special = opts.special ?? false;
    const parts: Uint8Array[] = [];
    let n = 0;
    for (const id of ids) {
      let b = this.tokenBytes(id, special);
      if (parts.length === 0 && this.addSpacePrefix && b[0] === 0x20) b = b.subarray(1);
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

  private checkId(id: number): void {
    if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize) {
      throw new TokenizerError("invalid_token_id", `token id ${id} is out of range (vocabulary has ${this.vocabSize} tokens)`);
    }
  }

  /** Appends the BPE ids of plain text to `out`, stopping once `out` holds more than `limit`. */
  private encodeRaw(text: string, out: number[], limit: number): void {
    eachPreToken(text, this.split!, (p) => this.encodeWord(p, out, limit));
  }

  /**
   * Appends the SentencePiece ids of one plain-text fragment to `out`; false once `out` holds more
   * than `limit`. A fragment that cannot fit what is left (it makes at least bytes / spmMaxTokenBytes
   * tokens) is not merged, since merging costs time in proportion to its length: `out` is filled to
   * limit + 1 with its first bytes' byte tokens, which are not the text's tokenization (past the
   * limit only the count matters).
   */
  private encodeSentencePiece(text: string, afterSpecial: boolean, out: number[], limit: number): boolean {
    if (text === "") return out.length <= limit; // llama.cpp has no fragment for empty text (so no space prefix)
    const escaped = escapeSpaces(this.addSpacePrefix && afterSpecial ? " " + text : text);
    if (out.length + Math.ceil(utf8Length(escaped) / this.spmMaxTokenBytes) > limit) {
      this.spm!.encodeBytes(escaped, limit + 1 - out.length, out);
      return false;
    }
    this.spm!.encode(escaped, out);
    return out.length <= limit;
  }

  /**
   * BPE of one pre-token piece into `out`; false once `out` holds more than `limit`. A piece that
   * goes past the limit by more than a token (it makes at least bytes / maxTokenBytes) is not merged:
   * merging a word costs time in proportion to its length (a 2 MB word, seconds), and past the limit
   * only the count matters, so `out` is filled to limit + 1 with the piece's first characters' own
   * ids (like the cut at limit + 1, those ids are not the text's tokenization).
   */
  private encodeWord(piece: number[], out: number[], limit: number): boolean {
    let bytes = 0; // UTF-8 length, without building the word
    for (const c of piece) bytes += c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
    // (limit + 1: a word that ends just past the limit is merged, so the ids up to the cut are the
    // text's own whenever the word at the cut is short.)
    if (out.length + Math.ceil(bytes / this.maxTokenBytes) > limit + 1) {
      const missing = limit + 1 - out.length; // <= bytes: a piece makes no more tokens than bytes
      this.bpe!.encodeChars(byteLevelEncode(fromCodePoints(piece.slice(0, missing))), missing, out);
      return false;
    }
    this.mergeWord(byteLevelEncode(fromCodePoints(piece)), out);
    return out.length <= limit;
  }

  /** BPE of one byte-level word; with llama.cpp's `ignore_merges` (Llama 3), a word that is a token is that token. */
  private mergeWord(word: string, out: number[]): void {
    const whole = this.ignoreMerges ? this.tokenToId.get(word) : undefined;
    if (whole !== undefined) out.push(whole);
    else this.bpe!.encodeWord(word, out);
  }

  /**
   * encodeRaw, and for each mark (an offset into the whole text; `base` is the text's own offset)
   * the ids before it, when the text split there encodes the same as the whole: the mark starts a
   * pre-token piece, and the text before it, cut there, splits into the same pieces. Only the last
   * two pieces before a mark can differ (the split looks ahead through one run of whitespace), so
   * that is all that is split again: one pass over the text, however many marks.
   */
  private encodeRawMarked(text: string, base: number, marks: readonly number[], out: number[], limit: number): Map<number, number> {
    const wanted = new Set(marks.map((m) => m - base));
    const found = new Map<number, number>();
    const starts: number[] = []; // offsets of the pieces so far
    const pieces: number[][] = [];
    let at = 0;
    eachPreToken(text, this.split!, (p) => {
      if (wanted.has(at) && starts.length > 0) {
        const from = starts[Math.max(0, starts.length - 2)]!;
        const again = preTokenize(text.slice(from, at), this.split!);
        const had = pieces.slice(Math.max(0, pieces.length - 2));
        if (again.length === had.length && again.every((q, i) => q.length === had[i]!.length && q.every((c, j) => c === had[i]![j]))) {
          found.set(base + at, out.length);
        }
      }
      starts.push(at);
      pieces.push(p);
      if (pieces.length > 2) {
        starts.shift();
        pieces.shift();
      }
      for (const c of p) at += c > 0xffff ? 2 : 1;
      return this.encodeWord(p, out, limit);
    });
    return found;
  }
}
