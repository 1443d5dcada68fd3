#include "ucx/ucx_node.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <future>
#include <random>
#include <stdexcept>
#include <utility>

namespace ctx::ucx {

namespace {

// Active-message ids and their headers (both ends are this code, on hosts of one byte order).
constexpr unsigned kAsk = 1;            // reader -> owner: Ask, no data
constexpr unsigned kAnswer = 2;         // owner -> reader: Answer, then the range's bytes when status is kOk
constexpr uint32_t kWire = 0x31414358;  // "XCA1"

struct Ask {
  uint32_t wire;
  uint32_t epoch;
  uint64_t read_id;
  uint64_t mapping;
  uint64_t token;
  uint64_t offset;
  uint64_t length;
};

enum AnswerStatus : uint32_t { kOk = 0, kGone = 1, kOutOfRange = 2, kRefused = 3, kMalformed = 4 };

struct Answer {
  uint32_t wire;
  uint32_t status;
  uint64_t read_id;
};

Outcome outcome_of(ucs_status_t status) {
  if (status == UCS_OK) return {};
  switch (status) {
    case UCS_ERR_CANCELED:
      return {"aborted", ucs_status_string(status)};
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_TIMED_OUT:
      return {"unreachable", ucs_status_string(status)};
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
    case UCS_ERR_UNSUPPORTED:
      return {"bad_endpoint", ucs_status_string(status)};
    default:
      return {"io_error", ucs_status_string(status)};
  }
}

Outcome outcome_of(AnswerStatus status) {
  switch (status) {
    case kOk:
      return {};
    case kGone:
      return {"stale_epoch", "the owner no longer serves this shard epoch"};
    case kOutOfRange:
      return {"out_of_range", "the range lies outside the owner's mapping"};
    case kRefused:
      return {"bad_endpoint", "the owner refused the read (wrong token)"};
    default:
      return {"bad_endpoint", "the owner could not parse the read"};
  }
}

// While a read is pulling bytes the thread spins on the worker (the pull advances only in
// progress calls); otherwise it sleeps until the worker has an event (an ask, an answer, wire-up)
// or a command arrives, and wakes every so often to finish closing endpoints.
constexpr int kClosingPollMs = 5;
constexpr int kIdlePollMs = 200;

// Idle endpoints kept per owner; more reads at once open more, closed when they come back.
constexpr size_t kIdlePerOwner = 16;

uint64_t random_token() {
  std::random_device device;  // /dev/urandom
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

}  // namespace

struct Node::Peer {
  std::vector<uint8_t> address;
  ucp_ep_h ep = nullptr;
  bool failed = false;
};

// A read in flight: asked, then (once answered) receiving into dst.
struct Node::Read {
  std::unique_ptr<Peer> peer;  // its own endpoint; null once cancel() closed it
  void* dst;
  uint64_t length;
  std::function<void(Outcome)> done;
  bool receiving = false;  // a ucp_am_recv_data_nbx is writing into dst
  void* answer = nullptr;  // the owner's answer, waiting for its turn to be pulled (queued_)
};

struct Node::Mapping {
  ucp_mem_h memh;
  void* addr;
  uint64_t length;
  uint32_t epoch;
  uint64_t token;
  bool retired = false;  // unexposed: answers nothing new, released when `sending` reaches 0
  size_t sending = 0;    // answers whose bytes a reader may still be pulling
};

// What a send or receive callback needs; a send's header lives here until the send completes.
struct Node::Sending {
  Node* node;
  uint64_t id;  // the read (an ask, a receive) or the mapping (an answer)
  Ask ask;
  Answer answer;
  bool with_data;
};

Node::Node() {
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) throw std::runtime_error(std::string("UCX: eventfd: ") + std::strerror(errno));
  thread_ = std::thread([this] { run(); });
  std::string error;
  run_sync([&] {
    ucp_config_t* config = nullptr;
    ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
    if (st != UCS_OK) {
      error = std::string("ucp_config_read: ") + ucs_status_string(st);
      return;
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    st = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (st != UCS_OK) {
      error = std::string("ucp_init: ") + ucs_status_string(st);
      return;
    }
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread touches it
    st = ucp_worker_create(context_, &wp, &worker_);
    if (st != UCS_OK) {
      error = std::string("ucp_worker_create: ") + ucs_status_string(st);
      return;
    }
    for (auto [id, cb] : {std::pair{kAsk, &Node::on_ask}, std::pair{kAnswer, &Node::on_answer}}) {
      ucp_am_handler_param_t hp{};
      hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
      hp.id = id;
      hp.cb = cb;
      hp.arg = this;
      st = ucp_worker_set_am_recv_handler(worker_, &hp);
      if (st != UCS_OK) {
        error = std::string("ucp_worker_set_am_recv_handler: ") + ucs_status_string(st);
        return;
      }
    }
    ucp_address_t* addr = nullptr;
    size_t len = 0;
    st = ucp_worker_get_address(worker_, &addr, &len);
    if (st != UCS_OK) {
      error = std::string("ucp_worker_get_address: ") + ucs_status_string(st);
      return;
    }
    address_.assign(reinterpret_cast<uint8_t*>(addr), reinterpret_cast<uint8_t*>(addr) + len);
    ucp_worker_release_address(worker_, addr);
    st = ucp_worker_get_efd(worker_, &worker_fd_);
    if (st != UCS_OK) error = std::string("ucp_worker_get_efd: ") + ucs_status_string(st);
  });
  if (!error.empty()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake();
    thread_.join();
    if (worker_) ucp_worker_destroy(worker_);
    if (context_) ucp_cleanup(context_);
    ::close(wake_fd_);
    throw std::runtime_error("UCX: " + error);
  }
}

Node::~Node() {
  run_sync([this] {
    for (auto& [id, r] : reads_)
      if (r->peer) close_peer(std::move(r->peer));
    auto idle = std::move(idle_);
    for (auto& [address, peers] : idle)
      for (auto& p : peers) close_peer(std::move(p));
    reap_peers();
    while (!closing_.empty()) {
      ucp_worker_progress(worker_);
      reap_peers();
    }
    for (auto& [id, m] : mappings_) {
      ucp_mem_unmap(context_, m.memh);
      munmap(m.addr, m.length);
    }
    mappings_.clear();
    for (auto& [addr, length] : retired_) munmap(addr, length);
    retired_.clear();
  });
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake();
  thread_.join();
  ucp_worker_destroy(worker_);
  ucp_cleanup(context_);
  ::close(wake_fd_);
}

void Node::post(std::function<void()> command) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    commands_.push_back(std::move(command));
  }
  wake();
}

