#include "afterburner/data/image_file.h"

#include <fmt/format.h>
#include <spng.h>

#include <csetjmp>
#include <cstdio>  // before jpeglib.h, which uses FILE without including it
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include <jpeglib.h>

#include "afterburner/core/error.h"
#include "file_bytes.h"

namespace afterburner::data {
namespace {

constexpr uint8_t kPngSignature[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
constexpr uint8_t kJpegSignature[] = {0xFF, 0xD8, 0xFF};
// Larger images are refused before their pixels are allocated (a corrupt header can claim 4G x 4G).
constexpr int64_t kMaxPixels = int64_t{1} << 28;
constexpr int64_t kDeflateBestRatio = 1032;

template <size_t N>
bool starts_with(const uint8_t* bytes, size_t size, const uint8_t (&signature)[N]) {
  return size >= N && std::memcmp(bytes, signature, N) == 0;
}

[[noreturn]] void not_an_image(const std::string& source) {
  throw DataError(source, "not a JPEG or PNG image (its first bytes are neither signature)");
}

// `kind` ("JPEG", "PNG") names the format in the error.
void check_dimensions(int64_t width, int64_t height, const char* kind, const std::string& source) {
  if (width <= 0 || height <= 0) {
    throw DataError(source, fmt::format("corrupt {}: its header declares {}x{} pixels", kind, width, height));
  }
  if (width * height > kMaxPixels) {
    throw DataError(source, fmt::format("{}x{} pixels: more than the {} an image may have", width, height,
                                        kMaxPixels));
  }
}

// libjpeg's error manager, made to stop a decode at its first error or warning (a truncated scan
// and corrupt data are warnings to libjpeg, as to TurboJPEG without TJFLAG_STOPONWARNING) and to
// keep the message, instead of exit()ing the process.
struct JpegErrors {
  jpeg_error_mgr manager;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_fail(j_common_ptr info) {
  auto* errors = reinterpret_cast<JpegErrors*>(info->err);
  info->err->format_message(info, errors->message);
  std::longjmp(errors->jump, 1);
}

void jpeg_message(j_common_ptr info, int level) {
  if (level < 0) jpeg_fail(info);  // a warning
}

jpeg_error_mgr* stopping_at_first_error(JpegErrors& errors) {
  jpeg_std_error(&errors.manager);
  errors.manager.error_exit = jpeg_fail;
  errors.manager.emit_message = jpeg_message;
  return &errors.manager;
}

enum class JpegOutcome { decoded, failed, cmyk, unsized };

// What a JPEG decode asks for: the header only, or pixels at eighths/8 of the stored size, all of
// them or the rows and (whole-block) columns of `region` (of the scaled image).
struct JpegRequest {
  bool header_only = false;
  int eighths = 8;
  const Box* region = nullptr;
};

// The decode's libjpeg calls, which may longjmp back here: nothing in this function has a
// destructor (Pixels was made by the caller). libjpeg's defaults are PIL's: the accurate integer
// DCT, smooth chroma upsampling.
JpegOutcome run_jpeg(jpeg_decompress_struct& info, JpegErrors& errors, const uint8_t* bytes, size_t size,
                     const JpegRequest& request, ImageSize& stored, Pixels& into) {
  if (setjmp(errors.jump)) return JpegOutcome::failed;
  jpeg_mem_src(&info, bytes, static_cast<unsigned long>(size));
  jpeg_read_header(&info, TRUE);
  stored = {info.image_width, info.image_height};
  if (info.image_width == 0 || info.image_height == 0 ||
      int64_t{info.image_width} * info.image_height > kMaxPixels) {
    return JpegOutcome::unsized;  // before any pixel is allocated
  }
  if (info.jpeg_color_space == JCS_CMYK || info.jpeg_color_space == JCS_YCCK) return JpegOutcome::cmyk;
  if (request.header_only) return JpegOutcome::decoded;
  info.out_color_space = info.jpeg_color_space == JCS_GRAYSCALE ? JCS_GRAYSCALE : JCS_RGB;
  info.scale_num = static_cast<unsigned>(request.eighths);
  info.scale_denom = 8;
  jpeg_start_decompress(&info);
  JDIMENSION left = 0, width = info.output_width, top = 0, rows = info.output_height;
  if (request.region != nullptr) {
    left = static_cast<JDIMENSION>(request.region->x);
    width = static_cast<JDIMENSION>(request.region->width);
    top = static_cast<JDIMENSION>(request.region->y);
    rows = static_cast<JDIMENSION>(request.region->height);
    if (width < info.output_width) jpeg_crop_scanline(&info, &left, &width);  // widened to whole blocks
  }
  into.channels = info.output_components;
  into.width = width;
  into.height = rows;
  into.left = left;
  into.top = top;
  into.hwc.resize(static_cast<size_t>(width) * rows * info.output_components);
  if (top > 0) jpeg_skip_scanlines(&info, top);
  while (info.output_scanline < top + rows) {
    JSAMPROW row = &into.hwc[static_cast<size_t>(info.output_scanline - top) * width * info.output_components];
    jpeg_read_scanlines(&info, &row, 1);
  }
  if (info.output_scanline < info.output_height) {
    jpeg_abort_decompress(&info);  // the rows below the region are not needed
  } else {
    jpeg_finish_decompress(&info);  // reads on to the end: a file cut short is an error
  }
  return JpegOutcome::decoded;
}

ImageSize decode_jpeg(const uint8_t* bytes, size_t size, const std::string& source, const JpegRequest& request,
                      Pixels& into) {
  jpeg_decompress_struct info{};
  JpegErrors errors{};
  info.err = stopping_at_first_error(errors);
  jpeg_create_decompress(&info);
  ImageSize stored;
  const JpegOutcome outcome = run_jpeg(info, errors, bytes, size, request, stored, into);
  jpeg_destroy_decompress(&info);
  switch (outcome) {
    case JpegOutcome::failed: throw DataError(source, fmt::format("corrupt JPEG: {}", errors.message));
    case JpegOutcome::cmyk:
      throw DataError(source, "a CMYK JPEG: its colours depend on the software that wrote it; convert it to RGB");
    case JpegOutcome::unsized:
    case JpegOutcome::decoded: break;
  }
  check_dimensions(stored.width, stored.height, "JPEG", source);
  stored.partial_decoding = true;
  return stored;
}

struct SpngFreer {
  void operator()(spng_ctx* context) const { spng_ctx_free(context); }
};

// The decoded samples in `format` (host-endian for 16 bits), HWC.
std::vector<uint8_t> spng_pixels(spng_ctx* context, int format, const std::string& source) {
  size_t bytes = 0;
  int error = spng_decoded_image_size(context, format, &bytes);
  std::vector<uint8_t> pixels;
  if (error == 0) {
    pixels.resize(bytes);
    error = spng_decode_image(context, pixels.data(), bytes, format, 0);
  }
  // The chunks after the pixels, up to IEND: a file cut short after its image data is corrupt too.
  if (error == 0) error = spng_decode_chunks(context);
  if (error != 0) throw DataError(source, fmt::format("corrupt PNG: {}", spng_strerror(error)));
  return pixels;
}

// 16-bit samples to 8 bits, rounded: v * 255 / 65535.
std::vector<uint8_t> narrowed(const std::vector<uint8_t>& wide) {
  std::vector<uint8_t> narrow(wide.size() / 2);
  for (size_t i = 0; i < narrow.size(); ++i) {
    uint16_t value;
    std::memcpy(&value, &wide[2 * i], sizeof(value));
    narrow[i] = static_cast<uint8_t>((uint32_t{value} * 255 + 32767) / 65535);
  }
  return narrow;
}

using PngDecoder = std::unique_ptr<spng_ctx, SpngFreer>;

// A decoder of the bytes, its header read and checked.
PngDecoder png_decoder(const uint8_t* bytes, size_t size, spng_ihdr& header, const std::string& source) {
  PngDecoder context(spng_ctx_new(0));
  if (!context) throw DataError(source, "cannot start a PNG decoder: out of memory");
  int error = spng_set_png_buffer(context.get(), bytes, size);
  if (error == 0) error = spng_set_image_limits(context.get(), 1u << 24, 1u << 24);
  if (error == 0) error = spng_get_ihdr(context.get(), &header);
  if (error != 0) throw DataError(source, fmt::format("corrupt PNG: {}", spng_strerror(error)));
  check_dimensions(header.width, header.height, "PNG", source);
  // Deflate compresses 1,032 bytes into 1 at best: a file cannot hold more filtered rows (a flag
  // byte and at least bit_depth bits a pixel) than that, however corrupt or truncated it is.
  const int64_t least_raw_bytes = int64_t{header.height} * (1 + (int64_t{header.width} * header.bit_depth + 7) / 8);
  if (least_raw_bytes > kDeflateBestRatio * static_cast<int64_t>(size)) {
    throw DataError(source, fmt::format("corrupt PNG: its header declares {}x{} pixels, more than its {} bytes can hold",
                                        header.width, header.height, size));
  }
  return context;
}

Pixels decode_png(const uint8_t* bytes, size_t size, const std::string& source) {
  spng_ihdr header{};
  const PngDecoder png = png_decoder(bytes, size, header, source);
  const bool alpha_gray = header.color_type == SPNG_COLOR_TYPE_GRAYSCALE_ALPHA;
  const bool gray = alpha_gray || header.color_type == SPNG_COLOR_TYPE_GRAYSCALE;
  const bool wide = header.bit_depth == 16;
  // What libspng converts to: G8 from gray up to 8 bits, GA16 from 16-bit gray, RGB8 from any
  // colour type up to 8 bits, RGBA16 from 16 bits. Gray with alpha, which it converts to RGB(A)
  // only, is taken as stored (PNG: the file's own samples, 8 or 16 bits, host-endian).
  int format = SPNG_FMT_RGB8;
  int64_t stored = 3;  // samples per pixel as decoded
  if (gray) {
    format = alpha_gray ? SPNG_FMT_PNG : wide ? SPNG_FMT_GA16 : SPNG_FMT_G8;
    stored = wide || alpha_gray ? 2 : 1;
  } else if (wide) {
    format = SPNG_FMT_RGBA16;
    stored = 4;
  }
  std::vector<uint8_t> pixels = spng_pixels(png.get(), format, source);
  if (wide) pixels = narrowed(pixels);
  Pixels decoded;
  decoded.width = header.width;
  decoded.height = header.height;
  decoded.channels = gray ? 1 : 3;
  if (stored == decoded.channels) {
    decoded.hwc = std::move(pixels);
    return decoded;
  }
  decoded.hwc.resize(static_cast<size_t>(decoded.width * decoded.height * decoded.channels));
  for (size_t i = 0, n = decoded.hwc.size() / decoded.channels; i < n; ++i) {  // alpha dropped
    std::memcpy(&decoded.hwc[i * decoded.channels], &pixels[i * stored], decoded.channels);
  }
  return decoded;
}

// libjpeg's compression calls, which may longjmp back here (as run_jpeg). The output buffer is
// malloc'ed by jpeg_mem_dest: the caller frees it.
bool run_jpeg_encoder(jpeg_compress_struct& info, JpegErrors& errors, const Pixels& pixels, int quality,
                      unsigned char** buffer, unsigned long* size) {
  if (setjmp(errors.jump)) return false;
  jpeg_mem_dest(&info, buffer, size);
  info.image_width = static_cast<JDIMENSION>(pixels.width);
  info.image_height = static_cast<JDIMENSION>(pixels.height);
  info.input_components = static_cast<int>(pixels.channels);
  info.in_color_space = pixels.channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&info);
  jpeg_set_quality(&info, quality, TRUE);
  jpeg_start_compress(&info, TRUE);
  while (info.next_scanline < info.image_height) {
    auto* row = const_cast<JSAMPROW>(&pixels.hwc[static_cast<size_t>(info.next_scanline) * pixels.width *
                                                 pixels.channels]);
    jpeg_write_scanlines(&info, &row, 1);
  }
  jpeg_finish_compress(&info);
  return true;
}

}  // namespace

std::vector<uint8_t> encode_jpeg(const Pixels& pixels, int quality, const std::string& source) {
  if (pixels.channels != 1 && pixels.channels != 3) {
    throw UsageError("encode_jpeg", fmt::format("{}: {} channels (1 or 3 are encoded)", source, pixels.channels));
  }
  if (quality < 1 || quality > 100) throw UsageError("quality", fmt::format("{} is not in 1..100", quality));
  jpeg_compress_struct info{};
  JpegErrors errors{};
  info.err = stopping_at_first_error(errors);
  jpeg_create_compress(&info);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  const bool encoded = run_jpeg_encoder(info, errors, pixels, quality, &buffer, &size);
  jpeg_destroy_compress(&info);
  std::vector<uint8_t> bytes;
  if (encoded) bytes.assign(buffer, buffer + size);
  std::free(buffer);
  if (!encoded) throw DataError(source, fmt::format("cannot encode as JPEG: {}", errors.message));
  return bytes;
}

ImageSize read_image_size(const uint8_t* bytes, size_t size, const std::string& source) {
  if (starts_with(bytes, size, kJpegSignature)) {
    Pixels none;
    return decode_jpeg(bytes, size, source, JpegRequest{true}, none);
  }
  if (starts_with(bytes, size, kPngSignature)) {
    spng_ihdr header{};
    png_decoder(bytes, size, header, source);
    return {header.width, header.height, false};
  }
  not_an_image(source);
}

void decode_pixels(const uint8_t* bytes, size_t size, const std::string& source, int eighths, Pixels& into,
                   const Box* region) {
  if (eighths < 1 || eighths > 8) throw UsageError("eighths", fmt::format("{} is not in 1..8", eighths));
  if (starts_with(bytes, size, kJpegSignature)) {
    decode_jpeg(bytes, size, source, JpegRequest{false, eighths, region}, into);
    return;
  }
  if (starts_with(bytes, size, kPngSignature)) {
    into = decode_png(bytes, size, source);
    return;
  }
  not_an_image(source);
}

Pixels decode_pixels(const uint8_t* bytes, size_t size, const std::string& source, int eighths) {
  Pixels pixels;
  decode_pixels(bytes, size, source, eighths, pixels);
  return pixels;
}

torch::Tensor decode_image(const uint8_t* bytes, size_t size, const std::string& source) {
  Pixels pixels = decode_pixels(bytes, size, source);
  return torch::from_blob(pixels.hwc.data(), {pixels.height, pixels.width, pixels.channels}, torch::kByte)
      .permute({2, 0, 1})
      .clone(at::MemoryFormat::Contiguous);
}

torch::Tensor decode_image_file(const std::string& path) {
  const std::vector<char> bytes = file_bytes(path);
  return decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), path);
}

}  // namespace afterburner::data
