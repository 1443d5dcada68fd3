// What a service process holds: config, logger, the loaded model and engine, tokenizer and chat
// template, the registry database. `ctxbank serve` builds one and gives it to both services.
import path from "node:path";
import pino, { type DestinationStream, type Logger } from "pino";
import type { Config } from "../shared/platform/config.ts";
import { Engine, loadModel, type LoadedModel } from "../shared/inference/engine/engine.ts";
import { kvPool, readGgufMetadata } from "../shared/inference/engine/native.ts";
import { boundedError } from "../shared/platform/http/error-log.ts";
import { ApiError } from "../shared/platform/http/errors.ts";
import type { SloTargets } from "../shared/platform/metrics/slo.ts";
import { resolveModel } from "../shared/inference/model/resolve.ts";
import { openDatabase, type OpenedDatabase } from "../shared/platform/registry/db.ts";
import { Registry } from "../shared/platform/registry/registry.ts";
import { ChatTemplate, noChatTemplate, type ChatMessage } from "../shared/inference/tokenizer/chat-template.ts";
import { GgufTokenizer } from "../shared/inference/tokenizer/tokenizer.ts";
import type { PromptJob } from "../shared/inference/tokenizer/prompt-job.ts";
import { TokenizerPool } from "./tokenizer-pool.ts";

export interface Runtime {
  config: Config;
  log: Logger;
  modelPath: string;
  /** The id /v1/models lists: the GGUF file name without .gguf. */
  modelId: string;
  model: LoadedModel;
  engine: Engine;
  /** For detokenizing and the model's special ids; prompts are tokenized on `prompts`. */
  tokenizer: GgufTokenizer;
  chat: ChatTemplate | undefined;
  /** The tokenizer threads encodePrompt uses. */
  prompts: TokenizerPool;
  db: OpenedDatabase;
  registry: Registry;
  close(): Promise<void>;
}

/** The services' logger: errors are logged bounded and without SQL parameters (shared/platform/http/error-log.ts). */
export function createLogger(config: Pick<Config, "logLevel" | "role" | "instanceId">, destination?: DestinationStream): Logger {
  const options = { level: config.logLevel, base: { svc: config.role, instance: config.instanceId }, serializers: { err: boundedError } };
  return destination ? pino(options, destination) : pino(options);
}

export async function openRuntime(config: Config, log: Logger = createLogger(config)): Promise<Runtime> {
  const modelPath = await resolveModel(config.model !== undefined ? { path: config.model } : {});
  const model = await loadModel(modelPath);
  const engine = new Engine(model, { threads: config.threads, device: config.device, maxContext: config.maxContext });
  kvPool(config.kvPoolMib * 2 ** 20);
  if (engine.maxContext > model.config.nCtxTrain) {
    log.warn(
      { maxContext: engine.maxContext, trainedContext: model.config.nCtxTrain },
      "the context is longer than the model was trained for: positions past it give no meaningful answers",
    );
  }
  const meta = readGgufMetadata(modelPath);
  const tokenizer = GgufTokenizer.fromMetadata(meta);
  const chat = ChatTemplate.fromMetadataIfAny(meta, tokenizer);
  if (!chat) log.warn("the model has no chat template: chat requests will be refused");
  const prompts = new TokenizerPool(meta);
  // Services that tokenize start their thread while the database opens (a decode-only one never does).
  const threadReady = config.role === "decode" ? Promise.resolve() : prompts.ready();
  let db: OpenedDatabase | undefined;
  try {
    db = await openDatabase(config.databaseUrl, { timeoutMs: config.dbTimeoutMs });
    await threadReady;
  } catch (e) {
    await threadReady.catch((err: unknown) => log.warn({ err }, "the tokenizer thread failed to start too"));
    await prompts.close();
    await db?.close();
    throw e;
  }
  // Computed here (a pass over the vocabulary) rather than on the first request's event loop turn.
  const promptChars = maxPromptChars({ engine, tokenizer });
  log.info(
    {
      model: path.basename(modelPath),
      device: engine.info.deviceDescription,
      kernels: engine.info.kernels,
      threads: engine.info.threads,
      db: db.kind,
      maxPromptChars: promptChars,
    },
    "runtime ready",
  );
  return {
    config,
    log,
    modelPath,
    modelId: path.basename(modelPath).replace(/\.gguf$/i, ""),
    model,
    engine,
    tokenizer,
    chat,
    prompts,
    db,
    registry: new Registry(db.db),
    close: async () => {
      await prompts.close();
      await db.close();
    },
  };
}

/** The SLO targets the configuration sets. */
export function sloTargets(config: Pick<Config, "sloTtftMs" | "sloTpotMs" | "sloE2eMs">): SloTargets {
  return { ttftMs: config.sloTtftMs, tpotMs: config.sloTpotMs, e2eMs: config.sloE2eMs };
}

export type PromptInput = { prompt?: string | undefined; messages?: ChatMessage[] | undefined; prompt_token_ids?: number[] | undefined };

export interface EncodedPrompt {
  ids: number[];
  /** With `rounds`: the chat's round starts (null when they cannot be found; see encodeChat). */
  roundStarts?: number[] | null;
}

