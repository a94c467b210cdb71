#include "afterburner/serve/protocol.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <simdjson.h>

#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

namespace afterburner::serve {
namespace dom = simdjson::dom;

namespace {

[[noreturn]] void bad_request(const std::string& message) { throw RequestError(400, message); }

template <typename T>
T take(simdjson::simdjson_result<T>&& result, std::string_view where) {
  T value;
  if (auto error = std::move(result).get(value)) {
    bad_request(fmt::format("{}: {}", where, simdjson::error_message(error)));
  }
  return value;
}

// An optional field: nullopt if absent.
std::optional<dom::element> optional_field(const dom::object& object, std::string_view key) {
  dom::element value;
  if (object.at_key(key).get(value)) return std::nullopt;
  return value;
}

dom::element field(const dom::object& object, std::string_view key, std::string_view where) {
  return take(object.at_key(key), where);
}

// Calls f(T{}) with the C++ element type of `type`.
template <typename F>
decltype(auto) with_element_type(DataType type, F&& f) {
  switch (type) {
    case DataType::BOOL: return f(bool{});
    case DataType::UINT8: return f(uint8_t{});
    case DataType::INT8: return f(int8_t{});
    case DataType::INT16: return f(int16_t{});
    case DataType::INT32: return f(int32_t{});
    case DataType::INT64: return f(int64_t{});
    case DataType::FP16: return f(at::Half{});
    case DataType::FP32: return f(float{});
    case DataType::FP64: return f(double{});
  }
  return f(float{});
}

// One number (or bool) into `out`. A number the datatype cannot hold is refused: an integer
// outside its range, a float that would round to infinity (JSON has no infinity, so a client
// sending 1e39 as FP32 means a number, not what a cast would make of it).
template <typename T>
simdjson::error_code read_scalar(const dom::element& element, T& out, std::string_view where) {
  if constexpr (std::is_same_v<T, bool>) {
    return element.get_bool().get(out);
  } else if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, at::Half>) {
    double value = 0;
    auto error = element.get_double().get(value);
    out = static_cast<T>(value);
    if (!error && std::isinf(static_cast<double>(out))) {
      bad_request(fmt::format("{}: {} is out of range for {} (largest {:g})", where, value,
                              datatype_name(datatype_of(c10::CppTypeToScalarType<T>::value)),
                              static_cast<double>(std::numeric_limits<T>::max())));
    }
    return error;
  } else {
    int64_t value = 0;
    auto error = element.get_int64().get(value);
    if (!error && (value < std::numeric_limits<T>::min() || value > std::numeric_limits<T>::max())) {
      bad_request(fmt::format("{}: {} is out of range for the datatype", where, value));
    }
    out = static_cast<T>(value);
    return error;
  }
}

// Reads numbers from `array`, flat or nested to any depth, row-major into out[0, count).
template <typename T>
void read_elements(const dom::array& array, T* out, std::size_t count, std::size_t& written, std::string_view where) {
  for (dom::element element : array) {
    if (element.is_array()) {
      read_elements(element.get_array().value_unsafe(), out, count, written, where);
      continue;
    }
    if (written == count) bad_request(fmt::format("{}: more values than the shape holds ({})", where, count));
    if (auto error = read_scalar(element, out[written], where)) {
      bad_request(fmt::format("{}: {}", where, simdjson::error_message(error)));
    }
    ++written;
  }
}

// The binary data after the JSON, handed out to tensors in input order.
class BinarySection {
 public:
  explicit BinarySection(std::string_view bytes) : bytes_(bytes) {}

  std::string_view take(std::size_t size, std::string_view where) {
    if (size > bytes_.size() - offset_) {
      bad_request(fmt::format("{}: binary_data_size {} but only {} bytes of binary data are left", where, size,
                              bytes_.size() - offset_));
    }
    std::string_view part = bytes_.substr(offset_, size);
    offset_ += size;
    return part;
  }

  void expect_consumed() const {
    if (offset_ != bytes_.size()) {
      bad_request(fmt::format("binary data: {} bytes follow the JSON but the tensors declare {}", bytes_.size(),
                              offset_));
    }
  }

