// Checks for lesson 5, step 3: overlap: the Reducer, its buckets and its errors.
// Run: bazel test //lesson5_distributed:all   (this step only: bazel test //lesson5_distributed:ddp_step3_test)
// The seeded problems and the helpers that start ranks are in ddp_test_helpers.h.
#include "lesson5_distributed/ddp_test_helpers.h"

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "lesson5_distributed/comm.h"
#include "lesson5_distributed/ddp.h"

namespace ddp_checks {

TEST_CASE("[step3] with overlap, the first bucket's all-reduce starts before backward has finished") {
  const Data data(16);
  for (bool overlap : {true, false}) {
    CAPTURE(overlap);
    auto models = replicas(2);
    std::vector<int64_t> calls_when_first_layer_ready(2, -1), in_backward(2, -1), calls(2, -1);
    dist::run_ranks(launch(2), [&](dist::Comm& comm) {
      const auto params = models[comm.rank()]->parameters();
      // Our hook on the first layer's weight, whose gradient backward computes last; registered before the
      // reducer's, so it runs first: how many all-reduces had started by then?
      params[0].register_hook([&, r = comm.rank()](const torch::Tensor&) {
        calls_when_first_layer_ready[r] = comm.stats().all_reduce_calls;
      });
      ddp::ReducerOptions options;
      options.bucket_bytes = 1000;
      options.first_bucket_bytes = 300;
      options.overlap = overlap;
      ddp::Reducer reducer(comm, params, options);
      comm.reset_stats();
      torch::mse_loss(models[comm.rank()]->forward(ddp::shard(data.x, comm.rank(), 2)),
                      ddp::shard(data.y, comm.rank(), 2))
          .backward();
      reducer.finish();
      in_backward[comm.rank()] = reducer.launched_in_backward();
      calls[comm.rank()] = comm.stats().all_reduce_calls;
    });
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      CHECK(calls[r] == 4);  // 3 buckets + the "no gradient" map
      if (overlap) {
        CHECK(calls_when_first_layer_ready[r] >= 1);  // launched while backward was still running
        CHECK(in_backward[r] == 3);
      } else {
        CHECK(calls_when_first_layer_ready[r] == 0);
        CHECK(in_backward[r] == 0);
      }
    }
  }
}

TEST_CASE("[step3] the reducer's averaged gradients give the full-batch steps (N = 2 and 4, overlap on and off)") {
  const Data data(16);
  const std::vector<torch::Tensor> reference = full_batch_sgd(data, 3);
  for (int n : {2, 4}) {
    for (bool overlap : {true, false}) {
      CAPTURE(n);
      CAPTURE(overlap);
      auto models = replicas(n);
      std::vector<int64_t> calls(static_cast<size_t>(n));
      dist::run_ranks(launch(n), [&](dist::Comm& comm) {
        auto& model = models[comm.rank()];
        ddp::ReducerOptions options;
        options.bucket_bytes = 1000;
        options.first_bucket_bytes = 300;
        options.overlap = overlap;
        ddp::Reducer reducer(comm, model->parameters(), options);
        torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
        comm.reset_stats();
        for (int step = 0; step < 3; ++step) {
          sgd.zero_grad();
          torch::mse_loss(model->forward(ddp::shard(data.x, comm.rank(), n)), ddp::shard(data.y, comm.rank(), n))
              .backward();
          reducer.finish();
          sgd.step();
        }
        calls[comm.rank()] = comm.stats().all_reduce_calls;
      });
      for (int r = 0; r < n; ++r) {
        CAPTURE(r);
        const double rel = rel_error(values_of(models[r]->parameters()), reference);
        CAPTURE(rel);
        CHECK(rel <= 1e-6);
        CHECK(calls[r] == 12);  // (3 buckets + the "no gradient" map) x 3 steps
      }
    }
  }
}

