// oneDNN convolutions behind blas/onednn_conv.hpp: per (shape, kind, threads) a primitive whose
// layouts oneDNN chose ("any": blocked layouts such as nChw16c beat plain NCHW several-fold on
// AVX-512), with reorders from and to the callers' NCHW / OIHW buffers, created once and kept.
#include "blas/onednn_conv.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <initializer_list>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/counted_buffer.hpp"
#include "blas/onednn_gemm.hpp"

namespace tessera::blas::onednn {
namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
using dims = dnnl::memory::dims;

enum class Kind { forward, backward_data, backward_weights };

/// The threads oneDNN's OpenMP runtime gives the calling thread (1 under a sequential build):
/// set by blas::onednn::set_threads, part of every key.
int omp_threads() {
  using GetThreads = int (*)();
  static const auto get = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
  return get != nullptr ? get() : 1;
}

struct Key {
  Kind kind;
  int batch, in, out, height, width, kernel, pad_top, pad_bottom, rows_x, rows_y;
  bool bias;
  int threads;
  bool bf16;
  auto tie() const {
    return std::tie(kind, batch, in, out, height, width, kernel, pad_top, pad_bottom, rows_x, rows_y, bias, threads,
                    bf16);
  }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

/// Scratch roles: one buffer each, shared by every primitive (calls are serialised).
enum Role { image_in = 0, weights = 1, image_out = 2, bias_grad = 3, roles = 4 };

/// One argument of a primitive: the caller's buffer and what the primitive reads or writes,
/// the same memory where the layouts agree, else scratch and a reorder between them.
struct Port {
  int arg = 0;
  Role role = image_in;
  dnnl::memory user, inner;
  dnnl::reorder reorder;  // user -> inner for inputs, inner -> user for outputs
  bool direct = true;
};

struct Entry {
  dnnl::primitive primitive;
  std::vector<Port> inputs, outputs;
  dnnl::memory scratchpad;  ///< its scratchpad's descriptor, on Library::scratchpad when run
  std::string impl;
};

struct Library {
  std::mutex mutex;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, Entry> cache;
  CountedBuffer scratch[roles];
  CountedBuffer scratchpad;  ///< the primitives' own (scratchpad_mode::user)
};

Library& library() {
  static Library lib;
  return lib;
}

void* scratch(Library& lib, Role r, std::size_t bytes) { return lib.scratch[r].get(bytes); }

/// Primitives hand their scratchpads to Tessera (CountedBuffer) instead of allocating their own.
dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

/// The caller's NCHW tensor of `rows` rows per plane inside planes of `plane_rows` rows.
dnnl::memory::desc image(int batch, int channels, int rows, int width, int plane_rows) {
  const dnnl::memory::dim plane = dnnl::memory::dim(plane_rows == 0 ? rows : plane_rows) * width;
  return dnnl::memory::desc({batch, channels, rows, width}, dt::f32,
                            dims{channels * plane, plane, width, 1});
}

Port input(const Library& lib, int arg, Role role, const dnnl::memory::desc& user, const dnnl::memory::desc& want) {
  Port p{arg, role, dnnl::memory(user, lib.engine, nullptr), {}, {}, user == want};
  p.inner = p.direct ? p.user : dnnl::memory(want, lib.engine, nullptr);
  if (!p.direct) p.reorder = dnnl::reorder(p.user, p.inner);
  return p;
}

/// accumulate: user += the result (a reorder with a sum post-op), so never direct.
Port output(const Library& lib, int arg, Role role, const dnnl::memory::desc& user, const dnnl::memory::desc& have,
            bool accumulate) {
  Port p{arg, role, dnnl::memory(user, lib.engine, nullptr), {}, {}, !accumulate && user == have};
  p.inner = p.direct ? p.user : dnnl::memory(have, lib.engine, nullptr);
  if (!p.direct) {
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    p.reorder = dnnl::reorder(dnnl::reorder::primitive_desc(lib.engine, have, lib.engine, user, attr));
  }
  return p;
}

/// The callers' buffers (x, y, w, b: fp32) and what the primitives may choose (any_*: of the
/// products' type, bf16 or fp32; any_dw: the weight gradient, fp32 always).
struct Descs {
  dnnl::memory::desc x, y, w, b, any_x, any_y, any_w, any_dw;
  dims strides{1, 1}, pad_l, pad_r;
};

Descs descs(const Key& k) {
  const int P = k.kernel / 2, oh = k.height + k.pad_top + k.pad_bottom - k.kernel + 1;
  Descs d;
  d.x = image(k.batch, k.in, k.height, k.width, k.rows_x);
  d.y = image(k.batch, k.out, oh, k.width, k.rows_y);
  d.w = dnnl::memory::desc({k.out, k.in, k.kernel, k.kernel}, dt::f32, tag::oihw);
  d.b = dnnl::memory::desc({k.out}, dt::f32, tag::x);
  const dt inner = k.bf16 ? dt::bf16 : dt::f32;
  d.any_x = dnnl::memory::desc({k.batch, k.in, k.height, k.width}, inner, tag::any);
  d.any_y = dnnl::memory::desc({k.batch, k.out, oh, k.width}, inner, tag::any);
  d.any_w = dnnl::memory::desc({k.out, k.in, k.kernel, k.kernel}, inner, tag::any);
  d.any_dw = dnnl::memory::desc({k.out, k.in, k.kernel, k.kernel}, dt::f32, tag::any);
  d.pad_l = {k.pad_top, P};
  d.pad_r = {k.pad_bottom, P};
  return d;
}

dnnl::convolution_forward::primitive_desc forward_pd(const Library& lib, const Key& k, const Descs& d) {
  const dnnl::convolution_forward::desc fd =
      k.bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                               d.any_x, d.any_w, d.b, d.any_y, d.strides, d.pad_l, d.pad_r)
             : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                               d.any_x, d.any_w, d.any_y, d.strides, d.pad_l, d.pad_r);
  return dnnl::convolution_forward::primitive_desc(fd, user_scratchpad(), lib.engine);
}