 private:
  std::string_view bytes_;
  std::size_t offset_ = 0;
};

struct TensorHeader {
  std::string name;
  DataType datatype = DataType::FP32;
  std::vector<int64_t> shape;
  std::optional<std::size_t> binary_data_size;
  std::size_t numel = 1;
};

void set_datatype(TensorHeader& header, std::string_view datatype, const std::string& where) {
  auto parsed = parse_datatype(datatype);
  if (!parsed) bad_request(fmt::format("{}.datatype: unsupported datatype '{}'", where, datatype));
  header.datatype = *parsed;
}

void append_dim(TensorHeader& header, uint64_t size, const std::string& where) {
  // Bounded so that the byte size of the widest datatype (8 bytes) cannot overflow.
  constexpr std::size_t max_numel = std::numeric_limits<std::size_t>::max() / 16;
  if (size > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()) ||
      (size > 0 && header.numel > max_numel / size)) {
    bad_request(where + ".shape: too large");
  }
  header.shape.push_back(static_cast<int64_t>(size));
  header.numel *= size;
}

TensorHeader read_header(const dom::object& tensor, const std::string& where) {
  TensorHeader header;
  header.name = std::string(take(field(tensor, "name", where + ".name").get_string(), where + ".name"));
  set_datatype(header, take(field(tensor, "datatype", where + ".datatype").get_string(), where + ".datatype"), where);
  for (dom::element dim : take(field(tensor, "shape", where + ".shape").get_array(), where + ".shape")) {
    append_dim(header, take(dim.get_uint64(), where + ".shape"), where);
  }
  if (auto parameters = optional_field(tensor, "parameters")) {
    dom::object object = take(parameters->get_object(), where + ".parameters");
    if (auto size = optional_field(object, "binary_data_size")) {
      header.binary_data_size = take(size->get_uint64(), where + ".parameters.binary_data_size");
    }
  }
  return header;
}

at::Tensor allocate(const TensorHeader& header) {
  return at::empty(header.shape, at::TensorOptions().dtype(scalar_type(header.datatype)));
}

// `size` is the byte count a request gives for a tensor (its binary_data_size, or the length of
// its raw contents: `size_name`).
void check_byte_size(const TensorHeader& header, std::size_t size, std::string_view size_name,
                     const std::string& where) {
  const std::size_t expected = header.numel * datatype_size(header.datatype);
  if (size != expected) {
    bad_request(fmt::format("{}: {} {} does not match shape {} of {} ({} bytes)", where, size_name, size,
                            fmt::join(header.shape, "x"), datatype_name(header.datatype), expected));
  }
}

at::Tensor copy_bytes(const TensorHeader& header, std::string_view bytes) {
  at::Tensor out = allocate(header);
  if (!bytes.empty()) std::memcpy(out.data_ptr(), bytes.data(), bytes.size());
  return out;
}

// The tensor's data, from "data" or the binary section. Allocated only once the body is known
// to hold that many values: `max_json_values` is what it can hold (every JSON value takes at
// least one byte), so a small body declaring a huge shape cannot make us allocate it.
at::Tensor read_data(const dom::object& tensor, const TensorHeader& header, BinarySection& binary,
                     std::size_t max_json_values, const std::string& where) {
  if (header.binary_data_size) {
    check_byte_size(header, *header.binary_data_size, "binary_data_size", where);
    return copy_bytes(header, binary.take(*header.binary_data_size, where));
  }
  if (header.numel > max_json_values) bad_request(fmt::format("{}: shape holds more values than the body", where));
  dom::array data = take(field(tensor, "data", where + ".data").get_array(), where + ".data");
  at::Tensor out = allocate(header);
  std::size_t written = 0;
  with_element_type(header.datatype, [&](auto tag) {
    using T = decltype(tag);
    read_elements<T>(data, static_cast<T*>(out.data_ptr()), header.numel, written, where + ".data");
  });
  if (written != header.numel) {
    bad_request(fmt::format("{}.data: {} values for shape [{}] ({} values)", where, written,
                            fmt::join(header.shape, ", "), header.numel));
  }
  return out;
}

