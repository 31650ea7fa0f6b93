#include "comm/flight_record.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <limits>
#include <system_error>
#include <type_traits>

#include "core/error.hpp"

namespace tessera::comm {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int kMaxRanks = 1 << 24;  // beyond any machine; keeps `tessera doctor` linear in sane sizes

namespace {

json op_json(const RecordedOp& o) {
  return {{"id", o.id},
          {"op", o.op},
          {"group", o.group},
          {"p2p", o.p2p},
          {"peer", o.peer >= 0 ? json(o.peer) : json(nullptr)},
          {"seq", o.seq},
          {"bytes", o.bytes},
          {"start", o.start},
          {"end", o.in_flight() ? json(nullptr) : json(o.end)}};
}

json to_json(const FlightRecord& r) {
  const RecordIdentity& w = r.who;
  json ops = json::array();
  for (const auto& o : r.ops) ops.push_back(op_json(o));
  return {{"format", kFlightRecordFormat},
          {"format_version", kFlightRecordVersion},
          {"run", w.run},
          {"run_dir", w.run_dir},
          {"rank", w.rank},
          {"ranks", w.ranks},
          {"host", w.host},
          {"pid", w.pid},
          {"coord", {{"data", w.data}, {"tensor", w.tensor}, {"pipeline", w.pipeline}, {"spatial", w.spatial}}},
          {"layout", {{"data", w.dp}, {"tensor", w.tp}, {"pipeline", w.pp}, {"spatial", w.sp}}},
          {"timeout_s", w.timeout_s},
          {"reason", r.reason},
          {"message", r.message},
          {"written", r.written},
          {"written_iso", iso_time(r.written)},
          {"groups", r.groups},
          {"waiting_on", r.waiting_on ? json(r.waiting_on) : json(nullptr)},
          {"waiting_since", r.waiting_on ? json(r.waiting_since) : json(nullptr)},
          {"ops", ops}};
}

// A member of j, with its type and range checked (nlohmann's get<int> of 1e20 or 2.5 would
// convert silently); errors name the file and the key.
const json& member(const json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end()) throw InputError(fmt::format("{}: key \"{}\" is missing", where, key));
  return *it;
}

[[noreturn]] void wrong(const char* key, const std::string& where, const char* expected, const json& v) {
  std::string found = v.dump();
  if (found.size() > 40) found = found.substr(0, 37) + "...";
  throw InputError(fmt::format("{}: key \"{}\" must be {} (found {})", where, key, expected, found));
}

template <class T>
T field(const json& j, const char* key, const std::string& where) {
  const json& v = member(j, key, where);
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) wrong(key, where, "true or false", v);
    return v.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    const bool fits = std::is_signed_v<T>
                          ? v.is_number_integer() && v.get<std::int64_t>() >= std::numeric_limits<T>::min() &&
                                v.get<std::int64_t>() <= std::numeric_limits<T>::max()
                          : v.is_number_unsigned();
    if (!fits) wrong(key, where, std::is_signed_v<T> ? "an integer" : "an integer >= 0", v);
    return v.get<T>();
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) wrong(key, where, "a number", v);
    return v.get<T>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) wrong(key, where, "a string", v);
    return v.get<std::string>();
  } else {
    if (!v.is_object()) wrong(key, where, "an object", v);
    return v;
  }
}

template <class T>
T nullable(const json& j, const char* key, const std::string& where, T fallback) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return field<T>(j, key, where);
}

// "groups": {"data": [0, 2], ...}
std::map<std::string, std::vector<int>> parse_groups(const json& j, const std::string& where) {
  std::map<std::string, std::vector<int>> groups;
  const json all = field<json>(j, "groups", where);
  for (const auto& [name, ranks] : all.items()) {
    if (!ranks.is_array()) wrong("groups", where, "an object of arrays of ranks", ranks);
    auto& g = groups[name];
    for (const auto& r : ranks) {
      if (!r.is_number_integer() || r.get<std::int64_t>() < 0 || r.get<std::int64_t>() > INT32_MAX)
        wrong("groups", where, "an object of arrays of ranks", ranks);
      g.push_back(r.get<int>());
    }
  }
  return groups;
}

RecordedOp parse_op(const json& j, const std::string& where) {
  if (!j.is_object()) throw InputError(fmt::format("{}: an entry of \"ops\" is not an object", where));
  RecordedOp o;
  o.id = field<std::uint64_t>(j, "id", where);
  o.op = field<std::string>(j, "op", where);
  o.group = field<std::string>(j, "group", where);
  o.p2p = field<bool>(j, "p2p", where);
  o.peer = nullable<int>(j, "peer", where, -1);
  o.seq = field<std::uint64_t>(j, "seq", where);
  o.bytes = field<std::uint64_t>(j, "bytes", where);
  o.start = field<double>(j, "start", where);
  o.end = nullable<double>(j, "end", where, -1.0);
  return o;
}

}  // namespace

const RecordedOp* FlightRecord::find(std::uint64_t id) const {
  for (const auto& o : ops)
    if (o.id == id) return &o;
  return nullptr;
}

