// gdn-bench: the program behind `gdn bench` (bench.cpp), which `gdn` executes in its own place.
// It is a program of its own so that the allocation counter it links (alloc_count.cpp, a
// replacement of the global operator new and delete) is in the benchmark's process only, never in
// the `gdn` tool's other commands.

#include <exception>

#include <fmt/format.h>

#include "commands.hpp"
#include "gdn/core/error.hpp"

int main(int argc, char** argv) {
  try {
    return gdn::cli::bench(argc - 1, argv + 1);
  } catch (const gdn::Error& e) {
    fmt::print(stderr, "gdn bench: error ({}): {}\n", gdn::status_name(e.status()), e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "gdn bench: error: {}\n", e.what());
    return 1;
  }
}
