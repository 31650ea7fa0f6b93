#include "train/replica_check.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>
#include <string>
#include <vector>

#include "comm/agree.hpp"
#include "core/counted_buffer.hpp"
#include "core/error.hpp"
#include "core/test_hooks.hpp"
#include "io/tensor_check.hpp"

namespace tessera {

namespace {

// The checksum of each parameter's block, in parameter order: its elements read by `read(at, n,
// out)` one parameter at a time into `buffer` (from memory, a device or an offload file alike,
// never a whole copy).
template <class Read>
void block_sums(const nn::ParamStore<float>& store, const Read& read, CountedBuffer& buffer,
                std::vector<std::uint64_t>& out) {
  for (const auto& p : store.infos()) {
    auto* values = static_cast<float*>(buffer.get(p.size * sizeof(float)));
    read(p.offset, p.size, values);
    std::uint64_t sum = 0;
    for (std::size_t k = 0; k < p.size; ++k) sum += io::element_checksum(k, values[k]);
    out.push_back(sum);
  }
}

void perturb_for_test(const Communicator& comm, Model& model, std::int64_t step) {
  const std::optional<long long> wanted = test_hooks::perturb_replica();
  if (!wanted || *wanted != step || comm.rank(Group::replica) != 1) return;
  auto values = model.params().values();
  auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), values);
  h(0) += 1e-3f;
  Kokkos::deep_copy(values, h);
  model.params().values_changed();
}

}  // namespace

const char* replicated_state(const Sharding& sharding, const Communicator& comm) {
  if (comm.size(Group::replica) == 1 || sharding.values_sharded()) return "";
  return sharding.state_sharded() ? "parameters" : "parameters and optimizer state";
}

void check_replicas(const Config& cfg, const Communicator& comm, Model& model, const Sharding& sharding,
                    const Optimizer& opt, std::int64_t step) {
  if (*replicated_state(sharding, comm) == '\0') return;
  perturb_for_test(comm, model, step);
  const auto& store = model.params();
  std::vector<std::uint64_t> sums;
  CountedBuffer buffer(mem::Category::param);
  block_sums(store, [&](std::size_t at, std::size_t n, float* out) { sharding.copy_values(at, n, out); }, buffer, sums);
  if (!sharding.state_sharded())
    for (std::size_t i = 0; i < opt.state_names().size(); ++i)
      block_sums(store, [&](std::size_t at, std::size_t n, float* out) { opt.copy_state(i, at, n, out); }, buffer, sums);

  // Every rank of the replica group (data x spatial) sees every rank's sums; the first that differs
  // from rank 0's.
  const std::vector<std::uint64_t> all = comm.allgather_u64(sums, Group::replica);
  const std::vector<int> ranks = comm.members(Group::replica);
  const std::size_t n = sums.size(), params = store.infos().size();
  std::string problem;
  for (std::size_t i = 0; i < n && problem.empty(); ++i) {
    std::vector<int> differ;
    for (std::size_t r = 1; r < ranks.size(); ++r)
      if (all[r * n + i] != all[i]) differ.push_back(ranks[r]);
    if (differ.empty()) continue;
    const std::string what = i < params ? store.infos()[i].name
                                        : fmt::format("{} of {}", opt.state_names()[i / params - 1],
                                                      store.infos()[i % params].name);
    problem = fmt::format("the data replicas diverged by step {}: {} differs between world rank {} and "
                          "world rank(s) {} (train.check_replicas_every = {}); they should hold it bit "
                          "for bit: suspect those ranks' nodes or a bug", step, what, ranks[0],
                          fmt::join(differ, ", "), cfg.train.check_replicas_every);
  }
  // Every replica group reaches its own verdict; all ranks learn the first.
  agree(comm.handle(), [&] {
    if (!problem.empty()) throw NumericError(problem);
  });
}

}  // namespace tessera
