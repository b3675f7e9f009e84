#include "common/report.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <sys/stat.h>

#include <c10/util/Exception.h>

namespace workshop {

Flags::Flags(int argc, char** argv, const std::map<std::string, std::string>& known, const std::string& description) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      if (!description.empty()) std::cout << description << "\n";
      std::cout << "usage: " << argv[0] << " [flags]\n";
      for (const auto& entry : known) std::cout << "  --" << entry.first << "  " << entry.second << "\n";
      std::exit(0);
    }
    TORCH_CHECK(arg.rfind("--", 0) == 0, "unexpected argument '", arg, "' (flags look like --name=value)");
    arg = arg.substr(2);
    const auto eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    std::string known_names;
    for (const auto& entry : known) known_names += " --" + entry.first;
    TORCH_CHECK(known.count(name), "unknown flag --", name, "; known:", known_names);
    values_[name] = eq == std::string::npos ? "" : arg.substr(eq + 1);
  }
}

bool Flags::has(const std::string& name) const { return values_.count(name) > 0; }

std::string Flags::get(const std::string& name, const std::string& fallback) const {
  const auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

int64_t Flags::get_int(const std::string& name, int64_t fallback) const {
  const auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  try {
    size_t used = 0;
    const int64_t value = std::stoll(it->second, &used);
    TORCH_CHECK(used == it->second.size(), "");
    return value;
  } catch (const std::exception&) {
    TORCH_CHECK(false, "--", name, " needs a whole number, got '", it->second, "'");
  }
  return fallback;
}

double Flags::get_double(const std::string& name, double fallback) const {
  const auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  try {
    size_t used = 0;
    const double value = std::stod(it->second, &used);
    TORCH_CHECK(used == it->second.size(), "");
    return value;
  } catch (const std::exception&) {
    TORCH_CHECK(false, "--", name, " needs a number, got '", it->second, "'");
  }
  return fallback;
}

Table::Table(std::string name, std::vector<std::string> columns)
    : name_(std::move(name)), columns_(std::move(columns)) {}

void Table::add(std::vector<std::string> cells) {
  TORCH_CHECK(cells.size() == columns_.size(), "Table ", name_, ": a row has ", cells.size(), " cells, expected ",
              columns_.size());
  rows_.push_back(std::move(cells));
}

namespace {

void make_dirs(const std::string& path) {
  std::string partial;
  std::stringstream parts(path);
  std::string part;
  if (!path.empty() && path[0] == '/') partial = "/";
  while (std::getline(parts, part, '/')) {
    if (part.empty()) continue;
    partial += part + "/";
    mkdir(partial.c_str(), 0755);
  }
}

std::string csv_cell(const std::string& cell) {
  if (cell.find_first_of(",\"\n") == std::string::npos) return cell;
  std::string quoted = "\"";
  for (char c : cell) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

}  // namespace

std::string Table::emit(const std::string& csv_dir, bool print) const {
  std::vector<size_t> width(columns_.size());
  for (size_t c = 0; c < columns_.size(); ++c) {
    width[c] = columns_[c].size();
    for (const auto& row : rows_) width[c] = std::max(width[c], row[c].size());
  }
  auto print_row = [&](const std::vector<std::string>& row) {
    for (size_t c = 0; c < row.size(); ++c) {
      std::cout << (c ? "  " : "") << std::setw(static_cast<int>(width[c])) << (c ? std::right : std::left) << row[c];
    }
    std::cout << "\n";
  };
  if (print) {
    std::cout << "\n" << name_ << "\n";
    print_row(columns_);
    size_t total = 0;
    for (size_t w : width) total += w + 2;
    std::cout << std::string(total - 2, '-') << "\n";
    for (const auto& row : rows_) print_row(row);
    std::cout << std::flush;
  }
  if (csv_dir.empty()) return "";
  make_dirs(csv_dir);
  const std::string path = csv_dir + "/" + name_ + ".csv";
  std::ofstream out(path);
  TORCH_CHECK(out, "cannot write ", path);
  for (size_t c = 0; c < columns_.size(); ++c) out << (c ? "," : "") << csv_cell(columns_[c]);
  out << "\n";
  for (const auto& row : rows_) {
    for (size_t c = 0; c < row.size(); ++c) out << (c ? "," : "") << csv_cell(row[c]);
    out << "\n";
  }
  return path;
}

void append_summary(const std::string& csv_dir, const std::vector<SummaryRow>& rows) {
  if (csv_dir.empty()) return;
  make_dirs(csv_dir);
  const std::string path = csv_dir + "/summary.csv";
  std::ifstream existing(path);
  const bool fresh = !existing.good();
  existing.close();
  std::ofstream out(path, std::ios::app);
  TORCH_CHECK(out, "cannot write ", path);
  if (fresh) out << "lesson,measure,baseline,improved,ratio,device\n";
  for (const auto& row : rows) {
    out << csv_cell(row.lesson) << "," << csv_cell(row.measure) << "," << row.baseline << "," << row.improved << ","
        << (row.improved != 0 ? row.baseline / row.improved : 0.0) << "," << csv_cell(row.device) << "\n";
  }
}

std::string fixed(double value, int digits) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(digits) << value;
  return out.str();
}

std::string mib(double bytes) { return fixed(bytes / (1024.0 * 1024.0), 2) + " MiB"; }

}  // namespace workshop
