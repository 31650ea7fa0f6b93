#include "train/checkpointer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <regex>

#include "comm/agree.hpp"
#include "core/error.hpp"
#include "core/memory.hpp"
#include "core/test_hooks.hpp"
#include "core/version.hpp"
#include "io/checkpoint_file.hpp"
#include "io/small_file.hpp"
#include "io/tensor_file_writer.hpp"
#include "io/tensor_check.hpp"

namespace tessera {

namespace fs = std::filesystem;

namespace {

// The largest step count a checkpoint may claim (far beyond any run; keeps every count derived
// from it far from overflow).
constexpr std::int64_t kMaxStep = std::int64_t{1} << 48;
// `latest` holds one file name: a few dozen bytes.
constexpr std::size_t kLatestMaxBytes = 4096;

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
// Where a slab's elements come from: `n` elements of `source` from element `at`.
template <class Source>
void attach(io::TensorSlab& slab, const Source& source, std::size_t at, std::size_t n) {
  if (n == 0) return;
  if (source.data != nullptr)
    slab.data = source.data + at;
  else
    slab.fill = [read = source.read, at, n](float* out) { read(at, n, out); };
}

// What this rank writes of a block it holds whole (its first element at `at` in `source`): its
// share of the block's rows over n ranks.
template <class Source>
io::TensorSlab block_rows(const std::string& path, const nn::ParamInfo& p, const Source& source, std::size_t at,
                          int r, int n) {
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
  attach(slab, source, at + begin * row_len, (end - begin) * row_len);
  return slab;
}

// What this rank writes from a ZeRO shard: its piece, an element range of its tensor block. A
// block every tensor rank holds is written from tensor rank 0 only.
template <class Source>
io::TensorSlab shard_piece(const std::string& path, const nn::ParamInfo& p, const Sharding::Piece& piece,
                           const Source& shard, bool writes) {
  io::TensorSlab slab;
  slab.path = path;
  slab.shape = to_u64(p.logical_shape);
  slab.offset = to_u64(p.block_offset);
  slab.count = to_u64(p.shape);
  slab.by_elements = true;
  if (writes) {
    slab.first = piece.begin;
    slab.last = piece.end;
    attach(slab, shard, piece.shard_offset, piece.end - piece.begin);
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

// An integer attribute of `group` in [lo, hi].
std::int64_t attr_in(const std::map<std::string, io::Attr>& attrs, const std::string& group,
                     const std::string& key, std::int64_t lo, std::int64_t hi, const std::string& file) {
  const auto value = attr_as<std::int64_t>(attrs, key, file);
  if (value < lo || value > hi)
    throw InputError(fmt::format("{}: checkpoint attribute {}/{} is {}, expected {} <= {} <= {}", file,
                                 group, key, value, lo, key, hi));
  return value;
}

// The step_<8 digits>.h5 files of dir, newest first.
std::vector<fs::path> step_files(const std::string& dir) {
  std::vector<fs::path> all;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (step_of(it->path()) >= 0) all.push_back(it->path());
  std::sort(all.begin(), all.end(), [](auto& a, auto& b) { return step_of(a) > step_of(b); });
  return all;
}

// Why `file` is not a checkpoint a run can resume from, or "" if it looks like one: a local,
// metadata-only look (format, version, the /train state's presence); load() checks the rest.
std::string why_not_resumable(const std::string& file) {
  try {
    io::CheckpointFile f(MPI_COMM_SELF, file);
    const auto train = f.group_attrs("train");
    for (const char* key : {"step", "epoch", "batch_in_epoch", "samples_seen"})
      attr_as<std::int64_t>(train, key, file);
    return "";
  } catch (const InputError& e) {
    return e.what();
  }
}

}  // namespace

Checkpointer::Checkpointer(const Config& cfg, const Communicator& comm)
    : cfg_(cfg), comm_(comm), dir_((fs::path(cfg.run.output_dir) / "checkpoints").string()) {}

void Checkpointer::check_writable(std::int64_t from_step) const {
  agree(comm_.handle(), [&] {
    if (!comm_.is_root()) return;
    const fs::path dir(dir_);
    // A path written as a file must be absent or a file (or a link to one).
    const auto must_be_file = [](const fs::path& path) {
      std::error_code ec;
      const fs::file_status st = fs::status(path, ec);
      if (!fs::exists(st) || fs::is_regular_file(st)) return;
      throw InputError(fmt::format("{}: the run writes a file here at its checkpoints, but a {} stands in "
                                   "its place; move it away (nothing was changed)",
                                   path.string(), fs::is_directory(st) ? "directory" : "non-file"));
    };
    must_be_file(dir / "latest");
    must_be_file(dir / "latest.tmp");
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      fs::path name = it->path().filename();
      if (name.extension() == ".tmp") name.replace_extension();
      if (step_of(name) > from_step) must_be_file(it->path());
    }
    // The directory takes a new file: create one and remove it.
    const fs::file_status st = fs::status(dir, ec);
    if (fs::exists(st) && !fs::is_directory(st))
      throw InputError(fmt::format("{}: the run keeps its checkpoints in this directory, but a file stands in "
                                   "its place; move it away (nothing was changed)", dir.string()));
    const fs::path where = fs::exists(st) ? dir : dir.parent_path();
    const fs::path probe = where / fmt::format(".tessera-write-check-{}", ::getpid());
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
      throw InputError(fmt::format("{}: cannot create a file there ({}), so no checkpoint could be written; "
                                   "the run did not start", where.string(), std::strerror(errno)));
    ::close(fd);
    fs::remove(probe, ec);
  });
}

LatestCheckpoint Checkpointer::find_latest() const {
  LatestCheckpoint found;
  agree(comm_.handle(), [&] {
    if (!comm_.is_root()) return;
    const fs::path latest = fs::path(dir_) / "latest";
    std::string why;
    if (const auto text = io::read_small_file(latest.string(), kLatestMaxBytes, &why)) {
      const std::string name = text->substr(0, text->find('\n'));
      if (step_of(name) >= 0 && name.find('/') == std::string::npos) {
        const fs::path file = fs::path(dir_) / name;
        if (!fs::exists(file))
          throw InputError(fmt::format("{}: names {}, which does not exist", latest.string(), name));
        found.path = file.string();
        return;
      }
      why = fmt::format("holds \"{}\", not the name of a step_<8 digits>.h5 file",
                        text->size() > 64 ? text->substr(0, 64) + "..." : *text);
    } else if (why == "a directory" || why == "not a regular file") {
      // Nothing could point `latest` at the next checkpoint: refuse now, not at the first save.
      throw InputError(fmt::format("{} is {}, so no checkpoint of this run could be recorded there; "
                                   "remove it (--resume auto then continues from the newest step_*.h5)",
                                   latest.string(), why));
    }
    // `latest` cannot say: the newest step file is the newest complete checkpoint (only a
    // complete one gets its final name). No step file at all: nothing to resume.
    const std::vector<fs::path> files = step_files(dir_);
    if (files.empty()) {
      if (why != "missing")
        found.note = fmt::format("{} is {} and {} holds no step_*.h5 checkpoint: starting afresh",
                                 latest.string(), why, dir_);
      return;
    }
    const std::string bad = why_not_resumable(files.front().string());
    if (!bad.empty())
      throw InputError(fmt::format("{} is {}, and the newest checkpoint {} cannot be resumed ({}); "
                                   "continue from an older one with --resume PATH", latest.string(),
                                   why, files.front().string(), bad));
    found.path = files.front().string();
    found.note = fmt::format("{} is {}: resuming from the newest complete checkpoint, {}",
                             latest.string(), why, found.path);
  });
  comm_.broadcast(found.path, 0, Group::world);
  comm_.broadcast(found.note, 0, Group::world);
  return found;
}

std::vector<io::TensorSlab> Checkpointer::slabs(const Model& model, const Sharding* sh, const Source& values,
                                                const std::vector<Source>& states,
                                                const std::vector<std::string>& state_names) const {
  const auto& store = model.params();
  const bool sharded_values = sh != nullptr && sh->values_sharded();
  const bool sharded_states = sh != nullptr && sh->state_sharded();
  const auto pieces = sharded_values || sharded_states ? sh->pieces() : std::vector<Sharding::Piece>{};
  const int d = comm_.rank(Group::replica), n_d = comm_.size(Group::replica);
  const int t = comm_.rank(Group::tensor), n_t = comm_.size(Group::tensor);
  // A block this rank holds whole is split by rows over its replicas (the replica group: the data
  // ranks times the spatial ranks, and the tensor ranks too where every tensor rank holds it); a
  // shard's piece is written by the rank that holds it. No element is written twice.
  const auto slab = [&](const std::string& path, std::size_t i, const Source& source, bool sharded) {
    const auto& p = store.infos()[i];
    if (sharded)
      return shard_piece(path, p, pieces[i], source, (p.tensor_sharded || t == 0) && sh->writes_pieces());
    return p.tensor_sharded ? block_rows(path, p, source, p.offset, d, n_d)
                            : block_rows(path, p, source, p.offset, d + n_d * t, n_d * n_t);
  };
  // Every rank lists every tensor of the whole model in the same order (the datasets are
  // created collectively); a tensor of another pipeline stage gets an empty slab here.
  std::vector<io::TensorSlab> out;
  for (const auto& logical : logical_params(cfg_, model.shape())) {
    const std::size_t i = store.index_of(logical.name).value_or(store.infos().size());
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
    if (values)
      out.push_back(mine ? slab(model_path, i, values, sharded_values) : none(model_path));
    for (std::size_t k = 0; k < states.size(); ++k) {
      const std::string path = "optimizer/" + logical.name + "/" + state_names[k];
      out.push_back(mine ? slab(path, i, states[k], sharded_states) : none(path));
    }
  }
  return out;
}

io::CheckpointContent Checkpointer::content(const Model& model, const Sharding& sharding, const Optimizer& opt,
                                            const TrainState& state, const Source& values,
                                            const std::vector<Source>& states, const FieldNormValues& norm) const {
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
  };
  c.group_attrs["optimizer"] = {{"kind", opt.kind_name()}, {"step", opt.steps()}};
  c.group_attrs["train"] = {{"step", state.step},
                            {"epoch", state.epoch},
                            {"batch_in_epoch", state.batch_in_epoch},
                            {"loss_scale", state.loss_scale},
                            {"loss_scale_good_steps", state.loss_scale_good_steps},
                            {"skipped_steps", state.skipped_steps},
                            {"samples_seen", state.samples_seen}};
  c.tensors = slabs(model, &sharding, values, states, opt.state_names());
  if (!model.shape().norm.empty()) {
    c.group_attrs[kFieldNormGroup] = field_norm_attrs();
    for (io::TensorSlab& slab : field_norm_slabs(norm, comm_.is_root())) c.tensors.push_back(std::move(slab));
  }
  return c;
}

std::string Checkpointer::save(const Model& model, const Sharding& sharding, const Optimizer& opt,
                               const TrainState& state) {
  // The values (full, or this rank's shard: the sharding says) and the optimizer state are read
  // tensor by tensor as the writer needs them (io::TensorSlab::fill, into one buffer of the largest
  // tensor), from memory, a device or an offload file alike: a save holds no whole copy, which
  // the memory counters would not see (it had held the values whole: 4 bytes a parameter).
  Source values;
  values.read = [&sharding](std::size_t at, std::size_t n, float* out) { sharding.copy_values(at, n, out); };
  std::vector<Source> states;
  for (std::size_t i = 0; i < opt.state_names().size(); ++i) {
    Source s;
    s.read = [&opt, i](std::size_t at, std::size_t n, float* out) { opt.copy_state(i, at, n, out); };
    states.push_back(std::move(s));
  }
  const fs::path path = fs::path(dir_) / fmt::format("step_{:08}.h5", state.step);
  const FieldNormValues norm = field_norm_values(model.shape().norm);
  io::write_checkpoint(comm_.handle(), path.string(), content(model, sharding, opt, state, values, states, norm));
  written_.insert(state.step);
  record_latest(path.string());
  return path.string();
}

struct Checkpointer::PendingSave {
  /// The staged copies' bytes, counted (parameters, optimizer state) while the save is in flight:
  /// the memory limit's estimate holds them (MemoryEstimate::checkpoint).
  struct Counted {
    mem::Category category;
    std::int64_t bytes = 0;
    Counted(mem::Category c, std::size_t n) : category(c), bytes(static_cast<std::int64_t>(n * sizeof(float))) {
      mem::count_external(category, bytes);
    }
    Counted(const Counted&) = delete;
    Counted& operator=(const Counted&) = delete;
    ~Counted() { mem::count_external(category, -bytes); }
  };
  std::vector<float> values;                ///< staged copies: the writer reads these
  std::vector<std::vector<float>> states;
  std::vector<std::unique_ptr<Counted>> counted;
  FieldNormValues norm;
  std::unique_ptr<io::TensorFileWriter> writer;
  std::string path;
  std::int64_t step = 0;
};

Checkpointer::~Checkpointer() = default;

void Checkpointer::begin_save(const Model& model, const Sharding& sharding, const Optimizer& opt,
                              const TrainState& state) {
  if (pending_) throw std::logic_error("Checkpointer::begin_save with a save in flight");
  auto p = std::make_unique<PendingSave>();
  // Stage: this rank's values and optimizer state copied out of the live buffers (the only
  // pause; training changes them from the next step on).
  p->values.resize(sharding.values_size());
  p->counted.push_back(std::make_unique<PendingSave::Counted>(mem::Category::param, p->values.size()));
  sharding.copy_values(0, p->values.size(), p->values.data());
  std::vector<Source> states;
  p->states.resize(opt.state_names().size());
  for (std::size_t i = 0; i < p->states.size(); ++i) {
    p->states[i].resize(opt.size());
    p->counted.push_back(std::make_unique<PendingSave::Counted>(mem::Category::optim, opt.size()));
    opt.copy_state(i, p->states[i].data());
    states.push_back(p->states[i].data());
  }
  p->step = state.step;
  p->path = (fs::path(dir_) / fmt::format("step_{:08}.h5", state.step)).string();
  p->norm = field_norm_values(model.shape().norm);
  io::CheckpointContent c = content(model, sharding, opt, state, p->values.data(), states, p->norm);
  std::vector<std::uint64_t> offsets = io::create_checkpoint_layout(comm_.handle(), p->path, c);
  // Test hooks (core/test_hooks.hpp, as the synchronous ones of io/checkpoint_file.cpp, naming
  // steps): rank 1 (0 when alone) fails its background write, or is killed half-way through it.
  const bool faulty = comm_.rank() == std::min(1, comm_.size() - 1);
  const std::string step_text = fmt::format("{}", state.step);
  const std::string target = faulty && test_hooks::names_step(test_hooks::StepHook::fail_in_checkpoint, step_text)
                                 ? io::temporary_path(p->path) + ".TESSERA_TEST_FAIL_IN_CHECKPOINT/missing"
                                 : io::temporary_path(p->path);
  p->writer = std::make_unique<io::TensorFileWriter>(
      target, std::move(c.tensors), std::move(offsets),
      faulty && test_hooks::names_step(test_hooks::StepHook::kill_in_checkpoint, step_text));
  pending_ = std::move(p);
}

bool Checkpointer::save_written() const { return !pending_ || pending_->writer->done(); }

std::string Checkpointer::finish_save() {
  if (!pending_) throw std::logic_error("Checkpointer::finish_save without a save in flight");
  const std::unique_ptr<PendingSave> p = std::move(pending_);
  const std::string error = p->writer->wait();
  agree(comm_.handle(), [&] {
    if (!error.empty()) throw InputError(error);
  });
  io::commit_checkpoint(comm_.handle(), p->path);
  written_.insert(p->step);
  record_latest(p->path);
  return p->path;
}

void Checkpointer::record_latest(const std::string& path) {
  // Point `latest` at it (written whole or not at all), then prune. Rank 0 alone touches the
  // directory; the agreement carries any failure to every rank.
  agree(comm_.handle(), [&] {
    if (!comm_.is_root()) return;
    io::write_file_atomically((fs::path(dir_) / "latest").string(), fs::path(path).filename().string() + "\n");
    prune();
  });
}

void Checkpointer::prune() const {
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    // A .tmp left by a run that died mid-write is no checkpoint: drop it.
    const std::string name = it->path().filename().string();
    if (name.starts_with("step_") && it->path().extension() == ".tmp") fs::remove(it->path(), ec);
  }
  if (cfg_.checkpoint.keep <= 0) return;
  // Only this run's own checkpoints count: those it wrote and those of the run it continues, up
  // to the step it resumed from. A file it did not write and does not descend from (newer than
  // what it resumed, left by something else) is never deleted.
  std::size_t kept = 0;
  for (const fs::path& file : step_files(dir_)) {
    const std::int64_t step = step_of(file);
    if (!written_.count(step) && step > resumed_from_) continue;
    if (++kept > static_cast<std::size_t>(cfg_.checkpoint.keep)) fs::remove(file, ec);
  }
}