FlightRecord make_record(const RecordIdentity& who, const FlightSnapshot& snapshot,
                         const std::string& reason, const std::string& message) {
  FlightRecord r;
  r.who = who;
  r.reason = reason;
  r.message = message;
  r.written = unix_seconds();
  for (const auto& g : snapshot.groups) r.groups[g.name] = g.members;
  auto copy = [](const FlightOp& f) {
    return RecordedOp{f.id, f.op, f.group, f.p2p, f.peer, f.seq, f.bytes, f.start, f.end};
  };
  for (const auto& f : snapshot.ops) r.ops.push_back(copy(f));
  if (snapshot.waiting) {
    r.waiting_on = snapshot.waiting->id;
    r.waiting_since = snapshot.waiting_since;
    if (!r.find(r.waiting_on)) r.ops.insert(r.ops.begin(), copy(*snapshot.waiting));  // older than the ring
  }
  return r;
}

std::string record_path(const std::string& run_dir, int rank) {
  return (fs::path(run_dir) / "flight" / fmt::format("rank_{}.json", rank)).string();
}

bool write_record(const FlightRecord& record, const std::string& path) {
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return false;
    out << to_json(record).dump(1) << '\n';
    if (!out.flush()) return false;
  }
  fs::rename(tmp, path, ec);
  return !ec;
}

FlightRecord read_record(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(fmt::format("{}: cannot open it", path));
  json j;
  try {
    in >> j;
  } catch (const json::exception& e) {
    throw InputError(fmt::format("{}: not a flight record (not JSON: {})", path, e.what()));
  }
  const auto format = j.is_object() ? j.find("format") : j.end();
  if (!j.is_object() || format == j.end() || !format->is_string() || format->get<std::string>() != kFlightRecordFormat)
    throw InputError(fmt::format("{}: not a flight record (\"format\" is not \"{}\")", path, kFlightRecordFormat));
  if (const int v = field<int>(j, "format_version", path); v != kFlightRecordVersion)
    throw InputError(fmt::format("{}: flight record format_version {}, this tessera reads {}", path, v,
                                 kFlightRecordVersion));
  FlightRecord r;
  RecordIdentity& w = r.who;
  w.run = field<std::string>(j, "run", path);
  w.run_dir = field<std::string>(j, "run_dir", path);
  w.rank = field<int>(j, "rank", path);
  w.ranks = field<int>(j, "ranks", path);
  if (w.ranks < 1 || w.ranks > kMaxRanks || w.rank < 0 || w.rank >= w.ranks)
    throw InputError(fmt::format("{}: rank {} of {} ranks is impossible (1 to {} ranks)", path, w.rank, w.ranks,
                                 kMaxRanks));
  w.host = field<std::string>(j, "host", path);
  w.pid = field<long>(j, "pid", path);
  const json coord = field<json>(j, "coord", path), layout = field<json>(j, "layout", path);
  w.data = field<int>(coord, "data", path + " coord");
  w.tensor = field<int>(coord, "tensor", path + " coord");
  w.pipeline = field<int>(coord, "pipeline", path + " coord");
  w.dp = field<int>(layout, "data", path + " layout");
  w.tp = field<int>(layout, "tensor", path + " layout");
  w.pp = field<int>(layout, "pipeline", path + " layout");
  // Records before the spatial dimension have none: one spatial rank.
  if (coord.contains("spatial")) w.spatial = field<int>(coord, "spatial", path + " coord");
  if (layout.contains("spatial")) w.sp = field<int>(layout, "spatial", path + " layout");
  w.timeout_s = field<double>(j, "timeout_s", path);
  r.reason = field<std::string>(j, "reason", path);
  r.message = field<std::string>(j, "message", path);
  r.written = field<double>(j, "written", path);
  r.groups = parse_groups(j, path);
  r.waiting_on = nullable<std::uint64_t>(j, "waiting_on", path, 0);
  r.waiting_since = nullable<double>(j, "waiting_since", path, 0.0);
  const json& ops = member(j, "ops", path);
  if (!ops.is_array()) wrong("ops", path, "an array", ops);
  for (const auto& o : ops) r.ops.push_back(parse_op(o, path));
  return r;
}

namespace {
// Times a record may hold: from 1970 to beyond 2200 (a crafted file may say anything).
bool plausible(double unix_s) { return std::isfinite(unix_s) && unix_s >= 0.0 && unix_s < 8e9; }
}  // namespace

std::string clock_time(double unix_s) {
  if (!plausible(unix_s)) return "?";
  const auto whole = static_cast<std::time_t>(std::floor(unix_s));
  std::tm tm{};
  localtime_r(&whole, &tm);
  const int ms = static_cast<int>((unix_s - std::floor(unix_s)) * 1000.0);
  return fmt::format("{:02}:{:02}:{:02}.{:03}", tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
}

std::string iso_time(double unix_s) {
  if (!plausible(unix_s)) return "?";
  const auto whole = static_cast<std::time_t>(std::floor(unix_s));
  std::tm tm{};
  gmtime_r(&whole, &tm);
  const int us = static_cast<int>((unix_s - std::floor(unix_s)) * 1e6);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, us);
}

std::string format_bytes(std::uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{} bytes", bytes);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB"};
  auto v = static_cast<double>(bytes) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 3) {
    v /= 1024.0;
    ++u;
  }
  return fmt::format("{:.1f} {}", v, units[u]);
}

std::string rank_list(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ',';
    if (j >= i + 2) out += fmt::format("{}-{}", ranks[i], ranks[j]);
    else out += fmt::format("{}", ranks[i]);
    if (j == i + 1) out += fmt::format(",{}", ranks[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace tessera::comm
