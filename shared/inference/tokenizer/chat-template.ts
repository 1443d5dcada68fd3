/**
 * Chat prompt rendering from the GGUF's own Jinja template (`tokenizer.chat_template`), with
 * `@huggingface/jinja` — the same engine node-llama-cpp tries first. The rendered prompt contains
 * control tokens as text (`<|im_start|>`…), so tokenize it with `{ parseSpecial: true }`.
 */
import { CtxbankError } from "../errors.ts";
import { Template } from "@huggingface/jinja";
import { readGgufMetadata } from "../engine/native.ts";
import type { GgufMetadata, GgufTokenizer } from "./tokenizer.ts";

export const CHAT_ROLES = ["system", "user", "assistant"] as const;
export type ChatRole = (typeof CHAT_ROLES)[number];

export interface ChatMessage {
  role: ChatRole;
  content: string;
}

export const CHAT_TEMPLATE_ERROR_CODES = [
  "no_chat_template", // the model has no chat template
  "invalid_messages", // the messages are not a non-empty array of { role, content }
  "chat_template_syntax", // the model's template does not parse
  "chat_template_failed", // the template refused the messages (raise_exception) or failed rendering them
] as const;
export type ChatTemplateErrorCode = (typeof CHAT_TEMPLATE_ERROR_CODES)[number];

export class ChatTemplateError extends CtxbankError<ChatTemplateErrorCode> {
  static override readonly codes = CHAT_TEMPLATE_ERROR_CODES;
  override readonly name = "ChatTemplateError";
  constructor(code: ChatTemplateErrorCode, message: string, options?: { cause?: unknown }) {
    super(code, message, { ...options, param: code === "invalid_messages" || code === "no_chat_template" ? "messages" : null });
  }
}

/** The error a conversation gets from a model without a chat template (HTTP 400 no_chat_template). */
export function noChatTemplate(): ChatTemplateError {
  return new ChatTemplateError(
    "no_chat_template",
    "this model has no chat template (GGUF key tokenizer.chat_template is missing); use plain completions " +
      "(/v1/completions) or a model with a chat template",
  );
}

/**
 * Check that `input` is a non-empty array of `{ role, content }` with role system/user/assistant
 * and string content; returns clean copies (other fields dropped). Errors name the offending index.
 */
export function validateMessages(input: unknown): ChatMessage[] {
  if (!Array.isArray(input)) {
    throw new ChatTemplateError("invalid_messages", `messages must be an array of { role, content } objects (got ${typeOf(input)})`);
  }
  if (input.length === 0) throw new ChatTemplateError("invalid_messages", "messages must contain at least one message");
  return input.map((m: unknown, i) => {
    if (m === null || typeof m !== "object" || Array.isArray(m)) {
      throw new ChatTemplateError("invalid_messages", `messages[${i}] must be an object with role and content (got ${typeOf(m)})`);
    }
    const { role, content } = m as { role?: unknown; content?: unknown };
    if (typeof role !== "string" || !(CHAT_ROLES as readonly string[]).includes(role)) {
      throw new ChatTemplateError(
        "invalid_messages",
        `messages[${i}].role must be one of ${CHAT_ROLES.join(", ")} (got ${typeof role === "string" ? JSON.stringify(role) : typeOf(role)})`,
      );
    }
    if (typeof content !== "string") {
      throw new ChatTemplateError("invalid_messages", `messages[${i}].content must be a string (got ${typeOf(content)})`);
    }
    return { role: role as ChatRole, content };
  });
}

export interface RenderOptions {
  /** Append the assistant turn header so the model answers (default true). */
  addGenerationPrompt?: boolean;
  /** Extra template variables (e.g. `tools`), passed through as-is. */
  variables?: Readonly<Record<string, unknown>>;
}

export class ChatTemplate {
  readonly source: string;
  readonly bosToken: string;
  readonly eosToken: string;
  private readonly template: Template;

  constructor(source: string, tokens: { bosToken?: string; eosToken?: string } = {}) {
    this.source = source;
    this.bosToken = tokens.bosToken ?? "";
    this.eosToken = tokens.eosToken ?? "";
    try {
      this.template = new Template(source);
    } catch (e) {
      throw new ChatTemplateError(
        "chat_template_syntax",
        `the model's chat template (tokenizer.chat_template) cannot be parsed: ${(e as Error).message}`,
        { cause: e },
      );
    }
  }

  /**
   * The template stored in the GGUF. `tokenizer` supplies the bos/eos token texts; without it they
   * are read from `tokenizer.ggml.tokens` and the bos/eos ids.
   */
  /** The model's chat template, or undefined when it has none (any other fault still throws). */
  static fromMetadataIfAny(meta: GgufMetadata, tokenizer?: GgufTokenizer): ChatTemplate | undefined {
    try {
      return ChatTemplate.fromMetadata(meta, tokenizer);
    } catch (e) {
      if (e instanceof ChatTemplateError && e.code === "no_chat_template") return undefined;
      throw e;
    }
  }

  static fromMetadata(meta: GgufMetadata, tokenizer?: GgufTokenizer): ChatTemplate {
    const src = meta["tokenizer.chat_template"];
    if (typeof src !== "string" || src.trim() === "") throw noChatTemplate();
    const text = (id: number | undefined): string | undefined => {
      if (id === undefined) return undefined;
      if (tokenizer) return tokenizer.tokenText(id);
      const toks = meta["tokenizer.ggml.tokens"];
      return Array.isArray(toks) && typeof toks[id] === "string" ? toks[id] : undefined;
    };
    const id = (key: string): number | undefined => {
      const v = meta[key];
      return typeof v === "number" ? v : typeof v === "bigint" ? Number(v) : undefined;
    };
    const bos = tokenizer ? tokenizer.special.bos : id("tokenizer.ggml.bos_token_id");
    const eos = tokenizer ? tokenizer.special.eos : id("tokenizer.ggml.eos_token_id");
    const toks: { bosToken?: string; eosToken?: string } = {};
    const b = text(bos);
    const e = text(eos);
    if (b !== undefined) toks.bosToken = b;
    if (e !== undefined) toks.eosToken = e;
    return new ChatTemplate(src, toks);
  }

  /** Read the template from a GGUF file (metadata via the native addon). */
  static fromGguf(path: string, tokenizer?: GgufTokenizer): ChatTemplate {
    return ChatTemplate.fromMetadata(readGgufMetadata(path), tokenizer);
  }

  /** Validate `messages` and render the prompt text. */
  render(messages: unknown, opts: RenderOptions = {}): string {
    const msgs = validateMessages(messages);
    try {
      return this.template.render({
        ...(opts.variables ?? {}),
        messages: msgs,
        add_generation_prompt: opts.addGenerationPrompt ?? true,
        bos_token: this.bosToken,
        eos_token: this.eosToken,
      });
    } catch (e) {
      throw new ChatTemplateError("chat_template_failed", `the model's chat template failed to render: ${(e as Error).message}`, {
        cause: e,
      });
    }
  }
}

function typeOf(v: unknown): string {
  return v === null ? "null" : Array.isArray(v) ? "array" : typeof v;
}
