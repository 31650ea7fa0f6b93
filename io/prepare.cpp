#include "io/prepare.hpp"

#include <filesystem>
#include <span>

#include <fmt/format.h>

#include "core/error.hpp"
#include "io/dataset_writer.hpp"
#include "io/idx.hpp"

namespace tessera::io {

namespace {

namespace fs = std::filesystem;

// source_dir/name.gz if it exists, else source_dir/name; InputError if neither does.
std::string find_idx_file(const std::string& source_dir, const std::string& name) {
  fs::path gz = fs::path(source_dir) / (name + ".gz");
  fs::path plain = fs::path(source_dir) / name;
  if (fs::exists(gz)) return gz.string();
  if (fs::exists(plain)) return plain.string();
  throw InputError(fmt::format(
      "{}: no such file (nor {}); pass --source DIR with the Fashion-MNIST IDX files, or on "
      "Debian install them under /usr/share/datasets/fashion-mnist",
      gz.string(), plain.string()));
}

LabeledImages read_split(const std::string& source_dir, const std::string& prefix,
                         std::int64_t count) {
  LabeledImagesSpec expect{count, 28, 28, 10};
  const std::string images = find_idx_file(source_dir, prefix + "-images-idx3-ubyte");
  const std::string labels = find_idx_file(source_dir, prefix + "-labels-idx1-ubyte");
  return read_labeled_images(images, labels, expect);
}

void write_split(DatasetWriter& out, const std::string& split, const LabeledImages& set) {
  const auto n = static_cast<std::uint64_t>(set.images.count);
  const auto rows = static_cast<std::uint64_t>(set.images.rows);
  const auto cols = static_cast<std::uint64_t>(set.images.cols);
  const std::string inputs = "/" + split + "/inputs";
  const std::string labels = "/" + split + "/labels";
  out.write(inputs, {n, rows, cols}, std::span<const std::uint8_t>(set.images.pixels));
  out.write_float_attr(inputs, "scale", 1.0f / 255.0f);
  out.write_float_attr(inputs, "offset", 0.0f);
  out.write(labels, {n}, std::span<const std::uint8_t>(set.labels.labels));
  out.write_attr(labels, "classes", std::int64_t{10});
}

}  // namespace

void prepare_fashion_mnist(const std::string& source_dir, const std::string& out_path) {
  // Read and check everything before writing anything.
  LabeledImages train = read_split(source_dir, "train", 60000);
  LabeledImages test = read_split(source_dir, "t10k", 10000);

  fs::path final_path(out_path);
  if (final_path.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(final_path.parent_path(), ec);
    if (ec) {
      throw InputError(fmt::format("{}: cannot create directory: {}",
                                   final_path.parent_path().string(), ec.message()));
    }
  }

  // Write a temporary file, then rename it into place.
  const std::string tmp_path = out_path + ".tmp";
  DatasetWriter out(tmp_path);
  write_split(out, "train", train);
  write_split(out, "test", test);
  out.write_attr("/", "source", std::string("fashion-mnist"));
  out.write_attr("/", "format", std::string("tessera-dataset"));
  out.close();
  fs::rename(tmp_path, final_path);
}

}  // namespace tessera::io