void Node::wake() {
  const uint64_t one = 1;
  ssize_t ignored = ::write(wake_fd_, &one, sizeof one);  // fails only when the counter is full: awake anyway
  (void)ignored;
}

// Sleeps until the worker has an event, a command is posted, or `timeout_ms` pass. Arming fails
// (busy) when events are already pending: then it returns at once to progress them.
void Node::wait_for_events(int timeout_ms) {
  if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) return;
  pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {worker_fd_, POLLIN, 0}};
  ::poll(fds, 2, timeout_ms);
}

void Node::run_sync(std::function<void()> command) {
  std::promise<void> finished;
  post([&] {
    command();
    finished.set_value();
  });
  finished.get_future().wait();
}

void Node::run() {
  for (;;) {
    // Clear the wake-ups first: a command posted after this wakes the next wait.
    uint64_t posted = 0;
    ssize_t ignored = ::read(wake_fd_, &posted, sizeof posted);
    (void)ignored;
    std::deque<std::function<void()>> batch;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_ && commands_.empty()) return;
      batch.swap(commands_);
    }
    for (auto& c : batch) c();
    if (!worker_) {
      if (batch.empty()) wait_idle();
      continue;
    }
    while (ucp_worker_progress(worker_) != 0) {
    }
    fail_orphaned_reads();
    pull_next();
    // Idle endpoints whose owner failed.
    for (auto& [address, peers] : idle_) {
      for (size_t i = 0; i < peers.size();) {
        if (!peers[i]->failed) {
          ++i;
          continue;
        }
        retired_peers_.push_back(std::move(peers[i]));
        peers.erase(peers.begin() + static_cast<std::ptrdiff_t>(i));
      }
    }
    reap_peers();
    if (receiving_ > 0) continue;  // pulling: spin
    wait_for_events(closing_.empty() ? kIdlePollMs : kClosingPollMs);
  }
}

