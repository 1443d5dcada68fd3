#include "policies/common.h"

namespace ctx {

void QueryWindow::push(const PolicyBackend& backend, int t, int keep_count) {
  const size_t keep = static_cast<size_t>(keep_count);
  if (keep == 0) return;
  const int width = backend.config().q_dim();
  const float* row = backend.query(t);
  if (q.size() == keep) {  // full: recycle the oldest row
    std::rotate(q.begin(), q.begin() + 1, q.end());
    pos.erase(pos.begin());
    q.back().assign(row, row + width);
  } else {
    q.emplace_back(row, row + width);
  }
  pos.push_back(backend.position(t));
}

size_t QueryWindow::bytes() const { return vector_bytes(q) + vector_bytes(pos); }

}  // namespace ctx
