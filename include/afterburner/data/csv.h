// Numeric CSV files as a classification dataset: float32 features, one int64 label column.
//
//   auto iris = read_csv("iris.csv", CsvOptions().label_name("species").classes(3));
//   auto raw = read_csv("data.tsv", CsvOptions().header(false).delimiter('\t').label_column(0));
#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <string>

#include "afterburner/data/dataset.h"

namespace afterburner::data {

struct CsvOptions {
  // Which column holds the label, by index; negative counts from the end (-1 = last).
  TORCH_ARG(int64_t, label_column) = -1;
  // When not empty, picks the label column by its header name instead (needs a header).
  TORCH_ARG(std::string, label_name) = "";
  // Whether the first line names the columns.
  TORCH_ARG(bool, header) = true;
  TORCH_ARG(char, delimiter) = ',';
  // The model's number of classes: when > 0, every label must be below it.
  TORCH_ARG(int64_t, classes) = 0;
};

// Every cell must be a number (surrounding spaces and double quotes are ignored, quoted
// delimiters are not supported); labels must be non-negative integers (below classes() when
// set). Blank lines are skipped. Errors name file:line:column.
DatasetPtr read_csv(const std::string& path, const CsvOptions& options = CsvOptions());

}  // namespace afterburner::data
