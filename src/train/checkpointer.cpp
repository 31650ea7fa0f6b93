#include "train/checkpointer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <regex>

#include "comm/agree.hpp"
#include "core/error.hpp"
#include "core/version.hpp"
#include "io/checkpoint_file.hpp"

namespace tessera {

namespace fs = std::filesystem;

namespace {

constexpr std::int64_t format_version = 1;

std::string iso8601_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::vector<std::uint64_t> to_u64(const std::vector<std::int64_t>& v) {
  return {v.begin(), v.end()};
}

// The rows [begin, end) of a tensor with `rows` rows that world rank r of n writes.
std::pair<std::uint64_t, std::uint64_t> owned_rows(std::uint64_t rows, int r, int n) {
  const std::uint64_t q = rows / static_cast<std::uint64_t>(n), extra = rows % static_cast<std::uint64_t>(n);
  const auto ur = static_cast<std::uint64_t>(r);
  const std::uint64_t begin = ur * q + std::min(ur, extra);
  return {begin, begin + q + (ur < extra ? 1 : 0)};
}

// What this rank writes of a tensor it holds whole (its tensor block): a contiguous range of the
// block's rows, the block's replicas (replica r of n) splitting them.
io::TensorSlab block_rows(const std::string& path, const nn::ParamInfo& p, const float* base, int r, int n) {
  io::TensorSlab slab;
  slab.path = path;
  slab.shape = to_u64(p.logical_shape);
  std::uint64_t row_len = 1;
  for (std::size_t i = 1; i < p.shape.size(); ++i) row_len *= static_cast<std::uint64_t>(p.shape[i]);
  const auto [begin, end] = owned_rows(static_cast<std::uint64_t>(p.shape[0]), r, n);
  slab.offset = to_u64(p.block_offset);
  slab.count = to_u64(p.shape);
  slab.offset[0] += begin;
  slab.count[0] = end - begin;
  slab.data = base + begin * row_len;
  return slab;
}

// What this rank writes from a ZeRO shard: its piece, an element range of its tensor block. A
// block every tensor rank holds is written from tensor rank 0 only.
io::TensorSlab shard_piece(const std::string& path, const nn::ParamInfo& p,
                           const DataParallel::Piece& piece, const float* shard, bool writes) {
  io::TensorSlab slab;
  slab.path = path;
  slab.shape = to_u64(p.logical_shape);
  slab.offset = to_u64(p.block_offset);
  slab.count = to_u64(p.shape);
  slab.by_elements = true;
  if (writes) {
    slab.first = piece.begin;
    slab.last = piece.end;
    slab.data = shard + piece.shard_offset;
  }
  return slab;
}

std::int64_t step_of(const fs::path& p) {
  static const std::regex re(R"(step_(\d{8})\.h5)");
  std::smatch m;
  const std::string name = p.filename().string();
  return std::regex_match(name, m, re) ? std::stoll(m[1]) : -1;
}

template <class T>
T attr_as(const std::map<std::string, io::Attr>& attrs, const std::string& key,
          const std::string& file) {
  const auto it = attrs.find(key);
  if (it == attrs.end() || !std::holds_alternative<T>(it->second))
    throw InputError(fmt::format("{}: checkpoint attribute '{}' is missing or has the wrong type",
                                 file, key));
  return std::get<T>(it->second);
}

}  // namespace

Checkpointer::Checkpointer(const Config& cfg, const Communicator& comm)
    : cfg_(cfg), comm_(comm), dir_((fs::path(cfg.run.output_dir) / "checkpoints").string()) {}

std::string Checkpointer::find_latest() const {
  std::string found;
  agree(comm_.handle(), [&] {
    if (!comm_.is_root()) return;
    const fs::path latest = fs::path(dir_) / "latest";
    std::ifstream in(latest);
    std::string name;
    if (in && std::getline(in, name) && !name.empty()) {
      const fs::path file = fs::path(dir_) / name;
      if (fs::exists(file))
        found = file.string();
      else
        throw InputError(fmt::format("{}: names {}, which does not exist", latest.string(), name));
    }
  });
  comm_.broadcast(found, 0, Group::world);
  return found;
}

std::string Checkpointer::save(const Model& model, const DataParallel& dp,
                               const TrainState& state) const {
  const auto& store = model.params();
  const Optimizer& opt = dp.optimizer();
  // Host copies at the I/O boundary: the full values or this rank's shard of them, and the
  // optimizer state (full at zero 0, this rank's shard above).
  const bool sharded_values = dp.zero() >= 3;
  auto h_values = Kokkos::create_mirror_view_and_copy(HostSpace(), sharded_values ? dp.value_shard() : store.values());
  std::vector<decltype(h_values)> h_states;
  for (std::size_t i = 0; i < opt.state_names().size(); ++i)
    h_states.push_back(Kokkos::create_mirror_view_and_copy(HostSpace(), opt.state(i)));

  io::CheckpointContent c;
  c.root_attrs = {
      {"step", state.step},
      {"epoch", state.epoch},
      {"samples_seen", state.samples_seen},
      {"seed", static_cast<std::int64_t>(cfg_.run.seed)},
      {"layout", comm_.layout(cfg_.parallel.zero)},
      {"deck", cfg_.resolved_toml},
      {"created", iso8601_now()},
      {"tessera_version", std::string(TESSERA_VERSION)},
      {"format_version", format_version},
  };
  c.group_attrs["optimizer"] = {{"kind", opt.kind_name()}, {"step", opt.steps()}};
  c.group_attrs["train"] = {{"step", state.step},
                            {"epoch", state.epoch},
                            {"batch_in_epoch", state.batch_in_epoch},
                            {"loss_scale", state.loss_scale},
                            {"loss_scale_good_steps", state.loss_scale_good_steps},
                            {"skipped_steps", state.skipped_steps},
                            {"samples_seen", state.samples_seen}};
  const auto pieces = dp.zero() >= 1 ? dp.shard_pieces() : std::vector<DataParallel::Piece>{};
  const int d = comm_.rank(Group::data), n_d = comm_.size(Group::data);
  const int t = comm_.rank(Group::tensor), n_t = comm_.size(Group::tensor);
  // A block this rank holds whole is split by rows over its replicas (the data ranks, and the
  // tensor ranks too where every tensor rank holds it); a shard's piece is written by the rank
  // that holds it. No element is written twice.
  const auto slab = [&](const std::string& path, std::size_t i, const float* full, const float* shard) {
    const auto& p = store.infos()[i];
    if (shard != nullptr) return shard_piece(path, p, pieces[i], shard, p.tensor_sharded || t == 0);
    return p.tensor_sharded ? block_rows(path, p, full + p.offset, d, n_d)
                            : block_rows(path, p, full + p.offset, d + n_d * t, n_d * n_t);
  };
  // Every rank lists every tensor of the whole model in the same order (the datasets are
  // created collectively); a tensor of another pipeline stage gets an empty slab here.
  for (const auto& logical : logical_params(cfg_, model.shape())) {
    std::size_t i = 0;
    while (i < store.infos().size() && store.infos()[i].name != logical.name) ++i;
    const auto none = [&](const std::string& path) {
      io::TensorSlab empty;
      empty.path = path;
      empty.shape = to_u64(logical.logical_shape);
      empty.offset.assign(empty.shape.size(), 0);
      empty.count.assign(empty.shape.size(), 0);
      return empty;
    };
    // The last stage's copy of a tied parameter is written by the first stage's original.
    const bool mine = i < store.infos().size() && store.infos()[i].tie != nn::Tie::copy;
    const std::string model_path = "model/" + logical.name;
    c.tensors.push_back(mine ? slab(model_path, i, h_values.data(), sharded_values ? h_values.data() : nullptr)
                             : none(model_path));
    for (std::size_t k = 0; k < h_states.size(); ++k) {
      const std::string path = "optimizer/" + logical.name + "/" + opt.state_names()[k];
      c.tensors.push_back(mine ? slab(path, i, h_states[k].data(), dp.zero() >= 1 ? h_states[k].data() : nullptr)
                               : none(path));
    }
  }

  const fs::path path = fs::path(dir_) / fmt::format("step_{:08}.h5", state.step);
  io::write_checkpoint(comm_.handle(), path.string(), c);

  // Point `latest` at it (write and rename, so `latest` is never half-written), then prune.
  if (comm_.is_root()) {
    const fs::path tmp = fs::path(dir_) / "latest.tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << path.filename().string() << '\n';
    }
    fs::rename(tmp, fs::path(dir_) / "latest");
    std::vector<fs::path> all;
    for (const auto& e : fs::directory_iterator(dir_)) {
      if (step_of(e.path()) >= 0) all.push_back(e.path());
      // A .tmp left by a run that died mid-write is no checkpoint: drop it.
      if (e.path().extension() == ".tmp" && e.path().filename().string().starts_with("step_"))
        fs::remove(e.path());
    }
    if (cfg_.checkpoint.keep > 0) {
      std::sort(all.begin(), all.end(), [](auto& a, auto& b) { return step_of(a) > step_of(b); });
      for (std::size_t i = static_cast<std::size_t>(cfg_.checkpoint.keep); i < all.size(); ++i)
        fs::remove(all[i]);
    }
  }
  comm_.barrier();
  return path.string();
}