// Before the worker exists (start-up): only commands wake the thread.
void Node::wait_idle() {
  pollfd fd{wake_fd_, POLLIN, 0};
  ::poll(&fd, 1, kIdlePollMs);
}

void Node::on_peer_error(void* arg, ucp_ep_h, ucs_status_t) { static_cast<Peer*>(arg)->failed = true; }

// A read still waiting for its answer from an owner that failed gets none: it ends here. (A read
// already receiving ends through its receive, which UCX completes with the error.)
void Node::fail_orphaned_reads() {
  std::vector<uint64_t> orphaned;
  for (auto& [id, r] : reads_)
    if (!r->receiving && r->peer && r->peer->failed) orphaned.push_back(id);
  for (uint64_t id : orphaned) finish_read(id, {"unreachable", "the owner's endpoint failed before it answered"});
}

std::unique_ptr<Node::Peer> Node::take_peer(const std::vector<uint8_t>& address, Outcome* err) {
  auto it = idle_.find(address);
  if (it != idle_.end() && !it->second.empty()) {
    auto peer = std::move(it->second.back());
    it->second.pop_back();
    return peer;
  }
  auto peer = std::make_unique<Peer>();
  peer->address = address;
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
  // A dead owner fails the reads instead of hanging them, and a forced close can cancel them. In
  // UCX 1.13 this rules out the shared-memory transports (no peer failure handling) and CMA
  // unless UCX_CMA_MEMORY_INVALIDATE=y (ucx-addon.ts sets it): on one host the asks and answers
  // go over TCP, the bytes over CMA.
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &Node::on_peer_error;
  ep.err_handler.arg = peer.get();
  const ucs_status_t st = ucp_ep_create(worker_, &ep, &peer->ep);
  if (st != UCS_OK) {
    *err = outcome_of(st);
    if (err->code == "io_error") err->code = "unreachable";
    err->message = std::string("cannot connect to the owner's worker: ") + ucs_status_string(st);
    return nullptr;
  }
  return peer;
}

// Starts closing (forced: what is in flight on it completes as cancelled). Never called from a
// UCX callback: UCX calls must not nest in its progress. The peer lives until the close is done.
void Node::close_peer(std::unique_ptr<Peer> peer, std::optional<uint64_t> read) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t req = ucp_ep_close_nbx(peer->ep, &p);
  closing_.push_back({std::move(peer), UCS_PTR_IS_PTR(req) ? req : nullptr, read});
}

// Closes the endpoints retired inside callbacks, and frees those whose close has finished.
void Node::reap_peers() {
  auto retired = std::move(retired_peers_);
  retired_peers_.clear();
  for (auto& p : retired) close_peer(std::move(p));
  for (size_t i = 0; i < closing_.size();) {
    void* req = closing_[i].request;
    if (req != nullptr && ucp_request_check_status(req) == UCS_INPROGRESS) {
      ++i;
      continue;
    }
    if (req != nullptr) ucp_request_free(req);
    // The endpoint is gone, and with it every way to write into a cancelled read's buffer: the
    // read ends here if UCX did not complete its receive when the close purged it.
    const std::optional<uint64_t> read = closing_[i].read;
    closing_.erase(closing_.begin() + static_cast<std::ptrdiff_t>(i));
    if (read) finish_read(*read, {"aborted", "cancelled"});
  }
}

// Ends a read: its endpoint goes back to the pool, or is retired (closed by the run loop) when
// the read failed or its owner did; then its `done` runs. Unknown ids (ended already) are ignored.
void Node::finish_read(uint64_t id, Outcome outcome) {
  auto it = reads_.find(id);
  if (it == reads_.end()) return;
  std::unique_ptr<Read> r = std::move(it->second);
  reads_.erase(it);
  if (r->receiving) receiving_--;
  if (r->answer) ucp_am_data_release(worker_, r->answer);  // never pulled: the owner's send completes
  if (r->peer) {
    auto& pool = idle_[r->peer->address];
    if (!outcome.code.empty() || r->peer->failed || pool.size() >= kIdlePerOwner)
      retired_peers_.push_back(std::move(r->peer));
    else
      pool.push_back(std::move(r->peer));
  }
  r->done(std::move(outcome));
}

