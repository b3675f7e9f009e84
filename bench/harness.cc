// The bench's shared harness (see harness.h): ceilings, rounds, and the report.
#include "bench/harness.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "common/compat/compat.h"
#include "common/report.h"

namespace bench {

using workshop::fixed;

// ---- helpers ------------------------------------------------------------------------------------------------

void set_tf32(bool on) { at::globalContext().setAllowTF32CuBLAS(on); }

bool fp16_autocast(c10::Device device) {
  return device.is_cuda() || workshop::compat::cpu_autocast_supports(torch::kHalf);
}

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : separator) + p;
  return out;
}

// ---- ceilings -----------------------------------------------------------------------------------------------

namespace {

std::string dtype_name(c10::ScalarType dtype, bool tf32) {
  if (tf32) return "tf32";
  switch (dtype) {
    case torch::kFloat:
      return "fp32";
    case torch::kBFloat16:
      return "bf16";
    case torch::kHalf:
      return "fp16";
    default:
      return c10::toString(dtype);
  }
}

}  // namespace

std::string Ceilings::add(const std::string& key, Entry entry) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    it = entries_.emplace(key, std::move(entry)).first;
    order_.push_back(key);
  }
  remeasure(key);
  return key;
}

std::string Ceilings::matmul(c10::Device device, c10::ScalarType dtype, bool tf32, int64_t m, int64_t k, int64_t n,
                             int repeats) {
  const std::string name =
      dtype_name(dtype, tf32) + " matmul " + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
  Entry entry{name, "GFLOP/s", 0, 0, [=] {
                set_tf32(tf32);
                const auto a = torch::randn({m, k}, torch::dtype(dtype).device(device));
                const auto b = torch::randn({k, n}, torch::dtype(dtype).device(device));
                auto out = torch::empty({m, n}, torch::dtype(dtype).device(device));
                const auto t = workshop::time_repeated(
                    device, [&] { torch::mm_out(out, a, b); }, 2, repeats);
                set_tf32(false);
                return 2.0 * m * k * n / (t.min_ms * 1e-3);
              }};
  return add(name, std::move(entry));
}

std::string Ceilings::copy(c10::Device device, int64_t floats, int repeats) {
  const std::string name = "memory copy (read+write) " + workshop::mib(4.0 * floats);
  Entry entry{name, "GB/s", 0, 0, [=] {
                const auto src = torch::randn({floats}, device);
                auto dst = torch::empty({floats}, device);
                const auto t = workshop::time_repeated(
                    device, [&] { dst.copy_(src); }, 2, repeats);
                return 2.0 * 4.0 * floats / (t.min_ms * 1e-3);  // read + write
              }};
  return add(name, std::move(entry));
}

std::string Ceilings::in_place(c10::Device device, int64_t floats, int repeats) {
  const std::string name = "memory in place (read+write) " + workshop::mib(4.0 * floats);
  Entry entry{name, "GB/s", 0, 0, [=] {
                auto x = torch::rand({floats}, device);
                const auto t = workshop::time_repeated(
                    device, [&] { x.mul_(1.0); }, 2, repeats);
                return 2.0 * 4.0 * floats / (t.min_ms * 1e-3);  // read + write of the same bytes
              }};
  return add(name, std::move(entry));
}

void Ceilings::remeasure(const std::string& key) {
  const auto it = entries_.find(key);
  TORCH_CHECK(it != entries_.end(), "Ceilings::remeasure: no ceiling named '", key, "'");
  it->second.best = std::max(it->second.best, it->second.measure());
  ++it->second.measurements;
}

double Ceilings::best(const std::string& key) const {
  const auto it = entries_.find(key);
  return it == entries_.end() ? 0 : it->second.best;
}

std::string Ceilings::name(const std::string& key) const {
  const auto it = entries_.find(key);
  return it == entries_.end() ? "" : it->second.name;
}

std::string Ceilings::unit(const std::string& key) const {
  const auto it = entries_.find(key);
  return it == entries_.end() ? "" : it->second.unit;
}

