// gdn doctor MODEL_DIR [--json] [--quick] [--threads N] [--state-dtype f32|bf16] [--backend cpu|cuda] [--fault NAME]...
//            [--pack | --in-place | --image FILE] [--quant q8_0|q4_0|q4_k|q4_k_m] [--lm-head-quant auto|q8_0|q4_0|q4_k]   (the CPU backend's weights; CUDA uploads its own copy)
//
// Self-check of a checkpoint and of this engine on it (include/gdn/diagnostics/doctor.hpp): prints
// PASS / WARN / FAIL / SKIP per check with the measured figure, or the report as JSON on stdout
// with --json. Exit status 1 when any check FAILs, 0 otherwise (2 for a usage error), so a host
// can run it at deploy time. --fault drop-conv-state | tiled-value-heads breaks the engine on
// purpose, to see the checks that catch it fail.

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "commands.hpp"
#include "load_flags.hpp"
#include "gdn/diagnostics/doctor.hpp"

namespace gdn::cli {

int doctor(int argc, char** argv) {
  const auto usage = [] {
    std::fputs("usage: gdn doctor MODEL_DIR [--json] [--quick] [--threads N] [--state-dtype f32|bf16] "
               "[--backend cpu|cuda] [--fault drop-conv-state|tiled-value-heads] [--pack | --in-place | --image FILE] [--quant q8_0|q4_0|q4_k|q4_k_m] [--lm-head-quant auto|q8_0|q4_0|q4_k]\n", stderr);
    return 2;
  };
  if (argc < 1) return usage();
  const std::string dir = argv[0];
  DoctorOptions opt;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const bool has_value = i + 1 < argc;
    if (parse_load_flag(argc, argv, i, opt.load)) continue;
    if (a == "--json") json = true;
    else if (a == "--quick") opt.quick = true;
    else if (a == "--threads" && has_value) opt.threads = std::atoi(argv[++i]);
    else if (a == "--backend" && has_value) opt.backend = parse_backend(argv[++i]);
    else if (a == "--state-dtype" && has_value) {
      const std::string_view v = argv[++i];
      if (v == "f32") opt.state_dtype = DType::f32;
      else if (v == "bf16") opt.state_dtype = DType::bf16;
      else return usage();
    } else if (a == "--fault" && has_value) {
      const std::string_view v = argv[++i];
      if (v == "drop-conv-state") opt.faults.drop_conv_state = true;
      else if (v == "tiled-value-heads") opt.faults.tiled_value_heads = true;
      else return usage();
    } else {
      return usage();
    }
  }
  const DoctorReport report = run_doctor(dir, opt);
  const std::string out = json ? report.to_json() + "\n" : report.to_table();
  std::fwrite(out.data(), 1, out.size(), stdout);
  return report.ok() ? 0 : 1;
}

}  // namespace gdn::cli
