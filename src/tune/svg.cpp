#include "svg.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace afterburner::tune::svg {
namespace {

constexpr double kWidth = 720, kMarginLeft = 240, kMarginRight = 40, kTop = 40, kBottom = 50;
const char* const kColours[] = {"#3366cc", "#dc3912", "#109618", "#ff9900", "#990099"};

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

std::string header(double height, const std::string& title) {
  return fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">{3}</text>\n",
      kWidth, height, kWidth / 2, escape(title));
}

std::string text(double x, double y, const std::string& content, const char* anchor = "middle") {
  return fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"{}\">{}</text>\n", x, y, anchor, escape(content));
}

std::string line(double x1, double y1, double x2, double y2, const char* colour = "black") {
  return fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\"/>\n", x1, y1, x2, y2,
                     colour);
}

// Maps [low, high] (padded to include `always`) onto [from, to] pixels.
struct Scale {
  double low, high, from, to;
  double operator()(double v) const { return from + (v - low) / (high - low) * (to - from); }
};

Scale scale(std::vector<double> values, double from, double to) {
  auto [lo, hi] = std::minmax_element(values.begin(), values.end());
  double low = *lo, high = *hi;
  if (high - low < 1e-12) high = low + 1;
  double pad = (high - low) * 0.05;
  return {low - pad, high + pad, from, to};
}

std::string ticks(const Scale& s, bool horizontal, double at, Axis axis = Axis::linear) {
  std::string out;
  for (int i = 0; i <= 4; ++i) {
    double v = s.low + (s.high - s.low) * i / 4;
    double p = s(v);
    auto label = fmt::format("{:.4g}", axis == Axis::log ? std::pow(10.0, v) : v);
    out += horizontal ? line(p, at, p, at + 5) + text(p, at + 18, label)
                      : line(at - 5, p, at, p) + text(at - 8, p + 4, label, "end");
  }
  return out;
}

}  // namespace

std::string bar_chart(const std::string& title, const std::string& value_axis, const std::vector<Bar>& bars,
                      double reference) {
  const double row = 26, height = kTop + row * double(bars.size()) + kBottom;
  std::vector<double> values{reference};
  for (const auto& bar : bars) values.insert(values.end(), {bar.value, bar.low, bar.high});
  Scale x = scale(values, kMarginLeft, kWidth - kMarginRight);
  std::string out = header(height, title);
  for (size_t i = 0; i < bars.size(); ++i) {
    const auto& bar = bars[i];
    double y = kTop + row * double(i);
    double from = x(std::min(reference, bar.value)), to = x(std::max(reference, bar.value));
    out += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\"/>\n", from, y + 4,
                       std::max(to - from, 1.0), row - 8, bar.value >= reference ? kColours[0] : kColours[1]);
    out += line(x(bar.low), y + row / 2, x(bar.high), y + row / 2);
    out += text(kMarginLeft - 8, y + row / 2 + 4, bar.label, "end");
  }
  const double axis = kTop + row * double(bars.size());
  out += line(x(reference), kTop, x(reference), axis, "gray");
  out += line(kMarginLeft, axis, kWidth - kMarginRight, axis) + ticks(x, true, axis);
  out += text((kMarginLeft + kWidth - kMarginRight) / 2, height - 10, value_axis);
  return out + "</svg>\n";
}

std::string line_chart(const std::string& title, const std::string& x_axis, const std::string& y_axis,
                       const std::vector<Series>& series_given, Axis x_scale) {
  const double height = 400;
  std::vector<Series> series = series_given;
  std::vector<double> xs, ys;
  for (auto& s : series) {
    for (auto& p : s.points) {
      if (x_scale == Axis::log) p.x = std::log10(p.x);
      xs.push_back(p.x);
      ys.push_back(p.y);
    }
  }
  if (xs.empty()) xs = ys = {0};
  Scale x = scale(xs, kMarginLeft / 2, kWidth - kMarginRight), y = scale(ys, height - kBottom, kTop);
  std::string out = header(height, title);
  out += line(kMarginLeft / 2, height - kBottom, kWidth - kMarginRight, height - kBottom) + ticks(x, true, height - kBottom, x_scale);
  out += line(kMarginLeft / 2, kTop, kMarginLeft / 2, height - kBottom) + ticks(y, false, kMarginLeft / 2);
  out += text((kMarginLeft / 2 + kWidth - kMarginRight) / 2, height - 12, x_axis);
  out += fmt::format("<text x=\"16\" y=\"{:.1f}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {:.1f})\">{}</text>\n",
                     height / 2, height / 2, escape(y_axis));
  for (size_t i = 0; i < series.size(); ++i) {
    const char* colour = kColours[i % std::size(kColours)];
    std::string points;
    for (const auto& p : series[i].points) {
      points += fmt::format("{:.1f},{:.1f} ", x(p.x), y(p.y));
      out += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", x(p.x), y(p.y), colour);
    }
    out += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\"/>\n", points, colour);
    out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"{}\">{}</text>\n", kWidth - kMarginRight - 150,
                       kTop + 16 * double(i + 1), colour, escape(series[i].name));
  }
  return out + "</svg>\n";
}

}  // namespace afterburner::tune::svg
