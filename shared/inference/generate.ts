/**
 * The generation loop shared by the CLI and the services: prefill a prompt into a fresh sequence,
 * then sample → yield → decode until an end-of-generation token, the token limit, or a stop string.
 *
 * `generate()` validates its arguments synchronously (a bad request throws `GenerateError` before
 * any work starts) and returns an async generator of events:
 *   - one `token` event per sampled token (the EOG token included), whose `text` is the newly
 *     printable text: complete UTF-8 only, with anything that could be the start of a stop string
 *     held back until it is resolved. Concatenating every `text` gives exactly the output;
 *   - one final `done` event with the finish reason and timings.
 * Aborting the signal makes the generator throw `signal.reason` (an AbortError) at the next step
 * boundary: between prefill chunks (one ubatch each) or decode steps.
 */
import { CtxbankError } from "./errors.ts";
import type { Engine, NativeSequence } from "./engine/engine.ts";
import { Sampler, SamplingError, validateSampling, type SamplingOptions } from "./engine/sampler.ts";
import { StopStringFilter } from "./stop-strings.ts";
import { TokenTextStream, type FinishReason } from "./text-stream.ts";
import type { GgufTokenizer } from "./tokenizer/tokenizer.ts";

export type { FinishReason };
export { StopStringFilter };

export interface GenerateOptions extends SamplingOptions {
  /** Most tokens to generate (EOG included); default: whatever is left of the engine's context. */
  maxTokens?: number;
  /** Stop as soon as the output contains one of these; the output ends right before it. */
  stop?: readonly string[];
  signal?: AbortSignal;
}

export interface TokenEvent {
  type: "token";
  id: number;
  /** Newly printable text (may be empty). */
  text: string;
  /** 0-based position among the generated tokens. */
  index: number;
  /** Engine + sampling time for this token (the first one includes the prefill). */
  ms: number;
}

export interface GenerateSummary {
  finishReason: FinishReason;
  promptTokens: number;
  generatedTokens: number;
  prefillMs: number;
  /** Time spent in decode steps (each: one forward pass + sampling). */
  decodeMs: number;
  /** Decode steps run: generated tokens minus the first one, which comes from the prefill. */
  decodeSteps: number;
  prefillTokPerS: number;
  /** 0 when there was no decode step. */
  decodeMsPerToken: number;
  decodeTokPerS: number;
  /** Time to first token: prefill plus the first sample. */
  ttftMs: number;
}

export interface DoneEvent extends GenerateSummary {
  type: "done";
}

export type GenerateEvent = TokenEvent | DoneEvent;

export const GENERATE_ERROR_CODES = ["empty_prompt", "invalid_prompt", "invalid_request", "context_length_exceeded"] as const;
export type GenerateErrorCode = (typeof GENERATE_ERROR_CODES)[number];

export class GenerateError extends CtxbankError<GenerateErrorCode> {
  static override readonly codes = GENERATE_ERROR_CODES;
  override readonly name = "GenerateError";
}

type Detokenizer = Pick<GgufTokenizer, "createDetokenizer" | "isEog">;

export function generate(
  engine: Engine,
  tokenizer: Detokenizer,
  prompt: ArrayLike<number>,
  options: GenerateOptions = {},
): AsyncGenerator<GenerateEvent, void, undefined> {
  const nVocab = engine.model.config.nVocab;
  if (prompt.length === 0) throw new GenerateError("empty_prompt", "the prompt is empty (it needs at least one token)");
  const tokens = Int32Array.from(prompt);
  for (let i = 0; i < tokens.length; i++) {
    if (tokens[i] !== prompt[i] || tokens[i]! < 0 || tokens[i]! >= nVocab)
      throw new GenerateError("invalid_prompt", `prompt token ${i} (${prompt[i]}) is not a token id in [0, ${nVocab})`);
  }
  const room = engine.maxContext - tokens.length;
  if (room < 1) {
    throw new GenerateError(
      "context_length_exceeded",
      `the prompt has ${tokens.length} tokens, which leaves no room to generate in the context of ${engine.maxContext} tokens`,
    );
  }
  const maxTokens = options.maxTokens ?? room;
  if (!Number.isInteger(maxTokens) || maxTokens < 1)
    throw new GenerateError("invalid_request", `max tokens must be a positive integer (got ${maxTokens})`, { param: "max_tokens" });
  if (maxTokens > room) {
    throw new GenerateError(
      "context_length_exceeded",
      `prompt (${tokens.length} tokens) + max tokens (${maxTokens}) = ${tokens.length + maxTokens} exceeds the context ` +
        `of ${engine.maxContext} tokens; use at most ${room} max tokens or a shorter prompt`,
    );
  }
  const stop = options.stop ?? [];
  if (!Array.isArray(stop) || !stop.every((s) => typeof s === "string" && s.length > 0))
    throw new GenerateError("invalid_request", "stop must be a list of non-empty strings", { param: "stop" });
  const text = new TokenTextStream(tokenizer, maxTokens, stop);
  let sampler: Sampler;
  try {
    sampler = new Sampler(validateSampling(options));
  } catch (e) {
    if (e instanceof SamplingError) throw new GenerateError("invalid_request", e.message, { param: e.param, cause: e });
    throw e;
  }
  return run(engine, tokens, sampler, text, options.signal);
}

async function* run(
  engine: Engine,
  prompt: Int32Array,
  sampler: Sampler,
  text: TokenTextStream,
  signal: AbortSignal | undefined,
): AsyncGenerator<GenerateEvent, void, undefined> {
  signal?.throwIfAborted();
  const t0 = performance.now();
  // The only resource this call owns; dropped (and collected) when the generator ends.
  const seq: NativeSequence = engine.createSequence(prompt.length + text.maxTokens);
  const chunk = Math.max(1, engine.ubatch);
  let logits!: Float32Array;
  for (let i = 0; i < prompt.length; i += chunk) {
    logits = await engine.prefill(seq, prompt.subarray(i, i + chunk));
    signal?.throwIfAborted();
  }
  const prefillMs = performance.now() - t0;

  let stepStart = t0;
  let ttftMs = 0;
  let decodeMs = 0;
  for (;;) {
    const id = sampler.sample(logits);
    const ms = performance.now() - stepStart;
    if (text.count === 0) ttftMs = ms;
    else decodeMs += ms;
    const { text: piece, finish } = text.push(id);
    const generated = text.count;
    yield { type: "token", id, text: piece, index: generated - 1, ms };

    if (finish) {
      const decodeSteps = generated - 1;
      yield {
        type: "done",
        finishReason: finish,
        promptTokens: prompt.length,
        generatedTokens: generated,
        prefillMs,
        decodeMs,
        decodeSteps,
        prefillTokPerS: prompt.length / (prefillMs / 1000),
        decodeMsPerToken: decodeSteps > 0 ? decodeMs / decodeSteps : 0,
        decodeTokPerS: decodeSteps > 0 ? decodeSteps / (decodeMs / 1000) : 0,
        ttftMs,
      };
      return;
    }
    signal?.throwIfAborted();
    stepStart = performance.now();
    [logits] = (await engine.decode([seq], [id])) as [Float32Array];
    signal?.throwIfAborted();
  }
}
