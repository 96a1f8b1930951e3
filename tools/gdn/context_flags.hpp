#pragma once
// --state-dtype f32|bf16 and --kv-dtype f32|bf16: the element types of a context's recurrent state
// and KV cache (gdn/runtime/context.hpp), on every command that makes a context. Unset, the context
// takes its defaults: the checkpoint's mamba_ssm_dtype, and the backend's KV dtype (CPU float32,
// CUDA bf16).

#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "gdn/core/error.hpp"
#include "gdn/runtime/context.hpp"

namespace gdn::cli {

inline DType parse_element_dtype(std::string_view flag, std::string_view v) {
  if (v == "f32") return DType::f32;
  if (v == "bf16") return DType::bf16;
  throw Error(Status::invalid_argument, fmt::format("{}: '{}' is not f32 or bf16", flag, v));
}

// Consumes argv[i] and its value when it is one of the flags; false otherwise.
inline bool parse_context_flag(int argc, char** argv, int& i, std::optional<DType>& state_dtype, std::optional<DType>& kv_dtype) {
  const std::string_view a = argv[i];
  if (i + 1 >= argc) return false;
  if (a == "--state-dtype") state_dtype = parse_element_dtype(a, argv[++i]);
  else if (a == "--kv-dtype") kv_dtype = parse_element_dtype(a, argv[++i]);
  else return false;
  return true;
}

inline bool parse_context_flag(int argc, char** argv, int& i, ContextParams& cp) {
  return parse_context_flag(argc, argv, i, cp.state_dtype, cp.kv_dtype);
}

}  // namespace gdn::cli
