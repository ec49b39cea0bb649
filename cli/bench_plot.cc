#include "cli/bench_plot.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gradsync {
namespace {

constexpr double kWidth = 860, kHeight = 520;
constexpr double kLeft = 80, kRight = 230, kTop = 50, kBottom = 70;  // margins; legend on the right

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// A round step (1, 2 or 5 times a power of ten) giving about `ticks` ticks up to max.
double NiceStep(double max, int ticks) {
  const double raw = max / ticks;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * mag >= raw) return m * mag;
  }
  return 10 * mag;
}

}  // namespace

std::string SizeLabel(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  uint64_t v = bytes;
  while (u < 4 && v >= 1024 && v % 1024 == 0) {
    v /= 1024;
    ++u;
  }
  return absl::StrCat(v, " ", kUnits[u]);
}

std::string BusBandwidthSvg(const std::string& title, const std::vector<PlotPoint>& points,
                            const std::vector<PlotLimit>& limits) {
  const double pw = kWidth - kLeft - kRight, ph = kHeight - kTop - kBottom;
  double lo = points.empty() ? 1 : std::max<double>(1, points.front().bytes);
  double hi = points.empty() ? 2 : std::max<double>(lo * 2, points.back().bytes);
  double ymax = 0;
  for (const PlotPoint& p : points) ymax = std::max(ymax, p.busbw_gbps);
  for (const PlotLimit& l : limits) ymax = std::max(ymax, l.gbps);
  if (ymax <= 0) ymax = 1;
  const double step = NiceStep(ymax * 1.05, 5);
  const double ytop = std::ceil(ymax * 1.05 / step) * step;
  auto X = [&](double bytes) {
    return kLeft + (std::log2(std::max(bytes, lo)) - std::log2(lo)) / (std::log2(hi) - std::log2(lo)) * pw;
  };
  auto Y = [&](double gbps) { return kTop + ph - gbps / ytop * ph; };

  std::string svg = absl::StrFormat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
      "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%.0f\" y=\"28\" font-size=\"15\">%s</text>\n",
      kWidth, kHeight, kWidth, kHeight, kLeft, Escape(title));
  // Axes, grid and ticks.
  absl::StrAppendFormat(&svg,
                        "<g stroke=\"black\"><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>"
                        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/></g>\n",
                        kLeft, kTop + ph, kLeft + pw, kTop + ph, kLeft, kTop, kLeft, kTop + ph);
  for (double v = 0; v <= ytop + step / 2; v += step) {
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n",
                          kLeft, Y(v), kLeft + pw, Y(v), kLeft - 6, Y(v) + 4, v);
  }
  // One x tick per size of the table, labelled at most every ~60 px.
  double last_label = -1e9;
  for (const PlotPoint& p : points) {
    const double x = X(static_cast<double>(p.bytes));
    absl::StrAppendFormat(&svg, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                          x, kTop + ph, x, kTop + ph + 4);
    if (x - last_label >= 60) {
      absl::StrAppendFormat(&svg, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", x,
                            kTop + ph + 18, SizeLabel(p.bytes));
      last_label = x;
    }
  }
  absl::StrAppendFormat(&svg,
                        "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">message size (bytes per rank, "
                        "log scale)</text>\n"
                        "<text transform=\"translate(22 %.1f) rotate(-90)\" text-anchor=\"middle\">busbw "
                        "(GB/s)</text>\n",
                        kLeft + pw / 2, kHeight - 24, kTop + ph / 2);
  // The limits, dashed, labelled in the legend.
  static const char* kColors[] = {"#d62728", "#2ca02c", "#9467bd", "#8c564b"};
  double legend_y = kTop + 10;
  absl::StrAppendFormat(&svg,
                        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#1f77b4\" "
                        "stroke-width=\"2\"/><text x=\"%.1f\" y=\"%.1f\">busbw (measured)</text>\n",
                        kLeft + pw + 14, legend_y, kLeft + pw + 40, legend_y, kLeft + pw + 46, legend_y + 4);
  for (size_t i = 0; i < limits.size(); ++i) {
    const char* color = kColors[i % 4];
    legend_y += 20;
    absl::StrAppendFormat(
        &svg,
        "<line class=\"limit\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
        "stroke-dasharray=\"6 4\"/>\n"
        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-dasharray=\"6 4\"/>"
        "<text x=\"%.1f\" y=\"%.1f\">%s: %.3g GB/s</text>\n",
        kLeft, Y(limits[i].gbps), kLeft + pw, Y(limits[i].gbps), color, kLeft + pw + 14, legend_y,
        kLeft + pw + 40, legend_y, color, kLeft + pw + 46, legend_y + 4, Escape(limits[i].label),
        limits[i].gbps);
  }
  // The measured curve.
  std::string line;
  for (const PlotPoint& p : points) {
    absl::StrAppendFormat(&line, "%s%.1f,%.1f", line.empty() ? "" : " ",
                          X(static_cast<double>(p.bytes)), Y(p.busbw_gbps));
  }
  absl::StrAppendFormat(&svg,
                        "<polyline class=\"busbw\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" "
                        "points=\"%s\"/>\n",
                        line);
  for (const PlotPoint& p : points) {
    absl::StrAppendFormat(&svg,
                          "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#1f77b4\"><title>%s: %.3f "
                          "GB/s</title></circle>\n",
                          X(static_cast<double>(p.bytes)), Y(p.busbw_gbps), SizeLabel(p.bytes),
                          p.busbw_gbps);
  }
  svg += "</svg>\n";
  return svg;
}

absl::Status WriteBusBandwidthPlot(const std::string& path, const std::string& title,
                                   const std::vector<PlotPoint>& points,
                                   const std::vector<PlotLimit>& limits) {
  if (!absl::EndsWith(path, ".svg")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--plot '", path, "': the plot is written as SVG; name the file *.svg"));
  }
  std::ofstream out(path, std::ios::trunc);
  out << BusBandwidthSvg(title, points, limits);
  out.close();
  if (!out) return absl::InvalidArgumentError(absl::StrCat("--plot: cannot write '", path, "'"));
  return absl::OkStatus();
}

}  // namespace gradsync
