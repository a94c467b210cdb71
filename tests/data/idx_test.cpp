#include <gtest/gtest.h>
#include <torch/torch.h>
#include <zlib.h>

#include "afterburner/core/error.h"
#include "afterburner/data/idx.h"
#include "testing.h"

using afterburner::testing::Contains;
using afterburner::testing::error_message;

namespace afterburner::data {
namespace {

using testing::TempDir;

// An IDX file written byte by byte from the format description: two zero bytes, the type
// code, the dimension count, big-endian uint32 dimensions, big-endian elements.
std::string idx_file(unsigned char type, const std::vector<uint32_t>& dims, const std::string& payload) {
  std::string bytes{'\0', '\0', static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t dim : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<char>((dim >> shift) & 0xFF));
  }
  return bytes + payload;
}

template <typename T>
std::string big_endian(const std::vector<T>& values) {
  std::string bytes;
  for (T value : values) {
    unsigned char raw[sizeof(T)];
    std::memcpy(raw, &value, sizeof(T));
    for (size_t i = sizeof(T); i-- > 0;) bytes.push_back(static_cast<char>(raw[i]));  // host is little-endian
  }
  return bytes;
}

void write_gz(const std::filesystem::path& path, const std::string& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr);
  ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(file), Z_OK);
}

std::string read_idx_error(const std::filesystem::path& path) {
  return error_message<DataError>([&] { read_idx(path.string()); });
}

class IdxRoundTrip : public ::testing::TestWithParam<bool> {
 protected:
  // Writes raw or gzip-compressed depending on the parameter.
  std::filesystem::path write(const std::string& name, const std::string& bytes) {
    auto path = dir_ / (GetParam() ? name + ".gz" : name);
    if (GetParam()) {
      write_gz(path, bytes);
    } else {
      testing::write_file(path, bytes);
    }
    return path;
  }
  TempDir dir_;
};

