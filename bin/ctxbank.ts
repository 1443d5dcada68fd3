#!/usr/bin/env -S npx tsx
// ctxbank command line: `generate` runs one prompt (or a chat REPL with --interactive) on the
// local engine and streams the text to stdout; statistics go to stderr. `serve`, `prefill`,
// `decode` and `router` run the HTTP services (bin/serve.ts); `models` lists the models --model can name.
import { availableParallelism } from "node:os";
import { createInterface } from "node:readline";
import { parseArgs } from "node:util";

import { defaultMaxTokens, MAX_TOKENS_DEFAULTS, SAMPLING_DEFAULTS } from "../shared/inference/defaults.ts";
import { Engine, loadModel, type EngineDevice } from "../shared/inference/engine/engine.ts";
import { DEVICE_PATTERN } from "../shared/inference/engine/native.ts";
import { SamplingError, validateSampling, type SamplingOptions } from "../shared/inference/engine/sampler.ts";
import { generate, GenerateError, type DoneEvent } from "../shared/inference/generate.ts";
import { MODEL_CATALOGUE } from "../shared/inference/model/catalogue.ts";
import { resolveModel } from "../shared/inference/model/resolve.ts";
import { ChatTemplate, ChatTemplateError, validateMessages, type ChatMessage } from "../shared/inference/tokenizer/chat-template.ts";
import { GgufTokenizer } from "../shared/inference/tokenizer/tokenizer.ts";
import { UsageError } from "../shared/inference/errors.ts";
import { keysCommand } from "./keys.ts";
import { modelsCommand } from "./models.ts";
import { SERVICE_COMMANDS, serviceCommand } from "./serve.ts";

const USAGE = `Usage: ctxbank generate [options]
       ctxbank serve | prefill | decode | router [options]   (the HTTP services; see ctxbank serve --help)
       ctxbank keys new <id>                        (an API key for the services; see ctxbank keys --help)
       ctxbank models [--json] [--verify]           (the models --model can name, and what is cached)

Prompt (one of):
  --prompt TEXT          a user message (wrapped in the model's chat template unless --raw)
  --user TEXT            the same as --prompt; may be combined with --system
  --system TEXT          a system message (with --prompt/--user, or for --interactive)
  --chat JSON            a whole conversation: [{"role":"user","content":"..."}, ...]
  --interactive          chat on stdin/stdout; /reset forgets the conversation, /exit or EOF quits
  --raw                  feed --prompt to the model as-is (no chat template)

Generation:
  --max-tokens N         most tokens to generate (default ${MAX_TOKENS_DEFAULTS.generate}, less if the context is short)
  --temperature T        0 = greedy (default ${SAMPLING_DEFAULTS.cli.temperature})
  --top-k K              (default ${SAMPLING_DEFAULTS.cli.topK}; 0 = off)
  --top-p P              (default ${SAMPLING_DEFAULTS.cli.topP})
  --seed S               sampling seed (default random)
  --stop STR             stop before this text; repeatable

Engine:
  --model NAME|PATH      a model name (ctxbank models lists them; downloaded once) or a GGUF file
                         (default: $CTXBANK_MODEL, else ${MODEL_CATALOGUE.defaultModel})
  --threads N            compute threads (default ${availableParallelism()})
  --device D             cpu | cuda | cuda:N | auto (default: $CTXBANK_DEVICE, else cpu)

  -h, --help             show this help
`;

const OPTIONS = {
  model: { type: "string" },
  prompt: { type: "string" },
  user: { type: "string" },
  system: { type: "string" },
  chat: { type: "string" },
  interactive: { type: "boolean" },
  raw: { type: "boolean" },
  "max-tokens": { type: "string" },
  temperature: { type: "string" },
  "top-k": { type: "string" },
  "top-p": { type: "string" },
  seed: { type: "string" },
  stop: { type: "string", multiple: true },
  threads: { type: "string" },
  device: { type: "string" },
  help: { type: "boolean", short: "h" },
} as const;

type Flags = ReturnType<typeof parse>["values"];

function parse(argv: string[]) {
  try {
    return parseArgs({ args: argv, options: OPTIONS, allowPositionals: true, strict: true });
  } catch (e) {
    throw new UsageError((e as Error).message.split(/\.\s/)[0]!.replace(/^Unknown option/, "unknown option"));
  }
}

function deviceFrom(flag: string | undefined, env: string | undefined): EngineDevice {
  const value = flag ?? (env === "" ? undefined : env) ?? "cpu";
  if (!DEVICE_PATTERN.test(value))
    throw new UsageError(
      `${flag !== undefined ? "--device" : "$CTXBANK_DEVICE"} must be cpu, cuda, cuda:N or auto (got ${JSON.stringify(value)})`,
    );
  return value as EngineDevice;
}

