// The shared generation loop on the real default model, checked against a hand-written
// prefill + decode loop over the same engine.
import { beforeAll, describe, expect, it, vi } from "vitest";
import { Engine, loadModel, type LoadedModel } from "../../shared/inference/engine/engine.ts";
import { Sampler, argmax, type SamplingOptions } from "../../shared/inference/engine/sampler.ts";
import {
  generate,
  GenerateError,
  StopStringFilter,
  type DoneEvent,
  type GenerateOptions,
  type TokenEvent,
} from "../../shared/inference/generate.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { ChatTemplate } from "../../shared/inference/tokenizer/chat-template.ts";
import { GgufTokenizer } from "../../shared/inference/tokenizer/tokenizer.ts";

let model: LoadedModel;
let engine: Engine;
let tok: GgufTokenizer;
let chat: (content: string) => number[];

beforeAll(async () => {
  const path = await resolveModel();
  model = await loadModel(path);
  engine = new Engine(model, { threads: 1 });
  tok = GgufTokenizer.fromGguf(path);
  const tmpl = ChatTemplate.fromGguf(path, tok);
  chat = (content) => tok.encode(tmpl.render([{ role: "user", content }]), { parseSpecial: true });
});

async function run(prompt: number[], opts: GenerateOptions, t: Pick<GgufTokenizer, "createDetokenizer" | "isEog"> = tok) {
  const events: TokenEvent[] = [];
  let done: DoneEvent | undefined;
  for await (const ev of generate(engine, t, prompt, opts)) {
    expect(done).toBeUndefined(); // nothing after "done"
    if (ev.type === "token") events.push(ev);
    else done = ev;
  }
  expect(done).toBeDefined();
  return { ids: events.map((e) => e.id), text: events.map((e) => e.text).join(""), events, done: done! };
}

/** The reference: one prefill, then sample/decode by hand until EOG or the limit. */
async function manual(prompt: number[], maxTokens: number, sampling: SamplingOptions = {}): Promise<number[]> {
  const sampler = new Sampler(sampling);
  const seq = engine.createSequence(prompt.length + maxTokens);
  let logits = await engine.prefill(seq, prompt);
  const out: number[] = [];
  for (;;) {
    const id = sampling.temperature ? sampler.sample(logits) : argmax(logits);
    out.push(id);
    if (tok.isEog(id) || out.length === maxTokens) return out;
    [logits] = (await engine.decode([seq], [id])) as [Float32Array];
  }
}

const STORY = "Once upon a time";