TEST_CASE("[step3] a parameter that gets no gradient in a backward gives a clear error") {
  auto models = replicas(2);
  std::vector<torch::Tensor> extra;
  for (int r = 0; r < 2; ++r) extra.push_back(torch::zeros({3}, torch::requires_grad()));
  const Data data(4);
  const auto outcomes = dist::run_ranks_collect(launch(2), [&](dist::Comm& comm) {
    auto params = models[comm.rank()]->parameters();
    params.push_back(extra[comm.rank()]);  // never used by the loss
    ddp::Reducer reducer(comm, params);
    torch::mse_loss(models[comm.rank()]->forward(data.x), data.y).backward();
    reducer.finish();
  });
  check_every_rank_failed_with(outcomes, "got no gradient");
}

TEST_CASE("[step3] constructing the reducer gives every rank rank 0's parameters, as DDP's constructor does") {
  const int n = 3;
  for (bool frozen_first_layer : {false, true}) {
    CAPTURE(frozen_first_layer);
    std::vector<torch::nn::Sequential> models;
    for (int r = 0; r < n; ++r) {
      models.push_back(make_model(100 + r));  // a different seed on every rank
      // Frozen layers too: DDP broadcasts every parameter, not only those it reduces.
      if (frozen_first_layer) {
        for (int i : {0, 1}) models.back()->parameters()[i].requires_grad_(false);
      }
    }
    const auto rank0 = values_of(models[0]->parameters());
    REQUIRE(rel_error(values_of(models[2]->parameters()), rank0) > 0);
    dist::run_ranks(launch(n),
                    [&](dist::Comm& comm) { ddp::Reducer reducer(comm, models[comm.rank()]->parameters()); });
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(rel_error(values_of(models[r]->parameters()), rank0) == 0);
    }
  }
}

TEST_CASE("[step3] ranks that freeze or tie differently get a clear error at construction, as in DDP") {
  const Data data(8);
  for (bool tie : {false, true}) {
    CAPTURE(tie);
    auto models = replicas(2);
    const torch::Tensor separate = torch::zeros({4, 16}, torch::requires_grad());  // the last weight's shape
    // The whole lists agree (7 tensors of the same shapes, or the same 6): only the lists the reducers keep differ.
    check_fails_on_every_rank(
        2,
        [&](dist::Comm& comm) {
          const int r = comm.rank();
          auto params = models[r]->parameters();
          if (tie) {
            params.push_back(r == 0 ? params[4] : separate);  // rank 0 ties its last weight, rank 1 does not
          } else if (r == 1) {
            for (int i : {0, 1}) params[i].requires_grad_(false);  // only rank 1 freezes the first layer
          }
          ddp::Reducer reducer(comm, params);
          shard_loss(models[r], data, r, 2).backward();
          reducer.finish();
        },
        tie ? "rank 0 has 6 parameters with 484 elements, rank 1 has 7 parameters with 548 elements"
            : "rank 0 has 6 parameters with 484 elements, rank 1 has 4 parameters with 340 elements");
  }
}

TEST_CASE("[step3] ranks given different bucket limits get a clear error at construction, not mismatched buckets") {
  const Data data(8);
  // First limits of 256 bytes: buckets {b3, W3} then the rest (1664 B) with the default limit, or {b2, W2} and
  // {b1, W1} with 512; a first limit of 256 on rank 1 only: one bucket of all 1936 B on rank 0, two on rank 1.
  for (bool first : {false, true}) {
    CAPTURE(first);
    auto models = replicas(2);
    check_fails_on_every_rank(
        2,
        [&](dist::Comm& comm) {
          const int r = comm.rank();
          ddp::ReducerOptions options;
          if (!first) options.first_bucket_bytes = 256;
          if (r == 1) (first ? options.first_bucket_bytes : options.bucket_bytes) = first ? 256 : 512;
          ddp::Reducer reducer(comm, models[r]->parameters(), options);
          shard_loss(models[r], data, r, 2).backward();
          reducer.finish();
        },
        first ? "the bucket limits differ across ranks: rank 0 has bucket_bytes 26214400 and first_bucket_bytes "
                "1048576, rank 1 has 26214400 and 256"
              : "the bucket limits differ across ranks: rank 0 has bucket_bytes 26214400 and first_bucket_bytes 256, "
                "rank 1 has 512 and 256");
  }
}