/**
 * The most characters a prompt may have: the context times the longest token's bytes. A longer
 * text cannot fit (each token covers at most that many bytes, and a UTF-16 unit is at least one
 * UTF-8 byte), so it is refused before any tokenizing. For SmolLM2: 8192 × 81 ≈ 660k characters.
 */
export function maxPromptChars(rt: Pick<Runtime, "engine" | "tokenizer">): number {
  return rt.engine.maxContext * rt.tokenizer.maxTokenBytes;
}

/**
 * Token ids of a prompt given as text, a conversation, or ids, with bounded work: sizes are
 * checked before tokenizing (400 context_length_exceeded), tokenizing runs on the tokenizer threads
 * and stops just past the context, user text never yields control tokens. 400 when it cannot be
 * encoded, 400 no_chat_template for a conversation when the model has no chat template (Gemma 3
 * 270M base: it serves plain completions only). `rounds`: also find a chat's Round Attention rounds
 * (in the same pass).
 */
export async function encodePrompt(
  rt: Pick<Runtime, "tokenizer" | "prompts" | "model" | "engine" | "chat">,
  input: PromptInput,
  opts: { rounds?: boolean; tenant?: string; signal?: AbortSignal } = {},
): Promise<EncodedPrompt> {
  const maxContext = rt.engine.maxContext;
  if (input.messages !== undefined && rt.chat === undefined) throw noChatTemplate();
  checkPromptSize(rt, input);
  if (input.prompt_token_ids !== undefined) {
    checkTokenIds(input.prompt_token_ids, rt.model.config.nVocab, "prompt_token_ids");
    return { ids: input.prompt_token_ids };
  }
  const job: PromptJob =
    input.messages !== undefined
      ? { kind: "chat", messages: input.messages, maxTokens: maxContext, ...(opts.rounds ? { rounds: true } : {}) }
      : { kind: "text", text: input.prompt ?? "", maxTokens: maxContext };
  const result = await rt.prompts.run(job, opts.tenant, opts.signal);
  if (!result.ok) throw new ApiError(400, "invalid_request", result.message, result.param);
  const param = input.messages !== undefined ? "messages" : "prompt";
  if (result.ids.length > maxContext) tooLong(`the prompt has more than ${maxContext} tokens, the model's context`, param);
  if (result.ids.length === 0) throw new ApiError(400, "invalid_request", "the prompt is empty after tokenization", param);
  return result.roundStarts === undefined ? { ids: result.ids } : { ids: result.ids, roundStarts: result.roundStarts };
}

/** 400 context_length_exceeded, before any tokenizing, when the prompt's size alone shows it cannot fit the context. */
export function checkPromptSize(rt: Pick<Runtime, "tokenizer" | "engine">, input: PromptInput): void {
  const maxContext = rt.engine.maxContext;
  if (input.prompt_token_ids !== undefined) {
    const n = input.prompt_token_ids.length;
    if (n >= maxContext) tooLong(`the prompt has ${n} tokens; the model's context is ${maxContext} tokens`, "prompt_token_ids");
    return;
  }
  const maxChars = maxPromptChars(rt);
  const limit = `at most ${maxChars} characters fit the model's context of ${maxContext} tokens`;
  if (input.messages !== undefined) {
    // Every message takes at least one token of the template.
    const n = input.messages.length;
    if (n > maxContext) tooLong(`${n} messages cannot fit the model's context of ${maxContext} tokens`, "messages");
    let chars = 0;
    for (const m of input.messages) chars += typeof m?.content === "string" ? m.content.length : 0;
    if (chars > maxChars) tooLong(`the messages have ${chars} characters; ${limit}`, "messages");
    return;
  }
  const n = input.prompt?.length ?? 0;
  if (n > maxChars) tooLong(`the prompt has ${n} characters; ${limit}`, "prompt");
}

function tooLong(message: string, param: string): never {
  throw new ApiError(400, "context_length_exceeded", message, param);
}

/** 400 naming `param` (e.g. "handle.first_token") when an id is not in the model's vocabulary. */
export function checkTokenIds(ids: readonly number[], nVocab: number, param: string): void {
  for (let i = 0; i < ids.length; i++) {
    const t = ids[i]!;
    if (!Number.isInteger(t) || t < 0 || t >= nVocab) {
      throw new ApiError(400, "invalid_request", `${param}[${i}] = ${t} is not a token id in [0, ${nVocab})`, param);
    }
  }
}

/** Tokens a decode request without max_tokens may generate (shared/inference/defaults.ts). */
export { defaultMaxTokens } from "../shared/inference/defaults.ts";

/** 413 when the prompt leaves no room to generate; 400 when prompt + max tokens exceed the context. */
export function checkContext(maxContext: number, promptTokens: number, maxTokens: number | undefined): void {
  if (promptTokens >= maxContext) {
    throw new ApiError(
      400,
      "context_length_exceeded",
      `the prompt has ${promptTokens} tokens; the model's context is ${maxContext} tokens`,
      "prompt",
    );
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
