#include "io/h5_probe.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "comm/agree.hpp"
#include "comm/mpi_check.hpp"
#include "core/error.hpp"
#include "io/h5.hpp"

// Under AddressSanitizer (GCC or clang) the child drops a fuzzer's death callback (plain_crashes).
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TESSERA_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define TESSERA_ASAN 1
#endif
#ifndef TESSERA_ASAN
#define TESSERA_ASAN 0
#endif
#if TESSERA_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

namespace tessera::io::h5 {

namespace {

// The most bytes one attribute may hold in a probe: a damaged size must not exhaust memory.
constexpr hssize_t kMaxAttributeBytes = hssize_t{1} << 28;
constexpr int kExitHdf5Error = 10;
constexpr unsigned long long kProbeExtraBytes = 4ULL << 30;

double probe_seconds() {
  const char* text = std::getenv("TESSERA_PROBE_SECONDS");
  const double s = text != nullptr ? std::atof(text) : 0.0;
  return s > 0.0 ? s : kProbeSeconds;
}

// The first HDF5 error of the walk, in HDF5's words (later API calls, a handle's close among
// them, clear HDF5's own stack).
std::string first_error;

herr_t failed() {
  if (first_error.empty()) first_error = error_text();
  return -1;
}

// Reads one attribute's value whole, whatever its type (variable-length parts reclaimed).
herr_t read_attribute(hid_t loc, const char* name, const H5A_info_t*, void*) {
  Attribute attr(H5Aopen(loc, name, H5P_DEFAULT));
  if (!attr.valid()) return failed();
  Datatype type(H5Aget_type(attr));
  Dataspace space(H5Aget_space(attr));
  if (!type.valid() || !space.valid()) return failed();
  const hssize_t n = H5Sget_simple_extent_npoints(space);
  if (n < 0) return failed();
  const bool variable = H5Tis_variable_str(type) > 0 || H5Tdetect_class(type, H5T_VLEN) > 0;
  Datatype memory(variable ? H5Tget_native_type(type, H5T_DIR_DEFAULT) : H5Tcopy(type));
  if (!memory.valid()) return failed();
  const std::size_t size = H5Tget_size(memory);
  if (size == 0 || static_cast<double>(n) * static_cast<double>(size) > static_cast<double>(kMaxAttributeBytes)) {
    if (first_error.empty()) first_error = fmt::format("attribute {} declares {} values of {} bytes", name, n, size);
    return -1;
  }
  std::vector<unsigned char> buffer(static_cast<std::size_t>(n) * size + 1);
  if (H5Aread(attr, memory, buffer.data()) < 0) return failed();
  if (variable) H5Dvlen_reclaim(memory, space, H5P_DEFAULT, buffer.data());
  return 0;
}

// Everything of one object a reader may touch: its header, its attributes, a dataset's type,
// shape, layout and chunk index.
herr_t visit_object(hid_t root, const char* name, const H5O_info_t*, void*) {
  Object obj(H5Oopen(root, name, H5P_DEFAULT));
  if (!obj.valid()) return failed();
  if (H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, read_attribute, nullptr) < 0) return failed();
  if (H5Iget_type(obj) != H5I_DATASET) return 0;
  Datatype type(H5Dget_type(obj));
  Dataspace space(H5Dget_space(obj));
  PropList dcpl(H5Dget_create_plist(obj));
  if (!type.valid() || !space.valid() || !dcpl.valid() || H5Sget_simple_extent_npoints(space) < 0) return failed();
  H5Dget_storage_size(obj);
  if (H5Pget_layout(dcpl) == H5D_CHUNKED) {
    hsize_t chunks = 0;
    if (H5Dget_num_chunks(obj, space, &chunks) < 0) return failed();
  }
  return 0;
}

// The child's work: "" when every piece of metadata reads, else HDF5's reason.
std::string walk(const std::string& path) {
  silence_errors();
  // HDF5 clears its error stack at every API call: take its words before anything else runs.
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (file < 0) return error_text();
  if (H5Ovisit2(file, H5_INDEX_NAME, H5_ITER_NATIVE, visit_object, nullptr, H5O_INFO_BASIC) < 0)
    return first_error.empty() ? error_text() : first_error;
  return H5Fclose(file) < 0 ? error_text() : "";
}

/// In the child: at most kProbeExtraBytes of address space beyond what the process has mapped
/// already (a damaged header can declare a 20 GB message; the allocation then fails inside HDF5
/// and is reported as its error rather than swapping the node).
void limit_address_space() {
  std::FILE* statm = std::fopen("/proc/self/statm", "r");
  if (statm == nullptr) return;
  unsigned long long pages = 0;
  const int got = std::fscanf(statm, "%llu", &pages);
  std::fclose(statm);
  if (got != 1) return;
  const unsigned long long bytes = pages * static_cast<unsigned long long>(::sysconf(_SC_PAGESIZE));
  const rlimit limit{bytes + kProbeExtraBytes, bytes + kProbeExtraBytes};
  ::setrlimit(RLIMIT_AS, &limit);
}

/// In the child: a crash ends the child and nothing else. The parent's handlers are reset (Open
/// MPI's would print a backtrace; a fuzzer's would record the parent's input as its own crash), and
/// under AddressSanitizer its report ends the child without the death callback a fuzzer set.
void plain_crashes() {
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) ::signal(sig, SIG_DFL);
#if TESSERA_ASAN
  __sanitizer_set_death_callback(nullptr);
#endif
}

}  // namespace

