#include "kv_cache.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>

namespace ctx {

KvCache::KvCache(int n_layer, int kv_dim, int capacity) : n_layer_(n_layer), kv_dim_(kv_dim), capacity_(capacity) {
  if (n_layer <= 0 || kv_dim <= 0 || capacity <= 0) throw std::invalid_argument("kv cache: dimensions must be positive");
  bytes_ = static_cast<size_t>(n_layer) * 2 * capacity * kv_dim * sizeof(uint16_t);
  void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw std::runtime_error("kv cache: cannot reserve " + std::to_string(bytes_ >> 20) + " MiB: " + std::strerror(errno));
  base_ = static_cast<uint16_t*>(p);
}

KvCache::~KvCache() { munmap(base_, bytes_); }

void KvCache::release() {
  madvise(base_, bytes_, MADV_DONTNEED);
  size_ = 0;
}

void KvCache::set_size(int n) {
  if (n < 0 || n > capacity_) throw std::out_of_range("kv cache: size " + std::to_string(n) + " outside capacity " + std::to_string(capacity_));
  size_ = n;
}

}  // namespace ctx
