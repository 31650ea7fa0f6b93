// Replays saved inputs through a fuzz target without libFuzzer, so that the normal builds
// (Release, ASan + UBSan) run every seed and every regression case under ctest (label `fuzz`).
//   fuzz_replay_<target> PATH...   (a folder stands for its files, in name order)
// Prints each file before it runs, so a crash names its input; exits 0 when every input ran, 2
// when there was none. A finding aborts (fuzz_target.hpp). As libFuzzer's -rss_limit_mb, a
// watchdog aborts when the resident memory passes TESSERA_FUZZ_RSS_MB (2048): some damaged files
// make HDF5 allocate without end, and a replay must not take the machine's memory with it.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
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

// Resident memory in MiB (/proc/self/statm: pages).
long resident_mib() {
  std::ifstream statm("/proc/self/statm");
  long size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE) / (1024 * 1024);
}

void watch_memory() {
  const char* env = std::getenv("TESSERA_FUZZ_RSS_MB");
  const long limit = env != nullptr ? std::atol(env) : 2048;
  std::thread([limit] {
    for (;;) {
      const long rss = resident_mib();
      if (rss > limit) {
        std::fprintf(stderr, "replay: out of memory: %ld MiB resident, more than TESSERA_FUZZ_RSS_MB = %ld\n",
                     rss, limit);
        std::fflush(stderr);
        std::abort();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }).detach();
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<fs::path> files = inputs(argc, argv);
  watch_memory();
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