TEST_P(IdxRoundTrip, Uint8) {
  std::vector<uint8_t> values(3 * 4 * 5);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint8_t>(i * 7);
  auto path = write("bytes", idx_file(0x08, {3, 4, 5}, std::string(values.begin(), values.end())));
  torch::Tensor tensor = read_idx(path.string());
  ASSERT_EQ(tensor.scalar_type(), torch::kByte);
  ASSERT_EQ(tensor.sizes(), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(std::memcmp(tensor.data_ptr(), values.data(), values.size()), 0);
}

TEST_P(IdxRoundTrip, Int8) {
  std::vector<int8_t> values{-128, -1, 0, 1, 127};
  torch::Tensor tensor = read_idx(write("int8", idx_file(0x09, {5}, big_endian(values))).string());
  ASSERT_EQ(tensor.scalar_type(), torch::kChar);
  EXPECT_TRUE(torch::equal(tensor, torch::tensor({-128, -1, 0, 1, 127}, torch::kChar)));
}

TEST_P(IdxRoundTrip, Int16) {
  std::vector<int16_t> values{-32768, -2, 258, 32767};
  torch::Tensor tensor = read_idx(write("int16", idx_file(0x0B, {2, 2}, big_endian(values))).string());
  ASSERT_EQ(tensor.scalar_type(), torch::kShort);
  EXPECT_TRUE(torch::equal(tensor, torch::tensor({-32768, -2, 258, 32767}, torch::kShort).view({2, 2})));
}

TEST_P(IdxRoundTrip, Int32) {
  std::vector<int32_t> values{INT32_MIN, -70000, 16909060, INT32_MAX};
  torch::Tensor tensor = read_idx(write("int32", idx_file(0x0C, {4}, big_endian(values))).string());
  ASSERT_EQ(tensor.scalar_type(), torch::kInt);
  EXPECT_TRUE(torch::equal(tensor, torch::tensor({INT32_MIN, -70000, 16909060, INT32_MAX}, torch::kInt)));
}

TEST_P(IdxRoundTrip, Float32) {
  std::vector<float> values{-1.5f, 0.0f, 3.25e-7f, 6.5e12f, 1.0f / 3.0f, -0.0f};
  torch::Tensor tensor = read_idx(write("float32", idx_file(0x0D, {1, 2, 3}, big_endian(values))).string());
  ASSERT_EQ(tensor.scalar_type(), torch::kFloat);
  ASSERT_EQ(tensor.sizes(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(std::memcmp(tensor.data_ptr(), values.data(), values.size() * sizeof(float)), 0);
}

TEST_P(IdxRoundTrip, Float64) {
  std::vector<double> values{-2.5, 1e-300, 1.0 / 7.0};
  torch::Tensor tensor = read_idx(write("float64", idx_file(0x0E, {3}, big_endian(values))).string());
  ASSERT_EQ(tensor.scalar_type(), torch::kDouble);
  EXPECT_EQ(std::memcmp(tensor.data_ptr(), values.data(), values.size() * sizeof(double)), 0);
}

INSTANTIATE_TEST_SUITE_P(RawAndGzip, IdxRoundTrip, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "gzip" : "raw"; });

TEST(ReadIdx, MissingFile) {
  TempDir dir;
  auto message = read_idx_error(dir / "absent-idx1-ubyte");
  EXPECT_TRUE(Contains(message, (dir / "absent-idx1-ubyte").string()));
  EXPECT_TRUE(Contains(message, "no such file"));
}

TEST(ReadIdx, BadMagic) {
  TempDir dir;
  testing::write_file(dir / "bad", "\x01\x02\x08\x01" + std::string(4, '\0'));
  auto message = read_idx_error(dir / "bad");
  EXPECT_TRUE(Contains(message, (dir / "bad").string()));
  EXPECT_TRUE(Contains(message, "bad magic 0x01020801"));
}

TEST(ReadIdx, UnknownElementType) {
  TempDir dir;
  testing::write_file(dir / "type", idx_file(0x0A, {1}, "x"));
  auto message = read_idx_error(dir / "type");
  EXPECT_TRUE(Contains(message, (dir / "type").string()));
  EXPECT_TRUE(Contains(message, "unknown IDX element type 0x0a"));
}

TEST(ReadIdx, ZeroDimensions) {
  TempDir dir;
  testing::write_file(dir / "scalar", idx_file(0x08, {}, "x"));
  auto message = read_idx_error(dir / "scalar");
  EXPECT_TRUE(Contains(message, (dir / "scalar").string()));
  EXPECT_TRUE(Contains(message, "0 dimensions"));
}

TEST(ReadIdx, TruncatedHeader) {
  TempDir dir;
  testing::write_file(dir / "short", idx_file(0x08, {2, 3}, "").substr(0, 9));
  auto message = read_idx_error(dir / "short");
  EXPECT_TRUE(Contains(message, (dir / "short").string()));
  EXPECT_TRUE(Contains(message, "truncated header: expected 8 bytes, got 5"));
}

TEST(ReadIdx, TruncatedDataRaw) {
  TempDir dir;
  testing::write_file(dir / "short", idx_file(0x0C, {4}, std::string(15, 'x')));
  auto message = read_idx_error(dir / "short");
  EXPECT_TRUE(Contains(message, (dir / "short").string()));
  EXPECT_TRUE(Contains(message, "truncated"));
}

TEST(ReadIdx, TruncatedDataGzip) {
  TempDir dir;
  write_gz(dir / "short.gz", idx_file(0x08, {10, 10}, std::string(99, 'x')));
  auto message = read_idx_error(dir / "short.gz");
  EXPECT_TRUE(Contains(message, (dir / "short.gz").string()));
  EXPECT_TRUE(Contains(message, "truncated data: expected 100 bytes, got 99"));
}

TEST(ReadIdx, HugeDimensionsAreRejectedBeforeAllocating) {
  TempDir dir;
  testing::write_file(dir / "huge", idx_file(0x0E, {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}, "12345678"));
  auto message = read_idx_error(dir / "huge");
  EXPECT_TRUE(Contains(message, (dir / "huge").string()));
  EXPECT_TRUE(Contains(message, "truncated data"));
}

TEST(ReadIdx, TrailingBytes) {
  TempDir dir;
  testing::write_file(dir / "long", idx_file(0x08, {2}, "abc"));
  auto message = read_idx_error(dir / "long");
  EXPECT_TRUE(Contains(message, (dir / "long").string()));
  EXPECT_TRUE(Contains(message, "unexpected bytes after the data"));
}

std::string compressed(const std::string& bytes) {
  TempDir dir;
  write_gz(dir / "tmp.gz", bytes);
  return testing::read_file(dir / "tmp.gz");
}

TEST(ReadIdx, CorruptGzipChecksum) {
  TempDir dir;
  std::string gz = compressed(idx_file(0x08, {1000}, std::string(1000, 'a')));
  gz[gz.size() - 8] ^= 0x5A;  // the CRC-32 of the trailer
  testing::write_file(dir / "crc.gz", gz);
  auto message = read_idx_error(dir / "crc.gz");
  EXPECT_TRUE(Contains(message, (dir / "crc.gz").string()));
  EXPECT_TRUE(Contains(message, "corrupt gzip data"));
}

TEST(ReadIdx, CorruptGzipStream) {
  TempDir dir;
  std::string payload;
  for (int i = 0; i < 5000; ++i) payload.push_back(static_cast<char>((i * 7919) % 251));
  std::string gz = compressed(idx_file(0x08, {5000}, payload));
  for (size_t i = 20; i < 60; ++i) gz[i] = static_cast<char>(0xFF);  // inside the deflate stream
  testing::write_file(dir / "stream.gz", gz);
  auto message = read_idx_error(dir / "stream.gz");
  EXPECT_TRUE(Contains(message, (dir / "stream.gz").string()));
  EXPECT_TRUE(Contains(message, "corrupt gzip data"));
}

TEST(ReadIdx, CutGzipStream) {
  TempDir dir;
  std::string payload;
  for (int i = 0; i < 5000; ++i) payload.push_back(static_cast<char>((i * 7919) % 251));
  std::string gz = compressed(idx_file(0x08, {5000}, payload));
  testing::write_file(dir / "cut.gz", gz.substr(0, gz.size() / 2));
  auto message = read_idx_error(dir / "cut.gz");
  EXPECT_TRUE(Contains(message, (dir / "cut.gz").string()));
  EXPECT_TRUE(Contains(message, "corrupt gzip data"));
}

// A small MNIST-style directory: `images` of 28x28 and `labels`, either raw or gzipped.
void write_mnist(const TempDir& dir, const std::string& prefix, uint32_t images, uint32_t labels, bool gz = false) {
  std::string pixels(images * 28 * 28, '\0');
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<char>(i % 256);
  std::string classes(labels, '\0');
  for (uint32_t i = 0; i < labels; ++i) classes[i] = static_cast<char>(i % 10);
  const std::string suffix = gz ? ".gz" : "";
  auto write = [&](const std::string& name, const std::string& bytes) {
    gz ? write_gz(dir / (name + suffix), bytes) : testing::write_file(dir / name, bytes);
  };
  write(prefix + "-images-idx3-ubyte", idx_file(0x08, {images, 28, 28}, pixels));
  write(prefix + "-labels-idx1-ubyte", idx_file(0x08, {labels}, classes));
}

TEST(LoadMnist, ReadsASmallDirectory) {
  TempDir dir;
  write_mnist(dir, "t10k", 3, 3);
  DatasetPtr dataset = load_mnist(dir.path().string(), Split::test);
  ASSERT_EQ(dataset->size(), 3);
  Batch all = dataset->get_batch(torch::arange(3));
  EXPECT_EQ(all.input.sizes(), (std::vector<int64_t>{3, 1, 28, 28}));
  EXPECT_EQ(all.input.scalar_type(), torch::kByte);
  EXPECT_EQ(all.input[1][0][0][0].item<int>(), 784 % 256);
  EXPECT_TRUE(torch::equal(all.target, torch::tensor({0, 1, 2}, torch::kLong)));
}

TEST(LoadMnist, PrefersTheRawFileOverTheGzip) {
  TempDir dir;
  write_mnist(dir, "train", 2, 2);
  write_mnist(dir, "train", 5, 5, /*gz=*/true);
  EXPECT_EQ(load_mnist(dir.path().string(), Split::train)->size(), 2);
  std::filesystem::remove(dir / "train-images-idx3-ubyte");
  std::filesystem::remove(dir / "train-labels-idx1-ubyte");
  EXPECT_EQ(load_mnist(dir.path().string(), Split::train)->size(), 5);
}

TEST(LoadMnist, MissingFilesNameThePath) {
  TempDir dir;
  auto message = error_message<DataError>([&] { load_mnist(dir.path().string(), Split::train); });
  EXPECT_TRUE(Contains(message, (dir / "train-images-idx3-ubyte").string()));
  EXPECT_TRUE(Contains(message, "no such file"));
}

TEST(LoadMnist, CountMismatch) {
  TempDir dir;
  write_mnist(dir, "train", 3, 2);
  auto message = error_message<DataError>([&] { load_mnist(dir.path().string(), Split::train); });
  EXPECT_TRUE(Contains(message, (dir / "train-labels-idx1-ubyte").string()));
  EXPECT_TRUE(Contains(message, "2 labels for 3 images"));
}

TEST(LoadMnist, WrongImageDimensions) {
  TempDir dir;
  write_mnist(dir, "train", 2, 2);
  testing::write_file(dir / "train-images-idx3-ubyte", idx_file(0x08, {2, 784}, std::string(2 * 784, 'x')));
  auto message = error_message<DataError>([&] { load_mnist(dir.path().string(), Split::train); });
  EXPECT_TRUE(Contains(message, (dir / "train-images-idx3-ubyte").string()));
  EXPECT_TRUE(Contains(message, "expected uint8 images [N, 28, 28]"));
}

TEST(LoadMnist, WrongLabelDimensions) {
  TempDir dir;
  write_mnist(dir, "train", 2, 2);
  testing::write_file(dir / "train-labels-idx1-ubyte", idx_file(0x08, {2, 1}, "ab"));
  auto message = error_message<DataError>([&] { load_mnist(dir.path().string(), Split::train); });
  EXPECT_TRUE(Contains(message, (dir / "train-labels-idx1-ubyte").string()));
  EXPECT_TRUE(Contains(message, "expected uint8 labels [N]"));
}

// One corrupt byte in a labels file: label 200 for a 10-class model.
TEST(LoadMnist, LabelOutsideTheModelsClassesNamesFileIndexAndValue) {
  TempDir dir;
  write_mnist(dir, "t10k", 20, 20, /*gz=*/true);
  std::string labels(20, '\0');
  for (int i = 0; i < 20; ++i) labels[i] = static_cast<char>(i % 10);
  labels[17] = static_cast<char>(200);
  const auto path = dir / "t10k-labels-idx1-ubyte.gz";
  write_gz(path, idx_file(0x08, {20}, labels));
  EXPECT_EQ(error_message<DataError>([&] { load_mnist(dir.path().string(), Split::test, 10); }),
            path.string() + ": label 200 at index 17 is outside the model's 10 classes");
  EXPECT_EQ(error_message<DataError>([&] { load_mnist(dir.path().string(), Split::test, 7); }),
            path.string() + ": label 7 at index 7 is outside the model's 7 classes");
  // Without a model there is nothing to check against: any uint8 is a label.
  auto unchecked = load_mnist(dir.path().string(), Split::test);
  EXPECT_EQ(unchecked->get_batch(torch::tensor({17}, torch::kLong)).target.item<int64_t>(), 200);
}

// The decompressed bytes of a gzip file, read with zlib alone.
std::string gunzip(const std::filesystem::path& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  std::string bytes;
  char buffer[1 << 16];
  for (int got; (got = gzread(file, buffer, sizeof buffer)) > 0;) bytes.append(buffer, got);
  gzclose(file);
  return bytes;
}

class FashionMnist : public ::testing::TestWithParam<Split> {};

TEST_P(FashionMnist, MatchesTheFiles) {
  const bool train = GetParam() == Split::train;
  const int64_t count = train ? 60000 : 10000;
  DatasetPtr dataset = load_mnist(testing::fashion_mnist_dir().string(), GetParam());
  ASSERT_EQ(dataset->size(), count);
  Batch all = dataset->get_batch(torch::arange(count));
  ASSERT_EQ(all.input.sizes(), (std::vector<int64_t>{count, 1, 28, 28}));
  ASSERT_EQ(all.target.scalar_type(), torch::kLong);

  // Fashion-MNIST is balanced: a tenth of each split in each of the 10 classes.
  EXPECT_GE(all.target.min().item<int64_t>(), 0);
  EXPECT_LE(all.target.max().item<int64_t>(), 9);
  EXPECT_TRUE(torch::equal(torch::bincount(all.target), torch::full({10}, count / 10, torch::kLong)));
  // Both splits start with an ankle boot (class 9), checked with Python's gzip module.
  EXPECT_EQ(all.target[0].item<int64_t>(), 9);

  // The pixels are the file's bytes after its 16-byte header.
  const std::string prefix = train ? "train" : "t10k";
  std::string images = gunzip(testing::fashion_mnist_dir() / (prefix + "-images-idx3-ubyte.gz"));
  ASSERT_EQ(static_cast<int64_t>(images.size()), 16 + count * 784);
  EXPECT_EQ(std::memcmp(all.input.data_ptr(), images.data() + 16, count * 784), 0);
}

INSTANTIATE_TEST_SUITE_P(Splits, FashionMnist, ::testing::Values(Split::train, Split::test),
                         [](const auto& info) { return info.param == Split::train ? "train" : "test"; });

}  // namespace
}  // namespace afterburner::data
