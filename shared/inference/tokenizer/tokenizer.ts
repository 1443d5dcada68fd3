/**
 * GPT-2 style byte-level BPE tokenizer built from GGUF metadata, matching llama.cpp's tokenizer
 * (`llama-vocab.cpp`) id for id.
 *
 * Pipeline (the same as llama.cpp's `tokenize(text, add_special, parse_special)`):
 *   1. split the text on special tokens (control/unknown tokens only when `parseSpecial`,
 *      user-defined tokens always), longest token first — llama.cpp's `tokenizer_st_partition`
 *      (`special-tokens.ts`);
 *   2. pre-tokenize each raw fragment: for the `smollm`/`starcoder`/… family every `\p{N}` code point
 *      is isolated first, then the GPT-2 split, ported from llama.cpp (`pre-tokenize.ts`);
 *   3. byte-level encode each piece (GPT-2 bytes→unicode table, `byte-level.ts`) and apply BPE
 *      merges by rank (`bpe.ts`, llama.cpp's merge order and tie-breaking).
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
import { eachPreToken, fromCodePoints, preTokenize, wellFormed } from "./pre-tokenize.ts";
import { findSpecialTokens, partitionOnSpecials, specialPartitionLists, type Fragment, type SpecialTokenIds } from "./special-tokens.ts";
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

const utf8 = new TextEncoder();
const EMPTY = new Uint8Array(0);

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
  private longestToken: number | undefined;

  private constructor(meta: GgufMetadata) {
    const { model, pre, digitsFirst, cleanSpaces, tokens, merges, types } = readVocab(meta);
    this.model = model;
    this.pre = pre;
    this.digitsFirst = digitsFirst;
    this.cleanSpaces = cleanSpaces;
    this.tokens = tokens;
    this.vocabSize = tokens.length;

    // text → id (later duplicates win, like llama.cpp's token_to_id map)
    this.tokenToId = new Map();
    for (let i = 0; i < tokens.length; i++) this.tokenToId.set(tokens[i]!, i);

    const { special, eog } = findSpecialTokens(meta, tokens, types, this.tokenToId); // may retype tokens
    this.eog = eog;
    this.types = types;

    const addBos = meta["tokenizer.ggml.add_bos_token"];
    const addEos = meta["tokenizer.ggml.add_eos_token"];
    this.addBos = typeof addBos === "boolean" ? addBos : false;
    this.addEos = typeof addEos === "boolean" ? addEos : false;

    const { all, user } = specialPartitionLists(tokens, types);
    this.specialAll = all;
    this.specialUser = user;

    this.bpe = new BytePairEncoder(tokens, merges);
    this.pieceCache = new Array(tokens.length);

    const nl = this.encode("\n");
    if (nl.length > 0) special.nl = nl[0]!;
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
        if (f.text !== undefined && prev?.text !== undefined) prev.text += f.text; // plain text runs on across parts
        else frags.push({ ...f, start });
        start += f.text?.length ?? this.tokens[f.id!]!.length;
      }
      at += part.text.length;
    }
    // Marks in offset order, walked once alongside the fragments.
    const order = marks.map((_, i) => i).sort((a, b) => marks[a]! - marks[b]!);
    let k = 0;
    for (const f of frags) {
      if (out.length > limit) break;
      const end = f.start + (f.text?.length ?? this.tokens[f.id!]!.length);
      for (; k < order.length && marks[order[k]!]! <= f.start; k++) if (marks[order[k]!] === f.start) markIds[order[k]!] = out.length;
      if (f.id !== undefined) {
        out.push(f.id);
        continue;
      }
      const inside: number[] = [];
      for (; k < order.length && marks[order[k]!]! < end; k++) inside.push(order[k]!);
      if (inside.length === 0) {
        this.encodeRaw(f.text!, out, limit);
        continue;
      }
      const found = this.encodeRawMarked(f.text!, f.start, inside.map((i) => marks[i]!), out, limit);
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

  /** The pre-tokenizer's pieces of plain text (no special-token handling); for inspection and tests. */
  preTokenize(text: string): string[] {
    return preTokenize(wellFormed(text), this.digitsFirst).map(fromCodePoints);
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

  private checkId(id: number): void {
    if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize) {
      throw new TokenizerError("invalid_token_id", `token id ${id} is out of range (vocabulary has ${this.vocabSize} tokens)`);
    }
  }

  /** Appends the ids of plain text to `out`, stopping once `out` holds more than `limit`. */
  private encodeRaw(text: string, out: number[], limit: number): void {
    eachPreToken(text, this.digitsFirst, (p) => {
      this.bpe.encodeWord(byteLevelEncode(fromCodePoints(p)), out);
      return out.length <= limit;
    });
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
    eachPreToken(text, this.digitsFirst, (p) => {
      if (wanted.has(at) && starts.length > 0) {
        const from = starts[Math.max(0, starts.length - 2)]!;
        const again = preTokenize(text.slice(from, at), this.digitsFirst);
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
      this.bpe.encodeWord(byteLevelEncode(fromCodePoints(p)), out);
      return out.length <= limit;
    });
    return found;
  }
}