namespace {

// Reads this rank's part of the checkpoint tensor `ds` of parameter `logical` into `out`: its
// block at the store's offset, or its shard's piece at the piece's shard offset; nothing where the
// parameter belongs to another pipeline stage. Collective over the file's communicator.
void read_tensor(const io::CheckpointFile& file, const std::string& ds, const nn::ParamStore<float>& store,
                 const nn::ParamInfo& logical, const std::vector<DataParallel::Piece>* pieces, float* out) {
  std::size_t i = 0;
  while (i < store.infos().size() && store.infos()[i].name != logical.name) ++i;
  if (i == store.infos().size()) {
    const std::vector<std::uint64_t> none(logical.logical_shape.size(), 0);
    file.read(ds, none, none, nullptr);
    return;
  }
  const auto& p = store.infos()[i];
  if (pieces != nullptr)
    file.read_elements(ds, to_u64(p.block_offset), to_u64(p.shape), (*pieces)[i].begin,
                       (*pieces)[i].end, out + (*pieces)[i].shard_offset);
  else
    file.read(ds, to_u64(p.block_offset), to_u64(p.shape), out + p.offset);
}

}  // namespace

void Checkpointer::load_model(const std::string& path, Model& model, DataParallel* dp) const {
  io::CheckpointFile file(comm_.handle(), path);
  auto& store = model.params();
  // The checkpoint must hold exactly the deck's tensors with the deck's shapes.
  // Every rank checks the whole model, whatever part it holds, so all reach the same verdict.
  const auto names = file.list("model");
  const auto all = logical_params(cfg_, model.shape());
  for (const auto& p : all) {
    const std::string ds = "model/" + p.name;
    if (!file.has(ds))
      throw InputError(fmt::format("{}: checkpoint does not fit the deck's model: tensor {} is "
                                   "missing", path, ds));
    const auto shape = file.shape(ds);
    if (shape != to_u64(p.logical_shape))
      throw InputError(fmt::format("{}: checkpoint does not fit the deck's model: tensor {} has "
                                   "shape [{}] but the model needs [{}]",
                                   path, ds, fmt::join(shape, ","), fmt::join(p.logical_shape, ",")));
  }
  for (const auto& n : names) {
    const bool known = std::any_of(all.begin(), all.end(),
                                   [&](const auto& p) { return "model/" + p.name == n; });
    if (!known)
      throw InputError(fmt::format("{}: checkpoint does not fit the deck's model: tensor {} is not "
                                   "part of the model", path, n));
  }
  // Reads are collective: every rank goes through every tensor of the model, reading nothing of
  // those another pipeline stage holds.
  const bool sharded = dp != nullptr && dp->zero() >= 3;
  auto h_values = Kokkos::create_mirror_view(sharded ? dp->value_shard() : store.values());
  const auto pieces = sharded ? dp->shard_pieces() : std::vector<DataParallel::Piece>{};
  for (const auto& logical : all)
    read_tensor(file, "model/" + logical.name, store, logical, sharded ? &pieces : nullptr, h_values.data());
  Kokkos::deep_copy(sharded ? dp->value_shard() : store.values(), h_values);
}