int Ceilings::measurements(const std::string& key) const {
  const auto it = entries_.find(key);
  return it == entries_.end() ? 0 : it->second.measurements;
}

// ---- the report's helpers -------------------------------------------------------------------------------------

namespace {

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  return buf;
}

// "1.12x (ours 12% slower)" / "0.80x (ours 20% faster)" for ours / theirs of a time; "less"/"more" for bytes.
std::string versus(double ours, double theirs, bool time) {
  if (ours <= 0 || theirs <= 0) return "-";
  const double r = ours / theirs;
  const double pct = std::abs(r - 1.0) * 100.0;
  std::string word = time ? (r > 1 ? "slower" : "faster") : (r > 1 ? "more" : "less");
  if (pct < 0.5) return fixed(r, 2) + "x (same)";
  return fixed(r, 2) + "x (ours " + fixed(pct, 0) + "% " + word + ")";
}

// The 1-minute load average ("" where /proc/loadavg is not readable): on a shared machine, how much else ran.
std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string first;
  return in >> first ? first : std::string();
}

// Whether a time difference is resolved by this run: the medians and the fastest steps must both put one side
// ahead by more than 10% (where only medians exist, lesson 4: the two sides' min..max ranges must not overlap).
// Anything else is "within noise": on a shared machine a bare median ratio is not evidence.
std::string time_verdict(const workshop::Timing& ours, const PeerRow& theirs) {
  const double median = ours.median_ms / theirs.median_ms;
  if (ours.samples_ms.empty()) {
    if (ours.min_ms > theirs.max_ms) return "ours slower";
    if (ours.max_ms < theirs.min_ms) return "ours faster";
    return "within noise";
  }
  const double fastest = ours.min_ms / theirs.min_ms;
  if (median > 1.1 && fastest > 1.1) return "ours slower";
  if (median < 1 / 1.1 && fastest < 1 / 1.1) return "ours faster";
  return "within noise";
}

std::string peak_cell(int64_t bytes) { return bytes < 0 ? "-" : workshop::mib(static_cast<double>(bytes)); }

double median_of(std::vector<double> v) { return workshop::median(std::move(v)); }

// Each case runs `rounds` times, ours and then PyTorch's each round, so that on a shared machine both sides
// meet the same spells of other work; a row's time is the median of its rounds' medians.
void run_rounds(Context& c, const Case& bench_case, int rounds) {
  const size_t begin = c.rows.size(), scaler_begin = c.scaler_rows.size();
  std::vector<std::vector<double>> medians, scaler_medians;
  for (int round = 0; round < rounds; ++round) {
    if (rounds > 1) std::cout << "round " << round + 1 << " of " << rounds << std::endl;
    const size_t here = c.rows.size(), scaler_here = c.scaler_rows.size();
    bench_case.run(c);
    medians.resize(c.rows.size() - here);
    scaler_medians.resize(c.scaler_rows.size() - scaler_here);
    for (size_t i = here; i < c.rows.size(); ++i) {
      Row& first = c.rows[begin + (i - here)];
      medians[i - here].push_back(c.rows[i].timing.median_ms);
      first.timing.min_ms = std::min(first.timing.min_ms, c.rows[i].timing.min_ms);
      first.timing.max_ms = std::max(first.timing.max_ms, c.rows[i].timing.max_ms);
    }
    for (size_t i = scaler_here; i < c.scaler_rows.size(); ++i) {
      ScalerRow& first = c.scaler_rows[scaler_begin + (i - scaler_here)];
      scaler_medians[i - scaler_here].push_back(c.scaler_rows[i].timing.median_ms);
      first.timing.min_ms = std::min(first.timing.min_ms, c.scaler_rows[i].timing.min_ms);
      first.timing.max_ms = std::max(first.timing.max_ms, c.scaler_rows[i].timing.max_ms);
    }
    if (round > 0) {
      c.rows.erase(c.rows.begin() + static_cast<std::ptrdiff_t>(here), c.rows.end());
      c.scaler_rows.erase(c.scaler_rows.begin() + static_cast<std::ptrdiff_t>(scaler_here), c.scaler_rows.end());
    }
  }
  for (size_t i = 0; i < medians.size(); ++i) c.rows[begin + i].timing.median_ms = median_of(medians[i]);
  for (size_t i = 0; i < scaler_medians.size(); ++i) {
    c.scaler_rows[scaler_begin + i].timing.median_ms = median_of(scaler_medians[i]);
  }
  // Speed-ups against the first row of the same benchmark, from the summarised medians.
  for (size_t i = begin; i < c.rows.size(); ++i) {
    size_t base = begin;
    while (c.rows[base].bench != c.rows[i].bench) ++base;
    c.rows[i].ratio = c.rows[base].timing.median_ms / c.rows[i].timing.median_ms;
  }
  if (bench_case.finish != nullptr) bench_case.finish(c);
}

