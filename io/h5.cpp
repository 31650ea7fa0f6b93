#include "io/h5.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <memory>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.hpp"

namespace tessera::io::h5 {

namespace {

// Collects the API-level and the innermost description of the current error stack.
struct ErrorText {
  std::string outer, inner;
};

herr_t collect_error(unsigned n, const H5E_error2_t* err, void* data) {
  auto* text = static_cast<ErrorText*>(data);
  if (err->desc == nullptr) return 0;
  if (n == 0) text->outer = err->desc;
  text->inner = err->desc;
  return 0;
}

// The path's non-empty components: "/a/b/" -> {"a", "b"}.
std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (start <= path.size()) {
    std::size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    if (end > start) parts.push_back(path.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

H5I_type_t object_kind(hid_t loc, const std::string& path) {
  if (!exists(loc, path)) return H5I_BADID;
  Object obj(TESSERA_H5(H5Oopen(loc, path.c_str(), H5P_DEFAULT)));
  return H5Iget_type(obj);
}

// The InputScopes alive on this thread, innermost last.
struct Scope {
  std::string file, object;
  InputScope::Access access;
};
thread_local std::vector<Scope> scopes;

// "FILE: OBJECT: " for the innermost scope naming each.
std::string scope_prefix() {
  std::string file, object;
  for (const Scope& s : scopes) {
    file = s.file;
    if (!s.object.empty()) object = s.object;
  }
  return object.empty() ? file + ": " : file + ": " + object + ": ";
}

Attribute open_attr(hid_t obj, const std::string& name) {
  return Attribute(TESSERA_H5(H5Aopen(obj, name.c_str(), H5P_DEFAULT)));
}

void write_scalar_attr(hid_t obj, const std::string& name, hid_t file_type, hid_t mem_type,
                       const void* value) {
  if (TESSERA_H5(H5Aexists(obj, name.c_str())) > 0) TESSERA_H5(H5Adelete(obj, name.c_str()));
  Dataspace space(TESSERA_H5(H5Screate(H5S_SCALAR)));
  Attribute attr(TESSERA_H5(
      H5Acreate2(obj, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT)));
  TESSERA_H5(H5Awrite(attr, mem_type, value));
}

Datatype utf8_variable_string() {
  Datatype type(TESSERA_H5(H5Tcopy(H5T_C_S1)));
  TESSERA_H5(H5Tset_size(type, H5T_VARIABLE));
  TESSERA_H5(H5Tset_cset(type, H5T_CSET_UTF8));
  return type;
}

std::string read_string_attr(hid_t attr, hid_t file_type) {
  if (TESSERA_H5(H5Tis_variable_str(file_type)) > 0) {
    Datatype mem = utf8_variable_string();
    TESSERA_H5(H5Tset_cset(mem, H5Tget_cset(file_type)));
    char* raw = nullptr;
    TESSERA_H5(H5Aread(attr, mem, &raw));
    std::string value = raw != nullptr ? raw : "";
    H5free_memory(raw);
    return value;
  }
  const std::size_t size = H5Tget_size(file_type);
  if (size == 0 || size > (std::size_t{1} << 24)) fail_with(fmt::format("a string attribute of {} bytes", size));
  std::string value(size, '\0');
  TESSERA_H5(H5Aread(attr, file_type, value.data()));
  value.resize(std::min(value.find('\0'), value.size()));
  return value;
}

herr_t collect_attr_name(hid_t, const char* name, const H5A_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}

struct ListState {
  std::string prefix;
  std::vector<std::string>* out;
};

herr_t collect_dataset(hid_t group, const char* name, const H5L_info_t*, void* data) {
  auto* state = static_cast<ListState*>(data);
  Object obj(H5Oopen(group, name, H5P_DEFAULT));
  if (!obj.valid()) return -1;
  std::string path = state->prefix + name;
  H5I_type_t kind = H5Iget_type(obj);
  if (kind == H5I_DATASET) state->out->push_back(path);
  if (kind != H5I_GROUP) return 0;
  ListState inner{path + "/", state->out};
  return H5Literate(obj, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, collect_dataset, &inner);
}

}  // namespace

std::string error_text() {
  ErrorText text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &text);
  H5Eclear2(H5E_DEFAULT);
  std::string why = text.outer;
  if (!text.inner.empty() && text.inner != text.outer) why += " (" + text.inner + ")";
  return why.empty() ? "no HDF5 error message" : why;
}

void fail(const char* expr, const char* file, int line) {
  const std::string why = error_text();
  if (!scopes.empty()) {
    const bool writing = scopes.back().access == InputScope::Access::write;
    throw InputError(fmt::format("{}cannot be {} (HDF5: {}){}", scope_prefix(),
                                 writing ? "written" : "read", why,
                                 writing ? "; check the file system (space, permissions)"
                                         : "; the file is damaged, truncated or not what Tessera expects"));
  }
  throw std::runtime_error(fmt::format("HDF5 call {} failed at {}:{}: {}", expr, file, line, why));
}

void fail_with(const std::string& what) {
  H5Eclear2(H5E_DEFAULT);
  if (!scopes.empty()) throw InputError(scope_prefix() + what);
  throw std::runtime_error(what);
}

InputScope::InputScope(std::string file, std::string object, Access access) {
  scopes.push_back({std::move(file), std::move(object), access});
}

InputScope::~InputScope() { scopes.pop_back(); }

void File::close() {
  if (id_ >= 0) TESSERA_H5(H5Fclose(std::exchange(id_, H5I_INVALID_HID)));
}

void File::reset() noexcept {
  if (id_ < 0) return;
  const hid_t id = std::exchange(id_, H5I_INVALID_HID);
  if (collective_ && std::uncaught_exceptions() > exceptions_) return;  // see the class comment
  H5Fclose(id);
}

void silence_errors() {
  static bool silenced = false;
  if (silenced) return;
  TESSERA_H5(H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr));
  silenced = true;
}

// --- Files ---------------------------------------------------------------------------------

PropList mpio_access(MPI_Comm comm) {
  PropList fapl(TESSERA_H5(H5Pcreate(H5P_FILE_ACCESS)));
  TESSERA_H5(H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL));
  return fapl;
}

