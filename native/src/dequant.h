// Exact dequantization of one weight row (embedding lookups; tests).
#pragma once
#include "model.h"

namespace ctx {
void dequantize_row(const Weight& w, int row, float* out);
}
