#include "io/idx.hpp"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <utility>

#include <fmt/format.h>

#include "core/error.hpp"

namespace tessera::io {

namespace {

constexpr std::uint32_t kImagesMagic = 0x00000803;
constexpr std::uint32_t kLabelsMagic = 0x00000801;

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

// The whole (decompressed) content of path. gzread passes plain files through unchanged.
std::vector<std::uint8_t> read_whole_file(const std::string& path) {
  std::unique_ptr<gzFile_s, GzCloser> file(gzopen(path.c_str(), "rb"));
  if (!file) throw InputError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  gzbuffer(file.get(), 1 << 20);
  std::vector<std::uint8_t> bytes;
  constexpr std::size_t kChunk = 1 << 22;
  for (;;) {
    std::size_t used = bytes.size();
    bytes.resize(used + kChunk);
    int got = gzread(file.get(), bytes.data() + used, static_cast<unsigned>(kChunk));
    if (got < 0) {
      int code = 0;
      const char* why = gzerror(file.get(), &code);
      throw InputError(fmt::format("{}: cannot decompress: {}", path, why));
    }
    bytes.resize(used + static_cast<std::size_t>(got));
    if (got == 0) break;
  }
  return bytes;
}

std::uint32_t big_endian_u32(const std::uint8_t* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

// An IDX file's dimensions and payload, after checking magic number and size.
struct IdxArray {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> bytes;  // whole file; payload starts at header_size
  std::size_t header_size = 0;
};

IdxArray read_idx(const std::string& path, std::uint32_t magic, const char* noun) {
  IdxArray idx;
  idx.bytes = read_whole_file(path);
  const std::size_t ndims = magic & 0xffu;
  idx.header_size = 4 + 4 * ndims;
  if (idx.bytes.size() < 4) {
    throw InputError(fmt::format("{}: truncated: {} bytes, expected an IDX header of {} bytes",
                                 path, idx.bytes.size(), idx.header_size));
  }
  std::uint32_t seen = big_endian_u32(idx.bytes.data());
  if (seen != magic) {
    throw InputError(fmt::format("{}: magic number {:#010x}, expected {:#010x} (IDX {})", path,
                                 seen, magic, noun));
  }
  if (idx.bytes.size() < idx.header_size) {
    throw InputError(fmt::format("{}: truncated: {} bytes, expected an IDX header of {} bytes",
                                 path, idx.bytes.size(), idx.header_size));
  }
  std::uint64_t item_bytes = 1;
  for (std::size_t d = 0; d < ndims; ++d) {
    idx.dims.push_back(big_endian_u32(idx.bytes.data() + 4 + 4 * d));
    if (d > 0) item_bytes *= static_cast<std::uint64_t>(idx.dims[d]);
  }

  // The payload must hold exactly dims[0] items.
  const std::uint64_t payload = idx.bytes.size() - idx.header_size;
  const std::uint64_t declared = static_cast<std::uint64_t>(idx.dims[0]);
  if (item_bytes == 0) {
    throw InputError(fmt::format("{}: header declares {} of zero size", path, noun));
  }
  if (payload < declared * item_bytes) {
    throw InputError(fmt::format("{}: truncated: header says {} {}, file holds {}", path,
                                 declared, noun, payload / item_bytes));
  }
  if (payload > declared * item_bytes) {
    throw InputError(fmt::format("{}: {} trailing bytes after the {} {} the header declares", path,
                                 payload - declared * item_bytes, declared, noun));
  }
  return idx;
}

}  // namespace

IdxImages read_idx_images(const std::string& path) {
  IdxArray idx = read_idx(path, kImagesMagic, "images");
  IdxImages images{idx.dims[0], idx.dims[1], idx.dims[2], {}};
  idx.bytes.erase(idx.bytes.begin(), idx.bytes.begin() + static_cast<std::ptrdiff_t>(idx.header_size));
  images.pixels = std::move(idx.bytes);
  return images;
}

IdxLabels read_idx_labels(const std::string& path) {
  IdxArray idx = read_idx(path, kLabelsMagic, "labels");
  IdxLabels labels{idx.dims[0], {}};
  idx.bytes.erase(idx.bytes.begin(), idx.bytes.begin() + static_cast<std::ptrdiff_t>(idx.header_size));
  labels.labels = std::move(idx.bytes);
  return labels;
}

LabeledImages read_labeled_images(const std::string& images_path, const std::string& labels_path,
                                  const LabeledImagesSpec& expect) {
  LabeledImages set{read_idx_images(images_path), read_idx_labels(labels_path)};
  const IdxImages& images = set.images;
  if (images.rows != expect.rows || images.cols != expect.cols) {
    throw InputError(fmt::format("{}: images are {}x{}, expected {}x{}", images_path, images.rows,
                                 images.cols, expect.rows, expect.cols));
  }
  if (expect.count > 0 && images.count != expect.count) {
    throw InputError(fmt::format("{}: header says {} images, expected {}", images_path,
                                 images.count, expect.count));
  }
  if (set.labels.count != images.count) {
    throw InputError(fmt::format("{}: holds {} labels but {} holds {} images", labels_path,
                                 set.labels.count, images_path, images.count));
  }
  for (std::size_t i = 0; i < set.labels.labels.size(); ++i) {
    if (set.labels.labels[i] >= expect.classes) {
      throw InputError(fmt::format("{}: label {} at index {}, expected < {}", labels_path,
                                   set.labels.labels[i], i, expect.classes));
    }
  }
  return set;
}

}  // namespace tessera::io
