// Replays saved inputs through a fuzz target without libFuzzer, so that the normal builds
// (Release, ASan + UBSan) run every seed and every regression case under ctest (label `fuzz`).
//   fuzz_replay_<target> PATH...   (a folder stands for its files, in name order)
// Prints each file before it runs, so a crash names its input; exits 0 when every input ran, 2
// when there was none. A finding aborts (fuzz_target.hpp).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv);
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

namespace fs = std::filesystem;

std::vector<fs::path> inputs(int argc, char** argv) {
  std::vector<fs::path> files;
  for (int i = 1; i < argc; ++i) {
    const fs::path arg(argv[i]);
    if (!fs::is_directory(arg)) {
      files.push_back(arg);
      continue;
    }
    std::vector<fs::path> in_dir;
    for (const auto& entry : fs::directory_iterator(arg))
      if (entry.is_regular_file() && entry.path().filename().string().front() != '.')
        in_dir.push_back(entry.path());
    std::sort(in_dir.begin(), in_dir.end());
    files.insert(files.end(), in_dir.begin(), in_dir.end());
  }
  return files;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<fs::path> files = inputs(argc, argv);
  LLVMFuzzerInitialize(&argc, &argv);
  for (const fs::path& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "replay: cannot read %s\n", file.c_str());
      return 2;
    }
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::fprintf(stderr, "replay: %s (%zu bytes)\n", file.c_str(), bytes.size());
    std::fflush(stderr);
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  }
  std::fprintf(stderr, "replay: %zu input(s), no finding\n", files.size());
  return files.empty() ? 2 : 0;
}