TEST_CASE("[step3] a peer that never joins the reducer's check is reported as a timeout, not as other parameters") {
  auto models = replicas(2);
  const auto outcomes = dist::run_ranks_collect(launch(2, 3000), [&](dist::Comm& comm) {
    const int r = comm.rank();
    if (r == 0) {
      ddp::Reducer reducer(comm, models[r]->parameters());
    } else {
      ddp::sync_module_states(comm, models[r]->parameters());  // the reducer's first agreement, then nothing
      std::this_thread::sleep_for(std::chrono::milliseconds(4500));
    }
  });
  REQUIRE(outcomes.size() == 2);
  INFO(outcomes[0].error);
  CHECK_FALSE(outcomes[0].ok);
  CHECK(outcomes[0].error.find("timed out") != std::string::npos);
  CHECK(outcomes[0].error.find("differ across ranks") == std::string::npos);
}

TEST_CASE("[step3] frozen parameters are skipped and a tensor listed twice is reduced once (fine-tuning works)") {
  const Data data(16);
  auto freeze = [](torch::nn::Sequential& model) {
    const auto params = model->parameters();
    params[0].requires_grad_(false);  // the first layer is frozen
    params[1].requires_grad_(false);
  };
  auto reference_model = make_model();
  freeze(reference_model);
  {
    torch::optim::SGD sgd(reference_model->parameters(), torch::optim::SGDOptions(0.1));
    torch::mse_loss(reference_model->forward(data.x), data.y).backward();
    sgd.step();
  }
  const auto reference = values_of(reference_model->parameters());
  const int n = 2;
  auto models = replicas(n);
  std::vector<size_t> kept(n);
  std::vector<int64_t> bucket_bytes(n), reduced_bytes(n);
  dist::run_ranks(launch(n), [&](dist::Comm& comm) {
    auto& model = models[comm.rank()];
    freeze(model);
    std::vector<torch::Tensor> params = model->parameters();
    params.push_back(params[4]);  // the last layer's weight twice, as tied weights would list it
    ddp::Reducer reducer(comm, params);
    kept[comm.rank()] = reducer.params().size();
    for (const auto& bucket : reducer.buckets()) bucket_bytes[comm.rank()] += bucket.bytes;
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
    comm.reset_stats();
    torch::mse_loss(model->forward(ddp::shard(data.x, comm.rank(), n)), ddp::shard(data.y, comm.rank(), n)).backward();
    reducer.finish();
    sgd.step();
    reduced_bytes[comm.rank()] = comm.stats().all_reduce_bytes;
  });
  const int64_t trainable = kModelBytes - (16 * 8 + 16) * 4;  // 1360 B: the first layer is frozen
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    CHECK(kept[r] == 4);  // W2, b2, W3, b3: the frozen two skipped, W3 once
    CHECK(bucket_bytes[r] == trainable);
    CHECK(reduced_bytes[r] == trainable + 4 * 4);  // the gradients once, plus the 4-entry "no gradient" map
    const double rel = rel_error(values_of(models[r]->parameters()), reference);
    CAPTURE(rel);
    CHECK(rel <= 1e-6);
    CHECK_FALSE(models[r]->parameters()[0].grad().defined());
  }
}

