#pragma once
// Projections through cuBLASLt: y = alpha·x·Wᵀ + beta·c for bf16 activations x [rows][in] and a
// bf16 weight W stored as in the checkpoint, row-major [out][in]; float32 accumulation and scaling;
// bf16 or float32 output (the logits). c may alias y (beta = 1 with c = y adds the residual in the
// epilogue). A Gemm owns a cuBLASLt handle and a workspace allocated once, and caches the
// heuristic's algorithm per shape, so calls after the first allocate nothing and can be captured
// in a CUDA graph. One Gemm per thread (the cache is not synchronised).
//
// In column-major terms this is D[out × rows] = op(A)·B with A = W viewed as [in × out] (lda = in)
// transposed, B = x viewed as [in × rows] (ldb = ldx), D = y viewed as [out × rows] (ldd = ldy).

#include <cstddef>
#include <cstdint>
#include <memory>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "kernels.hpp"

// Under the emulator (gemm_emulated.cpp) a Gemm is a plain float loop with the same contract,
// run (or recorded into a graph) on the emulated stream: cuBLASLt itself is checked on a GPU only.
GDN_CUDA_NAMESPACE_BEGIN

enum class GemmOut { bfloat16, float32 };

struct GemmArgs {
  const __nv_bfloat16* x = nullptr;  // [rows][ldx]
  std::int64_t ldx = 0;
  const __nv_bfloat16* w = nullptr;  // [out][ldw], ldw ≥ in
  std::int64_t ldw = 0;
  void* y = nullptr;                 // [rows][ldy], bf16 or float per out_type
  std::int64_t ldy = 0;
  const void* c = nullptr;           // as y; read when beta != 0 (defaults to y)
  std::int64_t ldc = 0;
  GemmOut out_type = GemmOut::bfloat16;
  int rows = 0, in = 0, out = 0;
  float alpha = 1.0f, beta = 0.0f;
};

class Gemm {
 public:
  // Status codes: the cuBLAS status of the failing call (CUBLAS_STATUS_SUCCESS is 0).
  static constexpr std::size_t default_workspace = 32u << 20;
  Gemm();
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // Creates the handle and the workspace (device memory). Returns a cublasStatus_t as int.
  int init(std::size_t workspace_bytes = default_workspace);
  int run(const GemmArgs& a, cudaStream_t stream);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

GDN_CUDA_NAMESPACE_END
