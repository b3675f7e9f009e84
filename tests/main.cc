// The single doctest main of the repository. Before running, it names the device and lists the GPU-only test
// cases that will be skipped here, with the reason (once), so a green run on a CPU machine never hides them.
// A run whose filters select no test case at all fails: `--test-case='*step[45]*'` (doctest knows only the
// wildcards * and ?) must not look like a pass. One exception: a lesson's checks are several binaries
// (`bazel test //lesson3_profiling:all`), so `--test-case='*step2*'` selects nothing in the binaries of the other
// steps; given the lesson's page (--workshop-page=README.md, which lesson_test passes), a filter made only of
// `*stepK*` passes where the page has every such step, and fails naming the lesson's steps where it does not. Each test case's name is printed, and standard output flushed, as
// the case starts ("[workshop] case: ..."): a check that crashes the binary (an out-of-bounds write that glibc
// notices as "corrupted double-linked list", a segfault) leaves the banner and the name of the running case in the
// log, where doctest's own report of the crash may never be written.
#define DOCTEST_CONFIG_IMPLEMENT
#include "tests/torch_doctest.h"

#include <cstring>
#include <fstream>
#include <regex>
#include <initializer_list>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <c10/util/Exception.h>
#include <torch/cuda.h>
#include <torch/version.h>

namespace doctest {
namespace detail {
std::set<TestCase>& getRegisteredTests();  // defined by DOCTEST_CONFIG_IMPLEMENT above
}  // namespace detail
}  // namespace doctest

// LibTorch's c10::Error::what() carries a C++ backtrace; the message alone is what a learner needs.
REGISTER_EXCEPTION_TRANSLATOR(const c10::Error& error) { return doctest::String(error.what_without_backtrace()); }

namespace {

// How many test cases the last run's filters let through (a doctest listener sees the run's statistics), and how
// many GPU cases (suite "gpu") started and failed: tools/gpu_check.sh wants proof that a GPU machine ran them.
unsigned g_selected = 0;
unsigned g_gpu_started = 0;
unsigned g_gpu_failed = 0;
bool g_in_gpu_case = false;
bool g_announce_cases = false;  // off for queries and XML/JUnit output, which must stay machine-readable

struct SelectionListener : public doctest::IReporter {
  explicit SelectionListener(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData& data) override {
    if (data.run_stats != nullptr) g_selected = data.run_stats->numTestCasesPassingFilters;
  }
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override { g_selected = stats.numTestCasesPassingFilters; }
  void test_case_start(const doctest::TestCaseData& test) override {
    g_in_gpu_case = std::strcmp(test.m_test_suite, "gpu") == 0;
    if (g_in_gpu_case) ++g_gpu_started;
    // Flushed now: if the case crashes the process, whatever is still buffered is lost.
    if (g_announce_cases) std::cout << "[workshop] case: " << test.m_name << std::endl;
  }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats& stats) override {
    if (g_in_gpu_case && !stats.testCaseSuccess) ++g_gpu_failed;
  }
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

// True if a doctest option of the command line (-name, --name or --dt-name, with or without =value) is one of
// `names`.
bool has_option(int argc, char** argv, std::initializer_list<const char*> names) {
  for (int i = 1; i < argc; ++i) {
    std::string option(argv[i]);
    if (option.rfind("-", 0) != 0) continue;
    option.erase(0, option.find_first_not_of('-'));
    if (option.rfind("dt-", 0) == 0) option.erase(0, 3);
    option = option.substr(0, option.find('='));
    for (const char* name : names) {
      if (option == name) return true;
    }
  }
  return false;
}

// The value of the last `--workshop-page=PATH` argument ("" if none): the lesson page whose "## Step K" headings
// name the lesson's steps.
std::string workshop_page(int argc, char** argv) {
  std::string page;
  for (int i = 1; i < argc; ++i) {
    const std::string arg(argv[i]);
    if (arg.rfind("--workshop-page=", 0) == 0) page = arg.substr(std::strlen("--workshop-page="));
  }
  return page;
}

// The step numbers of a test-case filter made only of `*stepK*` alternatives (--test-case=, -tc=, --dt-test-case=,
// the last one given); empty if there is none or it has anything else.
std::vector<int> step_filter(int argc, char** argv) {
  std::string filter;
  for (int i = 1; i < argc; ++i) {
    const std::string arg(argv[i]);
    for (const char* prefix : {"--test-case=", "-tc=", "--dt-test-case=", "--tc=", "-test-case=", "--dt-tc="}) {
      if (arg.rfind(prefix, 0) == 0) filter = arg.substr(std::strlen(prefix));
    }
  }
  std::vector<int> steps;
  static const std::regex one_step(R"(\*step([0-9]+)\*)");
  std::stringstream alternatives(filter);
  std::string alternative;
  std::smatch match;
  while (std::getline(alternatives, alternative, ',')) {
    if (!std::regex_match(alternative, match, one_step)) return {};
    steps.push_back(std::stoi(match[1].str()));
  }
  return steps;
}

// The steps a lesson page has ("## Step K — ..." headings); empty if it cannot be read.
std::set<int> page_steps(const std::string& page) {
  std::set<int> steps;
  std::ifstream in(page);
  static const std::regex heading(R"(^## Step ([0-9]+)\b.*)");
  std::string line;
  std::smatch match;
  while (std::getline(in, line)) {
    if (std::regex_match(line, match, heading)) steps.insert(std::stoi(match[1].str()));
  }
  return steps;
}

}  // namespace