namespace {

// Reads this rank's part of the checkpoint tensor `ds` of parameter `logical` into `out`: its
// block at the store's offset, or its shard's piece at the piece's shard offset; nothing where the
// parameter belongs to another pipeline stage. Collective over the file's communicator.
// Where this rank's part of parameter `logical` goes in its buffer (the shard `pieces` name, or
// the full buffer): its first element and its count; none where this rank holds none of it.
std::pair<std::size_t, std::size_t> tensor_place(const nn::ParamStore<float>& store, const nn::ParamInfo& logical,
                                                 const std::vector<Sharding::Piece>* pieces) {
  const std::size_t i = store.index_of(logical.name).value_or(store.infos().size());
  if (i == store.infos().size()) return {0, 0};
  if (pieces != nullptr) return {(*pieces)[i].shard_offset, (*pieces)[i].end - (*pieces)[i].begin};
  return {store.infos()[i].offset, store.infos()[i].size};
}

// Reads this rank's part of `logical` into `dest` (tensor_place's count of floats).
void read_tensor(const io::CheckpointFile& file, const std::string& ds, const nn::ParamStore<float>& store,
                 const nn::ParamInfo& logical, const std::vector<Sharding::Piece>* pieces, float* dest) {
  const std::size_t i = store.index_of(logical.name).value_or(store.infos().size());
  if (i == store.infos().size()) {
    const std::vector<std::uint64_t> none(logical.logical_shape.size(), 0);
    file.read(ds, none, none, nullptr);
    return;
  }
  const auto& p = store.infos()[i];
  if (pieces != nullptr)
    file.read_elements(ds, to_u64(p.block_offset), to_u64(p.shape), (*pieces)[i].begin, (*pieces)[i].end, dest);
  else
    file.read(ds, to_u64(p.block_offset), to_u64(p.shape), dest);
}

// Reads every tensor's part of this rank under `group` ("model", "optimizer/.../exp_avg" as
// name_of gives it) into `to`: each part read into a buffer of its own and handed over, so that a
// destination on disk is never staged whole.
void read_tensors(const io::CheckpointFile& file, const std::vector<nn::ParamInfo>& all,
                  const std::function<std::string(const nn::ParamInfo&)>& name_of, const nn::ParamStore<float>& store,
                  const std::vector<Sharding::Piece>* pieces,
                  const std::function<void(std::size_t at, std::size_t n, const float* in)>& to) {
  std::vector<float> part;
  for (const auto& logical : all) {
    const auto [at, n] = tensor_place(store, logical, pieces);
    part.resize(std::max<std::size_t>(n, 1));
    read_tensor(file, name_of(logical), store, logical, pieces, part.data());
    if (n > 0) to(at, n, part.data());
  }
}

// The checkpoint must hold exactly the tensors `expected` (dataset path, logical shape) under
// `group` ("model", "optimizer"), `what` naming what would not fit ("the deck's model"). Local
// (metadata only); every rank checks them all, whatever part it holds.
using Expected = std::vector<std::pair<std::string, std::vector<std::uint64_t>>>;

void check_tensors(const io::CheckpointFile& file, const std::string& group, const Expected& expected,
                   const char* what) {
  const std::string& path = file.path();
  std::set<std::string> names;
  for (const auto& e : expected) names.insert(e.first);
  for (const auto& [ds, want] : expected) {
    if (!file.has(ds))
      throw InputError(fmt::format("{}: checkpoint does not fit {}: tensor {} is missing", path, what, ds));
    const auto shape = file.shape(ds);
    if (shape != want)
      throw InputError(fmt::format("{}: checkpoint does not fit {}: tensor {} has shape [{}] but the "
                                   "model needs [{}]", path, what, ds, fmt::join(shape, ","),
                                   fmt::join(want, ",")));
  }
  for (const auto& n : file.list(group))
    if (!names.count(n))
      throw InputError(fmt::format("{}: checkpoint does not fit {}: tensor {} is not part of it", path,
                                   what, n));
}

// The /train state, every value in its range (the batch's index within the epoch is checked
// against the deck's data by the trainer).
TrainState read_train_state(const io::CheckpointFile& file) {
  const std::string& path = file.path();
  const auto t = file.group_attrs("train");
  TrainState s;
  s.step = attr_in(t, "/train", "step", 0, kMaxStep, path);
  s.epoch = attr_in(t, "/train", "epoch", 0, s.step, path);
  s.batch_in_epoch = attr_in(t, "/train", "batch_in_epoch", 0, kMaxStep, path);
  s.samples_seen = attr_in(t, "/train", "samples_seen", s.step, std::numeric_limits<std::int64_t>::max(), path);
  // Checkpoints before mixed precision have no loss-scale state: the defaults serve them.
  if (t.count("loss_scale")) {
    s.loss_scale = attr_as<double>(t, "loss_scale", path);
    if (!(s.loss_scale >= 1.0 && s.loss_scale <= 16777216.0))
      throw InputError(fmt::format("{}: checkpoint attribute /train/loss_scale is {}, expected 1 <= "
                                   "loss_scale <= 2^24", path, s.loss_scale));
    s.loss_scale_good_steps = attr_in(t, "/train", "loss_scale_good_steps", 0, s.step, path);
    s.skipped_steps = attr_in(t, "/train", "skipped_steps", 0, s.step, path);
  }
  const auto root = file.root_attrs();
  if (root.count("step") && attr_as<std::int64_t>(root, "step", path) != s.step)
    throw InputError(fmt::format("{}: checkpoint root attribute step ({}) differs from /train/step "
                                 "({})", path, io::to_string(root.at("step")), s.step));
  return s;
}

}  // namespace

