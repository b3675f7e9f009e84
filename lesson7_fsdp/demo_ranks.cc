// Lesson 7's demo, --world_size=N: what each rank PROCESS measures (demo_processes.cc starts them with lesson 5's
// launcher, process_ranks.h, and prints rank 0's figures), and the text it sends back:
//   probe <ms> <bytes sent>                              one all-gather of the whole model (the link)
//   compute <forward ms> <backward ms> <Adam ms>          no communication, every rank busy at once
//   row K <kept> <peak, rank 0> <peak, most of any rank> <sent> <link bytes> <calls>   (the last round's)
//   ms K <median step ms of round 1> ...
//   cpu K <CPU ms per step, summed over the ranks, of round 1> ...
#include <algorithm>
#include <chrono>
#include <iomanip>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "common/device.h"
#include "common/memory_meter.h"
#include "common/report.h"
#include "lesson5_distributed/comm.h"
#include "lesson5_distributed/process_ranks.h"
#include "lesson7_fsdp/demo_parts.h"
#include "lesson7_fsdp/fsdp.h"

namespace l7demo {

std::vector<std::string> proc_args(const ProcConfig& c) {
  return {"--l7_rounds=" + std::to_string(c.rounds), "--l7_steps=" + std::to_string(c.steps),
          "--l7_layers=" + std::to_string(c.layers), "--l7_width=" + std::to_string(c.width),
          "--l7_items=" + std::to_string(c.items),   "--l7_delay_us=" + std::to_string(c.delay_us)};
}

namespace {

ProcConfig config_from(const std::vector<std::string>& args) {
  ProcConfig c;
  for (const std::string& a : args) {
    auto is = [&](const std::string& name) { return a.rfind("--l7_" + name + "=", 0) == 0; };
    auto value = [&](const std::string& name) { return std::stoll(a.substr(name.size() + 6)); };
    if (is("rounds")) c.rounds = static_cast<int>(value("rounds"));
    if (is("steps")) c.steps = static_cast<int>(value("steps"));
    if (is("layers")) c.layers = static_cast<int>(value("layers"));
    if (is("width")) c.width = value("width");
    if (is("items")) c.items = value("items");
    if (is("delay_us")) c.delay_us = value("delay_us");
  }
  return c;
}

// The link: one all-gather of the whole model's bytes (our ring, step 1), median of 5 after a warm-up. Returns
// "probe <ms> <bytes sent>".
std::string probe_link(dist::Comm& comm, const ProcConfig& c) {
  const int n = comm.world_size();
  const int64_t model_elements = c.layers * (c.width * c.width + c.width);
  const int64_t gather_elements = (model_elements + n - 1) / n * n;
  const at::Tensor shard = at::ones({gather_elements / n}), full = at::empty({gather_elements});
  std::vector<double> ms;
  for (int i = 0; i <= 5; ++i) {
    comm.barrier();
    comm.reset_stats();
    const auto start = std::chrono::steady_clock::now();
    fsdp::all_gather_into(comm, shard, full);
    if (i > 0)
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::ostringstream out;
  out << std::setprecision(17) << "probe " << workshop::median(ms) << " " << comm.stats().send_bytes << "\n";
  return out.str();
}

// Compute only, every rank busy at once: replicated layers, no communication; the medians of `steps` steps of
// forward, backward and Adam (after one warm-up step, in which Adam's state appears).
std::vector<double> measure_compute(dist::Comm& comm, const std::vector<std::vector<torch::Tensor>>& init,
                                    const torch::Tensor& xr, const torch::Tensor& yr, int steps) {
  std::vector<torch::Tensor> params;
  std::vector<std::vector<torch::Tensor>> replicas;
  for (const auto& layer : init) {
    replicas.emplace_back();
    for (const auto& t : layer) replicas.back().push_back(t.clone().requires_grad_(true));
    params.insert(params.end(), replicas.back().begin(), replicas.back().end());
  }
  torch::optim::Adam adam(params, torch::optim::AdamOptions(1e-3));
  std::vector<double> f, b, o;
  const auto ms = [](auto from, auto to) { return std::chrono::duration<double, std::milli>(to - from).count(); };
  for (int s = -1; s < steps; ++s) {
    adam.zero_grad();
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    torch::Tensor h = xr;
    for (const auto& layer : replicas) h = layer_fn(h, layer);
    torch::Tensor loss = torch::mse_loss(h, yr);
    const auto t1 = std::chrono::steady_clock::now();
    loss.backward();
    const auto t2 = std::chrono::steady_clock::now();
    adam.step();
    const auto t3 = std::chrono::steady_clock::now();
    if (s < 0) continue;
    f.push_back(ms(t0, t1)), b.push_back(ms(t1, t2)), o.push_back(ms(t2, t3));
  }
  return {workshop::median(f), workshop::median(b), workshop::median(o)};
}

// Over every rank (collectives, so every rank calls it): the CPU ms per step summed, the peak bytes' maximum.
std::pair<double, double> over_ranks(dist::Comm& comm, const StepFigures& f) {
  at::Tensor cpu = at::full({1}, f.cpu_ms, at::kDouble), peak = at::full({1}, static_cast<double>(f.peak), at::kDouble);
  comm.all_reduce(cpu);
  comm.all_reduce(peak, dist::ReduceOp::kMax);
  return {cpu.item<double>(), peak.item<double>()};
}

// Every row's figures on this rank, `c.rounds` times: the row, ms and cpu lines of rank 0's text (the rest is
// discarded by the launcher).
std::string rows_text(dist::Comm& comm, const ProcConfig& c, const std::vector<std::vector<torch::Tensor>>& init,
                      const torch::Tensor& xr, const torch::Tensor& yr, std::vector<std::vector<double>>& compute) {
  std::vector<std::ostringstream> ms(kProcModes), cpu(kProcModes);
  std::vector<StepFigures> last(kProcModes);
  std::vector<double> peak_any(kProcModes, 0);
  for (size_t k = 0; k < kProcModes; ++k) ms[k].precision(17), cpu[k].precision(17);
  for (int round = 0; round < c.rounds; ++round) {
    compute.push_back(measure_compute(comm, init, xr, yr, c.steps));
    for (size_t k = 0; k < kProcModes; ++k) {
      last[k] = train_rank(comm, kProcMode[k], init, xr, yr, c.steps, /*warm_up=*/true, /*peak=*/true);
      const std::pair<double, double> all = over_ranks(comm, last[k]);
      ms[k] << " " << last[k].median_ms, cpu[k] << " " << all.first;
      peak_any[k] = std::max(peak_any[k], all.second);
    }
  }
  std::ostringstream out;
  out << std::setprecision(17);
  for (size_t k = 0; k < kProcModes; ++k) {
    const StepFigures& f = last[k];
    out << "row " << k << " " << f.persistent << " " << f.peak << " " << peak_any[k] << " " << f.sent + f.agreement_sent
        << " " << f.link_bytes << " " << f.calls << "\n"
        << "ms " << k << ms[k].str() << "\ncpu " << k << cpu[k].str() << "\n";
  }
  return out.str();
}

// What one rank measures (rank 0's is printed). Text: one "key values..." line per figure.
std::string proc_rank(dist::Comm& comm, const ProcConfig& c) {
  workshop::cpu_allocated_bytes();  // installs the counting allocator before the rows' tensors exist
  const int r = comm.rank(), n = comm.world_size();
  const auto init = make_layers(c.layers, c.width);
  torch::manual_seed(4);
  const torch::Tensor x = torch::randn({c.items * n, c.width}), y = torch::randn({c.items * n, c.width});
  const torch::Tensor xr = x.narrow(0, r * c.items, c.items), yr = y.narrow(0, r * c.items, c.items);
  const std::string probe = probe_link(comm, c);
  comm.set_simulated_delay(std::chrono::microseconds(c.delay_us));
  std::vector<std::vector<double>> compute;  // per round: forward, backward, Adam
  const std::string rows = rows_text(comm, c, init, xr, yr, compute);
  std::vector<double> forward, backward, optimizer;
  for (const auto& round : compute) {
    forward.push_back(round[0]), backward.push_back(round[1]), optimizer.push_back(round[2]);
  }
  std::ostringstream out;
  out << std::setprecision(17) << probe << "compute " << workshop::median(forward) << " " << workshop::median(backward)
      << " " << workshop::median(optimizer) << "\n";
  return out.str() + rows;
}

}  // namespace

ProcResults parse_results(const std::string& text) {
  ProcResults out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string key;
    int k = 0;
    double value = 0;
    words >> key;
    if (key == "probe") words >> out.probe_ms >> out.probe_sent;
    if (key == "compute") words >> out.forward >> out.backward >> out.optimizer;
    if (key != "row" && key != "ms" && key != "cpu") continue;
    words >> k;
    ProcResults::Row& row = out.rows.at(static_cast<size_t>(k));
    if (key == "row") words >> row.kept >> row.peak >> row.peak_any >> row.sent >> row.link_bytes >> row.calls;
    while (key == "ms" && words >> value) row.round_ms.push_back(value);
    while (key == "cpu" && words >> value) row.round_cpu_ms.push_back(value);
  }
  return out;
}

int run_as_rank(int argc, char** argv) {
  return ranks::run_as_rank("l7", argc, argv, [](dist::Comm& comm, const std::vector<std::string>& args) {
    return proc_rank(comm, config_from(args));
  });
}

}  // namespace l7demo