void Node::read(uint64_t id, std::vector<uint8_t> address, Range range, void* dst, std::function<void(Outcome)> done) {
  post([this, id, address = std::move(address), range, dst, done = std::move(done)]() mutable {
    if (reads_.count(id) != 0) return done({"bad_endpoint", "a read with this id is already in flight"});
    Outcome err;
    std::unique_ptr<Peer> peer = take_peer(address, &err);
    if (!peer) return done(err);
    ucp_ep_h ep = peer->ep;
    reads_[id] = std::make_unique<Read>(Read{std::move(peer), dst, range.length, std::move(done)});
    auto* s = new Sending{this, id, Ask{kWire, range.epoch, id, range.mapping, range.token, range.offset, range.length}, {}, false};
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY;  // the owner answers on its endpoint back to this one
    p.cb.send = &Node::on_ask_sent;
    p.user_data = s;
    ucs_status_ptr_t req = ucp_am_send_nbx(ep, kAsk, &s->ask, sizeof s->ask, nullptr, 0, &p);
    if (UCS_PTR_IS_PTR(req)) return;
    delete s;
    if (UCS_PTR_IS_ERR(req)) finish_read(id, outcome_of(UCS_PTR_STATUS(req)));
  });
}

void Node::on_ask_sent(void* request, ucs_status_t status, void* user) {
  auto* s = static_cast<Sending*>(user);
  ucp_request_free(request);
  // A failed ask fails its read, unless the answer is already arriving (then its receive ends it).
  if (status != UCS_OK) {
    auto it = s->node->reads_.find(s->id);
    if (it != s->node->reads_.end() && !it->second->receiving) {
      if (it->second->peer)
        it->second->peer->failed = true;  // fail_orphaned_reads ends it, out of this callback
      else
        s->node->finish_read(s->id, outcome_of(status));
    }
  }
  delete s;
}

ucs_status_t Node::on_answer(void* arg, const void* header, size_t header_length, void* data, size_t length,
                             const ucp_am_recv_param_t* param) {
  return static_cast<Node*>(arg)->receive(header, header_length, data, length, param);
}

// The owner's answer to one of this process's reads: the range's bytes (pulled into the read's
// destination), or why not. Answers for reads that ended, or from another endpoint than the one
// the read asked on, are dropped.
ucs_status_t Node::receive(const void* header, size_t header_length, void* data, size_t length, const ucp_am_recv_param_t* param) {
  Answer a{};
  if (header_length != sizeof a) return UCS_ERR_INVALID_PARAM;
  std::memcpy(&a, header, sizeof a);
  auto it = reads_.find(a.read_id);
  if (a.wire != kWire || it == reads_.end() || it->second->receiving || it->second->answer || !it->second->peer) return UCS_ERR_CANCELED;
  Read& r = *it->second;
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) && param->reply_ep != r.peer->ep) return UCS_ERR_CANCELED;
  if (a.status != kOk) {
    finish_read(a.read_id, outcome_of(static_cast<AnswerStatus>(a.status)));
    return UCS_OK;
  }
  if (length != r.length) {
    finish_read(a.read_id, {"bad_endpoint", "the owner answered " + std::to_string(length) + " bytes, not " + std::to_string(r.length)});
    return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
  }
  if (!rndv) {  // small enough to come with the answer
    std::memcpy(r.dst, data, length);
    finish_read(a.read_id, {});
    return UCS_OK;
  }
  if (receiving_ > 0) {
    // One pull at a time, in the order the answers came: pulled together, the reads would share
    // the bandwidth and all land at the end, and the caller could start on none of them earlier.
    r.answer = data;
    queued_.push_back(a.read_id);
    return UCS_INPROGRESS;  // the descriptor stays valid until pulled or released
  }
  pull(a.read_id, r, data);
  return UCS_OK;
}

