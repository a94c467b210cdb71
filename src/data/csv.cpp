#include "afterburner/data/csv.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "afterburner/core/error.h"

namespace afterburner::data {
namespace {

std::string_view trim(std::string_view text) {
  const char* blanks = " \t\r";
  size_t first = text.find_first_not_of(blanks);
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(blanks) - first + 1);
}

std::string_view cell_text(std::string_view cell) {
  cell = trim(cell);
  if (cell.size() >= 2 && cell.front() == '"' && cell.back() == '"') cell = trim(cell.substr(1, cell.size() - 2));
  return cell;
}

void split(std::string_view line, char delimiter, std::vector<std::string_view>& cells) {
  cells.clear();
  size_t start = 0;
  for (size_t end; (end = line.find(delimiter, start)) != std::string_view::npos; start = end + 1) {
    cells.push_back(cell_text(line.substr(start, end - start)));
  }
  cells.push_back(cell_text(line.substr(start)));
}

std::ifstream open_text(const std::string& path) {
  if (!std::filesystem::exists(path)) throw DataError(path, "no such file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path, "cannot open");
  return in;
}

std::string read_text(const std::string& path) {
  std::ifstream in = open_text(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Parses the whole cell as a T, or throws naming file:line:column.
template <typename T>
T parse_cell(std::string_view cell, const std::string& path, int64_t line, size_t column) {
  T value{};
  auto [end, error] = std::from_chars(cell.data(), cell.data() + cell.size(), value);
  if (cell.empty() || error != std::errc() || end != cell.data() + cell.size()) {
    const char* expected = std::is_integral_v<T> ? "an integer label" : "a number";
    throw DataError(fmt::format("{}:{}:{}", path, line, column + 1),
                    fmt::format("expected {}, got '{}'", expected, cell));
  }
  return value;
}

void check_label(int64_t label, int64_t classes, const std::string& path, int64_t line, size_t column) {
  std::string problem;
  if (label < 0) problem = fmt::format("negative label {}", label);
  if (classes > 0 && label >= classes) {
    problem = fmt::format("label {} is outside the model's {} classes", label, classes);
  }
  if (!problem.empty()) throw DataError(fmt::format("{}:{}:{}", path, line, column + 1), problem);
}

// Class names as labels: each name's index among `known` (an evaluation file's training classes),
// or, when none are known, in order of first appearance until number() renumbers them in sorted
// order.
class TextLabels {
 public:
  explicit TextLabels(std::vector<std::string> known) : names_(std::move(known)), fixed_(!names_.empty()) {
    for (size_t i = 0; i < names_.size(); ++i) index_.emplace(names_[i], static_cast<int64_t>(i));
  }

  int64_t index(std::string_view cell, const std::string& path, int64_t line, size_t column) {
    if (cell.empty()) throw DataError(fmt::format("{}:{}:{}", path, line, column + 1), "an empty label");
    const auto found = index_.find(std::string(cell));
    if (found != index_.end()) return found->second;
    if (fixed_) {
      throw DataError(fmt::format("{}:{}:{}", path, line, column + 1),
                      fmt::format("label '{}' is not one of the training set's {} classes", cell, names_.size()));
    }
    names_.emplace_back(cell);
    return index_.emplace(names_.back(), static_cast<int64_t>(names_.size()) - 1).first->second;
  }

  // Labels of names in order of appearance renumbered as the names sorted.
  void number(std::vector<int64_t>& labels) {
    if (fixed_) return;
    std::vector<std::string> sorted = names_;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> rank(names_.size());
    for (size_t i = 0; i < names_.size(); ++i) {
      rank[i] = std::lower_bound(sorted.begin(), sorted.end(), names_[i]) - sorted.begin();
    }
    for (int64_t& label : labels) label = rank[static_cast<size_t>(label)];
    names_ = std::move(sorted);
  }

  const std::vector<std::string>& classes() const { return names_; }

 private:
  std::vector<std::string> names_;
  std::unordered_map<std::string, int64_t> index_;
  bool fixed_;
};

size_t label_column_index(const std::string& path, const CsvOptions& options, const std::vector<std::string_view>& names,
                          size_t columns) {
  if (!options.label_name().empty()) {
    if (!options.header()) throw UsageError("label_name", "picking the label by name needs a header line");
    for (size_t column = 0; column < names.size(); ++column) {
      if (names[column] == options.label_name()) return column;
    }
    throw DataError(path, fmt::format("no column named '{}' in the header", options.label_name()));
  }
  int64_t index = options.label_column() < 0 ? static_cast<int64_t>(columns) + options.label_column()
                                             : options.label_column();
  if (index < 0 || index >= static_cast<int64_t>(columns)) {
    throw UsageError("label_column", fmt::format("{} is out of range for the {} columns of {}",
                                                 options.label_column(), columns, path));
  }
  return static_cast<size_t>(index);
}

// The first `count` lines holding more than blanks (fewer when the file has fewer).
std::vector<std::string> first_text_lines(const std::string& path, size_t count) {
  std::ifstream in = open_text(path);
  std::vector<std::string> lines;
  for (std::string line; lines.size() < count && std::getline(in, line);) {
    if (!trim(line).empty()) lines.push_back(line);
  }
  return lines;
}

std::string first_text_line(const std::string& path) {
  const std::vector<std::string> lines = first_text_lines(path, 1);
  return lines.empty() ? "" : lines.front();
}

bool is_number(std::string_view cell) {
  float value;
  auto [end, error] = std::from_chars(cell.data(), cell.data() + cell.size(), value);
  return !cell.empty() && error == std::errc() && end == cell.data() + cell.size();
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

// The header cell naming the label in the usual words ("" when none does).
std::string conventional_label_name(const std::vector<std::string>& header) {
  for (const char* name : {"label", "target", "class", "y"}) {
    for (const std::string& cell : header) {
      if (lower(cell) == name) return cell;
    }
  }
  return "";
}

// Whether rows of `features` are images: integers in [0, 255], a square count of at least 8x8.
bool holds_pixels(const torch::Tensor& features) {
  constexpr int64_t kSmallestSide = 8;
  const auto side = static_cast<int64_t>(std::lround(std::sqrt(double(features.size(1)))));
  if (side < kSmallestSide || side * side != features.size(1)) return false;
  return features.min().item<float>() >= 0 && features.max().item<float>() <= 255 &&
         torch::equal(features, features.round());
}

// Whether the label cell of the first data row is not an integer: the labels are class names.
bool first_label_is_text(const std::string& path, const CsvOptions& options) {
  const std::vector<std::string> lines = first_text_lines(path, options.header() ? 2 : 1);
  if (lines.size() < (options.header() ? 2u : 1u)) return false;
  std::vector<std::string_view> names, cells;
  if (options.header()) split(lines.front(), options.delimiter(), names);
  split(lines.back(), options.delimiter(), cells);
  if (cells.size() < 2) return false;  // read_csv names the problem
  const size_t column = label_column_index(path, options, names, cells.size());
  if (column >= cells.size()) return false;  // a row shorter than the header: read_csv names it
  int64_t label = 0;
  const std::string_view cell = cells[column];
  const auto [end, error] = std::from_chars(cell.data(), cell.data() + cell.size(), label);
  return !cell.empty() && !(error == std::errc() && end == cell.data() + cell.size()) && !is_number(cell);
}

}  // namespace

char sniff_csv_delimiter(const std::string& path) {
  if (lower(std::filesystem::path(path).extension().string()) == ".tsv") return '\t';
  const std::string line = first_text_line(path);
  char chosen = ',';
  for (char candidate : {';', '\t'}) {
    if (std::count(line.begin(), line.end(), candidate) > std::count(line.begin(), line.end(), chosen)) {
      chosen = candidate;
    }
  }
  return chosen;
}

std::vector<std::string> read_csv_header(const std::string& path, char delimiter) {
  const std::vector<std::string> lines = first_text_lines(path, 2);
  std::vector<std::string_view> cells, next;
  if (lines.empty()) return {};
  split(lines[0], delimiter, cells);
  if (lines.size() > 1) split(lines[1], delimiter, next);
  bool names_a_number_column = lines.size() == 1 && !std::all_of(cells.begin(), cells.end(), is_number);
  for (size_t column = 0; column < std::min(cells.size(), next.size()); ++column) {
    names_a_number_column |= !is_number(cells[column]) && is_number(next[column]);
  }
  if (!names_a_number_column) return {};
  return {cells.begin(), cells.end()};
}

LabelledDataset load_csv_table(const std::string& path, const std::string& label,
                               std::shared_ptr<SkippedInputs> skipped, const std::vector<std::string>& classes) {
  const char delimiter = sniff_csv_delimiter(path);
  const std::vector<std::string> header = read_csv_header(path, delimiter);
  CsvOptions options = CsvOptions().delimiter(delimiter).header(!header.empty()).skipped(skipped);
  int64_t column = 0;
  if (label.empty()) {
    options.label_name(conventional_label_name(header));
  } else if (auto [end, error] = std::from_chars(label.data(), label.data() + label.size(), column);
             error == std::errc() && end == label.data() + label.size()) {
    options.label_column(column);
  } else if (header.empty()) {
    throw UsageError("--label-column", fmt::format("'{}' names a column, but {} has no header line: give the "
                                                   "column's index", label, path));
  } else {
    options.label_name(label);
  }
  if (first_label_is_text(path, options)) options.text_labels(true).class_names(classes);
  LabelledDataset read = read_csv_classes(path, options);
  const auto table = std::static_pointer_cast<const TensorDataset>(read.dataset);
  torch::Tensor inputs = table->inputs();
  if (holds_pixels(inputs)) {
    const int64_t side = std::lround(std::sqrt(double(inputs.size(1))));
    inputs = inputs.to(torch::kByte).view({inputs.size(0), 1, side, side});
  }
  return {std::make_shared<TensorDataset>(inputs, table->targets()), std::move(read.classes)};
}

DatasetPtr read_csv(const std::string& path, const CsvOptions& options) {
  return read_csv_classes(path, options).dataset;
}

LabelledDataset read_csv_classes(const std::string& path, const CsvOptions& options) {
  const std::string text = read_text(path);
  std::vector<float> features;
  std::vector<int64_t> labels;
  TextLabels names(options.class_names());
  std::vector<std::string_view> cells;
  size_t columns = 0;
  size_t label_column = 0;
  bool header_pending = options.header();

  int64_t line_number = 0;
  for (size_t start = 0; start < text.size();) {
    size_t end = std::min(text.find('\n', start), text.size());
    std::string_view line(text.data() + start, end - start);
    start = end + 1;
    ++line_number;
    if (trim(line).empty()) continue;

    split(line, options.delimiter(), cells);
    if (columns == 0) {
      columns = cells.size();
      if (columns < 2) throw DataError(path, "needs a label column and at least one feature column");
      label_column = label_column_index(path, options, header_pending ? cells : std::vector<std::string_view>{},
                                        columns);
      if (header_pending) {
        header_pending = false;
        continue;
      }
    }
    const size_t row_start = features.size();
    const bool parsed = skip_or_throw(options.skipped().get(), [&] {
      if (cells.size() != columns) {
        throw DataError(fmt::format("{}:{}", path, line_number),
                        fmt::format("expected {} fields, got {}", columns, cells.size()));
      }
      for (size_t column = 0; column < columns; ++column) {
        if (column != label_column) features.push_back(parse_cell<float>(cells[column], path, line_number, column));
      }
      if (options.text_labels()) {
        labels.push_back(names.index(cells[label_column], path, line_number, label_column));
        return;
      }
      const auto label = parse_cell<int64_t>(cells[label_column], path, line_number, label_column);
      check_label(label, options.classes(), path, line_number, label_column);
      labels.push_back(label);
    });
    if (!parsed) features.resize(row_start);
  }
  if (labels.empty()) throw DataError(path, "no data rows");

  const auto rows = static_cast<int64_t>(labels.size());
  auto inputs = torch::from_blob(features.data(), {rows, static_cast<int64_t>(columns) - 1}, torch::kFloat).clone();
  if (options.text_labels()) names.number(labels);
  auto targets = torch::from_blob(labels.data(), {rows}, torch::kLong).clone();
  std::vector<std::string> classes = options.text_labels() ? names.classes() : classes_up_to_largest(targets, path);
  return {std::make_shared<TensorDataset>(std::move(inputs), std::move(targets)), std::move(classes)};
}

}  // namespace afterburner::data