Entry make_entry(const Library& lib, const Key& k) {
  const Descs d = descs(k);
  const auto fpd = forward_pd(lib, k, d);
  Entry e;
  if (k.kind == Kind::forward) {
    e.primitive = dnnl::convolution_forward(fpd);
    e.scratchpad = dnnl::memory(fpd.scratchpad_desc(), lib.engine, nullptr);
    e.impl = fpd.impl_info_str();
    e.inputs = {input(lib, DNNL_ARG_SRC, image_in, d.x, fpd.src_desc()),
                input(lib, DNNL_ARG_WEIGHTS, weights, d.w, fpd.weights_desc())};
    if (k.bias) e.inputs.push_back(input(lib, DNNL_ARG_BIAS, bias_grad, d.b, fpd.bias_desc()));
    e.outputs = {output(lib, DNNL_ARG_DST, image_out, d.y, fpd.dst_desc(), false)};
  } else if (k.kind == Kind::backward_data) {
    const dnnl::convolution_backward_data::primitive_desc pd(
        dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, d.any_x, d.any_w, d.any_y,
                                              d.strides, d.pad_l, d.pad_r),
        user_scratchpad(), lib.engine, fpd);
    e.primitive = dnnl::convolution_backward_data(pd);
    e.scratchpad = dnnl::memory(pd.scratchpad_desc(), lib.engine, nullptr);
    e.impl = pd.impl_info_str();
    e.inputs = {input(lib, DNNL_ARG_DIFF_DST, image_out, d.y, pd.diff_dst_desc()),
                input(lib, DNNL_ARG_WEIGHTS, weights, d.w, pd.weights_desc())};
    e.outputs = {output(lib, DNNL_ARG_DIFF_SRC, image_in, d.x, pd.diff_src_desc(), false)};
  } else {
    const auto bd = k.bias ? dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, d.any_x,
                                                                      d.any_dw, d.b, d.any_y, d.strides, d.pad_l,
                                                                      d.pad_r)
                           : dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, d.any_x,
                                                                      d.any_dw, d.any_y, d.strides, d.pad_l, d.pad_r);
    const dnnl::convolution_backward_weights::primitive_desc pd(bd, user_scratchpad(), lib.engine, fpd);
    e.primitive = dnnl::convolution_backward_weights(pd);
    e.scratchpad = dnnl::memory(pd.scratchpad_desc(), lib.engine, nullptr);
    e.impl = pd.impl_info_str();
    e.inputs = {input(lib, DNNL_ARG_SRC, image_in, d.x, pd.src_desc()),
                input(lib, DNNL_ARG_DIFF_DST, image_out, d.y, pd.diff_dst_desc())};
    e.outputs = {output(lib, DNNL_ARG_DIFF_WEIGHTS, weights, d.w, pd.diff_weights_desc(), true)};
    if (k.bias) e.outputs.push_back(output(lib, DNNL_ARG_DIFF_BIAS, bias_grad, d.b, pd.diff_bias_desc(), true));
  }
  return e;
}

void check(const Conv2dShape& s) {
  const auto bad = [&](const std::string& why) {
    throw std::invalid_argument("tessera::blas::onednn::conv: " + why + " (batch " + std::to_string(s.batch) +
                                ", in " + std::to_string(s.in) + ", out " + std::to_string(s.out) + ", " +
                                std::to_string(s.height) + "x" + std::to_string(s.width) + ", kernel " +
                                std::to_string(s.kernel) + ", rows padded " + std::to_string(s.pad_top) + "/" +
                                std::to_string(s.pad_bottom) + ")");
  };
  if (s.batch < 0 || s.in < 1 || s.out < 1 || s.height < 1 || s.width < 1) bad("sizes must be positive");
  if (s.kernel < 1 || s.kernel % 2 == 0) bad("the kernel must be odd");
  if (s.pad_top < 0 || s.pad_bottom < 0 || s.pad_top > s.kernel / 2 || s.pad_bottom > s.kernel / 2)
    bad("row padding must lie in [0, kernel/2]");
  if (s.out_height() < 1) bad("no output rows");
  if ((s.plane_rows_x != 0 && s.plane_rows_x < s.height) || (s.plane_rows_y != 0 && s.plane_rows_y < s.out_height()))
    bad("planes hold fewer rows than the tensor");
}

