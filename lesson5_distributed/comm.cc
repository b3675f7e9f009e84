// Lesson 5 — given code (not an exercise): the counting communicator over c10d and the two ways to start
// ranks (threads on one FileStore, processes on a TCPStore). See comm.h.
#include "lesson5_distributed/comm.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>

#include "common/compat/compat_distributed.h"

namespace dist {
namespace {

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

}  // namespace

double ring_allreduce_wire_bytes(double payload_bytes, int world_size) {
  TORCH_CHECK(world_size > 0, "ring_allreduce_wire_bytes: world_size must be > 0, got ", world_size);
  return 2.0 * (world_size - 1) / world_size * payload_bytes;
}

bool gloo_available() { return workshop::compat::has_gloo(); }
bool nccl_available() { return workshop::compat::has_nccl(); }

struct Comm::Impl {
  c10::intrusive_ptr<workshop::compat::Collectives> group;
  c10::intrusive_ptr<c10d::Store> store;  // kept alive as long as the group
  int rank = 0;
  int world_size = 1;
  std::chrono::milliseconds timeout{0};
  std::string backend;
  c10::Device device{c10::kCPU};
  CommStats stats;
  std::vector<std::string> log;
  std::chrono::microseconds delay{0};                  // simulated latency per collective (0: none)
  std::chrono::steady_clock::time_point seen_until{};  // when the previous collective's result was "seen"

  // The simulated latency: a collective that really finished at `done` is seen `delay` after the later of
  // `done` and the previous collective's simulated finish (one link, one message at a time). Sleeps until then.
  void delay_after(std::chrono::steady_clock::time_point done) {
    if (delay.count() <= 0) return;
    seen_until = std::max(done, seen_until) + delay;
    // Sleep while far away, then yield until the moment: a sleeping thread's wake-up on a busy machine can be
    // late by milliseconds, far more than the delay simulated here (a runnable, yielding thread is not).
    const auto spin = std::chrono::milliseconds(2);
    if (seen_until - std::chrono::steady_clock::now() > spin) std::this_thread::sleep_until(seen_until - spin);
    while (std::chrono::steady_clock::now() < seen_until) std::this_thread::yield();
  }

  // Rethrows a failed collective as one clear error: which rank, which call, and what probably happened.
  [[noreturn]] void fail(const std::string& what, const std::exception& error) const {
    const std::string message = error.what();
    const std::string text = lower(message);
    std::string reason;
    if (text.find("timed out") != std::string::npos || text.find("timeout") != std::string::npos) {
      reason = "timed out after " + std::to_string(timeout.count()) +
               " ms waiting for a peer (a rank has exited or stopped, or the ranks called different collectives)";
    } else if (text.find("connection closed") != std::string::npos || text.find("reset by peer") != std::string::npos) {
      reason = "a peer closed its connection (it exited or failed)";
    } else {
      reason = "the collective failed";
    }
    const size_t newline = message.find('\n');
    TORCH_CHECK(false, "rank ", rank, ": ", what, " failed: ", reason, " [", message.substr(0, newline), "]");
  }

  void check_tensor(const char* op, const at::Tensor& tensor) const {
    TORCH_CHECK(tensor.defined(), "rank ", rank, ": ", op, " of an undefined tensor");
    TORCH_CHECK(tensor.is_contiguous(), "rank ", rank, ": ", op,
                " needs a contiguous tensor (flatten or .contiguous() first)");
    TORCH_CHECK(tensor.device() == device, "rank ", rank, ": ", op, " of a tensor on ", tensor.device(), ", but the ",
                backend, " group works on ", device);
  }

  // Starts a collective with `launch` (a failure to start it is named as a failure to finish it is) and waits.
  template <typename Launch>
  void start_and_run(const std::string& what, const Launch& launch) {
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = launch();
    } catch (const std::exception& error) {
      fail(what, error);
    }
    run(what, work);
  }

  void run(const std::string& what, const c10::intrusive_ptr<c10d::Work>& work) {
    try {
      work->wait();
    } catch (const std::exception& error) {
      fail(what, error);
    }
    delay_after(std::chrono::steady_clock::now());
  }
};

