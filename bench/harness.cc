// The bench's shared harness (see harness.h): ceilings, rounds, and the report.
#include "bench/harness.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>
#include <utility>

#ifdef __linux__
#include <sched.h>
#include <sys/resource.h>
#endif

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
// ahead by more than 10% (a row that keeps only its median and range, no samples: the two sides' min..max ranges
// must not overlap).
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
  const size_t begin = c.rows.size(), side_begin = c.side_rows.size();
  std::vector<std::vector<double>> medians, side_medians;
  for (int round = 0; round < rounds; ++round) {
    if (rounds > 1) std::cout << "round " << round + 1 << " of " << rounds << std::endl;
    const size_t here = c.rows.size(), side_here = c.side_rows.size();
    bench_case.run(c);
    medians.resize(c.rows.size() - here);
    side_medians.resize(c.side_rows.size() - side_here);
    for (size_t i = here; i < c.rows.size(); ++i) {
      Row& first = c.rows[begin + (i - here)];
      medians[i - here].push_back(c.rows[i].timing.median_ms);
      first.timing.min_ms = std::min(first.timing.min_ms, c.rows[i].timing.min_ms);
      first.timing.max_ms = std::max(first.timing.max_ms, c.rows[i].timing.max_ms);
    }
    for (size_t i = side_here; i < c.side_rows.size(); ++i) {
      SideRow& first = c.side_rows[side_begin + (i - side_here)];
      side_medians[i - side_here].push_back(c.side_rows[i].timing.median_ms);
      first.timing.min_ms = std::min(first.timing.min_ms, c.side_rows[i].timing.min_ms);
      first.timing.max_ms = std::max(first.timing.max_ms, c.side_rows[i].timing.max_ms);
    }
    if (round > 0) {
      c.rows.erase(c.rows.begin() + static_cast<std::ptrdiff_t>(here), c.rows.end());
      c.side_rows.erase(c.side_rows.begin() + static_cast<std::ptrdiff_t>(side_here), c.side_rows.end());
    }
  }
  for (size_t i = 0; i < medians.size(); ++i) c.rows[begin + i].timing.median_ms = median_of(medians[i]);
  for (size_t i = 0; i < side_medians.size(); ++i) {
    c.side_rows[side_begin + i].timing.median_ms = median_of(side_medians[i]);
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

// ---- case flags and the context -------------------------------------------------------------------------------

CaseFlag::CaseFlag(std::string name, std::string help, std::function<void(const std::string&)> check) {
  registry().push_back({std::move(name), std::move(help), std::move(check)});
}

std::vector<CaseFlag::Declared>& CaseFlag::registry() {
  static std::vector<Declared> declared;  // filled by the cases' static CaseFlag objects, before main
  return declared;
}

const std::vector<CaseFlag::Declared>& CaseFlag::all() { return registry(); }

std::string Context::flag(const std::string& name, const std::string& fallback) const {
  const auto it = flags.find(name);
  return it == flags.end() ? fallback : it->second;
}

// ---- the command line -----------------------------------------------------------------------------------------

namespace {

// What the command line chose besides what the Context holds.
struct Settings {
  std::vector<std::string> chosen;  // the cases to run, by name
  int rounds = 1;
  std::string command;  // the run as the user typed it
  std::string out_dir;  // "": no files
};

std::map<std::string, std::string> known_flags(const std::vector<std::string>& names) {
  std::map<std::string, std::string> known{
      {"device", "best (default), cpu, cuda"},
      {"quick", "small sizes (a smoke run)"},
      {"cases", "comma-separated: " + join(names, ",") + " (default all)"},
      {"out_dir", "write bench_<device>.csv and .md there"},
      {"threads", "ATen intra-op threads, ours and the peer's (default: LibTorch's)"},
      {"peer", "on (default): run PyTorch's implementations beside ours; off"},
      {"rounds", "run each case (ours, then PyTorch's) this many times; medians of the rounds' medians (default 1)"},
      {"peer_python", "the peer's interpreter (default $WORKSHOP_PEER_PYTHON, else /usr/bin/python3)"},
      {"peer_script", "bench/peer.py (default: from the runfiles)"}};
  for (const CaseFlag::Declared& flag : CaseFlag::all()) {
    TORCH_CHECK(known.emplace(flag.name, flag.help).second, "bench: the case flag --", flag.name, " is declared twice");
  }
  return known;
}

std::vector<std::string> chosen_cases(const workshop::Flags& flags, const std::vector<std::string>& names) {
  std::vector<std::string> chosen;
  std::stringstream list(flags.get("cases", join(names, ",")));
  for (std::string item; std::getline(list, item, ',');) {
    if (item.empty()) continue;
    TORCH_CHECK(std::find(names.begin(), names.end(), item) != names.end(), "--cases: unknown case '", item,
                "' (known: ", join(names, ","), ")");
    chosen.push_back(item);
  }
  return chosen;
}

void start_peer(Context& c, const workshop::Flags& flags, const char* argv0) {
  const std::string peer_flag = flags.get("peer", "on");
  TORCH_CHECK(peer_flag == "on" || peer_flag == "off", "--peer must be on or off, got '", peer_flag, "'");
  PeerOptions options;
  options.enabled = peer_flag == "on";
  options.python = default_peer_python(flags.get("peer_python", ""));
  options.script = find_peer_script(argv0, flags.get("peer_script", ""));
  options.device = c.device;
  options.threads = at::get_num_threads();
  c.peer = std::make_unique<Peer>(options);
}

// Parses the flags into `c` (device, sizes, the case flags, threads, the peer) and the returned settings.
Settings parse_flags(int argc, char** argv, const std::vector<Case>& cases, Context& c) {
  std::vector<std::string> names;
  for (const Case& bench_case : cases) names.push_back(bench_case.name);
  const workshop::Flags flags(argc, argv, known_flags(names));
  Settings s;
  c.device = workshop::parse_device(flags.get("device", "best"));
  c.quick = flags.has("quick");
  s.chosen = chosen_cases(flags, names);
  for (const CaseFlag::Declared& flag : CaseFlag::all()) {
    if (!flags.has(flag.name)) continue;
    const std::string value = flags.get(flag.name, "");
    if (flag.check) flag.check(value);  // a bad value stops the run before any case
    c.flags[flag.name] = value;
  }
  s.rounds = static_cast<int>(flags.get_int("rounds", 1));
  TORCH_CHECK(s.rounds >= 1, "--rounds must be >= 1, got ", s.rounds);
  if (flags.has("threads")) {
    const int64_t threads = flags.get_int("threads", 0);
    TORCH_CHECK(threads >= 1, "--threads must be >= 1, got ", threads);
    at::set_num_threads(static_cast<int>(threads));
  }
  start_peer(c, flags, argv[0]);
  s.command = "bazel run //bench --";
  for (int i = 1; i < argc; ++i) s.command += std::string(" ") + argv[i];
  s.out_dir = flags.get("out_dir", "");
  const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");  // set by `bazel run`: where the user ran it
  if (!s.out_dir.empty() && s.out_dir[0] != '/' && cwd != nullptr) s.out_dir = std::string(cwd) + "/" + s.out_dir;
  return s;
}

// ---- running the cases ----------------------------------------------------------------------------------------

// The 1-minute load average at the start, at the end and at its highest between cases ("" start: unknown).
struct Load {
  std::string start, end;
  double highest = 0;
};

Load run_cases(Context& c, const std::vector<Case>& cases, const Settings& s) {
  std::cout << "benchmarks on " << c.device << " (" << workshop::device_name(c.device) << "), LibTorch "
            << TORCH_VERSION << ", " << at::get_num_threads() << " ATen thread(s)\n";
  if (!c.peer->missing().empty()) std::cout << "PyTorch peer: NOT RUN: " << c.peer->missing() << " Our rows only.\n";
  Load load;
  load.start = load_average();
  load.highest = load.start.empty() ? 0 : std::stod(load.start);
  for (const Case& bench_case : cases) {
    if (std::find(s.chosen.begin(), s.chosen.end(), bench_case.name) == s.chosen.end()) continue;
    run_rounds(c, bench_case, bench_case.once ? 1 : s.rounds);
    const std::string now = load_average();
    if (!now.empty()) load.highest = std::max(load.highest, std::stod(now));
  }
  load.end = load_average();
  return load;
}

// How the system schedules this process where that is not the default: the CPUs it may run on (`taskset`) and
// its nice value, so that a recorded run says how it was kept apart from other work on a shared machine.
std::string scheduling() {
  std::string out;
#ifdef __linux__
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0 &&
      CPU_COUNT(&allowed) < static_cast<int>(std::thread::hardware_concurrency())) {
    out += "; this process pinned to " + std::to_string(CPU_COUNT(&allowed)) + " of them";
  }
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, 0);
  if (errno == 0 && nice != 0) out += "; nice " + std::to_string(nice);
#endif
  return out;
}