void check_against_spec(const TensorHeader& header, const TensorSpec& spec, const ModelConfig& config) {
  const std::string where = fmt::format("input '{}'", spec.name);
  if (header.datatype != spec.datatype) {
    bad_request(fmt::format("{}: datatype {} but the model takes {}", where, datatype_name(header.datatype),
                            datatype_name(spec.datatype)));
  }
  bool dims_match = header.shape.size() == spec.dims.size() + 1;
  for (std::size_t i = 0; dims_match && i < spec.dims.size(); ++i) {
    dims_match = spec.dims[i] == -1 || spec.dims[i] == header.shape[i + 1];
  }
  if (!dims_match) {
    bad_request(fmt::format("{}: shape [{}] but the model takes [batch, {}]", where, fmt::join(header.shape, ", "),
                            fmt::join(spec.dims, ", ")));
  }
  if (header.shape[0] < 1 || header.shape[0] > config.max_batch_size) {
    bad_request(fmt::format("{}: batch of {} samples, the model takes 1 to {} (max_batch_size)", where,
                            header.shape[0], config.max_batch_size));
  }
}

// Where the config says allow_non_finite = false: refused before the model runs, naming the first
// NaN or infinity.
void check_finite(const at::Tensor& tensor, const TensorSpec& spec) {
  if (spec.allow_non_finite || !tensor.is_floating_point()) return;
  const at::Tensor non_finite = tensor.isfinite().logical_not();
  if (!non_finite.any().item<bool>()) return;
  const at::Tensor first = non_finite.nonzero().select(0, 0).contiguous();
  const std::vector<int64_t> index(first.data_ptr<int64_t>(), first.data_ptr<int64_t>() + first.numel());
  at::Tensor element = tensor;
  for (const int64_t position : index) element = element.select(0, position);
  bad_request(fmt::format("input '{}': element [{}] is {}, and the model's config forbids NaN and infinities in it "
                          "(allow_non_finite = false)",
                          spec.name, fmt::join(index, ", "), element.item<double>()));
}

template <typename Specs>
std::string spec_names(const Specs& specs) {
  std::vector<std::string> names;
  for (const auto& spec : specs) names.push_back("'" + spec.name + "'");
  return fmt::format("{}", fmt::join(names, ", "));
}

// Checks one input against the model's config and the request's other inputs, then puts the
// tensor `read` makes into its place.
template <typename Read>
void place_input(const TensorHeader& header, const ModelConfig& config, const std::string& where,
                 InferRequest& request, Read&& read) {
  const std::size_t index = spec_index(config.inputs, header.name);
  if (index == config.inputs.size()) {
    bad_request(fmt::format("{}: unknown input '{}' (the model takes {})", where, header.name,
                            spec_names(config.inputs)));
  }
  if (request.inputs[index].defined()) bad_request(fmt::format("input '{}' given twice", header.name));
  check_against_spec(header, config.inputs[index], config);
  if (request.batch_size != 0 && header.shape[0] != request.batch_size) {
    bad_request(fmt::format("input '{}': batch of {} but other inputs have {}", header.name, header.shape[0],
                            request.batch_size));
  }
  request.batch_size = header.shape[0];
  request.inputs[index] = read(fmt::format("input '{}'", header.name));
  check_finite(request.inputs[index], config.inputs[index]);
}

void expect_every_input(const ModelConfig& config, const InferRequest& request) {
  for (std::size_t i = 0; i < config.inputs.size(); ++i) {
    if (!request.inputs[i].defined()) bad_request(fmt::format("input '{}' is missing", config.inputs[i].name));
  }
}

void read_inputs(const dom::array& inputs, const ModelConfig& config, BinarySection& binary, std::size_t json_length,
                 InferRequest& request) {
  request.inputs.assign(config.inputs.size(), at::Tensor());
  std::size_t position = 0;
  for (dom::element item : inputs) {
    const std::string where = fmt::format("inputs[{}]", position++);
    dom::object tensor = take(item.get_object(), where);
    const TensorHeader header = read_header(tensor, where);
    place_input(header, config, where, request, [&](const std::string& input) {
      return read_data(tensor, header, binary, json_length, input);
    });
  }
  expect_every_input(config, request);
}

