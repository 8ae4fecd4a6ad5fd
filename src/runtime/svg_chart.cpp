#include "runtime/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace zp::runtime {

namespace {

// The plot area inside a chart; the legend sits in a column to its right.
constexpr double kWidth = 880, kHeight = 300;
constexpr double kLeft = 70, kRight = 680, kTop = 34, kBottom = 252;
constexpr size_t kLegendRows = 11;

// Tableau 10: distinct on screen and in print.
const char* colour(size_t i) {
  static const char* const c[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                  "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
  return c[i % 10];
}

std::string format(const char* fmt, double v) {
  char b[48];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}

// A tick's text: large values (tokens seen) as 20k, 1.5M, 3G rather than 2e+04.
std::string tick_text(double v) {
  const double a = std::abs(v);
  if (a >= 1e9) return format("%.3gG", v / 1e9);
  if (a >= 1e6) return format("%.3gM", v / 1e6);
  if (a >= 1e4) return format("%.3gk", v / 1e3);
  return format("%.4g", v);
}

// About `want` round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi].
std::vector<double> ticks(double lo, double hi, int want) {
  const double raw = (hi - lo) / want, power = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / power < 1.5 ? power : raw / power < 3.5 ? 2 * power : raw / power < 7.5 ? 5 * power : 10 * power;
  std::vector<double> t;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) t.push_back(std::abs(v) < step * 1e-9 ? 0 : v);
  return t;
}

// A [lo, hi] with room: a constant series gets a band around its value.
void widen(double& lo, double& hi) {
  if (hi > lo) return;
  const double pad = lo == 0 ? 1 : std::abs(lo) * 0.1;
  lo -= pad;
  hi += pad;
}

struct Frame {
  double x0, x1, y0, y1;
  double px(double x) const { return kLeft + (x - x0) / (x1 - x0) * (kRight - kLeft); }
  double py(double y) const { return kBottom - (y - y0) / (y1 - y0) * (kBottom - kTop); }
};

void open_svg(std::ostringstream& o, const std::string& id, const std::string& title) {
  o << "<svg id=\"" << xml_escape(id) << "\" class=\"chart\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 "
    << kWidth << ' ' << kHeight << "\" width=\"" << kWidth << "\" height=\"" << kHeight << "\" role=\"img\">\n"
    << "<title>" << xml_escape(title) << "</title>\n"
    << "<text x=\"" << kLeft << "\" y=\"20\" class=\"title\">" << xml_escape(title) << "</text>\n";
}

// Axes, the y ticks with grid lines, and the axis labels; x ticks are the caller's.
void axes(std::ostringstream& o, const Frame& f, const std::string& x_label, const std::string& y_label) {
  for (double v : ticks(f.y0, f.y1, 5)) {
    const double y = f.py(v);
    o << "<line class=\"grid\" x1=\"" << kLeft << "\" x2=\"" << kRight << "\" y1=\"" << format("%.1f", y)
      << "\" y2=\"" << format("%.1f", y) << "\"/><text class=\"tick\" x=\"" << kLeft - 6 << "\" y=\""
      << format("%.1f", y + 4) << "\" text-anchor=\"end\">" << tick_text(v) << "</text>\n";
  }
  o << "<line class=\"axis\" x1=\"" << kLeft << "\" x2=\"" << kRight << "\" y1=\"" << kBottom << "\" y2=\"" << kBottom
    << "\"/><line class=\"axis\" x1=\"" << kLeft << "\" x2=\"" << kLeft << "\" y1=\"" << kTop << "\" y2=\"" << kBottom
    << "\"/>\n<text class=\"label\" x=\"" << (kLeft + kRight) / 2 << "\" y=\"" << kHeight - 8
    << "\" text-anchor=\"middle\">" << xml_escape(x_label) << "</text>\n<text class=\"label\" x=\"14\" y=\""
    << (kTop + kBottom) / 2 << "\" text-anchor=\"middle\" transform=\"rotate(-90 14 " << (kTop + kBottom) / 2
    << ")\">" << xml_escape(y_label) << "</text>\n";
}

// A legend column right of the plot; past kLegendRows entries one line says how many more.
void legend(std::ostringstream& o, const std::vector<std::string>& labels) {
  for (size_t i = 0; i < labels.size() && i <= kLegendRows; ++i) {
    const double y = kTop + 4 + 20.0 * double(i);
    if (i == kLegendRows) {
      o << "<text class=\"legend\" x=\"" << kRight + 16 << "\" y=\"" << y + 9 << "\">and "
        << labels.size() - kLegendRows << " more</text>\n";
      break;
    }
    // Long labels (paths) keep their end, the part that tells files apart.
    const std::string& l = labels[i];
    size_t from = l.size() > 24 ? l.size() - 23 : 0;
    while (from < l.size() && (static_cast<unsigned char>(l[from]) & 0xC0) == 0x80) ++from;  // not mid-UTF-8
    const std::string shown = from > 0 ? "..." + l.substr(from) : l;
    o << "<rect x=\"" << kRight + 16 << "\" y=\"" << y << "\" width=\"12\" height=\"12\" fill=\"" << colour(i)
      << "\"/><text class=\"legend\" x=\"" << kRight + 34 << "\" y=\"" << y + 10 << "\">" << xml_escape(shown)
      << "<title>" << xml_escape(l) << "</title></text>\n";
  }
}

}  // namespace