function number(flag: string, value: string | undefined, integer: boolean, min: number, max = Infinity): number | undefined {
  if (value === undefined) return undefined;
  const n = value.trim() === "" ? NaN : Number(value);
  if (!Number.isFinite(n) || (integer && !Number.isInteger(n)) || n < min || n > max) {
    const kind = integer ? "an integer" : "a number";
    throw new UsageError(`--${flag} must be ${kind} in [${min}, ${max === Infinity ? "∞" : max}] (got ${JSON.stringify(value)})`);
  }
  return n;
}

function samplingFrom(f: Flags): SamplingOptions {
  const opts: SamplingOptions = {
    temperature: number("temperature", f.temperature, false, 0) ?? SAMPLING_DEFAULTS.cli.temperature,
    topK: number("top-k", f["top-k"], true, 0) ?? SAMPLING_DEFAULTS.cli.topK,
    topP: number("top-p", f["top-p"], false, 0) ?? SAMPLING_DEFAULTS.cli.topP,
  };
  const seed = number("seed", f.seed, true, 0);
  if (seed !== undefined) opts.seed = seed;
  try {
    return validateSampling(opts); // fixes the seed, so it can be reported
  } catch (e) {
    if (e instanceof SamplingError) throw new UsageError("--" + e.message.replace(/^top_([kp])/, "top-$1"));
    throw e;
  }
}

/** The conversation a one-shot run starts from (undefined with --raw). */
function messagesFrom(f: Flags): ChatMessage[] | undefined {
  const text = f.prompt ?? f.user;
  if (f.prompt !== undefined && f.user !== undefined) throw new UsageError("use --prompt or --user, not both");
  if (f.chat !== undefined) {
    if (text !== undefined || f.system !== undefined) throw new UsageError("--chat cannot be combined with --prompt, --user or --system");
    if (f.raw) throw new UsageError("--raw needs --prompt, not --chat");
    let parsed: unknown;
    try {
      parsed = JSON.parse(f.chat);
    } catch (e) {
      throw new UsageError(`--chat is not valid JSON: ${(e as Error).message}`);
    }
    try {
      return validateMessages(parsed);
    } catch (e) {
      throw new UsageError(`--chat: ${(e as Error).message}`);
    }
  }
  if (text === undefined) throw new UsageError("generate needs --prompt, --user, --chat or --interactive");
  if (f.raw) {
    if (f.system !== undefined) throw new UsageError("--raw cannot be combined with --system");
    return undefined;
  }
  return [...(f.system !== undefined ? [{ role: "system" as const, content: f.system }] : []), { role: "user", content: text }];
}

interface Session {
  engine: Engine;
  tok: GgufTokenizer;
  path: string;
  sampling: SamplingOptions;
  maxTokens: number | undefined;
  stop: string[];
}

// The CLI's prompts come from the local user running it, so control tokens written in them
// (`<|im_start|>`…) are parsed, as llama.cpp's CLI does; the services never parse them in user text.
function withBos(tok: GgufTokenizer, text: string): number[] {
  const bos = tok.special.bos;
  const add = tok.addBos && bos !== undefined && !text.startsWith(tok.tokenText(bos));
  return [...(add ? [bos!] : []), ...tok.encode(text, { parseSpecial: true })];
}

function chatTemplate(s: Session): ChatTemplate {
  try {
    return ChatTemplate.fromGguf(s.path, s.tok);
  } catch (e) {
    if (e instanceof ChatTemplateError && e.code === "no_chat_template") throw new Error("this model has no chat template; use --raw");
    throw e;
  }
}

/** Streams one generation to stdout; returns the text and the summary. */
async function streamOnce(s: Session, prompt: number[], signal?: AbortSignal): Promise<{ text: string; done: DoneEvent }> {
  const maxTokens = s.maxTokens ?? defaultMaxTokens(s.engine.maxContext, prompt.length);
  let text = "";
  let done: DoneEvent | undefined;
  for await (const ev of generate(s.engine, s.tok, prompt, { ...s.sampling, maxTokens, stop: s.stop, signal })) {
    if (ev.type === "done") done = ev;
    else if (ev.text) {
      process.stdout.write(ev.text);
      text += ev.text;
    }
  }
  return { text, done: done! };
}

function statsLine(d: DoneEvent, seed: number | undefined): string {
  const f = (x: number, digits = 1) => x.toFixed(digits);
  const decode = d.decodeSteps > 0 ? `${f(d.decodeMsPerToken, 2)} ms/token, ${f(d.decodeTokPerS)} tok/s` : "no decode steps";
  return (
    `prompt: ${d.promptTokens} tokens, ${f(d.prefillTokPerS)} tok/s prefill | ` +
    `generated: ${d.generatedTokens} tokens, ${decode} | ttft ${f(d.ttftMs, 0)} ms | finish: ${d.finishReason}` +
    (seed !== undefined ? ` | seed ${seed}` : "")
  );
}

