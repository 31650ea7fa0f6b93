#pragma once
// The deck schema: one row per key (section, name, type, allowed values, one-line doc, and how to
// read and write it in a Config). Parsing, validation, to_toml() and deck_keys() all walk this
// table, so a new key is one row in deck_schema.cpp. Internal to core/deck*.cpp.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/config.hpp"

namespace tessera::deck {

enum class KeyType { integer, floating, boolean, string, int_array, choice };

/// A key's value, independent of the member's C++ type: integers as int64, enums by name.
using Value = std::variant<std::int64_t, double, bool, std::string, std::vector<std::int64_t>>;

/// One end of a numeric range; `open` excludes the bound itself.
struct Bound {
  double value;
  bool open = false;
};

/// Allowed values of a numeric key (or of each element of an int array). `note` is appended to
/// the description ("(>= 1 unless train.steps > 0)").
struct Range {
  std::optional<Bound> lo;
  std::optional<Bound> hi;
  std::string_view note;
};

struct KeySpec {
  std::string_view section;
  std::string_view name;
  KeyType type = KeyType::integer;
  Range range;                           ///< integer, floating, int_array (each element)
  bool non_empty = false;                ///< string
  std::vector<std::string_view> choices; ///< choice: the accepted names
  std::int64_t int_min = INT64_MIN;      ///< integer: limits of the member's C++ type
  std::int64_t int_max = INT64_MAX;
  std::string_view doc;
  std::function<Value(const Config&)> get;
  std::function<void(Config&, const Value&)> set;

  std::string full_name() const;
  /// What is allowed, as a phrase: "an integer >= 1", "a float in [0, 1)", "one of "sgd", "adamw"".
  std::string allowed() const;
  /// The type as a word for docs: "integer", "float", "boolean", "string", "integer array", "enum".
  std::string_view type_name() const;
};

/// Every key, sections in the order of DESIGN.md.
const std::vector<KeySpec>& schema();
/// Section names in schema order.
const std::vector<std::string_view>& sections();
/// The key `section.name`, or nullptr.
const KeySpec* find_key(std::string_view section, std::string_view name);

/// TOML text of a value ("0.05", "[512, 512]", "\"runs/x\"").
std::string format_value(const KeySpec& key, const Value& v);
/// A TOML basic string: "runs/\"x\"".
std::string quote(std::string_view s);
/// True when `v` lies in `r`.
bool in_range(const Range& r, double v);

/// Deck names of the enums, in one place (used by the schema and by tessera::to_string).
template <class E>
struct Choice {
  std::string_view name;
  E value;
};
inline constexpr Choice<ModelKind> kModelKinds[] = {
    {"mlp", ModelKind::mlp}, {"cnn", ModelKind::cnn}, {"gpt", ModelKind::gpt}, {"unet", ModelKind::unet}, {"llama", ModelKind::llama}};
inline constexpr Choice<Precision> kPrecisions[] = {
    {"fp32", Precision::fp32}, {"bf16", Precision::bf16}, {"fp16", Precision::fp16}};
inline constexpr Choice<GemmLibrary> kGemmLibraries[] = {
    {"auto", GemmLibrary::automatic}, {"openblas", GemmLibrary::openblas}, {"onednn", GemmLibrary::onednn}};
inline constexpr Choice<ConvLibrary> kConvLibraries[] = {
    {"auto", ConvLibrary::automatic}, {"im2col", ConvLibrary::im2col}, {"onednn", ConvLibrary::onednn}};
inline constexpr Choice<Activation> kActivations[] = {{"relu", Activation::relu},
                                                      {"gelu", Activation::gelu}};
inline constexpr Choice<GeluApproximate> kGeluApproximates[] = {{"none", GeluApproximate::none},
                                                                {"tanh", GeluApproximate::tanh}};
inline constexpr Choice<FieldNormalize> kFieldNormalize[] = {{"auto", FieldNormalize::automatic},
                                                             {"none", FieldNormalize::none},
                                                             {"channel", FieldNormalize::channel}};
inline constexpr Choice<LossKind> kLossKinds[] = {{"auto", LossKind::automatic},
                                                  {"cross_entropy", LossKind::cross_entropy},
                                                  {"mse", LossKind::mse}};
inline constexpr Choice<OptimizerKind> kOptimizerKinds[] = {{"sgd", OptimizerKind::sgd},
                                                            {"adamw", OptimizerKind::adamw}};
inline constexpr Choice<OptimizerOffload> kOptimizerOffloads[] = {{"none", OptimizerOffload::none},
                                                                   {"host", OptimizerOffload::host},
                                                                   {"disk", OptimizerOffload::disk}};
inline constexpr Choice<ScheduleKind> kScheduleKinds[] = {{"constant", ScheduleKind::constant},
                                                          {"cosine", ScheduleKind::cosine},
                                                          {"step", ScheduleKind::step},
                                                          {"cosine_restarts", ScheduleKind::cosine_restarts}};
inline constexpr Choice<PipelineSchedule> kPipelineSchedules[] = {
    {"gpipe", PipelineSchedule::gpipe}, {"1f1b", PipelineSchedule::one_f_one_b}};
inline constexpr Choice<ZeroGroup> kZeroGroups[] = {{"data", ZeroGroup::replica}, {"node", ZeroGroup::node}};
inline constexpr Choice<ContextComm> kContextComms[] = {{"all_to_all", ContextComm::all_to_all},
                                                      {"ring", ContextComm::ring}};
inline constexpr Choice<AllreduceAlgorithm> kAllreduceAlgorithms[] = {
    {"mpi", AllreduceAlgorithm::mpi},
    {"ring", AllreduceAlgorithm::ring},
    {"parameter-server", AllreduceAlgorithm::parameter_server},
    {"hierarchical", AllreduceAlgorithm::hierarchical}};
inline constexpr Choice<ReduceDtype> kReduceDtypes[] = {{"fp32", ReduceDtype::fp32}, {"bf16", ReduceDtype::bf16}};
inline constexpr Choice<CommBackend> kCommBackends[] = {
    {"auto", CommBackend::automatic},
    {"mpi", CommBackend::mpi},
    {"cuda-aware-mpi", CommBackend::cuda_aware_mpi},
    {"staged", CommBackend::staged},
    {"nccl", CommBackend::nccl}};

}  // namespace tessera::deck
