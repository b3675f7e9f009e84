// What every demo shares: the flags --quick, --device, --csv_dir and --help, parsed in one place, and the `main`
// around a demo's body that turns a bad flag or a failed check into "error: ..." and exit status 1.
//
//   int main(int argc, char** argv) {
//     return workshop::demo_main(argc, argv,
//                                workshop::DemoOptions("Lesson 2 — gradient accumulation: ...")
//                                    .flags({{"batch", "effective batch in items (default 1024; --quick: 256)"}}),
//                                run);  // int run(const workshop::Demo& demo)
//   }
#pragma once

#include <functional>
#include <map>
#include <string>

#include <c10/core/Device.h>
#include <torch/arg.h>

#include "common/report.h"

namespace workshop {

/// Flags and their help, name -> help.
using FlagHelp = std::map<std::string, std::string>;

/// How a demo's shared flags behave, and the demo's own flags; a builder, as LibTorch's option structs are:
/// `DemoOptions("what it shows").device("cpu").flags({{"steps", "timed steps (default 10)"}})`.
struct DemoOptions {
  explicit DemoOptions(std::string description) : description_(std::move(description)) {}
  /// What the demo shows, printed above the flags by --help.
  TORCH_ARG(std::string, description);
  /// The demo's own flags, name -> help (besides --quick, --device, --csv_dir).
  TORCH_ARG(FlagHelp, flags) = {};
  /// --device's default: best (CUDA device 0 where there is one, else the CPU), cpu, cuda or cuda:N.
  TORCH_ARG(std::string, device) = "best";
  /// --device's default under --quick ("": the same as without).
  TORCH_ARG(std::string, quick_device) = "";
  /// --device's help ("": the devices parse_device knows and the default).
  TORCH_ARG(std::string, device_help) = "";
};

/// What a demo's body gets: the shared flags, parsed, and every flag for its own (`flags.get_int("steps", 10)`).
struct Demo {
  bool quick;           ///< --quick: small, fast settings
  c10::Device device;   ///< --device, checked to exist here
  std::string csv_dir;  ///< --csv_dir: where the tables go as CSV ("" = nowhere)
  const Flags& flags;
};

/// A demo's whole `main`: parses the flags (an unknown one, or a device that is not there, is an error naming
/// what is known; --help prints the description and every flag, then exits 0), runs `body` and returns its exit
/// code. A c10::Error from either (TORCH_CHECK) prints "error: <message>" on stderr and returns 1.
int demo_main(int argc, char** argv, const DemoOptions& options, const std::function<int(const Demo&)>& body);

}  // namespace workshop
