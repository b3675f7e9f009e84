// Helpers the lessons' checks share: snapshots of parameters and gradients, and how far two lists of tensors
// are apart. Include after tests/torch_doctest.h (they REQUIRE their preconditions).
#pragma once

#include <algorithm>
#include <vector>

#include <torch/torch.h>

#include "tests/torch_doctest.h"

namespace workshop {
namespace test {

/// Copies of the parameters' values (detached), e.g. before a step, to compare with after it.
inline std::vector<torch::Tensor> values_of(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone());
  return out;
}

/// Copies of the parameters' gradients; a parameter without a gradient gives an undefined tensor.
inline std::vector<torch::Tensor> grads_of(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.grad().defined() ? p.grad().detach().clone() : torch::Tensor());
  return out;
}

/// Whether `a` and `b` hold the same tensors, element for element (same count, shapes and values).
inline bool all_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

/// max |a[i] - b[i]| over all tensors and elements, computed in float64 (every tensor must be defined).
inline double max_abs_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].defined());
    REQUIRE(b[i].defined());
    worst = std::max(worst, (a[i].to(torch::kDouble) - b[i].to(torch::kDouble)).abs().max().item<double>());
  }
  return worst;
}

/// max |a - b| / max |b|: the error of `a` relative to the reference `b`, over all tensors (float64).
inline double rel_error(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double scale = 0;
  for (const auto& t : b) {
    REQUIRE(t.defined());
    scale = std::max(scale, t.abs().max().item<double>());
  }
  return max_abs_diff(a, b) / scale;
}

}  // namespace test
}  // namespace workshop
