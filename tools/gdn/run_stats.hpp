#pragma once
// `--stats`: one line on stderr with where a command's time and memory went (load, context and
// step seconds; the peak resident set, and how much of it is anonymous memory vs mapped files).

#include <sys/resource.h>

#include <chrono>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "gdn/model/model.hpp"

namespace gdn::cli {

// A field of /proc/self/status in bytes (-1 when absent): VmHWM, RssAnon, RssFile.
inline long proc_status_bytes(const std::string& key) {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.compare(0, key.size(), key) == 0 && line.size() > key.size() && line[key.size()] == ':')
      return std::stol(line.substr(key.size() + 1)) * 1024L;
  return -1;
}

inline void print_run_stats(const Model& model, std::chrono::steady_clock::time_point t0, std::chrono::steady_clock::time_point loaded,
                            std::chrono::steady_clock::time_point ready, std::chrono::steady_clock::time_point done) {
  const auto s = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  fmt::print(stderr,
             "[weights {}: load {:.2f} s, context {:.2f} s, step {:.2f} s | peak RSS {:.0f} MiB (now {:.0f} MiB anonymous, "
             "{:.0f} MiB mapped files)]\n",
             weight_placement_name(model.weight_placement()), s(t0, loaded), s(loaded, ready), s(ready, done),
             static_cast<double>(proc_status_bytes("VmHWM")) / 1048576.0, static_cast<double>(proc_status_bytes("RssAnon")) / 1048576.0,
             static_cast<double>(proc_status_bytes("RssFile")) / 1048576.0);
}

}  // namespace gdn::cli
