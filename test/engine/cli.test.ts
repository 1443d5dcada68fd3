// The CLI as a user runs it (tsx bin/ctxbank.ts ...), its output checked against the generation
// loop run in-process on the same model with the same settings.
import { spawn } from "node:child_process";
import { closeSync, mkdtempSync, openSync, readSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Engine, loadModel } from "../../shared/inference/engine/engine.ts";
import { generate, type GenerateOptions } from "../../shared/inference/generate.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { ChatTemplate, type ChatMessage } from "../../shared/inference/tokenizer/chat-template.ts";
import { GgufTokenizer } from "../../shared/inference/tokenizer/tokenizer.ts";

const root = fileURLToPath(new URL("../..", import.meta.url));
const tsx = join(root, "node_modules/.bin/tsx"); // what `npx tsx` runs

function cli(args: string[], stdin = ""): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(tsx, ["bin/ctxbank.ts", ...args], { cwd: root });
    let stdout = "";
    let stderr = "";
    child.stdout.setEncoding("utf8").on("data", (d: string) => (stdout += d));
    child.stderr.setEncoding("utf8").on("data", (d: string) => (stderr += d));
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, stdout, stderr }));
    child.stdin.end(stdin);
  });
}

const STATS =
  /^prompt: (\d+) tokens, [\d.]+ tok\/s prefill \| generated: (\d+) tokens, [\d.]+ ms\/token, [\d.]+ tok\/s \| ttft \d+ ms \| finish: (stop|length|stop_string)$/m;

let engine: Engine;
let tok: GgufTokenizer;
let tmpl: ChatTemplate;
let dir: string;
let modelPath: string;