bool binary_data_flag(const dom::object& object, const std::string& where, std::string_view key) {
  auto parameters = optional_field(object, "parameters");
  if (!parameters) return false;
  dom::object params = take(parameters->get_object(), where + ".parameters");
  auto flag = optional_field(params, key);
  return flag && take(flag->get_bool(), fmt::format("{}.parameters.{}", where, key));
}

void read_requested_outputs(std::optional<dom::element> outputs, bool all_binary, const ModelConfig& config,
                            InferRequest& request) {
  if (!outputs) {
    for (const auto& spec : config.outputs) request.outputs.push_back({spec.name, all_binary});
    return;
  }
  std::vector<std::optional<bool>> binary_by_output(config.outputs.size());
  std::size_t position = 0;
  for (dom::element item : take(outputs->get_array(), "outputs")) {
    const std::string where = fmt::format("outputs[{}]", position++);
    dom::object output = take(item.get_object(), where);
    std::string_view name = take(field(output, "name", where + ".name").get_string(), where + ".name");
    std::size_t index = spec_index(config.outputs, name);
    if (index == config.outputs.size()) {
      bad_request(fmt::format("{}: unknown output '{}' (the model has {})", where, name, spec_names(config.outputs)));
    }
    binary_by_output[index] = all_binary || binary_data_flag(output, where, "binary_data");
  }
  for (std::size_t i = 0; i < config.outputs.size(); ++i) {
    if (binary_by_output[i]) request.outputs.push_back({config.outputs[i].name, *binary_by_output[i]});
  }
}

// simdjson reads up to SIMDJSON_PADDING bytes past the end: give it room without copying.
// The DOM parser rather than on-demand: its parsing dispatches at run time to the CPU's best
// kernels, where on-demand's inline code is compiled for baseline x86-64 (measured on a 16 KB
// single-sample cnn request: 10 us against 27 us).
dom::object parse_padded(dom::parser& parser, std::string& body, std::size_t json_length, std::string_view what) {
  if (body.capacity() < json_length + simdjson::SIMDJSON_PADDING) {
    body.reserve(json_length + simdjson::SIMDJSON_PADDING);
  }
  return take(take(parser.parse(body.data(), json_length, /*realloc_if_needed=*/false), what).get_object(), what);
}

std::size_t checked_json_length(const std::string& body, std::optional<std::size_t> json_length) {
  if (!json_length) return body.size();
  if (*json_length > body.size()) {
    bad_request(fmt::format("Inference-Header-Content-Length {} exceeds the body's {} bytes", *json_length,
                            body.size()));
  }
  return *json_length;
}

// Each thread keeps a parser, and its buffers, for the next request; a large body parses with
// a parser of its own, so that one large request does not leave every thread holding its size.
constexpr std::size_t kReusedParserMaxBytes = 1 << 20;

dom::parser& parser_for(std::size_t json_length, std::unique_ptr<dom::parser>& own) {
  thread_local dom::parser reused;
  if (json_length <= kReusedParserMaxBytes) return reused;
  own = std::make_unique<dom::parser>();
  return *own;
}