TrainState Checkpointer::load(const std::string& path, Model& model, DataParallel& dp) const {
  load_model(path, model, &dp);
  Optimizer& opt = dp.optimizer();
  io::CheckpointFile file(comm_.handle(), path);
  const auto oattrs = file.group_attrs("optimizer");
  const auto kind = attr_as<std::string>(oattrs, "kind", path);
  if (kind != opt.kind_name())
    throw InputError(fmt::format("{}: checkpoint holds {} optimizer state but optimizer.kind = "
                                 "\"{}\"", path, kind, opt.kind_name()));
  const auto& store = model.params();
  const auto pieces = dp.zero() >= 1 ? dp.shard_pieces() : std::vector<DataParallel::Piece>{};
  for (std::size_t i = 0; i < opt.state_names().size(); ++i) {
    auto h_state = Kokkos::create_mirror_view(opt.state(i));
    for (const auto& logical : logical_params(cfg_, model.shape())) {
      const std::string ds = "optimizer/" + logical.name + "/" + opt.state_names()[i];
      if (!file.has(ds))
        throw InputError(fmt::format("{}: checkpoint lacks optimizer state {}", path, ds));
      read_tensor(file, ds, store, logical, dp.zero() >= 1 ? &pieces : nullptr, h_state.data());
    }
    Kokkos::deep_copy(opt.state(i), h_state);
  }
  opt.set_steps(attr_as<std::int64_t>(oattrs, "step", path));
  const auto t = file.group_attrs("train");
  TrainState s;
  s.step = attr_as<std::int64_t>(t, "step", path);
  s.epoch = attr_as<std::int64_t>(t, "epoch", path);
  s.batch_in_epoch = attr_as<std::int64_t>(t, "batch_in_epoch", path);
  s.samples_seen = attr_as<std::int64_t>(t, "samples_seen", path);
  // Checkpoints before mixed precision have no loss-scale state: the defaults serve them.
  if (t.count("loss_scale")) {
    s.loss_scale = attr_as<double>(t, "loss_scale", path);
    s.loss_scale_good_steps = attr_as<std::int64_t>(t, "loss_scale_good_steps", path);
    s.skipped_steps = attr_as<std::int64_t>(t, "skipped_steps", path);
  }
  return s;
}

}  // namespace tessera
