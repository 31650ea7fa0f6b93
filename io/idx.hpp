#pragma once
// Reading IDX files (the format of MNIST and Fashion-MNIST), gzipped or plain, with every check
// that turns a damaged or mismatched file into an InputError naming it.
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::io {

/// Unsigned-byte images: pixels (count, rows, cols), row-major.
struct IdxImages {
  std::int64_t count = 0, rows = 0, cols = 0;
  std::vector<std::uint8_t> pixels;
};

/// Unsigned-byte labels: labels (count).
struct IdxLabels {
  std::int64_t count = 0;
  std::vector<std::uint8_t> labels;
};

/// Images and their labels, checked against each other.
struct LabeledImages {
  IdxImages images;
  IdxLabels labels;
};

/// What a pair of IDX files must hold.
struct LabeledImagesSpec {
  std::int64_t count = 0;  ///< samples; 0 accepts any count
  std::int64_t rows = 28, cols = 28;
  int classes = 10;        ///< every label must be < classes
};

/// \brief Reads an IDX images file (magic 0x00000803: unsigned bytes, 3 dimensions). A path ending
/// in .gz is decompressed. InputError naming the file if it cannot be read, has another magic
/// number, is truncated or has trailing bytes.
IdxImages read_idx_images(const std::string& path);

/// \brief Reads an IDX labels file (magic 0x00000801: unsigned bytes, 1 dimension); errors as
/// read_idx_images.
IdxLabels read_idx_labels(const std::string& path);

/// \brief Reads both files and checks them against expect and each other: image size, counts
/// equal (and equal to expect.count if set), every label < expect.classes. InputError naming the
/// file otherwise.
LabeledImages read_labeled_images(const std::string& images_path, const std::string& labels_path,
                                  const LabeledImagesSpec& expect);

}  // namespace tessera::io
