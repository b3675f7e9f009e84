// Lesson 6 demo: one AdamW step over a 64 MiB float32 parameter (16M floats) three ways: the fused operator
// workshop::fused_adamw_ (through the dispatcher), the same step one ATen op at a time, and torch::optim::AdamW;
// beside them, a memory copy of the same bytes as the ceiling. Napkin bytes, GB/s and the fraction of the ceiling,
// and the page faults each call takes (demo_pages.cc: why torch::optim::AdamW's step is 8x the fused one here and
// over 40x there).
//   bazel run //lesson6_fusion:demo -- --quick            (4 MiB per tensor, a few seconds)
//   bazel run //lesson6_fusion:demo                        (64 MiB per tensor)
//   bazel run //lesson6_fusion:demo -- --csv_dir=/tmp/l6   (also writes the table as CSV)
//   bazel run //lesson6_fusion:demo -- --device=cuda      (step 6: the CUDA kernels, on a GPU)
#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <utility>
#include <iostream>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>  // whether step 4 registered its operator
#include <c10/util/Exception.h>
#include <torch/torch.h>

#include "common/demo.h"
#include "common/device.h"
#include "common/memory_meter.h"
#include "common/report.h"
#include "lesson6_fusion/demo_parts.h"
#include "lesson6_fusion/fused_adamw.h"

namespace {

using l6demo::Variant;
constexpr double kMiB = 1024.0 * 1024.0;

double gbps(int64_t bytes, double ms) { return bytes / (ms * 1e-3) / 1e9; }

double fastest_ms(const Variant& v) { return *std::min_element(v.samples.begin(), v.samples.end()); }

const Variant& variant_named(const std::vector<Variant>& variants, const std::string& name) {
  const auto it = std::find_if(variants.begin(), variants.end(), [&](const Variant& v) { return v.name == name; });
  TORCH_CHECK(it != variants.end(), "lesson 6 demo: no variant named ", name);
  return *it;
}

double median_of(const std::vector<Variant>& variants, const std::string& name) {
  return workshop::median(variant_named(variants, name).samples);
}

double faults_of(const std::vector<Variant>& variants, const std::string& name) {
  return variant_named(variants, name).faults;
}

// On a CPU whose fused loop runs the AVX2 copy (fusion::cpu_isa()): the two fused steps again on the baseline
// instruction set, each with its own parameter and state, so that the table shows what the wider copy gives.
void add_baseline_isa(std::vector<Variant>& variants, const torch::Tensor& start, const torch::Tensor& grad,
                      const fusion::AdamWHyper& hyper) {
  const fusion::CpuIsa isa = fusion::cpu_isa();
  if (!start.is_cpu() || isa == fusion::CpuIsa::kBaseline) return;
  for (const torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16}) {
    struct State {
      torch::Tensor p, g, m, v;
      int64_t step = 0;
    };
    auto s = std::make_shared<State>(
        State{start.to(dtype), grad.to(dtype), torch::zeros_like(start), torch::zeros_like(start)});
    const fusion::Traffic traffic = fusion::fused_adamw_traffic(start.numel(), dtype);
    const std::string name = dtype == torch::kFloat ? "fused op (float32)" : "fused op (bfloat16 param)";
    variants.push_back({name + ", baseline ISA", traffic.passes, traffic.total(), [s, hyper, isa] {
                          fusion::set_cpu_isa(fusion::CpuIsa::kBaseline);
                          fusion::fused_adamw_(s->p, s->g, s->m, s->v, hyper, ++s->step);
                          fusion::set_cpu_isa(isa);
                        }});
  }
}

