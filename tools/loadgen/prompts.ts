// Prompts of a target token count, cut from the corpus with our tokenizer (the default model's
// GGUF, or --tokenizer). For chat requests the count includes the chat template the server
// applies (measured by rendering it the way services/runtime.ts encodePrompt does); for another
// server's model the counts are approximate, and the server's usage.prompt_tokens is recorded
// next to them.
import { encodeChat, needsBos } from "../../shared/inference/tokenizer/chat-encode.ts";
import { ChatTemplate, type ChatMessage } from "../../shared/inference/tokenizer/chat-template.ts";
import { GgufTokenizer } from "../../shared/inference/tokenizer/tokenizer.ts";
import { uniformInt, type Rng } from "../lib/random.ts";

export class PromptSource {
  readonly ids: number[];
  private readonly chat: ChatTemplate | undefined;

  constructor(
    readonly tokenizer: GgufTokenizer,
    corpus: string,
    chat?: ChatTemplate,
  ) {
    this.ids = tokenizer.encode(corpus);
    this.chat = chat;
  }

  static fromGguf(path: string, corpus: string): PromptSource {
    const tok = GgufTokenizer.fromGguf(path);
    let chat: ChatTemplate | undefined;
    try {
      chat = ChatTemplate.fromGguf(path, tok);
    } catch {
      chat = undefined; // completions only
    }
    return new PromptSource(tok, corpus, chat);
  }

  /** Tokens of a raw prompt as the server encodes it (user text: no control tokens; BOS added when the model asks). */
  textTokens(text: string): number {
    return needsBos(this.tokenizer, "").length + this.tokenizer.encode(text).length;
  }

  /** Tokens of a conversation rendered with the chat template (generation prompt included). */
  chatTokens(messages: ChatMessage[]): number {
    if (!this.chat) throw new Error("the tokenizer's model has no chat template: use --endpoint completions");
    return encodeChat(this.tokenizer, this.chat, messages).ids.length;
  }

  /** `n` consecutive corpus tokens from a random offset (the corpus wraps around). */
  slice(rng: Rng, n: number): number[] {
    const total = this.ids.length;
    const start = uniformInt(rng, 0, total - 1);
    const out: number[] = [];
    for (let i = 0; i < n; i++) out.push(this.ids[(start + i) % total]!);
    return out;
  }

  decode(ids: number[]): string {
    return this.tokenizer.decode(ids);
  }

  /**
   * Text whose measured size is as close to `target` as the corpus allows: `build(body)` wraps a
   * corpus cut of n tokens (question, template, ...), `measure` counts the whole prompt; n is
   * corrected from the first guess until it fits (re-tokenizing a cut can merge tokens at the
   * seams, so the count is measured, not assumed).
   */
  fit(rng: Rng, target: number, build: (body: string) => string, measure: (text: string) => number): { text: string; tokens: number } {
    const overhead = measure(build(""));
    if (overhead >= target) throw new Error(`a prompt of ${target} tokens is too short: the fixed part alone has ${overhead}`);
    const ids = this.slice(rng, target - overhead + 64);
    let n = target - overhead;
    let best = { text: build(""), tokens: overhead };
    for (let attempt = 0; attempt < 6; attempt++) {
      const text = build(this.decode(ids.slice(0, n)));
      const tokens = measure(text);
      if (Math.abs(tokens - target) < Math.abs(best.tokens - target) || (tokens === best.tokens && tokens <= target))
        best = { text, tokens };
      if (tokens === target) break;
      n = Math.max(1, Math.min(ids.length, n + (target - tokens)));
    }
    return best;
  }
}
