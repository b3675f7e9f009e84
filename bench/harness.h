// The bench's shared harness: the rows every case adds, the ceilings measured beside them, the rounds that
// interleave ours and PyTorch's, and the report (console tables, CSV, Markdown). The cases themselves live one
// file per lesson (solutions/lessonN_*/bench_case.cc) and bench/scaler.cc, and register themselves (registry.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "bench/peer_runner.h"
#include "common/device.h"

namespace bench {

/// One line of the main table: a variant of one lesson's claim.
struct Row {
  std::string bench;    ///< which lesson's claim
  std::string variant;  ///< baseline or improvement
  workshop::Timing timing;
  double flops = 0;         ///< per repetition
  double bytes = 0;         ///< moved per repetition (napkin), or peak bytes for memory cases
  std::string ceiling_key;  ///< the Ceilings entry this row is held against ("" if none)
  double ratio = 0;         ///< baseline median / this median (speed-up)
  std::string note;
  std::string key;             ///< the PyTorch peer's row for the same workload ("" if it has none)
  int64_t same_way_peak = -1;  ///< peak bytes measured as the peer measures its own (-1: not measured)
};

/// A line of a case's own table (a Section), e.g. one implementation of a cost measured apart from the steps.
/// Like Row, summarised over the rounds by the harness (the median of the rounds' medians).
struct SideRow {
  std::string name;
  workshop::Timing timing{};
  std::string unavailable;  ///< non-empty: not run here, and why
  std::string note;
  std::string group;        ///< which case's table it belongs to
  std::string ceiling_key;  ///< the Ceilings entry its napkin bytes are held against ("" if none)
};

/// A case's own table, printed and written after the main ones: its name (the console's heading), a title (the
/// Markdown's), the text before it (e.g. its napkin math), its columns and rows, and its lines of the bench CSV
/// (benchmark .. note; the harness adds the run's columns: device, versions, threads, date, command).
struct Section {
  Section(std::string name_, std::string title_, std::string text_, std::vector<std::string> columns_)
      : name(std::move(name_)), title(std::move(title_)), text(std::move(text_)), columns(std::move(columns_)) {}
  std::string name, title, text;
  std::vector<std::string> columns;
  std::vector<std::vector<std::string>> rows;
  std::vector<std::vector<std::string>> csv;
};

/// A ceiling a case measures itself (e.g. a collective over loopback), listed in the ceilings table as is.
struct CeilingRow {
  std::string name;
  double per_second = 0;  ///< in `unit` x 1e9
  std::string unit;       ///< "GB/s" or "GFLOP/s"
  std::string measurements;
};

/// A flag of one case, declared at namespace scope in the case's file (the harness knows no case's flags): the
/// harness lists it in --help, runs `check` on a given value before any case runs (TORCH_CHECK for a bad one),
/// and gives the value to the case through Context::flag.
class CaseFlag {
 public:
  CaseFlag(std::string name, std::string help, std::function<void(const std::string&)> check = nullptr);
  struct Declared {
    std::string name, help;
    std::function<void(const std::string&)> check;
  };
  /// Every case flag of this binary, in declaration order.
  static const std::vector<Declared>& all();

 private:
  static std::vector<Declared>& registry();
};

/// Ceilings: the best rate a workload's kernels reach on this device, measured the way the workload runs (same
/// thread count, same shapes, same dtype), each time a case runs (so, interleaved with the cases and across
/// rounds), keeping the BEST over the run. A ceiling is a best case: its best repetition counts, not a median.
class Ceilings {
 public:
  /// Measures a matmul [m, k] x [k, n] in `dtype` now (tf32: CUDA's TF32 matmuls) and returns its key; the
  /// entry keeps the highest FLOP/s seen so far.
  std::string matmul(c10::Device device, c10::ScalarType dtype, bool tf32, int64_t m, int64_t k, int64_t n,
                     int repeats);
  /// Measures a copy of `floats` float32 elements (one read and one write each) now and returns its key.
  std::string copy(c10::Device device, int64_t floats, int repeats);
  /// Measures reading and writing back the same `floats` float32 elements (x.mul_(1)) now and returns its key: the
  /// pattern of an in-place update (a copy also reads its destination into the cache before writing it, a cost
  /// the napkin's 8 bytes per element do not count and an in-place update does not pay).
  std::string in_place(c10::Device device, int64_t floats, int repeats);
  /// Measures `key` once more (its best may rise). Unknown keys are an error.
  void remeasure(const std::string& key);

  double best(const std::string& key) const;       ///< FLOP/s or B/s; 0 for an unknown key
  std::string name(const std::string& key) const;  ///< e.g. "fp32 matmul 512x1024x1024"
  std::string unit(const std::string& key) const;  ///< "GFLOP/s" or "GB/s"
  int measurements(const std::string& key) const;
  const std::vector<std::string>& keys() const { return order_; }  ///< in first-measured order

 private:
  struct Entry {
    std::string name, unit;
    double best = 0;
    int measurements = 0;
    std::function<double()> measure;  ///< one measurement: the best repetition's rate
  };
  std::string add(const std::string& key, Entry entry);
  std::map<std::string, Entry> entries_;
  std::vector<std::string> order_;
};

/// What every case reads and adds to.
struct Context {
  c10::Device device{c10::kCPU};
  bool quick = false;
  std::map<std::string, std::string> flags;  ///< the case flags given (CaseFlag), by name
  std::vector<Row> rows;
  std::vector<SideRow> side_rows;
  Ceilings ceilings;
  std::vector<CeilingRow> ceiling_rows;  ///< ceilings the cases measured themselves
  std::vector<Section> sections;         ///< the cases' own tables, after the main ones
  std::unique_ptr<Peer> peer;
  std::vector<std::string> notes;  ///< what differs between ours and PyTorch's, in structure (for the report)

  /// A case flag's value (CaseFlag), or `fallback` where it was not given.
  std::string flag(const std::string& name, const std::string& fallback) const;
};

/// One benchmark case: a lesson's claim, run by name (--cases=NAME,...).
struct Case {
  std::string name;                    ///< e.g. "l1"
  void (*run)(Context&);               ///< adds the case's rows (and runs its peer), once per round
  bool once = false;                   ///< true: run once whatever --rounds (e.g. it relaunches processes)
  void (*finish)(Context&) = nullptr;  ///< after all rounds (e.g. take the peer's summary over the rounds)
  /// A case whose workers are processes of this binary: returns their exit code when argv is a worker's, -1
  /// otherwise. The harness asks every case before anything else.
  int (*as_subprocess)(int argc, char** argv) = nullptr;
};

/// The bench's whole main: flags, ceilings, the cases in table order, the report. Returns the exit code.
int run_bench(int argc, char** argv, const std::vector<Case>& cases);

// ---- small helpers the cases share ------------------------------------------------------------------------

/// CUDA's TF32 matmuls on or off (present in LibTorch 1.13 and 2.x; only CUDA matmuls read it).
void set_tf32(bool on);
/// Whether this LibTorch runs float16 autocast on `device` (CUDA always; CPU from 2.3, see compat.h).
bool fp16_autocast(c10::Device device);
std::string join(const std::vector<std::string>& parts, const std::string& separator);

}  // namespace bench
