// Lesson 7 — where the sharded step's CPU goes (docs/results/lesson7_cpu_profile.md): a measurement, not a check.
// Starts 2 (--world_size) ranks as processes of this binary on loopback (lesson 5's launcher, as the demo's
// --world_size does) and, per case, times `reps` repetitions of one pattern on every rank: wall ms and CPU ms
// (getrusage, user + system) per repetition, of the whole process (Gloo's threads included) and of the calling
// thread alone. Rank 0's figures are printed. Cases: communication patterns (the rings, Gloo's all-reduce, an
// agreement, tiny exchanges) and the demo's training step, replicated (no communication) and sharded.
//   bazel build --config=ci //solutions/lesson7_fsdp:cpu_probe
//   OMP_NUM_THREADS=1 .bazel/bin/solutions/lesson7_fsdp/cpu_probe [--world_size=2] [--reps=40] [--cases=a,b]
//       [--loop_nice=0]   (root only: Gloo's event loop back at nice 0, as LibTorch starts it: the "before")
// Under `perf stat -e syscalls:sys_enter_epoll_wait` it also counts the event loop's wake-ups.
#include <dirent.h>
#include <errno.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "lesson5_distributed/comm.h"
#include "lesson5_distributed/process_ranks.h"
#include "lesson7_fsdp/fsdp.h"

namespace {

double cpu_ms(int who) {
  rusage u{};
  getrusage(who, &u);
  const auto ms = [](const timeval& t) { return 1e3 * static_cast<double>(t.tv_sec) + 1e-3 * t.tv_usec; };
  return ms(u.ru_utime) + ms(u.ru_stime);
}

struct Case {
  std::string name;
  std::string what;
  std::function<void(dist::Comm&)> once;
};

int64_t floats_of(double mib) { return static_cast<int64_t>(mib * 1024 * 1024 / 4); }

// The demo's model and data (--world_size's defaults, lesson7_fsdp/demo_parts.h and demo_ranks.cc: 8 x Linear(512,
// 512) + tanh from seed 3, 256 items per rank from seed 4, Adam(1e-3)), to time one training step as its rows do.
struct Model {
  std::vector<std::vector<torch::Tensor>> init;
  torch::Tensor x, y;
};

const Model& model(int rank) {
  static const Model m = [rank] {
    Model out;
    torch::manual_seed(3);
    for (int l = 0; l < 8; ++l) {
      torch::nn::Linear layer(512, 512);
      out.init.push_back({layer->weight.detach().clone(), layer->bias.detach().clone()});
    }
    torch::manual_seed(4);
    out.x = torch::randn({256 * 2, 512}).narrow(0, rank * 256, 256);
    out.y = torch::randn({256 * 2, 512}).narrow(0, rank * 256, 256);
    return out;
  }();
  return m;
}

torch::Tensor layer_fn(const torch::Tensor& x, const std::vector<torch::Tensor>& p) {
  return torch::tanh(torch::nn::functional::linear(x, p[0], p[1]));
}

// A training step of the sharded stack (the demo's "fully sharded" rows), `prefetch` or not.
void stack_step(dist::Comm& comm, bool prefetch) {
  struct State {
    std::vector<fsdp::FlatParam> flats;
    std::vector<fsdp::LayerFn> fns;
    std::unique_ptr<torch::optim::Adam> adam;
    std::unique_ptr<fsdp::ShardedStack> stack;
  };
  static std::unique_ptr<State> states[2];
  std::unique_ptr<State>& s = states[prefetch ? 1 : 0];
  const Model& m = model(comm.rank());
  if (!s) {
    s = std::make_unique<State>();
    std::vector<torch::Tensor> params;
    for (const auto& layer : m.init) {
      s->flats.push_back(fsdp::flatten_and_shard(layer, comm.rank(), comm.world_size()));
      params.push_back(s->flats.back().shard);
    }
    s->fns.assign(m.init.size(), fsdp::LayerFn(layer_fn));
    s->adam = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-3));
    s->stack = std::make_unique<fsdp::ShardedStack>(comm, s->flats, s->fns, prefetch);
  }
  s->adam->zero_grad();
  torch::mse_loss(s->stack->forward(m.x), m.y).backward();
  s->stack->finish();
  s->adam->step();
}

