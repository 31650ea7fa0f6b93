#include "io/torch_zip.hpp"

#include <zlib.h>

#include <cstdint>
#include <limits>

#include <fmt/format.h>

#include "core/error.hpp"
#include "io/output_file.hpp"

namespace tessera::io {

namespace {

// --- The pickle (protocol 2 opcodes) -------------------------------------------------------

constexpr char kProto = '\x80', kGlobal = 'c', kEmptyTuple = ')', kReduce = 'R', kMark = '(',
               kTuple = 't', kBinPersId = 'Q', kNewFalse = '\x89', kSetItems = 'u', kStop = '.',
               kBinUnicode = 'X', kBinInt1 = 'K', kBinInt2 = 'M', kBinInt = 'J', kLong1 = '\x8a';

void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_global(std::string& out, const char* module, const char* name) {
  out += kGlobal;
  out += fmt::format("{}\n{}\n", module, name);
}

void put_string(std::string& out, const std::string& s) {
  out += kBinUnicode;
  put_le(out, s.size(), 4);
  out += s;
}

// A non-negative integer in the shortest opcode: BININT1, BININT2, BININT, else LONG1.
void put_int(std::string& out, std::uint64_t v) {
  if (v < 0x100) {
    out += kBinInt1;
    put_le(out, v, 1);
  } else if (v < 0x10000) {
    out += kBinInt2;
    put_le(out, v, 2);
  } else if (v < 0x80000000ULL) {
    out += kBinInt;
    put_le(out, v, 4);
  } else {  // little-endian two's complement, a zero byte on top where the sign bit would be set
    std::string bytes;
    for (std::uint64_t x = v; x != 0; x >>= 8) bytes.push_back(static_cast<char>(x & 0xff));
    if ((static_cast<unsigned char>(bytes.back()) & 0x80) != 0) bytes.push_back('\0');
    out += kLong1;
    put_le(out, bytes.size(), 1);
    out += bytes;
  }
}

void put_tuple(std::string& out, const std::vector<std::uint64_t>& values) {
  out += kMark;
  for (std::uint64_t v : values) put_int(out, v);
  out += kTuple;
}

void put_empty_ordered_dict(std::string& out) {
  put_global(out, "collections", "OrderedDict");
  out += kEmptyTuple;
  out += kReduce;
}

// --- The zip (stored records, no ZIP64) ------------------------------------------------------

constexpr std::uint32_t kLocalHeader = 0x04034b50, kCentralHeader = 0x02014b50, kEnd = 0x06054b50;
constexpr std::uint16_t kVersion = 20;        // 2.0: stored records, no ZIP64
constexpr std::uint16_t kDosDate = 0x21;      // 1980-01-01, so equal content gives equal files
constexpr std::uint16_t kPaddingField = 0x5054;  // an extra field that only pads ("TP")
constexpr std::uint64_t kAlign = 64;

struct Record {
  std::string name;
  const void* data;
  std::uint64_t size;
};

std::uint32_t crc_of(const void* data, std::uint64_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* bytes = static_cast<const Bytef*>(data);
  for (std::uint64_t done = 0; done < size;) {
    const auto n = static_cast<uInt>(std::min<std::uint64_t>(size - done, 1u << 30));
    crc = crc32(crc, bytes + done, n);
    done += n;
  }
  return static_cast<std::uint32_t>(crc);
}

// The fields local and central headers share, from "version needed" to the name's length.
void put_common(std::string& out, const Record& r, std::uint32_t crc) {
  put_le(out, kVersion, 2);
  put_le(out, 0, 2);  // flags
  put_le(out, 0, 2);  // stored
  put_le(out, 0, 2);  // time
  put_le(out, kDosDate, 2);
  put_le(out, crc, 4);
  put_le(out, r.size, 4);
  put_le(out, r.size, 4);
  put_le(out, r.name.size(), 2);
}

void write_zip(const std::string& path, const std::vector<Record>& records) {
  // Offsets first, to refuse what a plain zip cannot hold before anything is written.
  std::uint64_t at = 0, padding_total = 0;
  std::vector<std::uint64_t> offsets, paddings;
  for (const Record& r : records) {
    const std::uint64_t unpadded = at + 30 + r.name.size();
    std::uint64_t pad = (kAlign - unpadded % kAlign) % kAlign;
    if (pad != 0 && pad < 4) pad += kAlign;  // an extra field is at least its 4-byte header
    offsets.push_back(at);
    paddings.push_back(pad);
    padding_total += pad;
    at = unpadded + pad + r.size;
  }
  const std::uint64_t central_size = [&] {
    std::uint64_t n = 0;
    for (const Record& r : records) n += 46 + r.name.size();
    return n;
  }();
  if (at + central_size + 22 > std::numeric_limits<std::uint32_t>::max() || records.size() > 0xffff)
    throw InputError(fmt::format("{}: the state_dict would take {} bytes, beyond the 4 GiB of a plain zip "
                                 "file; export it with --format safetensors", path, at + central_size + 22));

  OutputFile out(path);
  std::vector<std::uint32_t> crcs;
  for (std::size_t i = 0; i < records.size(); ++i) {
    const Record& r = records[i];
    crcs.push_back(crc_of(r.data, r.size));
    std::string header;
    put_le(header, kLocalHeader, 4);
    put_common(header, r, crcs.back());
    put_le(header, paddings[i], 2);
    header += r.name;
    if (paddings[i] != 0) {
      put_le(header, kPaddingField, 2);
      put_le(header, paddings[i] - 4, 2);
      header.append(paddings[i] - 4, '\0');
    }
    out.write(header);
    out.write(r.data, r.size);
  }
  const std::uint64_t central_at = out.size();
  std::string central;
  for (std::size_t i = 0; i < records.size(); ++i) {
    put_le(central, kCentralHeader, 4);
    put_le(central, kVersion, 2);  // made by
    put_common(central, records[i], crcs[i]);
    put_le(central, 0, 2);   // extra
    put_le(central, 0, 2);   // comment
    put_le(central, 0, 2);   // disk
    put_le(central, 0, 2);   // internal attributes
    put_le(central, 0, 4);   // external attributes
    put_le(central, offsets[i], 4);
    central += records[i].name;
  }
  put_le(central, kEnd, 4);
  put_le(central, 0, 2);  // this disk
  put_le(central, 0, 2);  // the central directory's disk
  put_le(central, records.size(), 2);
  put_le(central, records.size(), 2);
  put_le(central, central_size, 4);
  put_le(central, central_at, 4);
  put_le(central, 0, 2);  // comment
  out.write(central);
  out.commit();
}

}  // namespace

std::string torch_state_dict_pickle(const std::vector<NamedTensor>& tensors) {
  std::string p;
  p += kProto;
  p += '\x02';
  put_empty_ordered_dict(p);
  p += kMark;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const NamedTensor& t = tensors[i];
    put_string(p, t.name);
    // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks)
    put_global(p, "torch._utils", "_rebuild_tensor_v2");
    p += kMark;
    p += kMark;
    put_string(p, "storage");
    put_global(p, "torch", "FloatStorage");
    put_string(p, std::to_string(i));
    put_string(p, "cpu");
    put_int(p, t.values.size());
    p += kTuple;
    p += kBinPersId;
    put_int(p, 0);
    put_tuple(p, t.shape);
    std::vector<std::uint64_t> stride(t.shape.size(), 1);
    for (std::size_t d = t.shape.size(); d-- > 1;) stride[d - 1] = stride[d] * t.shape[d];
    put_tuple(p, stride);
    p += kNewFalse;
    put_empty_ordered_dict(p);
    p += kTuple;
    p += kReduce;
  }
  p += kSetItems;
  p += kStop;
  return p;
}

void write_torch_state_dict(const std::string& path, const std::vector<NamedTensor>& tensors) {
  const std::string pickle = torch_state_dict_pickle(tensors);
  static const std::string byteorder = "little", version = "3\n";
  std::vector<Record> records{{"archive/data.pkl", pickle.data(), pickle.size()},
                              {"archive/byteorder", byteorder.data(), byteorder.size()}};
  for (std::size_t i = 0; i < tensors.size(); ++i)
    records.push_back({fmt::format("archive/data/{}", i), tensors[i].values.data(),
                       tensors[i].values.size() * sizeof(float)});
  records.push_back({"archive/version", version.data(), version.size()});
  write_zip(path, records);
}

}  // namespace tessera::io