PropList collective_transfer() {
  PropList dxpl(TESSERA_H5(H5Pcreate(H5P_DATASET_XFER)));
  TESSERA_H5(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_COLLECTIVE));
  return dxpl;
}

PropList independent_transfer() {
  PropList dxpl(TESSERA_H5(H5Pcreate(H5P_DATASET_XFER)));
  TESSERA_H5(H5Pset_dxpl_mpio(dxpl, H5FD_MPIO_INDEPENDENT));
  return dxpl;
}

namespace {

bool several_ranks(MPI_Comm comm) {
  int size = 1;
  MPI_Comm_size(comm, &size);
  return size > 1;
}

}  // namespace

void use_checksummed_format(hid_t fapl) {
  TESSERA_H5(H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110));
}

File open_parallel(MPI_Comm comm, const std::string& path) {
  silence_errors();
  PropList fapl = mpio_access(comm);
  return File(TESSERA_H5(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl)), several_ranks(comm));
}

File create_parallel(MPI_Comm comm, const std::string& path) {
  silence_errors();
  PropList fapl = mpio_access(comm);
  use_checksummed_format(fapl);
  return File(TESSERA_H5(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl)), several_ranks(comm));
}

File open_serial(const std::string& path) {
  silence_errors();
  return File(TESSERA_H5(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)));
}

File create_serial(const std::string& path) {
  silence_errors();
  PropList fapl(TESSERA_H5(H5Pcreate(H5P_FILE_ACCESS)));
  use_checksummed_format(fapl);
  return File(TESSERA_H5(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl)));
}

std::optional<std::string> describe_unreadable(const std::string& path) {
  silence_errors();
  std::error_code ec;
  auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) return path + ": no such file";
  if (std::filesystem::is_directory(status)) return path + ": is a directory, expected an HDF5 file";
  htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  H5Eclear2(H5E_DEFAULT);
  if (is_hdf5 < 0) return path + ": cannot be read (check its permissions)";
  if (is_hdf5 == 0) return path + ": not an HDF5 file";
  return std::nullopt;
}

// --- Objects -------------------------------------------------------------------------------