// The single-tensor table and the page's goals, each with this run's figure.
void report_single(const std::vector<Variant>& variants, int64_t n, int64_t copy_bytes, const std::string& csv_dir) {
  // The ceiling is a best case: the fastest single call of any of the three copies over all rounds (the copies
  // ran interleaved with the steps, so a quiet moment of the run counts for them as it could for the steps).
  double ceiling = 0;
  for (const Variant& v : variants) {
    if (v.is_copy) ceiling = std::max(ceiling, gbps(v.napkin_bytes, fastest_ms(v)));
  }
  const double torch_ms = median_of(variants, "torch::optim::AdamW");
  workshop::Table table("lesson6_fusion", {"variant", "passes", "napkin MiB", "median ms", "min ms", "GB/s",
                                           "of copy ceiling", "allocated MiB", "vs torch AdamW", "faults per call"});
  for (const Variant& v : variants) {
    const double ms = workshop::median(v.samples);
    const double rate = gbps(v.napkin_bytes, ms);
    const double fraction = 100.0 * rate / ceiling;
    // A median above the best copy means the napkin over-counts what reaches memory (caches): no fraction is
    // printed for it.
    const std::string of_ceiling = fraction > 100.0 ? "suspect" : workshop::fixed(fraction, 0) + "%";
    table.add({v.name, std::to_string(v.passes), workshop::fixed(v.napkin_bytes / kMiB, 0), workshop::fixed(ms, 2),
               workshop::fixed(fastest_ms(v), 2), workshop::fixed(rate, 2), of_ceiling,
               workshop::fixed(v.allocated_bytes / kMiB, 1), v.is_copy ? "-" : workshop::fixed(torch_ms / ms, 2) + "x",
               workshop::fixed(v.faults, 0)});
  }
  table.emit(csv_dir);
  std::cout << "napkin MiB: bytes read + written if every op streams its operands from memory once (step 1); GB/s "
               "= napkin bytes / median time.\n"
            << "copy ceiling: the fastest single call of the copies over all rounds, " << workshop::fixed(ceiling, 2)
            << " GB/s, copying " << workshop::mib(static_cast<double>(copy_bytes))
            << " (the fused step's bytes: half read, half written); of copy ceiling: a row's median rate against it, "
               "'suspect' where the median beats it (the napkin then over-counts, e.g. tensors in cache).\n"
            << "allocated: peak bytes one call allocates (the device's counting allocator): the unfused step's two "
               "temporaries.\n";
  l6demo::print_page_costs(faults_of(variants, "torch::optim::AdamW"), torch_ms,
                           faults_of(variants, "fused op (float32)"), 4 * n);

  // The lesson page's goals ("Measured"), each with this run's figure: a kernel can pass every check and still
  // be slow (one that loads and stores every vector with the counted loadu/store runs at half the speed).
  const double fused_ms = median_of(variants, "fused op (float32)");
  const double bf16_ms = median_of(variants, "fused op (bfloat16 param)");
  const double f32_fraction = 100.0 * gbps(fusion::fused_adamw_traffic(n, torch::kFloat).total(), fused_ms) / ceiling;
  const double bf16_fraction =
      100.0 * gbps(fusion::fused_adamw_traffic(n, torch::kBFloat16).total(), bf16_ms) / ceiling;
  const auto goal = [](const std::string& what, const std::string& got, bool met) {
    std::cout << "  " << what << ": " << got << " -> " << (met ? "met" : "NOT MET") << "\n";
  };
  std::cout << "\nGoals of the lesson page (set for 64 MiB per tensor"
            << (n < (int64_t{1} << 24) ? "; this run is smaller, where caches flatter every row" : "") << "):\n";
  goal("fused float32 at least 3x faster than torch::optim::AdamW", workshop::fixed(torch_ms / fused_ms, 2) + "x",
       torch_ms / fused_ms >= 3.0);
  goal("fused float32 at least 70% of the copy ceiling", workshop::fixed(f32_fraction, 0) + "%", f32_fraction >= 70.0);
  goal("fused bfloat16 parameter at least 60% of the copy ceiling", workshop::fixed(bf16_fraction, 0) + "%",
       bf16_fraction >= 60.0);
}