describe("generate", () => {
  it("greedy output is deterministic and equals a manual prefill + argmax loop", async () => {
    const prompt = tok.encode(STORY);
    const a = await run(prompt, { maxTokens: 24, temperature: 0 });
    const b = await run(prompt, { maxTokens: 24, temperature: 0 });
    expect(a.ids).toEqual(b.ids);
    expect(a.ids).toEqual(await manual(prompt, 24));
    expect(a.text).toBe(tok.decode(a.ids));
    expect(a.text.length).toBeGreaterThan(20);
    expect(a.events.map((e) => e.index)).toEqual(a.ids.map((_, i) => i));
    const d = a.done;
    expect(d).toMatchObject({ finishReason: "length", promptTokens: prompt.length, generatedTokens: 24, decodeSteps: 23 });
    expect(d.prefillMs).toBeGreaterThan(0);
    expect(d.ttftMs).toBeGreaterThanOrEqual(d.prefillMs);
    expect(d.decodeMs).toBeGreaterThan(0);
    expect(d.decodeMsPerToken).toBeCloseTo(d.decodeMs / 23, 6);
    expect(d.decodeTokPerS).toBeCloseTo(23_000 / d.decodeMs, 3);
    expect(d.prefillTokPerS).toBeCloseTo((prompt.length * 1000) / d.prefillMs, 3);
  });

  it("seeded sampling is reproducible, follows the seed, and matches a manual sampler loop", async () => {
    const prompt = tok.encode(STORY);
    const opts = { temperature: 1.5, topK: 0, topP: 1, seed: 1234 };
    const a = await run(prompt, { ...opts, maxTokens: 16 });
    const b = await run(prompt, { ...opts, maxTokens: 16 });
    expect(a.ids).toEqual(b.ids);
    expect(a.ids).toEqual(await manual(prompt, 16, opts));
    const other = await run(prompt, { ...opts, seed: 99, maxTokens: 16 });
    expect(other.ids).not.toEqual(a.ids);
  });

  it("respects max tokens (finish 'length')", async () => {
    for (const maxTokens of [1, 5]) {
      const r = await run(tok.encode(STORY), { maxTokens, temperature: 0 });
      expect(r.ids).toHaveLength(maxTokens);
      expect(r.done).toMatchObject({ finishReason: "length", generatedTokens: maxTokens, decodeSteps: maxTokens - 1 });
    }
  });

  it("stops at the model's end-of-generation token (finish 'stop')", async () => {
    const prompt = chat("Reply with one word: yes or no?");
    const r = await run(prompt, { maxTokens: 48, temperature: 0 });
    expect(r.done.finishReason).toBe("stop");
    expect(r.ids.length).toBeLessThan(48);
    expect(tok.isEog(r.ids.at(-1)!)).toBe(true);
    expect(r.ids.slice(0, -1).some((id) => tok.isEog(id))).toBe(false);
    expect(r.ids).toEqual(await manual(prompt, 48));
    expect(r.text).toBe(tok.decode(r.ids.slice(0, -1)));
    expect(r.text).not.toMatch(/<\|/); // control tokens do not render
  });

  it("stops on whatever the tokenizer calls end-of-generation", async () => {
    const prompt = tok.encode(STORY);
    const ref = await manual(prompt, 12);
    const fakeEog = ref[5]!;
    const t = { createDetokenizer: () => tok.createDetokenizer(), isEog: (id: number) => id === fakeEog };
    const r = await run(prompt, { maxTokens: 12, temperature: 0 }, t);
    expect(r.ids).toEqual(ref.slice(0, ref.indexOf(fakeEog) + 1));
    expect(r.done.finishReason).toBe("stop");
    expect(r.text).toBe(tok.decode(ref.slice(0, ref.indexOf(fakeEog))));
  });

  describe("stop strings", () => {
    let full: { ids: number[]; text: string };
    let bounds: number[]; // text offset where each token's piece starts
    beforeAll(async () => {
      full = await run(tok.encode(STORY), { maxTokens: 32, temperature: 0 });
      bounds = full.ids.map((_, i) => tok.decode(full.ids.slice(0, i)).length);
    });

    /** Streams with `stop` and checks that every prefix streamed is a prefix of `expected`. */
    async function stream(stop: string[]) {
      const r = await run(tok.encode(STORY), { maxTokens: 32, temperature: 0, stop });
      let sofar = "";
      for (const e of r.events) {
        sofar += e.text;
        expect(r.text.startsWith(sofar)).toBe(true);
      }
      return r;
    }

    it("cut the text right before a stop string that spans tokens, never leaking part of it", async () => {
      const start = bounds[6]! + 1; // inside token 6 …
      const stop = full.text.slice(start, bounds[9]! + 1); // … into token 9
      expect(stop.length).toBeGreaterThan(3);
      const expected = full.text.slice(0, full.text.indexOf(stop));
      const r = await stream([stop]);
      expect(r.text).toBe(expected);
      expect(r.done.finishReason).toBe("stop_string");
      expect(r.ids).toEqual(full.ids.slice(0, 10)); // token 9 completes the stop string
      // While the stop string was forming its start was held back: token 6's event has not
      // printed the character where the stop string begins.
      const upTo6 = r.events
        .slice(0, 7)
        .map((e) => e.text)
        .join("");
      expect(upTo6.length).toBeLessThanOrEqual(start);
    });

    it("release held-back text when the stop string never completes", async () => {
      // One candidate is released mid-stream, the other (the last tokens) only at the end.
      const mid = full.text.slice(bounds[20]!, bounds[22]!) + "\u0001";
      const tail = full.text.slice(bounds[30]!) + "\u0001";
      const r = await stream([mid, tail]);
      expect(r.done.finishReason).toBe("length");
      expect(r.text).toBe(full.text);
    });

    it("the earliest of several stop strings wins", async () => {
      const late = full.text.slice(bounds[12]!, bounds[14]!);
      const early = full.text.slice(bounds[3]!, bounds[4]!);
      const r = await stream([late, early]);
      expect(r.text).toBe(full.text.slice(0, full.text.indexOf(early)));
    });

    it("StopStringFilter unit cases", () => {
      const f = new StopStringFilter(["</s>", "STOP"]);
      expect(f.push("hello <")).toEqual({ text: "hello ", stopped: false });
      expect(f.push("/")).toEqual({ text: "", stopped: false });
      expect(f.push("x")).toEqual({ text: "</x", stopped: false });
      expect(f.push(" ST")).toEqual({ text: " ", stopped: false });
      expect(f.flush()).toBe("ST");
      const g = new StopStringFilter(["ab"]);
      expect(g.push("a")).toEqual({ text: "", stopped: false });
      expect(g.push("a")).toEqual({ text: "a", stopped: false });
      expect(g.push("b tail")).toEqual({ text: "", stopped: true });
      expect(new StopStringFilter(["é!"]).push("café!x")).toEqual({ text: "caf", stopped: true });
    });
  });

  describe("abort", () => {
    it("stops between decode steps and leaves the engine usable", async () => {
      const ac = new AbortController();
      const ids: number[] = [];
      const gen = generate(engine, tok, tok.encode(STORY), { maxTokens: 32, temperature: 0, signal: ac.signal });
      await expect(
        (async () => {
          for await (const ev of gen) {
            if (ev.type === "token") ids.push(ev.id);
            if (ids.length === 3) ac.abort();
          }
        })(),
      ).rejects.toMatchObject({ name: "AbortError" });
      expect(ids).toHaveLength(3);
      const again = await run(tok.encode(STORY), { maxTokens: 8, temperature: 0 });
      expect(again.ids).toEqual(await manual(tok.encode(STORY), 8));
    });

    it("stops between prefill chunks", async () => {
      const ubatch = engine.native.info.ubatch;
      const prompt = Array.from({ length: ubatch * 2 + 10 }, (_, i) => 1000 + (i % 500));
      const ac = new AbortController();
      const spy = vi.spyOn(engine, "prefill");
      try {
        const gen = generate(engine, tok, prompt, { maxTokens: 4, signal: ac.signal });
        const first = gen.next();
        ac.abort();
        await expect(first).rejects.toMatchObject({ name: "AbortError" });
        expect(spy).toHaveBeenCalledTimes(1); // 1 of 3 chunks ran
      } finally {
        spy.mockRestore();
      }
    });

    it("an already aborted signal does nothing", async () => {
      const spy = vi.spyOn(engine, "prefill");
      try {
        const gen = generate(engine, tok, tok.encode(STORY), { signal: AbortSignal.abort() });
        await expect(gen.next()).rejects.toMatchObject({ name: "AbortError" });
        expect(spy).not.toHaveBeenCalled();
      } finally {
        spy.mockRestore();
      }
    });
  });

  describe("validation (synchronous, before any work)", () => {
    it("rejects prompt + max tokens over the context", () => {
      const small = new Engine(model, { threads: 1, maxContext: 64 });
      const prompt = tok.encode(STORY);
      expect(() => generate(small, tok, prompt, { maxTokens: 64 })).toThrow(
        new RegExp(`prompt \\(${prompt.length} tokens\\) \\+ max tokens \\(64\\) = ${prompt.length + 64} exceeds the context of 64`),
      );
      expect(() => generate(small, tok, prompt, { maxTokens: 64 - prompt.length })).not.toThrow();
      expect(() => generate(small, tok, new Array(64).fill(1000))).toThrow(/leaves no room/);
      const err = (() => {
        try {
          generate(small, tok, new Array(70).fill(1000), { maxTokens: 1 });
        } catch (e) {
          return e;
        }
      })();
      expect(err).toBeInstanceOf(GenerateError);
      expect((err as GenerateError).code).toBe("context_length_exceeded");
    });

    it("rejects an empty prompt", () => {
      expect(() => generate(engine, tok, [])).toThrow(/prompt is empty/);
    });

    it("rejects bad options and token ids", () => {
      const p = tok.encode(STORY);
      for (const maxTokens of [0, -1, 1.5, NaN]) expect(() => generate(engine, tok, p, { maxTokens })).toThrow(/max tokens/);
      expect(() => generate(engine, tok, p, { temperature: -1 })).toThrow(/temperature/);
      expect(() => generate(engine, tok, p, { stop: [""] })).toThrow(/stop/);
      expect(() => generate(engine, tok, [1, 1e9])).toThrow(/prompt token 1/);
      expect(() => generate(engine, tok, [1, 2.5])).toThrow(/prompt token 1/);
    });
  });
});
