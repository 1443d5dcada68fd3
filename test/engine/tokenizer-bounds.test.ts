// The tokenizer's work is bounded by the context it fills, not by the text: a word that cannot fit
// what is left of `maxTokens` is refused without merging it (merging a 2 MB word took ~2 s of a
// tokenizer thread), and every text that fits encodes exactly as without a limit.
import { beforeAll, describe, expect, it } from "vitest";
import { readGgufMetadata } from "../../shared/inference/engine/native.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { GgufTokenizer } from "../../shared/inference/tokenizer/tokenizer.ts";

let tok: GgufTokenizer;
beforeAll(async () => {
  tok = GgufTokenizer.fromMetadata(readGgufMetadata(await resolveModel()));
});

describe("encoding under a token limit", () => {
  it("refuses a word longer than the context at once, with more than maxTokens ids", () => {
    const word = "€".repeat(663_000); // one pre-token piece of ~2 MB
    const t0 = performance.now();
    const ids = tok.encode(word, { maxTokens: 8192 });
    const ms = performance.now() - t0;
    expect(ids.length).toBe(8193);
    // A word that could fit by its length is still merged exactly.
    expect(tok.encode("€".repeat(300), { maxTokens: 8192 })).toEqual(tok.encode("€".repeat(300)));
    console.log(`663k-character word refused in ${ms.toFixed(1)} ms`);
  });

  it("encodes a text that fits exactly as without a limit, and one that does not to maxTokens + 1 ids", () => {
    for (const text of ["Hello world ".repeat(2000), `${"a".repeat(50)} `.repeat(300), `x ${"€".repeat(4000)}`]) {
      const all = tok.encode(text);
      for (const limit of [1, 10, all.length - 1, all.length, all.length + 5]) {
        const ids = tok.encode(text, { maxTokens: limit });
        if (all.length <= limit) expect(ids).toEqual(all);
        else expect(ids.length).toBe(limit + 1);
      }
    }
  });
});
