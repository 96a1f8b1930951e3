// `gdn serve` when the tool was built without cpp-httplib (tools/gdn/serve.cmake).

#include <cstdio>

#include "commands.hpp"

namespace gdn::cli {

int serve(int, char**) {
  std::fputs("gdn serve: this gdn was built without cpp-httplib (install libcpp-httplib-dev, or run scripts/install-deps.sh, "
             "and rebuild)\n",
             stderr);
  return 1;
}

}  // namespace gdn::cli