namespace {

// When an asynchronous collective really finished: its future's callback notes the time (on Gloo's thread).
// A work without a future (getFuture unsupported) reports the time wait() returned.
using DoneAt = std::shared_ptr<std::atomic<int64_t>>;
DoneAt note_completion(const c10::intrusive_ptr<c10d::Work>& work) {
  auto done = std::make_shared<std::atomic<int64_t>>(0);
  try {
    work->getFuture()->addCallback(
        [done](c10::ivalue::Future&) { done->store(std::chrono::steady_clock::now().time_since_epoch().count()); });
  } catch (const std::exception&) {
    // no future: wait() time is used
  }
  return done;
}

}  // namespace

struct AsyncWork::Impl {
  c10::intrusive_ptr<c10d::Work> work;
  Comm::Impl* comm = nullptr;
  std::string what;
  at::Tensor tensor;                              // keeps the buffer alive while the collective writes it
  std::shared_ptr<std::atomic<int64_t>> done_at;  // steady_clock ticks when it really finished (0: unknown)
};

AsyncWork::AsyncWork() = default;
AsyncWork::AsyncWork(AsyncWork&&) noexcept = default;
AsyncWork& AsyncWork::operator=(AsyncWork&& other) noexcept {
  if (this != &other) {
    if (impl_) {
      try {
        wait();
      } catch (...) {
      }
    }
    impl_ = std::move(other.impl_);
  }
  return *this;
}
AsyncWork::~AsyncWork() {
  if (!impl_) return;
  try {
    wait();
  } catch (...) {
    // The error was (or will be) reported by whoever waited; never throw from a destructor.
  }
}
bool AsyncWork::defined() const { return impl_ != nullptr; }
void AsyncWork::wait() {
  if (!impl_ || !impl_->work) return;
  auto work = std::move(impl_->work);
  impl_->work.reset();
  Comm::Impl* comm = impl_->comm;
  try {
    work->wait();
  } catch (const std::exception& error) {
    comm->fail(impl_->what, error);
  }
  auto done = std::chrono::steady_clock::now();
  const int64_t ticks = impl_->done_at ? impl_->done_at->load() : 0;
  if (ticks != 0) done = std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(ticks));
  comm->delay_after(done);
}

Comm::Comm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Comm::~Comm() = default;
int Comm::rank() const { return impl_->rank; }
int Comm::world_size() const { return impl_->world_size; }
std::chrono::milliseconds Comm::timeout() const { return impl_->timeout; }
c10::Device Comm::device() const { return impl_->device; }
std::string Comm::backend() const { return impl_->backend; }
const CommStats& Comm::stats() const { return impl_->stats; }
void Comm::reset_stats() {
  impl_->stats = CommStats{};
  impl_->log.clear();
}
const std::vector<std::string>& Comm::log() const { return impl_->log; }
void Comm::set_simulated_delay(std::chrono::microseconds delay) {
  TORCH_CHECK(delay.count() >= 0, "rank ", impl_->rank, ": the simulated delay must be >= 0 us, got ", delay.count());
  impl_->delay = delay;
  impl_->seen_until = {};
}
std::chrono::microseconds Comm::simulated_delay() const { return impl_->delay; }

void Comm::all_reduce(const at::Tensor& tensor, ReduceOp op) {
  impl_->check_tensor("all_reduce", tensor);
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = op == ReduceOp::kMax ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
  const std::string what = "all_reduce of " + std::to_string(tensor.nbytes()) + " bytes";
  impl_->stats.calls += 1;
  impl_->stats.all_reduce_calls += 1;
  impl_->stats.all_reduce_bytes += static_cast<int64_t>(tensor.nbytes());
  impl_->log.push_back("all_reduce " + std::to_string(tensor.nbytes()));
  impl_->start_and_run(what, [&] { return impl_->group->allreduce(tensors, options); });
}

