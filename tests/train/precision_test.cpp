#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/autocast_mode.h>

#include "afterburner/core/error.h"
#include "afterburner/train/precision.h"

namespace afterburner::train {

TEST(Precision, ParsesNamesAndRejectsOthers) {
  EXPECT_EQ(parse_precision("bf16"), Precision::bf16);
  EXPECT_EQ(to_string(parse_precision("fp32")), "fp32");
  EXPECT_THROW(parse_precision("int4"), UsageError);
}

TEST(Precision, Fp16OnCpuIsRefusedWithOneLine) {
  try {
    check_precision_supported(Precision::fp16, torch::kCPU);
    FAIL();
  } catch (const UsageError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("fp16"), std::string::npos);
    EXPECT_EQ(what.find('\n'), std::string::npos);
  }
}

TEST(AutocastGuard, Bf16RunsMatmulsInBf16AndRestoresState) {
  auto a = torch::randn({8, 8});
  {
    AutocastGuard guard(Precision::bf16);
    EXPECT_TRUE(at::autocast::is_cpu_enabled());
    EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kBFloat16);
  }
  EXPECT_FALSE(at::autocast::is_cpu_enabled());
  EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat);
}

TEST(AutocastGuard, Fp32IsANoOp) {
  AutocastGuard guard(Precision::fp32);
  EXPECT_FALSE(at::autocast::is_cpu_enabled());
}

// A one-parameter problem lets every scaler decision be checked by hand.
struct ScalerFixture : ::testing::Test {
  torch::Tensor w = torch::ones({2}, torch::requires_grad());
  torch::optim::SGD sgd{{w}, torch::optim::SGDOptions(0.1)};

  void backward_with_grad(torch::Tensor grad, GradScaler& scaler) {
    sgd.zero_grad();
    // d(loss)/dw = grad, scaled as the scaler would scale a real loss.
    scaler.scale((w * grad).sum()).backward();
  }
};

TEST_F(ScalerFixture, UnscalesBeforeTheStep) {
  GradScaler scaler(GradScalerOptions().init_scale(1024));
  backward_with_grad(torch::tensor({1.0f, -2.0f}), scaler);
  EXPECT_FLOAT_EQ(w.grad()[0].item<float>(), 1024.0f);
  scaler.unscale(sgd);
  EXPECT_FLOAT_EQ(w.grad()[1].item<float>(), -2.0f);
  EXPECT_TRUE(scaler.step(sgd));  // does not unscale twice
  EXPECT_TRUE(torch::allclose(w, torch::tensor({0.9f, 1.2f})));
  scaler.update();
  EXPECT_EQ(scaler.current_scale(), 1024);
  EXPECT_EQ(scaler.growth_tracker(), 1);
}

TEST_F(ScalerFixture, SkipsTheStepAndBacksOffOnInfOrNan) {
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    GradScaler scaler(GradScalerOptions().init_scale(256).backoff_factor(0.25));
    auto before = w.detach().clone();
    backward_with_grad(torch::tensor({1.0f, bad}), scaler);
    EXPECT_FALSE(scaler.step(sgd));
    EXPECT_TRUE(torch::equal(w.detach(), before)) << "weights changed on a skipped step";
    scaler.update();
    EXPECT_EQ(scaler.current_scale(), 64);
    EXPECT_EQ(scaler.growth_tracker(), 0);
  }
}

TEST_F(ScalerFixture, GrowsAfterTheIntervalOfCleanSteps) {
  GradScaler scaler(GradScalerOptions().init_scale(8).growth_interval(3).growth_factor(2));
  for (int i = 0; i < 3; ++i) {
    backward_with_grad(torch::tensor({0.5f, 0.5f}), scaler);
    EXPECT_TRUE(scaler.step(sgd));
    scaler.update();
  }
  EXPECT_EQ(scaler.current_scale(), 16);
  EXPECT_EQ(scaler.growth_tracker(), 0);
}

TEST_F(ScalerFixture, StateRoundTripsThroughAnArchive) {
  GradScaler scaler(GradScalerOptions().init_scale(8).growth_interval(5));
  backward_with_grad(torch::tensor({0.5f, 0.5f}), scaler);
  scaler.step(sgd);
  scaler.update();
  torch::serialize::OutputArchive out;
  scaler.save(out);
  std::ostringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  std::istringstream read(bytes.str());
  in.load_from(read);
  GradScaler restored;
  restored.load(in);
  EXPECT_EQ(restored.current_scale(), 8);
  EXPECT_EQ(restored.growth_tracker(), 1);
}

TEST_F(ScalerFixture, DisabledScalerIsTransparent) {
  GradScaler scaler(GradScalerOptions().enabled(false));
  backward_with_grad(torch::tensor({1.0f, 1.0f}), scaler);
  EXPECT_FLOAT_EQ(w.grad()[0].item<float>(), 1.0f);
  EXPECT_TRUE(scaler.step(sgd));
}

}  // namespace afterburner::train
