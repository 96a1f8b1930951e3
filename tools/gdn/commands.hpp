#pragma once
// Sub-commands of the gdn tool, one file each. Each returns the process exit status.

#include <string_view>

#include <fmt/format.h>

#include "gdn/core/error.hpp"
#include "gdn/model/model.hpp"

namespace gdn::cli {

// --backend cpu|cuda: where a command's contexts run (and, for cuda, whose form of the weights the
// load makes: the device copy instead of the CPU's packed images).
inline Backend parse_backend(std::string_view v) {
  if (v == "cpu") return Backend::cpu;
  if (v == "cuda") return Backend::cuda;
  throw Error(Status::invalid_argument, fmt::format("--backend: '{}' is not cpu or cuda", v));
}

int generate(int argc, char** argv);   // gdn generate MODEL_DIR --prompt TEXT [...]
int speculate(int argc, char** argv);  // gdn speculate MODEL_DIR [...]: MTP acceptance and speedup
int doctor(int argc, char** argv);     // gdn doctor MODEL_DIR [--json] [--quick]: self-check, exit 1 on FAIL
int serve(int argc, char** argv);      // gdn serve MODEL_DIR [...]: the OpenAI-compatible server (serve.cpp)
int bench_cuda(int argc, char** argv); // gdn bench --backend cuda [...]: the GPU against the HBM roofline
int bench(int argc, char** argv);      // gdn bench [...]: speed vs the memory-bandwidth roofline and llama.cpp
                                       // (in the gdn-bench program, bench_main.cpp, which `gdn bench` runs)
int info(int argc, char** argv);       // gdn info MODEL_DIR [...]: architecture, parameters, memory plan (info.cpp)
int pack(int argc, char** argv);       // gdn pack MODEL_DIR [--out FILE]: the packed weight image (pack.cpp)
// gdn make-checkpoint: make_checkpoint_command in checkpoints.hpp.

}  // namespace gdn::cli
