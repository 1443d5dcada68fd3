#!/usr/bin/env python3
"""Writes native/tests/fixtures/quant-reference.bin: random blocks of the quant types the engine
computes beyond Q4_0/Q4_1/Q8_0 (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), with their values as llama.cpp's
own Python package (gguf-py, `gguf.quants.dequantize`) computes them. The C++ tests
(native/tests/quants_test.cc) compare the engine's dequantization with these values bit for bit
and its dot-product kernels with a double-precision product of them; the tests read only this
file, so neither CI nor the tests need Python.

    python3 -m venv /tmp/qref && /tmp/qref/bin/pip install gguf==0.19.0 numpy
    /tmp/qref/bin/python tools/quant-reference.py

Each block is random bytes (every quant, scale and min bit pattern occurs) with its f16 fields
(d; m or dmin) set to finite values: in row 0 the edge cases (zero, -0, subnormals, the largest
half), elsewhere magnitudes of 2e-3..5e-2 of either sign. The seed is fixed, so the file is
reproducible for a given gguf-py and NumPy.

Format (little-endian): b"CTXQREF1"; u32 length and UTF-8 text of a note (generator, versions,
seed); u32 entry count; per entry u32 ggml type, u32 rows, u32 cols, u32 byte count, the blocks
(rows x cols in ggml's layout), then rows x cols f32 values.
"""
import struct
import sys
from importlib.metadata import version
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T

SEED = 20250725
ROWS, COLS = 11, 512  # a full group of 8 rows and a partial one; 2 super-blocks, 16 blocks of 32

# Type -> byte offsets of its f16 fields in a block.
HALF_FIELDS = {
    T.Q5_0: [0],       # d
    T.Q5_1: [0, 2],    # d, m
    T.Q4_K: [0, 2],    # d, dmin
    T.Q5_K: [0, 2],    # d, dmin
    T.Q6_K: [208],     # d (after ql, qh, scales)
}
# Half bit patterns for the first blocks of row 0: 0, -0, smallest and largest subnormals,
# smallest normal, 1, the largest finite half and its negative.
EDGE_HALVES = [0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x3C00, 0x7BFF, 0xFBFF]


def blocks_for(qtype: T, rng: np.random.Generator) -> np.ndarray:
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = ROWS * COLS // block_elems
    data = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for off in HALF_FIELDS[qtype]:
        mag = rng.uniform(2e-3, 5e-2, size=n_blocks) * rng.choice([-1.0, 1.0], size=n_blocks)
        halves = mag.astype(np.float16).view(np.uint16)
        per_row = COLS // block_elems
        for i, h in enumerate(EDGE_HALVES[:per_row]):
            halves[i] = h  # row 0's first blocks
        data[:, off:off + 2] = halves.reshape(-1, 1).view(np.uint8)
    return data.reshape(ROWS, -1)


def main() -> None:
    default = Path(__file__).resolve().parent.parent / "native/tests/fixtures/quant-reference.bin"
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else default
    rng = np.random.default_rng(SEED)
    note = f"tools/quant-reference.py: gguf {version('gguf')}, numpy {np.__version__}, seed {SEED}"
    parts = [b"CTXQREF1", struct.pack("<I", len(note.encode())), note.encode(), struct.pack("<I", len(HALF_FIELDS))]
    for qtype in HALF_FIELDS:
        blocks = blocks_for(qtype, rng)
        values = gguf.quants.dequantize(blocks, qtype).astype(np.float32)
        assert values.shape == (ROWS, COLS), values.shape
        if not np.isfinite(values).all():
            raise SystemExit(f"{qtype.name}: non-finite value from finite scales")
        parts += [struct.pack("<4I", int(qtype), ROWS, COLS, blocks.nbytes), blocks.tobytes(), values.astype("<f4").tobytes()]
    out.write_bytes(b"".join(parts))
    print(f"wrote {out} ({out.stat().st_size} bytes): {note}")


if __name__ == "__main__":
    main()