// The same number of elements as many small parameters, as a model has them: one multi-tensor call against one
// call per tensor and against torch::optim::AdamW over the list.
void many_parameters(const workshop::Demo& demo, int64_t n, const fusion::AdamWHyper& hyper, int rounds, int repeats) {
  const torch::TensorOptions on = torch::TensorOptions().device(demo.device);
  const int64_t small = demo.flags.get_int("small", 4096);
  const int64_t count = std::max<int64_t>(1, n / small);
  std::vector<torch::Tensor> grads_many, ps_multi, ms_multi, vs_multi, ps_loop, ms_loop, vs_loop, ps_torch;
  for (int64_t i = 0; i < count; ++i) {
    const torch::Tensor p0 = torch::randn({small}, on);
    grads_many.push_back(torch::randn({small}, on));
    ps_multi.push_back(p0.clone());
    ps_loop.push_back(p0.clone());
    ps_torch.push_back(p0.clone().requires_grad_(true));
    ps_torch.back().mutable_grad() = grads_many.back().clone();
    for (auto* state : {&ms_multi, &vs_multi, &ms_loop, &vs_loop}) state->push_back(torch::zeros({small}, on));
  }
  torch::optim::AdamW optimizer_many(ps_torch, fusion::adamw_options(hyper));
  int64_t step_multi = 0, step_loop = 0;
  const int64_t many_bytes = fusion::fused_adamw_traffic(count * small, torch::kFloat).total();
  const fusion::Traffic unfused = fusion::unfused_adamw_traffic(count * small, torch::kFloat, true);
  std::vector<Variant> many;
  many.push_back({"fused_adamw_multi_ (one call)", 1, many_bytes,
                  [&] { fusion::fused_adamw_multi_(ps_multi, grads_many, ms_multi, vs_multi, hyper, ++step_multi); }});
  many.push_back({"fused_adamw_ (one call per tensor)", count, many_bytes, [&] {
                    ++step_loop;
                    for (int64_t i = 0; i < count; ++i) {
                      fusion::fused_adamw_(ps_loop[i], grads_many[i], ms_loop[i], vs_loop[i], hyper, step_loop);
                    }
                  }});
  many.push_back({"torch::optim::AdamW", count * unfused.passes, unfused.total(), [&] { optimizer_many.step(); }});
  for (Variant& v : many) v.step();
  l6demo::time_rounds(many, demo.device, rounds, repeats);
  const double many_torch_ms = workshop::median(many.back().samples);
  std::cout << "\nMany parameters: " << count << " tensors of " << small << " float32 elements ("
            << workshop::mib(4.0 * count * small) << " per list)\n";
  workshop::Table many_table("lesson6_many", {"variant", "calls per step", "median ms", "min ms", "GB/s (fused napkin)",
                                              "vs torch AdamW", "faults per call"});
  for (const Variant& v : many) {
    const double ms = workshop::median(v.samples);
    many_table.add({v.name, std::to_string(v.passes), workshop::fixed(ms, 2), workshop::fixed(fastest_ms(v), 2),
                    workshop::fixed(gbps(many_bytes, ms), 2), workshop::fixed(many_torch_ms / ms, 2) + "x",
                    workshop::fixed(v.faults, 0)});
  }
  many_table.emit(demo.csv_dir);
  std::cout << "calls per step: operator calls (torch::optim::AdamW: tensor ops). GB/s: the fused step's napkin bytes "
               "/ median time, for every row. faults per call: as above.\n";
}