TEST_CASE("[step3] a parameter unused on one rank only gives the error on every rank, not a timeout") {
  auto models = replicas(2);
  std::vector<torch::Tensor> extra;
  for (int r = 0; r < 2; ++r) extra.push_back(torch::zeros({3}, torch::requires_grad()));
  const Data data(8);
  const auto outcomes = dist::run_ranks_collect(launch(2, 5000), [&](dist::Comm& comm) {
    const int r = comm.rank();
    auto params = models[r]->parameters();
    params.push_back(extra[r]);
    ddp::Reducer reducer(comm, params);
    torch::Tensor loss = shard_loss(models[r], data, r, 2);
    if (r == 0) loss = loss + extra[r].sum() * 0;  // rank 0 uses it, rank 1 does not
    loss.backward();
    reducer.finish();
  });
  for (const auto& outcome : outcomes) {
    INFO(outcome.error);
    CHECK_FALSE(outcome.ok);
    CHECK(outcome.error.find("parameter 6 got no gradient") != std::string::npos);
    CHECK(outcome.error.find("on 1 of 2 ranks") != std::string::npos);
    CHECK(outcome.error.find("timed out") == std::string::npos);
  }
}

TEST_CASE(
    "[step3] the reducer divides before the sum: float16 gradients whose sum overflows average to a finite mean") {
  std::vector<torch::Tensor> grads(2);
  dist::run_ranks(launch(2), [&](dist::Comm& comm) {
    torch::Tensor p = torch::zeros({4}, torch::kHalf).requires_grad_();
    ddp::Reducer reducer(comm, {p});
    (p * torch::full({4}, 40000.0, torch::kHalf)).sum().backward();  // the gradient: 40000 on both ranks
    reducer.finish();
    grads[comm.rank()] = p.grad().clone();
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    INFO(grads[r]);
    CHECK(torch::equal(grads[r], torch::full({4}, 40000.0, torch::kHalf)));  // summed first: 80000, inf
  }
}

TEST_CASE("[step3] a forgotten finish() gives a clear error on every rank") {
  auto models = replicas(2);
  const Data data(8);
  const auto outcomes = dist::run_ranks_collect(launch(2, 5000), [&](dist::Comm& comm) {
    const int r = comm.rank();
    ddp::Reducer reducer(comm, models[r]->parameters());
    for (int step = 0; step < 2; ++step) {  // no finish() after the first backward
      shard_loss(models[r], data, r, 2).backward();
    }
    reducer.finish();
  });
  check_every_rank_failed_with(outcomes, "finish() was not called");
}

TEST_CASE("[step3] finish() forgotten on one rank only gives a clear error on every rank, not a timeout") {
  auto models = replicas(2);
  const Data data(8);
  for (bool overlap : {true, false}) {
    CAPTURE(overlap);
    const auto outcomes = dist::run_ranks_collect(launch(2, 5000), [&](dist::Comm& comm) {
      const int r = comm.rank();
      ddp::ReducerOptions options;
      options.overlap = overlap;
      ddp::Reducer reducer(comm, models[r]->parameters(), options);
      for (int step = 0; step < 2; ++step) {
        shard_loss(models[r], data, r, 2).backward();
        if (r == 0) reducer.finish();  // rank 1 forgets it
      }
    });
    check_every_rank_failed_with(outcomes, "finish() was not called");
  }
}

TEST_CASE("[step3] gradients ready out of bucket order, in another order on each rank: buckets still go in order") {
  // a and b, 4 floats each, one bucket each (limits of 16 bytes): bucket 0 holds b (make_buckets walks backwards),
  // bucket 1 holds a. Rank 0's loss uses b last (its gradient is ready first: in bucket order); rank 1's uses a
  // last (bucket 1 is ready first). Launched as they become ready, rank 0 would send b where rank 1 sends a.
  auto loss_of = [](const torch::Tensor& a, const torch::Tensor& b, int r) {
    const torch::Tensor x = torch::linspace(0.1, 0.4, 4) * (r + 1);
    return r == 0 ? (b * (a * x).tanh()).sum() : (a * (b * x).tanh()).sum();
  };
  auto leaves = [] {
    return std::vector<torch::Tensor>{torch::full({4}, 0.5).requires_grad_(), torch::full({4}, -0.3).requires_grad_()};
  };
  std::vector<std::vector<torch::Tensor>> local(2);
  for (int r = 0; r < 2; ++r) {
    auto ab = leaves();
    loss_of(ab[0], ab[1], r).backward();
    local[r] = {ab[0].grad(), ab[1].grad()};
  }
  std::vector<std::vector<torch::Tensor>> averaged(2);
  std::vector<std::vector<size_t>> order(2);
  dist::run_ranks(launch(2), [&](dist::Comm& comm) {
    const int r = comm.rank();
    auto ab = leaves();
    for (size_t i = 0; i < 2; ++i) ab[i].register_hook([&order, r, i](const torch::Tensor&) { order[r].push_back(i); });
    ddp::ReducerOptions options;
    options.bucket_bytes = 16;
    options.first_bucket_bytes = 16;
    ddp::Reducer reducer(comm, ab, options);
    loss_of(ab[0], ab[1], r).backward();
    reducer.finish();
    averaged[r] = {ab[0].grad().clone(), ab[1].grad().clone()};
  });
  REQUIRE(order[0] == std::vector<size_t>{1, 0});  // the premise: b first on rank 0, a first on rank 1
  REQUIRE(order[1] == std::vector<size_t>{0, 1});
  for (int r = 0; r < 2; ++r) {
    for (size_t i = 0; i < 2; ++i) {
      CAPTURE(r);
      CAPTURE(i);
      CHECK(torch::allclose(averaged[r][i], (local[0][i] + local[1][i]) / 2, 1e-6, 1e-7));
    }
  }
  // The same with a third parameter that rank 1 does not use, and sizes that differ: a named error on every
  // rank, not a mismatch of bucket sizes or a timeout.
  check_fails_on_every_rank(
      2,
      [&](dist::Comm& comm) {
        const int r = comm.rank();
        const torch::Tensor a = torch::full({4}, 0.5).requires_grad_(), b = torch::full({6}, -0.3).requires_grad_(),
                            c = torch::ones({2}).requires_grad_();
        ddp::ReducerOptions options;
        options.bucket_bytes = 8;
        options.first_bucket_bytes = 8;
        ddp::Reducer reducer(comm, {a, b, c}, options);  // buckets {c}, {b}, {a}
        torch::Tensor loss =
            r == 0 ? (b * (a * 0.5).sum().tanh()).sum() + c.pow(2).sum() : (a * (b * 0.5).sum().tanh()).sum();
        loss.backward();
        reducer.finish();
      },
      "parameter 2 got no gradient in this backward on 1 of 2 ranks");
}

TEST_CASE("[step3] after zero_grad() left defined zero gradients, an unused parameter is still found") {
  // LibTorch 1.13's Optimizer::zero_grad() zeroes the gradients and keeps them (2.x sets them to none): in the
  // second iteration every parameter already has a defined .grad. A reducer that took "has a .grad" for "got a
  // gradient in this backward" would send the unused parameter's slot: last step's average.
  auto models = replicas(2);
  std::vector<torch::Tensor> extra;
  for (int r = 0; r < 2; ++r) extra.push_back(torch::ones({3}, torch::requires_grad()));
  const Data data(8);
  std::vector<int> first_ok(2, 0);
  check_fails_on_every_rank(
      2,
      [&](dist::Comm& comm) {
        const int r = comm.rank();
        auto params = models[r]->parameters();
        params.push_back(extra[r]);
        ddp::Reducer reducer(comm, params);
        torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.1));
        for (int iteration = 0; iteration < 2; ++iteration) {
          for (auto& p : params) {
            if (p.grad().defined()) p.mutable_grad().zero_();  // as 1.13's zero_grad(), on both stacks
          }
          torch::Tensor loss = shard_loss(models[r], data, r, 2);
          if (iteration == 0 || r == 0) loss = loss + extra[r].pow(2).sum();  // rank 1 drops it in iteration 2
          loss.backward();
          reducer.finish();
          sgd.step();
          if (iteration == 0) first_ok[r] = 1;
        }
      },
      "parameter 6 got no gradient in this backward on 1 of 2 ranks");
  CHECK(first_ok == std::vector<int>{1, 1});
}