AsyncWork Comm::all_reduce_async(const at::Tensor& tensor) {
  impl_->check_tensor("all_reduce_async", tensor);
  std::vector<at::Tensor> tensors{tensor};
  AsyncWork handle;
  handle.impl_ = std::make_unique<AsyncWork::Impl>();
  handle.impl_->comm = impl_.get();
  handle.impl_->what = "all_reduce_async of " + std::to_string(tensor.nbytes()) + " bytes";
  handle.impl_->tensor = tensor;
  impl_->stats.calls += 1;
  impl_->stats.all_reduce_calls += 1;
  impl_->stats.all_reduce_bytes += static_cast<int64_t>(tensor.nbytes());
  impl_->log.push_back("all_reduce_async " + std::to_string(tensor.nbytes()));
  try {
    handle.impl_->work = impl_->group->allreduce(tensors);
  } catch (const std::exception& error) {
    impl_->fail(handle.impl_->what, error);
  }
  if (impl_->delay.count() > 0) handle.impl_->done_at = note_completion(handle.impl_->work);
  return handle;
}

void Comm::broadcast(const at::Tensor& tensor, int root) {
  if (tensor.defined() && !tensor.is_contiguous()) {
    // Any layout (a channels_last parameter, a strided view), on every rank whatever its peers' layouts: the
    // same call through a contiguous copy, so that a rank whose tensor is laid out otherwise does not fail alone.
    const at::Tensor flat = tensor.contiguous();
    broadcast(flat, root);
    at::NoGradGuard no_grad;
    tensor.copy_(flat);
    return;
  }
  impl_->check_tensor("broadcast", tensor);
  TORCH_CHECK(root >= 0 && root < impl_->world_size, "rank ", impl_->rank, ": broadcast from root ", root,
              ", but the group has ranks 0 .. ", impl_->world_size - 1);
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  const std::string what =
      "broadcast of " + std::to_string(tensor.nbytes()) + " bytes from rank " + std::to_string(root);
  impl_->stats.calls += 1;
  impl_->stats.broadcast_calls += 1;
  impl_->stats.broadcast_bytes += static_cast<int64_t>(tensor.nbytes());
  impl_->log.push_back("broadcast " + std::to_string(tensor.nbytes()));
  impl_->start_and_run(what, [&] { return impl_->group->broadcast(tensors, options); });
}

std::vector<at::Tensor> Comm::all_gather(const at::Tensor& input) {
  impl_->check_tensor("all_gather", input);
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int r = 0; r < impl_->world_size; ++r) outputs[0].push_back(at::empty_like(input));
  std::vector<at::Tensor> inputs{input};
  const std::string what = "all_gather of " + std::to_string(input.nbytes()) + " bytes";
  impl_->stats.calls += 1;
  impl_->stats.all_gather_calls += 1;
  impl_->stats.all_gather_bytes += static_cast<int64_t>(input.nbytes());
  impl_->log.push_back("all_gather " + std::to_string(input.nbytes()));
  impl_->start_and_run(what, [&] { return impl_->group->allgather(outputs, inputs); });
  return outputs[0];
}

namespace {

void check_peer(const Comm& comm, const char* op, int peer) {
  TORCH_CHECK(peer != comm.rank(), "rank ", comm.rank(), ": ", op, " with peer ", peer, ", which is this rank");
  TORCH_CHECK(peer >= 0 && peer < comm.world_size(), "rank ", comm.rank(), ": ", op, " with peer ", peer,
              ", outside 0 .. ", comm.world_size() - 1);
}

}  // namespace

AsyncWork Comm::send_async(const at::Tensor& tensor, int dst, int tag) {
  impl_->check_tensor("send", tensor);
  check_peer(*this, "send", dst);
  std::vector<at::Tensor> tensors{tensor};
  AsyncWork handle;
  handle.impl_ = std::make_unique<AsyncWork::Impl>();
  handle.impl_->comm = impl_.get();
  handle.impl_->what = "send of " + std::to_string(tensor.nbytes()) + " bytes to rank " + std::to_string(dst);
  handle.impl_->tensor = tensor;
  impl_->stats.calls += 1;
  impl_->stats.send_calls += 1;
  impl_->stats.send_bytes += static_cast<int64_t>(tensor.nbytes());
  impl_->log.push_back("send " + std::to_string(tensor.nbytes()));
  try {
    handle.impl_->work = impl_->group->send(tensors, dst, tag);
  } catch (const std::exception& error) {
    impl_->fail(handle.impl_->what, error);
  }
  return handle;
}

