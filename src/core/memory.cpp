#include "core/memory.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <Kokkos_Core.hpp>
#include <fmt/format.h>

#include <atomic>
#include <cstdint>
#include <fstream>

namespace tessera::mem {

namespace {

constexpr auto kCount = static_cast<std::size_t>(Category::count);
constexpr std::array<std::string_view, kCount> kNames = {"param", "grad", "optim", "act", "comm", "data", "lib"};

std::array<std::atomic<std::int64_t>, kCount> g_current{};
std::array<std::atomic<std::int64_t>, kCount> g_peak{};
std::atomic<std::int64_t> g_total{0}, g_total_peak{0};

void raise_peak(std::atomic<std::int64_t>& peak, std::int64_t now) {
  std::int64_t seen = peak.load();
  while (now > seen && !peak.compare_exchange_weak(seen, now)) {
  }
}
std::atomic<bool> g_installed{false};

// The category tagged at the start of a label, or count when there is none.
std::size_t category_of(const char* label) {
  if (label == nullptr || label[0] != '[') return kCount;
  const std::string_view text(label);
  const auto close = text.find(']');
  if (close == std::string_view::npos) return kCount;
  const auto tag = text.substr(1, close - 1);
  for (std::size_t i = 0; i < kCount; ++i)
    if (kNames[i] == tag) return i;
  return kCount;
}

void add(std::size_t c, std::int64_t bytes) {
  raise_peak(g_peak[c], g_current[c].fetch_add(bytes) + bytes);
  raise_peak(g_total_peak, g_total.fetch_add(bytes) + bytes);
}

void on_allocate(const Kokkos_Profiling_SpaceHandle, const char* label, const void*, std::uint64_t size) {
  const std::size_t c = category_of(label);
  if (c != kCount) add(c, static_cast<std::int64_t>(size));
}

void on_deallocate(const Kokkos_Profiling_SpaceHandle, const char* label, const void*, std::uint64_t size) {
  const std::size_t c = category_of(label);
  if (c != kCount) add(c, -static_cast<std::int64_t>(size));
}

}  // namespace

std::string_view name(Category c) { return kNames.at(static_cast<std::size_t>(c)); }

std::string label(Category c, std::string_view what) { return fmt::format("[{}] {}", name(c), what); }

void install_tracking() {
  if (g_installed.exchange(true)) return;
  Kokkos::Tools::Experimental::set_allocate_data_callback(on_allocate);
  Kokkos::Tools::Experimental::set_deallocate_data_callback(on_deallocate);
}

bool tracking_installed() { return g_installed.load(); }

void count_external(Category c, std::int64_t bytes) { add(static_cast<std::size_t>(c), bytes); }

std::size_t current(Category c) {
  return static_cast<std::size_t>(std::max<std::int64_t>(0, g_current.at(static_cast<std::size_t>(c)).load()));
}

std::size_t peak(Category c) {
  return static_cast<std::size_t>(std::max<std::int64_t>(0, g_peak.at(static_cast<std::size_t>(c)).load()));
}

std::size_t peak_total() { return static_cast<std::size_t>(std::max<std::int64_t>(0, g_total_peak.load())); }

std::size_t resident_peak() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0 || u.ru_maxrss < 0) return 0;
  return static_cast<std::size_t>(u.ru_maxrss) * 1024;  // Linux counts kibibytes
}

NodeMemory node_memory() {
  NodeMemory m;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  m.bytes = pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
  m.source = "physical memory";
  // A cgroup (v2, then v1) may allow less.
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    double limit = 0;
    if (in >> limit && limit > 0 && (m.bytes == 0 || limit < m.bytes)) {
      m.bytes = limit;
      m.source = std::string("cgroup limit ") + path;
    }
  }
  return m;
}

}  // namespace tessera::mem
