#include <gtest/gtest.h>
#include <torch/torch.h>

#include "afterburner/core/blas.h"
#include "afterburner/core/threads.h"

namespace afterburner {

TEST(Blas, DetectsTheLibraryTorchUses) {
  torch::mm(torch::ones({8, 8}), torch::ones({8, 8}));  // make sure BLAS is resolved
  BlasInfo info = detect_blas();
  // install-deps.sh installs OpenBLAS: anything else here means the detection or the set-up is wrong.
  EXPECT_EQ(info.name, "OpenBLAS") << info.detail;
  EXPECT_FALSE(info.is_reference);
}

TEST(Blas, WarningNamesTheFix) {
  BlasInfo reference{"reference", "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3", true};
  std::string line = blas_warning(reference);
  EXPECT_NE(line.find("libopenblas0-pthread"), std::string::npos);
  EXPECT_NE(line.find(reference.detail), std::string::npos);
  EXPECT_EQ(line.find('\n'), std::string::npos);
}

TEST(ThreadsGuard, RestoresThePreviousCount) {
  int before = at::get_num_threads();
  {
    ThreadsGuard guard(1);
    EXPECT_EQ(at::get_num_threads(), 1);
  }
  EXPECT_EQ(at::get_num_threads(), before);
}

// OpenBLAS keeps a pool of its own that at::set_num_threads does not reach.
TEST(ThreadsGuard, GovernsOpenBlasToo) {
  torch::mm(torch::ones({8, 8}), torch::ones({8, 8}));
  const int before = blas_threads();
  ASSERT_GT(before, 0) << "OpenBLAS is not the BLAS loaded";
  {
    ThreadsGuard guard(1);
    EXPECT_EQ(blas_threads(), 1);
    {
      ThreadsGuard inner(2);
      EXPECT_EQ(blas_threads(), 2);
    }
    EXPECT_EQ(blas_threads(), 1);
  }
  EXPECT_EQ(blas_threads(), before);
}

}  // namespace afterburner