AsyncWork Comm::recv_async(const at::Tensor& tensor, int src, int tag) {
  impl_->check_tensor("recv", tensor);
  check_peer(*this, "recv", src);
  std::vector<at::Tensor> tensors{tensor};
  AsyncWork handle;
  handle.impl_ = std::make_unique<AsyncWork::Impl>();
  handle.impl_->comm = impl_.get();
  handle.impl_->what = "recv of " + std::to_string(tensor.nbytes()) + " bytes from rank " + std::to_string(src);
  handle.impl_->tensor = tensor;
  impl_->stats.calls += 1;
  impl_->stats.recv_calls += 1;
  impl_->stats.recv_bytes += static_cast<int64_t>(tensor.nbytes());
  impl_->log.push_back("recv " + std::to_string(tensor.nbytes()));
  try {
    handle.impl_->work = impl_->group->recv(tensors, src, tag);
  } catch (const std::exception& error) {
    impl_->fail(handle.impl_->what, error);
  }
  return handle;
}

void Comm::send(const at::Tensor& tensor, int dst, int tag) { send_async(tensor, dst, tag).wait(); }
void Comm::recv(const at::Tensor& tensor, int src, int tag) { recv_async(tensor, src, tag).wait(); }

void Comm::group_reduce_scatter(const at::Tensor& output, const at::Tensor& input) {
  impl_->check_tensor("group_reduce_scatter", output);
  impl_->check_tensor("group_reduce_scatter", input);
  TORCH_CHECK(input.numel() == output.numel() * world_size(), "group_reduce_scatter: input must have N x ",
              "output.numel() elements: ", input.numel(), " for an output of ", output.numel(), " on ", world_size(),
              " ranks");
  const std::string what = "reduce_scatter of " + std::to_string(input.nbytes()) + " bytes";
  impl_->stats.calls += 1;
  impl_->stats.reduce_scatter_calls += 1;
  impl_->stats.reduce_scatter_bytes += static_cast<int64_t>(input.nbytes());
  impl_->log.push_back("reduce_scatter " + std::to_string(input.nbytes()));
  at::Tensor out = output, in = input;  // c10d takes them by non-const reference
  impl_->start_and_run(what, [&] { return impl_->group->_reduce_scatter_base(out, in); });
}

void Comm::barrier() {
  impl_->stats.calls += 1;
  impl_->log.push_back("barrier");
  impl_->start_and_run("barrier", [&] { return impl_->group->barrier(); });
}

namespace {

std::unique_ptr<Comm> make_comm(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                                std::chrono::milliseconds timeout, const std::string& backend,
                                const std::string& gloo_host = "127.0.0.1") {
  TORCH_CHECK(world_size > 0, "world_size must be > 0, got ", world_size);
  TORCH_CHECK(rank >= 0 && rank < world_size, "rank ", rank, " is outside 0 .. ", world_size - 1);
  TORCH_CHECK(backend == "gloo" || backend == "nccl", "unknown backend '", backend, "' (gloo or nccl)");
  auto impl = std::make_unique<Comm::Impl>();
  impl->store = store;
  impl->rank = rank;
  impl->world_size = world_size;
  impl->timeout = timeout;
  impl->backend = backend;
  try {
    if (backend == "gloo") {
      impl->group = workshop::compat::gloo_group(store, rank, world_size, timeout, gloo_host);
    } else {
      impl->device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(rank));
      impl->group = workshop::compat::nccl_group(store, rank, world_size, timeout);
    }
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& error) {
    impl->fail("joining the " + backend + " group of " + std::to_string(world_size) + " ranks", error);
  }
  return std::make_unique<Comm>(std::move(impl));
}

