#pragma once
// Sub-commands of the gdn tool, one file each. Each returns the process exit status.

namespace gdn::cli {

int generate(int argc, char** argv);   // gdn generate MODEL_DIR --prompt TEXT [...]
int speculate(int argc, char** argv);  // gdn speculate MODEL_DIR [...]: MTP acceptance and speedup
int doctor(int argc, char** argv);     // gdn doctor MODEL_DIR [--json] [--quick]: self-check, exit 1 on FAIL
int bench(int argc, char** argv);      // gdn bench [...]: speed vs the memory-bandwidth roofline and llama.cpp
                                       // (in the gdn-bench program, bench_main.cpp, which `gdn bench` runs)
int info(int argc, char** argv);       // gdn info MODEL_DIR [...]: architecture, parameters, memory plan (info.cpp)
int pack(int argc, char** argv);       // gdn pack MODEL_DIR [--out FILE]: the packed weight image (pack.cpp)
// gdn make-checkpoint: make_checkpoint_command in checkpoint_writer.hpp.

}  // namespace gdn::cli