std::string describe(const Load& load) {
  if (load.start.empty()) return "unknown";
  return load.start + " at the start, " + load.end + " at the end, " + fixed(load.highest, 2) +
         " at the highest between cases (" + std::to_string(std::thread::hardware_concurrency()) + " hardware threads" +
         scheduling() + ")";
}

std::string peer_state(const Peer& peer) {
  if (!peer.available()) {
    return "PyTorch peer NOT RUN: " + (peer.missing().empty() ? peer.failure() : peer.missing());
  }
  return "PyTorch " + peer.torch_version() + " (" + peer.info().at("python") + ", " + peer.info().at("threads") +
         " thread(s))";
}

// The notes every run gets after its cases' own (those once each): how the ceilings are measured, the load,
// and which kernels the two sides run.
void add_run_notes(Context& c, int suspects, const Load& load) {
  std::vector<std::string> unique;
  for (const auto& note : c.notes) {
    if (std::find(unique.begin(), unique.end(), note) == unique.end()) unique.push_back(note);
  }
  c.notes = unique;
  c.notes.push_back(
      "Ceilings are measured the way the rows run (same process and thread count; a matmul of the shape and dtype "
      "of the row's largest layer; a copy, or an in-place read and write, of as many bytes as the row's napkin "
      "counts: a copy also reads its destination, which the napkin does not count), each time a case runs, and the "
      "best repetition of all those measurements is kept: a best case. A row's rate is its median step's. A row "
      "faster than its ceiling gets the ceiling measured again (up to " +
      std::to_string(kRemeasures) + " times); if it still is, the cell reads \"suspect\" (" + std::to_string(suspects) +
      " in this run): the row's FLOP count or napkin bytes (which over-count when the tensors fit in a cache), or "
      "the ceiling's shape, does not describe the work.");
  const double threads = static_cast<double>(std::thread::hardware_concurrency());
  if (!load.start.empty() && load.highest > threads) {
    c.notes.push_back("The machine was shared: a 1-minute load average up to " + fixed(load.highest, 2) + " on " +
                      std::to_string(std::thread::hardware_concurrency()) +
                      " hardware threads means other jobs ran during the measurements, so times move from run to "
                      "run (see the verdict column). Peak bytes do not depend on load.");
  }
  const Peer& peer = *c.peer;
  if (!peer.available()) return;
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

// ---- the report's tables --------------------------------------------------------------------------------------

const std::vector<std::string> kMainColumns{"benchmark", "variant",    "median ms", "min..max ms", "rate",
                                            "ceiling",   "of ceiling", "speed-up",  "note"};
const std::vector<std::string> kVersusColumns{"benchmark",         "variant",           "ours ms",
                                              "PyTorch ms",        "time ours/PyTorch", "fastest ours/PyTorch",
                                              "time verdict",      "ours peak",         "PyTorch peak",
                                              "peak ours/PyTorch", "PyTorch code"};

// rate: GFLOP/s of the row's FLOP count, or GB/s of its napkin bytes where its ceiling is a memory pass.
workshop::Table main_table(const Context& c, const std::vector<Fraction>& fractions) {
  workshop::Table table("bench", kMainColumns);
  for (size_t i = 0; i < c.rows.size(); ++i) {
    const Row& r = c.rows[i];
    const std::string ceiling = r.ceiling_key.empty() ? "-"
                                                      : fixed(c.ceilings.best(r.ceiling_key) / 1e9, 1) + " (" +
                                                            c.ceilings.name(r.ceiling_key) + ")";
    table.add({r.bench, r.variant, fixed(r.timing.median_ms, 2),
               fixed(r.timing.min_ms, 2) + ".." + fixed(r.timing.max_ms, 2),
               fixed(rate_of(c.ceilings, r) / 1e9, 1) + (counts_bytes(c.ceilings, r) ? " GB/s" : " GFLOP/s"), ceiling,
               fractions[i].cell, fixed(r.ratio, 2) + "x", r.note});
  }
  return table;
}

// Ours and PyTorch's, one line per workload that the peer has too.
workshop::Table versus_table(const Context& c) {
  workshop::Table table("bench_vs_pytorch", kVersusColumns);
  const Peer& peer = *c.peer;
  for (const auto& r : c.rows) {
    if (r.key.empty()) continue;
    const PeerRow* p = peer.find(r.key);
    std::string theirs_ms = "-", time_ratio = "-", min_ratio = "-", verdict = "-", theirs_peak = "-", peak_ratio = "-",
                what;
    if (!peer.available() && p == nullptr) {
      what =
          "not run (" + (peer.missing().empty() ? std::string("peer failed") : std::string("peer not installed")) + ")";
    } else if (p == nullptr) {
      what = "no row from the peer";
    } else if (!p->unavailable.empty()) {
      what = p->unavailable;
    } else {
      theirs_ms = fixed(p->median_ms, 2);
      time_ratio = versus(r.timing.median_ms, p->median_ms, true);
      // A row that keeps only its median and range (no samples) has no fastest step to compare.
      if (!r.timing.samples_ms.empty()) min_ratio = fixed(r.timing.min_ms / p->min_ms, 2) + "x";
      verdict = time_verdict(r.timing, *p);
      theirs_peak = peak_cell(p->peak_bytes);
      if (r.same_way_peak >= 0 && p->peak_bytes >= 0) {
        peak_ratio = versus(static_cast<double>(r.same_way_peak), static_cast<double>(p->peak_bytes), false);
      }
      what = p->what;
    }
    table.add({r.bench, r.variant, fixed(r.timing.median_ms, 2), theirs_ms, time_ratio, min_ratio, verdict,
               peak_cell(r.same_way_peak), theirs_peak, peak_ratio, what});
  }
  return table;
}

workshop::Table ceilings_table(const Context& c) {
  workshop::Table table("bench_ceilings", {"ceiling", "measured", "unit", "measurements"});
  for (const std::string& key : c.ceilings.keys()) {
    table.add({c.ceilings.name(key), fixed(c.ceilings.best(key) / 1e9, 1), c.ceilings.unit(key),
               std::to_string(c.ceilings.measurements(key))});
  }
  for (const CeilingRow& row : c.ceiling_rows) {
    table.add({row.name, fixed(row.per_second / 1e9, 2), row.unit, row.measurements});
  }
  return table;
}

workshop::Table section_table(const Section& section) {
  workshop::Table table(section.name, section.columns);
  for (const auto& row : section.rows) table.add(row);
  return table;
}

// The report: everything the console, the CSV and the Markdown show, computed once.
struct Report {
  Report(workshop::Table ceilings_, workshop::Table main_, workshop::Table versus_)
      : ceilings(std::move(ceilings_)), main(std::move(main_)), versus(std::move(versus_)) {}
  workshop::Table ceilings, main, versus;
  std::string device, peer_state, load, threads, date, command;
  int rounds = 1;
  std::vector<std::string> once;          // the chosen cases that ran once whatever --rounds
  std::vector<std::string> medians_only;  // benchmarks compared with PyTorch whose rows keep no samples
};

Report make_report(Context& c, const std::vector<Case>& cases, const Settings& s, const Load& load) {
  // The fractions of ceiling first: a row that beats its ceiling has the ceiling measured again.
  std::vector<Fraction> fractions;
  int suspects = 0;
  for (const auto& r : c.rows) {
    fractions.push_back(of_ceiling(c.ceilings, r));
    suspects += fractions.back().suspect ? 1 : 0;
  }
  add_run_notes(c, suspects, load);
  Report report(ceilings_table(c), main_table(c, fractions), versus_table(c));
  report.device = workshop::device_name(c.device);
  report.peer_state = peer_state(*c.peer);
  report.load = describe(load);
  report.threads = std::to_string(at::get_num_threads());
  report.date = now_utc();
  report.command = s.command;
  report.rounds = s.rounds;
  for (const Case& bench_case : cases) {
    const bool chosen = std::find(s.chosen.begin(), s.chosen.end(), bench_case.name) != s.chosen.end();
    if (chosen && bench_case.once) report.once.push_back(bench_case.name);
  }
  for (const Row& r : c.rows) {
    const std::string quoted = "\"" + r.bench + "\"";
    auto& listed = report.medians_only;
    if (r.key.empty() || !r.timing.samples_ms.empty()) continue;
    if (std::find(listed.begin(), listed.end(), quoted) == listed.end()) listed.push_back(quoted);
  }
  return report;
}

// ---- the console, the CSV and the Markdown --------------------------------------------------------------------

void print_report(const Context& c, const Report& report) {
  report.ceilings.emit("");
  report.main.emit("");
  std::cout << "\nOurs and PyTorch's, same workloads, same run: " << report.peer_state << "\n"
            << "peak: " << same_way_peak_method(c.device) << "\n";
  report.versus.emit("");
  for (const Section& section : c.sections) {
    std::cout << "\n" << section.text << "\n";
    section_table(section).emit("");
  }
  for (const auto& note : c.notes) std::cout << "note: " << note << "\n";
}

void write_csv(const Context& c, const Report& report, const std::string& out_dir, const std::string& kind) {
  const Peer& peer = *c.peer;
  const std::string pytorch = peer.available() ? peer.torch_version() : "not run";
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
    for (const auto& s :
         {report.device, std::string(TORCH_VERSION), pytorch, report.threads, report.date, report.command}) {
      row.push_back(s);
    }
    csv.add(row);
  };
  for (const auto& r : c.rows) {
    add({r.bench, r.variant, "ours", fixed(r.timing.median_ms, 4), fixed(r.timing.min_ms, 4), fixed(r.timing.max_ms, 4),
         fixed(r.flops, 0), fixed(r.bytes, 0), r.same_way_peak < 0 ? "" : std::to_string(r.same_way_peak),
         fixed(c.ceilings.best(r.ceiling_key), 0), c.ceilings.name(r.ceiling_key), fixed(r.ratio, 4), "", r.note});
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
  for (const Section& section : c.sections) {
    for (const auto& line : section.csv) add(line);
  }
  csv.emit(out_dir, /*print=*/false);
}

void md_table(std::ostream& md, const std::vector<std::string>& header, const workshop::Table& t) {
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
}

// How to read the side-by-side table; rows that keep only medians and ranges are named from the rows themselves.
std::string versus_intro(const Context& c, const Report& report) {
  const std::string those = join(report.medians_only, " and ");
  return "<b>Ours and PyTorch's, same workloads, same run.</b> The PyTorch side is `bench/peer.py`, started by the "
         "bench with the same sizes, seeds, thread count and device. Time: median step, both sides timed the same "
         "way; the fastest step's ratio beside it is less sensitive to other work on a shared machine" +
         (those.empty() ? std::string()
                        : " (the rows of " + those + " keep only medians and ranges: no such ratio there)") +
         ". The verdict calls a difference resolved only when the median and the fastest-step ratios both exceed "
         "10% the same way" +
         (those.empty() ? std::string() : " (those rows: when the two sides' min..max ranges do not overlap)") +
         "; otherwise it is within this run's noise. Peak: " + same_way_peak_method(c.device) +
         " (our own meter's numbers are in the note column above). A ratio above 1 means ours is slower or holds "
         "more.";
}

void write_markdown(const Context& c, const Report& report, const std::string& path) {
  std::ofstream md(path);
  TORCH_CHECK(md, "cannot write ", path);
  const std::string once =
      report.once.empty() ? ""
                          : "; " + join(report.once, ", ") + (report.once.size() == 1 ? " runs" : " run") + " once";
  md << "Device: " << report.device << "  \nLibTorch: " << TORCH_VERSION << ", " << report.threads
     << " ATen thread(s)  \nPeer: " << report.peer_state << "  \nLoad: " << report.load << "  \nDate: " << report.date
     << "  \nCommand: `" << report.command << "`  \nRounds: " << report.rounds
     << " (each case ours then PyTorch's, per round; times are medians of the rounds' medians, min..max over all "
        "rounds"
     << once << ")\n\n";
  md << "| ceiling | measured | measurements |\n|---|---|---|\n";
  for (const auto& row : report.ceilings.rows()) {
    md << "| " << row[0] << " | " << row[1] << " " << row[2] << " | " << row[3] << " |\n";
  }
  md << "\n";
  md_table(md, kMainColumns, report.main);
  md << "\n" << versus_intro(c, report) << "\n\n";
  md_table(md, kVersusColumns, report.versus);
  for (const Section& section : c.sections) {
    md << "\n<b>" << section.title << "</b> " << section.text << "\n\n";
    md_table(md, section.columns, section_table(section));
  }
  if (!c.notes.empty()) {
    md << "\n<b>What differs in structure, and how to read the numbers.</b>\n\n";
    for (const auto& note : c.notes) md << "- " << note << "\n";
  }
}

}  // namespace