// Starts pulling an answer's bytes into the read's destination.
void Node::pull(uint64_t id, Read& r, void* data) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv_am = &Node::on_received;
  p.user_data = new Sending{this, id, {}, {}, false};
  ucs_status_ptr_t req = ucp_am_recv_data_nbx(worker_, data, r.dst, r.length, &p);
  if (UCS_PTR_IS_PTR(req)) {
    r.receiving = true;
    receiving_++;
    return;
  }
  delete static_cast<Sending*>(p.user_data);
  finish_read(id, outcome_of(UCS_PTR_IS_ERR(req) ? UCS_PTR_STATUS(req) : UCS_OK));
}

// Once no pull is under way: the next queued answer whose read is still waiting.
void Node::pull_next() {
  while (receiving_ == 0 && !queued_.empty()) {
    const uint64_t id = queued_.front();
    queued_.pop_front();
    auto it = reads_.find(id);
    if (it == reads_.end() || it->second->answer == nullptr) continue;  // ended meanwhile
    void* data = std::exchange(it->second->answer, nullptr);
    pull(id, *it->second, data);
  }
}

void Node::on_received(void* request, ucs_status_t status, size_t, void* user) {
  auto* s = static_cast<Sending*>(user);
  ucp_request_free(request);
  Outcome o = outcome_of(status);
  if (status == UCS_ERR_CANCELED) o.message = "cancelled";
  // The pull failed mid-way: on one host CMA says so when the owner's process is gone.
  if (status == UCS_ERR_IO_ERROR) o = {"unreachable", std::string("the owner failed mid-read: ") + ucs_status_string(status)};
  s->node->finish_read(s->id, std::move(o));
  delete s;
}

void Node::cancel(uint64_t id) {
  post([this, id] {
    auto it = reads_.find(id);
    if (it == reads_.end() || !it->second->peer) return;  // done already, or cancelled
    Read& r = *it->second;
    // A read still waiting for its answer ends now (a late answer finds no read); a read that is
    // receiving ends when UCX completes its receive as cancelled, or at the latest when its
    // endpoint's close is done: after either, nothing writes into its buffer.
    if (!r.receiving) {
      if (r.answer) ucp_am_data_release(worker_, std::exchange(r.answer, nullptr));  // before its endpoint goes
      close_peer(std::move(r.peer));
      finish_read(id, {"aborted", "cancelled"});
    } else {
      close_peer(std::move(r.peer), id);
    }
  });
}

ucs_status_t Node::on_ask(void* arg, const void* header, size_t header_length, void*, size_t, const ucp_am_recv_param_t* param) {
  return static_cast<Node*>(arg)->answer(header, header_length, param);
}

// Maps the shard pages of [p, p + n) into this process's page tables before a reader pulls
// them. A chunk the prefill has just written is in the shard file but not yet in the mapping;
// a CMA pull would then fault each 4 KiB page in one by one, on the reader's CPU and time (a
// throwaway process_vm_readv test here, not kept: a fifth slower than from mapped pages). Done
// here it costs the owner about as much, while the reader pulls the previous chunk (answers are
// pulled one at a time, Node::receive). Pages already mapped cost next to nothing.
// A hint: a kernel without MADV_POPULATE_READ (before 5.14) leaves the faults to the pull.
void Node::populate(const void* p, size_t n) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + n;
  madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_READ);
}

