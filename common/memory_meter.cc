#include "common/memory_meter.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include "common/compat/compat.h"

#if WORKSHOP_HAS_CUDA
#include "common/cuda_memory.h"
#endif

namespace workshop {
namespace {

// Bytes still allocated and their peak: the whole process's (in the allocator) and each thread's. A thread's count
// is shared by the thread and by the table entries of its allocations, so that a free on another thread still
// lands on the thread that allocated.
struct ByteCount {
  std::atomic<int64_t> current{0};
  std::atomic<int64_t> peak{0};

  void add(int64_t bytes) {
    const int64_t now = current.fetch_add(bytes) + bytes;
    int64_t seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
  }
};

const std::shared_ptr<ByteCount>& this_thread_count() {
  thread_local const std::shared_ptr<ByteCount> count = std::make_shared<ByteCount>();
  return count;
}

// Wraps the CPU allocator LibTorch had before and counts bytes in and out. Installed once, never removed:
// tensors it allocated may outlive any meter. LibTorch's raw_allocate() requires data == context, so the
// allocation's bookkeeping lives in a table keyed by the data pointer rather than in the context.
class CountingCpuAllocator final : public compat::WrappingAllocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* inner) : inner_(inner) {}

  int64_t current() const { return process_.current.load(); }
  int64_t peak() const { return process_.peak.load(); }
  void reset_peak() { process_.peak.store(process_.current.load()); }

  c10::DeleterFnPtr raw_deleter() const override { return &CountingCpuAllocator::release; }

 protected:
  c10::DataPtr allocate_impl(size_t nbytes) const override {
    c10::DataPtr inner = inner_->allocate(nbytes);
    void* data = inner.get();
    const c10::Device device = inner.device();
    if (data == nullptr) return inner;  // zero bytes: nothing to count
    {
      std::lock_guard<std::mutex> lock(mutex());
      table().emplace(data, Entry{std::move(inner), static_cast<int64_t>(nbytes), this_thread_count()});
    }
    process_.add(static_cast<int64_t>(nbytes));
    this_thread_count()->add(static_cast<int64_t>(nbytes));
    return c10::DataPtr(data, data, &CountingCpuAllocator::release, device);
  }

 private:
  struct Entry {
    c10::DataPtr inner;  // frees the memory when the entry is destroyed
    int64_t bytes;
    std::shared_ptr<ByteCount> owner;  // the allocating thread's count
  };

  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::unordered_map<void*, Entry>& table() {
    static auto* t = new std::unordered_map<void*, Entry>();  // never destroyed: frees may come at exit
    return *t;
  }
  static CountingCpuAllocator*& instance() {
    static CountingCpuAllocator* self = nullptr;
    return self;
  }

  static void release(void* data) {
    Entry entry;
    {
      std::lock_guard<std::mutex> lock(mutex());
      auto it = table().find(data);
      if (it == table().end()) return;
      entry = std::move(it->second);
      table().erase(it);
    }
    instance()->process_.current.fetch_sub(entry.bytes);
    entry.owner->current.fetch_sub(entry.bytes);
    // entry.inner frees the memory here, outside the lock
  }

  friend CountingCpuAllocator& counting_cpu_allocator();

  c10::Allocator* inner_;
  mutable ByteCount process_;
};

CountingCpuAllocator& counting_cpu_allocator() {
  static CountingCpuAllocator* allocator = [] {
    auto* counting = new CountingCpuAllocator(c10::GetCPUAllocator());
    CountingCpuAllocator::instance() = counting;
    c10::SetCPUAllocator(counting, /*priority=*/100);
    TORCH_CHECK(c10::GetCPUAllocator() == counting,
                "MemoryMeter: could not install the counting CPU allocator (another allocator has priority)");
    return counting;
  }();
  return *allocator;
}

void check_device(c10::Device device) {
  TORCH_CHECK(device.is_cpu() || device.is_cuda(), "MemoryMeter: only CPU and CUDA are supported, got ", device);
#if !WORKSHOP_HAS_CUDA
  TORCH_CHECK(device.is_cpu(), "MemoryMeter: this LibTorch was built without CUDA, cannot measure ", device);
#endif
}

}  // namespace

int64_t cpu_allocated_bytes() { return counting_cpu_allocator().current(); }

int64_t cpu_bytes_kept_by(const std::function<void()>& fn) {
  int64_t kept = 0;
  std::exception_ptr error;
  std::thread worker([&] {
    try {
      MemoryMeter meter(c10::Device(c10::kCPU), MeterScope::kThisThread);
      fn();
      kept = meter.current_bytes();
    } catch (...) {
      error = std::current_exception();  // an exception must not leave a thread: it would end the program
    }
  });
  worker.join();
  if (error) std::rethrow_exception(error);
  return kept;
}

MemoryMeter::MemoryMeter(c10::Device device, MeterScope scope) : device_(device), scope_(scope) {
  check_device(device);
  TORCH_CHECK(scope == MeterScope::kProcess || device.is_cpu(),
              "MemoryMeter: MeterScope::kThisThread counts CPU allocations only, got ", device);
  if (device.is_cpu()) counting_cpu_allocator();
  reset();
}

void MemoryMeter::reset() {
  if (scope_ == MeterScope::kThisThread) {
    ByteCount& count = *this_thread_count();
    count.peak.store(count.current.load());
    baseline_ = count.current.load();
  } else if (device_.is_cpu()) {
    counting_cpu_allocator().reset_peak();
    baseline_ = counting_cpu_allocator().current();
  } else {
#if WORKSHOP_HAS_CUDA
    baseline_ = cuda_memory::reset_peak_and_get_current(device_.index());
#endif
  }
}

int64_t MemoryMeter::current_bytes() const {
  if (scope_ == MeterScope::kThisThread) return this_thread_count()->current.load() - baseline_;
  if (device_.is_cpu()) return counting_cpu_allocator().current() - baseline_;
#if WORKSHOP_HAS_CUDA
  return cuda_memory::allocated_bytes(device_.index()).current - baseline_;
#else
  return 0;
#endif
}

int64_t MemoryMeter::peak_bytes() const {
  if (scope_ == MeterScope::kThisThread) return this_thread_count()->peak.load() - baseline_;
  if (device_.is_cpu()) return counting_cpu_allocator().peak() - baseline_;
#if WORKSHOP_HAS_CUDA
  return cuda_memory::allocated_bytes(device_.index()).peak - baseline_;
#else
  return 0;
#endif
}

}  // namespace workshop