REGISTER_LISTENER("workshop_selection", 1, SelectionListener);

int main(int argc, char** argv) {
  const bool query = has_option(argc, argv,
                                {"list-test-cases", "ltc", "list-test-suites", "lts", "count", "c", "help", "h", "?",
                                 "version", "v", "list-reporters", "lr"});
  bool machine_readable = false;  // keep XML/JUnit output clean
  for (int i = 1; i < argc; ++i) {
    machine_readable |= std::strstr(argv[i], "xml") != nullptr || std::strstr(argv[i], "junit") != nullptr;
  }
  const bool quiet = query || machine_readable;
  if (!quiet) {
    std::cout << "[workshop] LibTorch " << TORCH_VERSION << ", "
              << (workshop::testing::cuda_usable() ? "CUDA devices: " + std::to_string(torch::cuda::device_count())
                                                   : std::string("CPU only"))
              << "\n";
    std::vector<const char*> gpu_cases;
    for (const auto& test : doctest::detail::getRegisteredTests()) {
      if (test.m_skip && std::strcmp(test.m_test_suite, "gpu") == 0) gpu_cases.push_back(test.m_name);
      if (test.m_skip && std::strcmp(test.m_test_suite, "multi_gpu") == 0) {
        // Not a "GPU case" skip: one GPU is a complete GPU machine for every other check (tools/gpu_check.sh).
        std::cout << "[workshop] SKIPPED (multi-GPU case): " << test.m_name << "\n"
                  << "           reason: needs at least 2 CUDA devices and NCCL; this machine has "
                  << (workshop::testing::cuda_usable() ? torch::cuda::device_count() : 0) << " CUDA device(s)\n";
      }
    }
    if (!gpu_cases.empty()) {
      std::cout << "[workshop] " << gpu_cases.size()
                << " GPU case(s) SKIPPED here: " << workshop::testing::gpu_skip_reason() << "\n";
      for (const char* name : gpu_cases) std::cout << "           - " << name << "\n";
    }
    std::cout << std::flush;  // the banner survives a crash in the first check
    g_announce_cases = true;
  }

  doctest::Context context;
  context.applyCommandLine(argc, argv);
  const int result = context.run();
  if (!quiet && g_gpu_started > 0) {
    // One line per binary, summed by tools/gpu_check.sh: "[workshop] N GPU case(s) RUN here: P passed, F failed".
    std::cout << "[workshop] " << g_gpu_started << " GPU case(s) RUN here: " << g_gpu_started - g_gpu_failed
              << " passed, " << g_gpu_failed << " failed\n";
  }
  if (query || context.shouldExit() || g_selected > 0) return result;

  // Nothing ran. Fine if the filters chose only GPU cases that are skipped on this machine; otherwise a typo
  // or an unsupported pattern, which must not pass.
  std::vector<const char*> args(argv, argv + argc);
  args.push_back("--count");
  args.push_back("--no-skip");
  std::ostringstream discard;
  doctest::Context count;
  count.applyCommandLine(static_cast<int>(args.size()), const_cast<char**>(args.data()));
  count.setCout(&discard);
  count.run();
  if (g_selected > 0) {
    std::cout << "[workshop] the filters select only GPU cases, skipped on this machine\n";
    return result;
  }
  const std::vector<int> wanted = step_filter(argc, argv);
  const std::string page = workshop_page(argc, argv);
  if (!wanted.empty() && !page.empty()) {
    const std::set<int> steps = page_steps(page);
    std::string missing, known;
    for (int k : wanted) {
      if (steps.count(k) == 0) missing += (missing.empty() ? "" : ", ") + std::to_string(k);
    }
    for (int k : steps) known += (known.empty() ? "" : ", ") + std::to_string(k);
    if (!steps.empty() && missing.empty()) {
      std::cout << "[workshop] no check of this target is in the selected step(s): the lesson's other targets have "
                   "them\n";
      return result;
    }
    std::cout << "[workshop] FAILED: the lesson has no step " << missing << " (its page, " << page << ", has steps "
              << (known.empty() ? "none" : known) << ")\n";
    return 1;
  }
  std::cout << "[workshop] FAILED: the filters select no test case. doctest's patterns know only * and ?;\n"
            << "           a comma separates alternatives: --test_arg=--test-case='*step4*,*step5*'\n";
  return 1;
}