// A row's achieved rate against its ceiling. The ceiling is the best of every measurement in the run, so a
// fraction above 100% means the ceiling was measured in a worse moment than the row: it is measured again (up
// to kRemeasures times); if the row still beats it, the cell says "suspect" instead of a number above 100%.
constexpr int kRemeasures = 3;

struct Fraction {
  std::string cell;  // "87.3%" or "suspect"
  bool suspect = false;
};

// A row's rate in its ceiling's unit: bytes per second against a copy ceiling (the row's napkin bytes), FLOP per
// second against a matmul's.
bool counts_bytes(const Ceilings& ceilings, const Row& r) {
  return !r.ceiling_key.empty() && ceilings.unit(r.ceiling_key) == "GB/s";
}

double rate_of(const Ceilings& ceilings, const Row& r) {
  return (counts_bytes(ceilings, r) ? r.bytes : r.flops) / (r.timing.median_ms * 1e-3);
}

Fraction of_ceiling(Ceilings& ceilings, const Row& r) {
  const double achieved = rate_of(ceilings, r);
  if (r.ceiling_key.empty() || achieved <= 0) return {"-", false};
  for (int i = 0; i < kRemeasures && achieved > ceilings.best(r.ceiling_key); ++i) ceilings.remeasure(r.ceiling_key);
  if (achieved > ceilings.best(r.ceiling_key)) return {"suspect", true};
  return {fixed(100.0 * achieved / ceilings.best(r.ceiling_key), 1) + "%", false};
}

}  // namespace

// ---- main -----------------------------------------------------------------------------------------------------

