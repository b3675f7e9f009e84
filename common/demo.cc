#include "common/demo.h"

#include <iostream>

#include <c10/util/Exception.h>

#include "common/device.h"

namespace workshop {

int demo_main(int argc, char** argv, const DemoOptions& options, const std::function<int(const Demo&)>& body) {
  try {
    FlagHelp known = options.flags();
    const std::string device_help =
        options.device_help().empty()
            ? "best, cpu, cuda or cuda:N (default " + options.device() +
                  (options.quick_device().empty() ? "" : "; --quick: " + options.quick_device()) + ")"
            : options.device_help();
    const FlagHelp shared{{"quick", "small, fast settings (seconds on a CPU)"},
                          {"device", device_help},
                          {"csv_dir",
                           "write the tables as CSV files into this folder and append the tour's summary.csv there"}};
    for (const auto& [name, help] : shared) {
      TORCH_CHECK(known.emplace(name, help).second, "demo_main: the demo declares the shared flag --", name, " again");
    }
    const Flags flags(argc, argv, known, options.description());
    const bool quick = flags.has("quick");
    const std::string fallback = quick && !options.quick_device().empty() ? options.quick_device() : options.device();
    const Demo demo{quick, parse_device(flags.get("device", fallback)), flags.get("csv_dir", ""), flags};
    return body(demo);
  } catch (const c10::Error& error) {
    std::cerr << "error: " << error.what_without_backtrace() << "\n";
    return 1;
  }
}

}  // namespace workshop