bool exists(hid_t loc, const std::string& path) {
  std::string prefix = path.starts_with('/') ? "/" : "";
  const std::vector<std::string> parts = split_path(path);
  for (std::size_t i = 0; i < parts.size(); ++i) {
    prefix += parts[i];
    if (TESSERA_H5(H5Lexists(loc, prefix.c_str(), H5P_DEFAULT)) <= 0) return false;
    // The link is there; its target need not be (a soft link to nothing, an external link to a
    // missing file).
    const htri_t target = H5Oexists_by_name(loc, prefix.c_str(), H5P_DEFAULT);
    if (target <= 0) fail_with(fmt::format("{} is a link to an object that does not exist (a "
                                           "dangling soft or external link)", prefix));
    if (i + 1 < parts.size()) {
      Object obj(TESSERA_H5(H5Oopen(loc, prefix.c_str(), H5P_DEFAULT)));
      if (H5Iget_type(obj) != H5I_GROUP) return false;
    }
    prefix += '/';
  }
  return true;
}

bool is_dataset(hid_t loc, const std::string& path) {
  return object_kind(loc, path) == H5I_DATASET;
}

bool is_group(hid_t loc, const std::string& path) { return object_kind(loc, path) == H5I_GROUP; }

PropList intermediate_groups() {
  PropList lcpl(TESSERA_H5(H5Pcreate(H5P_LINK_CREATE)));
  TESSERA_H5(H5Pset_create_intermediate_group(lcpl, 1));
  return lcpl;
}

Group open_or_create_group(hid_t loc, const std::string& path) {
  if (exists(loc, path)) return Group(TESSERA_H5(H5Gopen2(loc, path.c_str(), H5P_DEFAULT)));
  PropList lcpl = intermediate_groups();
  return Group(TESSERA_H5(H5Gcreate2(loc, path.c_str(), lcpl, H5P_DEFAULT, H5P_DEFAULT)));
}

std::vector<hsize_t> dims(hid_t dataset) {
  Dataspace space(TESSERA_H5(H5Dget_space(dataset)));
  int rank = TESSERA_H5(H5Sget_simple_extent_ndims(space));
  std::vector<hsize_t> out(static_cast<std::size_t>(rank));
  TESSERA_H5(H5Sget_simple_extent_dims(space, out.data(), nullptr));
  return out;
}

std::uint64_t declared_bytes(hid_t dataset) {
  Datatype type(TESSERA_H5(H5Dget_type(dataset)));
  std::uint64_t bytes = H5Tget_size(type);
  for (const hsize_t d : dims(dataset))
    if (__builtin_mul_overflow(bytes, d, &bytes) || bytes > (std::uint64_t{1} << 62))
      fail_with(fmt::format("its shape [{}] declares more than 2^62 bytes", fmt::join(dims(dataset), ",")));
  return bytes;
}

void check_storage(hid_t dataset, const std::string& name) {
  const std::uint64_t declared = declared_bytes(dataset);
  if (declared == 0) return;
  PropList dcpl(TESSERA_H5(H5Dget_create_plist(dataset)));
  const H5D_layout_t layout = H5Pget_layout(dcpl);
  if (layout == H5D_CONTIGUOUS) {
    const hsize_t stored = H5Dget_storage_size(dataset);
    if (stored != declared)
      fail_with(fmt::format("dataset {} stores {} bytes of the {} its shape [{}] declares (damaged, "
                            "or written only in part)", name, stored, declared,
                            fmt::join(dims(dataset), ",")));
  } else if (layout == H5D_CHUNKED) {
    const std::vector<hsize_t> extent = dims(dataset);
    std::vector<hsize_t> chunk(extent.size());
    TESSERA_H5(H5Pget_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()));
    hsize_t expected = 1;
    for (std::size_t d = 0; d < extent.size(); ++d) {
      if (chunk[d] == 0) fail_with(fmt::format("dataset {} has a chunk dimension of 0", name));
      expected *= (extent[d] + chunk[d] - 1) / chunk[d];
    }
    hsize_t stored = 0;
    Dataspace space(TESSERA_H5(H5Dget_space(dataset)));
    TESSERA_H5(H5Dget_num_chunks(dataset, space, &stored));
    if (stored != expected)
      fail_with(fmt::format("dataset {} stores {} of the {} chunks its shape [{}] declares "
                            "(damaged, or written only in part)", name, stored, expected,
                            fmt::join(extent, ",")));
  }
}

std::vector<std::string> list_datasets(hid_t file, const std::string& group) {
  std::vector<std::string> out;
  std::vector<std::string> parts = split_path(group);
  if (!parts.empty() && !is_group(file, group)) return out;
  std::string prefix;
  for (const std::string& part : parts) prefix += part + "/";
  Group root(TESSERA_H5(H5Gopen2(file, parts.empty() ? "/" : group.c_str(), H5P_DEFAULT)));
  ListState state{prefix, &out};
  TESSERA_H5(H5Literate(root, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, collect_dataset, &state));
  std::sort(out.begin(), out.end());
  return out;
}

