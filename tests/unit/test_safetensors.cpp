// io/safetensors and io/torch_zip: a written file reads back bit for bit; F16, BF16 and F64 decode
// to the float32 values their bits stand for (subnormals, signs, F64 beyond float32 refused); the
// state_dict pickle uses only the opcodes torch.load(weights_only=True) accepts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.hpp"
#include "io/safetensors.hpp"
#include "io/torch_zip.hpp"

namespace tessera::io {
namespace {

namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() / ("tessera_test_safetensors_" + name)).string();
}

// A file with one tensor "t" of `dtype` and shape [n], its bytes `data`.
std::string write_one(const std::string& name, const std::string& dtype, std::size_t n, const std::string& data) {
  const std::string header = "{\"t\":{\"dtype\":\"" + dtype + "\",\"shape\":[" + std::to_string(n) +
                             "],\"data_offsets\":[0," + std::to_string(data.size()) + "]}}";
  std::string bytes(8, '\0');
  const std::uint64_t len = header.size();
  std::memcpy(bytes.data(), &len, 8);
  const std::string path = temp_path(name);
  std::ofstream(path, std::ios::binary) << bytes << header << data;
  return path;
}

std::string halves(std::initializer_list<std::uint16_t> values) {
  std::string out;
  for (std::uint16_t v : values) {
    out.push_back(static_cast<char>(v & 0xff));
    out.push_back(static_cast<char>(v >> 8));
  }
  return out;
}

TEST(Safetensors, WrittenTensorsAndMetadataReadBackExactly) {
  const std::string path = temp_path("roundtrip");
  std::vector<NamedTensor> tensors = {{"a.weight", {2, 3}, {1.5f, -2.0f, 3.25f, 1e-30f, -0.0f, 7.0f}},
                                      {"b", {1}, {42.0f}}};
  write_safetensors(path, tensors, {{"format", "pt"}});
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  const SafetensorsFile f(path);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  ASSERT_EQ(f.entries().size(), 2u);
  for (const NamedTensor& t : tensors) {
    const SafetensorsEntry* e = f.find(t.name);
    ASSERT_NE(e, nullptr) << t.name;
    EXPECT_EQ(e->dtype, "F32");
    EXPECT_EQ(e->shape, t.shape);
    const std::vector<float> v = f.read(*e);
    ASSERT_EQ(v.size(), t.values.size());
    EXPECT_EQ(std::memcmp(v.data(), t.values.data(), v.size() * 4), 0);
  }
  fs::remove(path);
}

TEST(Safetensors, TheDataStartEightByteAlignedWhateverTheHeaderLength) {
  // Headers of eight consecutive lengths (the metadata value grows by one byte each time), so
  // every remainder mod 8 is padded: a rule that pads to 4 would leave half of them misaligned.
  for (int extra = 0; extra < 8; ++extra) {
    const std::string path = temp_path("align" + std::to_string(extra));
    write_safetensors(path, {{"w", {2}, {1.0f, 2.0f}}}, {{"format", "pt" + std::string(extra, 'x')}});
    std::uint64_t n = 0;
    std::ifstream(path, std::ios::binary).read(reinterpret_cast<char*>(&n), 8);
    EXPECT_EQ((8 + n) % 8, 0u) << "header of " << n << " bytes";
    const SafetensorsFile f(path);
    EXPECT_EQ(f.read(*f.find("w")), (std::vector<float>{1.0f, 2.0f}));
    fs::remove(path);
  }
}

TEST(Safetensors, HalfPrecisionAndDoubleConvertToTheirFloat32Values) {
  // F16: 1, -2, 65504 (largest), 2^-24 (smallest subnormal), 2^-14 (smallest normal), -0.
  const SafetensorsFile f16(write_one("f16", "F16", 6, halves({0x3c00, 0xc000, 0x7bff, 0x0001, 0x0400, 0x8000})));
  const std::vector<float> h = f16.read(f16.entries()[0]);
  EXPECT_EQ(h, (std::vector<float>{1.0f, -2.0f, 65504.0f, 0x1p-24f, 0x1p-14f, -0.0f}));
  EXPECT_TRUE(std::signbit(h[5]));
  // BF16: the top half of a float32: 1, -2, 3.140625.
  const SafetensorsFile bf16(write_one("bf16", "BF16", 3, halves({0x3f80, 0xc000, 0x4049})));
  EXPECT_EQ(bf16.read(bf16.entries()[0]), (std::vector<float>{1.0f, -2.0f, 3.140625f}));
  // F64: rounded to float32; beyond its range refused.
  double d[2] = {0.1, -3.0};
  const SafetensorsFile f64(write_one("f64", "F64", 2, std::string(reinterpret_cast<char*>(d), 16)));
  EXPECT_EQ(f64.read(f64.entries()[0]), (std::vector<float>{0.1f, -3.0f}));
  d[1] = 1e300;
  const SafetensorsFile big(write_one("f64big", "F64", 2, std::string(reinterpret_cast<char*>(d), 16)));
  EXPECT_THROW(big.read(big.entries()[0]), InputError);
  // F16 infinity and NaN are refused: parameters are finite.
  const SafetensorsFile inf(write_one("f16inf", "F16", 1, halves({0x7c00})));
  EXPECT_THROW(inf.read(inf.entries()[0]), InputError);
  // Integer dtypes do not convert.
  EXPECT_THROW(SafetensorsFile(write_one("i32", "I32", 1, std::string(4, '\0'))), InputError);
  // A shape whose byte count overflows 64 bits.
  EXPECT_THROW(SafetensorsFile(write_one("overflow", "F32", 4611686018427387905ULL, std::string(4, '\0'))), InputError);
}

TEST(TorchZip, ThePickleIsAnOrderedDictOfRebuiltTensors) {
  const std::vector<NamedTensor> tensors = {{"w", {2, 3}, std::vector<float>(6, 1.0f)}, {"b", {70000}, {}}};
  const std::string p = torch_state_dict_pickle(tensors);
  EXPECT_EQ(p.substr(0, 2), "\x80\x02");
  EXPECT_EQ(p.substr(p.size() - 2), "u.");
  EXPECT_NE(p.find("collections\nOrderedDict\n"), std::string::npos);
  EXPECT_NE(p.find("torch._utils\n_rebuild_tensor_v2\n"), std::string::npos);
  EXPECT_NE(p.find("torch\nFloatStorage\n"), std::string::npos);
  // numel 70000 as BININT (J, 4 bytes little-endian); the stride (3, 1) as BININT1s.
  const std::string numel = std::string("J") + std::string("\x70\x11\x01\x00", 4);
  EXPECT_NE(p.find(numel), std::string::npos);
  EXPECT_NE(p.find("(K\x03K\x01t"), std::string::npos);

  const std::string path = temp_path("state.pt");
  write_torch_state_dict(path, {tensors[0]});
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes.substr(0, 4), "PK\x03\x04");
  EXPECT_NE(bytes.find("archive/data/0"), std::string::npos);
  EXPECT_NE(bytes.find("archive/version"), std::string::npos);
  fs::remove(path);
}

}  // namespace
}  // namespace tessera::io