std::string fresh_folder() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string pattern = std::string(base && *base ? base : "/tmp") + "/workshop_ranks_XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  TORCH_CHECK(mkdtemp(buffer.data()) != nullptr, "run_ranks: cannot create a folder for the store under ", pattern);
  return std::string(buffer.data());
}

}  // namespace

std::vector<RankOutcome> run_ranks_collect(const LaunchOptions& options, const std::function<void(Comm&)>& fn) {
  TORCH_CHECK(options.world_size > 0, "run_ranks: world_size must be > 0, got ", options.world_size);
  TORCH_CHECK(options.timeout.count() > 0, "run_ranks: the timeout must be > 0 ms");
  const std::string folder = fresh_folder();
  const std::string path = folder + "/store";
  std::vector<RankOutcome> outcomes(static_cast<size_t>(options.world_size));
  std::vector<std::unique_ptr<Comm>> comms(static_cast<size_t>(options.world_size));
  {
    std::vector<std::thread> threads;
    for (int rank = 0; rank < options.world_size; ++rank) {
      threads.emplace_back([&, rank] {
        RankOutcome& outcome = outcomes[static_cast<size_t>(rank)];
        try {
          auto store = workshop::compat::file_store(path, options.world_size, options.timeout);
          comms[static_cast<size_t>(rank)] =
              make_comm(store, rank, options.world_size, options.timeout, options.backend);
          fn(*comms[static_cast<size_t>(rank)]);
          outcome.ok = true;
        } catch (const c10::Error& error) {
          outcome.error = error.what_without_backtrace();
        } catch (const std::exception& error) {
          outcome.error = error.what();
        }
      });
    }
    for (auto& thread : threads) thread.join();
  }
  comms.clear();  // every group closes only now: an early return looks like a stalled peer, not a crash
  std::error_code ignored;
  std::filesystem::remove_all(folder, ignored);
  return outcomes;
}

void run_ranks(const LaunchOptions& options, const std::function<void(Comm&)>& fn) {
  const std::vector<RankOutcome> outcomes = run_ranks_collect(options, fn);
  std::ostringstream errors;
  for (size_t rank = 0; rank < outcomes.size(); ++rank) {
    if (!outcomes[rank].ok)
      errors << (errors.tellp() > 0 ? "\n" : "") << "rank " << rank << ": " << outcomes[rank].error;
  }
  TORCH_CHECK(errors.tellp() == 0, errors.str());
}

struct TcpRendezvous::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
  std::chrono::milliseconds timeout;
};

TcpRendezvous::TcpRendezvous(const std::string& host, int port, bool is_server, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  TORCH_CHECK(port >= 0 && port < 65536, "TcpRendezvous: port ", port, " is not a TCP port");
  impl_->timeout = timeout;
  impl_->store = workshop::compat::tcp_store(host, static_cast<uint16_t>(port), is_server, timeout);
}
TcpRendezvous::~TcpRendezvous() = default;
int TcpRendezvous::port() const { return workshop::compat::tcp_store_port(*impl_->store); }
void TcpRendezvous::set(const std::string& key, const std::string& value) {
  impl_->store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
}
std::string TcpRendezvous::get(const std::string& key) {
  impl_->store->wait({key}, impl_->timeout);
  const std::vector<uint8_t> value = impl_->store->get(key);
  return std::string(value.begin(), value.end());
}
bool TcpRendezvous::has(const std::string& key) { return impl_->store->check({key}); }
std::unique_ptr<Comm> TcpRendezvous::join(int rank, int world_size, const std::string& backend,
                                          const std::string& gloo_host) {
  TORCH_CHECK(!gloo_host.empty(),
              "TcpRendezvous::join: the Gloo host is empty (an address such as 127.0.0.1, or "
              "iface:NAME)");
  return make_comm(impl_->store, rank, world_size, impl_->timeout, backend, gloo_host);
}

}  // namespace dist