// The same model replicated, no communication: forward, backward, Adam (`forwards` forwards: 2 = the sharded
// step's recompute, done as a second forward under no-grad).
void replicated_step(dist::Comm& comm, int forwards) {
  static std::vector<std::vector<torch::Tensor>> replicas;
  static std::unique_ptr<torch::optim::Adam> adam;
  const Model& m = model(comm.rank());
  if (!adam) {
    std::vector<torch::Tensor> params;
    for (const auto& layer : m.init) {
      replicas.emplace_back();
      for (const auto& t : layer) replicas.back().push_back(t.clone().requires_grad_(true));
      params.insert(params.end(), replicas.back().begin(), replicas.back().end());
    }
    adam = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1e-3));
  }
  adam->zero_grad();
  for (int f = 1; f < forwards; ++f) {
    torch::NoGradGuard no_grad;
    torch::Tensor h = m.x;
    for (const auto& layer : replicas) h = layer_fn(h, layer);
  }
  torch::Tensor h = m.x;
  for (const auto& layer : replicas) h = layer_fn(h, layer);
  torch::mse_loss(h, m.y).backward();
  adam->step();
}

// The cases: each `once` is one repetition, called by every rank.
std::vector<Case> cases() {
  std::vector<Case> out;
  out.push_back({"replicated_step", "the demo's model replicated: forward, backward, Adam; no communication",
                 [](dist::Comm& comm) { replicated_step(comm, 1); }});
  out.push_back({"replicated_2fwd", "replicated_step with a second forward (the sharded step's recompute)",
                 [](dist::Comm& comm) { replicated_step(comm, 2); }});
  out.push_back({"stack_step", "the demo's sharded step (ShardedStack, no prefetch; Adam on the shards)",
                 [](dist::Comm& comm) { stack_step(comm, false); }});
  out.push_back(
      {"stack_prefetch", "the demo's sharded step with prefetch", [](dist::Comm& comm) { stack_step(comm, true); }});
  out.push_back({"idle", "no communication: sleep 20 ms (an idle group's background CPU)",
                 [](dist::Comm&) { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }});
  out.push_back({"allreduce_8m", "Gloo all_reduce of 8 MiB (the DDP row's one call)", [](dist::Comm& comm) {
                   static at::Tensor t = at::ones({floats_of(8)});
                   comm.all_reduce(t);
                 }});
  out.push_back({"ring_ag_8m", "our ring all_gather_into, 8 MiB gathered (4 MiB shard)", [](dist::Comm& comm) {
                   static at::Tensor shard = at::ones({floats_of(8) / comm.world_size()}),
                                     full = at::empty({floats_of(8)});
                   fsdp::all_gather_into(comm, shard, full);
                 }});
  out.push_back({"ring_ag_1m_x8", "our ring all_gather_into, 1 MiB gathered, 8 times", [](dist::Comm& comm) {
                   static at::Tensor shard = at::ones({floats_of(1) / comm.world_size()}),
                                     full = at::empty({floats_of(1)});
                   for (int i = 0; i < 8; ++i) fsdp::all_gather_into(comm, shard, full);
                 }});
  out.push_back(
      {"ring_ag_1m_x8_sendfirst", "ring_ag_1m_x8 with each step's send posted before its recv", [](dist::Comm& comm) {
         static at::Tensor shard = at::ones({floats_of(1) / comm.world_size()}), full = at::empty({floats_of(1)});
         const int n = comm.world_size(), r = comm.rank();
         const int64_t size = shard.numel();
         for (int i = 0; i < 8; ++i) {
           full.narrow(0, r * size, size).copy_(shard);
           for (int step = 0; step < n - 1; ++step) {
             dist::AsyncWork send =
                 comm.send_async(full.narrow(0, ((r - step) % n + n) % n * size, size), (r + 1) % n, step);
             dist::AsyncWork recv =
                 comm.recv_async(full.narrow(0, ((r - 1 - step) % n + n) % n * size, size), (r - 1 + n) % n, step);
             send.wait();
             recv.wait();
           }
         }
       }});
  out.push_back({"ring_rs_1m_x8", "our ring reduce_scatter_into, 1 MiB reduced, 8 times", [](dist::Comm& comm) {
                   static at::Tensor full = at::ones({floats_of(1)}),
                                     shard = at::empty({floats_of(1) / comm.world_size()});
                   for (int i = 0; i < 8; ++i) fsdp::reduce_scatter_into(comm, full, shard);
                 }});
  out.push_back({"agree_x8", "Gloo all_gather of 8 int64 (an agreement), 8 times", [](dist::Comm& comm) {
                   const at::Tensor rec = at::zeros({8}, at::kLong);
                   for (int i = 0; i < 8; ++i) comm.all_gather(rec);
                 }});
  out.push_back({"tiny_x8", "a 4-byte send/recv exchange with the next rank, 8 times", [](dist::Comm& comm) {
                   const int n = comm.world_size(), r = comm.rank();
                   const at::Tensor out = at::zeros({1}), in = at::empty({1});
                   for (int i = 0; i < 8; ++i) {
                     dist::AsyncWork recv = comm.recv_async(in, (r - 1 + n) % n, 0);
                     dist::AsyncWork send = comm.send_async(out, (r + 1) % n, 0);
                     send.wait();
                     recv.wait();
                   }
                 }});
  // The sharded step's pattern: a gather posted, then compute (here: a sleep, so that the CPU is the wait's only)
  // while the peer is late by 5 ms: what does a rank burn while it waits for a message that is not sent yet?
  out.push_back(
      {"late_peer_1m", "1 MiB ring all_gather_into where rank 0 starts 5 ms late (others wait)", [](dist::Comm& comm) {
         static at::Tensor shard = at::ones({floats_of(1) / comm.world_size()}), full = at::empty({floats_of(1)});
         if (comm.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
         fsdp::all_gather_into(comm, shard, full);
       }});
  out.push_back(
      {"posted_idle_1m", "1 MiB gather's recv+send posted, then 5 ms of sleep, then wait", [](dist::Comm& comm) {
         static at::Tensor full = at::zeros({floats_of(1)});
         static fsdp::FlatParam flat =
             fsdp::flatten_and_shard({at::ones({floats_of(1)})}, comm.rank(), comm.world_size());
         fsdp::PendingGather pending = fsdp::start_gather(comm, flat, 7);
         std::this_thread::sleep_for(std::chrono::milliseconds(5));
         pending.wait();
       }});
  return out;
}

// Sets nice value `nice` on the threads of this process that now have nice value `from` (with
// WORKSHOP_GLOO_LOOP_NICE=19 in the environment the compat layer starts Gloo's event loop at 19; the other threads
// are at 0). Lowering a nice value needs root (CAP_SYS_NICE): --loop_nice=0 puts the loop back where LibTorch
// starts it, for a before/after in one process.
int renice_threads(int from, int nice) {
  int count = 0;
  DIR* dir = opendir("/proc/self/task");
  while (dirent* e = dir ? readdir(dir) : nullptr) {
    const long tid = std::atol(e->d_name);
    if (tid <= 0) continue;
    errno = 0;
    const int now = getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
    if (errno != 0 || now != from) continue;
    if (setpriority(PRIO_PROCESS, static_cast<id_t>(tid), nice) == 0) ++count;
  }
  if (dir) closedir(dir);
  return count;
}

std::string probe(dist::Comm& comm, const std::vector<std::string>& args) {
  int reps = 40;
  std::string only;
  std::ostringstream out;
  for (const auto& a : args) {
    if (a.rfind("--reps=", 0) == 0) reps = std::stoi(a.substr(7));
    if (a.rfind("--cases=", 0) == 0) only = a.substr(8);
    if (a.rfind("--loop_nice=", 0) == 0) {
      const int nice = std::stoi(a.substr(12));
      out << "(Gloo's event loop: nice " << nice << " set on " << renice_threads(19, nice) << " thread(s))\n";
    }
  }
  out << std::fixed << std::setprecision(3);
  for (const Case& c : cases()) {
    if (!only.empty() && ("," + only + ",").find("," + c.name + ",") == std::string::npos) continue;
    c.once(comm);  // warm-up
    comm.barrier();
    const double p0 = cpu_ms(RUSAGE_SELF), t0 = cpu_ms(RUSAGE_THREAD);
    const auto w0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) c.once(comm);
    const auto w1 = std::chrono::steady_clock::now();
    const double p1 = cpu_ms(RUSAGE_SELF), t1 = cpu_ms(RUSAGE_THREAD);
    comm.barrier();
    const double wall = std::chrono::duration<double, std::milli>(w1 - w0).count();
    out << std::left << std::setw(24) << c.name << std::right << " wall " << std::setw(8) << wall / reps
        << " ms  cpu process " << std::setw(8) << (p1 - p0) / reps << " ms  calling thread " << std::setw(8)
        << (t1 - t0) / reps << " ms  other threads " << std::setw(8) << ((p1 - p0) - (t1 - t0)) / reps << " ms   # "
        << c.what << "\n";
  }
  return out.str();
}

}  // namespace

int main(int argc, char** argv) {
  const int child = ranks::run_as_rank("l7p", argc, argv, probe);
  if (child >= 0) return child;
  int world_size = 2;
  std::vector<std::string> pass;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--world_size=", 0) == 0) {
      world_size = std::stoi(a.substr(13));
    } else {
      pass.push_back(a);
    }
  }
  ranks::Launch l;
  l.prefix = "l7p", l.who = "cpu_probe", l.world_size = world_size, l.args = pass;
  std::cout << "cpu_probe: " << world_size << " ranks (processes, Gloo on 127.0.0.1); per repetition, rank 0:\n"
            << ranks::launch(l);
  return 0;
}
