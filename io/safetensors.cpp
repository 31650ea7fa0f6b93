#include "io/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "io/output_file.hpp"

namespace tessera::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian bytes; this code copies them as they are");

namespace {

// A header longer than this is no model's (the reference implementation has the same bound).
constexpr std::uint64_t kMaxHeaderBytes = std::uint64_t{100} << 20;

// Bytes per element of the dtypes that convert to float32; 0 for any other.
std::uint64_t dtype_bytes(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  if (dtype == "F64") return 8;
  return 0;
}

float from_bf16(std::uint16_t h) {
  const std::uint32_t bits = std::uint32_t{h} << 16;
  return std::bit_cast<float>(bits);
}

// IEEE half: sign, 5 exponent bits (bias 15), 10 mantissa bits; subnormals scaled by 2^-24.
float from_f16(std::uint16_t h) {
  const float sign = (h & 0x8000u) != 0 ? -1.0f : 1.0f;
  const unsigned exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -24);
  if (exponent == 31)
    return mantissa == 0 ? sign * std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  return sign * std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
}

// product(shape) * bytes, or nothing where it overflows 64 bits.
bool byte_count(const std::vector<std::uint64_t>& shape, std::uint64_t bytes, std::uint64_t& out) {
  out = bytes;
  for (std::uint64_t d : shape) {
    if (d != 0 && out > std::numeric_limits<std::uint64_t>::max() / d) return false;
    out *= d;
  }
  return true;
}

std::vector<std::uint64_t> unsigned_array(const nlohmann::json& j, std::size_t size, const std::string& where) {
  bool ok = j.is_array() && (size == 0 || j.size() == size);
  for (std::size_t i = 0; ok && i < j.size(); ++i) ok = j[i].is_number_unsigned();
  if (!ok)
    throw InputError(fmt::format("{}: expected {}, got {}", where,
                                 size ? fmt::format("an array of {} integers >= 0", size)
                                      : std::string("an array of integers >= 0"),
                                 j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).substr(0, 80)));
  std::vector<std::uint64_t> out;
  for (const auto& v : j) out.push_back(v.get<std::uint64_t>());
  return out;
}

SafetensorsEntry parse_entry(const std::string& file, const std::string& name, const nlohmann::json& j) {
  const std::string where = fmt::format("{}: tensor {}", file, name);
  if (!j.is_object() || !j.contains("dtype") || !j.contains("shape") || !j.contains("data_offsets"))
    throw InputError(where + ": expected an object with dtype, shape and data_offsets");
  if (!j["dtype"].is_string()) throw InputError(where + ": dtype is not a string");
  SafetensorsEntry e;
  e.name = name;
  e.dtype = j["dtype"].get<std::string>();
  if (dtype_bytes(e.dtype) == 0)
    throw InputError(fmt::format("{}: dtype \"{}\" does not convert to float32 (F32, F16, BF16 and F64 do)",
                                 where, e.dtype));
  e.shape = unsigned_array(j["shape"], 0, where + ": shape");
  const auto offsets = unsigned_array(j["data_offsets"], 2, where + ": data_offsets");
  e.begin = offsets[0];
  e.end = offsets[1];
  std::uint64_t bytes = 0;
  if (!byte_count(e.shape, dtype_bytes(e.dtype), bytes) || e.end < e.begin || e.end - e.begin != bytes)
    throw InputError(fmt::format("{}: data_offsets [{}, {}) do not hold the {} bytes of a {} tensor of shape [{}]",
                                 where, e.begin, e.end, bytes, e.dtype, fmt::join(e.shape, ",")));
  return e;
}

