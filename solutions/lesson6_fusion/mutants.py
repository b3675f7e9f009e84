"""Lesson 6's mutants (fused kernels: napkin math, the fused AdamW kernel, the operator's checks): plausible bugs in
solutions/, one tuple each.

(name, file, old, new, what the bug is): `old` must occur exactly once in `file`; tools/mutants/mutants.py
turns each tuple into a patch at run time and tools/mutants/run.sh applies them one at a time.
"""

L6 = "solutions/lesson6_fusion/fused_adamw.cc"

L6_CUDA = "solutions/lesson6_fusion/fused_adamw_cuda.cu"

MUTANTS = [
    # ---- step 1: napkin math ----------------------------------------------------------------------------
    ("l6_napkin_addcmul_reads_grad_once", L6,
     "{3, 1, 0},  // .addcmul_(grad, grad, 1 - beta2)",
     "{2, 1, 0},  // .addcmul_(grad, grad, 1 - beta2)",
     "the napkin counts addcmul_'s two reads of the gradient as one"),
    ("l6_napkin_fused_state_in_param_dtype", L6,
     "const int64_t state = numel * static_cast<int64_t>(sizeof(float));",
     "const int64_t state = param;",
     "the fused napkin gives the state the parameter's dtype (it is float32)"),
    # ---- step 2: the kernel -----------------------------------------------------------------------------
    ("l6_no_bias_correction", L6,
     "c.neg_step_size = static_cast<float>(-h.lr / bias_correction1);",
     "c.neg_step_size = static_cast<float>(-h.lr);",
     "the first moment's bias correction is missing from the step size"),
    ("l6_coupled_weight_decay", L6,
     "    Vec exp_avg = load(m + i, n);\n    Vec exp_avg_sq = load(v + i, n);\n"
     "    // Decoupled weight decay first, on the parameter itself (not added to the gradient), as AdamW does.\n"
     "    if (decay) param = param * decay_v;\n",
     "    grad = grad + (Vec(1.f) - decay_v) * param;\n    Vec exp_avg = load(m + i, n);\n"
     "    Vec exp_avg_sq = load(v + i, n);\n",
     "L2-style (coupled) weight decay: lr * wd * p is added to the gradient instead of scaling the parameter"),
    ("l6_betas_swapped", L6,
     "    exp_avg = exp_avg * beta1 + one_minus_beta1 * grad;\n    exp_avg_sq = exp_avg_sq * beta2 + one_minus_beta2 * grad * grad;",
     "    exp_avg = exp_avg * beta2 + one_minus_beta2 * grad;\n    exp_avg_sq = exp_avg_sq * beta1 + one_minus_beta1 * grad * grad;",
     "beta1 and beta2 swapped between the two moments"),
    ("l6_eps_inside_sqrt", L6,
     "const Vec denom = exp_avg_sq.sqrt() / sqrt_bc2 + eps;",
     "const Vec denom = (exp_avg_sq + eps).sqrt() / sqrt_bc2;",
     "eps added under the square root (Adam's paper writes it outside)"),
    ("l6_vector_tail_skipped", L6,
     "for (int64_t i = begin; i < end; i += kLanes) {\n    const int64_t n = std::min(kLanes, end - i);",
     "for (int64_t i = begin; i + kLanes <= end; i += kLanes) {\n    const int64_t n = kLanes;",
     "the last, partial vector of each range is never updated"),
    ("l6_state_not_written_back", L6,
     "    store(m + i, exp_avg, n);\n",
     "",
     "the new first moment is computed but not stored"),
    ("l6_no_weight_decay", L6,
     "    if (decay) param = param * decay_v;\n",
     "",
     "the fused step forgets the weight decay"),
    ("l6_16bit_truncates", L6,
     "  return T(x);  // c10::BFloat16 / c10::Half round to nearest even",
     "  uint32_t bits;\n"
     "  __builtin_memcpy(&bits, &x, sizeof bits);\n"
     "  bits &= 0xFFFF0000u;  // keeps the upper half: truncation\n"
     "  float truncated;\n"
     "  __builtin_memcpy(&truncated, &bits, sizeof bits);\n"
     "  return T(std::is_same<T, c10::BFloat16>::value ? truncated : x);",
     "bfloat16 parameters are written back truncated (the float's upper 16 bits) instead of rounded to nearest"),
    ("l6_16bit_state_rounded", L6,
     "    store(m + i, exp_avg, n);\n",
     "    if (std::is_same<T, float>::value) {\n"
     "      store(m + i, exp_avg, n);\n"
     "    } else {\n"
     "      T rounded[kLanes];\n"
     "      store(rounded, exp_avg, n);\n"
     "      store(m + i, load(rounded, n), n);\n"
     "    }\n",
     "with 16-bit parameters the first moment is rounded to the parameter's dtype each step (state not float32)"),
    # ---- step 3: the operator's checks ------------------------------------------------------------------
    ("l6_overlap_check_misses_pairs", L6,
     "for (int j = i + 1; j < 4; ++j) {",
     "for (int j = i + 1; j < i + 2 && j < 4; ++j) {",
     "the aliasing check compares only neighbouring arguments (param/grad, grad/exp_avg, ...)"),
    ("l6_contiguity_unchecked", L6,
     "TORCH_CHECK(tensors[i]->is_contiguous(), ",
     "TORCH_CHECK(i == 0 || tensors[i]->is_contiguous(), ",
     "a non-contiguous parameter is accepted"),
    ("l6_beta_range_inclusive", L6,
     "TORCH_CHECK(hyper.beta1 >= 0 && hyper.beta1 < 1,",
     "TORCH_CHECK(hyper.beta1 >= 0 && hyper.beta1 <= 1,",
     "beta1 = 1 (a first moment that never moves) is accepted"),
    # ---- step 4: the multi-tensor operator --------------------------------------------------------------
    ("l6_multi_first_tensor_only", L6,
     "for (; t < count && offsets[t] < end; ++t) {",
     "for (; t < count && offsets[t] <= begin; ++t) {",
     "a range that spans several tensors updates only the one it starts in"),
    ("l6_multi_offset_not_clipped", L6,
     "const int64_t hi = std::min(end, offsets[t + 1]) - offsets[t];",
     "const int64_t hi = offsets[t + 1] - offsets[t];",
     "each range updates the rest of its tensor, not only its own part (elements are updated twice)"),
    ("l6_multi_no_cross_overlap", L6,
     "    TORCH_CHECK(ranges[k].begin >= ranges[k - 1].end, ",
     "    TORCH_CHECK(true || ranges[k].begin >= ranges[k - 1].end, ",
     "tensors of different tuples may share memory"),
    # ---- step 5: the scaler's fused unscale --------------------------------------------------------------
    ("l6_unscale_found_inf_never_set", L6,
     "*found_inf.data_ptr<float>() = 1.0f;",
     "(void)found_inf;",
     "the non-finite check runs but found_inf is never written"),
    ("l6_unscale_piece_flag_overwritten", L6,
     "found = unscale_part(grads[t], lo, hi, inv) || found;",
     "found = unscale_part(grads[t], lo, hi, inv);",
     "a piece that spans several gradients keeps only the last one's flag"),
    ("l6_unscale_short_circuit", L6,
     "found = unscale_part(grads[t], lo, hi, inv) || found;",
     "found = found || unscale_part(grads[t], lo, hi, inv);",
     "after an inf, the rest of the piece's gradients are not unscaled (|| short-circuits)"),
    ("l6_unscale_tail_skipped", L6,
     "for (int64_t i = lo; i < hi; i += kLanes) {",
     "for (int64_t i = lo; i + kLanes <= hi; i += kLanes) {",
     "the last, partial vector of each part is neither checked nor unscaled"),
    ("l6_unscale_no_overlap_check", L6,
     'check_disjoint("fused_unscale_", {grads}, {"grads"});',
     "",
     "gradients that share memory are accepted (and unscaled twice)"),
    ("l6_unscale_contiguity_unchecked", L6,
     'TORCH_CHECK(g.is_contiguous(), "fused_unscale_: grad ", i, " is not contiguous");',
     "",
     "a strided gradient is accepted and its memory walked as if contiguous"),
    # ---- the checks of lesson6 issue 27, section 2: mistakes that used to pass --------------------------------
    ("l6_nan_eps_accepted", L6,
     "TORCH_CHECK(hyper.eps >= 0,",
     "TORCH_CHECK(!(hyper.eps < 0),",
     "a NaN eps is accepted (the rule written as 'not negative')"),
    ("l6_nan_weight_decay_accepted", L6,
     "TORCH_CHECK(hyper.weight_decay >= 0,",
     "TORCH_CHECK(!(hyper.weight_decay < 0),",
     "a NaN weight decay is accepted"),
    ("l6_nan_beta1_accepted", L6,
     "TORCH_CHECK(hyper.beta1 >= 0 && hyper.beta1 < 1,",
     "TORCH_CHECK(!(hyper.beta1 < 0 || hyper.beta1 >= 1),",
     "a NaN beta1 is accepted"),
    ("l6_nan_beta2_accepted", L6,
     "TORCH_CHECK(hyper.beta2 >= 0 && hyper.beta2 < 1,",
     "TORCH_CHECK(!(hyper.beta2 < 0 || hyper.beta2 >= 1),",
     "a NaN beta2 is accepted"),
    ("l6_beta2_one_accepted", L6,
     "TORCH_CHECK(hyper.beta2 >= 0 && hyper.beta2 < 1,",
     "TORCH_CHECK(hyper.beta2 >= 0 && hyper.beta2 <= 1,",
     "beta2 = 1 is accepted: 1 - beta2^t is 0 and the step divides by it"),
    ("l6_negative_step_accepted", L6,
     "TORCH_CHECK(step >= 1,",
     "TORCH_CHECK(step != 0,",
     "a negative step is accepted (only 0 refused)"),
    ("l6_unscale_shared_scratch", L6,
     "    case c10::ScalarType::BFloat16:\n      return unscale_range(grad.data_ptr<c10::BFloat16>(), lo, hi, inv_scale);",
     "    case c10::ScalarType::BFloat16: {\n"
     "      static std::vector<float> scratch(kChunk);  // one piece's buffer, shared by every thread\n"
     "      c10::BFloat16* g = grad.data_ptr<c10::BFloat16>();\n"
     "      for (int64_t i = lo; i < hi; ++i) scratch[i - lo] = static_cast<float>(g[i]);\n"
     "      const bool found = unscale_range(scratch.data(), 0, hi - lo, inv_scale);\n"
     "      for (int64_t i = lo; i < hi; ++i) g[i] = c10::BFloat16(scratch[i - lo]);\n"
     "      return found;\n"
     "    }",
     "bfloat16 gradients are unscaled through one float32 scratch buffer that the threads of the region share"),
    ("l6_multi_region_per_tensor", L6,
     "  // One parallel region for the whole list.\n  for_each_chunk(offsets.back(), [&](int64_t begin, int64_t end) {",
     "  for (size_t t = 0; t < params.size(); ++t) {\n"
     "    for_each_chunk(params[t].numel(), [&](int64_t lo, int64_t hi) {\n"
     "      update_part(params[t], grads[t], exp_avgs[t], exp_avg_sqs[t], lo, hi, c, decay);\n"
     "    });\n"
     "  }\n"
     "  if ((false)) for_each_chunk(offsets.back(), [&](int64_t begin, int64_t end) {",
     "the multi-tensor kernel runs one parallel region per tensor (the right values, not one region)"),
    ("l6_unscale_region_per_grad", L6,
     "  for_each_chunk(offsets.back(), [&](int64_t begin, int64_t end) {\n    bool found = false;",
     "  for (size_t t = 0; t < grads.size(); ++t) {\n"
     "    for_each_chunk(grads[t].numel(), [&](int64_t lo, int64_t hi) {\n"
     "      if (unscale_part(grads[t], lo, hi, inv)) piece_found[0] = 1;\n"
     "    });\n"
     "  }\n"
     "  if ((false)) for_each_chunk(offsets.back(), [&](int64_t begin, int64_t end) {\n    bool found = false;",
     "the unscale runs one parallel region per gradient"),
    ("l6_unscale_check_skipped_at_scale_1", L6,
     "    non_finite = non_finite + (x - x);\n",
     "    if (inv_scale != 1.0f) non_finite = non_finite + (x - x);\n",
     "at a scale of 1 nothing is multiplied, and the non-finite check is skipped with it"),
    ("l6_unscale_checks_after_multiply", L6,
     "    non_finite = non_finite + (x - x);\n    if (inv_scale != 1.0f) store(g + i, x * inv, n);",
     "    const Vec y = x * inv;\n    non_finite = non_finite + (y - y);\n    if (inv_scale != 1.0f) store(g + i, y, n);",
     "the non-finite check looks at the unscaled value: a finite gradient that overflows when multiplied is flagged"),
    ("l6_multi_devices_unchecked", L6,
     "    TORCH_CHECK(params[i].device() == params[0].device(),",
     "    TORCH_CHECK(true || params[i].device() == params[0].device(),",
     "tuples on different devices are accepted (the CUDA operator updates some, then fails)"),
    # ---- issue 27, section 6: mistakes a learner made that passed every check ----------------------------
    ("l6_napkin_half_as_4_bytes", L6,
     "const int64_t param = numel * static_cast<int64_t>(c10::elementSize(param_dtype));",
     "const int64_t param = numel * (param_dtype == c10::ScalarType::BFloat16 ? 2 : 4);",
     "the fused napkin knows bfloat16 as a 16-bit type, and counts float16 as 4 bytes"),
    ("l6_device_check_one_tensor", L6,
     "  TORCH_CHECK(grad.device() == param.device() && exp_avg.device() == param.device() &&\n"
     "                  exp_avg_sq.device() == param.device(),",
     "  TORCH_CHECK(exp_avg_sq.device() == param.device(),",
     "the device rule compares one of the other three tensors with param: grad or exp_avg elsewhere passes"),
    ("l6_16bit_tail_overread", L6,
     "for (int64_t i = 0; i < count; ++i) lanes[i] = static_cast<float>(src[i]);",
     "for (int64_t i = 0; i < Vec::size(); ++i) lanes[i] = static_cast<float>(src[i]);",
     "a 16-bit load converts all the lanes: the last vector reads up to 7 elements past the tensor's end"),
    ("l6_16bit_tail_overwrite", L6,
     "for (int64_t i = 0; i < count; ++i) dst[i] = rounded<T>(lanes[i]);",
     "for (int64_t i = 0; i < Vec::size(); ++i) dst[i] = rounded<T>(lanes[i]);",
     "a 16-bit store writes all the lanes: the last vector writes up to 7 elements past the tensor's end"),
    ("l6_float_tail_overread", L6,
     "Vec load(const float* src, int64_t count) { return count == Vec::size() ? Vec::loadu(src) : Vec::loadu(src, count); }",
     "Vec load(const float* src, int64_t count) { return Vec::loadu(src); }",
     "every float32 vector is loaded whole: the last one reads past the tensor's end (only the store is counted)"),
    # ---- step 6: the launch shape (the CUDA kernels' own mutants need a GPU to be caught: not listed) ------
    ("l6_launch_blocks_rounded_down", L6,
     "const int64_t wanted = (packs + kThreadsPerBlock - 1) / kThreadsPerBlock;",
     "const int64_t wanted = packs / kThreadsPerBlock;",
     "the blocks are rounded down: a small tensor gets a grid of zero blocks, a large one loses its tail"),
    ("l6_launch_packs_rounded_down", L6,
     "const int64_t packs = (numel + vector_width - 1) / vector_width;",
     "const int64_t packs = numel / vector_width;",
     "a partial last pack gets no thread"),
    ("l6_launch_width_ignored", L6,
     "const int64_t packs = (numel + vector_width - 1) / vector_width;",
     "const int64_t packs = numel;",
     "one thread per element although each thread loads a pack: four times the blocks needed"),
    ("l6_launch_no_cap", L6,
     "shape.blocks = std::min(wanted, static_cast<int64_t>(multiprocessors) * kBlocksPerMultiprocessor);",
     "shape.blocks = wanted;",
     "the grid grows with the tensor without bound (the grid-stride loop never loops)"),
    ("l6_launch_width_unchecked", L6,
     "  TORCH_CHECK(vector_width == 1 || vector_width == 2 || vector_width == 4 || vector_width == 8,",
     "  TORCH_CHECK(vector_width > 0,",
     "a vector width that is not a load size (3) is accepted"),
    # ---- step 6: the CUDA kernels, caught on the CPU grid (grid.h) on any machine -------------------------
    ("l6_gpu_tail_skipped", L6_CUDA,
     "    if (tail < numel) update(p[tail], g[tail], m[tail], v[tail], c, multiplier);\n",
     "",
     "the elements after the last whole pack are never updated"),
    ("l6_gpu_tail_overlaps_last_pack", L6_CUDA,
     "const int64_t tail = packs * kWidth + thread.index();\n    if (tail < numel) update(",
     "const int64_t tail = (numel > kWidth ? numel - kWidth : 0) + thread.index();\n    if (tail < numel) update(",
     "the tail is taken as the last kWidth elements: those of the last whole pack are updated twice"),
    ("l6_gpu_packs_unaligned", L6_CUDA,
     "  const bool packed = aligned(p, sizeof(T) * kWidth) && aligned(g, sizeof(T) * kWidth) &&\n"
     "                      aligned(m, sizeof(float) * kWidth) && aligned(v, sizeof(float) * kWidth);",
     "  const bool packed = true;",
     "packed loads from a view that starts mid-pack (a misaligned address)"),
    ("l6_gpu_grid_stride_never_loops", L6_CUDA,
     "for (int64_t i = thread.index(); i < packs; i += thread.stride()) {\n      Pack<T, kWidth> pp",
     "if (int64_t i = thread.index(); i < packs) {\n      Pack<T, kWidth> pp",
     "each thread updates one pack: a grid smaller than the tensor leaves the rest alone"),
    ("l6_gpu_stride_is_block", L6_CUDA,
     "for (int64_t i = thread.index(); i < packs; i += thread.stride()) {\n      Pack<T, kWidth> pp",
     "for (int64_t i = thread.index(); i < packs; i += thread.threads) {\n      Pack<T, kWidth> pp",
     "the grid-stride loop steps by the block (blockDim.x), not the grid: packs are updated several times"),
    ("l6_gpu_bf16_truncates", L6_CUDA,
     "return __float2bfloat16_rn(x);",
     "return __float2bfloat16_rz(x);",
     "bfloat16 parameters written back truncated (round toward zero) instead of rounded to nearest"),
    ("l6_gpu_no_weight_decay", L6_CUDA,
     "  if (c.apply_decay) param = mul_rn(param, c.decay);\n",
     "",
     "the CUDA step forgets the weight decay"),
    ("l6_gpu_unscale_flag_never_set", L6_CUDA,
     "    if (non_finite) *found_inf = 1.0f;",
     "    (void)non_finite;",
     "the CUDA unscale finds the inf but never writes found_inf"),
    ("l6_gpu_unscale_skips_check_at_1", L6_CUDA,
     "        non_finite = non_finite || !isfinite(x);\n        pack.x[k]",
     "        non_finite = non_finite || (inv != 1.0f && !isfinite(x));\n        pack.x[k]",
     "at a scale of 1 nothing is multiplied, and the non-finite check is skipped with it"),
    ("l6_gpu_unscale_checks_after_multiply", L6_CUDA,
     "        non_finite = non_finite || !isfinite(x);\n        pack.x[k] = from_float<T>(x * inv);",
     "        pack.x[k] = from_float<T>(x * inv);\n        non_finite = non_finite || !isfinite(to_float(pack.x[k]));",
     "the non-finite check looks at the unscaled value: a finite gradient that overflows when multiplied is flagged"),
    ("l6_gpu_unscale_packs_unaligned", L6_CUDA,
     "  const bool packed = aligned(g, sizeof(T) * kWidth);",
     "  const bool packed = true;",
     "the unscale loads packs from gradients that start mid-pack (a misaligned address)"),
    ("l6_gpu_unscale_stops_at_first_inf", L6_CUDA,
     "for (int64_t i = thread.index(); i < packs; i += thread.stride()) {\n      Pack<T, kWidth> pack",
     "for (int64_t i = thread.index(); i < packs && !non_finite; i += thread.stride()) {\n      Pack<T, kWidth> pack",
     "a thread that met an inf stops: the rest of its packs are not unscaled"),
]

# Only a GPU catches these (tools/mutants/run.sh --gpu 'l6_gpu_stream_*', on a machine that runs the GPU cases): the
# CPU grid has no streams.
GPU_MUTANTS = [
    ("l6_gpu_stream_ignored", L6_CUDA,
     "  if (packed) return launch<AdamWKernel<T, kWidth>>(shape, target, p, g, m, v, numel, c, grad_scale, found_inf);\n"
     "  return launch<AdamWKernel<T, 1>>(shape, target, p, g, m, v, numel, c, grad_scale, found_inf);",
     "  Target on_default = target;\n  on_default.stream = nullptr;  // the legacy default stream\n"
     "  if (packed) return launch<AdamWKernel<T, kWidth>>(shape, on_default, p, g, m, v, numel, c, grad_scale, found_inf);\n"
     "  return launch<AdamWKernel<T, 1>>(shape, on_default, p, g, m, v, numel, c, grad_scale, found_inf);",
     "the AdamW kernel is launched on the default stream, not the caller's current stream"),
]