int run_bench(int argc, char** argv, const std::vector<Case>& cases) {
  for (const Case& bench_case : cases) {
    if (bench_case.as_subprocess == nullptr) continue;
    const int exit_code = bench_case.as_subprocess(argc, argv);  // e.g. lesson 5's ranks: copies of this binary
    if (exit_code >= 0) return exit_code;
  }
  std::vector<std::string> names;
  for (const Case& bench_case : cases) names.push_back(bench_case.name);
  try {
    workshop::Flags flags(argc, argv,
                          {{"device", "best (default), cpu, cuda"},
                           {"quick", "small sizes (a smoke run)"},
                           {"cases", "comma-separated: " + join(names, ",") + " (default all)"},
                           {"world_sizes", "lesson 5 ranks, comma-separated (default 2,4; --quick: 2)"},
                           {"out_dir", "write bench_<device>.csv and .md there"},
                           {"threads", "ATen intra-op threads, ours and the peer's (default: LibTorch's)"},
                           {"peer", "on (default): run PyTorch's implementations beside ours; off"},
                           {"rounds",
                            "run each case (ours, then PyTorch's) this many times; medians of "
                            "the rounds' medians (default 1)"},
                           {"peer_python",
                            "the peer's interpreter (default $WORKSHOP_PEER_PYTHON, "
                            "else /usr/bin/python3)"},
                           {"peer_script", "bench/peer.py (default: from the runfiles)"}});
    Context c;
    c.device = workshop::parse_device(flags.get("device", "best"));
    c.quick = flags.has("quick");
    std::vector<std::string> chosen;
    {
      std::stringstream list(flags.get("cases", join(names, ",")));
      for (std::string item; std::getline(list, item, ',');) {
        if (item.empty()) continue;
        TORCH_CHECK(std::find(names.begin(), names.end(), item) != names.end(), "--cases: unknown case '", item,
                    "' (known: ", join(names, ","), ")");
        chosen.push_back(item);
      }
    }
    {
      std::stringstream list(flags.get("world_sizes", c.quick ? "2" : "2,4"));
      for (std::string item; std::getline(list, item, ',');) {
        const int n = std::atoi(item.c_str());
        TORCH_CHECK(n >= 1, "--world_sizes: '", item, "' is not a number of ranks >= 1");
        c.world_sizes.push_back(n);
      }
    }
    const std::string peer_flag = flags.get("peer", "on");
    TORCH_CHECK(peer_flag == "on" || peer_flag == "off", "--peer must be on or off, got '", peer_flag, "'");
    const int rounds = static_cast<int>(flags.get_int("rounds", 1));
    TORCH_CHECK(rounds >= 1, "--rounds must be >= 1, got ", rounds);
    if (flags.has("threads")) {
      const int64_t threads = flags.get_int("threads", 0);
      TORCH_CHECK(threads >= 1, "--threads must be >= 1, got ", threads);
      at::set_num_threads(static_cast<int>(threads));
    }
    PeerOptions peer_options;
    peer_options.enabled = peer_flag == "on";
    peer_options.python = default_peer_python(flags.get("peer_python", ""));
    peer_options.script = find_peer_script(argv[0], flags.get("peer_script", ""));
    peer_options.device = c.device;
    peer_options.threads = at::get_num_threads();
    c.peer = std::make_unique<Peer>(peer_options);

    std::string command = "bazel run //bench --";
    for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
    const std::string name = workshop::device_name(c.device);
    std::cout << "benchmarks on " << c.device << " (" << name << "), LibTorch " << TORCH_VERSION << ", "
              << at::get_num_threads() << " ATen thread(s)\n";
    if (!c.peer->missing().empty()) {
      std::cout << "PyTorch peer: NOT RUN: " << c.peer->missing() << " Our rows only.\n";
    }

    const std::string load_start = load_average();
    double highest_load = load_start.empty() ? 0 : std::stod(load_start);
    for (const Case& bench_case : cases) {
      if (std::find(chosen.begin(), chosen.end(), bench_case.name) == chosen.end()) continue;
      run_rounds(c, bench_case, bench_case.once ? 1 : rounds);
      const std::string load_now = load_average();
      if (!load_now.empty()) highest_load = std::max(highest_load, std::stod(load_now));
    }

    const Peer& peer = *c.peer;
    {
      std::vector<std::string> unique;
      for (const auto& note : c.notes) {
        if (std::find(unique.begin(), unique.end(), note) == unique.end()) unique.push_back(note);
      }
      c.notes = unique;
    }
    // The fractions of ceiling first: a row that beats its ceiling has the ceiling measured again.
    std::vector<Fraction> fractions;
    int suspects = 0;
    for (const auto& r : c.rows) {
      fractions.push_back(of_ceiling(c.ceilings, r));
      suspects += fractions.back().suspect ? 1 : 0;
    }
    c.notes.push_back(
        "Ceilings are measured the way the rows run (same process and thread count, the same matmul "
        "shape and dtype as the row's largest layer, a copy of as many bytes as the scaler's gradients, and "
        "for lesson 6 an in-place read and write of as many bytes as its fused step moves: a copy also reads "
        "its destination, which the napkin does not count), "
        "each time a case runs, and the best repetition of all those measurements is kept: a best "
        "case. A row's rate is its median step's. A row faster than its ceiling gets the ceiling "
        "measured again (up to " +
        std::to_string(kRemeasures) +
        " times); if it still is, the cell "
        "reads \"suspect\" (" +
        std::to_string(suspects) +
        " in this run): the row's FLOP count (lesson 6: its napkin bytes, which over-count when the "
        "tensors fit in a cache) or "
        "the ceiling's shape does not describe the work.");
    const std::string load_end = load_average();
    const std::string load = load_start.empty()
                                 ? "unknown"
                                 : load_start + " at the start, " + load_end + " at the end, " +
                                       fixed(highest_load, 2) + " at the highest between cases (" +
                                       std::to_string(std::thread::hardware_concurrency()) + " hardware threads)";
    if (!load_start.empty() && highest_load > static_cast<double>(std::thread::hardware_concurrency())) {
      c.notes.push_back("The machine was shared: a 1-minute load average up to " + fixed(highest_load, 2) + " on " +
                        std::to_string(std::thread::hardware_concurrency()) +
                        " hardware threads means other jobs ran during the measurements, so times move from run to "
                        "run (see the verdict column). Peak bytes do not depend on load.");
    }
    const std::string peer_state =
        peer.available() ? "PyTorch " + peer.torch_version() + " (" + peer.info().at("python") + ", " +
                               peer.info().at("threads") + " thread(s))"
                         : "PyTorch peer NOT RUN: " + (peer.missing().empty() ? peer.failure() : peer.missing());
    if (peer.available()) {
      const std::string libtorch = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR);
      if (peer.torch_version().rfind(libtorch + ".", 0) != 0) {
        c.notes.push_back("Versions differ: LibTorch " + std::string(TORCH_VERSION) + " against PyTorch " +
                          peer.torch_version() + "; the kernels under the two sides are not the same build.");
      } else {
        c.notes.push_back("Both sides run LibTorch " + libtorch + "'s kernels (PyTorch " + peer.torch_version() +
                          " wraps the same C++ library): what differs is the code around them, ours in C++, "
                          "PyTorch's in Python.");
      }
    }

    // rate: GFLOP/s of the row's FLOP count, or GB/s of its napkin bytes where its ceiling is a memory copy.
    workshop::Table table("bench", {"benchmark", "variant", "median ms", "min..max ms", "rate", "ceiling", "of ceiling",
                                    "speed-up", "note"});
    for (size_t i = 0; i < c.rows.size(); ++i) {
      const Row& r = c.rows[i];
      const bool has_ceiling = !r.ceiling_key.empty();
      table.add({r.bench, r.variant, fixed(r.timing.median_ms, 2),
                 fixed(r.timing.min_ms, 2) + ".." + fixed(r.timing.max_ms, 2),
                 fixed(rate_of(c.ceilings, r) / 1e9, 1) + (counts_bytes(c.ceilings, r) ? " GB/s" : " GFLOP/s"),
                 has_ceiling
                     ? fixed(c.ceilings.best(r.ceiling_key) / 1e9, 1) + " (" + c.ceilings.name(r.ceiling_key) + ")"
                     : "-",
                 fractions[i].cell, fixed(r.ratio, 2) + "x", r.note});
    }
    // Ours and PyTorch's, one line per workload.
    workshop::Table versus_table("bench_vs_pytorch",
                                 {"benchmark", "variant", "ours ms", "PyTorch ms", "time ours/PyTorch",
                                  "fastest ours/PyTorch", "time verdict", "ours peak", "PyTorch peak",
                                  "peak ours/PyTorch", "PyTorch code"});
    for (const auto& r : c.rows) {
      if (r.key.empty()) continue;
      const PeerRow* p = peer.find(r.key);
      std::string theirs_ms = "-", time_ratio = "-", min_ratio = "-", verdict = "-", theirs_peak = "-",
                  peak_ratio = "-", what;
      if (!peer.available() && p == nullptr) {
        what = "not run (" + (peer.missing().empty() ? std::string("peer failed") : std::string("peer not installed")) +
               ")";
      } else if (p == nullptr) {
        what = "no row from the peer";
      } else if (!p->unavailable.empty()) {
        what = p->unavailable;
      } else {
        theirs_ms = fixed(p->median_ms, 2);
        time_ratio = versus(r.timing.median_ms, p->median_ms, true);
        // Lesson 4's and lesson 5's rows keep only medians and ranges, no samples.
        if (!r.timing.samples_ms.empty()) min_ratio = fixed(r.timing.min_ms / p->min_ms, 2) + "x";
        verdict = time_verdict(r.timing, *p);
        theirs_peak = peak_cell(p->peak_bytes);
        if (r.same_way_peak >= 0 && p->peak_bytes >= 0) {
          peak_ratio = versus(static_cast<double>(r.same_way_peak), static_cast<double>(p->peak_bytes), false);
        }
        what = p->what;
      }
      versus_table.add({r.bench, r.variant, fixed(r.timing.median_ms, 2), theirs_ms, time_ratio, min_ratio, verdict,
                        peak_cell(r.same_way_peak), theirs_peak, peak_ratio, what});
    }
    // The scaler alone, with its napkin math: the least a pass over the gradients moves is one read and one
    // write of each (8 bytes per float32 element); at the copy ceiling that takes min_ms.
    const double copy_ceiling = c.ceilings.best(c.scaler_copy_ceiling);
    const double min_bytes = 8.0 * static_cast<double>(c.scaler_elements);
    const double min_ms = copy_ceiling > 0 ? 1e3 * min_bytes / copy_ceiling : 0;
    workshop::Table scaler_table("bench_scaler", {"implementation", "median ms", "min..max ms", "vs ours plain",
                                                  "GB/s (8 B/element)", "of copy ceiling", "note"});
    double plain_ms = 0;
    for (const auto& s : c.scaler_rows) {
      if (!s.unavailable.empty()) {
        scaler_table.add({s.name, "-", "-", "-", "-", "-", s.unavailable});
        continue;
      }
      if (plain_ms == 0) plain_ms = s.timing.median_ms;
      const double rate = min_bytes / (s.timing.median_ms * 1e-3);
      std::string fraction = copy_ceiling > 0 ? fixed(100.0 * rate / copy_ceiling, 1) + "%" : "-";
      if (copy_ceiling > 0 && rate > copy_ceiling) fraction = "suspect";
      scaler_table.add({s.name, fixed(s.timing.median_ms, 3),
                        fixed(s.timing.min_ms, 3) + ".." + fixed(s.timing.max_ms, 3),
                        fixed(plain_ms / s.timing.median_ms, 2) + "x", fixed(rate / 1e9, 1), fraction, s.note});
    }
    const std::string scaler_napkin =
        "GradScaler cost per step (scale + unscale_ + step with a no-op optimizer + update), " +
        std::to_string(c.scaler_tensors) + " float32 gradient tensors, " + fixed(c.scaler_elements / 1e6, 2) +
        " M elements (" + workshop::mib(4.0 * c.scaler_elements) +
        "). Napkin math: one pass reads and writes each "
        "gradient once, " +
        workshop::mib(min_bytes) + " per step; at the measured copy ceiling (" + fixed(copy_ceiling / 1e9, 1) +
        " GB/s) that is " + fixed(min_ms, 3) +
        " ms, the floor. The plain path "
        "makes three passes (`isfinite` reads 4 B and writes 1 B per element, `all` reads 1 B, `mul_` reads and "
        "writes 8 B: about 14 B per element) and launches 5 ops per gradient where the fused path launches one "
        "kernel for all of them.";

    workshop::Table ceilings("bench_ceilings", {"ceiling", "measured", "unit", "measurements"});
    for (const std::string& key : c.ceilings.keys()) {
      ceilings.add({c.ceilings.name(key), fixed(c.ceilings.best(key) / 1e9, 1), c.ceilings.unit(key),
                    std::to_string(c.ceilings.measurements(key))});
    }
    for (const auto& [n, bytes_per_s] : c.loopback_ceilings) {
      ceilings.add({"all-reduce over loopback, " + std::to_string(n) + " ranks (Gloo, ring napkin bytes sent per rank)",
                    fixed(bytes_per_s / 1e9, 2), "GB/s", "1 (median of 5)"});
    }
    ceilings.emit("");
    table.emit("");
    std::cout << "\nOurs and PyTorch's, same workloads, same run: " << peer_state << "\n"
              << "peak: " << same_way_peak_method(c.device) << "\n";
    versus_table.emit("");
    if (!c.scaler_rows.empty()) {
      std::cout << "\n" << scaler_napkin << "\n";
      scaler_table.emit("");
    }
    for (const auto& note : c.notes) std::cout << "note: " << note << "\n";

    std::string out_dir = flags.get("out_dir", "");
    const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");  // set by `bazel run`: where the user ran it
    if (!out_dir.empty() && out_dir[0] != '/' && cwd != nullptr) out_dir = std::string(cwd) + "/" + out_dir;
    if (!out_dir.empty()) {
      const std::string kind = c.device.is_cuda() ? "cuda" : "cpu";
      const std::string date = now_utc();
      const std::string pytorch = peer.available() ? peer.torch_version() : "not run";
      const std::string threads = std::to_string(at::get_num_threads());
      workshop::Table csv("bench_" + kind, {"benchmark",
                                            "variant",
                                            "impl",
                                            "median_ms",
                                            "min_ms",
                                            "max_ms",
                                            "flops",
                                            "peak_or_bytes",
                                            "same_way_peak_bytes",
                                            "ceiling_flops_per_s",
                                            "ceiling",
                                            "ratio",
                                            "ours_over_pytorch_time",
                                            "note",
                                            "device",
                                            "libtorch",
                                            "pytorch_version",
                                            "threads",
                                            "date",
                                            "command"});
      const auto add = [&](const std::vector<std::string>& cells) {
        std::vector<std::string> row = cells;
        for (const auto& s : {name, std::string(TORCH_VERSION), pytorch, threads, date, command}) row.push_back(s);
        csv.add(row);
      };
      for (const auto& r : c.rows) {
        add({r.bench, r.variant, "ours", fixed(r.timing.median_ms, 4), fixed(r.timing.min_ms, 4),
             fixed(r.timing.max_ms, 4), fixed(r.flops, 0), fixed(r.bytes, 0),
             r.same_way_peak < 0 ? "" : std::to_string(r.same_way_peak), fixed(c.ceilings.best(r.ceiling_key), 0),
             c.ceilings.name(r.ceiling_key), fixed(r.ratio, 4), "", r.note});
        const PeerRow* p = r.key.empty() ? nullptr : peer.find(r.key);
        if (p == nullptr) continue;
        if (!p->unavailable.empty()) {
          add({r.bench, r.variant, "pytorch", "", "", "", "", "", "", "", "", "", "", p->unavailable});
        } else {
          add({r.bench, r.variant, "pytorch", fixed(p->median_ms, 4), fixed(p->min_ms, 4), fixed(p->max_ms, 4),
               fixed(r.flops, 0), p->peak_bytes < 0 ? "" : std::to_string(p->peak_bytes),
               p->peak_bytes < 0 ? "" : std::to_string(p->peak_bytes), "", "", "",
               fixed(r.timing.median_ms / p->median_ms, 4), p->what});
        }
      }
      const std::string copy_name = c.ceilings.name(c.scaler_copy_ceiling);
      for (const auto& s : c.scaler_rows) {
        const bool theirs = s.name.rfind("PyTorch", 0) == 0;
        if (!s.unavailable.empty()) {
          add({"GradScaler cost", s.name, theirs ? "pytorch" : "ours", "", "", "", "", fixed(min_bytes, 0), "",
               fixed(copy_ceiling, 0), copy_name, "", "", s.unavailable});
        } else {
          add({"GradScaler cost", s.name, theirs ? "pytorch" : "ours", fixed(s.timing.median_ms, 4),
               fixed(s.timing.min_ms, 4), fixed(s.timing.max_ms, 4), "0", fixed(min_bytes, 0), "",
               fixed(copy_ceiling, 0), copy_name, fixed(plain_ms / s.timing.median_ms, 4), "", s.note});
        }
      }
      csv.emit(out_dir, /*print=*/false);
      std::ofstream md(out_dir + "/bench_" + kind + ".md");
      const auto md_table = [&md](const std::vector<std::string>& header, const workshop::Table& t) {
        md << "|";
        for (const auto& h : header) md << " " << h << " |";
        md << "\n|";
        for (size_t i = 0; i < header.size(); ++i) md << "---|";
        md << "\n";
        for (const auto& row : t.rows()) {
          md << "|";
          for (const auto& cell : row) md << " " << cell << " |";
          md << "\n";
        }
      };
      md << "Device: " << name << "  \nLibTorch: " << TORCH_VERSION << ", " << threads
         << " ATen thread(s)  \nPeer: " << peer_state << "  \nLoad: " << load << "  \nDate: " << date
         << "  \nCommand: `" << command << "`  \nRounds: " << rounds
         << " (each case ours then PyTorch's, per round; times are medians of the rounds' medians, min..max over "
            "all rounds; lesson 5 runs once)\n\n";
      md << "| ceiling | measured | measurements |\n|---|---|---|\n";
      for (const auto& row : ceilings.rows()) {
        md << "| " << row[0] << " | " << row[1] << " " << row[2] << " | " << row[3] << " |\n";
      }
      md << "\n";
      md_table({"benchmark", "variant", "median ms", "min..max ms", "rate", "ceiling", "of ceiling", "speed-up",
                "note"},
               table);
      md << "\n<b>Ours and PyTorch's, same workloads, same run.</b> The PyTorch side is `bench/peer.py`, started by "
            "the bench with the same sizes, seeds, thread count and device. Time: median step, both sides timed "
            "the same way; the fastest step's ratio beside it is less sensitive to other work on a shared machine "
            "(lesson 4's and lesson 5's measurements keep only medians and ranges: no such ratio there). The "
            "verdict calls a difference resolved only when the median and the fastest-step ratios both exceed 10% "
            "the same way (lessons 4 and 5: when the two sides' min..max ranges do not overlap); otherwise it is "
            "within this run's noise. Peak: "
         << same_way_peak_method(c.device)
         << " (our own meter's numbers are in the note column above). A ratio above 1 means ours is slower or "
            "holds more.\n\n";
      md_table({"benchmark", "variant", "ours ms", "PyTorch ms", "time ours/PyTorch", "fastest ours/PyTorch",
                "time verdict", "ours peak", "PyTorch peak", "peak ours/PyTorch", "PyTorch code"},
               versus_table);
      if (!c.scaler_rows.empty()) {
        md << "\n<b>The GradScaler's own cost.</b> " << scaler_napkin << "\n\n";
        md_table({"implementation", "median ms", "min..max ms", "vs ours plain", "GB/s (8 B/element)",
                  "of copy ceiling", "note"},
                 scaler_table);
      }
      if (!c.notes.empty()) {
        md << "\n<b>What differs in structure, and how to read the numbers.</b>\n\n";
        for (const auto& note : c.notes) md << "- " << note << "\n";
      }
      std::cout << "wrote " << out_dir << "/bench_" << kind << ".{csv,md}\n";
    }
    if (!peer.failure().empty()) {
      std::cerr << "error: the PyTorch peer failed: " << peer.failure() << "\n";
      return 1;
    }
    return 0;
  } catch (const c10::Error& error) {
    std::cerr << "error: " << error.what_without_backtrace() << "\n";
    return 1;
  }
}

}  // namespace bench