nlohmann::json parse_header(const std::string& path, std::ifstream& in, std::uint64_t file_size,
                            std::uint64_t& data_start) {
  unsigned char length_bytes[8];
  if (file_size < 8 || !in.read(reinterpret_cast<char*>(length_bytes), 8))
    throw InputError(fmt::format("{}: {} bytes, too short for a safetensors file (an 8-byte header length first)",
                                 path, file_size));
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | length_bytes[i];
  if (n > file_size - 8)
    throw InputError(fmt::format("{}: header length {} goes beyond the file ({} bytes): not a safetensors "
                                 "file, or truncated", path, n, file_size));
  if (n > kMaxHeaderBytes)
    throw InputError(fmt::format("{}: header length {} exceeds the {} bytes a safetensors header may have",
                                 path, n, kMaxHeaderBytes));
  std::string text(n, '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(n)))
    throw InputError(fmt::format("{}: cannot read its {}-byte header", path, n));
  data_start = 8 + n;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{}: the safetensors header is not JSON: {}", path, e.what()));
  }
  if (!header.is_object())
    throw InputError(fmt::format("{}: the safetensors header is JSON but not an object", path));
  return header;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    const std::uint64_t bytes = t.values.size() * sizeof(float);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  // Names and metadata are UTF-8 in the format; a path with other bytes is written with U+FFFD.
  std::string text = header.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  text.append((8 - text.size() % 8) % 8, ' ');  // the data start 8-byte aligned
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(std::uint64_t{text.size()} >> (8 * i));
  OutputFile out(path);
  out.write(length, sizeof length);
  out.write(text);
  for (const NamedTensor& t : tensors) out.write(t.values.data(), t.values.size() * sizeof(float));
  out.commit();
}

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path_, ec))
    throw InputError(fmt::format("{}: {}", path_, std::filesystem::exists(path_, ec)
                                                      ? "not a regular file" : "no such file"));
  const std::uint64_t file_size = std::filesystem::file_size(path_, ec);
  std::ifstream in(path_, std::ios::binary);
  if (ec || !in) throw InputError(fmt::format("{}: cannot open for reading", path_));
  const nlohmann::json header = parse_header(path_, in, file_size, data_start_);
  const std::uint64_t data_size = file_size - data_start_;

  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) throw InputError(fmt::format("{}: __metadata__ is not an object", path_));
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string())
          throw InputError(fmt::format("{}: __metadata__ {} is not a string", path_, key));
        metadata_[key] = text.get<std::string>();
      }
      continue;
    }
    SafetensorsEntry e = parse_entry(path_, name, value);
    if (e.end > data_size)
      throw InputError(fmt::format("{}: tensor {}: data_offsets [{}, {}) lie outside the data ({} bytes "
                                   "after the header): truncated or damaged", path_, name, e.begin, e.end,
                                   data_size));
    entries_.push_back(std::move(e));
  }
  // No byte belongs to two tensors.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& e : entries_)
    if (e.end > e.begin) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (std::size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->begin < by_offset[i - 1]->end)
      throw InputError(fmt::format("{}: tensors {} [{}, {}) and {} [{}, {}) overlap: damaged", path_,
                                   by_offset[i - 1]->name, by_offset[i - 1]->begin, by_offset[i - 1]->end,
                                   by_offset[i]->name, by_offset[i]->begin, by_offset[i]->end));
  std::sort(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  const auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                                   [](const SafetensorsEntry& e, const std::string& n) { return e.name < n; });
  return it != entries_.end() && it->name == name ? &*it : nullptr;
}

std::vector<float> SafetensorsFile::read(const SafetensorsEntry& e) const {
  const std::uint64_t bytes = e.end - e.begin, width = dtype_bytes(e.dtype), n = bytes / width;
  std::vector<unsigned char> raw(bytes);
  std::ifstream in(path_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(data_start_ + e.begin));
  if (!in || !in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(bytes)))
    throw InputError(fmt::format("{}: tensor {}: cannot read its {} bytes", path_, e.name, bytes));
  std::vector<float> out(n);
  for (std::uint64_t i = 0; i < n; ++i) {
    const unsigned char* p = raw.data() + i * width;
    if (width == 4) {
      std::memcpy(&out[i], p, 4);
    } else if (width == 8) {
      double v;
      std::memcpy(&v, p, 8);
      if (std::isfinite(v) && std::fabs(v) > std::numeric_limits<float>::max())
        throw InputError(fmt::format("{}: tensor {}: element {} is {}, beyond float32's range", path_,
                                     e.name, i, v));
      out[i] = static_cast<float>(v);
    } else {
      const auto h = static_cast<std::uint16_t>(p[0] | (p[1] << 8));
      out[i] = e.dtype == "BF16" ? from_bf16(h) : from_f16(h);
    }
    if (!std::isfinite(out[i]))
      throw InputError(fmt::format("{}: tensor {}: element {} is NaN or infinite; a model's parameters "
                                   "must be finite", path_, e.name, i));
  }
  return out;
}

