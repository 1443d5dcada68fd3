// The catalogue's claims about each model (trained context, chat template) against the metadata of
// the real GGUF, fetched on first use into the user cache (Gemma 3 270M is skipped when offline).
import { describe, expect, it } from "vitest";
import { readGgufMetadata } from "../../shared/inference/engine/native.ts";
import { MODEL_CATALOGUE } from "../../shared/inference/model/catalogue.ts";
import { resolveModel } from "../../shared/inference/model/resolve.ts";
import { gemma3Model } from "../harness/gemma-model.ts";

const FILES: Record<string, () => Promise<{ path: string } | { skip: string }>> = {
  "smollm2-135m-instruct": async () => ({ path: await resolveModel({ path: "smollm2-135m-instruct" }) }),
  "gemma-3-270m": gemma3Model,
};

describe("the catalogue describes its files", () => {
  it("names a file source for every model", () => {
    expect(Object.keys(FILES).sort()).toEqual(MODEL_CATALOGUE.models.map((m) => m.name).sort());
  });

  for (const model of MODEL_CATALOGUE.models) {
    it(`${model.name}: context length and chat template as the GGUF says`, async (ctx) => {
      const file = await FILES[model.name]!();
      if ("skip" in file) return ctx.skip(file.skip);
      const meta = readGgufMetadata(file.path);
      expect(meta[`${String(meta["general.architecture"])}.context_length`]).toBe(model.contextLength);
      expect(typeof meta["tokenizer.chat_template"] === "string").toBe(model.chatTemplate);
    });
  }
});
