// Lesson 5 — the communicator the lesson gives you (not an exercise): one rank's handle on a real c10d
// process group (LibTorch's distributed engine: ProcessGroupGloo on CPU, ProcessGroupNCCL on CUDA), which
// counts every collective call and the bytes handed to it, and two ways to start ranks:
//   * run_ranks(): N threads in this process, each with its OWN process group, all meeting in one FileStore
//     (what the checks use: deterministic, no sockets to clean up but Gloo's own loopback TCP);
//   * TcpRendezvous: separate processes meeting at a TCPStore host:port, the way torchrun starts them (the demo
//     and //bench use it).
// Either way the collectives are Gloo's (or NCCL's) own: the bytes really travel over TCP (loopback) between
// the groups. Nothing here is a home-made communication layer; it only counts and names errors.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace dist {

/// How all_reduce combines the ranks' tensors.
enum class ReduceOp { kSum, kMax };

/// What one rank's communicator has done since it was made (or since reset_stats()). Bytes are the payload
/// handed to the collectives (tensor.nbytes(), per call), not what the algorithm puts on the wire: a ring
/// all-reduce of B bytes sends about 2 (N - 1) / N * B per rank (see ring_allreduce_wire_bytes).
struct CommStats {
  int64_t calls = 0;  ///< every call (all_reduce, broadcast, all_gather, barrier, send, recv)
  int64_t all_reduce_calls = 0;
  int64_t all_reduce_bytes = 0;
  int64_t broadcast_calls = 0;
  int64_t broadcast_bytes = 0;  ///< counted on every rank (the root sends them, the others receive them)
  int64_t all_gather_calls = 0;
  int64_t all_gather_bytes = 0;      ///< this rank's input bytes per call
  int64_t send_calls = 0;            ///< point-to-point sends (send, send_async)
  int64_t send_bytes = 0;            ///< bytes this rank sent point-to-point
  int64_t recv_calls = 0;            ///< point-to-point receives (recv, recv_async)
  int64_t recv_bytes = 0;            ///< bytes this rank received point-to-point (not in bytes(): a peer sent them)
  int64_t reduce_scatter_calls = 0;  ///< the group's own reduce-scatter (group_reduce_scatter)
  int64_t reduce_scatter_bytes = 0;  ///< its input bytes per call (the whole payload, N chunks)
  /// Bytes this rank handed to the group: the collectives' payloads plus what it sent point-to-point.
  int64_t bytes() const {
    return all_reduce_bytes + broadcast_bytes + all_gather_bytes + send_bytes + reduce_scatter_bytes;
  }
};

/// Bytes a ring all-reduce of `payload_bytes` sends from each rank: reduce-scatter then all-gather, each
/// (N - 1) / N of the payload. The napkin math for the demo and //bench (Gloo may pick another algorithm).
double ring_allreduce_wire_bytes(double payload_bytes, int world_size);

/// An all-reduce started with Comm::all_reduce_async. wait() blocks until it is done (rethrowing its error
/// as a clear c10::Error); it is a no-op once done. A handle that is dropped without wait() waits in its
/// destructor, so a buffer is never freed while the collective still writes it.
class AsyncWork {
 public:
  AsyncWork();
  ~AsyncWork();
  AsyncWork(AsyncWork&&) noexcept;
  AsyncWork& operator=(AsyncWork&&) noexcept;
  void wait();
  bool defined() const;

 private:
  friend class Comm;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// One rank's member of a process group. Every collective must be called by every rank of the group, in
/// the same order, with tensors of the same shape and dtype; all work in place on `tensor`. A collective
/// that a peer never joins fails after the group's timeout with an error that says so (it does not hang).
class Comm {
 public:
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const;
  int world_size() const;
  std::chrono::milliseconds timeout() const;
  c10::Device device() const;   ///< CPU for Gloo, this rank's CUDA device for NCCL
  std::string backend() const;  ///< "gloo" or "nccl"

  /// Combines `tensor` across the ranks (sum or max), in place on every rank. Blocks until done.
  void all_reduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  /// Starts a sum all-reduce of `tensor` in the background (Gloo's worker threads) and returns at once.
  AsyncWork all_reduce_async(const at::Tensor& tensor);
  /// Copies `tensor` of rank `root` into `tensor` of every other rank. Any layout (channels_last, a strided
  /// view; each rank's own): a non-contiguous tensor travels through a contiguous copy.
  void broadcast(const at::Tensor& tensor, int root);
  /// Every rank's `input` (all of the same shape), in rank order: out[r] is rank r's.
  std::vector<at::Tensor> all_gather(const at::Tensor& input);
  /// Returns once every rank has called it.
  void barrier();
  /// The process group's OWN reduce-scatter (c10d's `_reduce_scatter_base`), for setting lesson 7's ring beside
  /// it: `input` (contiguous, N x output.numel() elements, the same on every rank's shape) is summed across the
  /// ranks and rank r gets chunk r in `output`. LibTorch 1.13's Gloo has none (throws "does not support", the
  /// group's words); 2.x's Gloo all-reduces a copy of `input` and copies out its chunk (ProcessGroupGloo::
  /// reduce_scatter_tensor_coalesced: an all-reduce's bytes); NCCL runs a real reduce-scatter. Throws
  /// "input must have N x output.numel() elements". Counted in reduce_scatter_calls/reduce_scatter_bytes.
  void group_reduce_scatter(const at::Tensor& output, const at::Tensor& input);