void append_json_string(std::string& out, std::string_view text) {
  // Text that is no UTF-8 (a request target's bytes quoted in an error) keeps its ASCII; every
  // other byte becomes U+FFFD, so the body stays JSON.
  const bool utf8 = simdjson::validate_utf8(text.data(), text.size());
  out += '"';
  for (char c : text) {
    if (!utf8 && static_cast<unsigned char>(c) >= 0x80) {
      out += "\\ufffd";
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  out += '"';
}

template <typename T>
void append_number(std::string& out, T value) {
  char buffer[32];
  if constexpr (std::is_same_v<T, bool>) {
    out += value ? "true" : "false";
    return;
  } else if constexpr (std::is_same_v<T, at::Half>) {
    append_number(out, static_cast<float>(value));
    return;
  } else {
    // Shortest text that reads back to the same value.
    auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
    out.append(buffer, result.ptr);
  }
}

// One tensor's JSON object; binary tensors append their bytes to `binary` instead of "data".
void append_tensor(std::string& out, std::string& binary, std::string_view name, const at::Tensor& tensor,
                   bool as_binary) {
  at::Tensor data = tensor.contiguous();
  DataType datatype = datatype_of(data.scalar_type());
  out += "{\"name\":";
  append_json_string(out, name);
  fmt::format_to(std::back_inserter(out), ",\"datatype\":\"{}\",\"shape\":[{}]", datatype_name(datatype),
                 fmt::join(data.sizes(), ","));
  if (as_binary) {
    std::size_t bytes = data.numel() * datatype_size(datatype);
    fmt::format_to(std::back_inserter(out), ",\"parameters\":{{\"binary_data_size\":{}}}}}", bytes);
    binary.append(static_cast<const char*>(data.data_ptr()), bytes);
    return;
  }
  out += ",\"data\":[";
  with_element_type(datatype, [&](auto tag) {
    using T = decltype(tag);
    const T* values = data.data_ptr<T>();
    for (int64_t i = 0; i < data.numel(); ++i) {
      if (i > 0) out += ',';
      append_number(out, values[i]);
    }
  });
  out += "]}";
}

}  // namespace

at::ScalarType scalar_type(DataType type) {
  switch (type) {
    case DataType::BOOL: return at::kBool;
    case DataType::UINT8: return at::kByte;
    case DataType::INT8: return at::kChar;
    case DataType::INT16: return at::kShort;
    case DataType::INT32: return at::kInt;
    case DataType::INT64: return at::kLong;
    case DataType::FP16: return at::kHalf;
    case DataType::FP32: return at::kFloat;
    case DataType::FP64: return at::kDouble;
  }
  return at::kFloat;
}

DataType datatype_of(at::ScalarType type) {
  for (DataType candidate : {DataType::BOOL, DataType::UINT8, DataType::INT8, DataType::INT16, DataType::INT32,
                             DataType::INT64, DataType::FP16, DataType::FP32, DataType::FP64}) {
    if (scalar_type(candidate) == type) return candidate;
  }
  throw Error(fmt::format("serve: tensors of {} have no Open Inference Protocol datatype", at::toString(type)));
}

InferRequest parse_infer_request(std::string& body, std::optional<std::size_t> json_length,
                                 const ModelConfig& config) {
  std::size_t json_size = checked_json_length(body, json_length);
  std::unique_ptr<dom::parser> large_body_parser;
  dom::object root = parse_padded(parser_for(json_size, large_body_parser), body, json_size, "request body");
  InferRequest request;
  if (auto id = optional_field(root, "id")) request.id = std::string(take(id->get_string(), "id"));
  bool all_binary = false;
  if (auto parameters = optional_field(root, "parameters")) {
    dom::object params = take(parameters->get_object(), "parameters");
    if (auto flag = optional_field(params, "binary_data_output")) {
      all_binary = take(flag->get_bool(), "parameters.binary_data_output");
    }
  }
  BinarySection binary(std::string_view(body).substr(json_size));
  read_inputs(take(field(root, "inputs", "inputs").get_array(), "inputs"), config, binary, json_size, request);
  binary.expect_consumed();
  read_requested_outputs(optional_field(root, "outputs"), all_binary, config, request);
  return request;
}

InferRequest make_infer_request(const TensorRequest& tensors, const ModelConfig& config) {
  InferRequest request;
  request.id = tensors.id;
  request.inputs.assign(config.inputs.size(), at::Tensor());
  for (std::size_t i = 0; i < tensors.inputs.size(); ++i) {
    const RawTensor& raw = tensors.inputs[i];
    const std::string where = fmt::format("inputs[{}]", i);
    TensorHeader header;
    header.name = raw.name;
    set_datatype(header, raw.datatype, where);
    for (const int64_t dim : raw.shape) {
      if (dim < 0) bad_request(fmt::format("{}.shape: negative size {}", where, dim));
      append_dim(header, static_cast<uint64_t>(dim), where);
    }
    place_input(header, config, where, request, [&](const std::string& input) {
      check_byte_size(header, raw.bytes.size(), "raw_input_contents size", input);
      return copy_bytes(header, raw.bytes);
    });
  }
  expect_every_input(config, request);
  std::vector<bool> wanted(config.outputs.size(), tensors.outputs.empty());
  for (std::size_t i = 0; i < tensors.outputs.size(); ++i) {
    const std::size_t index = spec_index(config.outputs, tensors.outputs[i]);
    if (index == config.outputs.size()) {
      bad_request(fmt::format("outputs[{}]: unknown output '{}' (the model has {})", i, tensors.outputs[i],
                              spec_names(config.outputs)));
    }
    wanted[index] = true;
  }
  for (std::size_t i = 0; i < config.outputs.size(); ++i) {
    if (wanted[i]) request.outputs.push_back({config.outputs[i].name, /*binary=*/true});
  }
  return request;
}

Reply encode_infer_response(const ModelConfig& config, const InferRequest& request,
                            const std::vector<at::Tensor>& outputs) {
  // JSON has no NaN or Infinity: such outputs travel only in the binary extension.
  for (const auto& wanted : request.outputs) {
    const at::Tensor& tensor = outputs.at(spec_index(config.outputs, wanted.name));
    if (!wanted.binary && tensor.is_floating_point() && !tensor.isfinite().all().item<bool>()) {
      return error_reply(500, fmt::format("output '{}' of model '{}' holds NaN or infinite values, which JSON cannot "
                                          "carry; request it with \"binary_data\": true",
                                          wanted.name, config.name));
    }
  }
  Reply reply;
  std::string binary;
  std::string& out = reply.body;
  out.reserve(256 + 16 * static_cast<std::size_t>(outputs.empty() ? 0 : outputs[0].numel()));
  out += "{\"model_name\":";
  append_json_string(out, config.name);
  if (!request.id.empty()) {
    out += ",\"id\":";
    append_json_string(out, request.id);
  }
  out += ",\"outputs\":[";
  bool first = true;
  for (const auto& wanted : request.outputs) {
    if (!first) out += ',';
    first = false;
    append_tensor(out, binary, wanted.name, outputs.at(spec_index(config.outputs, wanted.name)), wanted.binary);
  }
  out += "]}";
  bool any_binary = false;
  for (const auto& wanted : request.outputs) any_binary |= wanted.binary;
  if (any_binary) {
    reply.headers.emplace_back("Inference-Header-Content-Length", std::to_string(out.size()));
    reply.content_type = "application/octet-stream";
    out += binary;
  }
  return reply;
}

Reply error_reply(int status, std::string_view message) {
  Reply reply;
  reply.status = status;
  reply.body = "{\"error\":";
  append_json_string(reply.body, message);
  reply.body += '}';
  return reply;
}

EncodedBody encode_infer_request(const std::vector<NamedTensor>& inputs, const RequestOptions& options) {
  EncodedBody encoded;
  std::string binary;
  std::string& out = encoded.body;
  out += '{';
  if (!options.id().empty()) {
    out += "\"id\":";
    append_json_string(out, options.id());
    out += ',';
  }
  if (options.binary_outputs()) out += "\"parameters\":{\"binary_data_output\":true},";
  out += "\"inputs\":[";
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (i > 0) out += ',';
    append_tensor(out, binary, inputs[i].first, inputs[i].second, options.binary_inputs());
  }
  out += "]}";
  if (options.binary_inputs()) {
    encoded.json_length = out.size();
    out += binary;
  }
  return encoded;
}

std::vector<NamedTensor> parse_infer_response(std::string body, std::optional<std::size_t> json_length) {
  std::size_t json_size = checked_json_length(body, json_length);
  dom::parser parser;
  dom::object root = parse_padded(parser, body, json_size, "response body");
  BinarySection binary(std::string_view(body).substr(json_size));
  std::vector<NamedTensor> outputs;
  for (dom::element item : take(field(root, "outputs", "outputs").get_array(), "outputs")) {
    const std::string where = fmt::format("outputs[{}]", outputs.size());
    dom::object tensor = take(item.get_object(), where);
    TensorHeader header = read_header(tensor, where);
    outputs.emplace_back(header.name, read_data(tensor, header, binary, json_size, where));
  }
  binary.expect_consumed();
  return outputs;
}

}  // namespace afterburner::serve
