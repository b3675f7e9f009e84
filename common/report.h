// Small helpers for the demos: command-line flags, aligned tables that are also written as CSV, and the
// one-line summaries that //:tour collects.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace workshop {

/// Flags of the form --name=value or --name (a switch). Unknown flags are an error naming the known ones.
class Flags {
 public:
  /// `known`: name -> help text. "--help" prints `description` (if any), then them, and exits 0.
  Flags(int argc, char** argv, const std::map<std::string, std::string>& known, const std::string& description = "");

  bool has(const std::string& name) const;
  std::string get(const std::string& name, const std::string& fallback) const;
  int64_t get_int(const std::string& name, int64_t fallback) const;
  double get_double(const std::string& name, double fallback) const;

 private:
  std::map<std::string, std::string> values_;
};

/// A table printed with aligned columns and, when a folder is given, written as `<folder>/<name>.csv`.
class Table {
 public:
  Table(std::string name, std::vector<std::string> columns);

  /// Adds a row; it must have one cell per column.
  void add(std::vector<std::string> cells);

  /// Prints the table to stdout (unless `print` is false); writes the CSV if `csv_dir` is not empty.
  /// Returns the CSV path or "".
  std::string emit(const std::string& csv_dir, bool print = true) const;

  const std::vector<std::vector<std::string>>& rows() const { return rows_; }

 private:
  std::string name_;
  std::vector<std::string> columns_;
  std::vector<std::vector<std::string>> rows_;
};

/// One line of the tour's summary: what a lesson measured, the baseline, the improved value, their ratio.
struct SummaryRow {
  std::string lesson;   ///< e.g. "1 mixed precision"
  std::string measure;  ///< e.g. "step time (ms)"
  double baseline;
  double improved;
  std::string device;
};

/// Appends rows to `<csv_dir>/summary.csv` (creating it with a header), for //:tour to collect.
/// The ratio written is baseline / improved. Does nothing when csv_dir is empty.
void append_summary(const std::string& csv_dir, const std::vector<SummaryRow>& rows);

/// Formats a number for a table: fixed with `digits` decimals.
std::string fixed(double value, int digits = 2);

/// Formats bytes as "12.3 MiB".
std::string mib(double bytes);

}  // namespace workshop
