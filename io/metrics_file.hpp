#pragma once
// metrics.h5: the history of a run's logged rows, for analysis (docs/analysis.md). One group per
// row kind ("train", "eval") holding one 1-D dataset per column, all of a group's datasets the
// same length (one element per row); integer columns are int64, the others float64 with NaN where
// a row has no value. One process writes it with HDF5's serial driver, appending rows and
// flushing after each append, so a run killed between appends leaves every row before the kill
// readable.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace tessera::io {

/// The value of the root attribute `format` of a metrics file.
inline constexpr const char* kMetricsFormat = "tessera-metrics";
/// The layout version this code writes.
inline constexpr std::int64_t kMetricsFormatVersion = 1;

/// One column of a metrics group.
struct MetricsColumn {
  std::string name;
  bool integer = false;  ///< int64 dataset (values are rounded); otherwise float64
};

/// A group ("train") and its columns, in the order append() takes values.
using MetricsGroup = std::pair<std::string, std::vector<MetricsColumn>>;

/// \brief A metrics file open for appending. Local: one process owns it.
class MetricsFile {
 public:
  /// \brief Creates (truncates) path with the given groups and empty datasets; throws
  /// std::runtime_error naming the file if it cannot.
  MetricsFile(const std::string& path, const std::vector<MetricsGroup>& groups);
  ~MetricsFile();
  MetricsFile(MetricsFile&&) noexcept;
  MetricsFile& operator=(MetricsFile&&) noexcept;

  /// \brief Appends rows to group and flushes the file. values: rows x columns, row-major, in
  /// the group's column order; its size must be a multiple of the column count.
  void append(const std::string& group, std::span<const double> values);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// \brief One column of a metrics file as doubles (integers converted). Local. InputError naming
/// the file and the dataset if either is missing.
std::vector<double> read_metrics_column(const std::string& path, const std::string& group,
                                        const std::string& column);

}  // namespace tessera::io