// ---- main -----------------------------------------------------------------------------------------------------

int run_bench(int argc, char** argv, const std::vector<Case>& cases) {
  for (const Case& bench_case : cases) {
    if (bench_case.as_subprocess == nullptr) continue;
    const int exit_code = bench_case.as_subprocess(argc, argv);  // a case's workers: copies of this binary
    if (exit_code >= 0) return exit_code;
  }
  try {
    Context c;
    const Settings settings = parse_flags(argc, argv, cases, c);
    const Load load = run_cases(c, cases, settings);
    const Report report = make_report(c, cases, settings, load);
    print_report(c, report);
    if (!settings.out_dir.empty()) {
      const std::string kind = c.device.is_cuda() ? "cuda" : "cpu";
      write_csv(c, report, settings.out_dir, kind);
      write_markdown(c, report, settings.out_dir + "/bench_" + kind + ".md");
      std::cout << "wrote " << settings.out_dir << "/bench_" << kind << ".{csv,md}\n";
    }
    if (!c.peer->failure().empty()) {
      std::cerr << "error: the PyTorch peer failed: " << c.peer->failure() << "\n";
      return 1;
    }
    return 0;
  } catch (const c10::Error& error) {
    std::cerr << "error: " << error.what_without_backtrace() << "\n";
    return 1;
  }
}

}  // namespace bench
