// CSV files as a classification dataset: float32 features, one label column (class indices, or
// class names).
//
//   auto iris = read_csv_classes("iris.csv", CsvOptions().label_name("species").text_labels(true));
//   // iris.classes: {"setosa", "versicolor", "virginica"}, the labels their indices
//   auto raw = read_csv("data.tsv", CsvOptions().header(false).delimiter('\t').label_column(0));
//   LabelledDataset kaggle = load_csv_table("fashion-mnist_train.csv");   // [N, 1, 28, 28] uint8
#pragma once

#include <torch/arg.h>

#include <cstdint>
#include <string>
#include <vector>

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
  // Labels are class names (any text, as "setosa"), numbered in sorted order (as scikit-learn's
  // LabelEncoder), or by class_names when given (an evaluation file: a name outside them is a bad
  // row).
  TORCH_ARG(bool, text_labels) = false;
  TORCH_ARG(std::vector<std::string>, class_names);
  // Where a row with a missing, extra or non-numeric field or a bad label is recorded and skipped
  // (null: it is an error).
  TORCH_ARG(std::shared_ptr<SkippedInputs>, skipped);
};

// Every feature cell must be a number (surrounding spaces and double quotes are ignored, quoted
// delimiters are not supported); labels must be non-negative integers (below classes() when set),
// or names with text_labels. Blank lines are skipped. Errors name file:line:column.
DatasetPtr read_csv(const std::string& path, const CsvOptions& options = CsvOptions());

// The same with the class names: text labels' names, or numbered up to the largest label.
LabelledDataset read_csv_classes(const std::string& path, const CsvOptions& options = CsvOptions());

// The delimiter of `path`'s first line: tab for a .tsv file, else the most frequent of ',', ';'
// and tab in it (',' when none occurs).
char sniff_csv_delimiter(const std::string& path);

// The cells of `path`'s first non-blank line when they name the columns (one of them is not a
// number where the next line holds one), else none: a file of numbers only, or of numbers and
// text labels, has no header line.
std::vector<std::string> read_csv_header(const std::string& path, char delimiter);

// A CSV table as `afterburner train --data` reads it: delimiter and header detected, the label in
// the column `label` names (a header name or a column index; empty: the column named label,
// target, class or y, in any case, else the last). Rows of integers in [0, 255] whose count is a
// square S*S are grayscale images, uint8 [N, 1, S, S] (the layout of the MNIST family's CSV
// files); other rows are features, float32 [N, F]. The classes are numbered up to the largest
// label, or are the names the label column holds when its first label is not an integer (the
// training set's `classes` when given: an evaluation file). Bad rows are recorded in `skipped` and
// left out, when it is given.
LabelledDataset load_csv_table(const std::string& path, const std::string& label = "",
                               std::shared_ptr<SkippedInputs> skipped = nullptr,
                               const std::vector<std::string>& classes = {});

}  // namespace afterburner::data
