#include "afterburner/serve/protocol.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <tuple>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "testing.h"

namespace afterburner::serve {
namespace {

using afterburner::testing::Contains;

ModelConfig model_config(DataType datatype = DataType::FP32, std::vector<int64_t> dims = {1, 28, 28}) {
  ModelConfig config;
  config.name = "cnn";
  config.max_batch_size = 8;
  config.inputs = {{"input", datatype, std::move(dims)}};
  config.outputs = {{"output", DataType::FP32, {10}}, {"features", DataType::INT64, {2}}};
  return config;
}

InferRequest parse(std::string body, const ModelConfig& config = model_config(),
                   std::optional<std::size_t> json_length = std::nullopt) {
  return parse_infer_request(body, json_length, config);
}

RequestError parse_error(const std::string& body, const ModelConfig& config = model_config(),
                         std::optional<std::size_t> json_length = std::nullopt) {
  try {
    parse(body, config, json_length);
  } catch (const RequestError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body.substr(0, 200);
  return RequestError(0, "");
}

void expect_identical(const at::Tensor& actual, const at::Tensor& expected) {
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type());
  ASSERT_EQ(actual.sizes(), expected.sizes());
  EXPECT_TRUE(torch::equal(actual, expected));
}

at::Tensor random_of(DataType datatype, std::vector<int64_t> shape) {
  at::Tensor values = torch::randn(shape, torch::kDouble) * 50;
  if (datatype == DataType::BOOL) return values > 0;
  if (datatype == DataType::UINT8) return values.abs().to(torch::kByte);
  return values.to(scalar_type(datatype));
}

TEST(Protocol, JsonRequestRoundTripsEveryDatatypeExactly) {
  for (DataType datatype : {DataType::BOOL, DataType::UINT8, DataType::INT8, DataType::INT16, DataType::INT32,
                            DataType::INT64, DataType::FP16, DataType::FP32, DataType::FP64}) {
    SCOPED_TRACE(std::string(datatype_name(datatype)));
    at::Tensor input = random_of(datatype, {3, 2, 5});
    auto encoded = encode_infer_request({{"input", input}}, RequestOptions().id("r-7"));
    EXPECT_FALSE(encoded.json_length);
    InferRequest request = parse(encoded.body, model_config(datatype, {2, 5}));
    EXPECT_EQ(request.id, "r-7");
    EXPECT_EQ(request.batch_size, 3);
    expect_identical(request.inputs.at(0), input);
  }
}

TEST(Protocol, JsonDataMatchesAnIndependentParser) {
  at::Tensor input = torch::randn({1, 1, 28, 28});
  std::string body = encode_infer_request({{"input", input}}).body;
  auto json = nlohmann::json::parse(body);
  auto data = json["inputs"][0]["data"].get<std::vector<float>>();
  ASSERT_EQ(data.size(), 784u);
  at::Tensor flat = input.flatten();
  for (std::size_t i = 0; i < data.size(); ++i) ASSERT_EQ(data[i], flat[static_cast<int64_t>(i)].item<float>());
  EXPECT_EQ(json["inputs"][0]["shape"], nlohmann::json({1, 1, 28, 28}));
  EXPECT_EQ(json["inputs"][0]["datatype"], "FP32");
}

TEST(Protocol, NestedAndFlatDataAreTheSame) {
  std::string head = R"({"inputs":[{"name":"input","datatype":"INT32","shape":[2,3],"data":)";
  InferRequest flat = parse(head + "[1,2,3,4,5,6]}]}", model_config(DataType::INT32, {3}));
  InferRequest nested = parse(head + "[[1,2,3],[4,5,6]]}]}", model_config(DataType::INT32, {3}));
  expect_identical(flat.inputs[0], torch::arange(1, 7, torch::kInt).reshape({2, 3}));
  expect_identical(nested.inputs[0], flat.inputs[0]);
}

TEST(Protocol, FieldsMayComeInAnyOrder) {
  InferRequest request = parse(
      R"({"outputs":[{"name":"output"}],"inputs":[{"data":[1.5,2.5],"shape":[1,2],"datatype":"FP32","name":"input"}],)"
      R"("id":"x"})",
      model_config(DataType::FP32, {2}));
  EXPECT_EQ(request.id, "x");
  expect_identical(request.inputs[0], torch::tensor({{1.5f, 2.5f}}));
  ASSERT_EQ(request.outputs.size(), 1u);
  EXPECT_EQ(request.outputs[0].name, "output");
}

TEST(Protocol, BinaryInputsRoundTrip) {
  ModelConfig config = model_config(DataType::FP32, {4});
  config.inputs.push_back({"mask", DataType::UINT8, {4}});
  at::Tensor input = torch::randn({2, 4});
  at::Tensor mask = torch::randint(0, 255, {2, 4}, torch::kByte);
  auto encoded = encode_infer_request({{"mask", mask}, {"input", input}}, RequestOptions().binary_inputs(true));
  ASSERT_TRUE(encoded.json_length);
  EXPECT_EQ(encoded.body.size(), *encoded.json_length + 2 * 4 * 4 + 2 * 4);
  EXPECT_TRUE(Contains(encoded.body.substr(0, *encoded.json_length), "\"binary_data_size\":32"));
  InferRequest request = parse(encoded.body, config, encoded.json_length);
  expect_identical(request.inputs[0], input);  // config order, not request order
  expect_identical(request.inputs[1], mask);
}

TEST(Protocol, ResponseRoundTripsJson) {
  InferRequest request = parse(encode_infer_request({{"input", torch::randn({2, 1, 28, 28})}},
                                                    RequestOptions().id("abc")).body);
  ASSERT_EQ(request.outputs.size(), 2u);
  at::Tensor logits = torch::randn({2, 10});
  at::Tensor features = torch::randint(-1000, 1000, {2, 2}, torch::kLong);
  Reply reply = encode_infer_response(model_config(), request, {logits, features});
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.content_type, "application/json");
  EXPECT_TRUE(reply.headers.empty());
  auto json = nlohmann::json::parse(reply.body);
  EXPECT_EQ(json["model_name"], "cnn");
  EXPECT_EQ(json["id"], "abc");
  auto outputs = parse_infer_response(reply.body, std::nullopt);
  ASSERT_EQ(outputs.size(), 2u);
  EXPECT_EQ(outputs[0].first, "output");
  expect_identical(outputs[0].second, logits);
  EXPECT_EQ(outputs[1].first, "features");
  expect_identical(outputs[1].second, features);
}

TEST(Protocol, BinaryOutputsForTheRequestOrPerOutput) {
  at::Tensor logits = torch::randn({1, 10});
  at::Tensor features = torch::randint(-5, 5, {1, 2}, torch::kLong);
  std::string input = encode_infer_request({{"input", torch::zeros({1, 1, 28, 28})}}).body;
  auto with = [&](const std::string& extra) { return input.substr(0, input.size() - 1) + "," + extra + "}"; };

  InferRequest all_binary = parse(with(R"("parameters":{"binary_data_output":true})"));
  Reply reply = encode_infer_response(model_config(), all_binary, {logits, features});
  EXPECT_EQ(reply.content_type, "application/octet-stream");
  ASSERT_EQ(reply.headers.size(), 1u);
  EXPECT_EQ(reply.headers[0].first, "Inference-Header-Content-Length");
  std::size_t json_length = std::stoul(reply.headers[0].second);
  EXPECT_EQ(reply.body.size(), json_length + 10 * 4 + 2 * 8);
  auto outputs = parse_infer_response(reply.body, json_length);
  expect_identical(outputs.at(0).second, logits);
  expect_identical(outputs.at(1).second, features);

  InferRequest one_binary = parse(with(R"("outputs":[{"name":"features","parameters":{"binary_data":true}}])"));
  ASSERT_EQ(one_binary.outputs.size(), 1u);
  reply = encode_infer_response(model_config(), one_binary, {logits, features});
  json_length = std::stoul(reply.headers.at(0).second);
  EXPECT_EQ(reply.body.size(), json_length + 2 * 8);
  outputs = parse_infer_response(reply.body, json_length);
  ASSERT_EQ(outputs.size(), 1u);
  EXPECT_EQ(outputs[0].first, "features");
  expect_identical(outputs[0].second, features);
}

// JSON has no NaN or Infinity: a JSON response would be invalid, so the reply is an error
// that names the output, and the binary extension still carries the values.
TEST(Protocol, NonFiniteOutputsAreRefusedInJsonAndCarriedInBinary) {
  std::string input = encode_infer_request({{"input", torch::zeros({1, 1, 28, 28})}}).body;
  at::Tensor features = torch::zeros({1, 2}, torch::kLong);
  for (double bad : {std::nan(""), std::numeric_limits<double>::infinity()}) {
    at::Tensor logits = torch::zeros({1, 10});
    logits[0][3] = bad;
    Reply reply = encode_infer_response(model_config(), parse(input), {logits, features});
    EXPECT_EQ(reply.status, 500);
    EXPECT_TRUE(Contains(nlohmann::json::parse(reply.body)["error"].get<std::string>(),
                         "output 'output' of model 'cnn' holds NaN or infinite values"));
    const std::string binary = input.substr(0, input.size() - 1) + R"(,"parameters":{"binary_data_output":true}})";
    reply = encode_infer_response(model_config(), parse(binary), {logits, features});
    ASSERT_EQ(reply.status, 200);
    auto outputs = parse_infer_response(reply.body, std::stoul(reply.headers.at(0).second));
    EXPECT_TRUE(torch::allclose(outputs.at(0).second, logits, 0, 0, /*equal_nan=*/true));
  }
}

TEST(Protocol, ErrorReplyIsOneJsonField) {
  Reply reply = error_reply(404, "unknown model \"x\"\n");
  EXPECT_EQ(reply.status, 404);
  EXPECT_EQ(nlohmann::json::parse(reply.body), nlohmann::json({{"error", "unknown model \"x\"\n"}}));
}

struct BadRequest {
  std::string body;
  std::string message;  // part of the message that names the field and the problem
};

const std::string kInput = R"({"name":"input","datatype":"FP32","shape":[1,3],"data":[1,2,3]})";

TEST(Protocol, EachBadRequestIsA400NamingTheField) {
  const std::vector<BadRequest> cases = {
      {R"({"inputs":[)", "request body"},
      {"[1,2]", "request body"},
      {R"({"id":"a"})", "inputs"},
      {R"({"inputs":{}})", "inputs"},
      {R"({"inputs":[3]})", "inputs[0]"},
      {R"({"inputs":[{"datatype":"FP32","shape":[1,3],"data":[1,2,3]}]})", "inputs[0].name"},
      {R"({"inputs":[{"name":"image","datatype":"FP32","shape":[1,3],"data":[1,2,3]}]})",
       "unknown input 'image' (the model takes 'input')"},
      {R"({"inputs":[{"name":"input","datatype":"FP64","shape":[1,3],"data":[1,2,3]}]})",
       "input 'input': datatype FP64 but the model takes FP32"},
      {R"({"inputs":[{"name":"input","datatype":"BYTES","shape":[1,3],"data":[1,2,3]}]})",
       "inputs[0].datatype: unsupported datatype 'BYTES'"},
      {R"({"inputs":[{"name":"input","datatype":"FP32","shape":[1,3],"data":[1,2]}]})",
       "input 'input'.data: 2 values for shape [1, 3]"},
      {R"({"inputs":[{"name":"input","datatype":"FP32","shape":[1,3],"data":[1,2,3,4]}]})",
       "input 'input'.data: more values than the shape holds"},
      {R"({"inputs":[{"name":"input","datatype":"FP32","shape":[1,3],"data":[1,"2",3]}]})", "input 'input'.data"},
      {R"({"inputs":[{"name":"input","datatype":"FP32","shape":[1,4],"data":[1,2,3,4]}]})",
       "input 'input': shape [1, 4] but the model takes [batch, 3]"},
      {R"({"inputs":[{"name":"input","datatype":"FP32","shape":[3],"data":[1,2,3]}]})",
       "input 'input': shape [3] but the model takes [batch, 3]"},
      {R"({"inputs":[{"name":"input","datatype":"FP32","shape":[9,3],"data":[]}]})",
       "input 'input': batch of 9 samples, the model takes 1 to 8 (max_batch_size)"},
      {R"({"inputs":[{"name":"input","datatype":"FP32","shape":[0,3],"data":[]}]})", "batch of 0 samples"},
      {R"({"inputs":[{"name":"input","datatype":"FP32","shape":[1,-3],"data":[]}]})", "inputs[0].shape"},
      {R"({"inputs":[{"name":"input","datatype":"FP32","shape":[1,3]}]})", "input 'input'.data"},
      {R"({"inputs":[]})", "input 'input' is missing"},
      {R"({"inputs":[)" + kInput + "," + kInput + "]}", "input 'input' given twice"},
      {R"({"inputs":[)" + kInput + R"(],"outputs":[{"name":"probs"}]})",
       "outputs[0]: unknown output 'probs' (the model has 'output', 'features')"},
      {R"({"inputs":[)" + kInput + R"(],"parameters":{"binary_data_output":"yes"}})",
       "parameters.binary_data_output"},
      {R"({"inputs":[{"name":"input","datatype":"FP32","shape":[1,3],"parameters":{"binary_data_size":12}}]})",
       "input 'input': binary_data_size 12 but only 0 bytes of binary data are left"},
      {R"({"inputs":[{"name":"input","datatype":"FP32","shape":[1,3],"parameters":{"binary_data_size":8}}]})",
       "input 'input': binary_data_size 8 does not match shape 1x3 of FP32 (12 bytes)"},
      {R"({"inputs":[{"name":"input","datatype":"FP32","shape":[1,3],"data":[1,2,3)", "request body"},
  };
  for (const auto& bad : cases) {
    RequestError error = parse_error(bad.body, model_config(DataType::FP32, {3}));
    EXPECT_EQ(error.status(), 400) << bad.body;
    EXPECT_TRUE(Contains(error.what(), bad.message)) << bad.body;
  }
}

TEST(Protocol, IntegersOutOfTheDatatypeRangeAreRefused) {
  RequestError error = parse_error(R"({"inputs":[{"name":"input","datatype":"INT8","shape":[1,2],"data":[1,300]}]})",
                                   model_config(DataType::INT8, {2}));
  EXPECT_EQ(error.status(), 400);
  EXPECT_TRUE(Contains(error.what(), "input 'input'.data: 300 is out of range"));
}

// JSON has no infinity: a number that would round to one in the input's datatype is a mistake
// the client hears of, not an infinity for the model.
TEST(Protocol, FloatsBeyondTheDatatypeRangeAreRefusedNamingInputAndNumber) {
  const auto body = [](const char* datatype, const std::string& number) {
    return fmt::format(R"({{"inputs":[{{"name":"input","datatype":"{}","shape":[1,2],"data":[1,{}]}}]}})", datatype,
                       number);
  };
  const std::vector<std::tuple<DataType, std::string, std::string>> refused{
      {DataType::FP32, "3.5e38", "input 'input'.data: 3.5e+38 is out of range for FP32 (largest 3.40282e+38)"},
      {DataType::FP32, "-1e39", "input 'input'.data: -1e+39 is out of range for FP32"},
      {DataType::FP16, "70000", "input 'input'.data: 70000 is out of range for FP16 (largest 65504)"},
      {DataType::FP16, "-65520", "input 'input'.data: -65520 is out of range for FP16"}};
  for (const auto& [datatype, number, message] : refused) {
    RequestError error = parse_error(body(std::string(datatype_name(datatype)).c_str(), number),
                                     model_config(datatype, {2}));
    EXPECT_EQ(error.status(), 400) << number;
    EXPECT_TRUE(Contains(error.what(), message)) << error.what();
  }
  // The largest finite values (and what rounds to them) are numbers.
  const std::vector<std::tuple<DataType, std::string, double>> kept{
      {DataType::FP32, "3.4028235e38", std::numeric_limits<float>::max()},
      {DataType::FP16, "65504", 65504},
      {DataType::FP16, "65519", 65504},
      {DataType::FP64, "1e300", 1e300}};
  for (const auto& [datatype, number, value] : kept) {
    at::Tensor input = parse(body(std::string(datatype_name(datatype)).c_str(), number), model_config(datatype, {2}))
                           .inputs.at(0);
    EXPECT_EQ(input[0][1].item<double>(), value) << number;
  }
}

// allow_non_finite = false refuses NaN and infinities in that input (they come in binary: JSON
// has neither), naming the input and the first such element; by default they pass.
TEST(Protocol, InputsTheConfigKeepsFiniteRefuseNanAndInfinities) {
  ModelConfig forbidding = model_config(DataType::FP32, {3});
  forbidding.inputs[0].allow_non_finite = false;
  for (const auto& [value, name] : std::vector<std::pair<double, std::string>>{
           {std::nan(""), "nan"}, {std::numeric_limits<double>::infinity(), "inf"},
           {-std::numeric_limits<double>::infinity(), "-inf"}}) {
    at::Tensor x = torch::ones({2, 3});
    x[1][2] = value;
    const auto encoded = encode_infer_request({{"input", x}}, RequestOptions().binary_inputs(true));
    RequestError error = parse_error(encoded.body, forbidding, encoded.json_length);
    EXPECT_EQ(error.status(), 400);
    EXPECT_STREQ(error.what(), ("input 'input': element [1, 2] is " + name +
                                ", and the model's config forbids NaN and infinities in it (allow_non_finite = false)")
                                   .c_str());
    at::Tensor passed = parse(encoded.body, model_config(DataType::FP32, {3}), encoded.json_length).inputs.at(0);
    EXPECT_TRUE(torch::allclose(passed, x, 0, 0, /*equal_nan=*/true));
  }
  const auto finite = encode_infer_request({{"input", torch::ones({2, 3})}}, RequestOptions().binary_inputs(true));
  EXPECT_TRUE(torch::equal(parse(finite.body, forbidding, finite.json_length).inputs.at(0), torch::ones({2, 3})));
}

TEST(Protocol, HugeShapesAreRefusedBeforeAllocating) {
  RequestError error = parse_error(
      R"({"inputs":[{"name":"input","datatype":"FP32","shape":[1,1000000000],"data":[1]}]})",
      model_config(DataType::FP32, {-1}));
  EXPECT_TRUE(Contains(error.what(), "input 'input': shape holds more values than the body"));
  // 2^59 values: allocating them first would fail inside LibTorch, not with our 400.
  const std::string huge = R"("shape":[1,536870912,1073741824])";
  RequestError request = parse_error(R"({"inputs":[{"name":"input","datatype":"FP64",)" + huge + R"(,"data":[7]}]})",
                                     model_config(DataType::FP64, {-1, -1}));
  EXPECT_TRUE(Contains(request.what(), "input 'input': shape holds more values than the body"));
  try {  // found by fuzz_oip_body: a response, as the load generator reads it
    parse_infer_response(R"({"outputs":[{"name":"index","datatype":"INT64",)" + huge + R"(,"data":[7]}]})",
                         std::nullopt);
    ADD_FAILURE() << "a response declaring 2^59 values with one given was accepted";
  } catch (const RequestError& e) {
    EXPECT_TRUE(Contains(e.what(), "shape holds more values than the body")) << e.what();
  }
}

TEST(Protocol, BinarySizesThatWouldOverflowAreRefused) {
  // 2^61 FP64 values are 2^64 bytes, which wraps to 0 in 64 bits: a binary_data_size of 0 must
  // not match them.
  RequestError error = parse_error(
      R"({"inputs":[{"name":"input","datatype":"FP64","shape":[1,1073741824,1073741824,2],)"
      R"("parameters":{"binary_data_size":0}}]})",
      model_config(DataType::FP64, {-1, -1, -1}), std::nullopt);
  EXPECT_EQ(error.status(), 400);
  EXPECT_TRUE(Contains(error.what(), "inputs[0].shape: too large")) << error.what();
}

TEST(Protocol, LargeBodiesParseLikeSmallOnes) {
  at::Tensor input = torch::randn({2, 100000});  // ~2 MB of JSON, past the reused parser's limit
  auto encoded = encode_infer_request({{"input", input}});
  ASSERT_GT(encoded.body.size(), 1u << 20);
  expect_identical(parse(encoded.body, model_config(DataType::FP32, {-1})).inputs[0], input);
  expect_identical(parse(encode_infer_request({{"input", input.narrow(1, 0, 5)}}).body,
                         model_config(DataType::FP32, {-1})).inputs[0],
                   input.narrow(1, 0, 5));
}

TEST(Protocol, BinarySectionMustMatchTheDeclaredSizes) {
  ModelConfig config = model_config(DataType::FP32, {2});
  auto encoded = encode_infer_request({{"input", torch::randn({1, 2})}}, RequestOptions().binary_inputs(true));
  RequestError extra = parse_error(encoded.body + "xyz", config, encoded.json_length);
  EXPECT_TRUE(Contains(extra.what(), "binary data: 11 bytes follow the JSON but the tensors declare 8"));
  RequestError too_long = parse_error(encoded.body, config, encoded.body.size() + 1);
  EXPECT_TRUE(Contains(too_long.what(), "Inference-Header-Content-Length"));
}

}  // namespace
}  // namespace afterburner::serve