TEST_CASE("[step3] the lesson's buckets are the ones DDP rebuilds from the order gradients arrived in") {
  // DDP records the order its hooks fire in during the first backward and rebuilds its buckets in that order
  // (rebuild_buckets). make_buckets assumes reverse parameter order; for this model it is exactly that order.
  auto models = replicas(1);
  const Data data(4);
  std::vector<size_t> order;
  std::vector<ddp::Bucket> buckets;
  dist::run_ranks(launch(1), [&](dist::Comm& comm) {
    const auto params = models[0]->parameters();
    for (size_t i = 0; i < params.size(); ++i)
      params[i].register_hook([&order, i](const torch::Tensor&) { order.push_back(i); });
    ddp::ReducerOptions options;
    options.bucket_bytes = 1000;
    options.first_bucket_bytes = 300;
    ddp::Reducer reducer(comm, params, options);
    torch::mse_loss(models[0]->forward(data.x), data.y).backward();
    reducer.finish();
    buckets = reducer.buckets();
  });
  CHECK(order == std::vector<size_t>{5, 4, 3, 2, 1, 0});
  // DDP's rebuild walks the ready order; make_buckets walks its list backwards: give it the ready order reversed.
  const auto params = models[0]->parameters();
  std::vector<torch::Tensor> reversed_ready;
  for (size_t k = order.size(); k-- > 0;) reversed_ready.push_back(params[order[k]]);
  const auto rebuilt = ddp::make_buckets(reversed_ready, 1000, 300);
  REQUIRE(rebuilt.size() == buckets.size());
  for (size_t b = 0; b < buckets.size(); ++b) {
    std::vector<size_t> mapped;
    for (size_t j : rebuilt[b].params) mapped.push_back(order[order.size() - 1 - j]);
    CAPTURE(b);
    CHECK(mapped == buckets[b].params);
  }
}

