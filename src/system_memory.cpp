#include "gdn/core/system_memory.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string_view>

#include <fmt/format.h>

namespace gdn {
namespace {

// A field of /proc/meminfo in bytes (-1 when absent).
std::int64_t meminfo(std::string_view key) {
  std::ifstream in("/proc/meminfo");
  std::string name;
  std::int64_t kib = 0;
  std::string unit;
  while (in >> name >> kib) {
    std::getline(in, unit);
    if (name.size() == key.size() + 1 && name.compare(0, key.size(), key) == 0 && name.back() == ':') return kib * 1024;
  }
  return -1;
}

// A file holding one number, or "max" (-1 for max, absent or unreadable).
std::int64_t number_file(const std::string& path) {
  std::ifstream in(path);
  std::string v;
  if (!(in >> v) || v == "max") return -1;
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  return end != v.c_str() && n >= 0 ? static_cast<std::int64_t>(n) : -1;
}

// A key of a memory.stat file (0 when absent).
std::int64_t stat_field(const std::string& path, std::string_view key) {
  std::ifstream in(path);
  std::string name;
  std::int64_t v = 0;
  while (in >> name >> v)
    if (name == key) return v;
  return 0;
}

struct Limit {
  std::int64_t limit = -1, headroom = -1;
  void take(std::int64_t lim, std::int64_t usage, std::int64_t reclaimable) {
    if (lim < 0 || lim >= (std::int64_t{1} << 60)) return;  // v1 reports "no limit" as a huge number
    const std::int64_t room = std::max<std::int64_t>(0, lim - std::max<std::int64_t>(0, usage - reclaimable));
    if (headroom < 0 || room < headroom) {
      headroom = room;
      limit = lim;
    }
  }
};

// The process's cgroup paths, from /proc/self/cgroup: "0::/path" (v2) and "N:memory:/path" (v1).
Limit cgroup_limits() {
  Limit l;
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    const auto c1 = line.find(':'), c2 = line.find(':', c1 + 1);
    if (c1 == std::string::npos || c2 == std::string::npos) continue;
    const std::string controllers = line.substr(c1 + 1, c2 - c1 - 1);
    std::string path = line.substr(c2 + 1);
    const bool v2 = line.compare(0, c1, "0") == 0 && controllers.empty();
    const bool v1 = controllers.find("memory") != std::string::npos;
    if (!v1 && !v2) continue;
    const std::string root = v2 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/memory";
    // Every level up to the root: a parent's limit binds its children.
    for (;;) {
      const std::string dir = root + (path == "/" ? "" : path);
      if (v2) {
        l.take(number_file(dir + "/memory.max"), number_file(dir + "/memory.current"), stat_field(dir + "/memory.stat", "file"));
      } else {
        l.take(number_file(dir + "/memory.limit_in_bytes"), number_file(dir + "/memory.usage_in_bytes"),
               stat_field(dir + "/memory.stat", "total_cache"));
      }
      if (path.empty() || path == "/") break;
      const auto slash = path.rfind('/');
      path = slash == 0 ? "/" : path.substr(0, slash);
    }
  }
  return l;
}

std::int64_t parse_size(std::string_view s) {
  std::int64_t v = 0;
  std::size_t i = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) v = v * 10 + (s[i++] - '0');
  if (i == 0) return -1;
  if (i < s.size()) {
    const char u = static_cast<char>(std::toupper(static_cast<unsigned char>(s[i])));
    const int shift = u == 'K' ? 10 : u == 'M' ? 20 : u == 'G' ? 30 : u == 'T' ? 40 : -1;
    if (shift < 0) return -1;
    v <<= shift;
  }
  return v;
}

}  // namespace

std::string format_bytes(std::int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes < 0) return "?";
  if (b >= 1e12) return fmt::format("{:.1f} TB", b / 1e12);
  if (b >= 1e9) return fmt::format("{:.1f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.1f} MB", b / 1e6);
  if (b >= 1e3) return fmt::format("{:.1f} kB", b / 1e3);
  return fmt::format("{} bytes", bytes);
}

std::string SystemMemory::describe() const {
  std::string s = fmt::format("{} available (MemAvailable {} of {}; ", format_bytes(available), format_bytes(mem_available),
                              format_bytes(mem_total));
  s += cgroup_limit >= 0 ? fmt::format("cgroup limit {}, {} of it free)", format_bytes(cgroup_limit), format_bytes(cgroup_headroom))
                         : std::string("no cgroup limit)");
  if (overridden) s += " [GDN_MEMORY_AVAILABLE]";
  return s;
}

SystemMemory system_memory() {
  SystemMemory m;
  m.mem_available = meminfo("MemAvailable");
  m.mem_total = meminfo("MemTotal");
  if (m.mem_available < 0) m.mem_available = std::max<std::int64_t>(0, meminfo("MemFree"));
  const Limit l = cgroup_limits();
  m.cgroup_limit = l.limit;
  m.cgroup_headroom = l.headroom;
  m.available = m.cgroup_headroom >= 0 ? std::min(m.mem_available, m.cgroup_headroom) : m.mem_available;
  if (const char* env = std::getenv("GDN_MEMORY_AVAILABLE")) {
    const std::int64_t v = parse_size(env);
    if (v >= 0) {
      m.available = v;
      m.overridden = true;
    }
  }
  return m;
}

}  // namespace gdn