// Answers a reader's ask on its reply endpoint: a rendezvous send of the asked range from the
// mapped shard (the reader pulls it), or a header saying why not. UCX allows sends in a receive
// callback; the reply endpoint is valid here, and may not be later.
ucs_status_t Node::answer(const void* header, size_t header_length, const ucp_am_recv_param_t* param) {
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || param->reply_ep == nullptr) return UCS_OK;  // no way to answer
  auto* s = new Sending{this, 0, {}, {kWire, kMalformed, 0}, false};
  Ask ask{};
  if (header_length == sizeof ask) {
    std::memcpy(&ask, header, sizeof ask);
    s->answer.read_id = ask.read_id;
    auto m = mappings_.find(ask.mapping);
    if (ask.wire != kWire)
      s->answer.status = kMalformed;
    else if (m == mappings_.end() || m->second.retired || m->second.epoch != ask.epoch)
      s->answer.status = kGone;
    else if (m->second.token != ask.token)
      s->answer.status = kRefused;
    else if (ask.length == 0 || ask.offset > m->second.length || ask.length > m->second.length - ask.offset)
      s->answer.status = kOutOfRange;
    else
      s->answer.status = kOk;
  }
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_REPLY;
  p.cb.send = &Node::on_answer_sent;
  p.user_data = s;
  const void* bytes = nullptr;
  size_t count = 0;
  if (s->answer.status == kOk) {
    Mapping& m = mappings_.at(ask.mapping);
    s->id = ask.mapping;
    s->with_data = true;
    m.sending++;
    bytes = static_cast<const uint8_t*>(m.addr) + ask.offset;
    count = ask.length;
    populate(bytes, count);
    p.flags |= UCP_AM_SEND_FLAG_RNDV;  // the reader pulls the bytes; the owner copies none
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    p.memh = m.memh;
  }
  ucs_status_ptr_t req = ucp_am_send_nbx(param->reply_ep, kAnswer, &s->answer, sizeof s->answer, bytes, count, &p);
  if (!UCS_PTR_IS_PTR(req)) on_answer_sent(nullptr, UCS_PTR_STATUS(req), s);
  return UCS_OK;
}

void Node::on_answer_sent(void* request, ucs_status_t, void* user) {
  auto* s = static_cast<Sending*>(user);
  if (request) ucp_request_free(request);
  if (s->with_data) {
    auto it = s->node->mappings_.find(s->id);
    if (it != s->node->mappings_.end() && --it->second.sending == 0 && it->second.retired) s->node->release_mapping(it);
  }
  delete s;
}

uint64_t Node::expose(const std::string& path, uint64_t length, uint32_t epoch, uint64_t* token) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("UCX expose: cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < length || length == 0) {
    ::close(fd);
    throw std::runtime_error("UCX expose: " + path + " is smaller than " + std::to_string(length) + " bytes");
  }
  // Shared and read-only: readers see what the owner writes to the file, and cannot write.
  void* addr = mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (addr == MAP_FAILED) throw std::runtime_error("UCX expose: cannot map " + path + ": " + std::strerror(map_errno));
  std::string error;
  uint64_t id = 0;
  const uint64_t secret = random_token();
  run_sync([&] {
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_PROT;
    mp.address = addr;
    mp.length = length;
    mp.prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_REMOTE_READ;
    ucp_mem_h memh = nullptr;
    const ucs_status_t s = ucp_mem_map(context_, &mp, &memh);
    if (s != UCS_OK) {
      error = std::string("ucp_mem_map: ") + ucs_status_string(s);
      return;
    }
    id = next_mapping_++;
    mappings_[id] = Mapping{memh, addr, length, epoch, secret};
  });
  if (!error.empty()) {
    munmap(addr, length);
    throw std::runtime_error("UCX expose: " + error);
  }
  *token = secret;
  return id;
}

void Node::unexpose(uint64_t id) {
  run_sync([&] {
    auto it = mappings_.find(id);
    if (it == mappings_.end() || it->second.retired) return;
    it->second.retired = true;
    if (it->second.sending == 0) release_mapping(it);
  });
}

// Unregisters a retired mapping with no answers in flight. Its range stays reserved, as zero
// pages, until the process ends: a reader that still pulls from it (its endpoint failed on this
// side only) copies zeros instead of whatever a later mapping at that address would hold.
void Node::release_mapping(std::map<uint64_t, Mapping>::iterator it) {
  ucp_mem_unmap(context_, it->second.memh);
  void* zeros = mmap(it->second.addr, it->second.length, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  if (zeros == MAP_FAILED)
    munmap(it->second.addr, it->second.length);
  else
    retired_.push_back({it->second.addr, it->second.length});
  mappings_.erase(it);
}

}  // namespace ctx::ucx
