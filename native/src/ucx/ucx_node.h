// One UCX context and worker per process, driven by its own progress thread: the owner side maps
// a shard's pages for remote reads (ucp_mem_map + packed rkey), the reader side reads a range of
// a remote shard with one-sided ucp_get_nbx straight into the caller's memory. Every UCX call is
// made on the progress thread, so the worker runs single-threaded and JS is never blocked on I/O.
#pragma once
#include <ucp/api/ucp.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ctx::ucx {

// How a read ended: "" on success, else a category ("unreachable", "aborted", "bad_endpoint",
// "io_error") and UCX's words.
struct Outcome {
  std::string code;
  std::string message;
};

// A shard's pages mapped for remote reads.
struct Exposed {
  std::vector<uint8_t> rkey;  // packed remote key, published in the registry
  uint64_t base = 0;          // the pages' address in this process (the reader's remote address)
  uint64_t length = 0;
  // The shard's epoch word: a slot of a page mapped for the process's lifetime, holding the
  // exposed epoch until unexpose() zeroes it. A reader that reads it after its chunk and finds its
  // epoch knows the chunk came from that epoch's pages (they are unmapped only after the zeroing).
  uint64_t fence = 0;
  std::vector<uint8_t> fence_rkey;
};

class Node {
 public:
  // Creates the context, the worker and the progress thread; throws std::runtime_error.
  Node();
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  std::vector<uint8_t> worker_address() const { return address_; }

  // Maps `length` bytes of the file at `path` (read-only, shared) and registers them for remote
  // reads. Returns an id for unexpose(). Throws std::runtime_error.
  uint64_t expose(const std::string& path, uint64_t length, uint64_t epoch, Exposed* out);
  // Zeroes the epoch word, unregisters, and replaces the pages with zero pages (the address range
  // stays reserved until the process ends). Unknown ids are ignored.
  void unexpose(uint64_t id);

  // Reads `length` bytes at `remote` of the worker at `address` (rkey `rkey`) into `dst`; `id`
  // names the read for cancel(). `done` runs once, on the progress thread, after which nothing
  // writes into `dst`. Each read in flight has an endpoint of its own (pooled per owner), so
  // cancelling one read never touches another's.
  void get(uint64_t id, std::vector<uint8_t> address, std::vector<uint8_t> rkey, uint64_t remote, void* dst, uint64_t length,
           std::function<void(Outcome)> done);
  // Ends the read `id` if it is still in flight (it completes "aborted"): closes its endpoint.
  void cancel(uint64_t id);

 private:
  struct Peer;
  struct Get;
  void run();
  void post(std::function<void()> command);
  void run_sync(std::function<void()> command);
  std::unique_ptr<Peer> take_peer(const std::vector<uint8_t>& address, Outcome* err);
  void close_peer(std::unique_ptr<Peer> peer);
  void reap_peers();
  void finish_get(uint64_t id, ucs_status_t status);
  static void on_get_done(void* request, ucs_status_t status, void* user);
  static void on_peer_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<uint8_t> address_;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> commands_;
  bool stop_ = false;
  std::thread thread_;

  // Progress-thread state.
  std::map<std::vector<uint8_t>, std::vector<std::unique_ptr<Peer>>> idle_;  // by owner address
  std::map<uint64_t, std::unique_ptr<Peer>> busy_;                          // by read id
  std::vector<std::unique_ptr<Peer>> retired_peers_;                        // to close, out of callbacks
  struct Closing {
    std::unique_ptr<Peer> peer;
    void* request;  // the close in progress, or null when it finished at once
  };
  std::vector<Closing> closing_;
  struct Mapping {
    ucp_mem_h memh;
    void* addr;
    uint64_t length;
    size_t slot;
  };
  static constexpr size_t kFenceSlots = 512;
  uint64_t* fence_ = nullptr;  // kFenceSlots epoch words, one page, registered once
  ucp_mem_h fence_memh_ = nullptr;
  std::vector<uint8_t> fence_rkey_;
  size_t next_slot_ = 0;
  std::map<uint64_t, Mapping> mappings_;
  std::vector<std::pair<void*, uint64_t>> retired_;  // unexposed ranges, kept as zero pages
  uint64_t next_mapping_ = 1;
  size_t in_flight_ = 0;
};

}  // namespace ctx::ucx
