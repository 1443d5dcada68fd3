#include "ucx/ucx_node.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <stdexcept>

namespace ctx::ucx {

namespace {

std::runtime_error ucx_error(const char* what, ucs_status_t status) {
  return std::runtime_error(std::string(what) + ": " + ucs_status_string(status));
}

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

// While reads are in flight the thread spins on the worker; idle, it still progresses every few
// ms (wire-up and, where no transport reads remotely, UCX's emulated reads need the owner's worker).
constexpr auto kIdleProgress = std::chrono::milliseconds(2);
constexpr auto kBusyAfterProgress = std::chrono::milliseconds(5);

}  // namespace

struct Node::Peer {
  std::vector<uint8_t> address;
  ucp_ep_h ep = nullptr;
  std::map<std::vector<uint8_t>, ucp_rkey_h> rkeys;
  bool failed = false;
};

struct Node::Get {
  uint64_t id;
  std::function<void(Outcome)> done;
  Node* node;
};

// Idle endpoints kept per owner; more reads at once open more, closed when they come back.
constexpr size_t kIdlePerOwner = 16;

Node::Node() {
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
    params.features = UCP_FEATURE_RMA;
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
    ucp_address_t* addr = nullptr;
    size_t len = 0;
    st = ucp_worker_get_address(worker_, &addr, &len);
    if (st != UCS_OK) {
      error = std::string("ucp_worker_get_address: ") + ucs_status_string(st);
      return;
    }
    address_.assign(reinterpret_cast<uint8_t*>(addr), reinterpret_cast<uint8_t*>(addr) + len);
    ucp_worker_release_address(worker_, addr);
    void* page = mmap(nullptr, kFenceSlots * sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) {
      error = "cannot map the epoch page";
      return;
    }
    fence_ = static_cast<uint64_t*>(page);
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_PROT;
    mp.address = page;
    mp.length = kFenceSlots * sizeof(uint64_t);
    mp.prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE | UCP_MEM_MAP_PROT_REMOTE_READ;
    st = ucp_mem_map(context_, &mp, &fence_memh_);
    if (st != UCS_OK) {
      error = std::string("ucp_mem_map: ") + ucs_status_string(st);
      return;
    }
    void* packed = nullptr;
    size_t size = 0;
    st = ucp_rkey_pack(context_, fence_memh_, &packed, &size);
    if (st != UCS_OK) {
      error = std::string("ucp_rkey_pack: ") + ucs_status_string(st);
      return;
    }
    fence_rkey_.assign(static_cast<uint8_t*>(packed), static_cast<uint8_t*>(packed) + size);
    ucp_rkey_buffer_release(packed);
  });
  if (!error.empty()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
    if (fence_memh_) ucp_mem_unmap(context_, fence_memh_);
    if (fence_) munmap(fence_, kFenceSlots * sizeof(uint64_t));
    if (worker_) ucp_worker_destroy(worker_);
    if (context_) ucp_cleanup(context_);
    throw std::runtime_error("UCX: " + error);
  }
}

Node::~Node() {
  run_sync([this] {
    while (!busy_.empty()) {
      auto peer = std::move(busy_.begin()->second);
      busy_.erase(busy_.begin());
      close_peer(std::move(peer));
    }
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
    ucp_mem_unmap(context_, fence_memh_);
  });
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  ucp_worker_destroy(worker_);
  ucp_cleanup(context_);
  munmap(fence_, kFenceSlots * sizeof(uint64_t));
}

void Node::post(std::function<void()> command) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    commands_.push_back(std::move(command));
  }
  wake_.notify_all();
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
  auto last_progress = std::chrono::steady_clock::now();
  for (;;) {
    std::deque<std::function<void()>> batch;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // Busy a moment after the last progress: an owner serving emulated reads has none in flight
      // of its own, and sleeping between its fragments would throttle the reader.
      const bool busy = in_flight_ > 0 || std::chrono::steady_clock::now() - last_progress < kBusyAfterProgress;
      if (commands_.empty() && !stop_ && !busy) wake_.wait_for(lock, kIdleProgress);
      if (stop_ && commands_.empty()) return;
      batch.swap(commands_);
    }
    for (auto& c : batch) c();
    if (!worker_) continue;
    bool progressed = false;
    while (ucp_worker_progress(worker_) != 0) progressed = true;
    if (progressed) last_progress = std::chrono::steady_clock::now();
    // Idle endpoints whose owner failed (busy ones are closed when their read completes).
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
    std::this_thread::yield();
  }
}

void Node::on_peer_error(void* arg, ucp_ep_h, ucs_status_t) { static_cast<Peer*>(arg)->failed = true; }

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
  // UCX 1.13 this rules out the shared-memory transports (no peer failure handling): on one host
  // the reads then go over TCP, with UCX serving them on the owner's worker (see the README).
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

