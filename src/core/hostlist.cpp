#include "core/hostlist.hpp"

#include <fmt/format.h>

#include <cctype>
#include <charconv>

#include "core/error.hpp"

namespace tessera {

namespace {

// Hosts beyond this many are refused: a list that expands further is a mistake, not a cluster.
constexpr std::size_t kMaxHosts = 1 << 20;

[[noreturn]] void malformed(const std::string& what, const std::string& list, const std::string& why) {
  throw InputError(fmt::format("{} = \"{}\": {}", what, list, why));
}

// A non-negative decimal number (digits only, at most 9).
bool number(std::string_view s, long& out) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  std::from_chars(s.data(), s.data() + s.size(), out);
  return true;
}

// "1-3,05,7" -> "1","2","3","05","7" (a range keeps its lower bound's width).
std::vector<std::string> expand_ranges(std::string_view r, const std::string& what, const std::string& list) {
  std::vector<std::string> out;
  std::size_t begin = 0;
  while (begin <= r.size()) {
    const std::size_t end = std::min(r.find(',', begin), r.size());
    const std::string_view item = r.substr(begin, end - begin);
    const std::size_t dash = item.find('-');
    long lo = 0, hi = 0;
    const std::string_view a = item.substr(0, dash);
    const std::string_view b = dash == std::string_view::npos ? a : item.substr(dash + 1);
    if (!number(a, lo) || !number(b, hi) || hi < lo)
      malformed(what, list, fmt::format("\"[{}]\" is not a range of numbers like [1-4,7]", r));
    if (out.size() + static_cast<std::size_t>(hi - lo) >= kMaxHosts) malformed(what, list, "too many hosts");
    for (long v = lo; v <= hi; ++v) out.push_back(fmt::format("{:0{}}", v, a.size()));
    begin = end + 1;
  }
  return out;
}

// One top-level item: "rack[1-2]-n[01-02]" -> rack1-n01, rack1-n02, rack2-n01, rack2-n02.
void expand_item(std::string_view item, std::vector<std::string>& out, const std::string& what,
                 const std::string& list) {
  std::vector<std::string> names = {""};
  std::size_t pos = 0;
  while (pos < item.size()) {
    const std::size_t open = item.find('[', pos);
    const std::string_view text = item.substr(pos, open == std::string_view::npos ? item.npos : open - pos);
    if (text.find(']') != std::string_view::npos) malformed(what, list, "a ']' without its '['");
    for (auto& n : names) n += text;
    if (open == std::string_view::npos) break;
    const std::size_t close = item.find(']', open);
    if (close == std::string_view::npos) malformed(what, list, "a '[' without its ']'");
    const auto values = expand_ranges(item.substr(open + 1, close - open - 1), what, list);
    std::vector<std::string> next;
    if (names.size() * values.size() >= kMaxHosts) malformed(what, list, "too many hosts");
    for (const auto& n : names)
      for (const auto& v : values) next.push_back(n + v);
    names = std::move(next);
    pos = close + 1;
  }
  for (auto& n : names) {
    if (n.empty()) malformed(what, list, "an empty host name");
    out.push_back(std::move(n));
  }
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& list, const std::string& what) {
  std::vector<std::string> hosts;
  int depth = 0;
  std::size_t begin = 0;
  for (std::size_t i = 0; i <= list.size(); ++i) {
    if (i < list.size() && list[i] == '[') ++depth;
    if (i < list.size() && list[i] == ']') --depth;
    if (i == list.size() || (list[i] == ',' && depth == 0)) {
      expand_item(std::string_view(list).substr(begin, i - begin), hosts, what, list);
      if (hosts.size() >= kMaxHosts) malformed(what, list, "too many hosts");
      begin = i + 1;
    }
  }
  return hosts;
}

std::vector<int> expand_counts(const std::string& list, const std::string& what) {
  std::vector<int> counts;
  std::size_t begin = 0;
  while (begin <= list.size()) {
    const std::size_t end = std::min(list.find(',', begin), list.size());
    const std::string_view item = std::string_view(list).substr(begin, end - begin);
    const std::size_t paren = item.find("(x");
    long count = 0, times = 1;
    const bool ok = number(item.substr(0, paren), count) && count >= 1 &&
                    (paren == std::string_view::npos ||
                     (item.back() == ')' && number(item.substr(paren + 2, item.size() - paren - 3), times) && times >= 1));
    if (!ok) malformed(what, list, fmt::format("\"{}\" is not a count like 2 or 2(x3)", item));
    if (counts.size() + static_cast<std::size_t>(times) >= kMaxHosts) malformed(what, list, "too many entries");
    counts.insert(counts.end(), static_cast<std::size_t>(times), static_cast<int>(count));
    begin = end + 1;
  }
  return counts;
}

std::vector<std::string> block_placement(const std::vector<std::string>& hosts,
                                         const std::vector<int>& per_host, int ranks) {
  if (hosts.size() != per_host.size())
    throw InputError(fmt::format("the job's {} hosts and its {} task counts per node do not match",
                                 hosts.size(), per_host.size()));
  std::vector<std::string> placed;
  for (std::size_t h = 0; h < hosts.size() && static_cast<int>(placed.size()) < ranks; ++h)
    for (int i = 0; i < per_host[h] && static_cast<int>(placed.size()) < ranks; ++i) placed.push_back(hosts[h]);
  if (static_cast<int>(placed.size()) < ranks)
    throw InputError(fmt::format("the job's hosts take {} tasks, fewer than the {} ranks to place", placed.size(), ranks));
  return placed;
}

}  // namespace tessera