async function interactive(s: Session, system: string | undefined): Promise<void> {
  const tmpl = chatTemplate(s);
  const tty = process.stdin.isTTY === true;
  const start = (): ChatMessage[] => (system !== undefined ? [{ role: "system", content: system }] : []);
  let messages = start();
  const rl = createInterface({ input: process.stdin, output: process.stdout, terminal: tty });
  let turn: AbortController | undefined;
  rl.on("SIGINT", () => (turn ? turn.abort() : rl.close())); // Ctrl-C: stop the reply, or quit
  const prompt = () => tty && rl.prompt();
  if (tty) process.stderr.write(`${s.engine.model.config.name}: /reset forgets the conversation, /exit or Ctrl-D quits\n`);
  prompt();
  for await (const line of rl) {
    const cmd = line.trim();
    if (cmd === "/exit") break;
    if (cmd === "/reset") messages = start();
    else if (cmd !== "") {
      messages.push({ role: "user", content: line });
      turn = new AbortController();
      try {
        const { text, done } = await streamOnce(s, withBos(s.tok, tmpl.render(messages)), turn.signal);
        process.stdout.write("\n");
        process.stderr.write(statsLine(done, s.sampling.temperature ? s.sampling.seed : undefined) + "\n");
        messages.push({ role: "assistant", content: text });
      } catch (e) {
        messages.pop(); // forget the turn that did not complete
        if ((e as Error).name === "AbortError") process.stdout.write("\n[interrupted]\n");
        else if (e instanceof GenerateError) process.stderr.write(`ctxbank: ${e.message} (/reset to start over)\n`);
        else throw e;
      } finally {
        turn = undefined;
      }
    }
    prompt();
  }
  rl.close();
}

async function main(argv: string[]): Promise<number> {
  if (argv.length === 0) {
    process.stdout.write(USAGE);
    return 0;
  }
  if (SERVICE_COMMANDS.includes(argv[0]!)) return serviceCommand(argv[0] as "serve" | "prefill" | "decode" | "router", argv.slice(1));
  if (argv[0] === "keys") return keysCommand(argv.slice(1));
  if (argv[0] === "models") return modelsCommand(argv.slice(1));
  const { values: f, positionals } = parse(argv);
  if (f.help) {
    process.stdout.write(USAGE);
    return 0;
  }
  const [command, ...extra] = positionals;
  if (command === undefined) throw new UsageError("missing command (ctxbank generate|serve|prefill|decode|keys|models ...)");
  if (command !== "generate") throw new UsageError(`unknown command ${JSON.stringify(command)}`);
  if (extra.length > 0) throw new UsageError(`unexpected argument ${JSON.stringify(extra[0])}`);

  // Check every flag before loading anything.
  const sampling = samplingFrom(f);
  const maxTokens = number("max-tokens", f["max-tokens"], true, 1);
  const threads = number("threads", f.threads, true, 1, 256) ?? availableParallelism();
  const device = deviceFrom(f.device, process.env.CTXBANK_DEVICE);
  let messages: ChatMessage[] | undefined;
  if (f.interactive) {
    if (f.prompt !== undefined || f.user !== undefined || f.chat !== undefined || f.raw)
      throw new UsageError("--interactive takes only --system, not --prompt, --user, --chat or --raw");
  } else {
    messages = messagesFrom(f);
  }

  const path = await resolveModel(f.model !== undefined ? { path: f.model } : {});
  const tok = GgufTokenizer.fromGguf(path);
  const engine = new Engine(await loadModel(path), { threads, device });
  const s: Session = { engine, tok, path, sampling, maxTokens, stop: f.stop ?? [] };
  if (f.interactive) {
    await interactive(s, f.system);
    return 0;
  }
  const prompt = messages ? withBos(tok, chatTemplate(s).render(messages)) : withBos(tok, (f.prompt ?? f.user)!);
  const { text, done } = await streamOnce(s, prompt);
  // End the line on the terminal; when stdout is redirected keep it exact and break the line on
  // stderr instead, so `2>&1` still reads well.
  const open = text !== "" && !text.endsWith("\n");
  if (process.stdout.isTTY && open) process.stdout.write("\n");
  const sep = !process.stdout.isTTY && open ? "\n" : "";
  process.stderr.write(sep + statsLine(done, sampling.temperature ? sampling.seed : undefined) + "\n");
  return 0;
}

process.stdout.on("error", (e: NodeJS.ErrnoException) => process.exit(e.code === "EPIPE" ? 0 : 1));

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (e: unknown) => {
    const usage = e instanceof UsageError;
    const msg = (e instanceof Error ? e.message : String(e)).replace(/\s*\n\s*/g, " ");
    process.stderr.write(`ctxbank: ${msg}${usage ? " (see ctxbank --help)" : ""}\n`);
    process.exit(usage ? 2 : 1);
  },
);
