#include "fuzz_target.hpp"

#include <cxxabi.h>
#include <mpi.h>
#include <unistd.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <typeinfo>
#include <vector>

namespace tessera::fuzz {

namespace {

void (*g_on_exit)() = nullptr;
bool g_kokkos = false;

void finish() {
  if (g_on_exit != nullptr) g_on_exit();
  if (g_kokkos && Kokkos::is_initialized()) Kokkos::finalize();
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();
}

// /dev/shm where it can be written (no disk traffic per input), else $TMPDIR, else /tmp.
const std::string& temp_dir() {
  static const std::string dir = [] {
    if (access("/dev/shm", W_OK) == 0) return std::string("/dev/shm");
    const char* tmp = std::getenv("TMPDIR");
    return std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp");
  }();
  return dir;
}

std::string new_temp_path(std::string_view suffix) {
  static std::atomic<unsigned long> counter{0};
  return temp_dir() + "/tessera-fuzz-" + std::to_string(getpid()) + "-" +
         std::to_string(counter++) + std::string(suffix);
}

void write_bytes(const std::string& path, const char* data, std::size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data, static_cast<std::streamsize>(size));
  out.close();
  if (!out) {
    std::fprintf(stderr, "fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

}  // namespace

void start(int* argc, char*** argv, bool kokkos, void (*on_exit)()) {
  // Open MPI's own handlers of SIGSEGV, SIGABRT, ... would replace libFuzzer's and the
  // sanitizers', which save the input; an empty list installs none.
  setenv("OMPI_MCA_opal_signal", "", 0);
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) MPI_Init(argc, argv);
  if (kokkos && !Kokkos::is_initialized()) Kokkos::initialize();
  g_kokkos = kokkos;
  g_on_exit = on_exit;
  std::atexit(finish);
}

void finding(std::string_view target, const std::string& what) {
  static const std::vector<std::string> ignored = [] {
    std::vector<std::string> texts;
    const char* env = std::getenv("TESSERA_FUZZ_IGNORE");
    std::string list = env != nullptr ? env : "";
    for (std::size_t begin = 0; begin < list.size();) {
      const std::size_t end = std::min(list.find('|', begin), list.size());
      if (end > begin) texts.push_back(list.substr(begin, end - begin));
      begin = end + 1;
    }
    return texts;
  }();
  for (const std::string& text : ignored)
    if (what.find(text) != std::string::npos) throw IgnoredFinding{};
  std::fprintf(stderr, "fuzz finding: %.*s: %s\n", static_cast<int>(target.size()), target.data(),
               what.c_str());
  std::fflush(stderr);
  std::abort();
}

bool verbose() {
  static const bool on = std::getenv("TESSERA_FUZZ_VERBOSE") != nullptr;
  return on;
}

void report_input_error(std::string_view target, std::string_view step, const InputError& e) {
  std::fprintf(stderr, "fuzz: %.*s: %.*s: InputError: %s\n", static_cast<int>(target.size()),
               target.data(), static_cast<int>(step.size()), step.data(), e.what());
}

std::string describe(const std::exception& e) {
  const char* mangled = typeid(e).name();
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(abi::__cxa_demangle(mangled, nullptr, nullptr, &status),
                                              std::free);
  return std::string(status == 0 && name ? name.get() : mangled) + ": " + e.what();
}

TempFile::TempFile(const std::uint8_t* data, std::size_t size, std::string_view suffix)
    : path_(new_temp_path(suffix)) {
  write_bytes(path_, reinterpret_cast<const char*>(data), size);
}

TempFile::~TempFile() {
  std::error_code ec;
  std::filesystem::remove(path_, ec);
}

std::string write_temp(std::string_view text, std::string_view suffix) {
  std::string path = new_temp_path(suffix);
  write_bytes(path, text.data(), text.size());
  return path;
}

}  // namespace tessera::fuzz
