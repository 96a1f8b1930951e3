#pragma once
// How much memory this process can still get, so that loading and context creation decide from it
// (pack the weights or read them in place; refuse a context that cannot fit) instead of being
// killed by the kernel's OOM killer halfway through. Read from /proc/meminfo (MemAvailable: free
// memory plus what the kernel can reclaim, the page cache included) and from the memory limits of
// the process's cgroup (v2 memory.max / v1 memory.limit_in_bytes, at every level up to the root),
// whose own reclaimable page cache counts as available too.

#include <cstdint>
#include <string>

namespace gdn {

struct SystemMemory {
  std::int64_t available = 0;        // min(mem_available, cgroup_headroom): what a new allocation can use
  std::int64_t mem_available = 0;    // MemAvailable
  std::int64_t mem_total = 0;        // MemTotal
  std::int64_t cgroup_limit = -1;    // the tightest cgroup limit (-1: none)
  std::int64_t cgroup_headroom = -1; // that limit minus the cgroup's usage less its reclaimable page cache (-1: no limit)
  bool overridden = false;           // GDN_MEMORY_AVAILABLE set it (tests; simulating a smaller machine)

  // "21.4 GB available (MemAvailable 21.4 GB of 24.6 GB; no cgroup limit)".
  std::string describe() const;
};

// The figures now. GDN_MEMORY_AVAILABLE=BYTES (suffixes K, M, G, T: powers of 1024) replaces
// `available` (and leaves the rest as read), so tests and users can see what libgdn does on a
// machine with less memory.
SystemMemory system_memory();

// Bytes as "52.1 GB" (decimal units, as `df -H` and disk vendors count).
std::string format_bytes(std::int64_t bytes);

}  // namespace gdn
