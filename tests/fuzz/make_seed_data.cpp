// Writes the tiny supervised datasets of the fuzz seeds with Tessera's own writer
// (io::DatasetWriter, as `tessera prepare` uses): make_seeds.sh runs it.
//   tessera_fuzz_seed_data DIR [TRAIN TEST]
//     -> DIR/supervised.h5 (labels, the shape of seed_data.hpp, TRAIN and TEST samples, by default
//        those of seed_data.hpp; the checkpoint seed trains on it), DIR/regression.h5 (targets),
//        DIR/deck.dict (libFuzzer dictionary of the deck's names), DIR/all_keys.toml (every key at
//        its default, for the deck seeds: mutations then reach every value).
// tests/robustness/test_damage.py writes a larger supervised.h5 with it.
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/deck.hpp"
#include "core/error.hpp"
#include "io/dataset_writer.hpp"
#include "seed_data.hpp"

namespace {

using namespace tessera;

void write_supervised(const std::string& path, std::int64_t train, std::int64_t test) {
  io::DatasetWriter out(path);
  const auto side = static_cast<std::uint64_t>(fuzz::kSeedImageSide);
  for (const auto& [split, n] : {std::pair{"train", train}, std::pair{"test", test}}) {
    const auto rows = static_cast<std::uint64_t>(n);
    std::vector<std::uint8_t> pixels(rows * side * side), labels(rows);
    for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<std::uint8_t>((i * 37) % 251);
    for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::uint8_t>(i % fuzz::kSeedClasses);
    const std::string group = std::string("/") + split;
    out.write(group + "/inputs", {rows, side, side}, std::span<const std::uint8_t>(pixels));
    out.write_float_attr(group + "/inputs", "scale", 1.0f / 255.0f);
    out.write_float_attr(group + "/inputs", "offset", 0.0f);
    out.write(group + "/labels", {rows}, std::span<const std::uint8_t>(labels));
    out.write_attr(group + "/labels", "classes", fuzz::kSeedClasses);
  }
  out.write_attr("/", "format", std::string("tessera-dataset"));
  out.close();
}

void write_regression(const std::string& path) {
  io::DatasetWriter out(path);
  const std::uint64_t rows = 6, features = 3, width = 2;
  std::vector<float> inputs(rows * features), targets(rows * width);
  for (std::size_t i = 0; i < inputs.size(); ++i) inputs[i] = 0.25f * static_cast<float>(i) - 1.0f;
  for (std::size_t i = 0; i < targets.size(); ++i) targets[i] = 0.5f * static_cast<float>(i);
  out.write("/train/inputs", {rows, features}, std::span<const float>(inputs));
  out.write("/train/targets", {rows, width}, std::span<const float>(targets));
  out.close();
}

// Sections, keys, the enums' names and a few TOML tokens, one quoted entry per line.
void write_deck_dictionary(const std::string& path) {
  std::set<std::string> words;
  for (const std::string& key : deck_keys()) {
    const std::size_t dot = key.find('.');
    words.insert(fmt::format("[{}]", key.substr(0, dot)));
    words.insert(fmt::format("{} = ", key.substr(dot + 1)));
    words.insert(fmt::format("{}=", key));
  }
  for (auto name : {to_string(ModelKind::mlp), to_string(ModelKind::cnn), to_string(ModelKind::gpt),
                    to_string(Precision::fp32), to_string(Precision::bf16), to_string(Precision::fp16),
                    to_string(Activation::relu), to_string(Activation::gelu),
                    to_string(LossKind::automatic), to_string(LossKind::cross_entropy), to_string(LossKind::mse),
                    to_string(OptimizerKind::sgd), to_string(OptimizerKind::adamw),
                    to_string(ScheduleKind::constant), to_string(ScheduleKind::cosine), to_string(ScheduleKind::step),
                    to_string(PipelineSchedule::gpipe), to_string(PipelineSchedule::one_f_one_b),
                    to_string(AllreduceAlgorithm::mpi), to_string(AllreduceAlgorithm::ring),
                    to_string(AllreduceAlgorithm::parameter_server),
                    to_string(CommBackend::automatic), to_string(CommBackend::mpi),
                    to_string(CommBackend::cuda_aware_mpi), to_string(CommBackend::staged), to_string(CommBackend::nccl)})
    words.insert(fmt::format("\"{}\"", name));
  for (const char* token : {"true", "false", "inf", "-inf", "nan", "0", "-1", "2147483647", "2147483648",
                            "9223372036854775807", "-9223372036854775808", "1e308", "5e-324", "[]", "[0]",
                            "[1, 1]", "0x7fffffff", "\"\"", "'''", "\"\"\"", "{ }", "[[", "]]"})
    words.insert(token);
  std::ofstream out(path);
  for (const std::string& w : words) {
    out << '"';
    for (char c : w) {
      if (c == '"' || c == '\\') out << '\\';
      out << c;
    }
    out << "\"\n";
  }
  if (!out.flush()) throw std::runtime_error(path + ": cannot write");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 4) {
    std::fprintf(stderr, "usage: %s DIR [TRAIN_SAMPLES TEST_SAMPLES]\n", argv[0]);
    return 2;
  }
  const std::int64_t train = argc == 4 ? std::atoll(argv[2]) : fuzz::kSeedTrainSamples;
  const std::int64_t test = argc == 4 ? std::atoll(argv[3]) : fuzz::kSeedTestSamples;
  if (train < 1 || test < 1) {
    std::fprintf(stderr, "%s: sample counts must be positive\n", argv[0]);
    return 2;
  }
  MPI_Init(&argc, &argv);
  int code = 0;
  try {
    write_supervised(std::string(argv[1]) + "/supervised.h5", train, test);
    write_regression(std::string(argv[1]) + "/regression.h5");
    write_deck_dictionary(std::string(argv[1]) + "/deck.dict");
    std::ofstream(std::string(argv[1]) + "/all_keys.toml") << to_toml(Config{});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera_fuzz_seed_data: %s\n", e.what());
    code = 1;
  }
  MPI_Finalize();
  return code;
}
