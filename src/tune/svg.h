// Small SVG charts for tune's report: horizontal bars with whiskers, and lines over numeric x.
// Self-contained files that any browser opens; every axis is labelled with its unit.
#pragma once

#include <string>
#include <vector>

namespace afterburner::tune::svg {

struct Bar {
  std::string label;
  double value = 0, low = 0, high = 0;  // the bar, and its whisker (min to max)
};

// Bars from a vertical line at `reference` (e.g. 1 for speedups), labelled on the left.
std::string bar_chart(const std::string& title, const std::string& value_axis, const std::vector<Bar>& bars,
                      double reference);

struct Point {
  double x = 0, y = 0;
};

struct Series {
  std::string name;
  std::vector<Point> points;
};

enum class Axis { linear, log };  // log: base 10, for positive values spanning decades

std::string line_chart(const std::string& title, const std::string& x_axis, const std::string& y_axis,
                       const std::vector<Series>& series, Axis x_scale = Axis::linear);

}  // namespace afterburner::tune::svg