std::string xml_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::vector<ChartPoint> decimate(const std::vector<ChartPoint>& points, size_t max_points) {
  if (points.size() <= max_points || max_points < 2) return points;
  const size_t buckets = max_points / 2;
  std::vector<ChartPoint> out;
  out.reserve(max_points);
  for (size_t b = 0; b < buckets; ++b) {
    const size_t begin = points.size() * b / buckets, end = points.size() * (b + 1) / buckets;
    size_t lo = begin, hi = begin;
    for (size_t i = begin; i < end; ++i) {
      if (points[i].y < points[lo].y) lo = i;
      if (points[i].y > points[hi].y) hi = i;
    }
    out.push_back(points[std::min(lo, hi)]);
    if (lo != hi) out.push_back(points[std::max(lo, hi)]);
  }
  return out;
}

std::string svg_line_chart(const LineChart& chart) {
  std::vector<std::vector<ChartPoint>> drawn;
  std::vector<std::string> labels;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const ChartSeries& s : chart.series) {
    std::vector<ChartPoint> finite;
    for (const ChartPoint& p : s.points)
      if (std::isfinite(p.x) && std::isfinite(p.y)) finite.push_back(p);
    if (finite.empty()) continue;
    drawn.push_back(decimate(finite, kMaxChartPoints));
    labels.push_back(s.label);
    for (const ChartPoint& p : drawn.back()) {
      x0 = std::min(x0, p.x), x1 = std::max(x1, p.x);
      y0 = std::min(y0, p.y), y1 = std::max(y1, p.y);
    }
  }
  if (drawn.empty()) return "";
  if (chart.from_zero) y0 = std::min(y0, 0.0);
  widen(x0, x1);
  widen(y0, y1);
  const Frame f{x0, x1, y0, y1};
  std::ostringstream o;
  open_svg(o, chart.id, chart.title);
  axes(o, f, chart.x_label, chart.y_label);
  for (double v : ticks(x0, x1, 6))
    o << "<text class=\"tick\" x=\"" << format("%.1f", f.px(v)) << "\" y=\"" << kBottom + 16
      << "\" text-anchor=\"middle\">" << tick_text(v) << "</text>\n";
  for (size_t i = 0; i < drawn.size(); ++i) {
    o << "<polyline class=\"series\" fill=\"none\" stroke=\"" << colour(i) << "\" points=\"";
    for (size_t k = 0; k < drawn[i].size(); ++k)
      o << (k ? " " : "") << format("%.1f", f.px(drawn[i][k].x)) << ',' << format("%.1f", f.py(drawn[i][k].y));
    o << "\"><title>" << xml_escape(labels[i]) << "</title></polyline>\n";
    // A lone point (one validation) would be an invisible polyline: mark it.
    if (drawn[i].size() == 1)
      o << "<circle cx=\"" << format("%.1f", f.px(drawn[i][0].x)) << "\" cy=\"" << format("%.1f", f.py(drawn[i][0].y))
        << "\" r=\"3\" fill=\"" << colour(i) << "\"/>\n";
  }
  legend(o, labels);
  o << "</svg>\n";
  return o.str();
}

std::string svg_stacked_bars(const StackedBars& chart) {
  if (chart.bars.empty()) return "";
  double top = 0;
  for (const auto& bar : chart.values) {
    double sum = 0;
    for (double v : bar) sum += std::max(v, 0.0);
    top = std::max(top, sum);
  }
  double y0 = 0, y1 = top;
  widen(y0, y1);
  const Frame f{0, double(chart.bars.size()), 0, y1};
  std::ostringstream o;
  open_svg(o, chart.id, chart.title);
  axes(o, f, chart.x_label, chart.y_label);
  const double slot = (kRight - kLeft) / double(chart.bars.size()), width = std::max(slot * 0.8, 1.0);
  const size_t label_every = (chart.bars.size() + 11) / 12;  // at most about 12 labels under the bars
  for (size_t b = 0; b < chart.bars.size(); ++b) {
    const double x = kLeft + slot * double(b) + (slot - width) / 2;
    double base = 0;
    for (size_t l = 0; l < chart.layers.size() && l < chart.values[b].size(); ++l) {
      const double v = std::max(chart.values[b][l], 0.0);
      if (!(v > 0)) continue;
      o << "<rect class=\"bar\" x=\"" << format("%.1f", x) << "\" y=\"" << format("%.1f", f.py(base + v))
        << "\" width=\"" << format("%.1f", width) << "\" height=\"" << format("%.1f", f.py(base) - f.py(base + v))
        << "\" fill=\"" << colour(l) << "\"><title>" << xml_escape(chart.bars[b]) << ": "
        << xml_escape(chart.layers[l]) << ' ' << format("%.4g", v) << "</title></rect>\n";
      base += v;
    }
    if (b % label_every == 0)
      o << "<text class=\"tick\" x=\"" << format("%.1f", x + width / 2) << "\" y=\"" << kBottom + 16
        << "\" text-anchor=\"middle\">" << xml_escape(chart.bars[b]) << "</text>\n";
  }
  legend(o, chart.layers);
  o << "</svg>\n";
  return o.str();
}

}  // namespace zp::runtime