namespace {

namespace fs = std::filesystem;

// What a directory given as a model stands for: its index where it has one, else its single file.
std::string resolve_model_path(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return path;
  for (const char* name : {"model.safetensors.index.json", "model.safetensors"})
    if (fs::exists(fs::path(path) / name, ec)) return (fs::path(path) / name).string();
  throw InputError(fmt::format("{}: a directory with neither model.safetensors.index.json nor model.safetensors", path));
}

// The index's weight_map: tensor name -> shard file name (checked: strings, plain file names).
std::map<std::string, std::string> read_weight_map(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(fmt::format("{}: {}", path, fs::exists(path) ? "cannot open for reading" : "no such file"));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("{}: not JSON: {}", path, e.what()));
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw InputError(fmt::format("{}: not a safetensors index: expected a JSON object with an object weight_map "
                                 "(tensor name: shard file)", path));
  std::map<std::string, std::string> map;
  for (const auto& [name, shard] : j["weight_map"].items()) {
    if (!shard.is_string())
      throw InputError(fmt::format("{}: weight_map[\"{}\"] is {}; expected a shard's file name", path, name, shard.dump()));
    const std::string file = shard.get<std::string>();
    if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
        file.find('\\') != std::string::npos)
      throw InputError(fmt::format("{}: weight_map[\"{}\"] is \"{}\"; a shard is a file beside the index, named "
                                   "without a directory", path, name, file));
    map[name] = file;
  }
  if (map.empty()) throw InputError(fmt::format("{}: weight_map names no tensor", path));
  return map;
}

}  // namespace

SafetensorsModel::SafetensorsModel(const std::string& path) : path_(resolve_model_path(path)) {
  index_ = path_.ends_with(".json");
  if (!index_) {
    files_.emplace_back(path_);
    entries_ = files_[0].entries();
    file_of_.assign(entries_.size(), 0);
    metadata_ = files_[0].metadata();
    return;
  }
  const std::map<std::string, std::string> weight_map = read_weight_map(path_);
  std::map<std::string, std::size_t> shard_index;
  for (const auto& [name, shard] : weight_map) shard_index.emplace(shard, 0);
  std::size_t k = 0;
  for (auto& [shard, i] : shard_index) {
    i = k++;
    files_.emplace_back((fs::path(path_).parent_path() / shard).string());
  }
  for (const auto& [name, shard] : weight_map)
    if (files_[shard_index.at(shard)].find(name) == nullptr)
      throw InputError(fmt::format("{}: weight_map puts tensor {} in {}, which has no such tensor", path_, name,
                                   files_[shard_index.at(shard)].path()));
  for (std::size_t f = 0; f < files_.size(); ++f) {
    for (const SafetensorsEntry& e : files_[f].entries()) {
      const auto it = weight_map.find(e.name);
      if (it == weight_map.end() || shard_index.at(it->second) != f)
        throw InputError(fmt::format("{}: holds tensor {}, which {}'s weight_map {}", files_[f].path(), e.name, path_,
                                     it == weight_map.end() ? std::string("does not name")
                                                            : "puts in " + it->second));
      entries_.push_back(e);
      file_of_.push_back(f);
    }
    for (const auto& [key, value] : files_[f].metadata()) {
      const auto [at, added] = metadata_.emplace(key, value);
      if (!added && at->second != value)
        throw InputError(fmt::format("{}: __metadata__ {} is \"{}\"; another shard of {} has \"{}\"", files_[f].path(),
                                     key, value, path_, at->second));
    }
  }
  std::vector<std::size_t> order(entries_.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return entries_[a].name < entries_[b].name; });
  std::vector<SafetensorsEntry> entries;
  std::vector<std::size_t> file_of;
  for (std::size_t i : order) {
    entries.push_back(std::move(entries_[i]));
    file_of.push_back(file_of_[i]);
  }
  entries_ = std::move(entries);
  file_of_ = std::move(file_of);
}

const SafetensorsEntry* SafetensorsModel::find(const std::string& name) const {
  const auto it = std::lower_bound(entries_.begin(), entries_.end(), name,
                                   [](const SafetensorsEntry& e, const std::string& n) { return e.name < n; });
  return it != entries_.end() && it->name == name ? &*it : nullptr;
}

std::vector<float> SafetensorsModel::read(const SafetensorsEntry& entry) const {
  const SafetensorsEntry* e = find(entry.name);
  if (e == nullptr) throw std::logic_error("SafetensorsModel::read: no tensor " + entry.name);
  return files_[file_of_[static_cast<std::size_t>(e - entries_.data())]].read(*e);
}

}  // namespace tessera::io