TEST_CASE("[step3] the reducer averages float64, float16 and bfloat16 gradients beside float32, each in its dtype") {
  // One parameter per dtype: make_buckets gives each dtype its own bucket, and each bucket's buffer is of that
  // dtype, so the bytes handed to all-reduce are the gradients' own (16 + 24 + 4, + 12 for bfloat16) plus the map
  // (a float per parameter), and the averages equal g0 / 2 + g1 / 2 computed in each dtype (0.1 x k in float64 is
  // not a float32). bfloat16: averaged where this Gloo takes it, else refused on every rank at construction.
  const std::vector<torch::Dtype> dtypes{torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16};
  const std::vector<int64_t> sizes{4, 3, 2, 6};
  auto coefficient = [&](size_t i, int r) {
    const auto options = torch::TensorOptions().dtype(dtypes[i]);
    return i == 1 ? torch::arange(1, 4, options) * 0.1 * (r + 1) : torch::arange(sizes[i], options) * 1.5 * (r + 1);
  };
  for (size_t count : {3, 4}) {
    CAPTURE(count);
    std::vector<std::vector<torch::Tensor>> grads(2);
    std::vector<int64_t> bytes(2, -1);
    std::vector<size_t> buckets(2);
    const auto outcomes = dist::run_ranks_collect(launch(2, 5000), [&](dist::Comm& comm) {
      const int r = comm.rank();
      std::vector<torch::Tensor> params;
      for (size_t i = 0; i < count; ++i) {
        params.push_back(torch::zeros({sizes[i]}, torch::TensorOptions().dtype(dtypes[i])).requires_grad_());
      }
      ddp::Reducer reducer(comm, params);
      buckets[r] = reducer.buckets().size();
      comm.reset_stats();
      torch::Tensor loss = torch::zeros({}, torch::kDouble);
      for (size_t i = 0; i < count; ++i) loss = loss + (params[i] * coefficient(i, r)).sum().to(torch::kDouble);
      loss.backward();  // the gradient of parameter i is coefficient(i, r), in its dtype
      reducer.finish();
      bytes[r] = comm.stats().all_reduce_bytes;
      for (const auto& p : params) grads[r].push_back(p.grad().clone());
    });
    if (count == 4 && !gloo_takes_bfloat16()) {
      check_every_rank_failed_with(outcomes, "Invalid scalar type");  // LibTorch 1.13's Gloo, on every rank alike
      continue;
    }
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      INFO(outcomes[r].error);
      REQUIRE(outcomes[r].ok);
      CHECK(buckets[r] == count);
      CHECK(bytes[r] == (count == 3 ? 16 + 24 + 4 + 12 : 16 + 24 + 4 + 12 + 16));
      for (size_t i = 0; i < count; ++i) {
        CAPTURE(i);
        INFO(grads[r][i]);
        CHECK((grads[r][i].scalar_type() == dtypes[i]));
        CHECK(torch::equal(grads[r][i], coefficient(i, 0) / 2 + coefficient(i, 1) / 2));
      }
    }
  }
}

