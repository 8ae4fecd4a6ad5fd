// Charts as inline SVG text, for the run report (runtime/run_report_html.h): line charts (one
// polyline per series) and stacked bar charts (one <rect> per bar and layer), each with axes, ticks
// and a legend. Drawn by our own code so that the report needs no script, font or network.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace zp::runtime {

// Text for HTML and SVG, content or attribute value: & < > " ' escaped.
std::string xml_escape(std::string_view s);

struct ChartPoint {
  double x, y;
};

// At most `max_points` of `points` (ordered by x): per bucket of consecutive points its lowest and
// highest, in their order, so a 1M-step run draws in a few thousand points and still shows its
// spikes. Fewer than max_points come back unchanged.
std::vector<ChartPoint> decimate(const std::vector<ChartPoint>& points, size_t max_points);

constexpr size_t kMaxChartPoints = 2000;  // per series

struct ChartSeries {
  std::string label;
  std::vector<ChartPoint> points;  // NaN y values are left out when drawn
};

struct LineChart {
  std::string id, title, x_label, y_label;
  std::vector<ChartSeries> series;
  bool from_zero = false;  // the y axis starts at 0 (rates, memory): small wiggles do not fill the chart
};

// An <svg id="<id>"> with one <polyline> per series that has points (each decimated to
// kMaxChartPoints), or "" when no series has a point.
std::string svg_line_chart(const LineChart& chart);

struct StackedBars {
  std::string id, title, x_label, y_label;
  std::vector<std::string> layers;     // what each part of a bar is, bottom first
  std::vector<std::string> bars;       // a label under each bar
  std::vector<std::vector<double>> values;  // [bar][layer], >= 0
};

// An <svg id="<id>"> with one <rect> per bar and non-zero layer, or "" when there is no bar.
std::string svg_stacked_bars(const StackedBars& chart);

}  // namespace zp::runtime