namespace {

// Reads path's metadata in a forked child; what probe() answers when it has no clean result to reuse.
std::optional<std::string> probe_in_child(const std::string& path) {
  const double seconds = probe_seconds();
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return std::nullopt;  // no sandbox to be had: read as before
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return std::nullopt;
  }
  if (pid == 0) {
    // The child: no MPI, no destructors, no atexit handlers; its answer through the pipe.
    ::close(fds[0]);
    ::alarm(static_cast<unsigned>(seconds) + 5);
    limit_address_space();
    plain_crashes();
    const std::string error = walk(path);
    if (!error.empty()) (void)!::write(fds[1], error.data(), error.size());
    ::_exit(error.empty() ? 0 : kExitHdf5Error);
  }
  ::close(fds[1]);
  std::string message;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  bool timed_out = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    char buf[4096];
    const ssize_t got = ::read(fds[0], buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;  // the child closed its end: it is done
    message.append(buf, static_cast<std::size_t>(got));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out)
    return fmt::format("{}: reading its metadata did not finish within {} s: the file is damaged (a damaged HDF5 "
                       "file can make the HDF5 library loop)", path, seconds);
  if (WIFSIGNALED(status))
    return fmt::format("{}: reading its metadata crashed the HDF5 library (signal {}): the file is damaged",
                       path, WTERMSIG(status));
  if (WIFEXITED(status) && WEXITSTATUS(status) == kExitHdf5Error) {
    return fmt::format("{}: cannot be read (HDF5: {}); the file is damaged, truncated or not what Tessera "
                       "expects", path, message);
  }
  // Any other end is a failure too (a sanitizer's report in an instrumented build exits 1).
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
    return fmt::format("{}: reading its metadata failed in the HDF5 library (exit {}): the file is damaged",
                       path, WEXITSTATUS(status));
  return std::nullopt;
}

// A file as stat() sees it: a clean probe of it holds while these have not changed.
struct FileIdentity {
  dev_t device = 0;
  ino_t inode = 0;
  off_t size = 0;
  std::int64_t mtime_ns = 0, ctime_ns = 0;
  bool operator==(const FileIdentity&) const = default;
};

std::optional<FileIdentity> identity_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  const auto ns = [](const timespec& t) { return std::int64_t{t.tv_sec} * 1000000000 + t.tv_nsec; };
  return FileIdentity{st.st_dev, st.st_ino, st.st_size, ns(st.st_mtim), ns(st.st_ctim)};
}

// Whether a file last changed long enough ago that a later change must move its timestamps (they
// advance in clock ticks: a file rewritten within one tick can keep them). Newer files are probed
// every time.
bool settled(const FileIdentity& id) {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  const std::int64_t now_ns = std::int64_t{now.tv_sec} * 1000000000 + now.tv_nsec;
  constexpr std::int64_t kSettledNs = 2000000000;
  return std::max(id.mtime_ns, id.ctime_ns) < now_ns - kSettledNs;
}

// The settled files whose metadata read cleanly in this process (a run opens its dataset for the
// training and the test split, each reader opens it again; a resume looks at a checkpoint before
// it loads it).
std::mutex clean_mutex;
std::map<std::string, FileIdentity> clean_files;

}  // namespace

std::optional<std::string> probe(const std::string& path) {
  const std::optional<FileIdentity> before = identity_of(path);
  if (before && settled(*before)) {
    const std::lock_guard lock(clean_mutex);
    const auto it = clean_files.find(path);
    if (it != clean_files.end() && it->second == *before) return std::nullopt;
  }
  std::optional<std::string> why = probe_in_child(path);
  const std::optional<FileIdentity> after = identity_of(path);
  if (!why && before && after == before && settled(*before)) {
    const std::lock_guard lock(clean_mutex);
    clean_files[path] = *before;
  }
  return why;
}

void check_openable(MPI_Comm comm, const std::string& path) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  agree(comm, [&] {
    if (std::optional<std::string> why = describe_unreadable(path)) throw InputError(*why);
    if (rank != 0) return;
    if (std::optional<std::string> why = probe(path)) throw InputError(*why);
  });
}

}  // namespace tessera::io::h5
