// The distributed part of the compatibility layer: LibTorch's c10d process groups (Gloo on CPU, NCCL on CUDA)
// and stores, as LibTorch 1.13 (Debian 12) and 2.x (Debian 13, PyTorch wheels) spell them. Only
// lesson5_distributed/comm.cc includes it: the c10d and Gloo headers are heavy and version-dependent.
//
// What differs:
//   * 1.13: ProcessGroupGloo/ProcessGroupNCCL derive from c10d::ProcessGroup. 2.x: they derive from
//     c10d::Backend (ProcessGroup became a dispatcher over backends). Both bases declare the same virtual
//     collectives (allreduce, broadcast, allgather, barrier taking std::vector<at::Tensor>&), so the
//     workshop holds the backend through `Collectives`.
//   * 2.x's TCPStoreOptions has useLibUV (default true from 2.4); the workshop asks for the classic server,
//     which every version has.
//   * ProcessGroupGloo.hpp needs the Gloo headers (Debian: libgloo-dev; a PyTorch wheel ships them) and the
//     build flag USE_C10D_GLOO, which LibTorch's own build sets and its headers do not.
#pragma once

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <thread>

#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/version.h>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#if __has_include(<gloo/algorithm.h>)
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#define WORKSHOP_HAS_GLOO 1
#else
#define WORKSHOP_HAS_GLOO 0
#endif

// NCCL: only where LibTorch has CUDA and nccl.h is on the include path (a CUDA PyTorch wheel with nvidia-nccl).
#if defined(WORKSHOP_HAS_CUDA) && WORKSHOP_HAS_CUDA && __has_include(<nccl.h>) && \
    __has_include(<torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>)
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL 1
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#define WORKSHOP_HAS_NCCL 1
#else
#define WORKSHOP_HAS_NCCL 0
#endif

#define WORKSHOP_TORCH_DIST_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#if WORKSHOP_TORCH_DIST_AT_LEAST(2, 0)
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

namespace workshop {
namespace compat {

/// The base class of one backend's collectives (1.13: c10d::ProcessGroup; 2.x: c10d::Backend).
#if WORKSHOP_TORCH_DIST_AT_LEAST(2, 0)
using Collectives = c10d::Backend;
#else
using Collectives = c10d::ProcessGroup;
#endif

inline bool has_gloo() { return WORKSHOP_HAS_GLOO != 0; }
inline bool has_nccl() { return WORKSHOP_HAS_NCCL != 0; }

/// A store in a file every rank can open (ranks on one machine): `world_size` users, `timeout` for waits.
inline c10::intrusive_ptr<c10d::Store> file_store(const std::string& path, int world_size,
                                                  std::chrono::milliseconds timeout) {
  auto store = c10::make_intrusive<c10d::FileStore>(path, world_size);
  store->setTimeout(timeout);
  return store;
}

/// A TCP store at host:port, the torchrun-style rendezvous. The server (is_server) listens; port 0 lets the
/// system choose a free port (read it back with tcp_store_port).
inline c10::intrusive_ptr<c10d::TCPStore> tcp_store(const std::string& host, uint16_t port, bool is_server,
                                                    std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = port;
  options.isServer = is_server;
  options.waitWorkers = false;
  options.timeout = timeout;
#if WORKSHOP_TORCH_DIST_AT_LEAST(2, 4)
  options.useLibUV = false;
#endif
  return c10::make_intrusive<c10d::TCPStore>(host, options);
}

inline uint16_t tcp_store_port(const c10d::TCPStore& store) { return store.getPort(); }

/// The nice value of Gloo's TCP event-loop thread (one per group; the rank's own thread and the group's worker
/// threads keep theirs), from the environment variable WORKSHOP_GLOO_LOOP_NICE: unset or 0 leaves Gloo as it is
/// (the default: the checks and the recorded runs), 1 to 19 lowers that one thread. Why one would: that loop
/// busy-polls while a rank's thread holds the lock of the connection it has events for (Pair::handleEvents only
/// try-locks it and returns, and level-triggered epoll_wait reports the same socket again at once;
/// pytorch/gloo#246). Where the ranks' threads outnumber the cores (2 rank processes on 2 cores) the spinning loop
/// takes the core from the very thread it waits for: in lesson 7's demo the sharded step (58 calls) burned 35 to
/// 55 ms of loop CPU per rank and step; at nice 19, 10 to 15 ms (docs/results/lesson7_cpu_profile.md). The price:
/// a loop at nice 19 runs only when no nice-0 thread wants the core, and it is the thread that reads every
/// received byte, so on a machine busy with other work (a build beside the tests) every message can wait. Hence
/// opt-in. Raising one's own nice value needs no privilege. Throws "WORKSHOP_GLOO_LOOP_NICE must be an integer
/// in 0..19" for anything else.
inline int gloo_loop_nice() {
  const char* text = std::getenv("WORKSHOP_GLOO_LOOP_NICE");
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  TORCH_CHECK(*end == '\0' && value >= 0 && value <= 19, "WORKSHOP_GLOO_LOOP_NICE must be an integer in 0..19, got '",
              text, "'");
  return static_cast<int>(value);
}

/// `make()` run on a new thread whose nice value is `nice` (Linux: per thread, and inherited by the threads that
/// thread starts); its result or its exception comes back here. Where the nice value cannot be set, it runs anyway.
template <typename Make>
auto on_thread_with_nice(int nice, const Make& make) -> decltype(make()) {
  decltype(make()) out;
  std::exception_ptr error;
  std::thread maker([&] {
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), nice);  // best effort
    try {
      out = make();
    } catch (...) {
      error = std::current_exception();
    }
  });
  maker.join();
  if (error) std::rethrow_exception(error);
  return out;
}

/// A Gloo group for `rank` of `world_size` on `store`, talking TCP over `host`: an address (127.0.0.1 for
/// loopback) or "iface:NAME" for an interface. createDeviceForHostname / createDeviceForInterface take one
/// string in 1.13 and (string, bool lazyInit = false) in 2.x: the one-argument call compiles on both.
inline c10::intrusive_ptr<Collectives> gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                  int world_size, std::chrono::milliseconds timeout,
                                                  const std::string& host) {
#if WORKSHOP_HAS_GLOO
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  const std::string iface = "iface:";
  const auto make_device = [&] {
    return host.rfind(iface, 0) == 0 ? c10d::ProcessGroupGloo::createDeviceForInterface(host.substr(iface.size()))
                                     : c10d::ProcessGroupGloo::createDeviceForHostname(host);
  };
  // The device starts Gloo's event-loop thread; made on a thread of the loop's nice value, the loop inherits it.
  const int nice = gloo_loop_nice();
  options->devices.push_back(nice == 0 ? make_device() : on_thread_with_nice(nice, make_device));
  options->threads = 2;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, options);
#else
  TORCH_CHECK(false,
              "this LibTorch was found without the Gloo headers (gloo/algorithm.h): on Debian install "
              "libgloo-dev (tools/setup.sh does)");
#endif
}

/// An NCCL group for `rank` of `world_size` on `store` (one CUDA device per rank).
inline c10::intrusive_ptr<Collectives> nccl_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                  int world_size, std::chrono::milliseconds timeout) {
#if WORKSHOP_HAS_NCCL
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, options);
#else
  TORCH_CHECK(false,
              "NCCL is not available in this build: it needs a CUDA LibTorch and nccl.h on the include "
              "path");
#endif
}

}  // namespace compat
}  // namespace workshop