bool is_ieee_float(hid_t type) {
  if (H5Tget_class(type) != H5T_FLOAT) return false;
  for (hid_t ieee : {H5T_IEEE_F32LE, H5T_IEEE_F32BE, H5T_IEEE_F64LE, H5T_IEEE_F64BE})
    if (H5Tequal(type, ieee) > 0) return true;
  return false;
}

std::string type_name(hid_t type) {
  std::size_t bits = 8 * H5Tget_size(type);
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      return fmt::format("{}int{}", H5Tget_sign(type) == H5T_SGN_NONE ? "u" : "", bits);
    case H5T_FLOAT:
      if (is_ieee_float(type)) return fmt::format("float{}", bits);
      return fmt::format("a non-IEEE float{} (sign, exponent or mantissa placed otherwise)", bits);
    case H5T_STRING:
      return "string";
    default:
      return "other";
  }
}

// --- Attributes ----------------------------------------------------------------------------

void write_attr(hid_t obj, const std::string& name, const Attr& value) {
  if (const auto* i = std::get_if<std::int64_t>(&value)) {
    write_scalar_attr(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, i);
  } else if (const auto* d = std::get_if<double>(&value)) {
    write_scalar_attr(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, d);
  } else {
    Datatype type = utf8_variable_string();
    const char* text = std::get<std::string>(value).c_str();
    write_scalar_attr(obj, name, type, type, &text);
  }
}

void write_float_attr(hid_t obj, const std::string& name, float value) {
  write_scalar_attr(obj, name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, &value);
}

Attr read_attr(hid_t obj, const std::string& name) {
  Attribute attr = open_attr(obj, name);
  Dataspace space(TESSERA_H5(H5Aget_space(attr)));
  if (TESSERA_H5(H5Sget_simple_extent_npoints(space)) != 1) {
    fail_with(fmt::format("attribute {} holds {} values, expected one (a scalar)", name,
                          H5Sget_simple_extent_npoints(space)));
  }
  Datatype type(TESSERA_H5(H5Aget_type(attr)));
  switch (H5Tget_class(type)) {
    case H5T_INTEGER: {
      std::int64_t value = 0;
      TESSERA_H5(H5Aread(attr, H5T_NATIVE_INT64, &value));
      return value;
    }
    case H5T_FLOAT: {
      double value = 0;
      TESSERA_H5(H5Aread(attr, H5T_NATIVE_DOUBLE, &value));
      return value;
    }
    case H5T_STRING:
      return read_string_attr(attr, type);
    default:
      fail_with(fmt::format("attribute {} has type {}, expected an integer, float or string", name,
                            type_name(type)));
  }
}

void write_u64_attr(hid_t obj, const std::string& name, std::uint64_t value) {
  write_scalar_attr(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value);
}

std::optional<std::uint64_t> find_u64_attr(hid_t obj, const std::string& name) {
  if (TESSERA_H5(H5Aexists(obj, name.c_str())) <= 0) return std::nullopt;
  Attribute attr = open_attr(obj, name);
  Dataspace space(TESSERA_H5(H5Aget_space(attr)));
  Datatype type(TESSERA_H5(H5Aget_type(attr)));
  if (TESSERA_H5(H5Sget_simple_extent_npoints(space)) != 1 || H5Tget_class(type) != H5T_INTEGER ||
      H5Tget_size(type) != 8 || H5Tget_sign(type) != H5T_SGN_NONE)
    fail_with(fmt::format("attribute {} is not a scalar uint64", name));
  std::uint64_t value = 0;
  TESSERA_H5(H5Aread(attr, H5T_NATIVE_UINT64, &value));
  return value;
}

std::optional<Attr> find_attr(hid_t obj, const std::string& name) {
  if (TESSERA_H5(H5Aexists(obj, name.c_str())) <= 0) return std::nullopt;
  return read_attr(obj, name);
}

std::map<std::string, Attr> read_attrs(hid_t obj) {
  std::vector<std::string> names;
  TESSERA_H5(H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, collect_attr_name, &names));
  std::map<std::string, Attr> out;
  for (const std::string& name : names) out.emplace(name, read_attr(obj, name));
  return out;
}

}  // namespace tessera::io::h5
