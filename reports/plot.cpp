// reports/plot.cpp: see plot.hpp.
#include "reports/plot.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

extern char** environ;

namespace ckv::report {
namespace {
// gnuplot strings are in single quotes: double a quote inside.
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "''";
    else if (c == '\n' || c == '\r')
      out += ' ';
    else
      out += c;
  }
  return out + "'";
}
mode_t current_umask() {
  const mode_t m = ::umask(0);
  ::umask(m);
  return m;
}
}  // namespace

bool gnuplot_available() {
  const char* path = std::getenv("PATH");
  if (!path) return false;
  std::string dirs = path;
  for (size_t start = 0; start <= dirs.size();) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string dir = dirs.substr(start, end - start);
    if (::access(((dir.empty() ? "." : dir) + "/gnuplot").c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

std::string gnuplot_data(const LinePlot& p) {
  std::string out;
  for (const Series& s : p.series) {
    out += "# " + s.title + "\n";
    for (const auto& [x, y] : s.points) {
      const double v = p.log_y ? std::max(y, p.y_floor) : y;
      out += fmt::format("{:.17g} {:.17g}\n", x, v);
    }
    out += "\n\n";  // a new index block
  }
  return out;
}

std::string gnuplot_script(const LinePlot& p, const std::string& data_path, const std::string& png_path) {
  std::string s = "set terminal pngcairo size 1000,600 enhanced font 'sans,10'\n";
  s += "set output " + quoted(png_path) + "\n";
  s += "set title " + quoted(p.title) + " noenhanced\n";
  s += "set xlabel " + quoted(p.xlabel) + " noenhanced\n";
  s += "set ylabel " + quoted(p.ylabel) + " noenhanced\n";
  s += "set key outside right top noenhanced\nset grid\n";
  if (p.log_y) s += "set logscale y\nset format y '10^{%L}'\n";
  if (p.log_x) s += "set logscale x\n";
  if (!p.xtics.empty()) {
    s += "set xtics (";
    for (size_t i = 0; i < p.xtics.size(); ++i)
      s += (i ? ", " : "") + quoted(p.xtics[i].second) + fmt::format(" {:.17g}", p.xtics[i].first);
    s += ") rotate by -45\n";
  }
  s += "plot ";
  for (size_t i = 0; i < p.series.size(); ++i)
    s += (i ? ", \\\n     " : "") + quoted(data_path) +
         fmt::format(" index {} using 1:2 with {} title ", i,
                     p.series[i].points_only ? "points pointsize 2"
                     : p.series[i].dashed    ? "lines dashtype 2"
                                             : "linespoints") +
         quoted(p.series[i].title);
  return s + "\n";
}

namespace {
// A PNG that ends with its IEND chunk: gnuplot exits 0 with the image cut short when the disk fills or a
// file size limit stops its writes.
bool png_complete(const std::string& path) {
  static const unsigned char kEnd[12] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xAE, 0x42, 0x60, 0x82};
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in || in.tellg() < 20) return false;
  in.seekg(-12, std::ios::end);
  unsigned char tail[12] = {};
  in.read(reinterpret_cast<char*>(tail), 12);
  return in.gcount() == 12 && std::memcmp(tail, kEnd, 12) == 0;
}
}  // namespace

void write_png(const LinePlot& p, const std::string& png_path) {
  namespace fs = std::filesystem;
  for (const Series& s : p.series)
    if (s.points.empty()) throw PlotError("no data for \"" + s.title + "\" in " + p.title);
  std::string dir = (fs::temp_directory_path() / "ckverify-plot-XXXXXX").string();
  if (!::mkdtemp(dir.data())) throw PlotError("cannot create a temporary directory for the plot");
  const fs::path target(png_path);
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  std::string tmp_png = (parent / ".ckverify-plot-XXXXXX.png").string();
  const int fd = ::mkstemps(tmp_png.data(), 4);
  auto cleanup = [&] {
    std::error_code ec;
    fs::remove_all(dir, ec);
  };
  if (fd < 0) {
    cleanup();
    throw PlotError("cannot write next to " + png_path + ": " + std::strerror(errno));
  }
  ::close(fd);
  const std::string data = dir + "/data.txt", script = dir + "/plot.gp";
  {
    std::ofstream d(data), g(script);
    d << gnuplot_data(p);
    g << gnuplot_script(p, data, tmp_png);
    d.close(), g.close();
    if (!d || !g) {
      ::unlink(tmp_png.c_str());
      cleanup();
      throw PlotError("cannot write the plot's data to a temporary directory (" + dir + ")");
    }
  }
  std::string prog = "gnuplot", arg = script;
  char* argv[] = {prog.data(), arg.data(), nullptr};
  pid_t pid = 0;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, (dir + "/stderr.txt").c_str(), O_WRONLY | O_CREAT, 0600);
  const int rc = ::posix_spawnp(&pid, "gnuplot", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  int status = 0;
  if (rc == 0) ::waitpid(pid, &status, 0);
  std::string err;
  if (rc != 0) {
    err = "gnuplot is not installed (apt-get install gnuplot-nox)";
  } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::ifstream in(dir + "/stderr.txt");
    std::string line;
    std::getline(in, line);
    err = "gnuplot failed: " + line.substr(0, 200);
  } else if (std::error_code ec; fs::file_size(tmp_png, ec) == 0 || ec) {
    err = "gnuplot wrote no image";
  } else if (!png_complete(tmp_png)) {
    err = "cannot write " + png_path + ": gnuplot's image was cut short (a full disk, or a file size limit)";
  } else if (::chmod(tmp_png.c_str(), 0666 & ~current_umask()) != 0 ||  // mkstemps made it 0600
             std::rename(tmp_png.c_str(), png_path.c_str()) != 0) {
    err = std::string("cannot write ") + png_path + ": " + std::strerror(errno);
  }
  if (!err.empty()) ::unlink(tmp_png.c_str());
  cleanup();
  if (!err.empty()) throw PlotError(err);
}

}  // namespace ckv::report
