// The tiny generated model the engine tests run on (no download, always run): a random-weight
// llama of the given shape and seed, written once into a temporary directory and loaded once per
// process; tests that ask for the same shape and seed share the model.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "gguf_writer.h"
#include "model.h"

namespace ctxtest {

// A llama shape with grouped-query attention (4 query heads on 2 KV heads), small enough that a
// test runs thousands of steps in well under a second; the context is the caller's.
inline TinyLlama tiny_gqa(int n_layer, int n_ctx) {
  TinyLlama c;
  c.n_embd = 64, c.n_head = 4, c.n_head_kv = 2, c.n_ff = 128, c.n_layer = n_layer, c.n_vocab = 50, c.n_ctx = n_ctx;
  return c;
}

// The model of shape `c` with weights drawn from `seed` (tiny_llama_spec).
inline std::shared_ptr<ctx::Model> tiny_model(const TinyLlama& c = TinyLlama{}, uint32_t seed = 1) {
  using Key = std::tuple<int, int, int, int, int, int, int, float, float, uint32_t>;
  static TempDir dir;
  static std::map<Key, std::shared_ptr<ctx::Model>> models;
  const Key key{c.n_embd, c.n_head, c.n_head_kv, c.n_ff, c.n_layer, c.n_vocab, c.n_ctx, c.rope_base, c.rms_eps, seed};
  auto& m = models[key];
  if (!m) m = ctx::Model::load(dir.write("tiny-" + std::to_string(models.size()) + ".gguf", build(tiny_llama_spec(c, seed)).bytes));
  return m;
}

}  // namespace ctxtest
