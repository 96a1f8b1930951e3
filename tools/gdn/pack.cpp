// gdn pack MODEL_DIR [--out FILE] [--layout panels|amx_tiles] [--quant q8_0|q4_0|q4_k|q4_k_m] [--lm-head-quant auto|q8_0|q4_0|q4_k] [--threads N]
//
// Writes the packed CPU weight image of a checkpoint once (gdn/model/packed_image.hpp): the bf16
// projections in the order this machine's projection kernel reads them. Every later load of the
// checkpoint maps it instead of packing the weights into anonymous memory (no copy, no pass over
// the checkpoint, one copy in the page cache shared by every process). Default output:
// MODEL_DIR/gdn-packed.<layout>.gdnimg, where loading looks for it; elsewhere, pass --image FILE
// (or ModelParams::packed_image) when loading.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "commands.hpp"
#include "gdn/core/system_memory.hpp"
#include "gdn/model/packed_image.hpp"

namespace gdn::cli {

int pack(int argc, char** argv) {
  const auto usage = [] {
    std::fputs("usage: gdn pack MODEL_DIR [--out FILE] [--layout panels|amx_tiles] [--quant q8_0|q4_0|q4_k|q4_k_m]\n"
               "                [--lm-head-quant auto|q8_0|q4_0|q4_k] [--threads N]\n"
               "  writes the packed weight image that loading maps instead of packing the weights\n"
               "  (default FILE: MODEL_DIR/gdn-packed.<layout>.gdnimg, found by loading without flags);\n"
               "  --quant: the block-quantised image (MODEL_DIR/gdn-packed.<quant>.gdnimg, found by --quant);\n"
               "  --lm-head-quant: the lm_head's format under --quant (auto: q8_0 under the 4-bit quants; another than auto's\n"
               "  goes to MODEL_DIR/gdn-packed.<quant>.lm_head-<format>.gdnimg, found by the same flags)\n",
               stderr);
    return 2;
  };
  if (argc < 1) return usage();
  const std::string dir = argv[0];
  PackImageOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const bool v = i + 1 < argc;
    if (a == "--out" && v) o.out = argv[++i];
    else if (a == "--layout" && v) o.layout = argv[++i];
    else if (a == "--quant" && v) o.quant = parse_weight_quant(argv[++i]);
    else if (a == "--lm-head-quant" && v) o.lm_head_quant = parse_lm_head_quant(argv[++i]);
    else if (a == "--threads" && v) o.threads = std::atoi(argv[++i]);
    else return usage();
  }
  o.progress = [](std::size_t done, std::size_t total) {
    if (total == 0 || !::isatty(STDERR_FILENO)) return;
    fmt::print(stderr, "\rpacking {:5.1f}% of {}", 100.0 * static_cast<double>(done) / static_cast<double>(total),
               format_bytes(static_cast<std::int64_t>(total)));
    if (done == total) fmt::print(stderr, "\n");
  };
  const PackImageResult r = write_packed_image(dir, o);
  std::string tensors = fmt::format("{} tensors", r.tensors);
  if (r.encodings.size() > 1) {  // e.g. q4_k_m: "71 tensors: 40 q4_k, 17 q8_0, 14 q5_0"
    tensors += ":";
    for (std::size_t i = 0; i < r.encodings.size(); ++i)
      tensors += fmt::format("{} {} {}", i ? "," : "", r.encodings[i].second, r.encodings[i].first);
  }
  fmt::print("wrote {} ({} layout, {}; {}; {} of non-zero blocks written) in {:.1f} s\n", r.path, r.layout, tensors,
             format_bytes(static_cast<std::int64_t>(r.file_bytes)), format_bytes(static_cast<std::int64_t>(r.written_bytes)),
             r.seconds);
  return 0;
}

}  // namespace gdn::cli
