// Checks of the shared peak-bytes meter (common/memory_meter.h) that lessons 2 and 4 rely on.
#include "tests/torch_doctest.h"

#include <thread>

#include <torch/torch.h>

#include "common/memory_meter.h"

TEST_CASE("the CPU meter counts a known allocation exactly, and its release") {
  workshop::MemoryMeter meter(torch::kCPU);
  CHECK(meter.current_bytes() == 0);
  {
    const auto t = torch::empty({1000, 25}, torch::kFloat);  // 100,000 bytes
    CHECK(meter.current_bytes() == 100000);
    CHECK(meter.peak_bytes() == 100000);
    const auto u = torch::empty({300}, torch::kDouble);  // 2,400 bytes
    CHECK(meter.current_bytes() == 102400);
  }
  CHECK(meter.current_bytes() == 0);
  CHECK(meter.peak_bytes() == 102400);  // the peak remembers
  meter.reset();
  CHECK(meter.peak_bytes() == 0);
}

TEST_CASE("the CPU meter sees the activations autograd keeps for backward") {
  const auto w = torch::randn({256, 256}, torch::requires_grad());
  const auto x = torch::randn({64, 256});
  workshop::MemoryMeter meter(torch::kCPU);
  int64_t kept = 0;
  {
    const auto h = torch::relu(torch::mm(x, w));  // relu keeps its output [64, 256] float32 for backward
    kept = meter.current_bytes();
  }
  CHECK(kept >= 64 * 256 * 4);
  CHECK(meter.current_bytes() == 0);
}

TEST_CASE("a this-thread meter counts this thread's allocations, wherever they are freed") {
  workshop::MemoryMeter mine(torch::kCPU, workshop::MeterScope::kThisThread);
  workshop::MemoryMeter all(torch::kCPU);
  torch::Tensor handed_over = torch::empty({250}, torch::kFloat);  // 1,000 bytes, allocated here
  std::thread other([&] {
    const auto theirs = torch::empty({500}, torch::kFloat);  // 2,000 bytes on the other thread, freed there
    CHECK(all.current_bytes() == 3000);
    handed_over = torch::Tensor();  // freed on the other thread: still this thread's allocation
  });
  other.join();
  CHECK(mine.current_bytes() == 0);
  CHECK(mine.peak_bytes() == 1000);  // the other thread's 2,000 bytes never count here
  CHECK(all.peak_bytes() == 3000);
  CHECK(all.current_bytes() == 0);
}

TEST_CASE("the meter rejects devices it cannot measure") {
  CHECK_THROWS_WITH_AS(workshop::MemoryMeter(torch::Device(torch::kMeta)), doctest::Contains("CPU and CUDA"),
                       c10::Error);
}

GPU_TEST_CASE("the CUDA meter counts a known allocation exactly") {
  workshop::MemoryMeter meter(torch::Device(torch::kCUDA, 0));
  {
    const auto t = torch::empty({1024, 1024}, torch::dtype(torch::kFloat).device(torch::kCUDA));  // 4 MiB
    CHECK(meter.current_bytes() == 4 * 1024 * 1024);
  }
  CHECK(meter.current_bytes() == 0);
  CHECK(meter.peak_bytes() == 4 * 1024 * 1024);
}

TEST_CASE("cpu_bytes_kept_by counts what the function keeps, not an older tensor another thread frees meanwhile") {
  auto older = std::make_shared<torch::Tensor>(torch::empty({16}, torch::kFloat));  // 64 bytes, this thread's
  torch::Tensor kept;
  // Inside: keep 400 bytes and free a tensor this (another) thread allocated before, as Gloo's worker threads
  // drop a rank's buffers at times of their own. A meter of this thread would read 400 - 64.
  workshop::MemoryMeter this_thread(torch::kCPU, workshop::MeterScope::kThisThread);
  const int64_t bytes = workshop::cpu_bytes_kept_by([&] {
    kept = torch::empty({100}, torch::kFloat);
    older.reset();
  });
  CHECK(bytes == 400);
  CHECK(this_thread.current_bytes() == -64);  // the free landed on the thread that allocated it
  CHECK_THROWS_AS(workshop::cpu_bytes_kept_by([] { TORCH_CHECK(false, "inside"); }), c10::Error);
}
