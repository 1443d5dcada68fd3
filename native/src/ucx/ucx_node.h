// One UCX context and worker per process, driven by its own progress thread. The owner side maps a
// shard's pages (ucp_mem_map) and answers reads of them; the reader side reads a range of a remote
// shard straight into the caller's memory. A read is a UCX active-message rendezvous: the reader
// asks (a header-only message), the owner answers with a rendezvous send of the range, and the
// reader pulls the bytes into its destination with a zero-copy get (CMA on one host, RDMA READ
// over verbs): the owner's CPU never touches the bytes. Why not ucp_get_nbx: UCX 1.13 serves gets
// only on lanes with buffered copies, so with peer failure handling they go over TCP (docs:
// the UCX transport). Every UCX call is made on the progress thread: the worker runs
// single-threaded and JS is never blocked on I/O.
#pragma once
#include <ucp/api/ucp.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ctx::ucx {

// How a read ended: "" on success, else a category ("unreachable", "aborted", "bad_endpoint",
// "stale_epoch", "out_of_range", "io_error") and words saying why.
struct Outcome {
  std::string code;
  std::string message;
};

// What a reader asks of an owner: a range of one exposed shard epoch. `token` is the exposure's
// secret, published in the registry with the mapping's id: an owner answers only readers that
// hold it.
struct Range {
  uint64_t mapping = 0;
  uint64_t token = 0;
  uint32_t epoch = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

class Node {
 public:
  // Creates the context, the worker and the progress thread; throws std::runtime_error.
  Node();
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  std::vector<uint8_t> worker_address() const { return address_; }

  // Maps `length` bytes of the file at `path` (read-only, shared) and registers them, answering
  // reads of epoch `epoch`. Returns the mapping's id and sets *token. Throws std::runtime_error.
  uint64_t expose(const std::string& path, uint64_t length, uint32_t epoch, uint64_t* token);
  // Stops answering reads of the mapping (later ones end "stale_epoch"); its pages go once the
  // answers in flight are done. Unknown ids are ignored.
  void unexpose(uint64_t id);

  // Reads `range` from the owner whose worker address is `address` into `dst` (range.length
  // bytes); `id` names the read for cancel(). `done` runs once, on the progress thread, after
  // which nothing writes into `dst`. Each read in flight has an endpoint of its own (pooled per
  // owner), so cancelling one read never touches another's.
  void read(uint64_t id, std::vector<uint8_t> address, Range range, void* dst, std::function<void(Outcome)> done);
  // Ends the read `id` if it is still in flight (it completes "aborted"): closes its endpoint.
  void cancel(uint64_t id);

 private:
  struct Peer;
  struct Read;
  struct Mapping;
  struct Sending;
  void run();
  void wake();
  void wait_for_events(int timeout_ms);
  void wait_idle();
  void post(std::function<void()> command);
  void run_sync(std::function<void()> command);
  std::unique_ptr<Peer> take_peer(const std::vector<uint8_t>& address, Outcome* err);
  void close_peer(std::unique_ptr<Peer> peer, std::optional<uint64_t> read = std::nullopt);
  void reap_peers();
  void finish_read(uint64_t id, Outcome outcome);
  void fail_orphaned_reads();
  void release_mapping(std::map<uint64_t, Mapping>::iterator it);
  ucs_status_t answer(const void* header, size_t header_length, const ucp_am_recv_param_t* param);
  static void populate(const void* p, size_t n);
  ucs_status_t receive(const void* header, size_t header_length, void* data, size_t length, const ucp_am_recv_param_t* param);
  void pull(uint64_t id, Read& r, void* data);
  void pull_next();
  static ucs_status_t on_ask(void* arg, const void* header, size_t header_length, void* data, size_t length,
                             const ucp_am_recv_param_t* param);
  static ucs_status_t on_answer(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                const ucp_am_recv_param_t* param);
  static void on_ask_sent(void* request, ucs_status_t status, void* user);
  static void on_answer_sent(void* request, ucs_status_t status, void* user);
  static void on_received(void* request, ucs_status_t status, size_t length, void* user);
  static void on_peer_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<uint8_t> address_;

  int wake_fd_ = -1;    // eventfd: post() wakes the progress thread with it
  int worker_fd_ = -1;  // the worker's event fd (UCP_FEATURE_WAKEUP)
  std::mutex mutex_;
  std::deque<std::function<void()>> commands_;
  bool stop_ = false;
  std::thread thread_;

  // Progress-thread state. Reader side:
  std::map<std::vector<uint8_t>, std::vector<std::unique_ptr<Peer>>> idle_;  // by owner address
  std::map<uint64_t, std::unique_ptr<Read>> reads_;                          // in flight, by read id
  size_t receiving_ = 0;                                                     // reads pulling bytes
  std::deque<uint64_t> queued_;                                              // answered reads waiting to pull, in order
  std::vector<std::unique_ptr<Peer>> retired_peers_;                         // to close, out of callbacks
  struct Closing {
    std::unique_ptr<Peer> peer;
    void* request;                 // the close in progress, or null when it finished at once
    std::optional<uint64_t> read;  // a cancelled read that was receiving on it
  };
  std::vector<Closing> closing_;
  // Owner side:
  std::map<uint64_t, Mapping> mappings_;
  std::vector<std::pair<void*, uint64_t>> retired_;  // released ranges, kept as zero pages
  uint64_t next_mapping_ = 1;
};

}  // namespace ctx::ucx
