#include "train/run_output.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>
#include <string_view>
#include <vector>

#include "core/error.hpp"
#include "io/metrics_file.hpp"
#include "io/small_file.hpp"

namespace tessera {

namespace fs = std::filesystem;

namespace {
// metrics.csv's columns in order. A new column goes at the end, so that every older column keeps
// its position for the scripts that read them by position (awk -F, '{ print $4 }').
constexpr std::array<std::string_view, 18> csv_columns = {
    "kind",        "step",        "epoch",    "loss",       "lr",     "grad_norm",
    "samples_per_s", "accuracy",  "wall_s",   "t_data",     "t_forward", "t_backward",
    "t_allreduce", "t_optimizer", "t_tensor", "t_pipeline", "rel_l2", "tokens_per_s"};

std::string opt(const std::optional<double>& v) {
  return v ? fmt::format("{:.9g}", *v) : std::string();
}

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> cells;
  std::stringstream in(line);
  for (std::string cell; std::getline(in, cell, ',');) cells.push_back(cell);
  return cells;
}

// metrics.h5's columns per row kind; optional values absent from a row are NaN.
const std::vector<io::MetricsGroup>& h5_groups() {
  static const std::vector<io::MetricsGroup> groups = {
      {"train",
       {{"step", true}, {"epoch", true}, {"loss"}, {"lr"}, {"grad_norm"}, {"samples_per_s"},
        {"tokens_per_s"}, {"wall_s"}, {"t_data"}, {"t_forward"}, {"t_backward"}, {"t_allreduce"},
        {"t_optimizer"}}},
      {"eval", {{"step", true}, {"epoch", true}, {"loss"}, {"accuracy"}, {"wall_s"}, {"rel_l2"}}},
  };
  return groups;
}

// A row's values in the column order of its h5_groups() entry.
std::vector<double> h5_values(const MetricsRow& r) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto v = [nan](const std::optional<double>& x) { return x.value_or(nan); };
  const auto step = static_cast<double>(r.step), epoch = static_cast<double>(r.epoch);
  if (r.kind == "eval") return {step, epoch, r.loss, v(r.accuracy), r.wall_s, v(r.rel_l2)};
  return {step,         epoch,          r.loss,          v(r.lr),          v(r.grad_norm),
          v(r.samples_per_s), v(r.tokens_per_s), r.wall_s, v(r.t_data), v(r.t_forward),
          v(r.t_backward), v(r.t_allreduce), v(r.t_optimizer)};
}

// A row as a metrics.csv line (csv_columns' order).
std::string csv_line(const MetricsRow& r) {
  return fmt::format("{},{},{},{:.9g},{},{},{},{},{:.3f},{},{},{},{},{},{},{},{},{}", r.kind, r.step,
                     r.epoch, r.loss, opt(r.lr), opt(r.grad_norm), opt(r.samples_per_s),
                     opt(r.accuracy), r.wall_s, opt(r.t_data), opt(r.t_forward), opt(r.t_backward),
                     opt(r.t_allreduce), opt(r.t_optimizer), opt(r.t_tensor), opt(r.t_pipeline),
                     opt(r.rel_l2), opt(r.tokens_per_s));
}

// The cells of a metrics.csv line (csv_columns' order) back as a row.
MetricsRow parse_row(const std::vector<std::string>& cells) {
  auto opt_of = [&](std::size_t i) {
    return cells[i].empty() ? std::nullopt : std::optional<double>(std::stod(cells[i]));
  };
  MetricsRow r;
  r.kind = cells[0];
  if (r.kind != "train" && r.kind != "eval") throw std::invalid_argument("row kind " + r.kind);
  r.step = std::stoll(cells[1]);
  r.epoch = std::stoll(cells[2]);
  r.loss = std::stod(cells[3]);
  r.lr = opt_of(4);
  r.grad_norm = opt_of(5);
  r.samples_per_s = opt_of(6);
  r.accuracy = opt_of(7);
  r.wall_s = opt_of(8).value_or(0.0);
  r.t_data = opt_of(9);
  r.t_forward = opt_of(10);
  r.t_backward = opt_of(11);
  r.t_allreduce = opt_of(12);
  r.t_optimizer = opt_of(13);
  r.t_tensor = opt_of(14);
  r.t_pipeline = opt_of(15);
  r.rel_l2 = opt_of(16);
  r.tokens_per_s = opt_of(17);
  return r;
}

// Where each of a metrics.csv header's columns goes in csv_columns. A file written before a column
// was added has no cell for it; a column this version does not know is bad input.
std::vector<std::size_t> column_places(const fs::path& path, const std::string& header) {
  const auto has = [](const std::vector<std::size_t>& v, std::size_t x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  };
  std::vector<std::size_t> places;
  for (const std::string& name : split_csv(header)) {
    const auto place = static_cast<std::size_t>(
        std::find(csv_columns.begin(), csv_columns.end(), name) - csv_columns.begin());
    if (place == csv_columns.size() || has(places, place))
      throw InputError(fmt::format("{}:1: column '{}' is not one of metrics.csv's ({}), or comes twice; "
                                   "fix or delete the file to resume", path.string(), name,
                                   fmt::join(csv_columns, ",")));
    places.push_back(place);
  }
  for (std::size_t required = 0; required < 4; ++required)  // kind, step, epoch, loss
    if (!has(places, required))
      throw InputError(fmt::format("{}:1: the header has no column '{}'; fix or delete the file to resume",
                                   path.string(), csv_columns[required]));
  return places;
}