// Starts closing (forced: a read in flight on it completes as cancelled). Never called from a
// UCX callback: UCX calls must not nest in its progress. The peer lives until the close is done.
void Node::close_peer(std::unique_ptr<Peer> peer) {
  for (auto& [bytes, rkey] : peer->rkeys) ucp_rkey_destroy(rkey);
  peer->rkeys.clear();
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t req = ucp_ep_close_nbx(peer->ep, &p);
  closing_.push_back({std::move(peer), UCS_PTR_IS_PTR(req) ? req : nullptr});
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
    closing_.erase(closing_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

void Node::on_get_done(void* request, ucs_status_t status, void* user) {
  auto* g = static_cast<Get*>(user);
  ucp_request_free(request);
  g->node->in_flight_--;
  g->node->finish_get(g->id, status);
  g->done(outcome_of(status));
  delete g;
}

// The read's endpoint goes back to the pool, or is retired (closed by the run loop) when its
// owner failed. A cancelled read's endpoint is no longer in busy_ (cancel() took it).
void Node::finish_get(uint64_t id, ucs_status_t status) {
  auto it = busy_.find(id);
  if (it == busy_.end()) return;
  auto peer = std::move(it->second);
  busy_.erase(it);
  auto& pool = idle_[peer->address];
  if (status != UCS_OK || peer->failed || pool.size() >= kIdlePerOwner) {
    retired_peers_.push_back(std::move(peer));
  } else {
    pool.push_back(std::move(peer));
  }
}

void Node::get(uint64_t id, std::vector<uint8_t> address, std::vector<uint8_t> rkey_bytes, uint64_t remote, void* dst, uint64_t length,
               std::function<void(Outcome)> done) {
  post([this, id, address = std::move(address), rkey_bytes = std::move(rkey_bytes), remote, dst, length, done = std::move(done)]() mutable {
    Outcome err;
    std::unique_ptr<Peer> owned = take_peer(address, &err);
    if (!owned) return done(err);
    Peer* peer = owned.get();
    busy_[id] = std::move(owned);
    ucp_rkey_h rkey = nullptr;
    auto rk = peer->rkeys.find(rkey_bytes);
    if (rk != peer->rkeys.end()) {
      rkey = rk->second;
    } else {
      const ucs_status_t st = ucp_ep_rkey_unpack(peer->ep, rkey_bytes.data(), &rkey);
      if (st != UCS_OK) {
        finish_get(id, st);
        return done({"bad_endpoint", std::string("cannot unpack the owner's remote key: ") + ucs_status_string(st)});
      }
      peer->rkeys[rkey_bytes] = rkey;
    }
    auto* g = new Get{id, std::move(done), this};
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = &Node::on_get_done;
    p.user_data = g;
    ucs_status_ptr_t req = ucp_get_nbx(peer->ep, dst, length, remote, rkey, &p);
    if (UCS_PTR_IS_PTR(req)) {
      in_flight_++;
      return;
    }
    const ucs_status_t st = UCS_PTR_STATUS(req);
    finish_get(id, st);
    g->done(outcome_of(st));
    delete g;
  });
}

void Node::cancel(uint64_t id) {
  post([this, id] {
    auto it = busy_.find(id);
    if (it == busy_.end()) return;  // done already, or not started
    auto peer = std::move(it->second);
    busy_.erase(it);
    close_peer(std::move(peer));
  });
}

uint64_t Node::expose(const std::string& path, uint64_t length, uint64_t epoch, Exposed* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("UCX expose: cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < length || length == 0) {
    ::close(fd);
    throw std::runtime_error("UCX expose: " + path + " is smaller than " + std::to_string(length) + " bytes");
  }
  // Shared and read-only: remote readers see what the owner writes to the file, and cannot write.
  void* addr = mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (addr == MAP_FAILED) throw std::runtime_error("UCX expose: cannot map " + path + ": " + std::strerror(map_errno));
  std::string error;
  uint64_t id = 0;
  run_sync([&] {
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_PROT;
    mp.address = addr;
    mp.length = length;
    mp.prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_REMOTE_READ;
    ucp_mem_h memh = nullptr;
    ucs_status_t s = ucp_mem_map(context_, &mp, &memh);
    if (s != UCS_OK) {
      error = ucx_error("ucp_mem_map", s).what();
      return;
    }
    void* packed = nullptr;
    size_t size = 0;
    s = ucp_rkey_pack(context_, memh, &packed, &size);
    if (s != UCS_OK) {
      ucp_mem_unmap(context_, memh);
      error = ucx_error("ucp_rkey_pack", s).what();
      return;
    }
    out->rkey.assign(static_cast<uint8_t*>(packed), static_cast<uint8_t*>(packed) + size);
    ucp_rkey_buffer_release(packed);
    id = next_mapping_++;
    const size_t slot = next_slot_++ % kFenceSlots;
    __atomic_store_n(&fence_[slot], epoch, __ATOMIC_RELEASE);
    mappings_[id] = {memh, addr, length, slot};
    out->fence = reinterpret_cast<uint64_t>(&fence_[slot]);
    out->fence_rkey = fence_rkey_;
  });
  if (!error.empty()) {
    munmap(addr, length);
    throw std::runtime_error("UCX expose: " + error);
  }
  out->base = reinterpret_cast<uint64_t>(addr);
  out->length = length;
  return id;
}

void Node::unexpose(uint64_t id) {
  run_sync([&] {
    auto it = mappings_.find(id);
    if (it == mappings_.end()) return;
    // The epoch word goes first: a reader that still finds it read the pages before they went.
    __atomic_store_n(&fence_[it->second.slot], 0, __ATOMIC_SEQ_CST);
    ucp_mem_unmap(context_, it->second.memh);
    // The range stays reserved, as zero pages, until the process ends: where UCX serves reads on
    // this worker (emulated RMA), a late read of the old range copies zeros instead of faulting,
    // and it never sees whatever a later mapping at the same address would hold.
    void* zeros = mmap(it->second.addr, it->second.length, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    if (zeros == MAP_FAILED) munmap(it->second.addr, it->second.length);
    else retired_.push_back({it->second.addr, it->second.length});
    mappings_.erase(it);
  });
}

}  // namespace ctx::ucx
