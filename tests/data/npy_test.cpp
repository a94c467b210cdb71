#include <gtest/gtest.h>
#include <torch/torch.h>
#include <zip.h>

#include "afterburner/core/error.h"
#include "afterburner/data/cifar.h"
#include "afterburner/data/npy.h"
#include "afterburner/data/sources.h"
#include "testing.h"

using afterburner::testing::Contains;
using afterburner::testing::error_message;

namespace afterburner::data {
namespace {

using testing::TempDir;

// An .npy file written from the format's description: magic, version, little-endian header length,
// the header dict padded with spaces to a multiple of 64 bytes and a newline, then the data.
std::string npy_file(std::string header, const std::string& data, int version = 1) {
  const size_t prefix = version == 1 ? 10 : 12;
  header.append(63 - (prefix + header.size()) % 64, ' ');
  header += '\n';
  std::string bytes = std::string("\x93NUMPY", 6) + static_cast<char>(version) + '\0';
  for (size_t i = 0; i < prefix - 8; ++i) bytes.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xFF));
  return bytes + header + data;
}

std::string npy(const std::string& descr, const std::string& shape, const std::string& data, bool fortran = false,
                int version = 1) {
  return npy_file("{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") + ", 'shape': " +
                      shape + ", }",
                  data, version);
}

template <typename T>
std::string raw(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

torch::Tensor parsed(const std::string& bytes) {
  TempDir dir;
  testing::write_file(dir / "a.npy", bytes);
  return read_npy((dir / "a.npy").string());
}

TEST(Npy, ReadsEveryTypeOrderAndVersion) {
  EXPECT_TRUE(torch::equal(parsed(npy("|u1", "(2, 3)", raw<uint8_t>({1, 2, 3, 4, 5, 250}))),
                           torch::tensor({1, 2, 3, 4, 5, 250}, torch::kByte).reshape({2, 3})));
  EXPECT_TRUE(torch::equal(parsed(npy("<i8", "(3,)", raw<int64_t>({-1, 0, int64_t{1} << 40}), false, 2)),
                           torch::tensor({int64_t{-1}, int64_t{0}, int64_t{1} << 40})));
  EXPECT_TRUE(torch::equal(parsed(npy(">i4", "(2,)", std::string("\x00\x00\x01\x02\xff\xff\xff\xfe", 8))),
                           torch::tensor({258, -2}, torch::kInt)));
  EXPECT_TRUE(torch::equal(parsed(npy("<f4", "(2, 3)", raw<float>({1, 2, 3, 4, 5, 6}), /*fortran=*/true)),
                           torch::tensor({1.f, 3.f, 5.f, 2.f, 4.f, 6.f}).reshape({2, 3})));
  EXPECT_TRUE(torch::equal(parsed(npy("|b1", "(2,)", std::string("\x01\x00", 2))), torch::tensor({true, false})));
  EXPECT_EQ(parsed(npy("<f8", "()", raw<double>({2.5}))).item<double>(), 2.5);
  EXPECT_EQ(parsed(npy("<f8", "(0, 4)", "")).sizes(), (std::vector<int64_t>{0, 4}));
}

TEST(Npy, BadFilesAreOneLineNamingThem) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"PK\x03\x04 not npy", "not a .npy array (bad magic)"},
      {npy("<c16", "(1,)", std::string(16, '\0')), "dtype '<c16' is not read"},
      {npy("<u4", "(1,)", std::string(4, '\0')), "dtype '<u4' is not read"},
      {npy("|u1", "(2, 3)", "12345"), "truncated data"},
      {npy("|u1", "(2,)", "123"), "trailing data"},
      {npy("|u1", "(4294967296, 4294967296)", "1"), "truncated data"},
      {npy("|u1", "(2, x)", "12"), "bad .npy header: shape (2, x)"},
      {std::string("\x93NUMPY\x01\x00\xff\x00{}", 12), "truncated .npy header"},
  };
  for (const auto& [content, problem] : cases) {
    const std::string& bytes = content;  // a structured binding cannot be captured in C++17
    const std::string message = error_message<DataError>([&] { parsed(bytes); });
    EXPECT_TRUE(Contains(message, "a.npy: " + problem));
  }
  const std::string structured = npy_file("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }",
                                          std::string(4, '\0'));
  EXPECT_TRUE(Contains(error_message<DataError>([&] { parsed(structured); }), "structured arrays are not"));
}

void write_npz(const std::filesystem::path& path, const std::vector<std::pair<std::string, std::string>>& entries) {
  int error = 0;
  zip_t* archive = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &error);
  ASSERT_NE(archive, nullptr);
  for (const auto& [name, bytes] : entries) {
    zip_source_t* source = zip_source_buffer(archive, bytes.data(), bytes.size(), 0);
    ASSERT_GE(zip_file_add(archive, (name + ".npy").c_str(), source, ZIP_FL_OVERWRITE), 0);
  }
  ASSERT_EQ(zip_close(archive), 0);
}

