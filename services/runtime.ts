// What a service process holds: config, logger, the loaded model and engine, tokenizer and chat
// template, the registry database. `ctxbank serve` builds one and gives it to both services.
import path from "node:path";
import pino, { type Logger } from "pino";
import type { Config } from "../shared/config.ts";
import { Engine, loadModel, type LoadedModel } from "../shared/engine/engine.ts";
import { ApiError } from "../shared/http/errors.ts";
import type { SloTargets } from "../shared/metrics/slo.ts";
import { resolveModel } from "../shared/model/resolve.ts";
import { openDatabase, type OpenedDatabase } from "../shared/registry/db.ts";
import { Registry } from "../shared/registry/registry.ts";
import { ChatTemplate, ChatTemplateError, type ChatMessage } from "../shared/tokenizer/chat-template.ts";
import { GgufTokenizer } from "../shared/tokenizer/tokenizer.ts";

export interface Runtime {
  config: Config;
  log: Logger;
  modelPath: string;
  /** The id /v1/models lists: the GGUF file name without .gguf. */
  modelId: string;
  model: LoadedModel;
  engine: Engine;
  tokenizer: GgufTokenizer;
  chat: ChatTemplate | undefined;
  db: OpenedDatabase;
  registry: Registry;
  close(): Promise<void>;
}

export function createLogger(config: Pick<Config, "logLevel" | "role" | "instanceId">): Logger {
  return pino({ level: config.logLevel, base: { svc: config.role, instance: config.instanceId } });
}

export async function openRuntime(config: Config, log: Logger = createLogger(config)): Promise<Runtime> {
  const modelPath = await resolveModel(config.model !== undefined ? { path: config.model } : {});
  const model = await loadModel(modelPath);
  const engine = new Engine(model, { threads: config.threads, device: config.device });
  const tokenizer = GgufTokenizer.fromGguf(modelPath);
  let chat: ChatTemplate | undefined;
  try {
    chat = ChatTemplate.fromGguf(modelPath, tokenizer);
  } catch (e) {
    if (!(e instanceof ChatTemplateError && e.code === "NO_TEMPLATE")) throw e;
    log.warn("the model has no chat template: chat requests will be refused");
  }
  const db = await openDatabase(config.databaseUrl);
  log.info({ model: path.basename(modelPath), device: engine.native.info.deviceDescription, kernels: engine.native.info.kernels, threads: engine.native.info.threads, db: db.kind }, "runtime ready");
  return {
    config,
    log,
    modelPath,
    modelId: path.basename(modelPath).replace(/\.gguf$/i, ""),
    model,
    engine,
    tokenizer,
    chat,
    db,
    registry: new Registry(db.db),
    close: () => db.close(),
  };
}

/** The SLO targets the configuration sets. */
export function sloTargets(config: Pick<Config, "sloTtftMs" | "sloTpotMs" | "sloE2eMs">): SloTargets {
  return { ttftMs: config.sloTtftMs, tpotMs: config.sloTpotMs, e2eMs: config.sloE2eMs };
}

export type PromptInput = { prompt?: string | undefined; messages?: ChatMessage[] | undefined; prompt_token_ids?: number[] | undefined };

/** Token ids of a prompt given as text, a conversation, or ids; 400 when it cannot be. */
export function encodePrompt(rt: Pick<Runtime, "tokenizer" | "chat" | "model">, input: PromptInput, render: { addGenerationPrompt?: boolean } = {}): number[] {
  const tok = rt.tokenizer;
  if (input.prompt_token_ids !== undefined) {
    const nVocab = rt.model.config.nVocab;
    const bad = input.prompt_token_ids.findIndex((t) => t >= nVocab);
    if (bad >= 0) throw new ApiError(400, "invalid_request", `prompt_token_ids[${bad}] = ${input.prompt_token_ids[bad]} is not a token id in [0, ${nVocab})`, "prompt_token_ids");
    return input.prompt_token_ids;
  }
  let text: string;
  if (input.messages !== undefined) {
    if (!rt.chat) throw new ApiError(400, "invalid_request", "this model has no chat template; send a plain prompt instead", "messages");
    try {
      text = rt.chat.render(input.messages, render);
    } catch (e) {
      throw new ApiError(400, "invalid_request", (e as Error).message, "messages");
    }
  } else {
    text = input.prompt ?? "";
  }
  const bos = tok.special.bos;
  const addBos = tok.addBos && bos !== undefined && !text.startsWith(tok.tokenText(bos));
  // Control tokens written as text (<|im_start|>…) are parsed, as the CLI and llama.cpp's server do.
  const ids = [...(addBos ? [bos!] : []), ...tok.encode(text, { parseSpecial: true })];
  if (ids.length === 0) throw new ApiError(400, "invalid_request", "the prompt is empty after tokenization", "prompt");
  return ids;
}

/** Tokens a decode request without max_tokens may generate: 256, or what the context leaves. */
export const DEFAULT_MAX_TOKENS = 256;
export function defaultMaxTokens(maxContext: number, promptTokens: number): number {
  return Math.max(1, Math.min(DEFAULT_MAX_TOKENS, maxContext - promptTokens));
}

/** 413 when the prompt leaves no room to generate; 400 when prompt + max tokens exceed the context. */
export function checkContext(maxContext: number, promptTokens: number, maxTokens: number | undefined): void {
  if (promptTokens >= maxContext) {
    throw new ApiError(413, "context_length_exceeded", `the prompt has ${promptTokens} tokens; the model's context is ${maxContext} tokens`, "prompt");
  }
  if (maxTokens !== undefined && promptTokens + maxTokens > maxContext) {
    throw new ApiError(
      400,
      "context_length_exceeded",
      `prompt (${promptTokens} tokens) + max_tokens (${maxTokens}) exceeds the context of ${maxContext} tokens; use at most ${maxContext - promptTokens} max_tokens`,
      "max_tokens",
    );
  }
}