void Checkpointer::load_model(const std::string& path, Model& model, Sharding* sharding) const {
  io::CheckpointFile file(comm_.handle(), path);
  auto& store = model.params();
  const auto all = logical_params(cfg_, model.shape());
  Expected expected;
  for (const auto& p : all) expected.emplace_back("model/" + p.name, to_u64(p.logical_shape));
  agree(comm_.handle(), [&] { check_tensors(file, "model", expected, "the deck's model"); });

  // Every rank goes through every tensor of the model, reading nothing of those another pipeline
  // stage holds; then the parts of each tensor add up to its checksum.
  const bool sharded = sharding != nullptr && sharding->values_sharded();
  const auto pieces = sharded ? sharding->pieces() : std::vector<Sharding::Piece>{};
  const auto model_name = [](const nn::ParamInfo& p) { return "model/" + p.name; };
  if (sharding != nullptr && sharding->value_file() != nullptr) {
    // The values on disk: each part written to the file as it is read, verified from there.
    read_tensors(file, all, model_name, store, &pieces,
                 [&](std::size_t at, std::size_t n, const float* in) { sharding->set_values(at, n, in); });
    Source from_file;
    from_file.read = [sharding](std::size_t at, std::size_t n, float* out) { sharding->copy_values(at, n, out); };
    verify(file, slabs(model, sharding, from_file, {}, {}));
    store.values_changed();
    return;
  }
  std::vector<float> h_values(sharding != nullptr ? sharding->values_size() : store.size());
  read_tensors(file, all, model_name, store, sharded ? &pieces : nullptr,
               [&](std::size_t at, std::size_t n, const float* in) { std::copy_n(in, n, h_values.data() + at); });
  verify(file, slabs(model, sharded ? sharding : nullptr, h_values.data(), {}, {}));
  if (sharding != nullptr)
    sharding->set_values(0, h_values.size(), h_values.data());
  else
    Kokkos::deep_copy(store.values(), Kokkos::View<const float*, HostSpace, Kokkos::MemoryUnmanaged>(h_values.data(), h_values.size()));
  store.values_changed();
}