TEST_CASE("[step3] finish() writes the averages into the same .grad tensors, in their layouts, step after step") {
  // w is channels_last, so autograd keeps its .grad channels_last; t's .grad is set to a transpose before the first
  // backward, which autograd then accumulates into in place. finish() must copy into those tensors: same
  // TensorImpl, same memory, same strides, in every step (a user's reference to a .grad sees the average).
  const int steps = 3;
  std::vector<std::vector<int>> kept(2);
  std::vector<std::vector<torch::Tensor>> grads(2);
  auto input = [](int r, int step, std::vector<int64_t> shape) {
    int64_t numel = 1;
    for (int64_t size : shape) numel *= size;
    return torch::linspace(-1, 1, numel).reshape(shape) * (r + 1 + step);
  };
  dist::run_ranks(launch(2), [&](dist::Comm& comm) {
    const int r = comm.rank();
    const torch::Tensor w = torch::linspace(0.5, 1, 24)
                                .reshape({2, 3, 2, 2})
                                .contiguous(torch::MemoryFormat::ChannelsLast)
                                .requires_grad_();
    const torch::Tensor t = torch::full({3, 4}, 0.25).requires_grad_();
    t.mutable_grad() = torch::zeros({4, 3}).t();
    ddp::Reducer reducer(comm, {w, t});
    for (int step = 0; step < steps; ++step) {
      for (const auto& p : {w, t}) {
        if (p.grad().defined()) p.mutable_grad().zero_();  // as 1.13's zero_grad(), on both stacks
      }
      ((w * input(r, step, {2, 3, 2, 2})).sum() + (t * input(r, step, {3, 4})).sum()).backward();
      const std::vector<const void*> impls{w.grad().unsafeGetTensorImpl(), t.grad().unsafeGetTensorImpl()};
      const std::vector<const void*> data{w.grad().data_ptr(), t.grad().data_ptr()};
      reducer.finish();
      kept[r].push_back(w.grad().unsafeGetTensorImpl() == impls[0] && w.grad().data_ptr() == data[0] &&
                                w.grad().is_contiguous(torch::MemoryFormat::ChannelsLast) &&
                                t.grad().unsafeGetTensorImpl() == impls[1] && t.grad().data_ptr() == data[1] &&
                                t.grad().stride(0) == 1
                            ? 1
                            : 0);
      grads[r].push_back(w.grad().clone());
      grads[r].push_back(t.grad().clone());
    }
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(kept[r] == std::vector<int>(steps, 1));
    for (int step = 0; step < steps; ++step) {
      CAPTURE(step);
      CHECK(torch::allclose(grads[r][2 * step], (input(0, step, {2, 3, 2, 2}) + input(1, step, {2, 3, 2, 2})) / 2));
      CHECK(torch::allclose(grads[r][2 * step + 1], (input(0, step, {3, 4}) + input(1, step, {3, 4})) / 2));
    }
  }
}

TEST_CASE("[step3] overlap goes on after the first step: every bucket starts inside backward in steps 1, 2 and 3") {
  // a and b of the out-of-order case above, one bucket each; the loss swaps which one is ready first on each rank
  // and in each step. The counting communicator's log tells which all-reduces started before finish(): both
  // buckets, in every step (a reducer that stopped overlapping after step 1 would still average right).
  auto loss_of = [](const torch::Tensor& a, const torch::Tensor& b, int form) {
    const torch::Tensor x = torch::linspace(0.1, 0.4, 4) * (form + 1);
    return form == 0 ? (b * (a * x).tanh()).sum() : (a * (b * x).tanh()).sum();
  };
  auto leaves = [] {
    return std::vector<torch::Tensor>{torch::full({4}, 0.5).requires_grad_(), torch::full({4}, -0.3).requires_grad_()};
  };
  const int steps = 3;
  std::vector<std::vector<int64_t>> in_backward(2);
  std::vector<int64_t> launched(2, -1);
  std::vector<std::vector<torch::Tensor>> averaged(2);
  dist::run_ranks(launch(2), [&](dist::Comm& comm) {
    const int r = comm.rank();
    auto ab = leaves();
    ddp::ReducerOptions options;
    options.bucket_bytes = 16;
    options.first_bucket_bytes = 16;
    ddp::Reducer reducer(comm, ab, options);
    for (int step = 0; step < steps; ++step) {
      for (auto& p : ab) p.mutable_grad() = torch::Tensor();
      comm.reset_stats();
      loss_of(ab[0], ab[1], (r + step) % 2).backward();
      int64_t started = 0;
      for (const std::string& entry : comm.log()) started += entry.rfind("all_reduce", 0) == 0 ? 1 : 0;
      in_backward[r].push_back(started);
      reducer.finish();
      averaged[r].push_back(ab[0].grad().clone());
      averaged[r].push_back(ab[1].grad().clone());
    }
    launched[r] = reducer.launched_in_backward();
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(in_backward[r] == std::vector<int64_t>(steps, 2));
    CHECK(launched[r] == 2 * steps);
    for (int step = 0; step < steps; ++step) {
      std::vector<torch::Tensor> sum(2);
      for (int rank = 0; rank < 2; ++rank) {
        auto ab = leaves();
        loss_of(ab[0], ab[1], (rank + step) % 2).backward();
        for (size_t i = 0; i < 2; ++i) sum[i] = sum[i].defined() ? sum[i] + ab[i].grad() : ab[i].grad();
      }
      for (size_t i = 0; i < 2; ++i) {
        CAPTURE(step);
        CAPTURE(i);
        CHECK(torch::allclose(averaged[r][2 * step + i], sum[i] / 2, 1e-6, 1e-7));
      }
    }
  }
}

TEST_CASE("[step3] a rank with nothing trainable: a named error on every rank at construction, not a timeout") {
  // Frozen on rank 1 only: its kept list is empty, unlike rank 0's, which the agreement names. Frozen everywhere:
  // the lists agree, and every rank refuses a reducer with nothing to reduce.
  for (bool everywhere : {false, true}) {
    CAPTURE(everywhere);
    auto models = replicas(2);
    check_fails_on_every_rank(
        2,
        [&](dist::Comm& comm) {
          const int r = comm.rank();
          const auto params = models[r]->parameters();
          if (everywhere || r == 1) {
            for (const auto& p : params) p.requires_grad_(false);
          }
          ddp::Reducer reducer(comm, params);
        },
        everywhere ? "no parameter requires grad"
                   : "rank 0 has 6 parameters with 484 elements, rank 1 has 0 parameters");
  }
}

}  // namespace ddp_checks