beforeAll(async () => {
  modelPath = await resolveModel();
  engine = new Engine(await loadModel(modelPath), { threads: 1 });
  tok = GgufTokenizer.fromGguf(modelPath);
  tmpl = ChatTemplate.fromGguf(modelPath, tok);
  dir = mkdtempSync(join(tmpdir(), "ctxbank-cli-"));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const chatIds = (messages: ChatMessage[]) => tok.encode(tmpl.render(messages), { parseSpecial: true });

async function expected(prompt: number[], opts: GenerateOptions) {
  let text = "";
  let finish = "";
  for await (const ev of generate(engine, tok, prompt, opts)) {
    if (ev.type === "token") text += ev.text;
    else finish = ev.finishReason;
  }
  return { text, finish };
}

describe("ctxbank generate", () => {
  it("streams the chat-templated greedy completion and prints stats to stderr", async () => {
    const want = await expected(chatIds([{ role: "user", content: "What is 2+2?" }]), { maxTokens: 8, temperature: 0 });
    const r = await cli(["generate", "--prompt", "What is 2+2?", "--max-tokens", "8", "--temperature", "0", "--threads", "1"]);
    expect(r.code).toBe(0);
    expect(r.stdout).toBe(want.text);
    expect(r.stdout.length).toBeGreaterThan(0);
    const m = STATS.exec(r.stderr);
    expect(m, r.stderr).not.toBeNull();
    expect(Number(m![1])).toBe(chatIds([{ role: "user", content: "What is 2+2?" }]).length);
    expect(Number(m![2])).toBeLessThanOrEqual(8);
    expect(m![3]).toBe(want.finish);
  });

  it("--raw feeds the prompt as-is; --stop cuts the output", async () => {
    const prompt = tok.encode("Once upon a time");
    const full = await expected(prompt, { maxTokens: 16, temperature: 0 });
    const base = ["generate", "--raw", "--prompt", "Once upon a time", "--max-tokens", "16", "--temperature", "0", "--threads", "1"];
    const r = await cli(base);
    expect(r.code).toBe(0);
    expect(r.stdout).toBe(full.text);
    expect(STATS.exec(r.stderr)?.[1]).toBe(String(prompt.length));

    const stop = full.text.split(" ").slice(3, 5).join(" "); // two words in the middle
    const cut = await cli([...base, "--stop", "zzz never", "--stop", stop]);
    expect(cut.code).toBe(0);
    expect(cut.stdout).toBe(full.text.slice(0, full.text.indexOf(stop)));
    expect(STATS.exec(cut.stderr)?.[3]).toBe("stop_string");
  });

  it("--interactive keeps the conversation and exits on /exit", async () => {
    const turn1: ChatMessage[] = [{ role: "user", content: "Hi" }];
    const a1 = await expected(chatIds(turn1), { maxTokens: 8, temperature: 0 });
    const turn2: ChatMessage[] = [...turn1, { role: "assistant", content: a1.text }, { role: "user", content: "What is 2+2?" }];
    const a2 = await expected(chatIds(turn2), { maxTokens: 8, temperature: 0 });
    const r = await cli(
      ["generate", "--interactive", "--max-tokens", "8", "--temperature", "0", "--threads", "1"],
      "Hi\nWhat is 2+2?\n/exit\nnot read\n",
    );
    expect(r.code).toBe(0);
    expect(r.stdout).toBe(`${a1.text}\n${a2.text}\n`);
    const prompts = [...r.stderr.matchAll(new RegExp(STATS.source, "gm"))].map((m) => Number(m[1]));
    expect(prompts).toEqual([chatIds(turn1).length, chatIds(turn2).length]);
  });

  it("prints usage for --help and for no command", async () => {
    for (const args of [["--help"], []]) {
      const r = await cli(args);
      expect(r.code).toBe(0);
      expect(r.stdout).toMatch(/^Usage: ctxbank generate/);
    }
  });

  describe("errors", () => {
    const oneLine = (s: string) => {
      expect(s.trim().split("\n")).toHaveLength(1);
      expect(s).not.toMatch(/\n\s+at /);
    };

    it("bad flags and values exit 2 with one line", async () => {
      for (const [args, msg] of [
        [["generate", "--bogus", "--prompt", "x"], /unknown option '--bogus'/],
        [["generate", "--prompt", "x", "--max-tokens", "0"], /--max-tokens must be an integer/],
        [["generate", "--prompt", "x", "--temperature", "hot"], /--temperature must be a number/],
        [["generate", "--prompt", "x", "--top-p", "2"], /--top-p must be in/],
        [["generate"], /needs --prompt/],
        [["generate", "--chat", "{"], /--chat is not valid JSON/],
        [["frobnicate"], /unknown command/],
      ] as const) {
        const r = await cli([...args]);
        expect(r.code, args.join(" ")).toBe(2);
        expect(r.stderr).toMatch(msg);
        oneLine(r.stderr);
      }
    });

    it("a model that is neither a name nor a file exits 1 with the path and the names", async () => {
      const r = await cli(["generate", "--model", join(dir, "nope.gguf"), "--prompt", "x"]);
      expect(r.code).toBe(1);
      expect(r.stderr).toMatch(/"[^"]*nope\.gguf" is neither a model name \(smollm2-135m-instruct, gemma-3-270m;.*nor an existing file/);
      oneLine(r.stderr);
    });

    it("a bad GGUF exits 1 with the reader's message", async () => {
      const head = Buffer.alloc(4096);
      const fd = openSync(modelPath, "r");
      readSync(fd, head, 0, head.length, 0);
      closeSync(fd);
      const bad = join(dir, "truncated.gguf");
      writeFileSync(bad, head);
      const r = await cli(["generate", "--model", bad, "--prompt", "x"]);
      expect(r.code).toBe(1);
      expect(r.stderr).toMatch(/^ctxbank: gguf: /);
      oneLine(r.stderr);
    });

    it("a prompt that does not fit the context exits 1", async () => {
      const r = await cli(["generate", "--prompt", "x", "--max-tokens", "9000"]);
      expect(r.code).toBe(1);
      expect(r.stderr).toMatch(/exceeds the context of 8192 tokens/);
      oneLine(r.stderr);
    });
  });
});
