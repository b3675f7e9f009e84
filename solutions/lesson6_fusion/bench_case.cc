// Lesson 6's bench case: one AdamW step over a 64 MiB float32 parameter (16M floats; --quick 4 MiB) as
// torch::optim::AdamW, the same step one ATen op at a time, the fused operator workshop::fused_adamw_ (float32
// and bfloat16 parameters), beside PyTorch's torch.optim.AdamW and, where the version has it for the device, its
// fused AdamW (bench/peer.py "l6"). Each row's rate is its napkin bytes (lesson 6, step 1) over its median time,
// held against an in-place read and write of as many bytes as the fused float32 step moves, measured in the
// same run. On a CPU whose fused loop runs the AVX2 copy, the two fused steps again on the baseline instruction
// set, side by side.
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "bench/harness.h"
#include "bench/registry.h"
#include "common/report.h"
#include "lesson6_fusion/fused_adamw.h"

namespace bench {

using workshop::fixed;

void lesson6(Context& c) {
  if (!c.device.is_cpu() && !fusion::has_cuda_kernel()) {
    std::cout << "lesson 6: skipped on " << c.device
              << ": no CUDA kernel in this build (step 6's kernels need nvcc when Bazel configures @libtorch)"
              << std::endl;
    return;
  }
  const torch::TensorOptions on = torch::TensorOptions().device(c.device);
  const int64_t n = c.quick ? (int64_t{1} << 20) : (int64_t{1} << 24);
  const int warmup = 2, repeats = c.quick ? 3 : 10;
  std::cout << "lesson 6: AdamW step over " << n << " float32 elements (" << workshop::mib(4.0 * n) << ")" << std::endl;
  torch::manual_seed(0);
  const torch::Tensor start = torch::randn({n}, on);
  const torch::Tensor grad = torch::randn({n}, on);
  const fusion::AdamWHyper hyper;  // torch::optim::AdamW's defaults (weight decay 1e-2)

  torch::Tensor p_torch = start.clone().requires_grad_(true);
  p_torch.mutable_grad() = grad.clone();
  torch::optim::AdamW optimizer({p_torch}, fusion::adamw_options(hyper));
  torch::Tensor p_plain = start.clone(), m_plain = torch::zeros({n}, on), v_plain = torch::zeros({n}, on);
  torch::Tensor p_fused = start.clone(), m_fused = torch::zeros({n}, on), v_fused = torch::zeros({n}, on);
  torch::Tensor p_bf16 = start.to(torch::kBFloat16), g_bf16 = grad.to(torch::kBFloat16);
  torch::Tensor m_bf16 = torch::zeros({n}, on), v_bf16 = torch::zeros({n}, on);
  int64_t step_plain = 0, step_fused = 0, step_bf16 = 0;
  // The same two fused steps on the baseline instruction set, where the CPU runs the AVX2 copy of the loop.
  torch::Tensor p_base = start.clone(), m_base = torch::zeros({n}, on), v_base = torch::zeros({n}, on);
  torch::Tensor p_base16 = start.to(torch::kBFloat16), m_base16 = torch::zeros({n}, on),
                v_base16 = torch::zeros({n}, on);
  int64_t step_base = 0, step_base16 = 0;
  const fusion::CpuIsa isa = fusion::cpu_isa();
  const bool two_isas = c.device.is_cpu() && isa != fusion::CpuIsa::kBaseline;
  const auto on_baseline = [isa](const std::function<void()>& step) {
    fusion::set_cpu_isa(fusion::CpuIsa::kBaseline);
    step();
    fusion::set_cpu_isa(isa);
  };
  const std::string isa_note = c.device.is_cpu() ? std::string(", ") + fusion::cpu_isa_name(isa) + " loop" : "";
  // Step 5's scaler, two ways: GradScaler's unscale_ (one pass that reads and writes every gradient) and then the
  // step on the unscaled gradient, or the scaler's check only (inv_scale 1: read, nothing written) and then the
  // step with grad_scale and found_inf, unscaling in its pass, its step counted in state_step (no host read of the
  // flag: a skipped step must not count). The first multiplies its gradient in place, so it alternates 1/65536 and
  // 65536 (powers of two: the values stay exact and never drift towards denormals).
  const float scale = 65536.0f;
  const torch::Tensor grad_scale = torch::full({1}, scale, on);
  torch::Tensor found_inf = torch::zeros({1}, on);
  const torch::Tensor inv_scales[] = {torch::full({1}, 1.0f / scale, on), torch::full({1}, scale, on)};
  const torch::Tensor no_scale = torch::ones({1}, on);
  std::vector<torch::Tensor> scaled_grad = {grad * scale};
  torch::Tensor p_two = start.clone(), m_two = torch::zeros({n}, on), v_two = torch::zeros({n}, on);
  torch::Tensor p_one = start.clone(), m_one = torch::zeros({n}, on), v_one = torch::zeros({n}, on);
  torch::Tensor state_step = torch::zeros({1}, on);  // the one-pass variant's steps taken, on the device
  int64_t step_two = 0;
  const auto plus = [n](fusion::Traffic t, int64_t read, int64_t written) {  // one more pass over a float32 tensor
    t.bytes_read += read * 4 * n;
    t.bytes_written += written * 4 * n;
    t.passes += 1;
    return t;
  };

  const fusion::Traffic unfused = fusion::unfused_adamw_traffic(n, torch::kFloat, hyper.weight_decay != 0);
  const fusion::Traffic fused = fusion::fused_adamw_traffic(n, torch::kFloat);
  const fusion::Traffic fused16 = fusion::fused_adamw_traffic(n, torch::kBFloat16);
  const fusion::Traffic unscale_then_step = plus(fused, 1, 1);    // 8 + 28 bytes per element
  const fusion::Traffic check_then_one_pass = plus(fused, 1, 0);  // 4 + 28
  // The ceiling: reading and writing back in place as many bytes as the fused float32 step moves (half read,
  // half written), now: the fused step's own pattern (a copy pays for reading its destination too).
  const std::string ceiling = c.ceilings.in_place(c.device, fused.total() / 8, repeats);

  struct Variant {
    std::string name;
    const fusion::Traffic& traffic;
    std::function<void()> step;
    std::string key;  // the peer's row for the same workload
  };
  std::vector<Variant> variants = {
      {"torch::optim::AdamW", unfused, [&] { optimizer.step(); }, "l6.adamw"},
      {"unfused ATen ops", unfused,
       [&] { fusion::unfused_adamw_step(p_plain, grad, m_plain, v_plain, hyper, ++step_plain); }, ""},
      {"fused op (float32)", fused, [&] { fusion::fused_adamw_(p_fused, grad, m_fused, v_fused, hyper, ++step_fused); },
       "l6.fused"},
      {"fused op (bfloat16 param)", fused16,
       [&] { fusion::fused_adamw_(p_bf16, g_bf16, m_bf16, v_bf16, hyper, ++step_bf16); }, ""},
      {"scaler: unscale_, then fused op", unscale_then_step,
       [&] {
         found_inf.zero_();
         fusion::fused_unscale_(scaled_grad, found_inf, inv_scales[step_two % 2]);
         if (found_inf.item<float>() == 0.0f) {  // the host reads the flag (on a GPU: a sync)
           fusion::fused_adamw_(p_two, scaled_grad[0], m_two, v_two, hyper, ++step_two);
         }
       },
       ""},
      {"scaler: check, then fused op with grad_scale", check_then_one_pass,
       [&] {
         found_inf.zero_();
         fusion::fused_unscale_(scaled_grad, found_inf, no_scale);  // inv_scale 1: reads, writes nothing
         fusion::fused_adamw_(p_one, scaled_grad[0], m_one, v_one, hyper, 0, grad_scale, found_inf, state_step);
       },
       ""},
  };
  if (two_isas) {
    variants.push_back(
        {"fused op (float32), baseline ISA", fused,
         [&] { on_baseline([&] { fusion::fused_adamw_(p_base, grad, m_base, v_base, hyper, ++step_base); }); }, ""});
    variants.push_back(
        {"fused op (bfloat16 param), baseline ISA", fused16,
         [&] {
           on_baseline([&] { fusion::fused_adamw_(p_base16, g_bf16, m_base16, v_base16, hyper, ++step_base16); });
         },
         ""});
  }
  for (const Variant& v : variants) {
    const bool baseline = v.name.find("baseline ISA") != std::string::npos;
    const bool fused_row = v.name.rfind("fused op", 0) == 0 || v.name.rfind("scaler", 0) == 0;
    const auto t = workshop::time_repeated(c.device, v.step, warmup, repeats);
    Row row{"lesson 6: AdamW step (" + workshop::mib(4.0 * n) + ")",
            v.name,
            t,
            0,
            static_cast<double>(v.traffic.total()),
            ceiling,
            0,
            std::to_string(v.traffic.passes) + " pass(es), napkin " +
                workshop::mib(static_cast<double>(v.traffic.total())) + " read+written" +
                (baseline    ? ", baseline loop"
                 : fused_row ? isa_note
                             : ""),
            v.key};
    c.rows.push_back(row);
  }
  c.peer->run("l6", "numel=" + std::to_string(n) + ",warmup=" + std::to_string(warmup) +
                        ",repeats=" + std::to_string(repeats) + ",lr=" + fixed(hyper.lr, 6) +
                        ",weight_decay=" + fixed(hyper.weight_decay, 6));
}

namespace {
const Registered registered(6, Case{"l6", lesson6});
}  // namespace

}  // namespace bench
