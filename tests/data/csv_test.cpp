#include <gtest/gtest.h>
#include <torch/torch.h>

#include "afterburner/core/error.h"
#include "afterburner/data/csv.h"
#include "testing.h"

using afterburner::testing::Contains;
using afterburner::testing::error_message;

namespace afterburner::data {
namespace {

using testing::TempDir;

Batch everything(const DatasetPtr& dataset) { return dataset->get_batch(torch::arange(dataset->size())); }

class ReadCsv : public ::testing::Test {
 protected:
  std::string write(const std::string& text) {
    testing::write_file(dir_ / "data.csv", text);
    return (dir_ / "data.csv").string();
  }
  std::string data_error(const std::string& text, const CsvOptions& options = CsvOptions()) {
    auto path = write(text);
    return error_message<DataError>([&] { read_csv(path, options); });
  }
  TempDir dir_;
};

TEST_F(ReadCsv, HeaderWithLabelByName) {
  auto path = write("a,label,b\n1.5,2,-3\n4,0,5e-1\n");
  Batch all = everything(read_csv(path, CsvOptions().label_name("label")));
  EXPECT_TRUE(torch::equal(all.input, torch::tensor({1.5f, -3.0f, 4.0f, 0.5f}).view({2, 2})));
  EXPECT_TRUE(torch::equal(all.target, torch::tensor({2, 0}, torch::kLong)));
}

TEST_F(ReadCsv, DefaultsToTheLastColumnAsLabel) {
  auto path = write("x,y,class\n0.25,1,3\n2,-8,1\n");
  Batch all = everything(read_csv(path));
  EXPECT_TRUE(torch::equal(all.input, torch::tensor({0.25f, 1.0f, 2.0f, -8.0f}).view({2, 2})));
  EXPECT_TRUE(torch::equal(all.target, torch::tensor({3, 1}, torch::kLong)));
}

TEST_F(ReadCsv, NoHeaderOtherDelimiterLabelFirst) {
  auto path = write("7;0.5;1\n\n2;-1;0.125\n");
  Batch all = everything(read_csv(path, CsvOptions().header(false).delimiter(';').label_column(0)));
  EXPECT_TRUE(torch::equal(all.input, torch::tensor({0.5f, 1.0f, -1.0f, 0.125f}).view({2, 2})));
  EXPECT_TRUE(torch::equal(all.target, torch::tensor({7, 2}, torch::kLong)));
}

TEST_F(ReadCsv, SpacesQuotesAndCrlf) {
  auto path = write("\"f\", \"label\"\r\n \"1.5\" , 4 \r\n");
  Batch all = everything(read_csv(path, CsvOptions().label_name("label")));
  EXPECT_TRUE(torch::equal(all.input, torch::tensor({1.5f}).view({1, 1})));
  EXPECT_TRUE(torch::equal(all.target, torch::tensor({4}, torch::kLong)));
}

TEST_F(ReadCsv, NegativeLabelColumnCountsFromTheEnd) {
  auto path = write("1,2,3\n4,5,6\n");
  Batch all = everything(read_csv(path, CsvOptions().header(false).label_column(-2)));
  EXPECT_TRUE(torch::equal(all.target, torch::tensor({2, 5}, torch::kLong)));
  EXPECT_TRUE(torch::equal(all.input, torch::tensor({1.0f, 3.0f, 4.0f, 6.0f}).view({2, 2})));
}

TEST_F(ReadCsv, BadNumberNamesFileLineAndColumn) {
  auto message = data_error("a,b,label\n1,2,0\n1.5,abc,1\n");
  EXPECT_TRUE(Contains(message, (dir_ / "data.csv").string() + ":3:2: "));
  EXPECT_TRUE(Contains(message, "expected a number, got 'abc'"));
}

TEST_F(ReadCsv, EmptyCellIsABadNumber) {
  auto message = data_error("a,b,label\n1,,0\n");
  EXPECT_TRUE(Contains(message, (dir_ / "data.csv").string() + ":2:2: "));
}

TEST_F(ReadCsv, NonIntegerLabel) {
  auto message = data_error("a,label\n1,2.5\n");
  EXPECT_TRUE(Contains(message, (dir_ / "data.csv").string() + ":2:2: "));
  EXPECT_TRUE(Contains(message, "expected an integer label, got '2.5'"));
}

TEST_F(ReadCsv, NegativeLabel) {
  auto message = data_error("a,label\n1,-1\n");
  EXPECT_TRUE(Contains(message, (dir_ / "data.csv").string() + ":2:2: "));
  EXPECT_TRUE(Contains(message, "negative label -1"));
}

TEST_F(ReadCsv, LabelOutsideTheModelsClassesNamesFileLineAndColumn) {
  const std::string text = "a,label\n1,9\n2,10\n";
  EXPECT_NO_THROW(read_csv(write(text)));
  EXPECT_EQ(data_error(text, CsvOptions().classes(10)),
            (dir_ / "data.csv").string() + ":3:2: label 10 is outside the model's 10 classes");
  EXPECT_TRUE(Contains(data_error("a,label\n1,-2\n", CsvOptions().classes(10)), "negative label -2"));
  Batch all = everything(read_csv(write("a,label\n1,9\n2,0\n"), CsvOptions().classes(10)));
  EXPECT_TRUE(torch::equal(all.target, torch::tensor({9, 0}, torch::kLong)));
}

TEST_F(ReadCsv, RaggedRow) {
  auto message = data_error("a,b,label\n1,2,0\n\n3,1\n");
  EXPECT_TRUE(Contains(message, (dir_ / "data.csv").string() + ":4: "));
  EXPECT_TRUE(Contains(message, "expected 3 fields, got 2"));
}

TEST_F(ReadCsv, UnknownLabelName) {
  auto message = data_error("a,b\n1,2\n", CsvOptions().label_name("class"));
  EXPECT_TRUE(Contains(message, (dir_ / "data.csv").string()));
  EXPECT_TRUE(Contains(message, "no column named 'class'"));
}

TEST_F(ReadCsv, LabelNameNeedsAHeader) {
  auto path = write("1,2\n");
  auto message = error_message<UsageError>([&] { read_csv(path, CsvOptions().header(false).label_name("b")); });
  EXPECT_TRUE(Contains(message, "label_name"));
}

TEST_F(ReadCsv, LabelColumnOutOfRange) {
  auto path = write("1,2\n");
  auto message = error_message<UsageError>([&] { read_csv(path, CsvOptions().header(false).label_column(2)); });
  EXPECT_TRUE(Contains(message, "label_column: 2 is out of range for the 2 columns of " + path));
}

TEST_F(ReadCsv, HeaderOnly) {
  auto message = data_error("a,label\n");
  EXPECT_TRUE(Contains(message, (dir_ / "data.csv").string() + ": no data rows"));
}

TEST_F(ReadCsv, MissingFile) {
  auto path = (dir_ / "absent.csv").string();
  auto message = error_message<DataError>([&] { read_csv(path); });
  EXPECT_TRUE(Contains(message, path + ": no such file"));
}

TEST_F(ReadCsv, TextLabelsAreClassNamesNumberedInSortedOrder) {
  auto path = write("sepal,petal,species\n5.1,1.4,setosa\n7.0,4.7,versicolor\n4.9,1.4,setosa\n6.3,6.0,virginica\n");
  const LabelledDataset iris = read_csv_classes(path, CsvOptions().label_name("species").text_labels(true));
  EXPECT_EQ(iris.classes, (std::vector<std::string>{"setosa", "versicolor", "virginica"}));
  EXPECT_TRUE(torch::equal(everything(iris.dataset).target, torch::tensor({0, 1, 0, 2}, torch::kLong)));
  const std::vector<std::string> reversed{"virginica", "versicolor", "setosa"};  // an evaluation file's
  const LabelledDataset evaluated =
      read_csv_classes(path, CsvOptions().label_name("species").text_labels(true).class_names(reversed));
  EXPECT_EQ(evaluated.classes, reversed);
  EXPECT_TRUE(torch::equal(everything(evaluated.dataset).target, torch::tensor({2, 1, 2, 0}, torch::kLong)));
  const std::string message = error_message<DataError>([&] {
    read_csv_classes(path, CsvOptions().label_name("species").text_labels(true).class_names({"setosa"}));
  });
  EXPECT_TRUE(Contains(message, path + ":3:3: label 'versicolor' is not one of the training set's 1 classes"));
  auto skipped = std::make_shared<SkippedInputs>();
  const LabelledDataset kept = read_csv_classes(
      path, CsvOptions().label_name("species").text_labels(true).class_names({"setosa"}).skipped(skipped));
  EXPECT_EQ(kept.dataset->size(), 2);
  EXPECT_EQ(skipped->lines().size(), 2u);
}

TEST_F(ReadCsv, ATableOfTextLabelsHasAHeaderOnlyWhereItNamesNumberColumns) {
  const std::string headed = write("sepal,petal,species\n5.1,1.4,setosa\n7.0,4.7,versicolor\n");
  EXPECT_EQ(read_csv_header(headed, ','), (std::vector<std::string>{"sepal", "petal", "species"}));
  const std::string bare = write("5.1,1.4,setosa\n7.0,4.7,versicolor\n6.3,6.0,virginica\n");
  EXPECT_TRUE(read_csv_header(bare, ',').empty());
  const LabelledDataset table = load_csv_table(bare);  // no header, the last column, names
  EXPECT_EQ(table.classes, (std::vector<std::string>{"setosa", "versicolor", "virginica"}));
  EXPECT_EQ(table.dataset->size(), 3);
  EXPECT_TRUE(torch::equal(everything(table.dataset).input, torch::tensor({5.1f, 1.4f, 7.0f, 4.7f, 6.3f, 6.0f}).view({3, 2})));
  const LabelledDataset numbered = load_csv_table(write("a,b,label\n1,2,1\n3,4,0\n"));
  EXPECT_EQ(numbered.classes, (std::vector<std::string>{"0", "1"}));  // integer labels stay class indices
  // A first row shorter than the header (the label column beyond it) is the ragged row it is.
  const std::string ragged = write("x,y,z,label\n1,2\n");
  EXPECT_TRUE(Contains(error_message<DataError>([&] { load_csv_table(ragged); }), ragged + ":2: expected 4 fields, got 2"));
}

}  // namespace
}  // namespace afterburner::data
