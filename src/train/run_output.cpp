#include "train/run_output.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <vector>

namespace tessera {

namespace fs = std::filesystem;

namespace {
constexpr const char* csv_header =
    "kind,step,epoch,loss,lr,grad_norm,samples_per_s,accuracy,wall_s,"
    "t_data,t_forward,t_backward,t_allreduce,t_optimizer,t_tensor,t_pipeline";

std::string opt(const std::optional<double>& v) {
  return v ? fmt::format("{:.9g}", *v) : std::string();
}

// Keeps the header and the rows whose step is <= last_step (a resumed run rewrites what follows).
std::vector<std::string> rows_up_to(const fs::path& path, std::int64_t last_step) {
  std::vector<std::string> kept;
  std::ifstream in(path);
  std::string line;
  bool header = true;
  while (std::getline(in, line)) {
    if (header) { header = false; continue; }
    const auto c1 = line.find(','), c2 = line.find(',', c1 + 1);
    if (c1 == std::string::npos || c2 == std::string::npos) continue;
    if (std::stoll(line.substr(c1 + 1, c2 - c1 - 1)) <= last_step) kept.push_back(line);
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
}

void RunOutput::log(const std::string& line) {
  if (!writer_) return;
  std::cout << line << std::endl;
  log_ << line << std::endl;
}

void RunOutput::metrics(const MetricsRow& r) {
  if (!writer_) return;
  csv_ << fmt::format("{},{},{},{:.9g},{},{},{},{},{:.3f},{},{},{},{},{},{},{}\n", r.kind, r.step,
                      r.epoch, r.loss, opt(r.lr), opt(r.grad_norm), opt(r.samples_per_s),
                      opt(r.accuracy), r.wall_s, opt(r.t_data), opt(r.t_forward),
                      opt(r.t_backward), opt(r.t_allreduce), opt(r.t_optimizer), opt(r.t_tensor),
                      opt(r.t_pipeline));
  csv_.flush();
}

void RunOutput::summary(const nlohmann::json& j) {
  if (!writer_) return;
  const fs::path final_path = fs::path(dir_) / "summary.json";
  const fs::path tmp = fs::path(dir_) / "summary.json.tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump(2) << '\n';
  }
  fs::rename(tmp, final_path);
}

std::string format_duration(double seconds) {
  if (!(seconds >= 0.0) || seconds > 1e8) return "?";
  const auto s = static_cast<long long>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

}  // namespace tessera