TrainState Checkpointer::load(const std::string& path, Model& model, Sharding& sharding, Optimizer& opt) {
  load_model(path, model, &sharding);
  io::CheckpointFile file(comm_.handle(), path);
  TrainState s;
  std::int64_t opt_step = 0;
  const auto all = logical_params(cfg_, model.shape());
  agree(comm_.handle(), [&] {
    const auto oattrs = file.group_attrs("optimizer");
    const auto kind = attr_as<std::string>(oattrs, "kind", path);
    if (kind != opt.kind_name())
      throw InputError(fmt::format("{}: checkpoint holds {} optimizer state but optimizer.kind = "
                                   "\"{}\"", path, kind, opt.kind_name()));
    s = read_train_state(file);
    opt_step = attr_in(oattrs, "/optimizer", "step", 0, s.step, path);
    Expected expected;
    for (const auto& p : all)
      for (const auto& state : opt.state_names())
        expected.emplace_back("optimizer/" + p.name + "/" + state, to_u64(p.logical_shape));
    check_tensors(file, "optimizer", expected, fmt::format("optimizer.kind = \"{}\"", opt.kind_name()).c_str());
  });

  const auto& store = model.params();
  const bool sharded = sharding.state_sharded();
  const auto pieces = sharded ? sharding.pieces() : std::vector<Sharding::Piece>{};
  // The state on disk: each part written to the file as it is read, verified from there; in
  // memory, host copies first.
  const bool on_disk = opt.offload_file() != nullptr;
  std::vector<std::vector<float>> h_states(opt.state_names().size());
  std::vector<Source> states;
  for (std::size_t i = 0; i < opt.state_names().size(); ++i) {
    const auto name_of = [&](const nn::ParamInfo& p) { return "optimizer/" + p.name + "/" + opt.state_names()[i]; };
    if (on_disk) {
      read_tensors(file, all, name_of, store, sharded ? &pieces : nullptr,
                   [&](std::size_t at, std::size_t n, const float* in) { opt.set_state(i, at, n, in); });
      Source from_file;
      from_file.read = [&opt, i](std::size_t at, std::size_t n, float* out) { opt.copy_state(i, at, n, out); };
      states.push_back(std::move(from_file));
      continue;
    }
    h_states[i].resize(opt.size());
    read_tensors(file, all, name_of, store, sharded ? &pieces : nullptr,
                 [&](std::size_t at, std::size_t n, const float* in) { std::copy_n(in, n, h_states[i].data() + at); });
    states.push_back(h_states[i].data());
  }
  verify(file, slabs(model, &sharding, nullptr, states, opt.state_names()));  // the model's were verified by load_model
  if (!on_disk)
    for (std::size_t i = 0; i < h_states.size(); ++i) opt.set_state(i, h_states[i].data());
  opt.set_steps(opt_step);
  resumed_from_ = s.step;
  return s;
}

void Checkpointer::verify(const io::CheckpointFile& file, const std::vector<io::TensorSlab>& owned) const {
  std::vector<io::TensorCheck> checks;
  for (const io::TensorSlab& slab : owned) checks.push_back(io::check_of(slab));
  file.verify(checks);
}

}  // namespace tessera