Key key_of(Kind kind, const Conv2dShape& s, bool bias) {
  return Key{kind, s.batch, s.in, s.out, s.height, s.width, s.kernel, s.pad_top, s.pad_bottom,
             s.plane_rows_x, s.plane_rows_y, bias, omp_threads(), s.bf16};
}

Entry& entry(Library& lib, const Key& key) {
  auto it = lib.cache.find(key);
  if (it == lib.cache.end()) {
    if (lib.cache.size() >= 1024) lib.cache.clear();  // a bound on a run whose shapes keep changing
    it = lib.cache.emplace(key, make_entry(lib, key)).first;
  }
  return it->second;
}

/// Runs kind on the callers' buffers (in the order of Entry::inputs, then Entry::outputs).
void run(Kind kind, const Conv2dShape& s, bool bias, std::initializer_list<const void*> in,
         std::initializer_list<void*> out) {
  check(s);
  if (s.batch == 0) return;
  Library& lib = library();
  std::lock_guard<std::mutex> lock(lib.mutex);
  try {
    Entry& e = entry(lib, key_of(kind, s, bias));
    std::unordered_map<int, dnnl::memory> args;
    auto ptr = in.begin();
    for (Port& p : e.inputs) {
      p.user.set_data_handle(const_cast<void*>(*ptr++));
      if (!p.direct) {
        p.inner.set_data_handle(scratch(lib, p.role, p.inner.get_desc().get_size()));
        p.reorder.execute(lib.stream, p.user, p.inner);
      }
      args.emplace(p.arg, p.inner);
    }
    auto optr = out.begin();
    for (Port& p : e.outputs) {
      p.user.set_data_handle(*optr++);
      if (!p.direct) p.inner.set_data_handle(scratch(lib, p.role, p.inner.get_desc().get_size()));
      args.emplace(p.arg, p.inner);
    }
    if (const std::size_t bytes = e.scratchpad.get_desc().get_size(); bytes > 0) {
      e.scratchpad.set_data_handle(lib.scratchpad.get(bytes));
      args.emplace(DNNL_ARG_SCRATCHPAD, e.scratchpad);
    }
    e.primitive.execute(lib.stream, args);
    for (Port& p : e.outputs)
      if (!p.direct) p.reorder.execute(lib.stream, p.inner, p.user);
    lib.stream.wait();
  } catch (const dnnl::error& err) {
    throw std::runtime_error(std::string("tessera::blas::onednn::conv: oneDNN failed (") + err.what() +
                             ") on a " + (s.bf16 ? "bf16" : "fp32") + " convolution of " + std::to_string(s.in) +
                             " -> " + std::to_string(s.out) +
                             " channels, " + std::to_string(s.height) + "x" + std::to_string(s.width));
  }
}

}  // namespace

bool conv_available() { return true; }

bool conv_bf16_native() { return native_bf16(); }

void conv_forward(const Conv2dShape& s, const float* x, const float* w, const float* bias, float* y) {
  if (bias != nullptr)
    run(Kind::forward, s, true, {x, w, bias}, {y});
  else
    run(Kind::forward, s, false, {x, w}, {y});
}

void conv_backward_data(const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  run(Kind::backward_data, s, false, {dy, w}, {dx});
}

void conv_backward_weights(const Conv2dShape& s, const float* x, const float* dy, float* dw, float* db) {
  if (db != nullptr)
    run(Kind::backward_weights, s, true, {x, dy}, {dw, db});
  else
    run(Kind::backward_weights, s, false, {x, dy}, {dw});
}

std::string conv_implementation(const Conv2dShape& s) {
  check(s);
  Conv2dShape one = s;
  one.batch = std::max(s.batch, 1);
  Library& lib = library();
  std::lock_guard<std::mutex> lock(lib.mutex);
  try {
    std::string line;
    for (const auto& [kind, name] : {std::pair{Kind::forward, "fwd "}, std::pair{Kind::backward_data, ", bwd_d "},
                                     std::pair{Kind::backward_weights, ", bwd_w "}})
      line += name + entry(lib, key_of(kind, one, true)).impl;
    return line;
  } catch (const dnnl::error& err) {
    return std::string("unavailable (") + err.what() + ")";
  }
}

std::size_t conv_cache_size() {
  std::lock_guard<std::mutex> lock(library().mutex);
  return library().cache.size();
}

}  // namespace tessera::blas::onednn
