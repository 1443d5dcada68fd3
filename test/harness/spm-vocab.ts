// A tiny SentencePiece vocabulary for tests, as GGUF metadata: control, unknown, user-defined and
// unused tokens, the 256 byte-fallback tokens, and scored pieces chosen to exercise llama.cpp's
// merge order (score first, then the leftmost pair), merges whose result is no token, and byte
// fallback. No chat template.
import { str, type GgufValue } from "./gguf-writer.ts";

const hex = (b: number): string => `<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`;

/** [text, token type, score] */
export const TINY_SPM_VOCAB: readonly [string, number, number][] = [
  ["<unk>", 2, 0],
  ["<s>", 3, 0],
  ["</s>", 3, 0],
  ["<ctl>", 3, 0],
  ["<user>", 4, 0],
  ["<unused0>", 5, 0],
  ...Array.from({ length: 256 }, (_, b): [string, number, number] => [hex(b), 6, 0]),
  ["▁", 1, -1],
  ["a", 1, -1],
  ["b", 1, -1],
  ["c", 1, -1],
  ["d", 1, -1],
  ["ab", 1, -2], // ties with "bc": the leftmost pair merges first
  ["bc", 1, -2],
  ["ca", 1, -1.5], // scores above "ab": merges first wherever it occurs
  ["▁a", 1, -2.5],
  ["▁▁", 1, -4],
  ["aa", 1, -5],
  ["dd", 1, -0.5],
  ["xyz", 1, -1], // unreachable: neither "xy" nor "yz" is a token
];

/** The vocabulary's GGUF keys; `addSpacePrefix` undefined leaves the key out (llama.cpp's default: true). */
export function tinySpmKv(addSpacePrefix?: boolean): Record<string, GgufValue> {
  const arr = (elem: "string" | "f32" | "i32", values: (string | number)[]): GgufValue => ({ type: "array", elem, values });
  return {
    "tokenizer.ggml.model": str("llama"),
    "tokenizer.ggml.tokens": arr(
      "string",
      TINY_SPM_VOCAB.map((v) => v[0]),
    ),
    "tokenizer.ggml.token_type": arr(
      "i32",
      TINY_SPM_VOCAB.map((v) => v[1]),
    ),
    "tokenizer.ggml.scores": arr(
      "f32",
      TINY_SPM_VOCAB.map((v) => v[2]),
    ),
    ...(addSpacePrefix === undefined ? {} : { "tokenizer.ggml.add_space_prefix": { type: "bool", value: addSpacePrefix } }),
  };
}