TEST(ArrayImages, KerasLayoutInAnArchiveOrAFolder) {
  TempDir dir;
  const std::string nhwc = npy("|u1", "(2, 2, 2, 3)", raw(std::vector<uint8_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                                                              12, 13, 14, 15, 16, 17, 18, 19, 20,
                                                                              21, 22, 23}));
  const std::string labels = npy("<i8", "(2,)", raw<int64_t>({4, 1}));
  const std::string test_images = npy("|u1", "(1, 2, 2)", raw<uint8_t>({9, 8, 7, 6}));
  const std::string test_labels = npy("|u1", "(1,)", raw<uint8_t>({2}));
  write_npz(dir / "set.npz", {{"x_train", nhwc}, {"y_train", labels}, {"x_test", test_images}, {"y_test", test_labels}});
  const LabelledDataset train = load_array_images((dir / "set.npz").string(), Split::train);
  EXPECT_EQ(train.classes.size(), 5u);
  const Batch batch = train.dataset->get_batch(torch::arange(2));
  EXPECT_TRUE(torch::equal(batch.input, torch::arange(24, torch::kByte).reshape({2, 2, 2, 3}).permute({0, 3, 1, 2})));
  EXPECT_TRUE(torch::equal(batch.target, torch::tensor({4, 1}, torch::kLong)));
  const LabelledDataset test = load_array_images((dir / "set.npz").string(), Split::test);
  EXPECT_EQ(test.classes.size(), 5u);  // counted on the training labels
  EXPECT_EQ(test.dataset->get_batch(torch::arange(1)).input.sizes(), (std::vector<int64_t>{1, 1, 2, 2}));
  EXPECT_EQ(detect_data_format((dir / "set.npz").string()), DataFormat::npy);

  std::filesystem::create_directory(dir / "arrays");
  testing::write_file(dir / "arrays" / "x_train.npy", nhwc);
  testing::write_file(dir / "arrays" / "y_train.npy", npy("<f4", "(2,)", raw<float>({1, 0})));
  EXPECT_EQ(detect_data_format((dir / "arrays").string()), DataFormat::npy);
  EXPECT_TRUE(Contains(error_message<DataError>([&] { load_array_images((dir / "arrays").string(), Split::train); }),
                       "y_train.npy: labels must be a 1-D integer array, got Float [2]"));
  testing::write_file(dir / "arrays" / "y_train.npy", labels);
  testing::write_file(dir / "arrays" / "x_train.npy", npy("|u1", "(2, 3, 2)", std::string(12, '\0')));
  EXPECT_TRUE(Contains(error_message<DataError>([&] { load_array_images((dir / "arrays").string(), Split::train); }),
                       "x_train.npy: images of shape [2, 3, 2]"));
}

std::string cifar_record(int coarse, int fine, uint8_t pixel, bool hundred) {
  std::string record;
  if (hundred) record.push_back(static_cast<char>(coarse));
  record.push_back(static_cast<char>(fine));
  return record + std::string(3072, static_cast<char>(pixel));
}

TEST(Cifar, TenAndHundredClassesAndTheirNames) {
  TempDir ten, hundred;
  testing::write_file(ten / "data_batch_1.bin", cifar_record(0, 3, 7, false) + cifar_record(0, 9, 8, false));
  testing::write_file(ten / "data_batch_2.bin", cifar_record(0, 1, 9, false));
  testing::write_file(ten / "test_batch.bin", cifar_record(0, 0, 1, false));
  testing::write_file(ten / "batches.meta.txt", "airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n\n");
  EXPECT_EQ(detect_data_format(ten.path().string()), DataFormat::cifar);
  const LabelledDataset train = load_cifar(ten.path().string(), Split::train);
  const Batch batch = train.dataset->get_batch(torch::arange(3));
  EXPECT_TRUE(torch::equal(batch.target, torch::tensor({3, 9, 1}, torch::kLong)));
  EXPECT_EQ(batch.input.sizes(), (std::vector<int64_t>{3, 3, 32, 32}));
  EXPECT_EQ(batch.input[2].min().item<int>(), 9);
  EXPECT_EQ(train.classes[3], "cat");
  EXPECT_EQ(load_cifar(ten.path().string(), Split::test).dataset->size(), 1);

  testing::write_file(hundred / "train.bin", cifar_record(19, 99, 1, true) + cifar_record(2, 42, 2, true));
  const LabelledDataset fine = load_cifar(hundred.path().string(), Split::train);
  EXPECT_TRUE(torch::equal(fine.dataset->get_batch(torch::arange(2)).target, torch::tensor({99, 42}, torch::kLong)));
  EXPECT_EQ(fine.classes.size(), 100u);
  EXPECT_EQ(fine.classes[42], "42");  // no fine_label_names.txt: numbered
  EXPECT_TRUE(Contains(error_message<DataError>([&] { load_cifar(hundred.path().string(), Split::test); }),
                       "test.bin: no such file"));
  testing::write_file(hundred / "train.bin", cifar_record(1, 100, 0, true));
  EXPECT_TRUE(Contains(error_message<DataError>([&] { load_cifar(hundred.path().string(), Split::train); }),
                       "train.bin: label 100 at index 0 is outside"));
}

TEST(Sources, FormatsByNameAndDetection) {
  for (DataFormat format : {DataFormat::idx, DataFormat::folder, DataFormat::cifar, DataFormat::npy}) {
    EXPECT_EQ(parse_data_format(data_format_name(format)), format);
  }
  EXPECT_TRUE(Contains(error_message<UsageError>([] { parse_data_format("jpeg"); }), "--data-format: 'jpeg'"));
  EXPECT_EQ(detect_data_format(testing::fashion_mnist_dir().string()), DataFormat::idx);
  TempDir dir;
  EXPECT_TRUE(Contains(error_message<DataError>([&] { detect_data_format(dir.path().string()); }), "no dataset found"));
  std::filesystem::create_directories(dir / "train" / "a");
  std::filesystem::create_directories(dir / "val" / "a");
  EXPECT_EQ(detect_data_format(dir.path().string()), DataFormat::folder);
  EXPECT_TRUE(has_split_folders(dir.path().string()));
  EXPECT_FALSE(has_split_folders((dir / "train").string()));
  EXPECT_TRUE(Contains(error_message<UsageError>([] {
                         load_images(testing::fashion_mnist_dir().string(), DataFormat::idx, Split::test,
                                     SourceOptions().image_size(32));
                       }),
                       "--image-size: "));
}

}  // namespace
}  // namespace afterburner::data
