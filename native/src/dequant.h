// Exact dequantization of one weight row (embedding lookups; tests), and the load-time check of
// quantized blocks' scales.
#pragma once
#include <cstdint>

#include "model.h"

namespace ctx {

// Element j of the row, computed as ggml (and gguf-py) computes it, rounding for rounding.
void dequantize_row(const Weight& w, int row, float* out);

// The index (row-major over rows x blocks per row) of the first block of a quantized weight whose
// f16 scale (d, m or dmin) is Inf or NaN, or -1 when there is none or the type has no blocks.
int64_t first_nonfinite_scale(const Weight& w);

}  // namespace ctx