  /// Point-to-point (Gloo's send/recv; lesson 7's rings are built on them): sends `tensor` to rank `dst`, which
  /// must call recv with a tensor of the same byte size and the same `tag`. A send may wait until the peer has
  /// posted its receive, so two ranks that send to each other must start at least one side asynchronously:
  /// the *_async forms return at once and finish on wait(). Counted in send_calls/send_bytes (recv_*).
  /// Throws "is this rank" for a peer equal to this rank and "outside 0 .." for a peer that does not exist.
  AsyncWork send_async(const at::Tensor& tensor, int dst, int tag = 0);
  /// Receives into `tensor` (contiguous, of the byte size the peer sends) from rank `src`, with `tag`.
  AsyncWork recv_async(const at::Tensor& tensor, int src, int tag = 0);
  void send(const at::Tensor& tensor, int dst, int tag = 0);
  void recv(const at::Tensor& tensor, int src, int tag = 0);

  const CommStats& stats() const;
  void reset_stats();

  /// For the checks and the demo: the collectives this rank launched, in order ("all_reduce 4096", ...).
  const std::vector<std::string>& log() const;

  /// A SIMULATED network latency (the demo's "On a real network" runs; 0, the default, adds nothing): every
  /// collective's result is seen `delay` after the later of its real completion and the previous collective's
  /// (simulated) completion, as on one link with that one-way latency. Kernels without netem cannot delay
  /// packets, so the delay is added here, by sleeping in wait(); output that uses it must say "simulated".
  void set_simulated_delay(std::chrono::microseconds delay);
  std::chrono::microseconds simulated_delay() const;

  struct Impl;
  explicit Comm(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

/// How run_ranks starts its ranks.
struct LaunchOptions {
  int world_size = 2;
  /// Every wait (rendezvous and collectives) gives up after this and fails with a clear error.
  std::chrono::milliseconds timeout{std::chrono::seconds(10)};
  std::string backend = "gloo";  ///< "gloo" (CPU tensors) or "nccl" (CUDA tensors, one device per rank)
};

/// What one rank's function did.
struct RankOutcome {
  bool ok = false;
  std::string error;  ///< the exception's message when !ok
};

/// Runs `fn(comm)` for ranks 0 .. world_size - 1, each on its own thread with its own process group; all
/// groups meet in one FileStore in a fresh temporary folder, which is removed afterwards. Returns when every
/// rank has finished; a rank that returns early keeps its group open until then (to the others it looks
/// like a peer that stopped answering: their collectives time out). Returns one outcome per rank.
std::vector<RankOutcome> run_ranks_collect(const LaunchOptions& options, const std::function<void(Comm&)>& fn);

/// run_ranks_collect, then throws one error that lists every failed rank ("rank 1: ...").
void run_ranks(const LaunchOptions& options, const std::function<void(Comm&)>& fn);

/// A TCPStore at host:port: the torchrun-style rendezvous of separate processes. The server listens (port 0:
/// the system picks a free one, see port()); the others connect to it. Besides making groups, it carries
/// small strings between processes (the demo's results).
class TcpRendezvous {
 public:
  TcpRendezvous(const std::string& host, int port, bool is_server, std::chrono::milliseconds timeout);
  ~TcpRendezvous();
  int port() const;
  void set(const std::string& key, const std::string& value);
  /// Waits (up to the timeout) for `key` and returns its value.
  std::string get(const std::string& key);
  /// Whether `key` has been set (does not wait).
  bool has(const std::string& key);
  /// This process's member of a group of `world_size` ranks on this store. Gloo's TCP device binds to
  /// `gloo_host`: an address of this machine (127.0.0.1: loopback; in a network namespace, the address of its
  /// interface) or, written "iface:NAME", the first address of the interface NAME.
  std::unique_ptr<Comm> join(int rank, int world_size, const std::string& backend = "gloo",
                             const std::string& gloo_host = "127.0.0.1");

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// True where this LibTorch was found with Gloo (CPU collectives); NCCL where it has CUDA and NCCL.
bool gloo_available();
bool nccl_available();

}  // namespace dist