// The rows whose step is <= last_step (a resumed run rewrites what follows), as lines of today's
// columns: a file written before a column was added keeps its cells, moved by column name, and the
// new column stays empty. A line that is not a metrics row is bad input, found before anything is
// written.
std::vector<std::string> rows_up_to(const fs::path& path, std::int64_t last_step) {
  std::vector<std::string> kept;
  std::ifstream in(path);
  std::string line;
  std::vector<std::size_t> places;
  for (std::size_t number = 1; std::getline(in, line); ++number) {
    if (number == 1) {
      places = column_places(path, line);
      continue;
    }
    std::vector<std::string> cells = split_csv(line), row(csv_columns.size());
    cells.resize(places.size());  // a trailing empty cell is not read
    for (std::size_t c = 0; c < places.size(); ++c) row[places[c]] = cells[c];
    std::int64_t step = 0;
    try {
      step = parse_row(row).step;
    } catch (const std::exception&) {
      throw InputError(fmt::format("{}:{}: not a metrics row (expected the columns of the header); "
                                   "fix or delete the line to resume", path.string(), number));
    }
    if (step <= last_step) kept.push_back(fmt::format("{}", fmt::join(row, ",")));
  }
  return kept;
}
}  // namespace

RunOutput::RunOutput(bool writer, const std::string& dir, std::optional<std::int64_t> resume_step)
    : writer_(writer), dir_(dir) {
  if (!writer_) return;
  fs::create_directories(dir_);
  const fs::path csv = fs::path(dir_) / "metrics.csv";
  std::vector<std::string> kept;
  if (resume_step) kept = rows_up_to(csv, *resume_step);
  log_.open(fs::path(dir_) / "log.txt", resume_step ? std::ios::app : std::ios::trunc);
  csv_.open(csv, std::ios::trunc);
  csv_ << fmt::format("{}", fmt::join(csv_columns, ",")) << '\n';
  for (const auto& row : kept) csv_ << row << '\n';
  csv_.flush();

  // metrics.h5 from the rows metrics.csv kept: the CSV is flushed line by line, so it is the
  // record that survives a crash.
  h5_ = std::make_unique<io::MetricsFile>((fs::path(dir_) / "metrics.h5").string(), h5_groups());
  std::map<std::string, std::vector<double>> values;
  for (const auto& line : kept) {
    std::vector<std::string> cells = split_csv(line);
    cells.resize(csv_columns.size());
    const MetricsRow r = parse_row(cells);
    const auto v = h5_values(r);
    values[r.kind].insert(values[r.kind].end(), v.begin(), v.end());
  }
  for (const auto& [kind, v] : values) h5_->append(kind, v);
}

RunOutput::~RunOutput() = default;

void RunOutput::log(const std::string& line) {
  if (!writer_) return;
  std::cout << line << std::endl;
  log_ << line << std::endl;
}

void RunOutput::metrics(const MetricsRow& r) {
  if (!writer_) return;
  csv_ << csv_line(r) << '\n';
  csv_.flush();
  h5_->append(r.kind, h5_values(r));
}

void RunOutput::summary(const nlohmann::json& j) {
  if (!writer_) return;
  io::write_file_atomically((fs::path(dir_) / "summary.json").string(), j.dump(2) + "\n");
}

std::string format_duration(double seconds) {
  if (!(seconds >= 0.0) || seconds > 1e8) return "?";
  const auto s = static_cast<long long>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

double eta_seconds(const Progress& p) {
  const auto at_least_one = [](std::int64_t n) { return static_cast<double>(std::max<std::int64_t>(1, n)); };
  const double step = p.interval_step_s / at_least_one(p.step - p.last_logged_step);
  const double between = std::max(0.0, p.loop_s - p.loop_step_s) / at_least_one(p.step - p.loop_start_step);
  return (step + between) * static_cast<double>(std::max<std::int64_t>(0, p.total_steps - p.step));
}

std::string format_rate(double per_second) {
  if (!std::isfinite(per_second) || per_second <= 0.0) return per_second == 0.0 ? "0" : "?";
  const int exponent = static_cast<int>(std::floor(std::log10(per_second)));
  const double unit = std::pow(10.0, exponent - 2);  // the third significant digit's place
  const double rounded = std::round(per_second / unit) * unit;
  // Rounding up can carry into a new digit (999.6 -> 1000): one decimal fewer then.
  const int decimals = std::max(0, 2 - static_cast<int>(std::floor(std::log10(rounded))));
  return fmt::format("{:.{}f}", rounded, decimals);
}

}  // namespace tessera
