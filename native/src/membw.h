// Memory read bandwidth as a stream of loads gets it: the bound a memory-bound decode step (every
// weight byte read once per token) cannot beat. bench/engine measures it and reports decode as a
// share of it (the roofline).
#pragma once
#include <cstddef>

namespace ctx {

struct ReadBandwidth {
  double gb_per_s;  // bytes / s / 1e9 of the fastest pass
  size_t bytes;     // read per pass
  int passes;
  int threads;
};

// `threads` threads (the caller and a ThreadPool's workers) each read a contiguous share of one
// buffer of `bytes` (allocated like the engine's packed weights, and several times the last-level
// cache so that it streams from DRAM), once per pass. The fastest of `passes` passes counts: other
// work on a shared machine only ever slows a pass down.
ReadBandwidth measure_read_bandwidth(int threads, size_t bytes, int passes);

}  // namespace ctx
