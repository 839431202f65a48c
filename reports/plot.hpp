// reports/plot.hpp: line plots through gnuplot (Debian's gnuplot-nox, pngcairo terminal). The data and
// the script go to a private temporary directory; gnuplot is run without a shell; the PNG is written
// next to the target under a temporary name and renamed over it, so a failed plot leaves nothing behind.
// The same data is what the JSON reports carry, so a plot never holds numbers the reports do not.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace ckv::report {

struct Series {
  std::string title;
  std::vector<std::pair<double, double>> points;  // (x, y), in x order
  bool points_only = false;                       // markers without a line (a scatter)
  bool dashed = false;                            // a fitted or reference line
};

struct LinePlot {
  std::string title, xlabel, ylabel;
  bool log_y = false, log_x = false;
  double y_floor = 0.0;  // log_y: values below are drawn at this floor (and the label says so)
  std::vector<std::pair<double, std::string>> xtics;  // explicit tick labels (empty: automatic)
  std::vector<Series> series;
};

class PlotError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The gnuplot script for `p` reading `data_path` (one block per series) and writing `png_path`.
std::string gnuplot_script(const LinePlot& p, const std::string& data_path, const std::string& png_path);
std::string gnuplot_data(const LinePlot& p);
// Whether a gnuplot executable is on PATH.
bool gnuplot_available();
// Writes the plot; throws PlotError (gnuplot missing or failing) naming the reason.
void write_png(const LinePlot& p, const std::string& png_path);

}  // namespace ckv::report