int run(const workshop::Demo& demo) {
  const workshop::Flags& flags = demo.flags;
  const bool quick = demo.quick;
  const c10::Device device = demo.device;
  TORCH_CHECK(device.is_cpu() || fusion::has_cuda_kernel(),
              "lesson 6 demo: workshop::fused_adamw_ has no CUDA kernel in this build (step 6's kernels are built "
              "where LibTorch has CUDA and Bazel found nvcc)");
  const torch::TensorOptions on = torch::TensorOptions().device(device);  // float32 on the demo's device
  const int64_t n = flags.get_int("numel", quick ? (int64_t{1} << 20) : (int64_t{1} << 24));
  const int rounds = static_cast<int>(flags.get_int("rounds", 3));
  const int repeats = static_cast<int>(flags.get_int("repeats", 5));
  const std::string& csv_dir = demo.csv_dir;
  if (flags.has("threads")) at::set_num_threads(static_cast<int>(flags.get_int("threads", 1)));

  std::cout << "Lesson 6 — fused kernels: one AdamW step\n"
            << "device: " << workshop::device_name(device) << ", ATen threads: " << at::get_num_threads() << "\n"
            << "parameter: " << n << " float32 elements (" << workshop::mib(4.0 * n) << " per tensor); " << rounds
            << " rounds x " << repeats << " timed calls per variant (median of all), variants interleaved\n";
  if (device.is_cpu()) {
    std::cout << "fused loop: " << fusion::cpu_isa_name(fusion::cpu_isa())
              << " (this CPU's widest: " << fusion::cpu_isa_name(fusion::best_cpu_isa())
              << "; ATEN_CPU_CAPABILITY=default runs the baseline)\n";
  }
  std::cout << "\n";

  torch::manual_seed(0);
  const torch::Tensor start = torch::randn({n}, on);
  const torch::Tensor grad = torch::randn({n}, on);
  fusion::AdamWHyper hyper;  // torch::optim::AdamW's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, wd 1e-2

  // Each variant owns its parameter and state, so that the step counters stay honest.
  torch::Tensor p_fused = start.clone(), m_fused = torch::zeros({n}, on), v_fused = torch::zeros({n}, on);
  torch::Tensor p_plain = start.clone(), m_plain = torch::zeros({n}, on), v_plain = torch::zeros({n}, on);
  torch::Tensor p_bf16 = start.to(torch::kBFloat16), g_bf16 = grad.to(torch::kBFloat16);
  torch::Tensor m_bf16 = torch::zeros({n}, on), v_bf16 = torch::zeros({n}, on);
  torch::Tensor p_torch = start.clone().requires_grad_(true);
  p_torch.mutable_grad() = grad.clone();
  torch::optim::AdamW optimizer({p_torch}, fusion::adamw_options(hyper));
  int64_t step_fused = 0, step_plain = 0, step_bf16 = 0;

  // The ceiling: copy as many bytes as the fused float32 step moves (read half, write half).
  const fusion::Traffic fused = fusion::fused_adamw_traffic(n, torch::kFloat);
  const fusion::Traffic fused16 = fusion::fused_adamw_traffic(n, torch::kBFloat16);
  const fusion::Traffic unfused = fusion::unfused_adamw_traffic(n, torch::kFloat, hyper.weight_decay != 0);
  const int64_t copy_bytes = fused.total() / 2;
  const torch::Tensor src = torch::rand({copy_bytes / 4}, on);
  torch::Tensor dst = torch::empty({copy_bytes / 4}, on);
  torch::Tensor in_place = torch::rand({copy_bytes / 4}, on);
  const char* src_bytes = static_cast<const char*>(src.data_ptr());
  char* dst_bytes = static_cast<char*>(dst.data_ptr());

  std::vector<Variant> variants;
  variants.push_back({"copy_ (ATen)", 1, 2 * copy_bytes, [&] { dst.copy_(src); }, true});
  if (device.is_cpu()) {
    variants.push_back({"memcpy (parallel_for)", 1, 2 * copy_bytes,
                        [&] {
                          at::parallel_for(0, copy_bytes, 1 << 20, [&](int64_t b, int64_t e) {
                            std::memcpy(dst_bytes + b, src_bytes + b, static_cast<size_t>(e - b));
                          });
                        },
                        true});
  }
  // A copy's destination is read before it is written (write-allocate caches), which the napkin does not count;
  // the fused step writes only what it has just read. So a third ceiling: read and write the same bytes in place.
  variants.push_back({"in place (mul_ by 1)", 1, 2 * copy_bytes, [&] { in_place.mul_(1.0); }, true});
  variants.push_back({"fused op (float32)", fused.passes, fused.total(),
                      [&] { fusion::fused_adamw_(p_fused, grad, m_fused, v_fused, hyper, ++step_fused); }});
  variants.push_back({"fused op (bfloat16 param)", fused16.passes, fused16.total(),
                      [&] { fusion::fused_adamw_(p_bf16, g_bf16, m_bf16, v_bf16, hyper, ++step_bf16); }});
  add_baseline_isa(variants, start, grad, hyper);
  variants.push_back({"unfused ATen ops", unfused.passes, unfused.total(),
                      [&] { fusion::unfused_adamw_step(p_plain, grad, m_plain, v_plain, hyper, ++step_plain); }});
  variants.push_back({"torch::optim::AdamW", unfused.passes, unfused.total(), [&] { optimizer.step(); }});

  // Warm up every variant once (first touch of the pages, the optimizer's state, the threads), measuring what one
  // call allocates; then the timed rounds.
  for (Variant& v : variants) {
    v.step();
    workshop::MemoryMeter meter(device);
    v.step();
    v.allocated_bytes = meter.peak_bytes();
  }
  l6demo::time_rounds(variants, device, rounds, repeats);
  report_single(variants, n, copy_bytes, csv_dir);
  const double torch_ms = median_of(variants, "torch::optim::AdamW");
  const double fused_ms = median_of(variants, "fused op (float32)");

  if (!c10::Dispatcher::singleton().findOp(c10::OperatorName(fusion::kMultiOpName, "")).has_value()) {
    std::cout << "\nMany parameters: left out, " << fusion::kMultiOpName
              << " is not registered yet (lesson 6, step 4 registers it).\n";
  } else {
    many_parameters(demo, n, hyper, rounds, repeats);
  }
  workshop::append_summary(csv_dir, {{"6 fused kernels", "AdamW step (ms), torch::optim::AdamW vs fused op", torch_ms,
                                      fused_ms, workshop::device_name(device)}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return workshop::demo_main(
      argc, argv,
      workshop::DemoOptions("Lesson 6 demo: one AdamW step three ways (the fused operator, one ATen op at a time, "
                            "torch::optim::AdamW) beside a copy of the same bytes: napkin bytes, GB/s, the fraction "
                            "of the ceiling, the page faults per call.")
          .device("cpu")
          .device_help("cpu (default), cuda or best (cuda: step 6's kernels, built where nvcc was found)")
          .flags({{"numel", "elements per tensor (default 16777216 = 64 MiB of float32; quick 1M)"},
                  {"rounds", "rounds; each variant is timed in every round (default 3)"},
                  {"repeats", "timed calls per variant and round (default 5)"},
                  {"threads", "ATen intra-op threads (default: LibTorch's own choice)"},
                  {"small", "elements per tensor in the many-parameters table (default 4096)"}}),
      run);
}
