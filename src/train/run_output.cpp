#include "train/run_output.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>
#include <vector>

#include "core/error.hpp"
#include "io/metrics_file.hpp"
#include "io/small_file.hpp"

namespace tessera {

namespace fs = std::filesystem;

namespace {
constexpr const char* csv_header =
    "kind,step,epoch,loss,lr,grad_norm,samples_per_s,accuracy,wall_s,"
    "t_data,t_forward,t_backward,t_allreduce,t_optimizer,t_tensor,t_pipeline,rel_l2";

std::string opt(const std::optional<double>& v) {
  return v ? fmt::format("{:.9g}", *v) : std::string();
}

// metrics.h5's columns per row kind; optional values absent from a row are NaN.
const std::vector<io::MetricsGroup>& h5_groups() {
  static const std::vector<io::MetricsGroup> groups = {
      {"train",
       {{"step", true}, {"epoch", true}, {"loss"}, {"lr"}, {"grad_norm"}, {"samples_per_s"},
        {"wall_s"}, {"t_data"}, {"t_forward"}, {"t_backward"}, {"t_allreduce"}, {"t_optimizer"}}},
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
  return {step, epoch, r.loss, v(r.lr), v(r.grad_norm), v(r.samples_per_s), r.wall_s,
          v(r.t_data), v(r.t_forward), v(r.t_backward), v(r.t_allreduce), v(r.t_optimizer)};
}

// A metrics.csv line (csv_header's columns) back as a row.
MetricsRow parse_row(const std::string& line) {
  std::vector<std::string> cells;
  std::stringstream in(line);
  for (std::string cell; std::getline(in, cell, ',');) cells.push_back(cell);
  cells.resize(17);
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
  return r;
}

// Keeps the rows whose step is <= last_step (a resumed run rewrites what follows). A line that is
// not a metrics row is bad input, found before anything is written.
std::vector<std::string> rows_up_to(const fs::path& path, std::int64_t last_step) {
  std::vector<std::string> kept;
  std::ifstream in(path);
  std::string line;
  for (std::size_t number = 1; std::getline(in, line); ++number) {
    if (number == 1) continue;  // the header
    MetricsRow row;
    try {
      row = parse_row(line);
    } catch (const std::exception&) {
      throw InputError(fmt::format("{}:{}: not a metrics row (expected the columns of the header); "
                                   "fix or delete the line to resume", path.string(), number));
    }
    if (row.step <= last_step) kept.push_back(line);
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
  csv_ << csv_header << '\n';
  for (const auto& row : kept) csv_ << row << '\n';
  csv_.flush();

  // metrics.h5 from the rows metrics.csv kept: the CSV is flushed line by line, so it is the
  // record that survives a crash.
  h5_ = std::make_unique<io::MetricsFile>((fs::path(dir_) / "metrics.h5").string(), h5_groups());
  std::map<std::string, std::vector<double>> values;
  for (const auto& line : kept) {
    const MetricsRow r = parse_row(line);
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
  csv_ << fmt::format("{},{},{},{:.9g},{},{},{},{},{:.3f},{},{},{},{},{},{},{},{}\n", r.kind, r.step,
                      r.epoch, r.loss, opt(r.lr), opt(r.grad_norm), opt(r.samples_per_s),
                      opt(r.accuracy), r.wall_s, opt(r.t_data), opt(r.t_forward),
                      opt(r.t_backward), opt(r.t_allreduce), opt(r.t_optimizer), opt(r.t_tensor),
                      opt(r.t_pipeline), opt(r.rel_l2));
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
